//! Once per actor and limits per actor over HTTP on the embedded store:
//! what the shared scenario (`conformance/scenarios/actors.json`) cannot
//! show because it is about one store's files or the process: the beacon
//! form, the raw actor never written, the generated secret kept across a
//! restart, marks surviving a restart, the retention of day marks, the
//! metrics, and start-up refusing a limit that does not parse.

#[path = "common/mod.rs"]
mod common;

use std::time::Duration;

use common::{assert_error, counter_path, Options, TestApp};
use serde_json::{json, Value};

fn like(actor: &str) -> Value {
    json!({"actor": actor, "unique": "ever"})
}

/// Every byte of the embedded store's files (database and write-ahead log).
fn store_bytes(dir: &std::path::Path) -> Vec<u8> {
    let mut all = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if name.starts_with(counter_gateway::store::sqlite::DB_FILE) {
            all.extend(std::fs::read(&path).unwrap());
        }
    }
    all
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

#[tokio::test]
async fn a_beacon_counts_each_visitor_once_a_day() {
    let app = TestApp::start().await;
    // navigator.sendBeacon sends text/plain; the gateway reads it as JSON.
    let body = json!({"events": [
        {"entity": "ARTICLE", "action": "VIEW", "uuid": "a1", "actor": "visitor-1", "unique": "day"},
        {"entity": "ARTICLE", "action": "VIEW", "uuid": "a1", "actor": "visitor-1", "unique": "day"},
        {"entity": "ARTICLE", "action": "VIEW", "uuid": "a1", "actor": "visitor-2", "unique": "day"}
    ]})
    .to_string();
    let r = app
        .post_raw("/v1/events", Some("text/plain;charset=UTF-8"), body.clone())
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(
        r.json,
        json!({"accepted": 2, "duplicates": 0, "repeats": 1})
    );
    let r = app
        .post_raw("/v1/events", Some("text/plain;charset=UTF-8"), body)
        .await;
    assert_eq!(
        r.json,
        json!({"accepted": 0, "duplicates": 0, "repeats": 3})
    );
    assert_eq!(app.value("ARTICLE", "VIEW", "a1").await, Some(2));
    assert_eq!(app.metric("counter_gateway_actor_repeats_total").await, 4.0);
    // A bad scope in a beacon is refused like in JSON, naming the event.
    let bad = json!({"events": [{"entity": "ARTICLE", "action": "VIEW", "uuid": "a1", "actor": "v", "unique": "hour"}]});
    let r = app
        .post_raw("/v1/events", Some("text/plain"), bad.to_string())
        .await;
    assert_error(&r, 400, "invalid_events", &[]);
    assert_eq!(r.json["error"]["details"][0]["index"], 0);
}

#[tokio::test]
async fn the_raw_actor_is_never_written_and_marks_survive_a_restart() {
    let app = TestApp::start().await;
    let actor = "person-4c1e9a@example.org";
    let r = app.increment("ARTICLE", "like", "a1", like(actor)).await;
    assert_eq!(
        (r.status, &r.json["counted"]),
        (200, &json!(true)),
        "{}",
        r.text
    );
    let view = json!({"actor": actor, "unique": "day"});
    assert_eq!(
        app.increment("ARTICLE", "VIEW", "a1", view.clone())
            .await
            .status,
        200
    );
    let bytes = store_bytes(app.data_dir());
    assert!(!bytes.is_empty());
    assert!(
        !contains(&bytes, actor.as_bytes()),
        "the raw actor is in the store"
    );
    assert!(
        !contains(&bytes, b"4c1e9a"),
        "part of the raw actor is in the store"
    );
    // A restart reads the same secret from the data directory: the marks
    // still match, so the actor is not counted again.
    let app = app.restart().await;
    let r = app.increment("ARTICLE", "like", "a1", like(actor)).await;
    assert_eq!(r.json["counted"], false, "{}", r.text);
    assert_eq!(r.json["skipped"], "repeat");
    let r = app.increment("ARTICLE", "VIEW", "a1", view).await;
    assert_eq!(r.json["skipped"], "repeat", "{}", r.text);
    assert_eq!(app.value("ARTICLE", "like", "a1").await, Some(1));
    let secret =
        std::fs::read_to_string(app.data_dir().join(counter_gateway::actors::SECRET_FILE)).unwrap();
    assert_eq!(secret.len(), 64);
}

