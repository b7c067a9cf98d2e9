//! The real binary, killed: every acknowledged increment survives a SIGKILL
//! in the middle of traffic, and a SIGTERM flushes everything queued before
//! the process exits 0.

mod common;

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use common::{counter_path, metric_in};
use serde_json::json;

/// The gateway binary, running over a data directory.
struct Gateway {
    child: Child,
    base: String,
    log: Arc<Mutex<String>>,
}

impl Gateway {
    fn start(dir: &Path, extra: &[&str]) -> Gateway {
        let mut child = Command::new(env!("CARGO_BIN_EXE_counter-gateway"))
            .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
            .arg(dir)
            .args(extra)
            .env("NO_COLOR", "1")
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start counter-gateway");
        let stderr = child.stderr.take().expect("stderr");
        let log = Arc::new(Mutex::new(String::new()));
        let (tx, rx) = mpsc::channel();
        let sink = log.clone();
        // Reads the log to its end, so the child never blocks on a full pipe.
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                let line = strip_ansi(&line);
                if let Some(addr) = listening_addr(&line) {
                    let _ = tx.send(addr);
                }
                let mut log = sink.lock().unwrap();
                log.push_str(&line);
                log.push('\n');
            }
        });
        let addr = match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(addr) => addr,
            Err(_) => {
                let _ = child.kill();
                panic!("no `listening` line; log:\n{}", log.lock().unwrap());
            }
        };
        Gateway {
            child,
            base: format!("http://{addr}"),
            log,
        }
    }

    fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    /// Waits for the process to exit on its own.
    fn wait_exit(&mut self, within: Duration) -> std::process::ExitStatus {
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return status;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                panic!("did not exit in {within:?}; log:\n{}", self.log());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        // Never leave a gateway behind, whatever the test did.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // CSI: ESC [ params final-byte (0x40..=0x7e).
            if chars.next() == Some('[') {
                for c in chars.by_ref() {
                    if ('\u{40}'..='\u{7e}').contains(&c) {
                        break;
                    }
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// `127.0.0.1:PORT` from a line like `... listening addr=127.0.0.1:PORT`.
fn listening_addr(line: &str) -> Option<String> {
    if !line.contains("listening") {
        return None;
    }
    let rest = &line[line.find("addr=")? + "addr=".len()..];
    let addr: String = rest
        .chars()
        .take_while(|c| !c.is_whitespace() && *c != ',')
        .collect();
    addr.parse::<std::net::SocketAddr>().ok()?;
    Some(addr)
}

const KEYS: [&str; 4] = ["k0", "k1", "k2", "k3"];

async fn value(http: &reqwest::Client, base: &str, entity: &str, uuid: &str) -> Option<i64> {
    let url = format!("{base}{}", counter_path(entity, "VIEW", uuid, ""));
    let r = common::read(http.get(url).send().await.expect("GET")).await;
    match r.status {
        200 => Some(r.json["value"].as_i64().expect("value")),
        404 => None,
        s => panic!("GET answered {s}: {}", r.text),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigkill_loses_no_acknowledged_increment() {
    const CLIENTS: usize = 32;
    const KILL_AFTER_ACKS: u64 = 2_000;
    const MAX_SENDS: u64 = 50_000;

    let dir = tempfile::tempdir().expect("temp dir");
    let gw = Arc::new(Mutex::new(Gateway::start(dir.path(), &[])));
    let base = gw.lock().unwrap().base.clone();
    let http = common::client();

    // Per key: the sum acknowledged with 200, and the sum whose answer never
    // came (or was not a 200): those may or may not have been applied.
    let acked: Arc<Mutex<HashMap<&str, i64>>> = Arc::default();
    let unknown: Arc<Mutex<HashMap<&str, i64>>> = Arc::default();
    let acks = Arc::new(AtomicU64::new(0));
    let sends = Arc::new(AtomicU64::new(0));
    let killed = Arc::new(AtomicBool::new(false));

    let clients: Vec<_> = (0..CLIENTS)
        .map(|i| {
            let (http, base) = (http.clone(), base.clone());
            let (acked, unknown) = (acked.clone(), unknown.clone());
            let (acks, sends) = (acks.clone(), sends.clone());
            tokio::spawn(async move {
                for j in 0.. {
                    if sends.fetch_add(1, SeqCst) >= MAX_SENDS {
                        break;
                    }
                    let key = KEYS[(i + j) % KEYS.len()];
                    let count = 1 + ((i * 7 + j) % 3) as i64;
                    let url = format!("{base}{}", counter_path("CRASH", "VIEW", key, "/increment"));
                    let sent = http.post(url).json(&json!({ "count": count })).send().await;
                    let ok = match sent {
                        Ok(res) if res.status() == 200 => res.text().await.is_ok(),
                        _ => false,
                    };
                    let into = if ok { &acked } else { &unknown };
                    *into.lock().unwrap().entry(key).or_default() += count;
                    if ok {
                        acks.fetch_add(1, SeqCst);
                    } else {
                        // The gateway is gone (or refusing): stop this client.
                        break;
                    }
                }
            })
        })
        .collect();

    // Kill while every client has a request in flight.
    let deadline = Instant::now() + Duration::from_secs(60);
    while acks.load(SeqCst) < KILL_AFTER_ACKS {
        assert!(
            Instant::now() < deadline,
            "too few acks: {}",
            acks.load(SeqCst)
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    {
        let mut gw = gw.lock().unwrap();
        gw.child.kill().expect("SIGKILL");
        gw.child.wait().expect("wait");
        killed.store(true, SeqCst);
    }
    for c in clients {
        c.await.expect("client task");
    }
    assert!(killed.load(SeqCst));
    let acked = acked.lock().unwrap().clone();
    let unknown = unknown.lock().unwrap().clone();
    let total_acks = acks.load(SeqCst);
    assert!(total_acks >= KILL_AFTER_ACKS);
    // Every client ended on a failed request, so some were in flight.
    assert!(unknown.values().sum::<i64>() > 0, "{unknown:?}");
    drop(gw);

    // Restart on the same data directory: every acknowledged increment is there.
    let gw = Gateway::start(dir.path(), &[]);
    for key in KEYS {
        let ack = acked.get(key).copied().unwrap_or(0);
        let maybe = unknown.get(key).copied().unwrap_or(0);
        let got = value(&http, &gw.base, "CRASH", key).await.unwrap_or(0);
        eprintln!("{key}: {got} stored, {ack} acknowledged, {maybe} unanswered");
        assert!(
            got >= ack,
            "{key}: {got} in the store, {ack} acknowledged (lost {})",
            ack - got
        );
        assert!(
            got <= ack + maybe,
            "{key}: {got} in the store, more than {ack} acknowledged + {maybe} unanswered"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigterm_flushes_what_is_queued_and_exits_zero() {
    const REQUESTS: usize = 40;
    let dir = tempfile::tempdir().expect("temp dir");
    // The flusher lingers, so the requests are still queued at SIGTERM.
    let mut gw = Gateway::start(dir.path(), &["--flush-interval", "2s"]);
    let http = common::client();

    let clients: Vec<_> = (0..REQUESTS)
        .map(|i| {
            let url = format!(
                "{}{}",
                gw.base,
                counter_path("TERM", "VIEW", KEYS[i % 2], "/increment")
            );
            let http = http.clone();
            tokio::spawn(async move {
                let res = http.post(url).json(&json!({ "count": i + 1 })).send().await;
                common::read(res.expect("answered before exit")).await
            })
        })
        .collect();

    // Wait until all of them are queued (the gauge counts queued events).
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let r = common::read(
            http.get(format!("{}/metrics", gw.base))
                .send()
                .await
                .unwrap(),
        )
        .await;
        let depth = metric_in(&r.text, "counter_gateway_queue_depth").expect("queue depth");
        if depth as usize == REQUESTS {
            break;
        }
        assert!(Instant::now() < deadline, "queue depth stuck at {depth}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let pid = gw.child.id().to_string();
    let sent = Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .expect("kill");
    assert!(sent.success());

    let status = tokio::task::block_in_place(|| gw.wait_exit(Duration::from_secs(30)));
    assert!(status.success(), "exit {status:?}; log:\n{}", gw.log());
    let mut want = [0i64; 2];
    for (i, c) in clients.into_iter().enumerate() {
        let r = c.await.expect("client task");
        assert_eq!(r.status, 200, "request {i}: {}", r.text);
        want[i % 2] += i as i64 + 1;
    }
    assert!(gw.log().contains("stopped cleanly"), "{}", gw.log());
    drop(gw);

    let gw = Gateway::start(dir.path(), &[]);
    for (key, want) in KEYS.iter().zip(want) {
        assert_eq!(
            value(&http, &gw.base, "TERM", key).await,
            Some(want),
            "{key}"
        );
    }
}

/// Shutdown closes every tenant's pipeline and waits for each: increments
/// queued for three tenants at SIGTERM are all answered and all on disk.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigterm_flushes_every_tenant() {
    const TENANTS: [&str; 3] = ["default", "acme", "globex"];
    const REQUESTS: usize = 30;
    let dir = tempfile::tempdir().expect("temp dir");
    let mut gw = Gateway::start(dir.path(), &["--flush-interval", "2s"]);
    let http = common::client();
    let clients: Vec<_> = (0..REQUESTS)
        .map(|i| {
            let url = format!(
                "{}{}",
                gw.base,
                counter_path("TERM", "VIEW", "k", "/increment")
            );
            let req = http
                .post(url)
                .header("x-tenant", TENANTS[i % 3])
                .json(&json!({ "count": i + 1 }));
            tokio::spawn(async move { common::read(req.send().await.expect("answered")).await })
        })
        .collect();
    // The queue bound is shared: its depth counts every tenant's events.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let r = common::read(
            http.get(format!("{}/metrics", gw.base))
                .send()
                .await
                .unwrap(),
        )
        .await;
        let depth = metric_in(&r.text, "counter_gateway_queue_depth").expect("queue depth");
        if depth as usize == REQUESTS {
            break;
        }
        assert!(Instant::now() < deadline, "queue depth stuck at {depth}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let pid = gw.child.id().to_string();
    assert!(Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .expect("kill")
        .success());
    let status = tokio::task::block_in_place(|| gw.wait_exit(Duration::from_secs(30)));
    assert!(status.success(), "exit {status:?}; log:\n{}", gw.log());
    let mut want = [0i64; 3];
    for (i, c) in clients.into_iter().enumerate() {
        let r = c.await.expect("client task");
        assert_eq!(r.status, 200, "request {i}: {}", r.text);
        want[i % 3] += i as i64 + 1;
    }
    drop(gw);

    let gw = Gateway::start(dir.path(), &[]);
    for (tenant, want) in TENANTS.iter().zip(want) {
        let url = format!("{}{}", gw.base, counter_path("TERM", "VIEW", "k", ""));
        let r = common::read(
            http.get(url)
                .header("x-tenant", *tenant)
                .send()
                .await
                .unwrap(),
        )
        .await;
        assert_eq!(r.json["value"], want, "{tenant}: {}", r.text);
    }
}
