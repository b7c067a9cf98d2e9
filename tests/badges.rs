//! Badges over HTTP (a real listener) on the embedded store: the SVG read
//! back by an XML parser in every style, hostile labels drawn as text,
//! sizes that follow the text, the keys that may read and count, cache
//! headers per key, cross-site counting on a keyless gateway, and the
//! badge rendered by headless Chromium (ignored by default: it needs
//! `chromium`; `scripts/test.sh` runs it with `--ignored` when it has one).
//! What badges count and show, on both stores, is the conformance
//! scenario `tests/conformance/scenarios/badges.json`.

mod common;

use common::{assert_error, key_line, Options, Resp, TestApp};
use serde_json::json;

const CHROME: &str = "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0.0.0 Safari/537.36";

async fn get(app: &TestApp, path: &str, key: Option<&str>) -> Resp {
    let mut req = app.http.get(app.url(path)).header("user-agent", CHROME);
    if let Some(k) = key {
        req = req.bearer_auth(k);
    }
    app.send(req).await
}

/// The badge parsed: the root's width and height, and the text of every
/// `<text>` that is not a shadow, in order.
fn parse(svg: &str) -> (f64, f64, Vec<String>) {
    let doc = roxmltree::Document::parse(svg).unwrap_or_else(|e| panic!("not XML ({e}): {svg}"));
    let root = doc.root_element();
    assert_eq!(root.tag_name().name(), "svg");
    assert_eq!(
        root.tag_name().namespace(),
        Some("http://www.w3.org/2000/svg")
    );
    let num = |n: &str| -> f64 { root.attribute(n).expect(n).parse().expect("a number") };
    let texts = root
        .descendants()
        .filter(|n| n.has_tag_name("text") && n.attribute("aria-hidden").is_none())
        .map(|n| n.text().unwrap_or_default().to_string())
        .collect();
    for n in root.descendants().filter(|n| n.is_element()) {
        assert!(
            [
                "svg",
                "title",
                "linearGradient",
                "stop",
                "clipPath",
                "rect",
                "g",
                "text"
            ]
            .contains(&n.tag_name().name()),
            "unexpected element {:?} in {svg}",
            n.tag_name()
        );
        for a in n.attributes() {
            assert!(!a.name().starts_with("on"), "an event attribute in {svg}");
        }
    }
    (num("width"), num("height"), texts)
}

/// The count a badge shows: the JSON's message, or the SVG's last text.
fn shown(r: &Resp) -> String {
    match r.json["message"].as_str() {
        Some(m) => m.to_string(),
        None => parse(&r.text).2.pop().expect("a text"),
    }
}

#[tokio::test]
async fn every_style_is_well_formed_svg_showing_label_and_count() {
    let app = TestApp::start().await;
    app.increment("REPO", "stars", "r1", json!({"count": 4321}))
        .await;
    for (style, height, label, message) in [
        ("flat", 20.0, "stars", "4.3k"),
        ("flat-square", 20.0, "stars", "4.3k"),
        ("for-the-badge", 28.0, "STARS", "4.3K"),
    ] {
        let r = get(
            &app,
            &format!("/v1/badge/REPO/stars/r1.svg?style={style}"),
            None,
        )
        .await;
        assert_eq!(r.status, 200, "{}", r.text);
        assert_eq!(r.header("content-type"), Some("image/svg+xml"));
        let (w, h, texts) = parse(&r.text);
        assert_eq!(h, height, "{style}");
        assert!(w > 40.0 && w < 200.0, "{style}: {w}");
        assert_eq!(texts, [label, message], "{style}");
    }
    let r = get(&app, "/v1/badge/REPO/stars/r1.svg?label=", None).await;
    assert_eq!(parse(&r.text).2, ["4.3k"]);
}