#[tokio::test]
async fn another_secret_makes_other_marks() {
    // The same data, read with a secret given by the operator instead of
    // the generated one: the marks are keyed, so they no longer match.
    let app = TestApp::start().await;
    assert_eq!(
        app.increment("ARTICLE", "like", "a1", like("alice"))
            .await
            .json["counted"],
        true
    );
    let (dir, mut options) = app.stop().await;
    options.actor_secret = Some("an operator's own secret, 32 bytes".into());
    let app = TestApp::start_in_dir(dir, options).await;
    let r = app.increment("ARTICLE", "like", "a1", like("alice")).await;
    assert_eq!(
        (r.json["counted"].clone(), r.json["value"].clone()),
        (json!(true), json!(2)),
        "{}",
        r.text
    );
}

#[tokio::test]
async fn views_marks_expire_with_the_bucket_retention() {
    // A view as old as the retention: allowed back that far here.
    let mut options = Options::default();
    options.time_policy.unique_max_age =
        chrono::Duration::days(i64::from(options.time_policy.retention_days));
    let clock = options.clock.clone();
    let app = TestApp::start_with(options).await;
    let retention = i64::from(app.options.time_policy.retention_days);
    // A view of the oldest day still accepted, and one of today.
    let oldest = common::test_now() - chrono::Duration::days(retention - 1);
    let old_view = json!({"actor": "alice", "unique": "day", "timestamp": common::rfc3339(oldest)});
    let view = json!({"actor": "alice", "unique": "day"});
    for body in [&old_view, &view] {
        let r = app.increment("ARTICLE", "VIEW", "a1", body.clone()).await;
        assert_eq!(r.json["counted"], true, "{}", r.text);
    }
    let marks = |dir: &std::path::Path| -> i64 {
        let c =
            rusqlite::Connection::open(dir.join(counter_gateway::store::sqlite::DB_FILE)).unwrap();
        c.query_row("SELECT count(*) FROM actor_day_marks", [], |r| r.get(0))
            .unwrap()
    };
    assert_eq!(marks(app.data_dir()), 2);
    // Two days on, the old day is past the retention: its mark goes, in
    // the background; today's stays.
    clock.set(common::test_now() + chrono::Duration::days(2));
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while marks(app.data_dir()) > 1 {
        assert!(
            std::time::Instant::now() < deadline,
            "the mark of a day past the retention is still there"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let r = app
        .increment("ARTICLE", "VIEW", "a1", json!({"actor": "alice", "unique": "day", "timestamp": common::rfc3339(common::test_now())}))
        .await;
    assert_eq!(r.json["skipped"], "repeat", "{}", r.text);
}

#[tokio::test]
async fn a_limit_per_actor_answers_429_with_retry_after_and_is_counted() {
    let options = Options {
        actor_limits: vec!["like: 2 per minute per actor".into()],
        ..Options::default()
    };
    let clock = options.clock.clone();
    let app = TestApp::start_with(options).await;
    let path = counter_path("ARTICLE", "like", "a1", "/increment");
    for _ in 0..2 {
        assert_eq!(app.post(&path, json!({"actor": "bot-7"})).await.status, 200);
    }
    let r = app.post(&path, json!({"actor": "bot-7"})).await;
    assert_error(&r, 429, "throttled", &["like: 2 per minute per actor"]);
    assert_eq!(r.header("retry-after"), Some("30"));
    assert_eq!(app.metric("counter_gateway_throttled_total").await, 1.0);
    // A count takes as many tokens: 3 at once never fits a rule of 2.
    let r = app.post(&path, json!({"actor": "bot-8", "count": 3})).await;
    assert_error(&r, 429, "throttled", &["whole period"]);
    assert_eq!(r.header("retry-after"), Some("60"));
    // Half a minute on, one more like of bot-7 passes.
    clock.set(common::test_now() + chrono::Duration::seconds(30));
    assert_eq!(app.post(&path, json!({"actor": "bot-7"})).await.status, 200);
    assert_eq!(app.value("ARTICLE", "like", "a1").await, Some(3));
}

#[tokio::test]
async fn start_up_refuses_a_limit_that_does_not_parse_or_a_short_secret() {
    use clap::Parser as _;
    use counter_gateway::config::{Cli, Command};
    let dir = tempfile::tempdir().unwrap();
    let serve = |extra: &[&str]| {
        let mut argv = vec![
            "counter-gateway",
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
            dir.path().to_str().unwrap(),
        ];
        argv.extend_from_slice(extra);
        match Cli::try_parse_from(argv).unwrap().command {
            Command::Serve(a) => *a,
            _ => unreachable!("a serve command line"),
        }
    };
    let e =
        counter_gateway::server::serve(serve(&["--actor-limit", "like: 10 per week per actor"]))
            .await
            .unwrap_err();
    assert!(
        e.contains("like: 10 per week per actor") && e.contains("week"),
        "{e}"
    );
    let e = counter_gateway::server::serve(serve(&["--actor-secret", "short"]))
        .await
        .unwrap_err();
    assert!(e.contains("--actor-secret"), "{e}");
    // Refused before any I/O: no store was opened.
    assert!(!dir
        .path()
        .join(counter_gateway::store::sqlite::DB_FILE)
        .exists());
}

/// A single increment that was a repeat (or a duplicate id) is answered
/// from its own flush: the store reads the wanted counter in the flush's
/// transaction, so the request needs no read of its own afterwards.
#[tokio::test]
async fn a_repeat_is_answered_from_its_own_flush() {
    use counter_gateway::domain::{ActorKey, CounterKey, Increment, IncrementSpec, Interner};
    use counter_gateway::store::sqlite::{Durability, SqliteStore};
    use counter_gateway::store::{Store, WriteBatch};
    let dir = tempfile::tempdir().unwrap();
    let clock = counter_gateway::domain::ManualClock::new(common::test_now());
    let store = SqliteStore::open(
        dir.path(),
        Durability::Relaxed,
        Duration::from_secs(3600),
        400,
        clock.clock(),
    )
    .unwrap();
    let secret = ActorKey::new(b"0123456789abcdef").unwrap();
    let like = |id: Option<&'static str>| {
        let spec = IncrementSpec {
            entity: "ARTICLE",
            action: "like",
            uuid: "a1",
            actor: Some("alice"),
            unique: Some("ever"),
            id,
            ..Default::default()
        };
        Increment::from_event(
            &spec,
            &Default::default(),
            common::test_now(),
            &mut Interner::default(),
            &secret,
        )
        .unwrap()
    };
    let key = CounterKey::new("ARTICLE", "like", "a1").unwrap();
    let flush = |inc: Increment| WriteBatch {
        requests: vec![vec![inc]],
        wanted: [key.clone()].into(),
    };
    let out = store.apply(flush(like(Some("x")))).await.unwrap();
    assert_eq!(out.counters[&key].value, 1);
    for again in [like(None), like(Some("x"))] {
        let out = store.apply(flush(again)).await.unwrap();
        assert_eq!(out.counters[&key].value, 1, "{out:?}");
        assert_eq!(out.store_writes, 0, "nothing written: {out:?}");
    }
}

/// Every counting write checks the crawler before it takes an actor's
/// tokens: a crawler's batch or increment is answered as ignored and
/// leaves every actor its whole budget (issue 21, item 6: the batch took
/// the tokens first).
#[tokio::test]
async fn a_crawlers_writes_spend_no_actor_budget() {
    const GOOGLEBOT: &str =
        "Mozilla/5.0 (compatible; Googlebot/2.1; +http://www.google.com/bot.html)";
    let app = TestApp::start_with(Options {
        actor_limits: vec!["like: 2 per hour per actor".into()],
        ..Options::default()
    })
    .await;
    let like = json!({"entity": "ARTICLE", "action": "like", "uuid": "a1", "actor": "alice"});
    let batch = json!({"events": [like, like]});
    let r = app
        .send(
            app.http
                .post(app.url("/v1/events"))
                .header("user-agent", GOOGLEBOT)
                .header("origin", "http://localhost:3000")
                .json(&batch),
        )
        .await;
    assert_eq!(r.status, 202, "{}", r.text);
    let path = counter_path("ARTICLE", "like", "a1", "/increment");
    let r = app
        .send(
            app.http
                .post(app.url(&path))
                .header("user-agent", GOOGLEBOT)
                .header("origin", "http://localhost:3000")
                .json(&json!({"actor": "alice"})),
        )
        .await;
    assert_eq!(r.status, 202, "{}", r.text);
    // Alice still has both likes of her hour, in one batch.
    let r = app.post("/v1/events", batch).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(app.value("ARTICLE", "like", "a1").await, Some(2));
    assert_eq!(app.metric("counter_gateway_throttled_total").await, 0.0);
}

/// A `unique: day` view counts once per actor and day: backdated, one
/// actor's batch could add a "unique" view for every day of the retention.
/// A `unique` event dated more than `--unique-max-age` (2 days by default)
/// back is refused, naming the field and the bound, and nothing of its
/// batch is applied; events without `unique` may still be backdated.
#[tokio::test]
async fn a_unique_event_may_not_be_dated_past_the_unique_max_age() {
    let app = TestApp::start().await;
    let at = |d: chrono::Duration| common::rfc3339(common::test_now() - d);
    let view = |d: chrono::Duration| {
        json!({"entity": "ARTICLE", "action": "VIEW", "uuid": "a1",
               "actor": "mallory", "unique": "day", "timestamp": at(d)})
    };
    let events: Vec<Value> = (0..30).map(|d| view(chrono::Duration::days(d))).collect();
    let r = app.post("/v1/events", json!({ "events": events })).await;
    assert_error(&r, 400, "invalid_events", &[]);
    let details = r.json["error"]["details"].as_array().unwrap();
    // Today, a day and two days back are within the bound; 3..30 are not.
    let refused: Vec<u64> = details
        .iter()
        .map(|d| d["index"].as_u64().unwrap())
        .collect();
    assert_eq!(refused, (3..30).collect::<Vec<u64>>(), "{}", r.text);
    let reason = details[0]["reason"].as_str().unwrap();
    assert!(reason.contains("timestamp"), "{reason}");
    assert!(reason.contains("2 days"), "{reason}");
    assert!(reason.contains("--unique-max-age"), "{reason}");
    assert_eq!(
        app.value("ARTICLE", "VIEW", "a1").await,
        None,
        "nothing applied"
    );

    // At the bound it counts, a second past it not; `ever` too.
    let edge = chrono::Duration::days(2);
    let r = app
        .increment(
            "ARTICLE",
            "VIEW",
            "a1",
            json!({"actor": "mallory", "unique": "day", "timestamp": at(edge)}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let past = edge + chrono::Duration::seconds(1);
    for unique in ["day", "ever"] {
        let r = app
            .increment(
                "ARTICLE",
                "like",
                "a1",
                json!({"actor": "mallory", "unique": unique, "timestamp": at(past)}),
            )
            .await;
        assert_error(
            &r,
            400,
            "invalid_request",
            &["timestamp", "--unique-max-age"],
        );
    }
    // Without `unique`, history back to the retention is still accepted.
    let r = app
        .increment(
            "ARTICLE",
            "VIEW",
            "a1",
            json!({"timestamp": at(chrono::Duration::days(300))}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(app.value("ARTICLE", "VIEW", "a1").await, Some(2));
}

/// The bound is `--unique-max-age`: raised, older `unique` events count.
#[tokio::test]
async fn the_unique_max_age_is_the_operators_to_raise() {
    let mut options = Options::default();
    options.time_policy.unique_max_age = chrono::Duration::days(10);
    let app = TestApp::start_with(options).await;
    let ts = common::rfc3339(common::test_now() - chrono::Duration::days(9));
    let r = app
        .increment(
            "ARTICLE",
            "VIEW",
            "a1",
            json!({"actor": "a", "unique": "day", "timestamp": ts}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let ts = common::rfc3339(common::test_now() - chrono::Duration::days(11));
    let r = app
        .increment(
            "ARTICLE",
            "VIEW",
            "a1",
            json!({"actor": "a", "unique": "day", "timestamp": ts}),
        )
        .await;
    assert_error(&r, 400, "invalid_request", &["10 days"]);
}

/// The marks `tenant` holds, ever and day, as hex.
async fn marks_of(app: &TestApp, tenant: &str) -> Vec<String> {
    let state = if tenant == "default" {
        std::sync::Arc::new(app.state.clone())
    } else {
        app.tenants.reader(tenant).await.unwrap()
    };
    let mut marks: Vec<String> = state
        .store
        .mark_page(None, 1_000, 0)
        .await
        .unwrap()
        .iter()
        .map(|m| m.mark.hex())
        .collect();
    marks.sort();
    marks
}

/// The operator of two tenants that share a secret (one gateway, one
/// `actor-secret`) cannot link a person across them: the same actor on the
/// same counter has another mark in each, and still counts once in each.
#[tokio::test]
async fn two_tenants_sharing_a_secret_share_no_mark() {
    let app = TestApp::start().await;
    let path = counter_path("ARTICLE", "like", "a1", "/increment");
    let view = counter_path("ARTICLE", "VIEW", "a1", "/increment");
    for tenant in ["default", "acme", "globex"] {
        for (p, body) in [
            (&path, like("alice@example.org")),
            (
                &view,
                json!({"actor": "alice@example.org", "unique": "day"}),
            ),
        ] {
            for counted in [true, false] {
                let r = app
                    .send(
                        app.http
                            .post(app.url(p))
                            .header("x-tenant", tenant)
                            .json(&body),
                    )
                    .await;
                assert_eq!(r.status, 200, "{tenant}: {}", r.text);
                assert_eq!(r.json["counted"], json!(counted), "{tenant}: {}", r.text);
            }
        }
    }
    let default = marks_of(&app, "default").await;
    let acme = marks_of(&app, "acme").await;
    let globex = marks_of(&app, "globex").await;
    assert_eq!((default.len(), acme.len(), globex.len()), (2, 2, 2));
    for (a, b) in [(&default, &acme), (&default, &globex), (&acme, &globex)] {
        assert!(
            a.iter().all(|m| !b.contains(m)),
            "{a:?} and {b:?} share a mark"
        );
    }
}

/// A store as an earlier version (schema 6) left it: `likes` by `actors`
/// on ARTICLE/like/a1 and one view each on ARTICLE/VIEW/a1, marked
/// without the tenant with `secret`, in `dir`.
async fn old_store_with_marks(
    dir: &std::path::Path,
    secret: &counter_gateway::domain::ActorKey,
    actors: &[&str],
) {
    use counter_gateway::domain::{CounterKey, Increment, Kind, Scope, Unique};
    use counter_gateway::store::{Store, WriteBatch};
    let store = counter_gateway::store::sqlite::SqliteStore::open(
        dir,
        counter_gateway::store::sqlite::Durability::Full,
        Duration::from_secs(7 * 86_400),
        400,
        counter_gateway::domain::ManualClock::new(common::test_now()).clock(),
    )
    .unwrap();
    let now = common::test_now();
    let day = now.timestamp_millis().div_euclid(86_400_000);
    let mut events = Vec::new();
    for who in actors {
        for (action, scope) in [("like", Scope::Ever), ("VIEW", Scope::Day)] {
            let key = CounterKey::new("ARTICLE", action, "a1").unwrap();
            events.push(Increment {
                unique: Some(Unique {
                    scope,
                    mark: secret.untenanted_mark(&key, who).unwrap(),
                }),
                key,
                delta: 1,
                category: None,
                ts_ms: now.timestamp_millis(),
                day,
                id: None,
                kind: Kind::Counter,
            });
        }
    }
    let out = store
        .apply(WriteBatch {
            requests: vec![events],
            ..WriteBatch::default()
        })
        .await
        .unwrap();
    assert!(matches!(
        out.requests[0],
        counter_gateway::store::RequestOutcome::Applied { .. }
    ));
    drop(store);
    let db = rusqlite::Connection::open(dir.join(counter_gateway::store::sqlite::DB_FILE)).unwrap();
    db.execute_batch("DROP TABLE actor_mark_keying; PRAGMA user_version = 6;")
        .unwrap();
}

/// Marks an earlier version keyed without the tenant are brought to it at
/// open, once, in the default tenant and another: an actor counted before
/// the upgrade is still counted once (a like again is a repeat, an unlike
/// takes it back), a view of the same day is a repeat, and a restart does
/// not key them again.
#[tokio::test]
async fn marks_of_an_earlier_version_still_count_each_actor_once() {
    let dir = std::sync::Arc::new(tempfile::tempdir().unwrap());
    let secret = counter_gateway::actors::embedded_secret(dir.path()).unwrap();
    let acme = dir.path().join("tenants/acme");
    std::fs::create_dir_all(&acme).unwrap();
    old_store_with_marks(dir.path(), &secret, &["alice", "bob"]).await;
    old_store_with_marks(&acme, &secret, &["alice", "bob"]).await;
    let mut app = TestApp::start_in_dir(dir, Options::default()).await;
    let path = counter_path("ARTICLE", "like", "a1", "");
    let view = counter_path("ARTICLE", "VIEW", "a1", "/increment");
    for round in 0..2 {
        for tenant in ["default", "acme"] {
            let post = |p: &str, body: Value| {
                app.send(
                    app.http
                        .post(app.url(p))
                        .header("x-tenant", tenant)
                        .json(&body),
                )
            };
            let r = post(&format!("{path}/increment"), like("alice")).await;
            assert_eq!(
                r.json["counted"],
                json!(false),
                "{tenant} {round}: {}",
                r.text
            );
            assert_eq!(
                r.json["value"],
                json!(2 - round),
                "{tenant} {round}: {}",
                r.text
            );
            let r = post(&view, json!({"actor": "bob", "unique": "day"})).await;
            assert_eq!(
                r.json["counted"],
                json!(false),
                "{tenant} {round}: {}",
                r.text
            );
            if round == 0 {
                // Bob's like is found, and taken back.
                let r = post(&format!("{path}/decrement"), like("bob")).await;
                assert_eq!(r.json["counted"], json!(true), "{tenant}: {}", r.text);
                assert_eq!(r.json["value"], json!(1), "{tenant}: {}", r.text);
            }
        }
        app = app.restart().await;
    }
    assert_eq!(marks_of(&app, "default").await.len(), 3);
    assert_eq!(marks_of(&app, "acme").await.len(), 3);
    assert_ne!(
        marks_of(&app, "default").await,
        marks_of(&app, "acme").await
    );
}
