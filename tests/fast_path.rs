//! The single increment's fast path (`src/api/fast.rs`) answers exactly
//! what the router would: a table of good and bad requests goes to two
//! gateways configured alike, one serving as `serve` does (the fast path in
//! front of the router) and one the router alone, in the same order, and
//! every answer (status, headers but `date`, body) and the request metrics
//! must be the same. The table covers what the fast path answers itself
//! (plain increments, tenants, keys and roles, crawlers, rate limits, the
//! name checks) and what it must leave to the router (a query string, a
//! body, a percent-encoded segment, refused hosts and pages, content types,
//! other methods, CORS).

mod common;

use common::{key_line, Options, Resp, TestApp};
use reqwest::Method;

const WRITE: &str = "w-0123456789abcdef";
const READ: &str = "r-0123456789abcdef";
const ADMIN: &str = "a-0123456789abcdef";
const SHOP_WRITE: &str = "ws-0123456789abcdef";

/// One request of the table: method, path, headers, body.
struct Req {
    method: Method,
    path: String,
    headers: Vec<(&'static str, String)>,
    body: Option<&'static str>,
}

fn post(path: &str) -> Req {
    Req {
        method: Method::POST,
        path: path.into(),
        headers: Vec::new(),
        body: None,
    }
}

impl Req {
    fn header(mut self, name: &'static str, value: &str) -> Req {
        self.headers.push((name, value.into()));
        self
    }

    fn body(mut self, body: &'static str) -> Req {
        self.body = Some(body);
        self
    }

    fn method(mut self, method: Method) -> Req {
        self.method = method;
        self
    }

