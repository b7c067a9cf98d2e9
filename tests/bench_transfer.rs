//! Benchmark (not a test): records imported per second on each store, and
//! exported per second, in one run so the figures compare.
//!
//! `cargo test --release --test bench_transfer -- --ignored --nocapture`
//! measures the embedded store; with `ELASTICSEARCH_URL` set (or under
//! `scripts/opensearch.sh run -- ...`) Elasticsearch too. `BENCH_RECORDS`
//! (default 20,000) counters of `BENCH_DAYS` (default 30) day buckets each,
//! with `BENCH_HOURS_PER_DAY` (default 0) hour buckets in each day of the
//! hourly retention;
//! then a file of `BENCH_MARKS` (default 100,000) marks of actors on those
//! counters, half likes and half views over the same days, in the same run.
//! Wall-clock time, and this process's CPU time from `/proc/self/stat` (the
//! engine's own CPU is not in it).

#[path = "common/mod.rs"]
mod common;

use std::time::{Duration, Instant};

use counter_gateway::domain::{day_of, Counter, CounterKey, ManualClock, Mark, TimePolicy};
use counter_gateway::store::elasticsearch::config::EsConfig;
use counter_gateway::store::elasticsearch::ElasticsearchStore;
use counter_gateway::store::sqlite::{Durability, SqliteStore};
use counter_gateway::store::{ActorMark, Bucket, CounterHistory, MarkState, Store};
use counter_gateway::transfer::{export, format, import};

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// This process's user + system CPU time.
fn cpu() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let after = stat.rsplit(')').next().unwrap_or("");
    let f: Vec<u64> = after
        .split_whitespace()
        .skip(11)
        .take(2)
        .filter_map(|x| x.parse().ok())
        .collect();
    // Clock ticks: 100 a second on Linux.
    Duration::from_millis(f.iter().sum::<u64>() * 10)
}

fn rules() -> format::Rules {
    format::Rules {
        now: common::test_now(),
        policy: TimePolicy::default(),
    }
}

fn file(records: usize, days: usize) -> String {
    let today = day_of(common::test_now());
    // Hours of each day of the hourly retention (14 days): the day's value
    // spread over its first `BENCH_HOURS_PER_DAY` hours (default 0: none).
    let per_day = env("BENCH_HOURS_PER_DAY", 0).min(24);
    let mut text = format::header_line();
    for i in 0..records {
        let days: Vec<Bucket> = (0..days)
            .map(|n| Bucket {
                day: today - n as i64,
                value: (i + n) as i64 % 97,
            })
            .collect();
        let mut hours: Vec<counter_gateway::store::HourBucket> = days
            .iter()
            .filter(|b| b.day >= rules().oldest_hour_day() && per_day > 0)
            .flat_map(|b| {
                (0..per_day as i64).map(move |h| counter_gateway::store::HourBucket {
                    hour: b.day * 24 + h,
                    value: b.value / per_day as i64
                        + i64::from(h == 0) * (b.value % per_day as i64),
                })
            })
            .collect();
        hours.sort_by_key(|h| h.hour);
        text.push_str(&format::counter_line(&CounterHistory {
            counter: Counter {
                key: CounterKey::new("ARTICLE", "VIEW", &format!("article-{i:07}")).unwrap(),
                value: days.iter().map(|b| b.value).sum(),
                category: Some("news".into()),
                first_ms: (today - 40) * 86_400_000,
                recorded_ms: today * 86_400_000,
            },
            days,
            hours,
        }));
    }
    text
}

/// `marks` marks of actors on the counters of [`file`]: even ones likes,
/// odd ones views of one of its `days` days. Marks are pseudo-random 128-bit
/// values, as keyed hashes are.
fn marks_file(marks: usize, records: usize, days: usize) -> String {
    let today = day_of(common::test_now());
    let mut text = format::header_line();
    let mut x: u128 = 0x9e37_79b9_7f4a_7c15_f39c_c060_5ced_c834;
    for i in 0..marks {
        // xorshift: distinct, spread marks without a hash of an actor.
        x ^= x << 23;
        x ^= x >> 17;
        x ^= x << 26;
        let uuid = format!("article-{:07}", i / 2 % records);
        let (action, day) = if i % 2 == 0 {
            ("like", None)
        } else {
            ("VIEW", Some(today - (i / 2 % days) as i64))
        };
        text.push_str(&format::mark_line(&ActorMark {
            key: CounterKey::new("ARTICLE", action, &uuid).unwrap(),
            mark: Mark(x.to_le_bytes()),
            day,
            state: MarkState::Counted,
        }));
    }
    text
}

