//! A reader of Server-Sent Events over reqwest, for the live streams'
//! tests (`GET /v1/stream`): blocks parsed as the EventSource of a browser
//! does (`event`, `id`, `data`, `retry`, comment lines).

use std::time::Duration;

use serde_json::Value;

use super::{read, Resp};

/// A hang guard, never a timing claim: every wait here ends long before.
pub const GUARD: Duration = Duration::from_secs(30);

/// One block of the event stream.
#[derive(Debug, Default)]
pub struct Block {
    pub event: Option<String>,
    pub id: Option<String>,
    pub data: String,
    pub comment: Option<String>,
    pub retry: Option<String>,
}

/// An open event stream, read block by block.
pub struct Events {
    res: reqwest::Response,
    buf: String,
}

impl Events {
    /// Opens `GET url`; the answer when it is no stream.
    pub async fn open(req: reqwest::RequestBuilder) -> Result<Events, Resp> {
        let res = req.send().await.expect("GET /v1/stream");
        if res.status() != 200 {
            return Err(read(res).await);
        }
        Ok(Events {
            res,
            buf: String::new(),
        })
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.res.headers().get(name).and_then(|v| v.to_str().ok())
    }

    /// The next block, `None` once the stream ended.
    pub async fn block(&mut self) -> Option<Block> {
        loop {
            if let Some(end) = self.buf.find("\n\n") {
                let text: String = self.buf.drain(..end + 2).collect();
                let mut b = Block::default();
                for line in text.lines() {
                    if let Some(c) = line.strip_prefix(':') {
                        b.comment = Some(c.trim().to_string());
                    } else if let Some((field, value)) = line.split_once(':') {
                        let value = value.strip_prefix(' ').unwrap_or(value).to_string();
                        match field {
                            "event" => b.event = Some(value),
                            "id" => b.id = Some(value),
                            "data" => b.data.push_str(&value),
                            "retry" => b.retry = Some(value),
                            other => panic!("unknown field {other:?} in {text:?}"),
                        }
                    }
                }
                return Some(b);
            }
            let chunk = tokio::time::timeout(GUARD, self.res.chunk())
                .await
                .expect("the stream went silent")
                .expect("reading the stream");
            match chunk {
                Some(bytes) => self
                    .buf
                    .push_str(std::str::from_utf8(&bytes).expect("UTF-8")),
                None => {
                    assert!(self.buf.is_empty(), "a cut block: {:?}", self.buf);
                    return None;
                }
            }
        }
    }

    /// The next `counter` event's data, skipping comments and the retry hint.
    pub async fn counter(&mut self) -> Value {
        loop {
            let b = self.block().await.expect("the stream ended");
            if b.event.as_deref() == Some("counter") {
                assert!(b.id.is_some(), "{b:?}");
                return serde_json::from_str(&b.data).expect("JSON data");
            }
            assert!(b.event.is_none() && b.data.is_empty(), "{b:?}");
        }
    }

    /// Counter events until one of `uuid` has `value`, all of them.
    pub async fn until(&mut self, uuid: &str, value: i64) -> Vec<Value> {
        let mut seen = Vec::new();
        loop {
            let c = self.counter().await;
            let done = c["uuid"] == uuid && c["value"] == value;
            seen.push(c);
            if done {
                return seen;
            }
        }
    }

    /// Reads until `n` keep-alive comments came (time passed with nothing
    /// to send); panics on any counter event meanwhile.
    pub async fn keep_alives(&mut self, n: usize) {
        let mut got = 0;
        while got < n {
            let b = self.block().await.expect("the stream ended");
            assert!(b.event.is_none(), "an event while idle: {b:?}");
            if b.comment.as_deref() == Some("keep-alive") {
                got += 1;
            }
        }
    }
}
