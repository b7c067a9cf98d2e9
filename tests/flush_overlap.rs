//! Flushes side by side (a store with more than one bulk in flight, as
//! Elasticsearch): no counter is ever in two running flushes, a submission
//! on a running counter waits for that flush and goes right after it, the
//! others do not wait, every total is exact, and a close drains every
//! running and waiting flush before the flusher stops.

mod common;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use counter_gateway::domain::{CounterKey, Increment, Kind, ManualClock, TimePolicy};
use counter_gateway::metrics::Metrics;
use counter_gateway::pipeline::{Pipeline, PipelineConfig, SubmitError};
use counter_gateway::store::sqlite::{Durability, SqliteStore};
use counter_gateway::store::Store;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// What the flights store saw: the counters (uuids) of each flush started,
/// in order; which run now; every overlap with a running flush.
#[derive(Clone, Debug, Default)]
struct Flights {
    started: Vec<HashSet<String>>,
    running: HashMap<usize, HashSet<String>>,
    ended: Vec<usize>,
    overlaps: Vec<String>,
    most_running: usize,
    /// Flushes let through; with `open`, all.
    released: HashSet<usize>,
    open: bool,
}

/// The embedded store's writes behind a gate: each flush waits until the
/// test releases it (or the gate is open), so the test decides when a
/// flush ends. Up to `bulks` flushes at once.
struct Gated {
    inner: Arc<dyn Store>,
    flights: watch::Sender<Flights>,
    bulks: usize,
}

store_wrapper!(
    Gated,
    |self, batch| {
        let keys: HashSet<String> = batch
            .requests
            .iter()
            .flatten()
            .map(|e| e.key.uuid.to_string())
            .collect();
        let mut n = 0;
        self.flights.send_modify(|f| {
            n = f.started.len();
            for (other, theirs) in &f.running {
                for k in keys.intersection(theirs) {
                    f.overlaps.push(format!("{k} in flushes {other} and {n}"));
                }
            }
            f.started.push(keys.clone());
            f.running.insert(n, keys);
            f.most_running = f.most_running.max(f.running.len());
        });
        let mut gate = self.flights.subscribe();
        let _ = gate.wait_for(|f| f.open || f.released.contains(&n)).await;
        let out = self.inner.apply(batch).await;
        self.flights.send_modify(|f| {
            f.running.remove(&n);
            f.ended.push(n);
        });
        out
    },
    |this| this.bulks
);

struct Setup {
    pipeline: Pipeline,
    flusher: JoinHandle<()>,
    flights: watch::Sender<Flights>,
    store: Arc<dyn Store>,
    _dir: tempfile::TempDir,
}

fn now_ms() -> i64 {
    common::test_now().timestamp_millis()
}

fn start(bulks: usize) -> Setup {
    let dir = tempfile::tempdir().expect("temp dir");
    let clock = ManualClock::new(common::test_now()).clock();
    let inner: Arc<dyn Store> = Arc::new(
        SqliteStore::open(
            dir.path(),
            Durability::Full,
            Duration::from_secs(86_400),
            TimePolicy::default().retention_days,
            clock,
        )
        .expect("open store"),
    );
    let (flights, _) = watch::channel(Flights::default());
    let store: Arc<dyn Store> = Arc::new(Gated {
        inner,
        flights: flights.clone(),
        bulks,
    });
    let config = PipelineConfig {
        ack_timeout: Duration::from_secs(60),
        ..PipelineConfig::default()
    };
    let (pipeline, flusher) = Pipeline::start(store.clone(), config, Arc::new(Metrics::default()));
    Setup {
        pipeline,
        flusher,
        flights,
        store,
        _dir: dir,
    }
}

fn inc(uuid: &str, delta: i64, id: Option<&str>) -> Increment {
    let ts_ms = now_ms();
    Increment {
        key: CounterKey::new("VIDEO", "VIEW", uuid).unwrap(),
        delta,
        category: None,
        ts_ms,
        day: ts_ms.div_euclid(86_400_000),
        id: id.map(Arc::from),
        kind: Kind::Counter,
        unique: None,
    }
}

