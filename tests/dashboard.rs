//! The built-in dashboard: the files it is served from (HTTP tests that
//! always run), and the page itself rendered by a real headless Chromium
//! over a gateway filled with known data (ignored by default: they need
//! `chromium`; `scripts/test.sh` runs them with `--ignored` when it has one).
//! A dumped DOM shows what the page drew (a key from a link, used only
//! after a click, is not used by a page nobody clicks).

mod common;

use chrono::Duration as Days;
use common::chromium::run_chromium;
use common::{key_line, rfc3339, test_now, Options, TestApp};
use serde_json::json;
use std::collections::HashMap;
use std::path::Path;

// --- the files, over HTTP -----------------------------------------------------

#[tokio::test]
async fn the_page_and_its_files_are_served_with_type_cache_and_policy_headers() {
    let app = TestApp::start().await;
    for (path, ctype) in [
        ("/dashboard", "text/html; charset=utf-8"),
        ("/dashboard/dashboard.js", "text/javascript; charset=utf-8"),
        ("/dashboard/dashboard.css", "text/css; charset=utf-8"),
    ] {
        let r = app.get(path).await;
        assert_eq!(r.status, 200, "{path}: {}", r.text);
        assert_eq!(r.header("content-type"), Some(ctype), "{path}");
        assert_eq!(r.header("cache-control"), Some("no-cache"), "{path}");
        assert_eq!(r.header("x-content-type-options"), Some("nosniff"));
        let csp = r.header("content-security-policy").unwrap_or_default();
        assert!(csp.contains("default-src 'none'"), "{csp}");
        assert!(csp.contains("script-src 'self'"), "{csp}");
        assert!(csp.contains("connect-src 'self'"), "{csp}");
        let etag = r.header("etag").expect("an ETag").to_string();
        // Nothing comes from another host: no absolute URL but the SVG namespace.
        let outside = r
            .text
            .match_indices("http")
            .filter(|(i, _)| !r.text[*i..].starts_with("http://www.w3.org/2000/svg"))
            .count();
        assert_eq!(outside, 0, "{path} names another host");
        let again = app
            .send(
                app.http
                    .get(app.url(path))
                    .header("if-none-match", etag.as_str()),
            )
            .await;
        assert_eq!(again.status, 304, "{path}");
        assert!(again.text.is_empty());
    }
    let page = app.get("/dashboard").await.text;
    assert!(page.contains("src=\"/dashboard/dashboard.js\""));
    assert!(page.contains("href=\"/dashboard/dashboard.css\""));
    // The page keeps the key in sessionStorage and sends it as a header.
    let js = app.get("/dashboard/dashboard.js").await.text;
    assert!(js.contains("sessionStorage"));
    assert!(js.contains("\"Bearer \""));
    assert!(!js.contains("localStorage"));
}

#[tokio::test]
async fn the_page_needs_no_key_but_its_data_does() {
    let app = TestApp::start_with(Options {
        keys: key_line("read", "*", "good-read"),
        ..Options::default()
    })
    .await;
    assert_eq!(app.get("/dashboard").await.status, 200);
    assert_eq!(app.get("/dashboard/dashboard.js").await.status, 200);
    assert_eq!(app.get("/v1/top/VIDEO/VIEW").await.status, 401);
}

// --- the page, in a real browser ------------------------------------------------