#[tokio::test]
async fn hostile_labels_are_text_and_nothing_else() {
    let app = TestApp::start().await;
    let label = r#"</text><script>alert('x')</script>&amp; "q" <![CDATA["#;
    let path = format!(
        "/v1/badge/REPO/views/r1.svg?label={}",
        common::encode(label)
    );
    let r = get(&app, &path, None).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let (_, _, texts) = parse(&r.text);
    assert_eq!(texts, [label, "0"]);
    let doc = roxmltree::Document::parse(&r.text).unwrap();
    let title = doc.descendants().find(|n| n.has_tag_name("title")).unwrap();
    assert_eq!(title.text(), Some(format!("{label}: 0").as_str()));
    assert_eq!(
        doc.root_element().attribute("aria-label"),
        Some(format!("{label}: 0").as_str())
    );
    // The JSON carries it as a string, unchanged.
    let r = get(
        &app,
        &format!("/v1/shields/REPO/views/r1?label={}", common::encode(label)),
        None,
    )
    .await;
    assert_eq!(r.json["label"], label);
    // A colour is never written as sent.
    let r = get(&app, "/v1/badge/REPO/views/r1.svg?color=%23ABC", None).await;
    assert!(r.text.contains(r##"fill="#abc""##), "{}", r.text);
}

#[tokio::test]
async fn a_badge_is_as_wide_as_its_text() {
    let app = TestApp::start().await;
    app.increment("REPO", "views", "w", json!({"count": 7}))
        .await;
    let width = |label: &'static str| {
        let app = &app;
        async move {
            let r = get(
                app,
                &format!("/v1/badge/REPO/views/w.svg?label={label}"),
                None,
            )
            .await;
            parse(&r.text).0
        }
    };
    // Wide letters make a wider badge than narrow ones of the same number.
    let (narrow, wide) = (width("iiiiiiii").await, width("MMMMMMMM").await);
    assert!(wide > narrow + 30.0, "{narrow} {wide}");
    // Every digit takes the same room: 1234567 is 6 digits wider than 7.
    let r = get(&app, "/v1/badge/REPO/views/w.svg?label=x", None).await;
    let short = parse(&r.text).0;
    app.increment("REPO", "views", "w", json!({"count": 1_234_560}))
        .await;
    let r = get(
        &app,
        "/v1/badge/REPO/views/w.svg?label=x&abbreviate=false",
        None,
    )
    .await;
    let (long, _, texts) = parse(&r.text);
    assert_eq!(texts[1], "1234567");
    let six_digits = long - short;
    assert!((41.0..=43.0).contains(&six_digits), "{six_digits}");
}

fn keyed() -> Options {
    Options {
        keys: key_line("public", "acme", "pub")
            + &key_line("read", "acme", "rd")
            + &key_line("write", "acme", "wr")
            + &key_line("admin", "acme", "adm")
            + &key_line("public", "other", "pub-other"),
        ..Options::default()
    }
}

#[tokio::test]
async fn keys_read_badges_as_the_multi_read_and_count_only_when_they_may_read() {
    let app = TestApp::start_with(keyed()).await;
    let r = app
        .send(
            app.http
                .post(app.url("/v1/counters/REPO/views/k/increment"))
                .bearer_auth("adm")
                .json(&json!({"count": 5})),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let badge = "/v1/badge/REPO/views/k.svg";
    let shields = "/v1/shields/REPO/views/k";
    for path in [badge, shields] {
        assert_error(
            &get(&app, path, None).await,
            401,
            "unauthorized",
            &["API key"],
        );
        assert_error(
            &get(&app, path, Some("nope")).await,
            401,
            "unauthorized",
            &[],
        );
        // A write key in a page reads nothing.
        assert_error(
            &get(&app, path, Some("wr")).await,
            403,
            "forbidden",
            &["public or read"],
        );
        for key in ["pub", "rd", "adm"] {
            let r = get(&app, path, Some(key)).await;
            assert_eq!(r.status, 200, "{key} {path}: {}", r.text);
            assert_eq!(shown(&r), "5");
        }
        // In the URL, as an image tag sends it.
        let r = get(&app, &format!("{path}?key=pub"), None).await;
        assert_eq!(r.status, 200, "{}", r.text);
        // Another tenant's key sees its own tenant: nothing counted there.
        let r = get(&app, &format!("{path}?key=pub-other&label=x"), None).await;
        assert_eq!(r.status, 200, "{}", r.text);
        assert_eq!(shown(&r), "0");
        let r = get(&app, &format!("{path}?key=pub-other&tenant=acme"), None).await;
        assert_error(&r, 403, "forbidden", &["tenant"]);
    }
    // count=true: a key that may count and read what it shows.
    for (key, says) in [
        ("pub", "needs a write key"),
        ("rd", "needs a write key"),
        ("wr", "--write-keys-read-values"),
    ] {
        for path in [badge, shields] {
            let r = get(&app, &format!("{path}?count=true"), Some(key)).await;
            assert_error(&r, 403, "forbidden", &[says]);
        }
    }
    let r = get(&app, "/v1/counters/REPO/views/k", Some("rd")).await;
    assert_eq!(r.json["value"], 5, "refused, nothing counted: {}", r.text);
    let r = get(&app, &format!("{shields}?count=true"), Some("adm")).await;
    assert_eq!(
        (r.status, r.json["message"].as_str()),
        (200, Some("6")),
        "{}",
        r.text
    );
    let (dir, options) = app.stop().await;
    // A gateway whose counters may be public lets write keys count badges.
    let app = TestApp::start_in_dir(
        dir,
        Options {
            write_keys_read_values: true,
            ..options
        },
    )
    .await;
    let r = get(&app, &format!("{badge}?count=true&key=wr"), None).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(shown(&r), "7");
    // Still no read without counting.
    assert_error(&get(&app, badge, Some("wr")).await, 403, "forbidden", &[]);
}

#[tokio::test]
async fn cache_headers_keep_private_keys_badges_out_of_shared_caches() {
    let app = TestApp::start_with(keyed()).await;
    for path in ["/v1/badge/REPO/views/c.svg", "/v1/shields/REPO/views/c"] {
        for (key, cache) in [
            ("pub", "no-cache"),
            ("rd", "no-cache, private"),
            ("adm", "no-cache, private"),
        ] {
            let r = get(&app, path, Some(key)).await;
            assert_eq!(r.header("cache-control"), Some(cache), "{key} {path}");
            assert_eq!(r.header("vary"), Some("authorization, x-tenant"));
            assert_eq!(
                r.header("cross-origin-resource-policy"),
                Some("cross-origin")
            );
            assert_eq!(r.header("x-content-type-options"), Some("nosniff"));
            let tag = r.header("etag").expect("an etag").to_string();
            assert!(tag.starts_with('"') && tag.len() == 34, "{tag}");
            // 304 only to a key that may read it.
            let r = app
                .send(
                    app.http
                        .get(app.url(path))
                        .bearer_auth(key)
                        .header("if-none-match", &tag),
                )
                .await;
            assert_eq!((r.status, r.text.as_str()), (304, ""));
            assert_eq!(r.header("cache-control"), Some(cache));
            let r = app
                .send(app.http.get(app.url(path)).header("if-none-match", &tag))
                .await;
            assert_error(&r, 401, "unauthorized", &[]);
        }
        // A public key's answers any page may read.
        let r = get(&app, path, Some("pub")).await;
        assert_eq!(r.header("access-control-allow-origin"), Some("*"));
        let r = get(&app, path, Some("rd")).await;
        assert_eq!(r.header("access-control-allow-origin"), None);
    }
}

#[tokio::test]
async fn a_keyless_gateway_counts_no_badge_for_a_page_of_another_site() {
    let app = TestApp::start().await;
    let path = "/v1/badge/REPO/views/x.svg?count=true";
    let r = app
        .send(
            app.http
                .get(app.url(path))
                .header("user-agent", CHROME)
                .header("referer", "https://evil.example/page"),
        )
        .await;
    assert_error(&r, 403, "cross_site_write", &["Referer"]);
    assert_eq!(app.value("REPO", "views", "x").await, None);
    // Showing it is a read, which any page may embed.
    let r = app
        .send(
            app.http
                .get(app.url("/v1/badge/REPO/views/x.svg"))
                .header("referer", "https://evil.example/page"),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    // A local page counts.
    let r = app
        .send(
            app.http
                .get(app.url(path))
                .header("user-agent", CHROME)
                .header("referer", "http://localhost:3000/"),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(app.value("REPO", "views", "x").await, Some(1));
}

#[tokio::test]
async fn githubs_image_proxy_counts_as_a_reader() {
    // camo fetches a README's images for the person who views it.
    let app = TestApp::start().await;
    let r = app
        .send(
            app.http
                .get(app.url("/v1/badge/REPO/views/gh.svg?count=true"))
                .header("user-agent", "github-camo (876de43e)"),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(app.value("REPO", "views", "gh").await, Some(1));
}

/// The badges as a real browser draws them: each SVG opened on its own is
/// parsed by Chromium's XML parser (a malformed one shows a
/// `parsererror`), and a page of `<img>` tags loads every style at the
/// size the SVG says; a screenshot of that page is left in
/// `target/badges.png` for people to look at.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs chromium (scripts/test.sh installs it and runs this with --ignored)"]
async fn badges_render_in_headless_chromium() {
    use common::chromium::run_chromium;
    let app = TestApp::start().await;
    app.increment("REPO", "views", "r1", json!({"count": 1234}))
        .await;
    let styles = ["flat", "flat-square", "for-the-badge"];
    let mut imgs = String::new();
    let mut sizes = Vec::new();
    for style in styles {
        let url = app.url(&format!(
            "/v1/badge/REPO/views/r1.svg?style={style}&label=views%20%26%20%3Chits%3E&color=orange"
        ));
        let r = app.send(app.http.get(&url)).await;
        assert_eq!(r.status, 200, "{}", r.text);
        let (w, h, _) = parse(&r.text);
        sizes.push((style, w, h));
        let dom = tokio::task::spawn_blocking({
            let url = url.clone();
            move || run_chromium(&url, &["--dump-dom"])
        })
        .await
        .expect("chromium task");
        assert!(!dom.contains("parsererror"), "{style}: {dom}");
        assert!(dom.contains("<svg"), "{style}: {dom}");
        let shown = if style == "for-the-badge" {
            "VIEWS &amp; &lt;HITS&gt;"
        } else {
            "views &amp; &lt;hits&gt;"
        };
        assert!(dom.contains(shown), "{style}: {dom}");
        imgs.push_str(&format!(
            r#"<p><img id="{style}" src="{url}" onload="this.dataset.state='loaded '+this.naturalWidth+'x'+this.naturalHeight" onerror="this.dataset.state='error'"></p>"#
        ));
    }
    let html = format!("<!doctype html><body style=\"background:#fff\">{imgs}</body>");
    // Served from loopback, as a page of a local site: Chromium loads no
    // loopback image into a `data:` page (a public one, to it).
    let page = serve_page(html).await;
    let dom = tokio::task::spawn_blocking({
        let page = page.clone();
        move || run_chromium(&page, &["--dump-dom"])
    })
    .await
    .expect("chromium task");
    for (style, w, h) in sizes {
        let at = dom
            .find(&format!("id=\"{style}\""))
            .unwrap_or_else(|| panic!("no #{style} in {dom}"));
        let tag = &dom[at..at + dom[at..].find('>').unwrap()];
        assert!(
            tag.contains(&format!("data-state=\"loaded {w}x{h}\"")),
            "{style}, {w}x{h}: {tag}"
        );
    }
    let shot = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/badges.png");
    let _ = std::fs::remove_file(&shot);
    std::fs::create_dir_all(shot.parent().unwrap()).expect("target/");
    let arg = format!("--screenshot={}", shot.display());
    tokio::task::spawn_blocking(move || run_chromium(&page, &[&arg, "--window-size=400,200"]))
        .await
        .expect("chromium task");
    let png =
        std::fs::read(&shot).unwrap_or_else(|e| panic!("no screenshot at {}: {e}", shot.display()));
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
}

/// Serves `html` at `/` on a port of its own, for as long as the test runs.
async fn serve_page(html: String) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("local addr");
    let page = axum::Router::new().fallback(move || {
        let html = html.clone();
        async move { axum::response::Html(html) }
    });
    tokio::spawn(async move { axum::serve(listener, page).await.expect("serve") });
    format!("http://{addr}/")
}