/// Imports the marks of `text`, again, and exports them; prints marks/s of
/// each and answers the import's.
async fn measure_marks(name: &str, store: &dyn Store, text: &str, marks: usize) -> f64 {
    let options = import::Options::default();
    let hidden = indicatif::ProgressBar::hidden();
    let (t, c) = (Instant::now(), cpu());
    let done = import::read_all(store, text.as_bytes(), &rules(), &options, &hidden)
        .await
        .unwrap();
    let (wall, spent) = (t.elapsed(), cpu() - c);
    assert_eq!(done.marks as usize, marks);
    let rate = marks as f64 / wall.as_secs_f64();
    println!(
        "{name}: import {marks} marks in {:.2} s: {rate:.0} marks/s; {:.1} µs CPU of this process per mark",
        wall.as_secs_f64(),
        spent.as_secs_f64() * 1e6 / marks as f64
    );
    let (t, c) = (Instant::now(), cpu());
    import::read_all(store, text.as_bytes(), &rules(), &options, &hidden)
        .await
        .unwrap();
    println!(
        "{name}: the same marks again (every one there): {:.0} marks/s; {:.1} µs CPU per mark",
        marks as f64 / t.elapsed().as_secs_f64(),
        (cpu() - c).as_secs_f64() * 1e6 / marks as f64
    );
    let (t, c) = (Instant::now(), cpu());
    let mut out = Vec::with_capacity(text.len());
    let what = export::Export {
        from_day: rules().oldest_day(),
        hours_from_day: rules().oldest_hour_day(),
        marks: true,
        fingerprint: None,
        tenant: "default".into(),
    };
    let exported = export::write(store, &mut out, &what, &hidden)
        .await
        .unwrap();
    let wall = t.elapsed();
    assert_eq!(exported.marks as usize, marks);
    println!(
        "{name}: export of the marks: {:.0} marks/s; {:.1} µs CPU per mark",
        marks as f64 / wall.as_secs_f64(),
        (cpu() - c).as_secs_f64() * 1e6 / marks as f64
    );
    rate
}