/// Known data, relative to the app's clock:
/// VIDEO/VIEW: `a` 10 twenty days ago and 1 now (11); `b` 5 a day ago and 3
/// three days ago (8); `c` 2 now, category `sports`; `old` 1 forty days ago
/// and `older` 1 fifty days ago (stale). ARTICLE/share `x` 1 forty-five days ago (an unused pair).
/// VIDEO/RATING averages: `r1` 5, 5; `r2` 4, 4, 4; `r3` 5.
async fn fill(app: &TestApp, key: Option<&str>) {
    let now = test_now();
    let at = |days: i64| rfc3339(now - Days::days(days));
    let mut events = Vec::new();
    for (e, a, u, count, days, category) in [
        ("VIDEO", "VIEW", "a", 10, 20, None),
        ("VIDEO", "VIEW", "a", 1, 0, None),
        ("VIDEO", "VIEW", "b", 5, 1, None),
        ("VIDEO", "VIEW", "b", 3, 3, None),
        ("VIDEO", "VIEW", "c", 2, 0, Some("sports")),
        ("VIDEO", "VIEW", "old", 1, 40, None),
        ("VIDEO", "VIEW", "older", 1, 50, None),
        ("ARTICLE", "share", "x", 1, 45, None),
    ] {
        let mut ev =
            json!({"entity": e, "action": a, "uuid": u, "count": count, "timestamp": at(days)});
        if let Some(c) = category {
            ev["category"] = json!(c);
        }
        events.push(ev);
    }
    let mut req = app
        .http
        .post(app.url("/v1/events"))
        .json(&json!({ "events": events }));
    if let Some(k) = key {
        req = req.bearer_auth(k);
    }
    let r = app.send(req).await;
    assert_eq!(r.status, 200, "{}", r.text);
    for (uuid, values) in [("r1", &[5, 5][..]), ("r2", &[4, 4, 4]), ("r3", &[5])] {
        for v in values {
            let mut req = app
                .http
                .post(app.url(&format!("/v1/averages/VIDEO/RATING/{uuid}")))
                .json(&json!({ "value": v }));
            if let Some(k) = key {
                req = req.bearer_auth(k);
            }
            let r = app.send(req).await;
            assert_eq!(r.status, 200, "{}", r.text);
        }
    }
}

/// The DOM after the page's scripts ran, as Chromium serializes it.
async fn dump_dom(url: String) -> String {
    tokio::task::spawn_blocking(move || run_chromium(&url, &["--dump-dom"]))
        .await
        .expect("chromium task")
}

/// The part of `dom` from the element with `id` to the end of its table
/// (or svg).
fn part<'a>(dom: &'a str, id: &str) -> &'a str {
    let start = dom
        .find(&format!("id=\"{id}\""))
        .unwrap_or_else(|| panic!("no #{id} in\n{dom}"));
    let rest = &dom[start..];
    let end = ["</table>", "</svg>"]
        .iter()
        .filter_map(|t| rest.find(t))
        .min()
        .unwrap_or(rest.len());
    &rest[..end]
}

/// The attributes of every `<tag ...>` start tag in `html` (values unescaped
/// only for `&amp;`, enough for these tests).
fn tags(html: &str, tag: &str) -> Vec<HashMap<String, String>> {
    let open = format!("<{tag} ");
    html.match_indices(&open)
        .map(|(i, _)| {
            let rest = &html[i + open.len()..];
            let inside = &rest[..rest.find('>').expect("a closed tag")];
            let mut attrs = HashMap::new();
            let mut s = inside;
            while let Some(eq) = s.find("=\"") {
                let name = s[..eq].trim().to_string();
                let after = &s[eq + 2..];
                let close = after.find('"').expect("a quoted value");
                attrs.insert(name, after[..close].replace("&amp;", "&"));
                s = &after[close + 1..];
            }
            attrs
        })
        .collect()
}

/// `(uuid, value)` of the rows of the top list, in order.
fn top_rows(dom: &str) -> Vec<(String, i64)> {
    tags(part(dom, "top"), "tr")
        .into_iter()
        .filter_map(|a| {
            let uuid = a.get("data-uuid")?.clone();
            Some((uuid, a["data-value"].parse().unwrap()))
        })
        .collect()
}

/// The uuids of the trending list's rows, in order.
fn trending_rows(dom: &str) -> Vec<String> {
    tags(part(dom, "trending"), "tr")
        .into_iter()
        .filter_map(|a| a.get("data-uuid").cloned())
        .collect()
}

fn rows(expected: &[(&str, i64)]) -> Vec<(String, i64)> {
    expected.iter().map(|(u, v)| (u.to_string(), *v)).collect()
}

fn message(dom: &str) -> String {
    let start = dom.find("id=\"message\"").expect("a message element");
    let rest = &dom[start..];
    let text = &rest[rest.find('>').unwrap() + 1..rest.find("</div>").unwrap()];
    text.to_string()
}

