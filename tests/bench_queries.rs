//! Query timings on the embedded store at benchmark scale: loads N counters
//! (default 1,000,000) with a week of daily buckets (today and the 6 days
//! before, so `last_week`) through `POST /v1/events`,
//! then times top lists and reports, through the router and at the store.
//! `first_<N>_days` lists (milestones) are timed once the load is folded.
//! Windowed top lists are timed at the moments that differ: the first query
//! right after the load, once the background has folded the load (and how
//! long that took), and the first query after the day changes (the injected
//! clock moved to 00:00:01 of the next day, then the background's roll).
//! Ignored by default (it takes minutes and asserts nothing about time):
//!
//! `BENCH_COUNTERS=1000000 cargo test --release --test bench_queries -- --ignored --nocapture`
//!
//! Lists are also timed every 100 ms while the background works (writes
//! the load's window totals back, or rebuilds them), and across midnight.
//! `BENCH_BUDGET_MIB` (default 256, the server's `--sqlite-memory-budget`)
//! is the memory budget, which bounds the window totals memory holds.
//! `BENCH_WAIT_SECS` (default 600) bounds each wait for the background;
//! `BENCH_DIR` (an empty directory) keeps the database for a look after.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::Request;
use counter_gateway::domain::{day_of, CounterKey, ManualClock, TimePolicy, Window};
use counter_gateway::metrics::Metrics;
use counter_gateway::pipeline::{Pipeline, PipelineConfig};
use counter_gateway::store::sqlite::{Durability, SqliteStore};
use counter_gateway::store::{FirstDaysQuery, StaleQuery, Store, TopQuery};
use counter_gateway::{router, AppState, Limits};
use http_body_util::BodyExt;
use tower::ServiceExt;

const DAYS: i64 = 7;
const PER_REQUEST: usize = 10_000;

/// A spread of values so that top lists are not decided by ties alone.
fn value(i: usize, day: i64) -> i64 {
    let x = (i as u64 ^ (day as u64).wrapping_mul(0x9E37_79B9)).wrapping_mul(0x2545_F491_4F6C_DD1D);
    (x >> 54) as i64 + 1
}

/// The resident memory of this process, in MiB.
fn rss_mib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        })
        .map_or(0, |kib| kib / 1024)
}

fn report(name: &str, runs: &mut [Duration]) {
    runs.sort();
    println!(
        "{name:<44} min {:>9.3} ms   median {:>9.3} ms   ({} runs)",
        runs[0].as_secs_f64() * 1e3,
        runs[runs.len() / 2].as_secs_f64() * 1e3,
        runs.len()
    );
}

/// Times one query of the store (the list must be full: the bench loads
/// more than 100 counters).
async fn timed(store: &dyn Store, q: &TopQuery) -> Duration {
    let t = Instant::now();
    let list = store.top(q).await.unwrap();
    let took = t.elapsed();
    assert_eq!(list.entries.len(), q.size);
    took
}

/// The first `n` queries one by one, each printed: the first pays for
/// whatever is not folded yet, the next show whether it stays paid.
async fn first_queries(store: &dyn Store, q: &TopQuery, moment: &str, n: usize) {
    let what = match (q.window, &q.category) {
        (None, _) => "all-time",
        (Some(_), None) => "last_week",
        (Some(_), Some(_)) => "last_week category",
    };
    for i in 1..=n {
        let took = timed(store, q).await;
        println!(
            "{:<44} {:>9.3} ms",
            format!("store.top {what} {moment} #{i}"),
            took.as_secs_f64() * 1e3
        );
    }
}