    async fn send(&self, app: &TestApp) -> Resp {
        let mut req = app.http.request(self.method.clone(), app.url(&self.path));
        for (name, value) in &self.headers {
            req = req.header(*name, value);
        }
        if let Some(body) = self.body {
            req = req.body(body);
        }
        app.send(req).await
    }
}

fn inc(uuid: &str) -> String {
    format!("/v1/counters/VIDEO/VIEW/{uuid}/increment")
}

/// Sends `table` to a fast-path gateway and a router-only one made with
/// `options`, in order, and compares every answer and the request metrics.
/// Answers how many answers were 200, to show the table counted.
async fn same_answers(options: Options, table: Vec<Req>) -> usize {
    let fast = TestApp::start_with(Options {
        router_only: false,
        ..options.clone()
    })
    .await;
    let router = TestApp::start_with(Options {
        router_only: true,
        ..options
    })
    .await;
    let mut ok = 0;
    for (i, req) in table.iter().enumerate() {
        let (a, b) = (req.send(&fast).await, req.send(&router).await);
        let what = format!("request {i}: {} {} {:?}", req.method, req.path, req.headers);
        assert_eq!(a.status, b.status, "{what}: {} / {}", a.text, b.text);
        assert_eq!(a.text, b.text, "{what}");
        let headers = |r: &Resp| {
            let mut h: Vec<(String, String)> = r
                .headers
                .iter()
                .filter(|(name, _)| name.as_str() != "date")
                .map(|(name, value)| (name.to_string(), value.to_str().unwrap_or("?").to_owned()))
                .collect();
            h.sort();
            h
        };
        assert_eq!(headers(&a), headers(&b), "{what}");
        ok += usize::from(a.status == 200);
    }
    let requests = |text: String| -> Vec<String> {
        text.lines()
            .filter(|l| l.starts_with("counter_gateway_http_requests_total"))
            .map(str::to_owned)
            .collect()
    };
    // Read in the process: `/metrics` itself may need a key or be limited.
    let (a, b) = (
        requests(fast.state.metrics.render(0, 0, 0, 0)),
        requests(router.state.metrics.render(0, 0, 0, 0)),
    );
    assert!(
        a.iter().any(|l| l.contains("/increment\",method=\"POST\"")),
        "{a:?}"
    );
    assert_eq!(a, b, "the request metrics");
    ok
}

const CRAWLER: &str = "Mozilla/5.0 (compatible; Googlebot/2.1; +http://www.google.com/bot.html)";

#[tokio::test]
async fn a_keyless_gateway_answers_alike() {
    let long = "x".repeat(300);
    let table = vec![
        post(&inc("a")),
        post(&inc("a")),
        post(&inc("b")).header("content-type", "application/json"),
        post(&inc("b")).header("content-type", "Text/Plain; charset=UTF-8"),
        post(&inc("b")).header("content-type", "text/html"),
        post(&inc("b")).header("content-length", "0"),
        // Tenants.
        post(&inc("a")).header("x-tenant", "shop"),
        post(&inc("a")).header("x-tenant", "shop"),
        post(&inc("a")).header("x-tenant", "not a tenant!"),
        post(&format!("{}?tenant=shop", inc("a"))),
        post(&format!("{}?tenant=other", inc("a"))).header("x-tenant", "shop"),
        // Names the domain refuses, and names the router decodes.
        post(&format!("/v1/counters/VIDEO/VIEW/{long}/increment")),
        post("/v1/counters/VIDEO/VI*EW/a/increment"),
        post("/v1/counters/VIDEO/VIEW/%C3%A9t%C3%A9/increment"),
        post("/v1/counters/VIDEO/VIEW/a%2Fb/increment"),
        post("/v1/counters/VIDEO/VIEW/%FF/increment"),
        post("/v1/counters/VIDEO//a/increment"),
        post("/v1/counters/VIDEO/VIEW/a/increment/"),
        // Bodies.
        post(&inc("c")).body(r#"{"count": 5}"#),
        post(&inc("c"))
            .header("content-type", "application/json")
            .body(r#"{"count": 5, "nope": 1}"#),
        post(&inc("c")).body("   "),
        // Hosts and pages.
        post(&inc("a")).header("host", "evil.example"),
        post(&inc("a")).header("host", "localhost:9"),
        post(&inc("a")).header("origin", "https://evil.example"),
        post(&inc("a")).header("referer", "https://evil.example/page"),
        post(&inc("a")).header("sec-fetch-site", "cross-site"),
        post(&inc("a")).header("origin", "http://localhost:3000"),
        // Crawlers: browser ingestion from a known one is ignored.
        post(&inc("d")).header("user-agent", CRAWLER),
        post(&inc("d"))
            .header("user-agent", CRAWLER)
            .header("content-type", "text/plain"),
        post(&inc("d"))
            .header("user-agent", CRAWLER)
            .header("origin", "http://localhost:3000"),
        post(&inc("d")).header(
            "user-agent",
            "Mozilla/5.0 (X11; Linux x86_64) Firefox/120.0",
        ),
        // Other methods and routes.
        post(&inc("a")).method(Method::GET),
        post(&inc("a")).method(Method::PUT),
        post("/v1/counters/VIDEO/VIEW/a/decrement"),
        post("/v1/counters/VIDEO/VIEW/a").method(Method::GET),
    ];
    let ok = same_answers(Options::default(), table).await;
    assert!(ok >= 10, "{ok} answers were 200");
}

fn keyed() -> Options {
    Options {
        keys: [
            key_line("write", "*", WRITE),
            key_line("read", "*", READ),
            key_line("admin", "*", ADMIN),
            key_line("write", "shop", SHOP_WRITE),
        ]
        .concat(),
        ..Options::default()
    }
}

fn keyed_table() -> Vec<Req> {
    let bearer = |k: &str| format!("Bearer {k}");
    vec![
        post(&inc("a")),
        post(&inc("a")).header("authorization", &bearer("nope")),
        post(&inc("a")).header("authorization", "Basic abc"),
        post(&inc("a")).header("authorization", "Bearer "),
        post(&inc("a")).header("authorization", &bearer(READ)),
        post(&inc("a")).header("authorization", &bearer(WRITE)),
        post(&inc("a")).header("authorization", &bearer(ADMIN)),
        post(&inc("a"))
            .header("authorization", &bearer(ADMIN))
            .header("x-tenant", "shop"),
        post(&inc("a")).header("authorization", &bearer(SHOP_WRITE)),
        post(&inc("a"))
            .header("authorization", &bearer(SHOP_WRITE))
            .header("x-tenant", "shop"),
        post(&inc("a"))
            .header("authorization", &bearer(SHOP_WRITE))
            .header("x-tenant", "other"),
        post(&format!("{}?key={WRITE}", inc("a"))),
        // With keys, any Host and page: the key decides.
        post(&inc("a"))
            .header("authorization", &bearer(WRITE))
            .header("host", "counts.example")
            .header("origin", "https://evil.example"),
        // A write key's crawler with a browser's agent.
        post(&inc("d"))
            .header("authorization", &bearer(WRITE))
            .header("user-agent", CRAWLER),
        post(&inc("d"))
            .header("authorization", &bearer(ADMIN))
            .header("user-agent", CRAWLER),
    ]
}

#[tokio::test]
async fn keys_roles_and_tenants_are_answered_alike() {
    let ok = same_answers(keyed(), keyed_table()).await;
    assert!(ok >= 5, "{ok} answers were 200");
    let ok = same_answers(
        Options {
            write_keys_read_values: true,
            ..keyed()
        },
        keyed_table(),
    )
    .await;
    assert!(ok >= 5, "{ok} answers were 200");
}

#[tokio::test]
async fn rate_limits_count_the_fast_path_too() {
    // A burst of one a second: the second request within the second is
    // refused, by address (keyless) as by key; the fast path is limited
    // by the same buckets as the router.
    let table = vec![post(&inc("a")), post(&inc("a")), post(&inc("b"))];
    let ok = same_answers(
        Options {
            rate_limit_per_second: Some(1),
            ..Options::default()
        },
        table,
    )
    .await;
    assert_eq!(ok, 1);
    let bearer = format!("Bearer {WRITE}");
    let table = vec![
        post(&inc("a")).header("authorization", &bearer),
        post(&inc("a")).header("authorization", &bearer),
        post(&inc("a")).header("authorization", "Bearer nope"),
    ];
    let ok = same_answers(
        Options {
            rate_limit_per_second: Some(1),
            ..keyed()
        },
        table,
    )
    .await;
    assert_eq!(ok, 1);
}

#[tokio::test]
async fn cors_and_timeouts_are_answered_alike() {
    let table = vec![
        post(&inc("a")),
        post(&inc("a")).header("origin", "https://shop.example"),
        post(&inc("a")).header("origin", "https://evil.example"),
        post(&inc("a"))
            .method(Method::OPTIONS)
            .header("origin", "https://shop.example")
            .header("access-control-request-method", "POST"),
    ];
    same_answers(
        Options {
            cors_origins: vec!["https://shop.example".into()],
            ..Options::default()
        },
        table,
    )
    .await;
    let table = vec![post(&inc("a")), post(&inc("a")).header("x-tenant", "shop")];
    let ok = same_answers(
        Options {
            request_timeout: Some(std::time::Duration::from_secs(30)),
            ..Options::default()
        },
        table,
    )
    .await;
    assert_eq!(ok, 2);
}
