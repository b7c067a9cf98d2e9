//! `export` and `import` on the embedded store: round trips give the same
//! file, importing twice gives the same state, a corrected file replaces the
//! days it names and keeps the rest, an interrupted import resumes from its
//! checkpoint, a bad line stops the import naming it with nothing of its
//! batch applied, `--skip-bad` sets bad lines aside. Every day is relative
//! to the test clock (`common::test_now`); the command-line test uses only
//! dates in the past, so it passes on any date.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use chrono::Duration as Days;
use common::{test_now, TestApp};
use counter_gateway::domain::{day_of, format_day, CounterKey, ManualClock, TimePolicy};
use counter_gateway::store::sqlite::{Durability, SqliteStore};
use counter_gateway::store::{ImportBatch, ImportOutcome, Store, StoreError};
use counter_gateway::transfer::{export, format, import};
use serde_json::{json, Value};
use tempfile::TempDir;

fn rules() -> format::Rules {
    format::Rules {
        now: test_now(),
        policy: TimePolicy::default(),
    }
}

/// The UTC day `n` days before the test clock, as the format writes days.
fn day(n: i64) -> String {
    format_day(day_of(test_now()) - n)
}

/// An instant `n` days before the test clock, as clients send it.
fn ts(n: i64) -> String {
    common::rfc3339(test_now() - Days::days(n))
}

fn hidden() -> indicatif::ProgressBar {
    indicatif::ProgressBar::hidden()
}

/// A fresh embedded store in its own directory, on the test clock.
fn empty_store() -> (TempDir, Arc<SqliteStore>) {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(
        dir.path(),
        Durability::Full,
        Duration::from_secs(7 * 86_400),
        TimePolicy::default().retention_days,
        ManualClock::new(test_now()).clock(),
    )
    .unwrap();
    (dir, Arc::new(store))
}

async fn export_text(store: &dyn Store) -> String {
    let mut out = Vec::new();
    export::write_all(
        store,
        &mut out,
        rules().oldest_day(),
        rules().oldest_hour_day(),
        &hidden(),
    )
    .await
    .unwrap();
    String::from_utf8(out).unwrap()
}

async fn import_text(
    store: &dyn Store,
    text: &str,
    options: &import::Options,
) -> Result<import::Imported, String> {
    import::read_all(store, text.as_bytes(), &rules(), options, &hidden()).await
}