/// Waits (up to `BENCH_WAIT_SECS`) until the change log is folded, every
/// window total memory held is written back (`windows_dirty` is empty) and
/// the kept totals end on `today` with the table of the day after complete,
/// reading the database file on its own connection; prints how long the
/// background took. With `probe`, times that list every 100 ms meanwhile
/// (lists while the background writes totals back, or rebuilds them) and
/// prints the slowest and the median.
async fn wait_for_background(
    db: &std::path::Path,
    today: i64,
    what: &str,
    probe: Option<(&dyn Store, &TopQuery)>,
) {
    let mut probed = Vec::new();
    wait_probing(db, today, what, probe, &mut probed).await;
    if !probed.is_empty() {
        probed.sort();
        println!(
            "{:<44} max {:>9.3} ms   median {:>9.3} ms   ({} lists)",
            format!("store.top last_week while background {what}"),
            probed[probed.len() - 1].as_secs_f64() * 1e3,
            probed[probed.len() / 2].as_secs_f64() * 1e3,
            probed.len()
        );
    }
}

async fn wait_probing(
    db: &std::path::Path,
    today: i64,
    what: &str,
    probe: Option<(&dyn Store, &TopQuery)>,
    probed: &mut Vec<Duration>,
) {
    let limit: u64 = std::env::var("BENCH_WAIT_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(600);
    let conn = rusqlite::Connection::open(db).unwrap();
    let started = Instant::now();
    loop {
        let (log, behind): (i64, i64) = conn
            .query_row(
                "SELECT (SELECT count(*) FROM windows_dirty) + (SELECT count(*) FROM counter_log),
                        (SELECT count(*) FROM windows_state WHERE anchor <> ?1 OR copied <> ?2)",
                [today, i64::MAX],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .unwrap();
        if log == 0 && behind == 0 {
            println!(
                "background {what} in {:.1} s",
                started.elapsed().as_secs_f64()
            );
            return;
        }
        if started.elapsed() > Duration::from_secs(limit) {
            println!("background {what}: not done after {limit} s ({log} log rows and counters held in memory, {behind} windows behind)");
            return;
        }
        if let Some((store, q)) = probe {
            probed.push(timed(store, q).await);
        }
        tokio::time::sleep(Duration::from_millis(if probe.is_some() {
            100
        } else {
            250
        }))
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark: minutes of load; run with --ignored --nocapture"]
async fn query_timings_at_a_million_counters() {
    let n: usize = std::env::var("BENCH_COUNTERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000);
    // BENCH_DIR keeps the database there for a look afterwards.
    let kept = std::env::var_os("BENCH_DIR").map(std::path::PathBuf::from);
    let temp = tempfile::tempdir().unwrap();
    let dir = kept.as_deref().unwrap_or(temp.path());
    // The wall time at start, standing still until the day change below.
    let now = chrono::Utc::now();
    let clock = ManualClock::new(now);
    // The server's default memory budget (`--sqlite-memory-budget`), which
    // bounds the window totals memory holds; `BENCH_BUDGET_MIB` sets another.
    let budget_mib: u64 = std::env::var("BENCH_BUDGET_MIB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(256);
    counter_gateway::store::sqlite::set_memory_budget(budget_mib << 20);
    println!(
        "memory budget {budget_mib} MiB, VmRSS before the load {} MiB",
        rss_mib()
    );
    let store: Arc<dyn Store> = Arc::new(
        SqliteStore::open(
            dir,
            Durability::Relaxed,
            Duration::from_secs(3600),
            TimePolicy::default().retention_days,
            clock.clock(),
        )
        .unwrap(),
    );
    let db = dir.join("counters.sqlite3");
    // To measure what read indexes cost the write path, load without them
    // (`BENCH_DROP_INDEXES=counters_top,counters_by_recorded`); only the load is timed then.
    let dropped = std::env::var("BENCH_DROP_INDEXES").unwrap_or_default();
    let without_indexes = !dropped.is_empty();
    if without_indexes {
        let conn = rusqlite::Connection::open(&db).unwrap();
        for index in dropped.split(',') {
            conn.execute_batch(&format!("DROP INDEX {index}")).unwrap();
        }
    }
    let metrics = Arc::new(Metrics::default());
    let (pipeline, _flusher) =
        Pipeline::start(store.clone(), PipelineConfig::default(), metrics.clone());
    let app = router(AppState {
        store: store.clone(),
        pipeline,
        time_policy: TimePolicy::default(),
        clock: clock.clock(),
        limits: Limits::default(),
        metrics,
        actors: Default::default(),
        pending: None,
    });

    let started = Instant::now();
    let mut sent = 0usize;
    // Days today-6..=today: the week queried below is exactly `last_week`
    // (7 buckets per counter), the named window the store keeps totals for.
    let today = day_of(now);
    for d in (0..DAYS).rev() {
        // Inside UTC day `today - d`, and never after now.
        let day_start = if d == 0 {
            now
        } else {
            chrono::DateTime::from_timestamp((today - d) * 86_400 + 86_399, 0).unwrap()
        };
        let floor = chrono::DateTime::from_timestamp((today - d) * 86_400, 0).unwrap();
        let mut i = 0;
        while i < n {
            let end = (i + PER_REQUEST).min(n);
            let mut body = String::from("{\"events\":[");
            for j in i..end {
                if j > i {
                    body.push(',');
                }
                // Distinct touch times, as real traffic has.
                let ts = (day_start - chrono::Duration::milliseconds(j as i64 % 3_600_000))
                    .max(floor)
                    .to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
                body.push_str(&format!(
                    r#"{{"entity":"VIDEO","action":"VIEW","uuid":"v{j:07}","count":{},"category":"c{}","timestamp":"{ts}"}}"#,
                    value(j, d),
                    j % 10
                ));
            }
            body.push_str("]}");
            let res = app
                .clone()
                .oneshot(
                    Request::post("/v1/events")
                        .header("content-type", "application/json")
                        .body(Body::from(body))
                        .unwrap(),
                )
                .await
                .unwrap();
            assert_eq!(res.status(), 200);
            sent += end - i;
            i = end;
        }
    }
    let load = started.elapsed();
    println!(
        "loaded {n} counters x {DAYS} days = {sent} events in {:.1} s ({:.0} events/s), VmRSS {} MiB",
        load.as_secs_f64(),
        sent as f64 / load.as_secs_f64(),
        rss_mib()
    );
    if without_indexes {
        return;
    }

    let week = Window {
        from_day: today - DAYS + 1,
        to_day: today,
    };
    let top = |window, category: Option<&str>| TopQuery {
        entity: "VIDEO".into(),
        action: "VIEW".into(),
        window,
        category: category.map(String::from),
        size: 100,
    };
    let cases: Vec<(&str, TopQuery)> = vec![
        ("store.top all-time size=100", top(None, None)),
        (
            "store.top all-time size=100 category",
            top(None, Some("c3")),
        ),
        ("store.top last_week size=100", top(Some(week), None)),
        (
            "store.top last_week size=100 category",
            top(Some(week), Some("c3")),
        ),
    ];
    // The first windowed queries see whatever the background has not
    // folded yet of the load: timed one by one, before any wait.
    first_queries(&*store, &top(Some(week), None), "after load", 3).await;
    first_queries(&*store, &top(Some(week), Some("c3")), "after load", 1).await;
    // All-time lists fold the change log first (at most 32,768 counters
    // pending after a load: the rest was written directly).
    first_queries(&*store, &top(None, None), "after load", 2).await;
    wait_for_background(
        &db,
        today,
        "folded the load",
        Some((&*store, &top(Some(week), None))),
    )
    .await;
    println!("VmRSS once the background is done {} MiB", rss_mib());
    for (name, q) in &cases {
        let runs_wanted = if q.window.is_some() { 10 } else { 50 };
        let mut runs = Vec::new();
        for _ in 0..runs_wanted {
            let t = Instant::now();
            let list = store.top(q).await.unwrap();
            runs.push(t.elapsed());
            assert_eq!(list.entries.len(), 100);
        }
        report(name, &mut runs);
    }

    let stale = StaleQuery {
        entity: None,
        action: None,
        // Everything loaded is older than an hour from now: every counter qualifies.
        before_ms: now.timestamp_millis() + 3_600_000,
        after: None,
        limit: 101,
    };
    let mut runs = Vec::new();
    for _ in 0..50 {
        let t = Instant::now();
        let page = store.stale(&stale).await.unwrap();
        runs.push(t.elapsed());
        assert_eq!(page.len(), 101);
    }
    report("store.stale first page size=100", &mut runs);
    let mid = store
        .stale(&StaleQuery {
            after: Some((
                (now - chrono::Duration::days(4)).timestamp_millis(),
                CounterKey::new("VIDEO", "VIEW", &format!("v{:07}", n / 2)).unwrap(),
            )),
            ..stale.clone()
        })
        .await
        .unwrap();
    assert!(!mid.is_empty());
    let mut runs = Vec::new();
    for _ in 0..50 {
        let t = Instant::now();
        store
            .stale(&StaleQuery {
                after: Some((mid[0].recorded_ms, mid[0].key.clone())),
                ..stale.clone()
            })
            .await
            .unwrap();
        runs.push(t.elapsed());
    }
    report("store.stale page from a cursor mid-way", &mut runs);

    let mut runs = Vec::new();
    for _ in 0..3 {
        let t = Instant::now();
        store.unused(now.timestamp_millis()).await.unwrap();
        runs.push(t.elapsed());
    }
    report("store.unused", &mut runs);

    // Milestones (issue 24): every counter's first touch is on the load's
    // first day, so each list sums that many of its days.
    for days in [3, 7] {
        let q = FirstDaysQuery {
            entity: "VIDEO".into(),
            action: "VIEW".into(),
            days,
            category: None,
            size: 100,
            oldest_day: today - i64::from(TimePolicy::default().retention_days),
        };
        let mut runs = Vec::new();
        for _ in 0..3 {
            let t = Instant::now();
            let list = store.top_first_days(&q).await.unwrap();
            runs.push(t.elapsed());
            assert_eq!(list.entries.len(), 100);
        }
        report(
            &format!("store.top_first_days first_{days}_days size=100"),
            &mut runs,
        );
    }

    for path in &[
        "/v1/top/VIDEO/VIEW?size=100".to_string(),
        "/v1/top/VIDEO/VIEW?size=100&interval=last_week".to_string(),
        format!(
            "/v1/top/VIDEO/VIEW?size=100&from={}&to={}",
            counter_gateway::domain::format_day(week.from_day),
            counter_gateway::domain::format_day(week.to_day)
        ),
        "/v1/reports/stale?days=1&size=100".to_string(),
        "/v1/top/VIDEO/VIEW?size=100&interval=first_7_days".to_string(),
    ] {
        let mut runs = Vec::new();
        for _ in 0..3 {
            let t = Instant::now();
            let res = app
                .clone()
                .oneshot(Request::get(path.as_str()).body(Body::empty()).unwrap())
                .await
                .unwrap();
            let status = res.status();
            res.into_body().collect().await.unwrap();
            runs.push(t.elapsed());
            assert_eq!(status, 200, "{path}");
        }
        report(&format!("http GET {path}"), &mut runs);
    }

    // Midnight: the clock moves to the next day, 00:00:01; `last_week` is
    // now tomorrow's week (the first day of the load left it).
    let tomorrow = today + 1;
    clock.set(chrono::DateTime::from_timestamp(tomorrow * 86_400 + 1, 0).unwrap());
    let next_week = Window {
        from_day: tomorrow - DAYS + 1,
        to_day: tomorrow,
    };
    first_queries(&*store, &top(Some(next_week), None), "after midnight", 3).await;
    wait_for_background(
        &db,
        tomorrow,
        "rolled the windows",
        Some((&*store, &top(Some(next_week), None))),
    )
    .await;
    let mut runs = Vec::new();
    for _ in 0..10 {
        runs.push(timed(&*store, &top(Some(next_week), None)).await);
    }
    report("store.top last_week size=100 (rolled)", &mut runs);
}