/// Imports `text` and exports it back; prints and answers records/s of each.
async fn measure(name: &str, store: &dyn Store, text: &str, records: usize) -> f64 {
    let options = import::Options::default();
    let hidden = indicatif::ProgressBar::hidden();
    let (t, c) = (Instant::now(), cpu());
    let done = import::read_all(store, text.as_bytes(), &rules(), &options, &hidden)
        .await
        .unwrap();
    let (wall, spent) = (t.elapsed(), cpu() - c);
    assert_eq!(done.counters as usize, records);
    let rate = records as f64 / wall.as_secs_f64();
    println!(
        "{name}: import {records} records ({} days, {} hours) in {:.2} s: {rate:.0} records/s, {:.0} days/s; {:.1} µs CPU of this process per record",
        done.days,
        done.hours,
        wall.as_secs_f64(),
        done.days as f64 / wall.as_secs_f64(),
        spent.as_secs_f64() * 1e6 / records as f64
    );
    let (t, c) = (Instant::now(), cpu());
    let again = import::read_all(store, text.as_bytes(), &rules(), &options, &hidden)
        .await
        .unwrap();
    let wall2 = t.elapsed();
    println!(
        "{name}: the same file again (every counter exists): {:.0} records/s; {:.1} µs CPU per record",
        again.counters as f64 / wall2.as_secs_f64(),
        (cpu() - c).as_secs_f64() * 1e6 / records as f64
    );
    let (t, c) = (Instant::now(), cpu());
    let mut out = Vec::with_capacity(text.len());
    export::write_all(
        store,
        &mut out,
        rules().oldest_day(),
        rules().oldest_hour_day(),
        &hidden,
    )
    .await
    .unwrap();
    let wall3 = t.elapsed();
    assert_eq!(out.len(), text.len());
    println!(
        "{name}: export: {:.0} records/s; {:.1} µs CPU per record",
        records as f64 / wall3.as_secs_f64(),
        (cpu() - c).as_secs_f64() * 1e6 / records as f64
    );
    rate
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark: cargo test --release --test bench_transfer -- --ignored --nocapture"]
async fn bench_import_and_export() {
    let records = env("BENCH_RECORDS", 20_000);
    let days = env("BENCH_DAYS", 30);
    let text = file(records, days);
    let clock = ManualClock::new(common::test_now()).clock();
    let dir = tempfile::tempdir().unwrap();
    let sqlite = SqliteStore::open(
        dir.path(),
        Durability::Full,
        Duration::from_secs(7 * 86_400),
        400,
        clock.clone(),
    )
    .unwrap();
    let embedded = measure("embedded (fsync'd)", &sqlite, &text, records).await;
    let marks = env("BENCH_MARKS", 100_000);
    let marks_text = marks_file(marks, records, days);
    let embedded_marks = measure_marks("embedded (fsync'd)", &sqlite, &marks_text, marks).await;
    let Ok(url) = std::env::var("ELASTICSEARCH_URL") else {
        println!("elasticsearch: not measured (set ELASTICSEARCH_URL)");
        return;
    };
    let prefix = format!("cg-bench-{}", std::process::id());
    let cfg = EsConfig::new(&url, &prefix, "default").unwrap();
    let es = ElasticsearchStore::open(cfg, clock, true).await.unwrap();
    let rate = measure("elasticsearch", &es, &text, records).await;
    println!(
        "elasticsearch imports at {:.2}x the embedded store's rate",
        rate / embedded
    );
    let es_marks = measure_marks("elasticsearch", &es, &marks_text, marks).await;
    println!(
        "elasticsearch imports marks at {:.2}x the embedded store's rate",
        es_marks / embedded_marks
    );
    let http = reqwest::Client::new();
    let indices: serde_json::Value = http
        .get(format!("{url}/_cat/indices/{prefix}_*?format=json&h=index"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap_or_default();
    for i in indices.as_array().into_iter().flatten() {
        let _ = http
            .delete(format!("{url}/{}", i["index"].as_str().unwrap_or("none")))
            .send()
            .await;
    }
}

/// Benchmark (not a test): what a flush of views with `unique: "day"`
/// costs the embedded store, per event, now that a new mark also names its
/// counter for `export` (`actor_mark_keys`). `BENCH_VIEWS` (default
/// 200,000) views of new actors in flushes of 1,000 over 1,000 counters,
/// then as many repeats; this process's CPU time per event.
/// `cargo test --release --test bench_transfer bench_view_marks -- --ignored --nocapture`
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark: cargo test --release --test bench_transfer bench_view_marks -- --ignored --nocapture"]
async fn bench_view_marks_written() {
    use counter_gateway::domain::{Increment, Kind, Scope, Unique};
    use counter_gateway::store::WriteBatch;
    let views = env("BENCH_VIEWS", 200_000);
    let clock = ManualClock::new(common::test_now()).clock();
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(
        dir.path(),
        Durability::Relaxed,
        Duration::from_secs(7 * 86_400),
        400,
        clock,
    )
    .unwrap();
    let today = day_of(common::test_now());
    let keys: Vec<CounterKey> = (0..1_000)
        .map(|i| CounterKey::new("ARTICLE", "VIEW", &format!("article-{i:04}")).unwrap())
        .collect();
    let event = |i: usize| Increment {
        key: keys[i % keys.len()].clone(),
        delta: 1,
        category: None,
        ts_ms: today * 86_400_000,
        day: today,
        id: None,
        unique: Some(Unique {
            scope: Scope::Day,
            mark: Mark(
                ((i as u128).wrapping_mul(0x9e37_79b9_7f4a_7c15_f39c_c060_5ced_c835)).to_le_bytes(),
            ),
        }),
        kind: Kind::Counter,
    };
    for round in ["new actors", "repeats"] {
        let (t, c) = (Instant::now(), cpu());
        for start in (0..views).step_by(1_000) {
            let batch = WriteBatch {
                requests: (start..(start + 1_000).min(views))
                    .map(|i| vec![event(i)])
                    .collect(),
                wanted: Default::default(),
            };
            store.apply(batch).await.unwrap();
        }
        let spent = cpu() - c;
        println!(
            "embedded (relaxed): {views} views of {round} in flushes of 1,000: {:.2} s, {:.2} µs CPU of this process per event",
            t.elapsed().as_secs_f64(),
            spent.as_secs_f64() * 1e6 / views as f64
        );
    }
}