/// A gateway with counters over 30 days (categories, awkward keys, an
/// earlier part no day holds), averages, a backfilled day, and three
/// targets' publication times (two set by an admin, one of a target with
/// no counter, one by an event).
async fn populated() -> TestApp {
    let app = TestApp::start().await;
    let mut events = Vec::new();
    for i in 0..20 {
        for n in (0..30).step_by(1 + i % 7) {
            events.push(json!({
                "entity": "VIDEO", "action": "VIEW", "uuid": format!("v{i:02}"),
                "count": (i as i64 + 1) * (n as i64 + 1), "timestamp": ts(n as i64),
                "category": if i % 3 == 0 { Some("sports") } else { None },
            }));
        }
    }
    for uuid in ["a_b", "a%b", "ü-1", "Z"] {
        events.push(json!({"entity": "ARTICLE", "action": "like", "uuid": uuid, "count": -3, "timestamp": ts(2)}));
    }
    let r = app.post("/v1/events", json!({ "events": events })).await;
    assert_eq!(r.status, 200, "{}", r.text);
    for (uuid, v, n) in [("a1", 5, 0), ("a1", 3, 4), ("a2", 1, 9), ("a1", 4, 4)] {
        let r = app
            .post(
                &format!("/v1/averages/ARTICLE/rating/{uuid}"),
                json!({"value": v, "timestamp": ts(n)}),
            )
            .await;
        assert_eq!(r.status, 200, "{}", r.text);
    }
    let r = app
        .send(
            app.http
                .put(app.url(&format!("/v1/counters/VIDEO/VIEW/v01/days/{}", day(40))))
                .json(&json!({"value": 77})),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    // A counter whose history starts before the retention.
    let old = format!(
        "{}{}\n",
        format::header_line(),
        json!({"kind": "counter", "entity": "VIDEO", "action": "VIEW", "uuid": "old", "value": 1000,
               "days": {day(3): 10}, "first_timestamp": "2020-01-01T00:00:00.000Z",
               "recorded_timestamp": format!("{}T00:00:00.000Z", day(3))})
    );
    import_text(&*app.state.store, &old, &import::Options::default())
        .await
        .unwrap();
    for (path, at) in [("VIDEO/v01", ts(12)), ("ARTICLE/none", ts(300))] {
        let r = app
            .send(
                app.http
                    .put(app.url(&format!("/v1/targets/{path}")))
                    .json(&json!({ "published": at })),
            )
            .await;
        assert_eq!(r.status, 200, "{}", r.text);
    }
    let r = app
        .post(
            "/v1/events",
            json!({"events": [{"entity": "VIDEO", "action": "VIEW", "uuid": "v03", "timestamp": ts(0), "published": ts(20)}]}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    app
}

/// What milestones answer of `store`: the first-days lists of the videos
/// (those of `VIDEO/v01` and `v03` count from their set publication, the
/// others from their first touch) and the three targets' publication times.
async fn milestones(store: &dyn Store) -> Vec<String> {
    let mut out = Vec::new();
    for days in [1, 3, 30] {
        let list = store
            .top_first_days(&counter_gateway::store::FirstDaysQuery {
                entity: "VIDEO".into(),
                action: "VIEW".into(),
                days,
                category: None,
                size: 100,
                oldest_day: rules().oldest_day(),
            })
            .await
            .unwrap();
        out.push(format!("{days}: {list:?}"));
    }
    for (entity, uuid) in [("VIDEO", "v01"), ("VIDEO", "v03"), ("ARTICLE", "none")] {
        let at = store.published(entity, uuid).await.unwrap();
        out.push(format!("{entity}/{uuid}: {at:?}"));
    }
    out
}

fn lines(text: &str) -> Vec<Value> {
    text.lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn record<'a>(all: &'a [Value], kind: &str, uuid: &str) -> &'a Value {
    all.iter()
        .find(|r| r["kind"] == kind && r["uuid"] == uuid)
        .unwrap_or_else(|| panic!("no {kind} {uuid}"))
}

#[tokio::test]
async fn export_import_export_gives_the_same_file() {
    let app = populated().await;
    let first = export_text(&*app.state.store).await;
    let all = lines(&first);
    assert_eq!(
        all[0],
        json!({"kind": "header", "format": "counter-gateway", "version": 5})
    );
    // 20 videos, 1 old, 4 articles, 2 averages, 3 publication times, and
    // the header.
    assert_eq!(all.len(), 1 + 25 + 2 + 3, "{first}");
    // Key order, bytewise: "ARTICLE" < "VIDEO"; "Z" < "a%b" < "a_b" < "ü-1".
    let uuids: Vec<&str> = all[1..5]
        .iter()
        .map(|r| r["uuid"].as_str().unwrap())
        .collect();
    assert_eq!(uuids, ["Z", "a%b", "a_b", "ü-1"]);
    let old = record(&all, "counter", "old");
    assert_eq!(old["value"], 1000);
    assert_eq!(old["before"], 990);
    assert_eq!(old["days"], json!({ day(3): 10 }));
    assert_eq!(old["first_timestamp"], "2020-01-01T00:00:00.000Z");
    let v01 = record(&all, "counter", "v01");
    assert_eq!(v01["days"][day(40)], 77);
    assert_eq!(v01["before"], 0);
    let v00 = record(&all, "counter", "v00");
    assert_eq!(v00["category"], "sports");
    let rating = record(&all, "average", "a1");
    assert_eq!(
        (rating["sum"].clone(), rating["quantity"].clone()),
        (json!(12), json!(3))
    );
    assert_eq!(rating["days"][day(4)], json!({"sum": 7, "quantity": 2}));
    // Publication times after the averages, by entity then uuid (bytewise).
    let published: Vec<&Value> = all.iter().filter(|r| r["kind"] == "published").collect();
    assert_eq!(
        published,
        [
            &json!({"kind": "published", "entity": "ARTICLE", "uuid": "none", "published": common::rendered(test_now() - Days::days(300))}),
            &json!({"kind": "published", "entity": "VIDEO", "uuid": "v01", "published": common::rendered(test_now() - Days::days(12))}),
            &json!({"kind": "published", "entity": "VIDEO", "uuid": "v03", "published": common::rendered(test_now() - Days::days(20))}),
        ]
    );
    assert_eq!(all[28]["kind"], "published");

    let (_dir, copy) = empty_store();
    let done = import_text(&*copy, &first, &import::Options::default())
        .await
        .unwrap();
    assert_eq!((done.counters, done.averages, done.published), (25, 2, 3));
    let second = export_text(&*copy).await;
    assert_eq!(first, second, "export -> import -> export changed the file");
    // Milestones answer as they did: the set times, not the first touches.
    let before = milestones(&*app.state.store).await;
    assert!(
        before[1].contains("uuid: \"v01\"") && before[1].contains("published_set: true"),
        "{before:?}"
    );
    assert_eq!(milestones(&*copy).await, before);
    // The copy answers as the original does.
    let key = CounterKey::new("VIDEO", "VIEW", "v07").unwrap();
    assert_eq!(
        copy.get(&key).await.unwrap(),
        app.state.store.get(&key).await.unwrap()
    );
    let r = app
        .get("/v1/top/VIDEO/VIEW?interval=last_week&size=3")
        .await;
    assert_eq!(r.status, 200);
}

#[tokio::test]
async fn importing_the_same_file_twice_leaves_the_same_state() {
    let app = populated().await;
    let file = export_text(&*app.state.store).await;
    let (_dir, copy) = empty_store();
    import_text(&*copy, &file, &import::Options::default())
        .await
        .unwrap();
    let once = export_text(&*copy).await;
    import_text(&*copy, &file, &import::Options::default())
        .await
        .unwrap();
    assert_eq!(export_text(&*copy).await, once);
    assert_eq!(once, file);
}

#[tokio::test]
async fn a_corrected_file_replaces_the_days_it_names_and_keeps_the_rest() {
    let (_dir, store) = empty_store();
    let header = format::header_line();
    let first = format!(
        "{header}{}\n{}\n",
        json!({"kind": "counter", "entity": "ARTICLE", "action": "VIEW", "uuid": "a1", "value": 130,
               "days": {day(2): 100, day(1): 20, day(0): 5}}),
        json!({"kind": "day", "entity": "ARTICLE", "action": "VIEW", "uuid": "a2", "day": day(1), "value": 8}),
    );
    import_text(&*store, &first, &import::Options::default())
        .await
        .unwrap();
    // Live traffic on another day of a1, and a counter the file never names.
    let inc = |uuid: &str, n: i64, count: i64| counter_gateway::domain::Increment {
        key: CounterKey::new("ARTICLE", "VIEW", uuid).unwrap(),
        delta: count,
        category: None,
        ts_ms: (test_now() - Days::days(n)).timestamp_millis(),
        day: day_of(test_now()) - n,
        id: None,
        unique: None,
        kind: counter_gateway::domain::Kind::Counter,
    };
    store
        .apply(counter_gateway::store::WriteBatch {
            requests: vec![vec![inc("a1", 3, 4), inc("other", 0, 9)]],
            wanted: Default::default(),
        })
        .await
        .unwrap();
    // The source revised day 1 of a1 (20 -> 25, its total with it) and a2's day.
    let corrected = format!(
        "{header}{}\n{}\n",
        json!({"kind": "counter", "entity": "ARTICLE", "action": "VIEW", "uuid": "a1", "value": 135,
               "before": 5, "days": {day(2): 100, day(1): 25, day(0): 5}}),
        json!({"kind": "day", "entity": "ARTICLE", "action": "VIEW", "uuid": "a2", "day": day(1), "value": 11}),
    );
    import_text(&*store, &corrected, &import::Options::default())
        .await
        .unwrap();
    let all = lines(&export_text(&*store).await);
    let a1 = record(&all, "counter", "a1");
    // Named days replaced, day 3 (not named) kept; the total is the part
    // before the days plus every bucket: 5 + 4 + 100 + 25 + 5.
    assert_eq!(
        a1["days"],
        json!({day(3): 4, day(2): 100, day(1): 25, day(0): 5})
    );
    assert_eq!(a1["value"], 139);
    assert_eq!(a1["before"], 5);
    let a2 = record(&all, "counter", "a2");
    assert_eq!(
        (a2["value"].clone(), a2["days"].clone()),
        (json!(11), json!({day(1): 11}))
    );
    assert_eq!(record(&all, "counter", "other")["value"], 9);
    // Importing the corrected file again changes nothing.
    let before = export_text(&*store).await;
    import_text(&*store, &corrected, &import::Options::default())
        .await
        .unwrap();
    assert_eq!(export_text(&*store).await, before);
    // A value that disagrees with its days is refused, not guessed at.
    let wrong = format!(
        "{header}{}\n",
        json!({"kind": "counter", "entity": "ARTICLE", "action": "VIEW", "uuid": "a1", "value": 135,
               "before": 5, "days": {day(1): 30}}),
    );
    let e = import_text(&*store, &wrong, &import::Options::default())
        .await
        .unwrap_err();
    assert!(e.contains("line 2") && e.contains("value 135"), "{e}");
}

/// A store whose import writes (`import`, and `set_published`, which sets
/// a batch's publication times) fail after `ok` of them, as a crash would
/// stop it; everything else goes to `inner`.
struct Interrupted {
    inner: Arc<dyn Store>,
    ok: usize,
    calls: AtomicUsize,
}

#[async_trait::async_trait]
impl counter_gateway::store::Store for Interrupted {
    async fn apply(
        &self,
        batch: counter_gateway::store::WriteBatch,
    ) -> Result<counter_gateway::store::BatchOutcome, StoreError> {
        self.inner.apply(batch).await
    }
    async fn sync(&self) -> Result<(), StoreError> {
        self.inner.sync().await
    }
    async fn get(
        &self,
        key: &CounterKey,
    ) -> Result<Option<counter_gateway::domain::Counter>, StoreError> {
        self.inner.get(key).await
    }
    async fn target_counters(
        &self,
        e: &str,
        u: &str,
    ) -> Result<Vec<counter_gateway::domain::Counter>, StoreError> {
        self.inner.target_counters(e, u).await
    }
    async fn delete(&self, key: &CounterKey) -> Result<bool, StoreError> {
        self.inner.delete(key).await
    }
    async fn ready(&self) -> Result<(), StoreError> {
        self.inner.ready().await
    }
    async fn histogram(
        &self,
        key: &CounterKey,
        w: counter_gateway::domain::Window,
    ) -> Result<Option<Vec<counter_gateway::store::Bucket>>, StoreError> {
        self.inner.histogram(key, w).await
    }
    async fn top(
        &self,
        q: &counter_gateway::store::TopQuery,
    ) -> Result<counter_gateway::store::TopList, StoreError> {
        self.inner.top(q).await
    }
    async fn stale(
        &self,
        q: &counter_gateway::store::StaleQuery,
    ) -> Result<Vec<counter_gateway::domain::Counter>, StoreError> {
        self.inner.stale(q).await
    }
    async fn unused(
        &self,
        before_ms: i64,
    ) -> Result<Vec<counter_gateway::store::UnusedPair>, StoreError> {
        self.inner.unused(before_ms).await
    }
    async fn average(
        &self,
        key: &CounterKey,
        w: Option<counter_gateway::domain::Window>,
    ) -> Result<Option<counter_gateway::store::Average>, StoreError> {
        self.inner.average(key, w).await
    }
    async fn top_averages(
        &self,
        q: &counter_gateway::store::TopAveragesQuery,
    ) -> Result<counter_gateway::store::TopAverages, StoreError> {
        self.inner.top_averages(q).await
    }
    async fn get_many(
        &self,
        keys: &[CounterKey],
    ) -> Result<Vec<Option<counter_gateway::domain::Counter>>, StoreError> {
        self.inner.get_many(keys).await
    }
    async fn set_days(
        &self,
        sets: Vec<counter_gateway::domain::DaySet>,
        oldest_day: i64,
    ) -> Result<counter_gateway::store::DaysOutcome, StoreError> {
        self.inner.set_days(sets, oldest_day).await
    }
    async fn set_value(
        &self,
        set: counter_gateway::domain::CounterSet,
    ) -> Result<counter_gateway::domain::Counter, StoreError> {
        self.inner.set_value(set).await
    }
    async fn counter_page(
        &self,
        after: Option<CounterKey>,
        limit: usize,
        from_day: i64,
        hours_from_day: i64,
    ) -> Result<Vec<counter_gateway::store::CounterHistory>, StoreError> {
        self.inner
            .counter_page(after, limit, from_day, hours_from_day)
            .await
    }
    async fn average_page(
        &self,
        after: Option<CounterKey>,
        limit: usize,
        from_day: i64,
    ) -> Result<Vec<counter_gateway::store::AverageHistory>, StoreError> {
        self.inner.average_page(after, limit, from_day).await
    }
    async fn mark_page(
        &self,
        after: Option<counter_gateway::store::ActorMark>,
        limit: usize,
        from_day: i64,
    ) -> Result<Vec<counter_gateway::store::ActorMark>, StoreError> {
        self.inner.mark_page(after, limit, from_day).await
    }
    async fn import(&self, batch: ImportBatch) -> Result<ImportOutcome, StoreError> {
        if self.calls.fetch_add(1, Ordering::SeqCst) >= self.ok {
            return Err(StoreError::Unavailable("the disk went away".into()));
        }
        self.inner.import(batch).await
    }
    async fn set_published(
        &self,
        sets: Vec<counter_gateway::store::PublishedSet>,
    ) -> Result<(), counter_gateway::store::StoreError> {
        if self.calls.fetch_add(1, Ordering::SeqCst) >= self.ok {
            return Err(StoreError::Unavailable("the disk went away".into()));
        }
        self.inner.set_published(sets).await
    }
    async fn published(
        &self,
        entity: &str,
        uuid: &str,
    ) -> Result<Option<i64>, counter_gateway::store::StoreError> {
        self.inner.published(entity, uuid).await
    }
    async fn top_first_days(
        &self,
        q: &counter_gateway::store::FirstDaysQuery,
    ) -> Result<counter_gateway::store::FirstDaysList, counter_gateway::store::StoreError> {
        self.inner.top_first_days(q).await
    }
    async fn published_page(
        &self,
        after: Option<(String, String)>,
        limit: usize,
    ) -> Result<Vec<counter_gateway::store::TargetPublished>, counter_gateway::store::StoreError>
    {
        self.inner.published_page(after, limit).await
    }
}

#[tokio::test]
async fn an_interrupted_import_resumes_after_the_last_batch_applied() {
    let app = populated().await;
    let file = export_text(&*app.state.store).await;
    let (dir, store) = empty_store();
    let checkpoint = dir.path().join("import.checkpoint");
    let options = import::Options {
        batch_records: 4,
        checkpoint: Some(checkpoint.clone()),
        input_name: "export.ndjson".into(),
        ..import::Options::default()
    };
    let broken = Interrupted {
        inner: store.clone(),
        ok: 3,
        calls: AtomicUsize::new(0),
    };
    let e = import_text(&broken, &file, &options).await.unwrap_err();
    // Three batches of four records (lines 2-13) are applied.
    assert!(
        e.contains("lines 14-17") && e.contains("the disk went away"),
        "{e}"
    );
    assert!(e.contains("resumes after line 13"), "{e}");
    let saved: Value =
        serde_json::from_str(&std::fs::read_to_string(&checkpoint).unwrap()).unwrap();
    assert_eq!(saved, json!({"input": "export.ndjson", "line": 13}));
    let partial = lines(&export_text(&*store).await);
    assert_eq!(partial.len(), 1 + 12);

    // Run again: only the lines after the checkpoint are read into the store.
    let counting = Interrupted {
        inner: store.clone(),
        ok: usize::MAX,
        calls: AtomicUsize::new(0),
    };
    let done = import_text(&counting, &file, &options).await.unwrap();
    assert_eq!(done.resumed_after, 13);
    assert_eq!(
        (done.counters + done.averages, done.published),
        (27 - 12, 3)
    );
    // Lines 14-29 and 30-31: four imports, the last of them with the first
    // publication time (and its set), then the two others (a set only).
    assert_eq!(
        counting.calls.load(Ordering::SeqCst),
        6,
        "18 records in batches of 4"
    );
    assert!(
        !checkpoint.exists(),
        "a complete import removes its checkpoint"
    );
    assert_eq!(export_text(&*store).await, file);

    // Cut between a batch's import and its publication times (lines 26-29:
    // the last counter, both averages, the first time): the checkpoint
    // stays before the batch, and resuming sets all of it.
    let (_dir2, store) = empty_store();
    let broken = Interrupted {
        inner: store.clone(),
        ok: 7,
        calls: AtomicUsize::new(0),
    };
    let e = import_text(&broken, &file, &options).await.unwrap_err();
    assert!(
        e.contains("lines 26-29") && e.contains("resumes after line 25"),
        "{e}"
    );
    assert_eq!(store.published("ARTICLE", "none").await.unwrap(), None);
    let done = import_text(&*store, &file, &options).await.unwrap();
    assert_eq!((done.resumed_after, done.published), (25, 3));
    assert_eq!(export_text(&*store).await, file);
    // A checkpoint of another input is refused rather than applied to it.
    std::fs::write(&checkpoint, r#"{"input":"other.ndjson","line":5}"#).unwrap();
    let e = import_text(&*store, &file, &options).await.unwrap_err();
    assert!(e.contains("other.ndjson"), "{e}");
}

/// Ten counters, one a line (lines 2-11), then `bad` at line 12, then one more.
fn file_with_bad_line(bad: &str) -> String {
    let mut text = format::header_line();
    for i in 0..10 {
        text.push_str(
            &json!({"kind": "counter", "entity": "E", "action": "A", "uuid": format!("u{i}"),
                             "value": i, "days": {day(1): i}})
            .to_string(),
        );
        text.push('\n');
    }
    text.push_str(bad);
    text.push('\n');
    text.push_str(
        &json!({"kind": "counter", "entity": "E", "action": "A", "uuid": "after", "value": 1})
            .to_string(),
    );
    text.push('\n');
    text
}

async fn value(store: &dyn Store, uuid: &str) -> Option<i64> {
    store
        .get(&CounterKey::new("E", "A", uuid).unwrap())
        .await
        .unwrap()
        .map(|c| c.value)
}

#[tokio::test]
async fn a_bad_line_stops_the_import_naming_it_with_nothing_of_its_batch_applied() {
    let cases = [
        ("{\"kind\":\"counter\",\"entity\":\"E\"", "EOF"),
        (r#"{"kind":"gauge","entity":"E","action":"A","uuid":"x","value":1}"#, "unknown record kind \"gauge\""),
        (r#"{"kind":"counter","entity":"E","action":"A","uuid":"x","value":9223372036854775808}"#, "64-bit"),
        (
            &json!({"kind": "day", "entity": "E", "action": "A", "uuid": "x", "day": day(401), "value": 1}).to_string(),
            "retention",
        ),
        // Parses, but would leave i64 with what the store holds.
        (r#"{"kind":"day","entity":"E","action":"A","uuid":"u7","day":"TODAY","value":9223372036854775807}"#, "64-bit range"),
    ];
    for (bad, why) in cases {
        let bad = bad.replace("TODAY", &day(0));
        let (_dir, store) = empty_store();
        let options = import::Options {
            batch_records: 4,
            ..import::Options::default()
        };
        let e = import_text(&*store, &file_with_bad_line(&bad), &options)
            .await
            .unwrap_err();
        assert!(e.starts_with("line 12: ") && e.contains(why), "{bad}: {e}");
        // Batches of lines 2-5 and 6-9 are applied; 10-11 (the bad line's
        // batch) are not, nor anything after.
        assert!(
            e.contains("lines up to 9 are applied") && e.contains("--from-line 10"),
            "{e}"
        );
        for i in 0..8 {
            assert_eq!(value(&*store, &format!("u{i}")).await, Some(i), "{bad}");
        }
        for uuid in ["u8", "u9", "after", "x"] {
            assert_eq!(value(&*store, uuid).await, None, "{bad}: {uuid} applied");
        }
        // Resuming where it says, with the line corrected, completes it.
        let fixed = file_with_bad_line(
            r#"{"kind":"counter","entity":"E","action":"A","uuid":"x","value":2}"#,
        );
        let resume = import::Options {
            from_line: 10,
            ..options
        };
        import_text(&*store, &fixed, &resume).await.unwrap();
        for uuid in ["u8", "u9", "after", "x"] {
            assert!(value(&*store, uuid).await.is_some(), "{uuid}");
        }
    }
}

#[tokio::test]
async fn skip_bad_sets_bad_lines_aside_and_goes_on() {
    let (dir, store) = empty_store();
    let skipped = dir.path().join("bad.ndjson");
    let overflow = json!({"kind": "day", "entity": "E", "action": "A", "uuid": "u9", "day": day(0),
                          "value": i64::MAX})
    .to_string();
    let mut text = file_with_bad_line(r#"{"kind":"gauge"}"#);
    text.push_str(&overflow);
    text.push_str("\nnot json\n");
    let options = import::Options {
        batch_records: 4,
        skip_bad: Some(skipped.clone()),
        ..import::Options::default()
    };
    let done = import_text(&*store, &text, &options).await.unwrap();
    assert_eq!(done.bad, 3);
    assert_eq!(done.counters, 11);
    for i in 0..10 {
        assert_eq!(value(&*store, &format!("u{i}")).await, Some(i));
    }
    assert_eq!(value(&*store, "after").await, Some(1));
    let aside = std::fs::read_to_string(&skipped).unwrap();
    assert_eq!(
        aside,
        format!(
            // In the order found: the overflow only when its batch was set.
            "{}{{\"kind\":\"gauge\"}}\nnot json\n{overflow}\n",
            format::header_line()
        )
    );
    // The set-aside file is an import file: fixed, it imports.
    let fixed = aside
        .replace("{\"kind\":\"gauge\"}\n", "")
        .replace("not json\n", "")
        .replace(&i64::MAX.to_string(), "3");
    import_text(&*store, &fixed, &import::Options::default())
        .await
        .unwrap();
    // Day 0 set to 3 beside day 1's 9.
    assert_eq!(value(&*store, "u9").await, Some(12));
}

#[tokio::test]
async fn the_header_is_required_and_versioned() {
    let (_dir, store) = empty_store();
    for (text, why) in [
        ("", "is empty"),
        (
            "{\"kind\":\"counter\",\"entity\":\"E\",\"action\":\"A\",\"uuid\":\"u\",\"value\":1}\n",
            "must be the header",
        ),
        (
            "{\"kind\":\"header\",\"format\":\"counter-gateway\",\"version\":6}\n",
            "versions 1 to 5",
        ),
    ] {
        let e = import_text(&*store, text, &import::Options::default())
            .await
            .unwrap_err();
        assert!(e.contains(why), "{text}: {e}");
    }
    // A version 1 file (before marks) imports as it did.
    let v1 = format!(
        "{{\"kind\":\"header\",\"format\":\"counter-gateway\",\"version\":1}}\n{}\n",
        json!({"kind": "counter", "entity": "E", "action": "A", "uuid": "u", "value": 4})
    );
    let done = import_text(&*store, &v1, &import::Options::default())
        .await
        .unwrap();
    assert_eq!(done.counters, 1);
    assert_eq!(value(&*store, "u").await, Some(4));
    // A version 2 file (before publication times) too, and it leaves the
    // publication times stored as they are.
    store
        .set_published(vec![counter_gateway::store::PublishedSet {
            entity: "E".into(),
            uuid: "u".into(),
            at_ms: Some(test_now().timestamp_millis()),
            replace: true,
        }])
        .await
        .unwrap();
    let v2 = format!(
        "{{\"kind\":\"header\",\"format\":\"counter-gateway\",\"version\":2}}\n{}\n",
        json!({"kind": "counter", "entity": "E", "action": "A", "uuid": "u", "value": 6})
    );
    let done = import_text(&*store, &v2, &import::Options::default())
        .await
        .unwrap();
    assert_eq!((done.counters, done.published), (1, 0));
    assert_eq!(value(&*store, "u").await, Some(6));
    assert_eq!(
        store.published("E", "u").await.unwrap(),
        Some(test_now().timestamp_millis())
    );
}

/// An imported publication time replaces the one stored, as an admin's
/// `PUT` does (import sets, it does not add; an event's set-if-none would
/// keep the old), and a target the file does not name keeps its own. An
/// implausible one stops the import at its line, nothing of its batch set.
#[tokio::test]
async fn an_imported_publication_time_replaces_the_stored_one_and_keeps_the_rest() {
    let (_dir, store) = empty_store();
    let at = |n: i64| (test_now() - Days::days(n)).timestamp_millis();
    let set = |uuid: &str, ms: i64| counter_gateway::store::PublishedSet {
        entity: "A".into(),
        uuid: uuid.into(),
        at_ms: Some(ms),
        replace: true,
    };
    store
        .set_published(vec![set("named", at(5)), set("other", at(6))])
        .await
        .unwrap();
    let line = |uuid: &str, published: &str| json!({"kind": "published", "entity": "A", "uuid": uuid, "published": published});
    let file = format!("{}{}\n", format::header_line(), line("named", &ts(2)));
    let done = import_text(&*store, &file, &import::Options::default())
        .await
        .unwrap();
    assert_eq!(done.published, 1);
    assert_eq!(store.published("A", "named").await.unwrap(), Some(at(2)));
    assert_eq!(store.published("A", "other").await.unwrap(), Some(at(6)));
    let bad = format!(
        "{}{}\n{}\n",
        format::header_line(),
        line("named", &ts(1)),
        line("other", "2001-01-01T00:00:00Z")
    );
    let e = import_text(&*store, &bad, &import::Options::default())
        .await
        .unwrap_err();
    assert!(
        e.contains("line 3: published 2001-01-01T00:00:00Z is before 2008-01-01"),
        "{e}"
    );
    assert_eq!(store.published("A", "named").await.unwrap(), Some(at(2)));
    assert_eq!(store.published("A", "other").await.unwrap(), Some(at(6)));
}

/// The command line: import a file into a data directory, export it back
/// (the same bytes), and a bad file exits non-zero naming its line. Dates
/// are fixed in the past, so this passes on any run date.
#[test]
fn the_commands_round_trip_a_file_and_fail_on_a_bad_line() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let input = dir.path().join("in.ndjson");
    let output = dir.path().join("out.ndjson");
    // In the order export writes fields.
    let mut text = format::header_line();
    for (uuid, value) in [("a", 5), ("b", -2)] {
        text.push_str(&format!(
            r#"{{"kind":"counter","entity":"E","action":"A","uuid":"{uuid}","value":{value},"before":{value},"first_timestamp":"2020-01-01T00:00:00.000Z","recorded_timestamp":"2021-06-01T12:00:00.000Z","days":{{}},"hours":{{}}}}"#
        ));
        text.push('\n');
    }
    text.push_str(
        r#"{"kind":"published","entity":"E","uuid":"a","published":"2021-05-01T10:00:00.000Z"}"#,
    );
    text.push('\n');
    std::fs::write(&input, &text).unwrap();
    let bin = env!("CARGO_BIN_EXE_counter-gateway");
    let run = |args: &[&str]| {
        std::process::Command::new(bin)
            .args(args)
            .env_remove("COUNTER_GATEWAY_ELASTICSEARCH_URL")
            .output()
            .unwrap()
    };
    let d = data.to_str().unwrap();
    let out = run(&[
        "import",
        "--data-dir",
        d,
        "--tenant",
        "acme",
        "--input",
        input.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("imported 2 counters") && stderr.contains("1 publication times"),
        "{stderr}"
    );
    let out = run(&[
        "export",
        "--data-dir",
        d,
        "--tenant",
        "acme",
        "--output",
        output.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(std::fs::read_to_string(&output).unwrap(), text);
    // To standard output too.
    let out = run(&["export", "--data-dir", d, "--tenant", "acme"]);
    assert_eq!(String::from_utf8(out.stdout).unwrap(), text);
    // A tenant that has no store is an error, not an empty export.
    let out = run(&["export", "--data-dir", d, "--tenant", "nobody"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no embedded store"));
    std::fs::write(&input, format!("{text}{{\"kind\":\"counter\"}}\n")).unwrap();
    let out = run(&[
        "import",
        "--data-dir",
        d,
        "--input",
        input.to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("line 5: missing field `entity`"),
        "{stderr}"
    );
}

/// The import command killed with SIGKILL mid-file, then run again with the
/// same checkpoint: it resumes after the last batch it recorded (replaying
/// at most what it applied after that: harmless, since import sets), and
/// the store ends as one uninterrupted import leaves it. Dates are fixed in
/// the past (the binary runs on the system clock).
#[test]
fn an_import_killed_mid_file_resumes_from_its_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let input = dir.path().join("in.ndjson");
    let checkpoint = dir.path().join("in.checkpoint");
    let mut text = format::header_line();
    let records = 50_000;
    for i in 0..records {
        text.push_str(&format!(
            r#"{{"kind":"counter","entity":"E","action":"A","uuid":"u{i:06}","value":{i},"before":{i},"first_timestamp":"2020-01-01T00:00:00.000Z","recorded_timestamp":"2021-06-01T12:00:00.000Z","days":{{}},"hours":{{}}}}"#
        ));
        text.push('\n');
    }
    std::fs::write(&input, &text).unwrap();
    let bin = env!("CARGO_BIN_EXE_counter-gateway");
    let args = [
        "import",
        "--data-dir",
        data.to_str().unwrap(),
        "--input",
        input.to_str().unwrap(),
        "--checkpoint",
        checkpoint.to_str().unwrap(),
        "--batch-size",
        "50",
    ];
    let mut child = std::process::Command::new(bin)
        .args(args)
        .env_remove("COUNTER_GATEWAY_ELASTICSEARCH_URL")
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Kill it once a few batches are recorded, before it can finish.
    let started = std::time::Instant::now();
    let recorded = loop {
        let line = std::fs::read_to_string(&checkpoint)
            .ok()
            .and_then(|t| serde_json::from_str::<Value>(&t).ok())
            .and_then(|v| v["line"].as_u64());
        if let Some(l) = line.filter(|&l| l > 500) {
            break l;
        }
        assert!(
            child.try_wait().unwrap().is_none(),
            "the import finished before it could be killed"
        );
        assert!(started.elapsed() < Duration::from_secs(120), "no progress");
        std::thread::sleep(Duration::from_millis(5));
    };
    // SIGKILL: no chance to tidy up.
    child.kill().unwrap();
    child.wait().unwrap();
    let at_kill: Value =
        serde_json::from_str(&std::fs::read_to_string(&checkpoint).unwrap()).unwrap();
    let resume_after = at_kill["line"].as_u64().unwrap();
    assert!(resume_after >= recorded && resume_after < records as u64 + 1);
    let out = std::process::Command::new(bin)
        .args(args)
        .env_remove("COUNTER_GATEWAY_ELASTICSEARCH_URL")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains(&format!("resuming after line {resume_after}")),
        "{stderr}"
    );
    assert!(!checkpoint.exists());
    let out = std::process::Command::new(bin)
        .args(["export", "--data-dir", data.to_str().unwrap()])
        .env_remove("COUNTER_GATEWAY_ELASTICSEARCH_URL")
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(
        String::from_utf8(out.stdout).unwrap() == text,
        "the store after the resumed import differs from the file"
    );
}

/// An export naming `fingerprint`, with days from `rules`' retention on.
async fn export_marked(
    store: &dyn Store,
    fingerprint: Option<&str>,
    rules: format::Rules,
) -> String {
    let mut out = Vec::new();
    let what = export::Export {
        from_day: rules.oldest_day(),
        hours_from_day: rules.oldest_hour_day(),
        marks: true,
        fingerprint: fingerprint.map(str::to_string),
        tenant: "default".into(),
    };
    export::write(store, &mut out, &what, &hidden())
        .await
        .unwrap();
    String::from_utf8(out).unwrap()
}

fn into_dir(dir: &std::path::Path, given: Option<&str>) -> import::Options {
    import::Options {
        secret: counter_gateway::transfer::secret::SecretCheck::Embedded {
            data_dir: dir.to_path_buf(),
            tenant: "default".into(),
            given: given.map(str::to_string),
        },
        ..import::Options::default()
    }
}

fn open_store(dir: &std::path::Path) -> SqliteStore {
    SqliteStore::open(
        dir,
        Durability::Full,
        Duration::from_secs(7 * 86_400),
        TimePolicy::default().retention_days,
        ManualClock::new(test_now()).clock(),
    )
    .unwrap()
}

/// Marks go out and come back: the file names the secret by its
/// fingerprint and holds no actor; a data directory without a secret takes
/// the marks only with the secret they were made with (and keeps it for its
/// gateway); importing twice, and exporting again, give the same file; a
/// gateway on the imported store does not count a repeat like or view.
#[tokio::test]
async fn marks_round_trip_and_the_imported_store_counts_no_actor_twice() {
    let app = TestApp::start_with(common::backdating()).await;
    common::liked_and_viewed(&app).await;
    let (secret, fp) = common::actor_secret_of(app.data_dir());
    let file = export_marked(&*app.state.store, Some(&fp), rules()).await;
    let all = lines(&file);
    assert_eq!(all[0]["version"], 5);
    assert_eq!(
        all[1],
        json!({"kind": "actor_secret", "fingerprint": fp, "keyed_for": "default"})
    );
    let marks: Vec<&Value> = all.iter().filter(|r| r["kind"] == "mark").collect();
    // Likes that stand (carol's was taken back), then views by day.
    let scopes: Vec<(&str, &str, Option<&str>)> = marks
        .iter()
        .map(|m| {
            (
                m["uuid"].as_str().unwrap(),
                m["scope"].as_str().unwrap(),
                m["day"].as_str(),
            )
        })
        .collect();
    let (d0, d1, d399) = (day(0), day(1), day(399));
    let mut want = vec![
        ("a1", "ever", None),
        ("a1", "ever", None),
        ("a2", "ever", None),
    ];
    want.sort_by_key(|w| w.0);
    let mut ever: Vec<_> = scopes[..3].to_vec();
    ever.sort_by_key(|w| w.0);
    assert_eq!(ever, want, "{file}");
    assert_eq!(
        scopes[3..].to_vec(),
        vec![
            ("a1", "day", Some(d399.as_str())),
            ("a1", "day", Some(d1.as_str())),
            ("a1", "day", Some(d0.as_str())),
            ("a1", "day", Some(d0.as_str())),
        ],
        "{file}"
    );
    assert!(marks
        .iter()
        .all(|m| m["state"] == "counted" && m["mark"].as_str().unwrap().len() == 32));
    for who in ["alice", "bob", "carol", "visitor"] {
        assert!(!file.contains(who), "{who} in {file}");
    }
    assert!(!file.contains(&secret));

    // Into a new data directory: not without the secret, and nothing of
    // the file applied.
    let dir = tempfile::tempdir().unwrap();
    let store = open_store(dir.path());
    let e = import_text(&store, &file, &into_dir(dir.path(), None))
        .await
        .unwrap_err();
    assert!(
        e.starts_with("line 2: ") && e.contains(&fp) && e.contains("--actor-secret"),
        "{e}"
    );
    assert!(store.counter_page(None, 10, 0, 0).await.unwrap().is_empty());
    assert!(!dir.path().join("actor-secret").exists());
    // With it: the marks set, the secret kept for the gateway.
    let done = import_text(&store, &file, &into_dir(dir.path(), Some(&secret)))
        .await
        .unwrap();
    assert_eq!((done.marks, done.marks_expired), (7, 0));
    assert_eq!(
        common::actor_secret_of(dir.path()),
        (secret.clone(), fp.clone())
    );
    // Twice: the same state, the same file.
    import_text(&store, &file, &into_dir(dir.path(), None))
        .await
        .unwrap();
    assert_eq!(export_marked(&store, Some(&fp), rules()).await, file);
    drop(store);
    app.stop().await;

    // A gateway over the imported store knows every actor already.
    let app = TestApp::start_in_dir(Arc::new(dir), common::Options::default()).await;
    let like = |who: &str| json!({"actor": who, "unique": "ever"});
    let r = app
        .increment("ARTICLE", "like", "a1", like("alice@example.org"))
        .await;
    assert_eq!(
        (&r.json["counted"], &r.json["value"]),
        (&json!(false), &json!(2)),
        "{}",
        r.text
    );
    let r = app.increment("ARTICLE", "like", "a1", like("carol")).await;
    assert_eq!(
        (&r.json["counted"], &r.json["value"]),
        (&json!(true), &json!(3)),
        "{}",
        r.text
    );
    let r = app
        .post(
            "/v1/events",
            json!({"events": [
                {"entity": "ARTICLE", "action": "VIEW", "uuid": "a1", "actor": "visitor-1", "unique": "day"},
                {"entity": "ARTICLE", "action": "VIEW", "uuid": "a1", "actor": "visitor-4", "unique": "day"},
            ]}),
        )
        .await;
    assert_eq!(
        r.json,
        json!({"accepted": 1, "duplicates": 0, "repeats": 1}),
        "{}",
        r.text
    );
    app.stop().await;
}

/// A view mark of a day the retention no longer keeps is not exported, and
/// is left out (counted) by an import: the store would delete it, and no
/// event of that day is accepted. A file exported one day imports the next.
#[tokio::test]
async fn a_mark_past_the_retention_is_neither_exported_nor_imported() {
    let app = TestApp::start_with(common::backdating()).await;
    common::liked_and_viewed(&app).await;
    let (_, fp) = common::actor_secret_of(app.data_dir());
    let now = export_marked(&*app.state.store, Some(&fp), rules()).await;
    let old_mark = format!(r#""scope":"day","day":"{}""#, day(399));
    assert!(now.contains(&old_mark), "{now}");
    // Two days later the view of 399 days ago is past the 400 days kept.
    let later = format::Rules {
        now: test_now() + Days::days(2),
        policy: TimePolicy::default(),
    };
    let then = export_marked(&*app.state.store, Some(&fp), later).await;
    assert!(!then.contains(&old_mark), "{then}");
    assert_eq!(then.lines().count(), now.lines().count() - 1);
    let (dir, store) = empty_store();
    let done = import::read_all(
        &*store,
        now.as_bytes(),
        &later,
        &into_dir(dir.path(), None),
        &hidden(),
    )
    .await
    .unwrap_err();
    assert!(done.contains("actor-secret"), "{done}");
    let (secret, _) = common::actor_secret_of(app.data_dir());
    let done = import::read_all(
        &*store,
        now.as_bytes(),
        &later,
        &into_dir(dir.path(), Some(&secret)),
        &hidden(),
    )
    .await
    .unwrap();
    assert_eq!((done.marks, done.marks_expired), (6, 1));
    let kept = store.mark_page(None, 100, 0).await.unwrap();
    assert_eq!(kept.len(), 6);
    assert!(kept.iter().all(|m| m.day != Some(day_of(test_now()) - 399)));
    app.stop().await;
}

/// A file whose marks were keyed with another secret than the store's is
/// refused at its `actor_secret` line, before anything is applied; with
/// `--skip-marks` it imports without them. Marks without a fingerprint
/// import (with a warning); a fingerprint after the marks is refused.
#[tokio::test]
async fn a_file_of_marks_keyed_with_another_secret_is_refused_before_anything_is_applied() {
    let theirs = counter_gateway::domain::ActorKey::new(b"the other store's secret").unwrap();
    let their_fp = theirs.fingerprint().unwrap();
    let key = CounterKey::new("E", "A", "u").unwrap();
    let mark = format::mark_line(&counter_gateway::store::ActorMark {
        key: key.clone(),
        mark: theirs.mark(&key, "alice").unwrap(),
        day: None,
        state: counter_gateway::store::MarkState::Counted,
    });
    let counter = format!(
        "{}\n",
        json!({"kind": "counter", "entity": "E", "action": "A", "uuid": "u", "value": 1})
    );
    let file = format!(
        "{}{}{counter}{mark}",
        format::header_line(),
        format::actor_secret_line(&their_fp, Some("default"))
    );
    let (dir, store) = empty_store();
    let ours = "this store's own secret, not theirs";
    assert!(counter_gateway::actors::keep_embedded_secret(dir.path(), ours).unwrap());
    let our_fp = counter_gateway::domain::ActorKey::new(ours.as_bytes())
        .unwrap()
        .fingerprint()
        .unwrap();
    let e = import_text(&*store, &file, &into_dir(dir.path(), None))
        .await
        .unwrap_err();
    assert!(e.starts_with("line 2: "), "{e}");
    assert!(
        e.contains(&their_fp) && e.contains(&our_fp) && e.contains("--skip-marks"),
        "{e}"
    );
    assert_eq!(value(&*store, "u").await, None);
    let e = import_text(
        &*store,
        &file,
        &into_dir(dir.path(), Some("yet another secret, given")),
    )
    .await
    .unwrap_err();
    assert!(e.contains("--actor-secret has fingerprint"), "{e}");
    // Without the marks.
    let skip = import::Options {
        skip_marks: true,
        ..into_dir(dir.path(), None)
    };
    let done = import_text(&*store, &file, &skip).await.unwrap();
    assert_eq!((done.counters, done.marks, done.marks_skipped), (1, 0, 1));
    assert!(store.mark_page(None, 10, 0).await.unwrap().is_empty());
    // The secret they were made with, given (a gateway run with it uses it).
    let done = import_text(
        &*store,
        &file,
        &into_dir(dir.path(), Some("the other store's secret")),
    )
    .await
    .unwrap();
    assert_eq!(done.marks, 1);
    assert_eq!(
        common::actor_secret_of(dir.path()).1,
        our_fp,
        "the store's own file is left alone"
    );
    // No fingerprint: imported as they are.
    let bare = format!("{}{counter}{mark}", format::header_line());
    let (dir2, store2) = empty_store();
    let done = import_text(&*store2, &bare, &into_dir(dir2.path(), None))
        .await
        .unwrap();
    assert_eq!(done.marks, 1);
    // A fingerprint after the marks it should name.
    let late = format!(
        "{bare}{}",
        format::actor_secret_line(&their_fp, Some("default"))
    );
    let e = import_text(&*store2, &late, &into_dir(dir2.path(), None))
        .await
        .unwrap_err();
    assert!(
        e.starts_with("line 4: ") && e.contains("before them"),
        "{e}"
    );
}

/// A resumed import checks the file's `actor_secret` record again even
/// when a tool (jq) rewrote it with its keys reordered and spaced: a file
/// of another secret's marks is refused before anything is applied.
#[tokio::test]
async fn a_resumed_import_checks_an_actor_secret_line_whose_keys_were_reordered() {
    let theirs = counter_gateway::domain::ActorKey::new(b"the other store's secret").unwrap();
    let their_fp = theirs.fingerprint().unwrap();
    let key = CounterKey::new("E", "A", "u").unwrap();
    let mark = format::mark_line(&counter_gateway::store::ActorMark {
        key: key.clone(),
        mark: theirs.mark(&key, "alice").unwrap(),
        day: None,
        state: counter_gateway::store::MarkState::Counted,
    });
    let counter = |uuid: &str| {
        format!(
            "{}\n",
            json!({"kind": "counter", "entity": "E", "action": "A", "uuid": uuid, "value": 1})
        )
    };
    for secret_line in [
        format!("{{\"fingerprint\":\"{their_fp}\",\"kind\":\"actor_secret\"}}\n"),
        format!("{{ \"kind\": \"actor_secret\", \"fingerprint\": \"{their_fp}\" }}\n"),
    ] {
        let file = format!(
            "{}{secret_line}{}{}{mark}",
            format::header_line(),
            counter("before"),
            counter("u"),
        );
        let (dir, store) = empty_store();
        assert!(counter_gateway::actors::keep_embedded_secret(
            dir.path(),
            "this store's own secret, not theirs"
        )
        .unwrap());
        // Resumed after line 3: the secret's line is among those skipped.
        let resume = import::Options {
            from_line: 4,
            ..into_dir(dir.path(), None)
        };
        let e = import_text(&*store, &file, &resume).await.unwrap_err();
        assert!(
            e.starts_with("line 2: ") && e.contains(&their_fp),
            "{secret_line}: {e}"
        );
        assert_eq!(value(&*store, "u").await, None, "{secret_line}");
        assert!(store.mark_page(None, 10, 0).await.unwrap().is_empty());
    }
}

/// A store whose marks were made before the table naming their counters
/// existed (an earlier version) gets it filled at open: its marks export.
#[tokio::test]
async fn marks_of_an_earlier_version_are_named_at_open_and_exported() {
    let app = TestApp::start_with(common::backdating()).await;
    common::liked_and_viewed(&app).await;
    let (_, fp) = common::actor_secret_of(app.data_dir());
    let before = export_marked(&*app.state.store, Some(&fp), rules()).await;
    let (dir, _) = app.stop().await;
    let db = rusqlite::Connection::open(dir.path().join("counters.sqlite3")).unwrap();
    assert!(db.execute("DELETE FROM actor_mark_keys", []).unwrap() >= 2);
    drop(db);
    let store = open_store(dir.path());
    assert_eq!(export_marked(&store, Some(&fp), rules()).await, before);
}

/// The command line carries marks and their secret: `export` names the
/// data directory's secret by its fingerprint; `import` into a data
/// directory without one refuses the marks unless given the secret (then
/// keeps it for the gateway), or imports without them with `--skip-marks`.
/// Dates are fixed in the past (the binary runs on the system clock).
#[test]
fn the_commands_carry_marks_and_name_their_secret() {
    let dir = tempfile::tempdir().unwrap();
    let (from, to, bare) = (
        dir.path().join("from"),
        dir.path().join("to"),
        dir.path().join("bare"),
    );
    std::fs::create_dir_all(&from).unwrap();
    let secret = "the secret of the data directory `from`";
    assert!(counter_gateway::actors::keep_embedded_secret(&from, secret).unwrap());
    let key = counter_gateway::domain::ActorKey::new(secret.as_bytes()).unwrap();
    let fp = key.fingerprint().unwrap();
    let like = CounterKey::new("E", "like", "a").unwrap();
    let mut text = format::header_line();
    text.push_str(
        r#"{"kind":"counter","entity":"E","action":"like","uuid":"a","value":1,"before":1,"first_timestamp":"2020-01-01T00:00:00.000Z","recorded_timestamp":"2021-06-01T12:00:00.000Z","days":{},"hours":{}}"#,
    );
    text.push('\n');
    text.push_str(&format::mark_line(&counter_gateway::store::ActorMark {
        key: like.clone(),
        mark: key.mark(&like, "alice").unwrap(),
        day: None,
        state: counter_gateway::store::MarkState::Counted,
    }));
    let input = dir.path().join("in.ndjson");
    std::fs::write(&input, &text).unwrap();
    let bin = env!("CARGO_BIN_EXE_counter-gateway");
    let run = |args: &[&str], secret: Option<&str>| {
        let mut c = std::process::Command::new(bin);
        c.args(args)
            .env_remove("COUNTER_GATEWAY_ELASTICSEARCH_URL")
            .env_remove("COUNTER_GATEWAY_ACTOR_SECRET")
            .env_remove("COUNTER_GATEWAY_SKIP_MARKS");
        if let Some(s) = secret {
            c.env("COUNTER_GATEWAY_ACTOR_SECRET", s);
        }
        c.output().unwrap()
    };
    let path = |p: &std::path::Path| p.to_str().unwrap().to_string();
    let out = run(
        &[
            "import",
            "--data-dir",
            &path(&from),
            "--input",
            &path(&input),
        ],
        None,
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = run(&["export", "--data-dir", &path(&from)], None);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let exported = String::from_utf8(out.stdout).unwrap();
    let want = format!(
        "{}{}{}",
        format::header_line(),
        format::actor_secret_line(&fp, Some("default")),
        &text[format::header_line().len()..]
    );
    assert_eq!(exported, want);
    let file = dir.path().join("out.ndjson");
    std::fs::write(&file, &exported).unwrap();

    // A data directory without a secret: refused, then taken with it.
    let import_to = |d: &std::path::Path, extra: &[&str], secret: Option<&str>| {
        let mut args = vec![
            "import".to_string(),
            "--data-dir".into(),
            path(d),
            "--input".into(),
            path(&file),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = run(&args, secret);
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (ok, stderr) = import_to(&to, &[], None);
    assert!(
        !ok && stderr.contains("line 2:") && stderr.contains("--actor-secret"),
        "{stderr}"
    );
    let (ok, stderr) = import_to(&to, &[], Some(secret));
    assert!(ok, "{stderr}");
    assert!(
        stderr.contains("1 marks of actors") && stderr.contains("kept the actor secret"),
        "{stderr}"
    );
    assert_eq!(
        std::fs::read_to_string(to.join("actor-secret")).unwrap(),
        secret
    );
    // Another secret given: refused, naming both fingerprints.
    let (ok, stderr) = import_to(&to, &[], Some("some other secret, not the one"));
    assert!(!ok && stderr.contains(&fp), "{stderr}");
    // Without the marks.
    let (ok, stderr) = import_to(&bare, &["--skip-marks"], None);
    assert!(
        ok && stderr.contains("1 marks left out (--skip-marks)"),
        "{stderr}"
    );
    assert!(!bare.join("actor-secret").exists());
}

/// Marks are keyed for their tenant: an export of an earlier version
/// (its `actor_secret` record has no `keyed_for`, its marks the first
/// keying) imported into a tenant is brought to that tenant's keying, also
/// when the import resumes past the record, so that a gateway on it still
/// counts the actor once; an export names its tenant, and marks keyed for
/// one tenant are refused by an import into another.
#[tokio::test]
async fn an_export_from_before_marks_were_keyed_for_their_tenant_imports_after() {
    let dir = Arc::new(tempfile::tempdir().unwrap());
    let secret = counter_gateway::actors::embedded_secret(dir.path()).unwrap();
    let fp = secret.fingerprint().unwrap();
    let key = CounterKey::new("ARTICLE", "like", "a1").unwrap();
    let old_mark = secret.untenanted_mark(&key, "alice").unwrap();
    let file = format!(
        "{}{}{}\n{}",
        format::header_line(),
        format::actor_secret_line(&fp, None),
        json!({"kind": "counter", "entity": "ARTICLE", "action": "like", "uuid": "a1", "value": 1}),
        format::mark_line(&counter_gateway::store::ActorMark {
            key: key.clone(),
            mark: old_mark,
            day: None,
            state: counter_gateway::store::MarkState::Counted,
        })
    );
    let into = |tenant: &str, from_line: u64| import::Options {
        secret: counter_gateway::transfer::secret::SecretCheck::Embedded {
            data_dir: dir.path().to_path_buf(),
            tenant: tenant.into(),
            given: None,
        },
        from_line,
        ..import::Options::default()
    };
    let acme_mark = secret.for_tenant("acme").mark(&key, "alice").unwrap();
    {
        // The whole file, and the file resumed at its mark: re-keyed both.
        for from_line in [1, 4] {
            let acme = open_store(&dir.path().join("tenants/acme"));
            acme.key_marks(&secret.for_tenant("acme")).await.unwrap();
            import_text(&acme, &file, &into("acme", from_line))
                .await
                .unwrap();
            let marks = acme.mark_page(None, 10, 0).await.unwrap();
            assert_eq!(
                marks.iter().map(|m| m.mark).collect::<Vec<_>>(),
                vec![acme_mark],
                "from line {from_line}"
            );
        }
    }
    let app = TestApp::start_in_dir(dir.clone(), common::Options::default()).await;
    let r = app
        .send(
            app.http
                .post(app.url(&common::counter_path("ARTICLE", "like", "a1", "/increment")))
                .header("x-tenant", "acme")
                .json(&json!({"actor": "alice", "unique": "ever"})),
        )
        .await;
    assert_eq!(
        (&r.json["counted"], &r.json["value"]),
        (&json!(false), &json!(1)),
        "{}",
        r.text
    );
    // The export of acme names its keying; another tenant refuses it.
    let acme = app.tenants.reader("acme").await.unwrap();
    let mut out = Vec::new();
    let what = export::Export {
        from_day: rules().oldest_day(),
        hours_from_day: rules().oldest_hour_day(),
        marks: true,
        fingerprint: Some(fp.clone()),
        tenant: "acme".into(),
    };
    export::write(&*acme.store, &mut out, &what, &hidden())
        .await
        .unwrap();
    let exported = String::from_utf8(out).unwrap();
    assert_eq!(
        lines(&exported)[1],
        json!({"kind": "actor_secret", "fingerprint": fp, "keyed_for": "acme"})
    );
    let globex = open_store(&dir.path().join("tenants/globex"));
    let e = import_text(&globex, &exported, &into("globex", 1))
        .await
        .unwrap_err();
    assert!(
        e.starts_with("line 2: ") && e.contains("keyed for tenant acme"),
        "{e}"
    );
    assert!(globex.get(&key).await.unwrap().is_none(), "nothing set");
}

fn admin_key_of(r: &common::Resp) -> String {
    assert_eq!(r.status, 200, "{}", r.text);
    r.json["admin_key"].as_str().unwrap().to_string()
}

/// CountAPI's records travel with the counters: a namespace imported into
/// another gateway keeps its admin key (`set` works with it and is refused
/// without) and its keys their bounds; the key itself is in no file (its
/// SHA-256 is); a key only hit has no record; export -> import -> export
/// is the same file, and importing it again changes nothing.
#[tokio::test]
async fn countapi_namespaces_keep_their_admin_key_and_bounds_through_export_and_import() {
    let app = TestApp::start().await;
    let admin = admin_key_of(
        &app.get("/countapi/create?namespace=mysite.com&key=likes&value=5&update_lowerbound=-2&update_upperbound=3")
            .await,
    );
    let r = app
        .get("/countapi/create?namespace=mysite.com&key=resettable&enable_reset=1")
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let other = admin_key_of(
        &app.get("/countapi/create?namespace=other.org&key=visits")
            .await,
    );
    assert_eq!(app.get("/countapi/hit/plain.net/hits").await.status, 200);
    let file = export_text(&*app.state.store).await;
    assert!(!file.contains(&admin) && !file.contains(&other), "{file}");
    let records: Vec<Value> = lines(&file)
        .into_iter()
        .filter(|r| r["kind"] == "countapi")
        .collect();
    let names: Vec<(&str, &str)> = records
        .iter()
        .map(|r| (r["namespace"].as_str().unwrap(), r["key"].as_str().unwrap()))
        .collect();
    assert_eq!(
        names,
        [
            ("mysite.com", "likes"),
            ("mysite.com", "resettable"),
            ("other.org", "visits")
        ]
    );
    assert_eq!(
        (
            records[0]["update_lowerbound"].clone(),
            records[0]["update_upperbound"].clone(),
            records[1]["enable_reset"].clone()
        ),
        (json!(-2), json!(3), json!(true))
    );
    assert_eq!(
        records[0]["admin_key_sha256"],
        records[1]["admin_key_sha256"]
    );
    assert_ne!(
        records[0]["admin_key_sha256"],
        records[2]["admin_key_sha256"]
    );

    let (dir, copy) = empty_store();
    let done = import_text(&*copy, &file, &import::Options::default())
        .await
        .unwrap();
    assert_eq!(done.countapi, 3);
    assert_eq!(export_text(&*copy).await, file);
    import_text(&*copy, &file, &import::Options::default())
        .await
        .unwrap();
    assert_eq!(export_text(&*copy).await, file);

    // A gateway over the copy: the same admin key, the same bounds.
    drop(copy);
    let moved = TestApp::start_in_dir(Arc::new(dir), common::Options::default()).await;
    assert_eq!(
        moved.get("/countapi/get/mysite.com/likes").await.json,
        json!({"value": 5})
    );
    let r = moved.get("/countapi/set/mysite.com/likes?value=42").await;
    common::assert_error(&r, 403, "forbidden", &["admin_key"]);
    let r = moved
        .get(&format!(
            "/countapi/set/mysite.com/likes?value=42&admin_key={other}"
        ))
        .await;
    common::assert_error(&r, 403, "forbidden", &["not the admin key"]);
    let r = moved
        .get(&format!(
            "/countapi/set/mysite.com/likes?value=42&admin_key={admin}"
        ))
        .await;
    assert_eq!(
        (r.status, r.json.clone()),
        (200, json!({"old_value": 5, "value": 42}))
    );
    let r = moved
        .get("/countapi/update/mysite.com/likes?amount=4")
        .await;
    common::assert_error(&r, 400, "invalid_request", &["update_upperbound 3"]);
    assert_eq!(
        moved
            .get("/countapi/update/mysite.com/likes?amount=3")
            .await
            .json,
        json!({"value": 45})
    );
    assert_eq!(
        moved
            .get("/countapi/set/mysite.com/resettable?value=7")
            .await
            .status,
        200
    );
}

/// Past the tenant's bound on namespaces, an import stops at the record
/// past it, naming the bound, with nothing of its batch applied (the
/// counter before it neither); `--skip-bad` sets that line aside.
#[tokio::test]
async fn a_countapi_record_past_the_bound_stops_the_import_with_nothing_of_its_batch_set() {
    use counter_gateway::domain::countapi::{
        CreatedKey, KeyRecord, KeyRules, Namespace, Restored, MAX_NAMESPACES,
    };
    let (_dir, store) = empty_store();
    let record = |ns: String| KeyRecord {
        namespace: Namespace {
            name: ns,
            admin_key_sha256: [7; 32],
            created_ms: test_now().timestamp_millis(),
        },
        key: "key".into(),
        created: CreatedKey {
            rules: KeyRules::new(false, -1, 1).unwrap(),
            created_ms: test_now().timestamp_millis(),
        },
    };
    let full: Vec<KeyRecord> = (1..MAX_NAMESPACES)
        .map(|i| record(format!("ns{i:05}")))
        .collect();
    assert_eq!(
        store.countapi_restore(full).await.unwrap(),
        Restored::Applied
    );
    let line = |ns: &str| format::countapi_line(&record(ns.into()));
    let file = format!(
        "{}{}\n{}{}{}",
        format::header_line(),
        json!({"kind": "counter", "entity": "E", "action": "A", "uuid": "u", "value": 4}),
        line("last.one"),
        line("one.more"),
        line("ns00001"),
    );
    let e = import_text(&*store, &file, &import::Options::default())
        .await
        .unwrap_err();
    assert!(e.contains("line 4:") && e.contains("namespaces"), "{e}");
    assert_eq!(value(&*store, "u").await, None);
    let page = store
        .countapi_page(Some(("last".into(), String::new())), 10)
        .await
        .unwrap();
    assert!(
        page.iter().all(|r| r.namespace.name != "last.one"),
        "{page:?}"
    );

    let skip = tempfile::NamedTempFile::new().unwrap();
    let options = import::Options {
        skip_bad: Some(skip.path().to_path_buf()),
        ..import::Options::default()
    };
    let done = import_text(&*store, &file, &options).await.unwrap();
    assert_eq!((done.countapi, done.bad, done.counters), (2, 1, 1));
    assert!(std::fs::read_to_string(skip.path())
        .unwrap()
        .contains("one.more"));
    assert_eq!(value(&*store, "u").await, Some(4));
}

/// A gateway with hourly traffic over the last three days: `h1` counted at
/// many hours, `h2` too with a day inside the hourly retention backfilled
/// (its hours do not sum to it), `h3` in the sports category.
async fn hourly() -> TestApp {
    let app = TestApp::start().await;
    let mut events = Vec::new();
    for k in 0..15i64 {
        let at = common::rfc3339(test_now() - chrono::Duration::hours(5 * k) - Days::minutes(7));
        for (uuid, count) in [("h1", k + 1), ("h2", 2 * k + 1), ("h3", 3)] {
            events.push(json!({
                "entity": "VIDEO", "action": "VIEW", "uuid": uuid, "count": count,
                "timestamp": at, "category": (uuid == "h3").then_some("sports"),
            }));
        }
    }
    let r = app.post("/v1/events", json!({ "events": events })).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let r = app
        .send(
            app.http
                .put(app.url(&format!("/v1/counters/VIDEO/VIEW/h2/days/{}", day(1))))
                .json(&json!({"value": 500})),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    app
}

/// What the hour and local-day reads answer, each as its whole JSON body.
async fn hour_answers(app: &TestApp) -> Vec<(String, Value)> {
    let mut out = Vec::new();
    for path in [
        format!(
            "/v1/counters/VIDEO/VIEW/h1/histogram?tz=Europe/Berlin&from={}",
            day(3)
        ),
        format!(
            "/v1/counters/VIDEO/VIEW/h1/histogram?bucket=hour&from={}",
            day(3)
        ),
        format!(
            "/v1/counters/VIDEO/VIEW/h2/histogram?bucket=hour&from={}",
            day(3)
        ),
        format!(
            "/v1/counters/VIDEO/VIEW/h2/histogram?tz=Europe/Berlin&from={}",
            day(3)
        ),
        "/v1/top/VIDEO/VIEW?interval=last_24_hours".to_string(),
        "/v1/top/VIDEO/VIEW?interval=last_week&tz=Europe/Berlin&category=sports".to_string(),
    ] {
        let r = app.get(&path).await;
        assert_eq!(r.status, 200, "{path}: {}", r.text);
        out.push((path, r.json));
    }
    out
}

/// The file of format 5 carries each counter's hours: after export and
/// import into a fresh store, the local-day (`tz=Europe/Berlin`) and
/// `bucket=hour` histograms and the hour lists answer exactly as before,
/// `exact` included (a backfilled day stays not exact, the others exact).
/// A file without hours (version 4) sets the same days with their hours
/// unknown: hour answers over them say `exact: false` rather than counting
/// nothing.
#[tokio::test]
async fn hours_travel_with_their_counters_and_a_file_without_them_is_not_exact() {
    let app = hourly().await;
    let before = hour_answers(&app).await;
    assert_eq!(before[1].1["exact"], true, "{:?}", before[1]);
    assert!(before[1].1["buckets"].as_array().unwrap().len() >= 10);
    assert_eq!(before[0].1["exact"], true, "{:?}", before[0]);
    assert_eq!(before[2].1["exact"], false, "{:?}", before[2]);
    let text = export_text(&*app.state.store).await;
    let all = lines(&text);
    let h1 = record(&all, "counter", "h1");
    let hours = h1["hours"].as_object().unwrap();
    assert_eq!(hours.len(), 15, "{h1}");
    let summed: i64 = hours.values().map(|v| v.as_i64().unwrap()).sum();
    assert_eq!(summed, (1..=15).sum::<i64>());
    // The backfilled day's hours are what its increments put there, and
    // its day holds more: that difference is the day's rest on import.
    let h2 = record(&all, "counter", "h2");
    assert_eq!(h2["days"][day(1)], 500);

    let copy = TestApp::start().await;
    let done = import_text(&*copy.state.store, &text, &import::Options::default())
        .await
        .unwrap();
    assert_eq!(done.hours, 45);
    assert_eq!(hour_answers(&copy).await, before);
    assert_eq!(export_text(&*copy.state.store).await, text);
    // Imported again (importing sets): the same answers.
    import_text(&*copy.state.store, &text, &import::Options::default())
        .await
        .unwrap();
    assert_eq!(hour_answers(&copy).await, before);

    // The same file as version 4 wrote it: no hours.
    let mut v4 = format!(
        "{}\n",
        json!({"kind": "header", "format": "counter-gateway", "version": 4})
    );
    for mut r in all.into_iter().skip(1) {
        if let Some(o) = r.as_object_mut() {
            o.remove("hours");
        }
        v4.push_str(&format!("{r}\n"));
    }
    let old = TestApp::start().await;
    let done = import_text(&*old.state.store, &v4, &import::Options::default())
        .await
        .unwrap();
    assert_eq!((done.counters, done.hours), (3, 0));
    let after = hour_answers(&old).await;
    for (path, j) in &after {
        assert_eq!(j["exact"], false, "{path}: {j}");
    }
    // The days themselves moved whole.
    let r = old
        .get(&format!(
            "/v1/counters/VIDEO/VIEW/h1/histogram?from={}",
            day(3)
        ))
        .await;
    let r0 = app
        .get(&format!(
            "/v1/counters/VIDEO/VIEW/h1/histogram?from={}",
            day(3)
        ))
        .await;
    assert_eq!(r.json, r0.json);
    // Importing the version 5 file over it makes them exact again.
    import_text(&*old.state.store, &text, &import::Options::default())
        .await
        .unwrap();
    assert_eq!(hour_answers(&old).await, before);
}

/// Hours are bounded with the days: a batch closes before its day and hour
/// buckets pass `batch_days`, and a bad hour stops the import at its line
/// with nothing of its batch applied (or, with `--skip-bad`, is set aside).
#[tokio::test]
async fn hours_count_against_the_batch_bound_and_a_bad_hour_is_named() {
    let d = day(0);
    let rec = |uuid: &str, hours: Value| {
        json!({"kind": "counter", "entity": "E", "action": "A", "uuid": uuid, "value": 6,
               "days": {d.clone(): 6}, "hours": hours})
        .to_string()
    };
    let good = |uuid: &str| rec(uuid, json!({format!("{d}T00"): 1, format!("{d}T01"): 2}));
    let bad = rec("bad", json!({format!("{}T05", day(1)): 6}));
    let text = format!(
        "{}{}\n{}\n{}\n",
        format::header_line(),
        good("u1"),
        good("u2"),
        bad
    );
    let (_dir, store) = empty_store();
    let e = import_text(&*store, &text, &import::Options::default())
        .await
        .unwrap_err();
    assert!(e.contains("line 4") && e.contains("does not list"), "{e}");
    // One batch: nothing of it applied.
    assert_eq!(value(&*store, "u1").await, None);
    // With a bound of 3 buckets (a day and two hours per record), each
    // record is a batch of its own: the first is applied, the second's
    // batch is the bad line's.
    let options = import::Options {
        batch_days: 3,
        ..Default::default()
    };
    let e = import_text(&*store, &text, &options).await.unwrap_err();
    assert!(e.contains("line 4"), "{e}");
    assert_eq!(value(&*store, "u1").await, Some(6));
    assert_eq!(value(&*store, "u2").await, None);
    let key = CounterKey::new("E", "A", "u1").unwrap();
    let today = day_of(test_now());
    let h = store
        .hour_histogram(
            &key,
            counter_gateway::domain::HourRange {
                from_hour: today * 24,
                to_hour: today * 24 + 23,
            },
        )
        .await
        .unwrap()
        .unwrap();
    // Day 6 = hours 1 + 2 + a rest of 3: not exact.
    assert_eq!(h.buckets.len(), 2);
    assert!(!h.exact);
    // --skip-bad sets the bad line aside and imports the rest.
    let (_dir, store) = empty_store();
    let skipped = tempfile::NamedTempFile::new().unwrap();
    let options = import::Options {
        skip_bad: Some(skipped.path().to_path_buf()),
        ..Default::default()
    };
    let done = import_text(&*store, &text, &options).await.unwrap();
    assert_eq!((done.counters, done.bad, done.hours), (2, 1, 4));
    let aside = std::fs::read_to_string(skipped.path()).unwrap();
    assert!(aside.contains("\"bad\""), "{aside}");
}
