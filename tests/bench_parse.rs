//! Micro-benchmark of the batch write path before the store: a
//! `POST /v1/events` body of 1,000 events over 10,000 keys (as
//! `scripts/bench/events.lua` sends) parsed, validated and coalesced, in
//! nanoseconds per event by stage. Not a test of behaviour, hence ignored:
//!
//! `cargo test --release --test bench_parse -- --ignored --nocapture`
//! (`BENCH_ROUNDS` sets how many times each body is read; 200 by default).

use std::hint::black_box;
use std::time::{Duration, Instant};

use counter_gateway::api::events::{parse_batch, read_batch};
use counter_gateway::domain::{Coalesced, Increment, TimePolicy};

const KEYS: u64 = 10_000;
const PER_BATCH: usize = 1_000;
const BODIES: usize = 16;

/// The bodies `scripts/bench/events.lua` sends: random uuids out of 10,000,
/// from a fixed seed so runs compare.
fn bodies() -> Vec<Vec<u8>> {
    let mut state: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state % KEYS + 1
    };
    (0..BODIES)
        .map(|_| {
            let events: Vec<String> = (0..PER_BATCH)
                .map(|_| {
                    format!(
                        r#"{{"entity":"VIDEO","action":"VIEW","uuid":"item-{}"}}"#,
                        next()
                    )
                })
                .collect();
            format!(r#"{{"events":[{}]}}"#, events.join(",")).into_bytes()
        })
        .collect()
}

fn per_event(d: Duration, events: usize) -> f64 {
    d.as_nanos() as f64 / events as f64
}

#[test]
#[ignore = "benchmark: run with --release --ignored --nocapture"]
fn batch_parse_stages() {
    let rounds: usize = std::env::var("BENCH_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(200);
    let bodies = bodies();
    let policy = TimePolicy::default();
    let now = "2026-12-01T12:00:00Z".parse().unwrap();
    let events = rounds * BODIES * PER_BATCH;
    let bytes: usize = bodies.iter().map(Vec::len).sum();

    // Warm up (allocator, caches) once over every body.
    for b in &bodies {
        black_box(read_batch(b, &policy, now, PER_BATCH).unwrap());
    }

    let started = Instant::now();
    for _ in 0..rounds {
        for b in &bodies {
            black_box(parse_batch(b).unwrap());
        }
    }
    let parse = started.elapsed();

    let started = Instant::now();
    for _ in 0..rounds {
        for b in &bodies {
            black_box(read_batch(b, &policy, now, PER_BATCH).unwrap());
        }
    }
    let read = started.elapsed();

    // Coalescing as the store does it: one flush of several requests.
    let requests: Vec<Vec<Increment>> = bodies
        .iter()
        .map(|b| read_batch(b, &policy, now, PER_BATCH).unwrap())
        .collect();
    let started = Instant::now();
    let mut keys = 0;
    for _ in 0..rounds {
        let mut c = Coalesced::default();
        for r in &requests {
            for inc in r {
                c.add(inc);
            }
        }
        keys = c.keys.len();
        black_box(c);
    }
    let coalesce = started.elapsed();

    println!(
        "{rounds} rounds of {BODIES} bodies x {PER_BATCH} events ({} bytes per event), {keys} distinct keys per flush of {} events",
        bytes / (BODIES * PER_BATCH),
        BODIES * PER_BATCH
    );
    println!("stage                               ns/event");
    println!(
        "JSON parse (borrowed body structs)  {:8.1}",
        per_event(parse, events)
    );
    println!(
        "validate + build increments         {:8.1}",
        per_event(read.saturating_sub(parse), events)
    );
    println!(
        "parse + validate (read_batch)       {:8.1}",
        per_event(read, events)
    );
    println!(
        "coalesce (flush of {BODIES} requests)      {:8.1}",
        per_event(coalesce, events)
    );
    println!(
        "total before the store              {:8.1}",
        per_event(read + coalesce, events)
    );
}