type Answer = JoinHandle<Result<u32, SubmitError>>;

/// Submits `events` in the background and waits until the pipeline holds
/// them (so submissions reach the flusher in the order of the calls).
async fn submit(s: &Setup, events: Vec<Increment>) -> Answer {
    let before = s.pipeline.own_depth();
    let n = events.len();
    let p = s.pipeline.clone();
    let task = tokio::spawn(async move { p.submit(events, None).await.map(|a| a.duplicates) });
    while s.pipeline.own_depth() < before + n && !task.is_finished() {
        tokio::task::yield_now().await;
    }
    task
}

async fn until(s: &Setup, what: impl Fn(&Flights) -> bool) -> Flights {
    let mut rx = s.flights.subscribe();
    let f: Flights = rx.wait_for(what).await.expect("flights").clone();
    drop(rx);
    f
}

fn set(uuids: &[&str]) -> HashSet<String> {
    uuids.iter().map(|u| u.to_string()).collect()
}

async fn value(s: &Setup, uuid: &str) -> i64 {
    let key = CounterKey::new("VIDEO", "VIEW", uuid).unwrap();
    s.store.get(&key).await.unwrap().map_or(0, |c| c.value)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_counter_waits_for_the_flush_that_holds_it_and_the_others_do_not() {
    let s = start(4);
    let a = submit(&s, vec![inc("a", 1, None)]).await;
    until(&s, |f| f.running.len() == 1).await;
    let b = submit(&s, vec![inc("b", 1, None)]).await;
    until(&s, |f| f.running.len() == 2).await;
    // On a's counter, with one of c's: both wait for the first flush.
    let a2 = submit(&s, vec![inc("a", 2, None), inc("c", 1, None)]).await;
    // c again, behind the one waiting: it waits too, so c's submissions
    // are applied in their order.
    let c = submit(&s, vec![inc("c", 3, None)]).await;
    // A free counter goes at once, beside the two running.
    let d = submit(&s, vec![inc("d", 1, None)]).await;
    let f = until(&s, |f| f.started.len() == 3).await;
    assert_eq!(f.started, vec![set(&["a"]), set(&["b"]), set(&["d"])]);
    assert_eq!(f.running.len(), 3, "three flushes at once: {f:?}");
    // a ends: what waited for it goes in the next flush, in order.
    s.flights.send_modify(|f| {
        f.released.insert(0);
    });
    let f = until(&s, |f| f.started.len() == 4).await;
    assert_eq!(f.started[3], set(&["a", "c"]), "{f:?}");
    assert!(f.ended.contains(&0), "a's flush ended before a ran again");
    s.flights.send_modify(|f| f.open = true);
    for t in [a, b, a2, c, d] {
        assert_eq!(t.await.unwrap(), Ok(0));
    }
    let f = s.flights.borrow().clone();
    assert!(f.overlaps.is_empty(), "{:?}", f.overlaps);
    for (uuid, want) in [("a", 3), ("b", 1), ("c", 4), ("d", 1)] {
        assert_eq!(value(&s, uuid).await, want, "{uuid}");
    }
}

/// Many clients on skewed keys (a few hot ones, many cold), single events
/// and batches over several keys, some sent twice with an id: no counter
/// ever in two running flushes, every total exact, every retried id counted once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_counter_is_ever_in_two_running_flushes() {
    let s = start(4);
    s.flights.send_modify(|f| f.open = true);
    let mut expected: HashMap<String, i64> = HashMap::new();
    let mut work: Vec<Vec<Vec<Increment>>> = vec![Vec::new(); 32];
    let mut seed: u64 = 7;
    let mut next = |m: u64| {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (seed >> 33) % m
    };
    for r in 0..3_200usize {
        // Zipf-like: half the events on 4 hot keys, the rest over 200.
        let mut pick = || {
            if next(2) == 0 {
                format!("hot{}", next(4))
            } else {
                format!("cold{}", next(200))
            }
        };
        let events: Vec<Increment> = if r % 10 == 9 {
            (0..5)
                .map(|j| inc(&pick(), 1, Some(&format!("r{r}-e{j}"))))
                .collect()
        } else {
            vec![inc(&pick(), 1, None)]
        };
        for e in &events {
            *expected.entry(e.key.uuid.to_string()).or_default() += 1;
        }
        let client = r % 32;
        if r % 10 == 9 {
            // Its retry, by another client: counted once.
            work[(client + 1) % 32].push(events.clone());
        }
        work[client].push(events);
    }
    let mut tasks = tokio::task::JoinSet::new();
    for list in work {
        let p = s.pipeline.clone();
        tasks.spawn(async move {
            let mut duplicates = 0;
            for events in list {
                duplicates += p.submit(events, None).await.expect("applied").duplicates;
            }
            duplicates
        });
    }
    let mut duplicates = 0;
    while let Some(d) = tasks.join_next().await {
        duplicates += d.unwrap();
    }
    assert_eq!(duplicates, 320 * 5, "every retried event counted once");
    let f = s.flights.borrow().clone();
    assert!(
        f.overlaps.is_empty(),
        "{:?}",
        &f.overlaps[..f.overlaps.len().min(5)]
    );
    eprintln!(
        "{} flushes, at most {} at once",
        f.started.len(),
        f.most_running
    );
    for (uuid, want) in &expected {
        assert_eq!(value(&s, uuid).await, *want, "{uuid}");
    }
}

