//! Micro-benchmark of the crawler check: nanoseconds per `User-Agent` for
//! Chrome's, and on average for the browsers' (the look-around cases
//! among them) and the crawlers' of `tests/fixtures/crawlers/`, against
//! isbot's whole pattern as one backtracking regex (what a straight port
//! of isbot would run), as a ratio measured in the same run. Not a test of
//! behaviour, hence ignored:
//!
//! `cargo test --release --test bench_crawlers -- --ignored --nocapture`
//! (`BENCH_ROUNDS` sets how many times each agent is checked; 20,000 by default).

use std::hint::black_box;
use std::time::Instant;

use serde_json::Value;

fn agents() -> (Vec<String>, Vec<String>) {
    let fixture: Value =
        serde_json::from_str(include_str!("fixtures/crawlers/isbot-verdicts.json")).unwrap();
    let (mut browsers, mut crawlers) = (Vec::new(), Vec::new());
    for v in fixture["verdicts"].as_array().unwrap() {
        let ua = v["ua"].as_str().unwrap().to_string();
        if v["crawler"].as_bool().unwrap() {
            crawlers.push(ua);
        } else {
            browsers.push(ua);
        }
    }
    (browsers, crawlers)
}

/// Nanoseconds per agent of `check` over `agents`, `rounds` times each.
fn per_agent(agents: &[String], rounds: usize, check: impl Fn(&str) -> bool) -> f64 {
    let start = Instant::now();
    let mut hits = 0usize;
    for _ in 0..rounds {
        for ua in agents {
            hits += usize::from(check(black_box(ua)));
        }
    }
    black_box(hits);
    start.elapsed().as_nanos() as f64 / (rounds * agents.len()) as f64
}

#[test]
#[ignore = "benchmark: run with --release --ignored --nocapture"]
fn nanoseconds_per_user_agent() {
    let rounds: usize = std::env::var("BENCH_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(20_000);
    let start = Instant::now();
    let list = counter_gateway::api::crawlers::list().unwrap();
    let compile = start.elapsed();

    // isbot's whole pattern, one alternation, on the backtracking engine;
    // the one JavaScript-only construct rewritten as the gateway does.
    let vendored: Value =
        serde_json::from_str(include_str!("../src/api/crawlers/isbot-patterns.json")).unwrap();
    let whole: Vec<String> = vendored["patterns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_str().unwrap().replace(r"\d-.", r"\d\-."))
        .collect();
    let start = Instant::now();
    let fancy = fancy_regex::RegexBuilder::new(&whole.join("|"))
        .case_insensitive(true)
        .build()
        .unwrap();
    let fancy_compile = start.elapsed();

    let (browsers, crawlers) = agents();
    println!(
        "{} ({} patterns): compiled in {:.1} ms (one backtracking regex: {:.1} ms); {rounds} rounds",
        list.name(),
        list.len(),
        compile.as_secs_f64() * 1e3,
        fancy_compile.as_secs_f64() * 1e3
    );
    // The most common agent of all, alone: the first of the fixture.
    let chrome = vec![browsers[0].clone()];
    assert!(chrome[0].contains("Chrome/"), "{}", chrome[0]);
    for (what, agents) in [
        ("Chrome on Windows", &chrome),
        ("browsers", &browsers),
        ("crawlers", &crawlers),
    ] {
        let ours = per_agent(agents, rounds, |ua| list.is_crawler(ua.as_bytes()));
        // Hundreds of times slower: fewer rounds give as steady a figure.
        let port = per_agent(agents, (rounds / 200).max(10), |ua| {
            fancy.is_match(ua).unwrap_or(false)
        });
        println!(
            "{what} ({} agents, {:.0} bytes on average): {ours:.0} ns per agent; one backtracking regex {port:.0} ns ({:.1}x ours)",
            agents.len(),
            agents.iter().map(String::len).sum::<usize>() as f64 / agents.len() as f64,
            port / ours
        );
    }
}