fn day(days_ago: i64) -> String {
    (test_now() - Days::days(days_ago))
        .format("%Y-%m-%d")
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs chromium (scripts/test.sh installs it and runs this with --ignored)"]
async fn the_dashboard_renders_top_lists_chart_and_reports_in_a_browser() {
    let app = TestApp::start().await;
    fill(&app, None).await;
    let page = app.url("/dashboard");

    // All time, with the averages of another action and the reports; the
    // page refreshes on its own (every 2 s here) while open.
    let dom = dump_dom(format!(
        "{page}#entity=VIDEO&action=VIEW&avg_action=RATING&min_quantity=2&days=30&refresh=2"
    ))
    .await;
    assert_eq!(
        top_rows(&dom),
        rows(&[("a", 11), ("b", 8), ("c", 2), ("old", 1), ("older", 1)]),
        "{dom}"
    );
    let refreshes: u32 = dom
        .split("data-refreshes=\"")
        .nth(1)
        .and_then(|s| s.split('"').next())
        .and_then(|n| n.parse().ok())
        .expect("the page counts its refreshes");
    assert!(refreshes >= 2, "refreshed {refreshes} times in 8 s");
    // Trending with a day's half-life (the default): b's 5 a day ago and 3
    // three days ago (about 2.9) pass c's 2 now and a's 1 now (its 10,
    // twenty days old, weigh a millionth); old and older lie past 20
    // half-lives.
    assert_eq!(trending_rows(&dom), ["b", "c", "a"], "{dom}");
    assert!(part(&dom, "trending-section").contains("half-life 24h"));
    assert!(part(&dom, "trending").contains("class=\"num score\">2<"));
    let averages: Vec<String> = tags(part(&dom, "averages"), "tr")
        .into_iter()
        .filter_map(|a| a.get("data-uuid").cloned())
        .collect();
    assert_eq!(averages, ["r1", "r2"], "min quantity 2 leaves r3 out");
    assert!(part(&dom, "averages").contains(">5.00<"));
    assert!(!part(&dom, "averages").contains("class=\"num score\">4"));

    // An hour's half-life keeps only what is within 20 hours; a week's
    // lets a's 10 twenty days ago count (1 + 10·2^(-20/7), about 2.4).
    let dom = dump_dom(format!("{page}#entity=VIDEO&action=VIEW&half_life=1h")).await;
    assert_eq!(trending_rows(&dom), ["c", "a"], "{dom}");
    let dom = dump_dom(format!("{page}#entity=VIDEO&action=VIEW&half_life=7d")).await;
    assert_eq!(
        trending_rows(&dom),
        ["b", "a", "c", "old", "older"],
        "{dom}"
    );

    // The Bayesian rank: m = min. quantity = 1, C = (5 + 4 + 5) / 3, so r1
    // scores (10 + C) / 3 = 4.889, r3 (5 + C) / 2 = 4.833, r2 (12 + C) / 4.
    let dom = dump_dom(format!(
        "{page}#entity=VIDEO&action=VIEW&avg_action=RATING&rank=bayesian"
    ))
    .await;
    let averages: Vec<String> = tags(part(&dom, "averages"), "tr")
        .into_iter()
        .filter_map(|a| a.get("data-uuid").cloned())
        .collect();
    assert_eq!(averages, ["r1", "r3", "r2"], "{dom}");
    let table = part(&dom, "averages");
    for score in [">4.889<", ">4.833<", ">4.167<"] {
        assert!(table.contains(score), "{score} in {table}");
    }
    let stale: Vec<String> = tags(part(&dom, "stale"), "tr")
        .into_iter()
        .filter_map(|a| a.get("data-id").cloned())
        .collect();
    assert_eq!(stale, ["VIDEO_VIEW_older", "VIDEO_VIEW_old"]);
    let unused = part(&dom, "unused");
    assert!(
        unused.contains("<td>ARTICLE</td><td>share</td>"),
        "{unused}"
    );
    assert!(!unused.contains("VIDEO"), "{unused}");
    // Without a chosen counter, the chart shows the first of the list.
    let chart = tags(&dom, "svg")
        .into_iter()
        .find(|a| a.get("id").map(String::as_str) == Some("chart"))
        .expect("the chart");
    assert_eq!(chart["data-uuid"], "a");
    assert_eq!(message(&dom), "");

    // Another window, another list; the chart of `b` has one point a day.
    let dom = dump_dom(format!(
        "{page}#entity=VIDEO&action=VIEW&interval=last_week&uuid=b"
    ))
    .await;
    assert_eq!(
        top_rows(&dom),
        rows(&[("b", 8), ("c", 2), ("a", 1)]),
        "{dom}"
    );
    let points = tags(part(&dom, "chart"), "circle");
    let series: Vec<(String, i64)> = points
        .iter()
        .map(|p| (p["data-day"].clone(), p["data-value"].parse().unwrap()))
        .collect();
    let expected: Vec<(String, i64)> = (0..7)
        .rev()
        .map(|d| (day(d), [0, 5, 0, 3, 0, 0, 0][d as usize]))
        .collect();
    assert_eq!(series, expected);
    assert!(part(&dom, "top").contains("class=\"selected\""));

    // A category filter, and a from/to range.
    let dom = dump_dom(format!(
        "{page}#entity=VIDEO&action=VIEW&interval=last_week&category=sports"
    ))
    .await;
    assert_eq!(top_rows(&dom), rows(&[("c", 2)]), "{dom}");
    let dom = dump_dom(format!(
        "{page}#entity=VIDEO&action=VIEW&from={}&to={}",
        day(25),
        day(15)
    ))
    .await;
    assert_eq!(top_rows(&dom), rows(&[("a", 10)]), "{dom}");

    // The stale report a page at a time: the oldest first, then a next page.
    let dom = dump_dom(format!("{page}#entity=VIDEO&action=VIEW&days=30&size=1")).await;
    let stale: Vec<String> = tags(part(&dom, "stale"), "tr")
        .into_iter()
        .filter_map(|a| a.get("data-id").cloned())
        .collect();
    assert_eq!(stale, ["VIDEO_VIEW_older"]);
    let buttons = tags(&dom, "button");
    let disabled = |id: &str| {
        buttons
            .iter()
            .find(|b| b.get("id").map(String::as_str) == Some(id))
            .unwrap_or_else(|| panic!("no #{id}"))
            .contains_key("disabled")
    };
    assert!(disabled("stale-prev") && !disabled("stale-next"));

    // What the page looks like, for people (target/ is not committed).
    let shot = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/dashboard.png");
    let _ = std::fs::remove_file(&shot);
    let arg = format!("--screenshot={}", shot.display());
    let url =
        format!("{page}#entity=VIDEO&action=VIEW&interval=last_week&uuid=b&avg_action=RATING");
    tokio::task::spawn_blocking(move || run_chromium(&url, &[&arg, "--window-size=1280,900"]))
        .await
        .expect("chromium task");
    assert!(shot.exists(), "no screenshot at {}", shot.display());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs chromium (scripts/test.sh installs it and runs this with --ignored)"]
async fn the_dashboard_says_clearly_when_the_read_key_is_missing() {
    let app = TestApp::start_with(Options {
        keys: key_line("read", "*", "good-read") + &key_line("write", "*", "w"),
        ..Options::default()
    })
    .await;
    fill(&app, Some("w")).await;
    let dom = dump_dom(app.url("/dashboard#entity=VIDEO&action=VIEW")).await;
    let m = message(&dom);
    assert!(m.starts_with("This gateway needs a read key"), "{m}");
    assert!(top_rows(&dom).is_empty(), "{dom}");
}

/// Whether the element with `id` carries `hidden`.
fn hidden(dom: &str, tag: &str, id: &str) -> bool {
    tags(dom, tag)
        .iter()
        .find(|a| a.get("id").map(String::as_str) == Some(id))
        .unwrap_or_else(|| panic!("no #{id}"))
        .contains_key("hidden")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs chromium (scripts/test.sh installs it and runs this with --ignored)"]
async fn a_key_from_a_link_is_not_used_before_the_user_accepts_it() {
    let app = TestApp::start_with(Options {
        keys: key_line("read", "*", "good-read") + &key_line("write", "*", "w"),
        ..Options::default()
    })
    .await;
    fill(&app, Some("w")).await;
    // A valid key in the link: the page asks without it (the gateway's
    // answer says no key was sent) and offers it with its button.
    let dom = dump_dom(app.url("/dashboard#entity=VIDEO&action=VIEW&key=good-read")).await;
    let m = message(&dom);
    assert!(m.starts_with("This gateway needs a read key"), "{m}");
    assert!(top_rows(&dom).is_empty(), "{dom}");
    assert!(!hidden(&dom, "div", "link-key"), "the offer is shown");
    assert!(dom.contains("id=\"use-link-key\""), "{dom}");
    assert_eq!(span_text(&dom, "key-state"), "no key");
}

/// The text of the element with `id` (a `<span>`) in `dom`.
fn span_text(dom: &str, id: &str) -> String {
    let start = dom
        .find(&format!("id=\"{id}\">"))
        .unwrap_or_else(|| panic!("no #{id}"));
    let rest = &dom[start + id.len() + 6..];
    rest[..rest.find("</span>").expect("a closed span")].to_string()
}

fn refreshes(dom: &str) -> u32 {
    dom.split("data-refreshes=\"")
        .nth(1)
        .and_then(|s| s.split('"').next())
        .and_then(|n| n.parse().ok())
        .expect("the page counts its refreshes")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs chromium (scripts/test.sh installs it and runs this with --ignored)"]
async fn the_refresh_interval_from_a_link_is_held_within_bounds_and_the_page_says_so() {
    let app = TestApp::start().await;
    fill(&app, None).await;
    let page = app.url("/dashboard#entity=VIDEO&action=VIEW");
    // A millisecond is held at 2 s: over the 8 s of Chromium's virtual
    // time the page refreshes at most 1 + 8 / 2 times, not thousands.
    let dom = dump_dom(format!("{page}&refresh=0.001")).await;
    assert_eq!(
        span_text(&dom, "refresh-note"),
        "refreshes every 2 s while open, the shortest interval (0.001 s was asked)"
    );
    let n = refreshes(&dom);
    assert!((2..=5).contains(&n), "{n} refreshes in 8 s of virtual time");
    assert_eq!(
        top_rows(&dom),
        rows(&[("a", 11), ("b", 8), ("c", 2), ("old", 1), ("older", 1)])
    );

    let dom = dump_dom(format!("{page}&refresh=1e9")).await;
    assert_eq!(
        span_text(&dom, "refresh-note"),
        "refreshes every 3600 s while open, the longest interval (1e9 s was asked)"
    );
    assert_eq!(refreshes(&dom), 1);
    let dom = dump_dom(format!("{page}&refresh=soon")).await;
    assert_eq!(
        span_text(&dom, "refresh-note"),
        "refreshes every 5 s while open (refresh=soon is not a number of seconds)"
    );
    let dom = dump_dom(format!("{page}&refresh=0")).await;
    assert_eq!(span_text(&dom, "refresh-note"), "automatic refresh is off");
    assert_eq!(refreshes(&dom), 1);
}

/// The store, with top lists that show every value as 0: what the page
/// shows beyond that came through the live stream.
struct ZeroTops {
    store: std::sync::Arc<dyn counter_gateway::store::Store>,
}

impl std::ops::Deref for ZeroTops {
    type Target = dyn counter_gateway::store::Store;
    fn deref(&self) -> &Self::Target {
        &*self.store
    }
}

impl ZeroTops {
    async fn top(
        &self,
        q: &counter_gateway::store::TopQuery,
    ) -> Result<counter_gateway::store::TopList, counter_gateway::store::StoreError> {
        let mut list = self.store.top(q).await?;
        list.entries.iter_mut().for_each(|e| e.value = 0);
        Ok(list)
    }
}

struct Zeroed {
    inner: ZeroTops,
}

store_wrapper!(Zeroed, |self, batch| { self.inner.apply(batch).await });

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs chromium (scripts/test.sh installs it and runs this with --ignored)"]
async fn the_top_lists_values_follow_the_live_stream() {
    let app = TestApp::start_wrapped(Options::default(), |store| {
        std::sync::Arc::new(Zeroed {
            inner: ZeroTops { store },
        })
    })
    .await;
    fill(&app, None).await;
    // No automatic refresh: one top list, every value 0 in it; the values
    // shown are the stream's.
    let dom = dump_dom(format!(
        "{}#entity=VIDEO&action=VIEW&refresh=0",
        app.url("/dashboard")
    ))
    .await;
    assert_eq!(
        top_rows(&dom),
        rows(&[("a", 11), ("b", 8), ("c", 2), ("old", 1), ("older", 1)]),
        "{dom}"
    );
    assert!(dom.contains("data-live-events=\""), "{dom}");
}
