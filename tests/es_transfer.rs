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
/// part before the days), averages, and day records.
fn sample(n: usize, seed: i64) -> String {
    let mut text = format::header_line();
    for i in 0..n {
        let uuid = match i % 5 {
            0 => format!("u_{i}"),
            1 => format!("ü{i}"),
            2 => format!("u%{i},x"),
            _ => format!("u{i:03}"),
        };
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
    text
}

async fn export_text(store: &dyn Store) -> String {
    let mut out = Vec::new();
    export::write_all(
        store,
        &mut out,
        rules().oldest_day(),
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
    assert_eq!(file.lines().count(), 1 + 150 + 37 + 5);

    let es = es_store(&url, &p1, "default").await;
    let done = import_text(&es, &file).await;
    assert_eq!((done.counters, done.averages), (155, 37));
    assert_eq!(
        export_text(&es).await,
        file,
        "Elasticsearch exports what the embedded store exported"
    );
    // Twice: the same state.
    import_text(&es, &file).await;
    assert_eq!(export_text(&es).await, file);
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
            migrate::verify(&from, &to, rules().oldest_day())
                .await
                .unwrap()
                .count,
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
    let v = migrate::verify(&from, &to, rules().oldest_day())
        .await
        .unwrap();
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
    let e = migrate::run(&args, clock()).await.unwrap_err();
    assert!(e.contains("verification found"), "{e}");
    let v = migrate::verify(&from, &to, rules().oldest_day())
        .await
        .unwrap();
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
    cleanup(&url, &p).await;
}
