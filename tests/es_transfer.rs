//! `export`, `import` and `migrate` against a real search engine: the same
//! data exported from the embedded store and from Elasticsearch is the same
//! file; export -> import -> export on Elasticsearch gives that file again;
//! importing twice changes nothing; `migrate` copies every tenant of an
//! embedded data directory and its verification passes; a counter altered
//! in the cluster is reported (and makes `migrate` fail).
//!
//! Ignored by default; the gate (`scripts/test.sh`) runs them against a real
//! OpenSearch 2.19 node (`scripts/opensearch.sh`), or `ELASTICSEARCH_URL`:
//! `ELASTICSEARCH_URL=http://localhost:9200 cargo test --test es_transfer -- --ignored`.
//! Without a reachable engine each test fails and says why. Each test works
//! under its own index prefix and removes what it created. Days are
//! relative to the test clock (`common::test_now`).

#[path = "common/mod.rs"]
mod common;

use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use counter_gateway::config::{Cli, Command, StoreArgs};
use counter_gateway::domain::{
    day_of, format_day, Clock, Counter, CounterKey, ManualClock, TimePolicy,
};
use counter_gateway::store::elasticsearch::config::EsConfig;
use counter_gateway::store::elasticsearch::ElasticsearchStore;
use counter_gateway::store::sqlite::{Durability, SqliteStore};
use counter_gateway::store::{AverageBucket, AverageHistory, Bucket, CounterHistory, Store};
use counter_gateway::transfer::{export, format, import, migrate};
use serde_json::{json, Value};

const NEEDS: &str = "needs a real Elasticsearch or OpenSearch: set ELASTICSEARCH_URL, or run \
     `scripts/opensearch.sh run -- cargo test --test es_transfer -- --ignored`";

async fn cluster() -> String {
    let url = match std::env::var("ELASTICSEARCH_URL") {
        Ok(u) if !u.trim().is_empty() => u.trim().trim_end_matches('/').to_string(),
        _ => panic!("no search engine to test against: {NEEDS}"),
    };
    match reqwest::get(&url).await {
        Ok(r) if r.status().is_success() => url,
        Ok(r) => panic!("ELASTICSEARCH_URL={url} answered {}: {NEEDS}", r.status()),
        Err(e) => panic!("ELASTICSEARCH_URL={url} is not reachable ({e}): {NEEDS}"),
    }
}