/// A close while flushes run and others wait: every submission accepted
/// before it is applied and answered, later ones are refused, the flusher
/// stops only once all is done.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_close_drains_every_running_and_waiting_flush() {
    let s = start(4);
    let a = submit(&s, vec![inc("a", 1, None)]).await;
    until(&s, |f| f.running.len() == 1).await;
    let b = submit(&s, vec![inc("b", 1, None)]).await;
    until(&s, |f| f.running.len() == 2).await;
    let waiting = submit(&s, vec![inc("a", 5, None), inc("b", 5, None)]).await;
    s.pipeline.close();
    let refused = s.pipeline.submit(vec![inc("z", 1, None)], None).await;
    assert!(
        matches!(refused, Err(SubmitError::ShuttingDown)),
        "{refused:?}"
    );
    assert!(!s.flusher.is_finished(), "two flushes still run");
    s.flights.send_modify(|f| f.open = true);
    for t in [a, b, waiting] {
        assert_eq!(t.await.unwrap(), Ok(0));
    }
    s.flusher.await.expect("the flusher stops");
    let f = s.flights.borrow().clone();
    assert!(f.overlaps.is_empty(), "{:?}", f.overlaps);
    assert_eq!(f.started.len(), 3, "{f:?}");
    let key = |u: &str| CounterKey::new("VIDEO", "VIEW", u).unwrap();
    let got = s
        .store
        .get_many(&[key("a"), key("b"), key("z")])
        .await
        .unwrap();
    let values: Vec<i64> = got
        .iter()
        .map(|c| c.as_ref().map_or(0, |c| c.value))
        .collect();
    assert_eq!(values, vec![6, 6, 0]);
}

/// One at a time stays the default: a store that does not ask for more
/// never has two flushes running.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_of_one_bulk_in_flight_runs_one_flush_at_a_time() {
    let s = start(1);
    let a = submit(&s, vec![inc("a", 1, None)]).await;
    until(&s, |f| f.running.len() == 1).await;
    let b = submit(&s, vec![inc("b", 1, None)]).await;
    s.flights.send_modify(|f| {
        f.released.insert(0);
    });
    until(&s, |f| f.started.len() == 2).await;
    s.flights.send_modify(|f| f.open = true);
    for t in [a, b] {
        assert_eq!(t.await.unwrap(), Ok(0));
    }
    assert_eq!(s.flights.borrow().most_running, 1);
}

/// A store whose flushes take a fixed time (as a bulk's round trip does),
/// apply nothing, and record how many requests each carried.
struct Timed {
    inner: Arc<dyn Store>,
    took: Duration,
    sizes: std::sync::Mutex<Vec<usize>>,
}

