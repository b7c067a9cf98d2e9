//! The cluster's nodes as the store reaches them: round-robin over the live
//! ones, a node whose connection fails set aside with a growing back-off,
//! and node sniffing (`GET _nodes/http`) when asked.
//!
//! Ours rather than the crate's `MultiNodeConnectionPool`: that one never
//! marks a node dead (a killed node keeps getting its share of requests),
//! panics on an empty node list and unwraps the sniffing answer. The one
//! rule that matters for counting lives in [`NodePool::send`]: only a
//! request that provably never left (connection refused or failed before a
//! byte was written) moves on to the next node; a request that was sent and
//! then lost (timeout, reset) comes back as an error whose outcome is
//! unknown, never resent here.
//!
//! Every decision takes `now` as an argument, so the unit tests drive the
//! back-off with a fake clock; the store passes `Instant::now()`.

use std::sync::atomic::{AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use elasticsearch::auth::Credentials;
use elasticsearch::http::headers::HeaderMap;
use elasticsearch::http::response::Response;
use elasticsearch::http::transport::{SingleNodeConnectionPool, TransportBuilder};
use elasticsearch::http::{Method, Url};
use elasticsearch::Elasticsearch;
use serde_json::Value;

use super::client::{transport_error, TransportError};
use super::config::{Auth, EsConfig};

/// The first pause of a node whose connection failed; doubled on each
/// further failure up to [`DEAD_MAX`]. A second is about how long a
/// cluster takes to notice a lost node and promote its replicas.
pub const DEAD_BASE: Duration = Duration::from_secs(1);
/// The longest pause of a dead node: it is tried again at least this often.
pub const DEAD_MAX: Duration = Duration::from_secs(30);
/// How often the node list is sniffed again while all is well.
pub const SNIFF_EVERY: Duration = Duration::from_secs(300);
/// The soonest a node's death brings a new sniff (the cluster may have
/// moved it, or replaced it with another address).
pub const SNIFF_AFTER_FAILURE: Duration = Duration::from_secs(10);

/// Process-wide gauges of every pool, read by `/metrics`
/// ([`crate::metrics::Metrics::render`]): the store has no handle on the
/// gateway's metrics, and a process runs one pool (tenants share it).
pub static NODES: AtomicI64 = AtomicI64::new(0);
pub static DEAD_NODES: AtomicI64 = AtomicI64::new(0);
/// Times a node was set aside because its connection failed.
pub static NODE_FAILURES: AtomicU64 = AtomicU64::new(0);

/// Whether a node takes requests, and since when not.
#[derive(Debug, Default)]
struct Health {
    /// Failures in a row; the back-off grows with them.
    failures: u32,
    /// Set aside until then; `None` when live.
    dead_until: Option<Instant>,
}

/// One node: its URL, its own HTTP client (connections kept per node), its health.
pub(super) struct Node {
    pub url: Url,
    client: Elasticsearch,
    /// Given by the operator (kept by every sniff) or found by sniffing.
    seed: bool,
    health: Mutex<Health>,
}

impl Node {
    fn health(&self) -> std::sync::MutexGuard<'_, Health> {
        self.health.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Set aside and not heard from since (what [`DEAD_NODES`] counts),
    /// whether or not its pause is over.
    fn marked_dead(&self) -> bool {
        self.health().dead_until.is_some()
    }

    #[cfg(test)]
    fn is_dead(&self, now: Instant) -> bool {
        self.health().dead_until.is_some_and(|t| t > now)
    }
}

/// What every node's client is built with.
#[derive(Clone)]
struct ClientSettings {
    auth: Option<Auth>,
    validation: Option<super::config::CaCert>,
    timeout: Duration,
}

impl ClientSettings {
    fn build(&self, url: &Url) -> Result<Elasticsearch, String> {
        let mut builder =
            TransportBuilder::new(SingleNodeConnectionPool::new(url.clone())).timeout(self.timeout);
        builder = match &self.auth {
            Some(Auth::Basic { username, password }) => {
                builder.auth(Credentials::Basic(username.clone(), password.clone()))
            }
            Some(Auth::ApiKey(key)) => builder.auth(Credentials::EncodedApiKey(key.clone())),
            None => builder,
        };
        if let Some(ca) = &self.validation {
            builder = builder.cert_validation(ca.validation()?);
        }
        let transport = builder
            .build()
            .map_err(|e| format!("cannot build the Elasticsearch client for {url}: {e}"))?;
        Ok(Elasticsearch::new(transport))
    }
}

/// The nodes and the rules for choosing among them.
pub(super) struct NodePool {
    nodes: RwLock<Vec<Arc<Node>>>,
    next: AtomicUsize,
    settings: ClientSettings,
    /// `Some` when `--elasticsearch-sniff`: when the next sniff is due.
    sniff_due: Option<Mutex<Instant>>,
}

impl NodePool {
    /// A pool over `config.urls`; no I/O.
    pub fn new(config: &EsConfig, now: Instant) -> Result<NodePool, String> {
        if config.urls.is_empty() {
            return Err("no Elasticsearch URL".into());
        }
        let settings = ClientSettings {
            auth: config.auth.clone(),
            validation: config.ca_cert.clone(),
            timeout: config.request_timeout,
        };
        let mut nodes = Vec::with_capacity(config.urls.len());
        for u in &config.urls {
            let url = Url::parse(u).map_err(|e| format!("bad Elasticsearch URL {u}: {e}"))?;
            if nodes.iter().any(|n: &Arc<Node>| n.url == url) {
                continue;
            }
            nodes.push(Arc::new(Node {
                client: settings.build(&url)?,
                url,
                seed: true,
                health: Mutex::default(),
            }));
        }
        NODES.fetch_add(nodes.len() as i64, Ordering::Relaxed);
        Ok(NodePool {
            nodes: RwLock::new(nodes),
            next: AtomicUsize::new(0),
            settings,
            // Due at once: `open` sniffs before the first request.
            sniff_due: config.sniff.then(|| Mutex::new(now)),
        })
    }

    fn nodes(&self) -> Vec<Arc<Node>> {
        self.nodes.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The URLs of the nodes, live or not (for logs and tests).
    pub fn urls(&self) -> Vec<String> {
        self.nodes().iter().map(|n| n.url.to_string()).collect()
    }

    /// The nodes in the order one request tries them: the live ones in
    /// turn (each request starts one further along), then the dead ones,
    /// soonest back first. Dead nodes stay in the list so that a cluster
    /// whose every node is set aside is still tried rather than given up
    /// on without a connection attempt, and so that a request never sent
    /// anywhere still has somewhere to go.
    pub fn order(&self, now: Instant) -> Vec<Arc<Node>> {
        let nodes = self.nodes();
        let n = nodes.len();
        let start = self.next.fetch_add(1, Ordering::Relaxed) % n.max(1);
        let mut live = Vec::with_capacity(n);
        let mut dead = Vec::new();
        for i in 0..n {
            let node = &nodes[(start + i) % n];
            match node.health().dead_until {
                Some(t) if t > now => dead.push((t, node.clone())),
                _ => live.push(node.clone()),
            }
        }
        dead.sort_by_key(|(t, _)| *t);
        live.extend(dead.into_iter().map(|(_, n)| n));
        live
    }

    /// A node's connection failed: set it aside for [`DEAD_BASE`] doubled
    /// per failure in a row, at most [`DEAD_MAX`]. A node already set aside
    /// (several requests failed on it at once) is not pushed further.
    pub fn mark_dead(&self, node: &Node, now: Instant) {
        let mut h = node.health();
        if h.dead_until.is_some_and(|t| t > now) {
            return;
        }
        let pause = DEAD_BASE
            .saturating_mul(1u32 << h.failures.min(16))
            .min(DEAD_MAX);
        if h.dead_until.is_none() {
            DEAD_NODES.fetch_add(1, Ordering::Relaxed);
        }
        h.failures = h.failures.saturating_add(1);
        h.dead_until = Some(now + pause);
        NODE_FAILURES.fetch_add(1, Ordering::Relaxed);
        drop(h);
        tracing::warn!(node = %node.url, failures = node.health().failures, pause_ms = pause.as_millis() as u64,
            "elasticsearch node unreachable: set aside");
        if let Some(due) = &self.sniff_due {
            let mut due = due.lock().unwrap_or_else(|e| e.into_inner());
            *due = (*due).min(now + SNIFF_AFTER_FAILURE);
        }
    }

    /// A node answered (any HTTP status: it is up): live again, its
    /// back-off reset.
    pub fn mark_alive(&self, node: &Node) {
        let mut h = node.health();
        if h.dead_until.take().is_some() {
            DEAD_NODES.fetch_sub(1, Ordering::Relaxed);
            tracing::info!(node = %node.url, "elasticsearch node answers again");
        }
        h.failures = 0;
    }

    /// How many nodes are set aside at `now`.
    #[cfg(test)]
    pub fn dead_count(&self, now: Instant) -> usize {
        self.nodes().iter().filter(|n| n.is_dead(now)).count()
    }

    /// One request, to the first node of [`NodePool::order`] that takes
    /// it. A node that refuses the connection is set aside and the request
    /// goes to the next (nothing was sent, so nothing can be counted
    /// twice). A node that took the request and then failed (timeout,
    /// reset, broken answer) is set aside too, but the request is not
    /// resent: its error says "sent" and its outcome is the caller's to
    /// call unknown.
    pub async fn send(
        &self,
        method: Method,
        path: &str,
        headers: HeaderMap,
        query: Option<&[(&str, &str)]>,
        body: Option<&[u8]>,
        timeout: Option<Duration>,
    ) -> Result<Response, TransportError> {
        let order = self.order(Instant::now());
        let mut refused = Vec::new();
        for node in &order {
            let res = node
                .client
                .send(method, path, headers.clone(), query, body, timeout)
                .await;
            match res {
                Ok(response) => {
                    self.mark_alive(node);
                    return Ok(response);
                }
                Err(e) => {
                    let e = transport_error(e);
                    self.mark_dead(node, Instant::now());
                    if !e.not_sent {
                        return Err(TransportError {
                            not_sent: false,
                            message: format!("{}: {}", node.url, e.message),
                        });
                    }
                    refused.push(format!("{}: {}", node.url, e.message));
                }
            }
        }
        Err(TransportError {
            not_sent: true,
            message: refused.join("; "),
        })
    }

    /// Whether a sniff is due at `now`; when it is, the next one is moved
    /// [`SNIFF_EVERY`] ahead, so concurrent requests start one sniff.
    pub fn take_sniff_due(&self, now: Instant) -> bool {
        let Some(due) = &self.sniff_due else {
            return false;
        };
        let mut due = due.lock().unwrap_or_else(|e| e.into_inner());
        if *due > now {
            return false;
        }
        *due = now + SNIFF_EVERY;
        true
    }

    /// Asks the cluster for its nodes' HTTP addresses and makes them the
    /// pool's nodes beside the configured ones (which are always kept: one
    /// may be a load balancer). A failed sniff changes nothing.
    pub async fn sniff(&self) -> Result<usize, String> {
        let response = self
            .send(
                Method::Get,
                "/_nodes/http",
                HeaderMap::new(),
                Some(&[("filter_path", "nodes.*.http.publish_address")]),
                None,
                Some(Duration::from_secs(5)),
            )
            .await
            .map_err(|e| format!("sniffing the nodes failed: {}", e.message))?;
        let status = response.status_code().as_u16();
        let bytes = response
            .bytes()
            .await
            .map_err(|e| format!("sniffing the nodes failed: {e}"))?;
        if status != 200 {
            return Err(format!("sniffing the nodes: _nodes/http answered {status}"));
        }
        let answer: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        let scheme = self
            .nodes()
            .first()
            .map_or("http", |n| n.url.scheme())
            .to_string();
        let found = sniffed_urls(&answer, &scheme);
        if found.is_empty() {
            return Err("sniffing the nodes: _nodes/http named no HTTP address".into());
        }
        self.replace_sniffed(found)
    }

    /// The seeds, then each of `found` not among them (an existing node
    /// keeps its health), in the order given; nodes sniffed before and not
    /// found now are dropped.
    fn replace_sniffed(&self, found: Vec<Url>) -> Result<usize, String> {
        let old = self.nodes();
        let mut nodes: Vec<Arc<Node>> = old.iter().filter(|n| n.seed).cloned().collect();
        for url in found {
            if nodes.iter().any(|n| n.url == url) {
                continue;
            }
            let node = match old.iter().find(|n| n.url == url) {
                Some(n) => n.clone(),
                None => Arc::new(Node {
                    client: self.settings.build(&url)?,
                    url,
                    seed: false,
                    health: Mutex::default(),
                }),
            };
            nodes.push(node);
        }
        let gone_dead = old
            .iter()
            .filter(|o| !nodes.iter().any(|n| Arc::ptr_eq(n, o)) && o.marked_dead())
            .count();
        DEAD_NODES.fetch_sub(gone_dead as i64, Ordering::Relaxed);
        NODES.fetch_add(nodes.len() as i64 - old.len() as i64, Ordering::Relaxed);
        let count = nodes.len();
        *self.nodes.write().unwrap_or_else(|e| e.into_inner()) = nodes;
        Ok(count)
    }
}

impl Drop for NodePool {
    fn drop(&mut self) {
        let nodes = self.nodes();
        NODES.fetch_sub(nodes.len() as i64, Ordering::Relaxed);
        let dead = nodes.iter().filter(|n| n.marked_dead()).count();
        DEAD_NODES.fetch_sub(dead as i64, Ordering::Relaxed);
    }
}

/// The HTTP addresses of a `GET _nodes/http` answer, as URLs of `scheme`.
/// `publish_address` is `ip:port`, or `hostname/ip:port` when the node has
/// a host name (the IP is taken: it is what the node bound); nodes without
/// an HTTP section (HTTP disabled) are skipped, as is anything unparsable.
pub(super) fn sniffed_urls(answer: &Value, scheme: &str) -> Vec<Url> {
    let Some(nodes) = answer.get("nodes").and_then(Value::as_object) else {
        return Vec::new();
    };
    let mut urls: Vec<Url> = nodes
        .values()
        .filter_map(|n| n.pointer("/http/publish_address")?.as_str())
        .filter_map(|addr| {
            let addr = addr.rsplit('/').next()?;
            Url::parse(&format!("{scheme}://{addr}")).ok()
        })
        .filter(|u| u.host().is_some() && u.port().is_some())
        .collect();
    urls.sort_by(|a, b| a.as_str().cmp(b.as_str()));
    urls.dedup();
    urls
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pool(urls: &[&str], sniff: bool, now: Instant) -> NodePool {
        let mut c = EsConfig::new(&urls.join(","), "cg", "default").unwrap();
        c.sniff = sniff;
        NodePool::new(&c, now).unwrap()
    }

    fn ports(order: &[Arc<Node>]) -> Vec<u16> {
        order.iter().map(|n| n.url.port().unwrap()).collect()
    }

    #[test]
    fn live_nodes_take_turns() {
        let t0 = Instant::now();
        let p = pool(&["http://a:1", "http://b:2", "http://c:3"], false, t0);
        let firsts: Vec<u16> = (0..6).map(|_| ports(&p.order(t0))[0]).collect();
        assert_eq!(firsts, [1, 2, 3, 1, 2, 3]);
        // Every node is in every order: a refused request can go anywhere.
        assert_eq!(ports(&p.order(t0)), [1, 2, 3]);
    }

    #[test]
    fn a_dead_node_is_skipped_then_tried_again_with_growing_pauses() {
        let t0 = Instant::now();
        let p = pool(&["http://a:1", "http://b:2"], false, t0);
        let a = p.order(t0)[0].clone();
        assert_eq!(a.url.port(), Some(1));
        p.mark_dead(&a, t0);
        assert_eq!(p.dead_count(t0), 1);
        // Skipped while set aside: last in every order, never first.
        for _ in 0..4 {
            assert_eq!(ports(&p.order(t0 + Duration::from_millis(500))), [2, 1]);
        }
        // Back after the first pause.
        let t1 = t0 + DEAD_BASE;
        assert_eq!(p.dead_count(t1), 0);
        assert!(p.order(t1).iter().any(|n| n.url.port() == Some(1)));
        // Failing again: twice as long.
        p.mark_dead(&a, t1);
        assert!(a.is_dead(t1 + DEAD_BASE));
        assert!(!a.is_dead(t1 + 2 * DEAD_BASE));
        // ... and never longer than the cap.
        let mut t = t1;
        for _ in 0..20 {
            t += DEAD_MAX;
            p.mark_dead(&a, t);
        }
        assert!(!a.is_dead(t + DEAD_MAX));
        // An answer resets the back-off.
        p.mark_alive(&a);
        assert_eq!(p.dead_count(t), 0);
        p.mark_dead(&a, t);
        assert!(!a.is_dead(t + DEAD_BASE));
    }

    #[test]
    fn failures_at_once_do_not_stretch_the_pause() {
        let t0 = Instant::now();
        let p = pool(&["http://a:1", "http://b:2"], false, t0);
        let a = p.order(t0)[0].clone();
        for _ in 0..5 {
            p.mark_dead(&a, t0);
        }
        assert!(
            !a.is_dead(t0 + DEAD_BASE),
            "five requests failing at once are one failure"
        );
    }

    #[test]
    fn all_dead_are_still_tried_soonest_back_first() {
        let t0 = Instant::now();
        let p = pool(&["http://a:1", "http://b:2", "http://c:3"], false, t0);
        let nodes = p.order(t0);
        p.mark_dead(&nodes[1], t0); // b: back at t0 + 1 s
        p.mark_dead(&nodes[0], t0 + Duration::from_millis(100)); // a: later
        p.mark_dead(&nodes[2], t0 + Duration::from_millis(200)); // c: latest
        assert_eq!(p.dead_count(t0 + Duration::from_millis(300)), 3);
        assert_eq!(ports(&p.order(t0 + Duration::from_millis(300))), [2, 1, 3]);
    }

    #[tokio::test]
    async fn a_refused_connection_moves_on_to_the_next_node() {
        // A port that refuses: bound, then closed.
        let refusing = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let dead = refusing.local_addr().unwrap().port();
        drop(refusing);
        let live = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = live.local_addr().unwrap().port();
        tokio::spawn(async move {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            loop {
                let (mut s, _) = live.accept().await.unwrap();
                let mut buf = [0u8; 4096];
                let _ = s.read(&mut buf).await;
                let _ = s
                    .write_all(
                        b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{}",
                    )
                    .await;
            }
        });
        let t0 = Instant::now();
        let p = pool(
            &[
                &format!("http://127.0.0.1:{dead}"),
                &format!("http://127.0.0.1:{port}"),
            ],
            false,
            t0,
        );
        for _ in 0..3 {
            let r = p
                .send(
                    Method::Post,
                    "/_bulk",
                    HeaderMap::new(),
                    None,
                    Some(b"x"),
                    None,
                )
                .await;
            assert_eq!(r.map(|r| r.status_code().as_u16()).ok(), Some(200));
        }
        assert_eq!(p.dead_count(Instant::now()), 1);
    }

    #[tokio::test]
    async fn a_request_sent_and_then_lost_is_not_resent() {
        // The first node reads the request and hangs up without answering;
        // the second would answer. The request must not reach the second.
        use std::sync::atomic::AtomicUsize;
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let hangs = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let hang_port = hangs.local_addr().unwrap().port();
        tokio::spawn(async move {
            loop {
                let (mut s, _) = hangs.accept().await.unwrap();
                let mut buf = [0u8; 4096];
                let _ = s.read(&mut buf).await;
                drop(s);
            }
        });
        let other = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let other_port = other.local_addr().unwrap().port();
        let reached = Arc::new(AtomicUsize::new(0));
        let seen = reached.clone();
        tokio::spawn(async move {
            loop {
                let (mut s, _) = other.accept().await.unwrap();
                seen.fetch_add(1, Ordering::SeqCst);
                let mut buf = [0u8; 4096];
                let _ = s.read(&mut buf).await;
                let _ = s
                    .write_all(
                        b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{}",
                    )
                    .await;
            }
        });
        let t0 = Instant::now();
        let p = pool(
            &[
                &format!("http://127.0.0.1:{hang_port}"),
                &format!("http://127.0.0.1:{other_port}"),
            ],
            false,
            t0,
        );
        let r = p
            .send(
                Method::Post,
                "/_bulk",
                HeaderMap::new(),
                None,
                Some(b"x"),
                None,
            )
            .await;
        let Err(e) = r else {
            panic!("the hung-up request must fail")
        };
        assert!(!e.not_sent, "sent, outcome unknown: {}", e.message);
        assert_eq!(
            reached.load(Ordering::SeqCst),
            0,
            "never resent to another node"
        );
        assert_eq!(p.dead_count(Instant::now()), 1);
    }

    #[test]
    fn sniffing_reads_published_http_addresses_only() {
        let answer = json!({"nodes": {
            "n1": {"http": {"publish_address": "127.0.0.1:9201"}},
            "n2": {"http": {"publish_address": "es-2.local/10.0.0.2:9200"}},
            "n3": {"http": {"publish_address": "[::1]:9203"}},
            "n4": {},
            "n5": {"http": {"publish_address": "not an address"}},
        }});
        let urls: Vec<String> = sniffed_urls(&answer, "https")
            .iter()
            .map(Url::to_string)
            .collect();
        assert_eq!(
            urls,
            [
                "https://10.0.0.2:9200/",
                "https://127.0.0.1:9201/",
                "https://[::1]:9203/"
            ]
        );
        assert!(sniffed_urls(&json!({"error": "x"}), "http").is_empty());
        assert!(sniffed_urls(&Value::Null, "http").is_empty());
    }

    #[test]
    fn a_sniff_keeps_the_seeds_and_the_health_of_known_nodes() {
        let t0 = Instant::now();
        let p = pool(&["http://seed:9200"], true, t0);
        assert!(p.take_sniff_due(t0), "due at start");
        assert!(!p.take_sniff_due(t0), "one sniff at a time");
        let u = |s: &str| Url::parse(s).unwrap();
        p.replace_sniffed(vec![u("http://n1:9200"), u("http://n2:9200")])
            .unwrap();
        assert_eq!(p.urls().len(), 3);
        let n1 = p
            .order(t0)
            .into_iter()
            .find(|n| n.url.host_str() == Some("n1"))
            .unwrap();
        p.mark_dead(&n1, t0);
        // A node's death brings the next sniff nearer.
        assert!(p.take_sniff_due(t0 + SNIFF_AFTER_FAILURE));
        p.replace_sniffed(vec![u("http://n1:9200"), u("http://n3:9200")])
            .unwrap();
        let mut hosts: Vec<String> = p
            .urls()
            .iter()
            .map(|s| u(s).host_str().unwrap().to_string())
            .collect();
        hosts.sort();
        assert_eq!(hosts, ["n1", "n3", "seed"], "n2 dropped, the seed kept");
        assert_eq!(p.dead_count(t0), 1, "n1 is still set aside");
        assert!(!pool(&["http://a:1"], false, t0).take_sniff_due(t0));
    }
}