fn prefix() -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    format!(
        "cg-transfer-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

fn clock() -> Clock {
    ManualClock::new(common::test_now()).clock()
}

fn rules() -> format::Rules {
    format::Rules {
        now: common::test_now(),
        policy: TimePolicy::default(),
    }
}

fn today() -> i64 {
    day_of(common::test_now())
}

/// Removes every index, template and script under `prefix`.
async fn cleanup(url: &str, prefix: &str) {
    let http = reqwest::Client::new();
    let indices: Value = http
        .get(format!("{url}/_cat/indices/{prefix}_*?format=json&h=index"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap_or(json!([]));
    for i in indices.as_array().into_iter().flatten() {
        let _ = http
            .delete(format!("{url}/{}", i["index"].as_str().unwrap()))
            .send()
            .await;
    }
    let names = EsConfig::new(url, prefix, "default").unwrap().names;
    let es8 = counter_gateway::store::elasticsearch::templates::Engine::Elasticsearch {
        major: 8,
        minor: 15,
        ilm: true,
    };
    for step in counter_gateway::store::elasticsearch::templates::steps(&names, es8)
        .iter()
        .rev()
    {
        let _ = http.delete(format!("{url}{}", step.path)).send().await;
    }
}

/// The Elasticsearch store of `tenant` under `prefix`, set up.
async fn es_store(url: &str, prefix: &str, tenant: &str) -> ElasticsearchStore {
    let cfg = EsConfig::new(url, prefix, "default").unwrap();
    ElasticsearchStore::open(cfg, clock(), true)
        .await
        .expect("setup against the cluster")
        .for_tenant(tenant)
        .unwrap()
}

fn sqlite(dir: &Path) -> SqliteStore {
    SqliteStore::open(
        dir,
        Durability::Relaxed,
        Duration::from_secs(7 * 86_400),
        TimePolicy::default().retention_days,
        clock(),
    )
    .unwrap()
}

/// A file of `n` counters over up to 60 days (categories, awkward keys, a
/// part before the days), averages, day records, and the publication
/// times of every 7th counter's target and of one without counters
/// ([`sample_published`] of them).
fn sample(n: usize, seed: i64) -> String {
    let mut text = format::header_line();
    for i in 0..n {
        let uuid = sample_uuid(i);
        let days: Vec<Bucket> = (0..60)
            .step_by(1 + i % 9)
            .map(|n| Bucket {
                day: today() - n as i64,
                value: (i as i64 + seed) * (n as i64 + 1) - 3,
            })
            .collect();
        let value = days.iter().map(|b| b.value).sum::<i64>() + (i as i64 % 4) * 100;
        // The start of its latest day: never ahead of the clock, at any hour.
        let recorded = days.first().map_or(0, |b| b.day * 86_400_000);
        text.push_str(&format::counter_line(&CounterHistory {
            counter: Counter {
                key: CounterKey::new(["VIDEO", "ARTICLE"][i % 2], "VIEW", &uuid).unwrap(),
                value,
                category: (i % 3 == 0).then(|| "sports".to_string()),
                first_ms: (today() - 500) * 86_400_000 + i as i64,
                recorded_ms: recorded,
            },
            days,
            hours: Vec::new(),
        }));
    }
    for i in 0..n / 4 {
        let days: Vec<AverageBucket> = (0..20)
            .step_by(3)
            .map(|n| AverageBucket {
                day: today() - n,
                sum: 4 + n + seed,
                quantity: 1 + n % 3,
            })
            .collect();
        text.push_str(&format::average_line(&AverageHistory {
            key: CounterKey::new("ARTICLE", "rating", &format!("r{i}")).unwrap(),
            sum: days.iter().map(|d| d.sum).sum::<i64>() + 7,
            quantity: days.iter().map(|d| d.quantity).sum::<i64>() + 2,
            category: None,
            first_ms: (today() - 30) * 86_400_000,
            recorded_ms: today() * 86_400_000,
            days,
        }));
    }
    for i in 0..5 {
        text.push_str(
            &json!({"kind": "day", "entity": "PAGE", "action": "VIEW", "uuid": format!("p{i}"),
                    "day": format_day(today() - i), "value": 10 * i + seed})
            .to_string(),
        );
        text.push('\n');
    }
    let published = |entity: &str, uuid: &str, ms: i64| {
        format::published_line(&counter_gateway::store::TargetPublished {
            entity: entity.into(),
            uuid: uuid.into(),
            at_ms: ms,
        })
    };
    for i in (0..n).step_by(7) {
        let ms = (today() - (i % 50) as i64) * 86_400_000 + 1_000 * (i as i64 + seed);
        text.push_str(&published(["VIDEO", "ARTICLE"][i % 2], &sample_uuid(i), ms));
    }
    text.push_str(&published(
        "ARTICLE",
        "no-counter",
        (today() - 300) * 86_400_000 + seed,
    ));
    text
}

/// How many publication times [`sample`] of `n` counters holds.
fn sample_published(n: usize) -> usize {
    n.div_ceil(7) + 1
}

/// The uuid of counter `i` of [`sample`].
fn sample_uuid(i: usize) -> String {
    match i % 5 {
        0 => format!("u_{i}"),
        1 => format!("ü{i}"),
        2 => format!("u%{i},x"),
        _ => format!("u{i:03}"),
    }
}

/// What milestones answer of `store`: the first-days lists of both
/// entities' views (the set publication times, else the first touches).
async fn milestones(store: &dyn Store) -> Vec<counter_gateway::store::FirstDaysList> {
    let mut out = Vec::new();
    for entity in ["ARTICLE", "VIDEO"] {
        for days in [1, 7, 60] {
            let q = counter_gateway::store::FirstDaysQuery {
                entity: entity.into(),
                action: "VIEW".into(),
                days,
                category: None,
                size: 1000,
                oldest_day: rules().oldest_day(),
            };
            out.push(store.top_first_days(&q).await.unwrap());
        }
    }
    out
}

async fn export_text(store: &dyn Store) -> String {
    let mut out = Vec::new();
    export::write_all(
        store,
        &mut out,
        rules().oldest_day(),
        rules().oldest_hour_day(),
        &indicatif::ProgressBar::hidden(),
    )
    .await
    .unwrap();
    String::from_utf8(out).unwrap()
}

async fn import_text(store: &dyn Store, text: &str) -> import::Imported {
    let options = import::Options {
        batch_records: 64,
        ..import::Options::default()
    };
    import::read_all(
        store,
        text.as_bytes(),
        &rules(),
        &options,
        &indicatif::ProgressBar::hidden(),
    )
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a real search engine: the gate starts one (scripts/opensearch.sh), or set ELASTICSEARCH_URL"]
async fn export_import_export_on_elasticsearch_gives_the_embedded_stores_file() {
    let url = cluster().await;
    let (p1, p2) = (prefix(), prefix());
    let dir = tempfile::tempdir().unwrap();
    let embedded = sqlite(dir.path());
    import_text(&embedded, &sample(150, 1)).await;
    let file = export_text(&embedded).await;
    assert_eq!(
        file.lines().count(),
        1 + 150 + 37 + 5 + sample_published(150)
    );

    let es = es_store(&url, &p1, "default").await;
    let done = import_text(&es, &file).await;
    assert_eq!(
        (done.counters, done.averages, done.published as usize),
        (155, 37, sample_published(150))
    );
    assert_eq!(
        export_text(&es).await,
        file,
        "Elasticsearch exports what the embedded store exported"
    );
    // Twice: the same state.
    import_text(&es, &file).await;
    assert_eq!(export_text(&es).await, file);
    // Milestones answer alike (the export refreshed the indices), from the
    // set publication times (the first touches, 500 days ago, have no
    // bucket left in their windows).
    let lists = milestones(&embedded).await;
    assert!(
        lists.iter().all(|l| !l.entries.is_empty())
            && lists
                .iter()
                .flat_map(|l| &l.entries)
                .all(|e| e.published_set),
        "{lists:?}"
    );
    assert_eq!(milestones(&es).await, lists);
    // The answers agree too.
    let key = CounterKey::new("ARTICLE", "VIEW", "ü1").unwrap();
    assert_eq!(
        es.get(&key).await.unwrap(),
        embedded.get(&key).await.unwrap()
    );

    // Export from Elasticsearch, import into an empty cluster prefix, export again.
    let copy = es_store(&url, &p2, "other").await;
    import_text(&copy, &export_text(&es).await).await;
    assert_eq!(export_text(&copy).await, file);

    // A corrected day (a day record) moves the counter by the difference on
    // both stores alike, the other days staying.
    let fix = format!(
        "{}{}\n",
        format::header_line(),
        json!({"kind": "day", "entity": "ARTICLE", "action": "VIEW", "uuid": "ü1",
               "day": format_day(today() - 2), "value": 1000})
    );
    import_text(&es, &fix).await;
    import_text(&embedded, &fix).await;
    let (a, b) = (export_text(&es).await, export_text(&embedded).await);
    assert_eq!(a, b);
    assert_ne!(a, file);
    cleanup(&url, &p1).await;
    cleanup(&url, &p2).await;
}

fn migrate_args(data: &Path, url: &str, prefix: &str) -> StoreArgs {
    let cli = Cli::try_parse_from([
        "counter-gateway",
        "migrate",
        "--data-dir",
        data.to_str().unwrap(),
        "--elasticsearch-url",
        url,
        "--index-prefix",
        prefix,
    ])
    .unwrap();
    match cli.command {
        Command::Migrate(a) => a.store,
        _ => unreachable!(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a real search engine: the gate starts one (scripts/opensearch.sh), or set ELASTICSEARCH_URL"]
async fn migrate_copies_every_tenant_and_verifies_and_reports_an_altered_counter() {
    let url = cluster().await;
    let p = prefix();
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let files = [("default", sample(120, 2)), ("acme", sample(40, 3))];
    for (tenant, text) in &files {
        let store = sqlite(&counter_gateway::transfer::embedded_dir(&data, tenant));
        import_text(&store, text).await;
    }
    // Live increments too, as a gateway leaves them.
    {
        let store = sqlite(&data);
        let inc = counter_gateway::domain::Increment {
            key: CounterKey::new("VIDEO", "VIEW", "u_0").unwrap(),
            delta: 5,
            category: None,
            ts_ms: common::test_now().timestamp_millis(),
            day: today(),
            id: None,
            unique: None,
            kind: counter_gateway::domain::Kind::Counter,
        };
        store
            .apply(counter_gateway::store::WriteBatch {
                requests: vec![vec![inc]],
                wanted: Default::default(),
            })
            .await
            .unwrap();
    }
    assert_eq!(
        migrate::tenants(&data).unwrap(),
        vec!["default".to_string(), "acme".to_string()]
    );
    let args = migrate_args(&data, &url, &p);
    migrate::run(&args, clock())
        .await
        .expect("migrate and verify");
    for (tenant, _) in &files {
        let from = sqlite(&counter_gateway::transfer::embedded_dir(&data, tenant));
        let to = es_store(&url, &p, tenant).await;
        let (a, b) = (export_text(&from).await, export_text(&to).await);
        assert!(a.lines().count() > 10);
        assert_eq!(
            a, b,
            "tenant {tenant}: the cluster exports what the embedded store does"
        );
        assert_eq!(
            migrate::verify(&from, &to, &rules()).await.unwrap().count,
            0
        );
    }

    // Alter a counter and a bucket in the cluster behind the gateway's back.
    let from = sqlite(&data);
    let to = es_store(&url, &p, "default").await;
    let http = reqwest::Client::new();
    let names = EsConfig::new(&url, &p, "default").unwrap().names;
    let altered = CounterKey::new("ARTICLE", "VIEW", "ü1").unwrap();
    let r = http
        .post(format!(
            "{url}/{}/_update/{}?refresh=true",
            names.counters(),
            counter_gateway::store::elasticsearch::request::encode_path_segment(&altered.doc_id())
        ))
        .json(&json!({"doc": {"value": 12345}}))
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{}", r.text().await.unwrap());
    let v = migrate::verify(&from, &to, &rules()).await.unwrap();
    assert_eq!(v.count, 1, "{:?}", v.differences);
    assert!(
        v.differences[0].contains("counter ARTICLE/VIEW/ü1: value")
            && v.differences[0].contains("12345"),
        "{:?}",
        v.differences
    );

    // A day bucket the embedded store does not have: migrate again keeps
    // it (import merges), so the totals differ and migrate fails, naming it.
    let extra_day = today() - 61;
    let cid = altered.doc_id();
    let r = http
        .put(format!(
            "{url}/{}/_doc/{}?routing={}&refresh=true",
            names.buckets(extra_day),
            counter_gateway::store::elasticsearch::request::encode_path_segment(
                &counter_gateway::store::elasticsearch::request::bucket_doc_id(&cid, extra_day)
            ),
            counter_gateway::store::elasticsearch::request::encode_path_segment(&cid)
        ))
        .json(
            &json!({"counter_id": cid, "entity": "ARTICLE", "action": "VIEW", "uuid": "ü1",
                      "day": extra_day * 86_400_000, "value": 7}),
        )
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{}", r.text().await.unwrap());
    // One open store per file in a process: migrate opens its own.
    drop(from);
    let e = migrate::run(&args, clock()).await.unwrap_err();
    assert!(e.contains("verification found"), "{e}");
    let from = sqlite(&data);
    let v = migrate::verify(&from, &to, &rules()).await.unwrap();
    assert!(v.count >= 2, "{:?}", v.differences);
    assert!(
        v.differences.iter().all(|d| d.contains("ARTICLE/VIEW/ü1")),
        "{:?}",
        v.differences
    );
    assert!(
        v.differences
            .iter()
            .any(|d| d.contains(&format_day(extra_day))),
        "{:?}",
        v.differences
    );

    // A publication time moved in the cluster is named.
    let at = common::test_now().timestamp_millis() - 1_000;
    to.set_published(vec![counter_gateway::store::PublishedSet {
        entity: "VIDEO".into(),
        uuid: "u_0".into(),
        at_ms: Some(at),
        replace: true,
    }])
    .await
    .unwrap();
    let v = migrate::verify(&from, &to, &rules()).await.unwrap();
    let moved: Vec<&String> = v
        .differences
        .iter()
        .filter(|d| d.contains("publication time of VIDEO/u_0"))
        .collect();
    assert_eq!(moved.len(), 1, "{:?}", v.differences);
    assert!(
        moved[0].contains(&counter_gateway::domain::format_ms(at)),
        "{moved:?}"
    );
    cleanup(&url, &p).await;
}

async fn export_marked(
    store: &dyn Store,
    fingerprint: Option<String>,
    rules: format::Rules,
) -> String {
    let mut out = Vec::new();
    let what = export::Export {
        from_day: rules.oldest_day(),
        hours_from_day: rules.oldest_hour_day(),
        marks: true,
        fingerprint,
        tenant: "default".into(),
    };
    export::write(store, &mut out, &what, &indicatif::ProgressBar::hidden())
        .await
        .unwrap();
    String::from_utf8(out).unwrap()
}

/// An import into `store` that checks and records the secret as `import`
/// does on a cluster.
async fn import_into_cluster(
    store: &Arc<ElasticsearchStore>,
    text: &str,
) -> Result<import::Imported, String> {
    let options = import::Options {
        batch_records: 64,
        secret: counter_gateway::transfer::secret::SecretCheck::Cluster {
            store: store.clone(),
            given: None,
            key: None,
        },
        ..import::Options::default()
    };
    import::read_all(
        &**store,
        text.as_bytes(),
        &rules(),
        &options,
        &indicatif::ProgressBar::hidden(),
    )
    .await
}

/// Marks on the real node: what the embedded store exported, imported into
/// Elasticsearch, exports as the same file (both list marks in one order),
/// also when imported twice and copied to another prefix (another tenant
/// refuses marks keyed for this one); the secret's
/// fingerprint is recorded, and a file of another secret is refused; a
/// like being taken back (`retracting`) survives a round trip; a view past
/// the retention is not exported.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a real search engine: the gate starts one (scripts/opensearch.sh), or set ELASTICSEARCH_URL"]
async fn marks_round_trip_on_elasticsearch_as_on_the_embedded_store() {
    let url = cluster().await;
    let (p1, p2) = (prefix(), prefix());
    let app = common::TestApp::start_with(common::backdating()).await;
    common::liked_and_viewed(&app).await;
    let (_, fp) = common::actor_secret_of(app.data_dir());
    let file = export_marked(&*app.state.store, Some(fp.clone()), rules()).await;
    assert_eq!(
        file.lines()
            .filter(|l| l.contains(r#""kind":"mark""#))
            .count(),
        7
    );

    let es = Arc::new(es_store(&url, &p1, "default").await);
    assert_eq!(es.recorded_fingerprint().await.unwrap(), None);
    let done = import_into_cluster(&es, &file).await.unwrap();
    assert_eq!(done.marks, 7);
    assert_eq!(es.recorded_fingerprint().await.unwrap(), Some(fp.clone()));
    assert_eq!(
        export_marked(&*es, Some(fp.clone()), rules()).await,
        file,
        "Elasticsearch exports the embedded store's marks, in the same order"
    );
    // Twice: the same state.
    import_into_cluster(&es, &file).await.unwrap();
    assert_eq!(export_marked(&*es, Some(fp.clone()), rules()).await, file);
    // To another prefix, through a file of Elasticsearch's; not to another
    // tenant, whose marks are keyed for it (they would never match there).
    let elsewhere = es_store(&url, &p2, "other").await;
    let e = import_into_cluster(
        &Arc::new(elsewhere),
        &export_marked(&*es, Some(fp.clone()), rules()).await,
    )
    .await
    .unwrap_err();
    assert!(e.contains("keyed for tenant default"), "{e}");
    let copy = Arc::new(es_store(&url, &p2, "default").await);
    import_into_cluster(&copy, &export_marked(&*es, Some(fp.clone()), rules()).await)
        .await
        .unwrap();
    assert_eq!(export_marked(&*copy, Some(fp.clone()), rules()).await, file);

    // Two days later the view of 399 days ago is past the retention.
    let later = format::Rules {
        now: common::test_now() + chrono::Duration::days(2),
        policy: TimePolicy::default(),
    };
    let old_mark = format!(r#""scope":"day","day":"{}""#, format_day(today() - 399));
    assert!(file.contains(&old_mark));
    assert!(!export_marked(&*es, Some(fp.clone()), later)
        .await
        .contains(&old_mark));

    // Marks of another secret are refused at their fingerprint, nothing set.
    let other = counter_gateway::domain::ActorKey::new(b"some other store's secret").unwrap();
    let key = CounterKey::new("ARTICLE", "like", "z9").unwrap();
    let foreign = format!(
        "{}{}{}",
        format::header_line(),
        format::actor_secret_line(&other.fingerprint().unwrap(), Some("default")),
        format::mark_line(&counter_gateway::store::ActorMark {
            key: key.clone(),
            mark: other.mark(&key, "zoe").unwrap(),
            day: None,
            state: counter_gateway::store::MarkState::Counted,
        })
    );
    let e = import_into_cluster(&es, &foreign).await.unwrap_err();
    assert!(e.starts_with("line 2: ") && e.contains(&fp), "{e}");
    assert_eq!(export_marked(&*es, Some(fp.clone()), rules()).await, file);

    // A like being taken back keeps its state and since on Elasticsearch,
    // and is a like on the embedded store (which has no such state).
    let since = common::test_now() - chrono::Duration::hours(1);
    let retracting = counter_gateway::store::ActorMark {
        key: key.clone(),
        mark: counter_gateway::domain::Mark([9; 16]),
        day: None,
        state: counter_gateway::store::MarkState::Retracting {
            since_ms: since.timestamp_millis(),
        },
    };
    let line = format::mark_line(&retracting);
    assert!(line.contains(r#""state":"retracting","since":""#), "{line}");
    let text = format!(
        "{}{}{line}",
        format::header_line(),
        format::actor_secret_line(&fp, Some("default"))
    );
    import_into_cluster(&copy, &text).await.unwrap();
    let again = export_marked(&*copy, Some(fp.clone()), rules()).await;
    assert!(again.contains(&line), "{again}");
    let dir = tempfile::tempdir().unwrap();
    let embedded = sqlite(dir.path());
    import_text(&embedded, &again).await;
    let marks = embedded.mark_page(None, 100, 0).await.unwrap();
    let held = marks.iter().find(|m| m.key == key).unwrap();
    assert_eq!(held.state, counter_gateway::store::MarkState::Counted);
    app.stop().await;
    cleanup(&url, &p1).await;
    cleanup(&url, &p2).await;
}

/// Mark documents an earlier version made lack `counter_hash` and `mark`
/// (the fields export sorts by): setup adds them to the mapping, and the
/// first export page fills them in from the document's id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a real search engine: the gate starts one (scripts/opensearch.sh), or set ELASTICSEARCH_URL"]
async fn marks_an_earlier_version_wrote_are_exported() {
    let url = cluster().await;
    let p = prefix();
    let es = Arc::new(es_store(&url, &p, "default").await);
    let names = EsConfig::new(&url, &p, "default").unwrap().names;
    let http = reqwest::Client::new();
    // Indices as version 1 of the templates made them: no mark fields.
    for index in [names.actor_marks(), names.actor_day_marks(today())] {
        let r = http
            .put(format!("{url}/{index}"))
            .json(&json!({"mappings": {"dynamic": "strict", "properties": {
                "counter_id": {"type": "keyword"}, "scope": {"type": "keyword"},
                "day": {"type": "date"}, "state": {"type": "keyword"}, "since": {"type": "date"},
                "token": {"type": "keyword"}, "outcome": {"type": "keyword"},
                "event_ids": {"type": "object", "enabled": false}}}}))
            .send()
            .await
            .unwrap();
        assert!(r.status().is_success(), "{}", r.text().await.unwrap());
    }
    let secret = counter_gateway::domain::ActorKey::new(b"a secret of sixteen+").unwrap();
    let key = CounterKey::new("ARTICLE", "like", "a_1").unwrap();
    let cid = key.doc_id();
    let enc = counter_gateway::store::elasticsearch::request::encode_path_segment;
    let like = secret.mark(&key, "alice").unwrap();
    let view = secret.mark(&key, "bob").unwrap();
    for (index, id, doc) in [
        (
            names.actor_marks(),
            counter_gateway::store::elasticsearch::request::mark_doc_id(&cid, &like.hex(), None),
            json!({"counter_id": cid, "scope": "ever", "state": "counted", "since": 1}),
        ),
        (
            names.actor_day_marks(today()),
            counter_gateway::store::elasticsearch::request::mark_doc_id(
                &cid,
                &view.hex(),
                Some(today()),
            ),
            json!({"counter_id": cid, "scope": "day", "day": today() * 86_400_000, "state": "counted", "since": 1}),
        ),
    ] {
        let r = http
            .put(format!(
                "{url}/{index}/_doc/{}?routing={}&refresh=true",
                enc(&id),
                enc(&cid)
            ))
            .json(&doc)
            .send()
            .await
            .unwrap();
        assert!(r.status().is_success(), "{}", r.text().await.unwrap());
    }
    // Setup (as a gateway of this version starts) adds the fields.
    es.setup().await.unwrap();
    let mapping: Value = http
        .get(format!("{url}/{}/_mapping", names.actor_marks()))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(mapping.to_string().contains("counter_hash"), "{mapping}");
    let marks = es.mark_page(None, 10, rules().oldest_day()).await.unwrap();
    assert_eq!(marks.len(), 2, "{marks:?}");
    assert_eq!((marks[0].mark, marks[0].day), (like, None));
    assert_eq!((marks[1].mark, marks[1].day), (view, Some(today())));
    assert!(marks.iter().all(|m| m.key == key));
    cleanup(&url, &p).await;
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The gateway binary on the cluster: `serve` with `secret` in its
/// environment (as `migrate` said to set it), on a port of its own.
fn gateway(url: &str, prefix: &str, secret: &str, port: u16) -> std::process::Child {
    std::process::Command::new(env!("CARGO_BIN_EXE_counter-gateway"))
        .args([
            "serve",
            "--elasticsearch-url",
            url,
            "--index-prefix",
            prefix,
            "--listen",
            &format!("127.0.0.1:{port}"),
        ])
        .env("COUNTER_GATEWAY_ACTOR_SECRET", secret)
        .env_remove("COUNTER_GATEWAY_API_KEYS")
        .env_remove("COUNTER_GATEWAY_API_KEYS_FILE")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run the gateway")
}

/// Kills the gateway this test started when it goes out of scope.
struct Running(std::process::Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `migrate` copies the marks too, records the secret's fingerprint and
/// says what the cluster's gateways must be started with; a gateway started
/// so counts neither a repeat like nor a repeat view (over HTTP), and one
/// with another secret refuses to start, naming both fingerprints. A mark
/// missing in the cluster is reported by the verification, and a cluster
/// recorded under another secret is refused before anything is copied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a real search engine: the gate starts one (scripts/opensearch.sh), or set ELASTICSEARCH_URL"]
async fn migrate_carries_marks_and_a_gateway_with_the_secret_it_names_counts_no_actor_twice() {
    let url = cluster().await;
    let p = prefix();
    let app = common::TestApp::start_with(common::backdating()).await;
    common::liked_and_viewed(&app).await;
    let (dir, _) = app.stop().await;
    let data = dir.path();
    let (secret, fp) = common::actor_secret_of(data);

    let args = migrate_args(data, &url, &p);
    let done = migrate::run(&args, clock())
        .await
        .expect("migrate and verify");
    assert_eq!(done.marks, 7);
    let said = done.gateways_need.expect("what the gateways need");
    assert!(said.contains(&fp) && !said.contains(&secret), "{said}");
    // COUNTER_GATEWAY_ACTOR_SECRET="$(cat '<path>')": the file it names.
    let path = said
        .split("$(cat '")
        .nth(1)
        .and_then(|rest| rest.split("')").next())
        .unwrap_or_else(|| panic!("no file named in {said}"));
    let told = std::fs::read_to_string(path).unwrap();
    assert_eq!(told.trim(), secret);

    let from = sqlite(data);
    let to = es_store(&url, &p, "default").await;
    assert_eq!(to.recorded_fingerprint().await.unwrap(), Some(fp.clone()));
    assert_eq!(
        export_marked(&to, Some(fp.clone()), rules()).await,
        export_marked(&from, Some(fp.clone()), rules()).await
    );

    // A gateway with another secret refuses to start.
    let mut wrong = gateway(&url, &p, "not the secret migrate named", free_port());
    let mut status = None;
    for _ in 0..1200 {
        status = wrong.try_wait().unwrap();
        if status.is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    if status.is_none() {
        let _ = wrong.kill();
        let _ = wrong.wait();
        panic!("a gateway with another secret started");
    }
    let out = wrong.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains(&fp) && stderr.contains("count once more"),
        "{stderr}"
    );

    // One with the secret as migrate said: a repeat like and a repeat view
    // are not counted, a new actor is.
    let port = free_port();
    let _running = Running(gateway(&url, &p, told.trim(), port));
    let http = reqwest::Client::new();
    let base = format!("http://127.0.0.1:{port}");
    let mut up = false;
    for _ in 0..1200 {
        if let Ok(r) = http.get(format!("{base}/healthz")).send().await {
            if r.status().is_success() {
                up = true;
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(up, "the gateway did not start");
    let like = |who: &str| json!({"actor": who, "unique": "ever"});
    let post = |path: String, body: Value| {
        let http = http.clone();
        async move {
            let r = http.post(path).json(&body).send().await.unwrap();
            let status = r.status().as_u16();
            (status, r.json::<Value>().await.unwrap_or(Value::Null))
        }
    };
    let (s, b) = post(
        format!("{base}/v1/counters/ARTICLE/like/a1/increment"),
        like("alice@example.org"),
    )
    .await;
    assert_eq!(
        (s, &b["counted"], &b["value"]),
        (200, &json!(false), &json!(2)),
        "{b}"
    );
    let (s, b) = post(
        format!("{base}/v1/counters/ARTICLE/like/a1/increment"),
        like("erin"),
    )
    .await;
    assert_eq!(
        (s, &b["counted"], &b["value"]),
        (200, &json!(true), &json!(3)),
        "{b}"
    );
    let (s, b) = post(
        format!("{base}/v1/counters/ARTICLE/like/a1/increment"),
        like("erin"),
    )
    .await;
    assert_eq!((s, &b["counted"]), (200, &json!(false)), "{b}");
    drop(_running);
    // The gateway's own mark carries the fields export lists it by.
    let names = EsConfig::new(&url, &p, "default").unwrap().names;
    let _ = http
        .post(format!("{url}/{}/_refresh", names.actor_marks()))
        .send()
        .await;
    let lacking: Value = http
        .post(format!("{url}/{}/_count", names.actor_marks()))
        .json(&json!({"query": {"bool": {"must_not": [{"exists": {"field": "mark"}}]}}}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(lacking["count"], 0, "{lacking}");
    let likes = export_marked(&to, Some(fp.clone()), rules()).await;
    assert_eq!(
        likes
            .lines()
            .filter(|l| l.contains(r#""scope":"ever""#))
            .count(),
        4,
        "alice, bob and dave's likes, and erin's: {likes}"
    );

    // A mark deleted in the cluster behind the gateways' back is reported.
    let r = http
        .post(format!(
            "{url}/{}/_delete_by_query?refresh=true",
            names.actor_marks()
        ))
        .json(&json!({"query": {"term": {"counter_id": "ARTICLE_like_a2"}}}))
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{}", r.text().await.unwrap());
    let v = migrate::verify(&from, &to, &rules()).await.unwrap();
    assert!(
        v.differences
            .iter()
            .any(|d| d.contains("of ARTICLE/like/a2 (ever): missing in the cluster")),
        "{:?}",
        v.differences
    );

    // A cluster whose marks are recorded under another secret: refused,
    // nothing copied.
    let q = prefix();
    let other = es_store(&url, &q, "default").await;
    other.record_fingerprint("0123456789abcdef").await.unwrap();
    // One open store per file in a process: migrate opens its own.
    drop(from);
    let e = migrate::run(&migrate_args(data, &url, &q), clock())
        .await
        .unwrap_err();
    assert!(
        e.contains("0123456789abcdef") && e.contains("nothing was copied"),
        "{e}"
    );
    assert!(other.counter_page(None, 10, 0, 0).await.unwrap().is_empty());
    cleanup(&url, &p).await;
    cleanup(&url, &q).await;
}

/// CountAPI's records (keys made by `create`, with their namespaces' admin
/// key digests): imported into a cluster, exported from it as the embedded
/// store exports them, read there as `create` reads them; importing again
/// changes nothing, and `migrate`'s verification names a namespace whose
/// admin key differs in the cluster.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a real search engine: the gate starts one (scripts/opensearch.sh), or set ELASTICSEARCH_URL"]
async fn countapi_records_move_to_the_cluster_and_verify_names_a_changed_admin_key() {
    use counter_gateway::domain::countapi::{CreatedKey, KeyRecord, KeyRules, Namespace, Restored};
    let url = cluster().await;
    let p = prefix();
    let dir = tempfile::tempdir().unwrap();
    let from = sqlite(dir.path());
    let now = common::test_now().timestamp_millis();
    let record = |ns: &str, key: String, digest: u8, lower: i64| KeyRecord {
        namespace: Namespace {
            name: ns.into(),
            admin_key_sha256: [digest; 32],
            created_ms: now - 86_400_000,
        },
        key,
        created: CreatedKey {
            rules: KeyRules::new(lower == 0, lower, 3).unwrap(),
            created_ms: now - i64::from(digest),
        },
    };
    // Three namespaces, 150 keys: import batches of 64 span namespaces.
    let records: Vec<KeyRecord> = (0..150)
        .map(|i| {
            let (ns, d) = [("a.site", 1), ("b-site", 2), ("c_site", 3)][i % 3];
            record(ns, format!("key{i:03}"), d, -(i as i64 % 4))
        })
        .collect();
    assert_eq!(
        from.countapi_restore(records.clone()).await.unwrap(),
        Restored::Applied
    );
    let file = export_text(&from).await;
    assert_eq!(
        file.lines()
            .filter(|l| l.contains("\"kind\":\"countapi\""))
            .count(),
        150
    );
    let to = es_store(&url, &p, "default").await;
    assert_eq!(import_text(&to, &file).await.countapi, 150);
    assert_eq!(
        export_text(&to).await,
        file,
        "the cluster exports what the embedded store does"
    );
    import_text(&to, &file).await;
    assert_eq!(export_text(&to).await, file);
    for r in [&records[0], &records[77], &records[149]] {
        let read = to
            .countapi_records(&r.namespace.name, &r.key)
            .await
            .unwrap();
        assert_eq!(read.namespace.as_ref(), Some(&r.namespace));
        assert_eq!(read.key, Some(r.created));
    }
    assert_eq!(
        migrate::verify(&from, &to, &rules()).await.unwrap().count,
        0
    );
    // Another admin key for b-site, set in the cluster behind the store's back.
    let changed = record("b-site", "key001".into(), 9, -1);
    let changed = KeyRecord {
        created: records[1].created,
        ..changed
    };
    assert_eq!(
        to.countapi_restore(vec![changed]).await.unwrap(),
        Restored::Applied
    );
    let v = migrate::verify(&from, &to, &rules()).await.unwrap();
    // Each of the namespace's 50 keys is named: `set` on any of them now
    // takes another admin key.
    assert_eq!(v.count, 50, "{:?}", v.differences);
    assert!(
        v.differences
            .iter()
            .all(|d| d.starts_with("CountAPI key b-site/") && d.contains("admin key differs")),
        "{:?}",
        v.differences
    );
    cleanup(&url, &p).await;
}

/// A day an import sets has no hours behind it: hour answers over it say
/// `exact: false` on Elasticsearch, as over a backfilled day, while a day
/// the import does not name stays exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a real search engine: the gate starts one (scripts/opensearch.sh), or set ELASTICSEARCH_URL"]
async fn hours_over_an_imported_day_are_not_exact() {
    use counter_gateway::domain::HourRange;
    let url = cluster().await;
    let p = prefix();
    let to = es_store(&url, &p, "default").await;
    let key = CounterKey::new("ARTICLE", "VIEW", "h1").unwrap();
    let hours_of = |day: i64| HourRange {
        from_hour: day * 24,
        to_hour: day * 24 + 23,
    };
    // An increment today and yesterday: exact hours.
    for day in [today() - 1, today()] {
        let inc = counter_gateway::domain::Increment {
            key: key.clone(),
            delta: 2,
            category: None,
            ts_ms: day * 86_400_000 + 3_600_000,
            day,
            id: None,
            unique: None,
            kind: counter_gateway::domain::Kind::Counter,
        };
        to.apply(counter_gateway::store::WriteBatch {
            requests: vec![vec![inc]],
            wanted: Default::default(),
        })
        .await
        .unwrap();
    }
    let h = to
        .hour_histogram(&key, hours_of(today()))
        .await
        .unwrap()
        .unwrap();
    assert!(h.exact, "{h:?}");
    // The file sets yesterday only.
    let file = format!(
        "{}{}\n",
        format::header_line(),
        json!({"kind": "counter", "entity": "ARTICLE", "action": "VIEW", "uuid": "h1",
               "before": 0, "days": {format_day(today() - 1): 10}})
    );
    import_text(&to, &file).await;
    let h = to
        .hour_histogram(&key, hours_of(today() - 1))
        .await
        .unwrap()
        .unwrap();
    assert!(!h.exact, "an imported day: {h:?}");
    let h = to
        .hour_histogram(&key, hours_of(today()))
        .await
        .unwrap()
        .unwrap();
    assert!(h.exact, "a day the file does not name: {h:?}");
    cleanup(&url, &p).await;
}

/// Hours move to the cluster with their counters (format 5): an embedded
/// store with increments at several hours of the last days, a day whose
/// hours do not sum to it (a rest, as a backfill leaves) and a day set
/// again by a second import, exported and imported into Elasticsearch,
/// answers the same hour histograms there, `exact` included; the cluster
/// exports the same file; `migrate`'s verification compares the hours and
/// names an hour changed in the cluster.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a real search engine: the gate starts one (scripts/opensearch.sh), or set ELASTICSEARCH_URL"]
async fn hours_move_to_the_cluster_and_answer_as_on_the_embedded_store() {
    use counter_gateway::domain::HourRange;
    let url = cluster().await;
    let p = prefix();
    let to = es_store(&url, &p, "default").await;
    let dir = tempfile::tempdir().unwrap();
    let from = sqlite(dir.path());
    let d = |n: i64| format_day(today() - n);
    let h = |n: i64, hh: u32| format!("{}T{hh:02}", d(n));
    // h1: hours summing to each day; h2: a day with a rest of 5 (its hours
    // hold 7 of 12); h3: a day before the hourly retention (no hours) and
    // one inside it.
    let file = format!(
        "{}{}\n{}\n{}\n",
        format::header_line(),
        json!({"kind": "counter", "entity": "ARTICLE", "action": "VIEW", "uuid": "h1", "value": 21,
               "days": {d(2): 6, d(1): 15}, "hours": {h(2, 0): 1, h(2, 23): 5, h(1, 7): 15}}),
        json!({"kind": "counter", "entity": "ARTICLE", "action": "VIEW", "uuid": "h2", "value": 12,
               "category": "news", "days": {d(1): 12}, "hours": {h(1, 3): 3, h(1, 4): 4}}),
        json!({"kind": "counter", "entity": "VIDEO", "action": "VIEW", "uuid": "h3", "value": 9,
               "days": {d(30): 4, d(0): 5}, "hours": {h(0, 0): 5}}),
    );
    import_text(&from, &file).await;
    // Increments at two hours of yesterday on the embedded store (hours of
    // today could lie after the test's now, which import refuses as a
    // recorded_timestamp in the future: the gate once ran this at 00:25).
    let key1 = CounterKey::new("ARTICLE", "VIEW", "h1").unwrap();
    for (hour, delta) in [(1, 2), (2, 3)] {
        let inc = counter_gateway::domain::Increment {
            key: key1.clone(),
            delta,
            category: None,
            ts_ms: (today() - 1) * 86_400_000 + hour * 3_600_000,
            day: today() - 1,
            id: None,
            unique: None,
            kind: counter_gateway::domain::Kind::Counter,
        };
        from.apply(counter_gateway::store::WriteBatch {
            requests: vec![vec![inc]],
            wanted: Default::default(),
        })
        .await
        .unwrap();
    }
    let exported = export_text(&from).await;
    let all: Vec<Value> = exported
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(
        all[1]["hours"],
        json!({h(2, 0): 1, h(2, 23): 5, h(1, 1): 2, h(1, 2): 3, h(1, 7): 15}),
        "{exported}"
    );
    let done = import_text(&to, &exported).await;
    assert_eq!(done.hours, 8);
    assert_eq!(export_text(&to).await, exported);
    let range = HourRange {
        from_hour: (today() - 3) * 24,
        to_hour: today() * 24 + 23,
    };
    for (entity, uuid, exact) in [
        ("ARTICLE", "h1", true),
        ("ARTICLE", "h2", false),
        ("VIDEO", "h3", true),
    ] {
        let key = CounterKey::new(entity, "VIEW", uuid).unwrap();
        let a = from.hour_histogram(&key, range).await.unwrap().unwrap();
        let b = to.hour_histogram(&key, range).await.unwrap().unwrap();
        assert_eq!(a, b, "{uuid}");
        assert_eq!(a.exact, exact, "{uuid}: {a:?}");
    }
    // The same file as version 4 wrote it (no hours), into another
    // tenant: the days move, their hours are unknown and say so; the
    // version 5 file over it makes them exact.
    let mut v4 = format!(
        "{}\n",
        json!({"kind": "header", "format": "counter-gateway", "version": 4})
    );
    for mut r in all.iter().skip(1).cloned() {
        if let Some(o) = r.as_object_mut() {
            o.remove("hours");
        }
        v4.push_str(&format!("{r}\n"));
    }
    let old = es_store(&url, &p, "old").await;
    assert_eq!(import_text(&old, &v4).await.hours, 0);
    let h1 = old.hour_histogram(&key1, range).await.unwrap().unwrap();
    assert!(!h1.exact && h1.buckets.is_empty(), "{h1:?}");
    import_text(&old, &exported).await;
    assert_eq!(export_text(&old).await, exported);
    let h1 = old.hour_histogram(&key1, range).await.unwrap().unwrap();
    assert_eq!(
        h1,
        from.hour_histogram(&key1, range).await.unwrap().unwrap()
    );
    assert!(h1.exact, "{h1:?}");

    // Importing twice changes nothing; a file that gives a day other hours
    // replaces them (the old hour goes) on both stores alike.
    import_text(&to, &exported).await;
    assert_eq!(export_text(&to).await, exported);
    let moved = format!(
        "{}{}\n",
        format::header_line(),
        json!({"kind": "counter", "entity": "ARTICLE", "action": "VIEW", "uuid": "h1", "value": 26,
               "days": {d(2): 6, d(1): 15, d(0): 5}, "hours": {h(2, 0): 6, h(1, 7): 15, h(0, 9): 5}}),
    );
    import_text(&from, &moved).await;
    import_text(&to, &moved).await;
    let again = export_text(&from).await;
    assert!(
        again.contains(&format!(
            r#""hours":{{"{}":6,"{}":15,"{}":5}}"#,
            h(2, 0),
            h(1, 7),
            h(0, 9)
        )),
        "{again}"
    );
    assert_eq!(export_text(&to).await, again);
    let v = migrate::verify(&from, &to, &rules()).await.unwrap();
    assert_eq!(v.count, 0, "{:?}", v.differences);

    // An hour changed in the cluster is named.
    let names = EsConfig::new(&url, &p, "default").unwrap().names;
    let hour = (today() - 1) * 24 + 7;
    let r = reqwest::Client::new()
        .post(format!(
            "{url}/{}/_update/{}?routing={}&refresh=true",
            names.hours(hour),
            counter_gateway::store::elasticsearch::request::encode_path_segment(&format!(
                "{}@{}",
                key1.doc_id(),
                h(1, 7)
            )),
            counter_gateway::store::elasticsearch::request::encode_path_segment(&key1.doc_id()),
        ))
        .json(&json!({"doc": {"value": 14}}))
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{}", r.text().await.unwrap());
    let v = migrate::verify(&from, &to, &rules()).await.unwrap();
    assert_eq!(v.count, 1, "{:?}", v.differences);
    assert!(
        v.differences[0].contains("counter ARTICLE/VIEW/h1: 1 hour(s) differ")
            && v.differences[0].contains("15 in the embedded store, 14 in the cluster"),
        "{:?}",
        v.differences
    );
    cleanup(&url, &p).await;
}