store_wrapper!(
    Timed,
    |self, batch| {
        self.sizes.lock().unwrap().push(batch.requests.len());
        tokio::time::sleep(self.took).await;
        Ok(counter_gateway::store::BatchOutcome {
            requests: vec![
                counter_gateway::store::RequestOutcome::Applied { duplicates: 0 };
                batch.requests.len()
            ],
            ..Default::default()
        })
    },
    |_this| 1
);

/// Clients that each send their next request once answered (as HTTP
/// clients under load do): every flush takes back the wave of clients
/// the last one answered, rather than starting with the few that came
/// while it ran and leaving the many to the flush after (flushes would
/// alternate between one request and all the others). Time is paused, so
/// the clients (1 ms apart, 16 ms in all) always come back before the
/// flusher's wait for them ends (5 ms without a request, 20 ms in all).
#[tokio::test(start_paused = true)]
async fn each_flush_takes_back_the_clients_the_last_one_answered() {
    let s = start(1);
    let timed = Arc::new(Timed {
        inner: s.store.clone(),
        took: Duration::from_millis(40),
        sizes: Default::default(),
    });
    let (pipeline, _flusher) = Pipeline::start(
        timed.clone(),
        PipelineConfig {
            ack_timeout: Duration::from_secs(600),
            ..PipelineConfig::default()
        },
        Arc::new(Metrics::default()),
    );
    const CLIENTS: usize = 16;
    let mut clients = tokio::task::JoinSet::new();
    for c in 0..CLIENTS {
        let p = pipeline.clone();
        clients.spawn(async move {
            for r in 0..10 {
                // Answers reach clients, and their next requests the
                // gateway, spread over a few milliseconds, not all at once.
                tokio::time::sleep(Duration::from_millis(c as u64)).await;
                let uuid = format!("c{c}-{r}");
                p.submit(vec![inc(&uuid, 1, None)], None)
                    .await
                    .expect("applied");
            }
        });
    }
    while let Some(done) = clients.join_next().await {
        done.unwrap();
    }
    let sizes = timed.sizes.lock().unwrap().clone();
    assert_eq!(sizes.iter().sum::<usize>(), CLIENTS * 10, "{sizes:?}");
    // The first flush starts with the first client alone, the second takes
    // the others; from then on each takes all of them back.
    assert!(
        sizes.len() <= 13,
        "flushes should carry every client, not alternate: {sizes:?}"
    );
    assert!(
        sizes[2..sizes.len() - 1].iter().all(|&n| n == CLIENTS),
        "{sizes:?}"
    );
}

/// The wait for a wave is bounded: a client that does not come back (it
/// stopped sending) holds the next flush back for the wave's gap at most,
/// not for the last flush's time.
#[tokio::test(start_paused = true)]
async fn a_lone_request_after_a_wave_waits_for_the_gap_at_most() {
    let s = start(1);
    let timed = Arc::new(Timed {
        inner: s.store.clone(),
        took: Duration::from_millis(40),
        sizes: Default::default(),
    });
    let (pipeline, _flusher) = Pipeline::start(
        timed.clone(),
        PipelineConfig::default(),
        Arc::new(Metrics::default()),
    );
    let mut many = tokio::task::JoinSet::new();
    for c in 0..8 {
        let p = pipeline.clone();
        many.spawn(async move { p.submit(vec![inc(&format!("m{c}"), 1, None)], None).await });
    }
    while let Some(done) = many.join_next().await {
        done.unwrap().expect("applied");
    }
    // The last flush answered several; one request comes alone.
    let started = tokio::time::Instant::now();
    pipeline
        .submit(vec![inc("alone", 1, None)], None)
        .await
        .expect("applied");
    let waited = started.elapsed();
    assert!(
        waited < Duration::from_millis(40 + 5 + 1),
        "the lone request waited {waited:?} for a wave that never came"
    );
    assert!(
        waited >= Duration::from_millis(40),
        "the flush itself takes 40 ms: {waited:?}"
    );
}
