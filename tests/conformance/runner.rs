//! The conformance runner: plays the JSON scenarios of
//! `tests/conformance/scenarios/` against a router over any store, so the
//! embedded and the Elasticsearch store are held to the same answers.
//!
//! A scenario is `{"name", "steps": [{"request": {...}, "expect": {...}}]}`:
//!
//! - `request`: `method` (default GET), `path` (with query string), optional
//!   `body` (JSON) or `text` (a raw body, `text/plain` unless `headers`
//!   name a `content-type`), and `headers` (placeholders substituted in
//!   all); `save`
//!   copies values of the answer (JSON pointers) and `save_header` copies
//!   headers into variables.
//! - `expect`: `status`, then optionally `body` (a subset match: objects may
//!   hold more keys than expected, arrays must have exactly the expected
//!   elements, numbers compare by value), `csv` (rows of cells), `text`
//!   (the body as text, special strings allowed), `bytes_hex` (the body's
//!   exact bytes, in hex), `headers`.
//! - Special strings in expectations: `"$any"`, `"$absent"` (object key or
//!   header must be missing), `"$present"`, `"$contains:<text>"`,
//!   `"$approx:<number>"` (a number within 1e-6 of it: a score computed in
//!   doubles, written to 7 places).
//! - A step with `"repeat": N` sends its request N times (each answer
//!   checked): 400 ratings without 400 steps.
//! - Time, relative to the clock the target's server reads (one manual
//!   clock, standing still unless a step moves it): `{day:-3d}` becomes the
//!   UTC day 3 days before it (`2026-11-27`), `{ts:-3d}` that instant in RFC
//!   3339 (milliseconds, `Z`), `{hour:-2h}` the UTC hour bucket that instant
//!   falls in (`2026-11-30T08:00:00Z`), and a request body field `"timestamp": "-3d"`
//!   that instant too; offsets are `[+-]N` then `d`, `h`, `m` or `s`.
//!   `{var:name}` is a saved variable.
//! - A step `{"clock": "+1d"}` moves that clock (forwards or back) between
//!   two requests: a day change, or an NTP step back, while the server runs.
//!   `{"clock": "to 23:59"}` moves it forwards to the next such UTC time of
//!   day (or leaves it there), so that a following `+2m` crosses midnight
//!   whatever hour the gate starts the scenarios at.
//! - The one absolute clock: a scenario's top-level `"start"` (RFC 3339)
//!   starts its target's clock at that instant instead of the gate's date,
//!   for what happens on given dates only (a zone's DST change,
//!   `local_days.json`). The store opens at that instant, so it never sees
//!   the clock jump there, and the scenario answers the same whatever the
//!   real date or the injected one. Relative steps and placeholders then
//!   count from it as usual.
//!
//! Use it from a test file with `#[path = "conformance/runner.rs"] mod runner;`.

#![allow(dead_code)]

use std::collections::HashMap;
use std::future::Future;
use std::path::{Path, PathBuf};

use axum::body::Body;
use axum::http::{Method, Request};
use axum::Router;
use chrono::{DateTime, Duration, SecondsFormat, Utc};
use counter_gateway::domain::ManualClock;
use http_body_util::BodyExt;
use serde_json::Value;
use tower::ServiceExt;

/// A router to play one scenario against, with whatever must live as long
/// as it (a temporary directory, the flusher task, an index prefix).
pub struct Target {
    pub router: Router,
    /// The clock the router's server reads; the scenario's "now".
    pub clock: ManualClock,
    pub guard: Box<dyn std::any::Any + Send>,
}

/// The actor secret and limits every target serves the scenarios with
/// (`actors.json` counts once per actor and runs into these limits).
pub fn actors() -> counter_gateway::actors::Actors {
    let limits = counter_gateway::actors::ActorLimits::parse(&[
        "THROTTLED/like: 3 per hour per actor".to_string(),
        "THROTTLED/view: 2 per day per actor".to_string(),
    ])
    .expect("the scenarios' limits parse");
    counter_gateway::actors::Actors::new(
        counter_gateway::domain::ActorKey::new(b"conformance scenarios' secret")
            .expect("a long enough secret"),
        limits,
    )
}

/// The scenario files, sorted by name.
pub fn scenario_files() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/conformance/scenarios");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", dir.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    files
}

/// Plays every scenario, each on a fresh target from `make`, and panics with
/// every failure found (not only the first). `CONFORMANCE_FILTER` limits the
/// run to scenarios whose file name contains it.
///
/// Every target starts its clock at `start`: the gate runs the scenarios at
/// several dates (see `scripts/test.sh`).
pub async fn run_all<F, Fut>(start: DateTime<Utc>, mut make: F)
where
    F: FnMut(ManualClock) -> Fut,
    Fut: Future<Output = Target>,
{
    let filter = std::env::var("CONFORMANCE_FILTER").unwrap_or_default();
    let mut failures = Vec::new();
    let mut ran = 0;
    for file in scenario_files() {
        let name = file.file_name().unwrap().to_string_lossy().into_owned();
        if !name.contains(&filter) {
            continue;
        }
        let text = std::fs::read_to_string(&file).unwrap();
        let scenario: Value =
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("{name}: not JSON: {e}"));
        let start = match scenario.get("start") {
            None => start,
            Some(at) => at
                .as_str()
                .and_then(|at| DateTime::parse_from_rfc3339(at).ok())
                .map(|at| at.with_timezone(&Utc))
                .unwrap_or_else(|| panic!("{name}: start {at} is not an RFC 3339 instant")),
        };
        let target = make(ManualClock::new(start)).await;
        ran += 1;
        if let Err(e) = run_scenario(&target.router, &target.clock, &scenario).await {
            failures.push(format!("{name}: {e}"));
        }
        drop(target);
    }
    assert!(ran > 0, "no scenario matched {filter:?}");
    assert!(
        failures.is_empty(),
        "{} of {ran} scenarios failed:\n\n{}",
        failures.len(),
        failures.join("\n\n")
    );
}

/// Plays one scenario; the error names the step and what differed.
pub async fn run_scenario(
    router: &Router,
    clock: &ManualClock,
    scenario: &Value,
) -> Result<(), String> {
    let mut vars = HashMap::new();
    let steps = scenario["steps"].as_array().ok_or("no steps")?;
    for (i, step) in steps.iter().enumerate() {
        let what = step
            .get("note")
            .and_then(Value::as_str)
            .map(|n| format!(" ({n})"))
            .unwrap_or_default();
        let result = match step.get("clock") {
            Some(by) => by
                .as_str()
                .and_then(|raw| match raw.strip_prefix("to ") {
                    Some(time) => next_time_of_day(clock.now(), time).map(|at| clock.set(at)),
                    None => offset(raw).map(|by| clock.advance(by)),
                })
                .ok_or_else(|| format!("bad clock step {by}")),
            None => {
                let times = step.get("repeat").map_or(Some(1), Value::as_u64);
                match times {
                    Some(n) => {
                        let mut r = Ok(());
                        for _ in 0..n {
                            r = run_step(router, step, clock.now(), &mut vars).await;
                            if r.is_err() {
                                break;
                            }
                        }
                        r
                    }
                    None => Err(format!("bad repeat {}", step["repeat"])),
                }
            }
        };
        result.map_err(|e| format!("step {i}{what}: {e}"))?;
    }
    Ok(())
}

async fn run_step(
    router: &Router,
    step: &Value,
    now: DateTime<Utc>,
    vars: &mut HashMap<String, String>,
) -> Result<(), String> {
    let req = &step["request"];
    let method = req["method"].as_str().unwrap_or("GET");
    let path = substitute(
        req["path"].as_str().ok_or("request without path")?,
        now,
        vars,
    )?;
    let mut builder = Request::builder()
        .method(Method::from_bytes(method.as_bytes()).map_err(|e| e.to_string())?)
        .uri(&path);
    if let Some(h) = req["headers"].as_object() {
        for (k, v) in h {
            builder = builder.header(k, substitute(v.as_str().unwrap_or_default(), now, vars)?);
        }
    }
    let body = match (req.get("body"), req["text"].as_str()) {
        (Some(b), _) => {
            builder = builder.header("content-type", "application/json");
            let b = resolve_body(b, now, vars, None)?;
            Body::from(serde_json::to_vec(&b).unwrap())
        }
        (None, Some(text)) => {
            let typed = req["headers"]
                .as_object()
                .is_some_and(|h| h.keys().any(|k| k.eq_ignore_ascii_case("content-type")));
            if !typed {
                builder = builder.header("content-type", "text/plain");
            }
            Body::from(substitute(text, now, vars)?)
        }
        (None, None) => Body::empty(),
    };
    let res = router
        .clone()
        .oneshot(builder.body(body).unwrap())
        .await
        .map_err(|e| e.to_string())?;
    let status = res.status().as_u16();
    let headers = res.headers().clone();
    let bytes = res.into_body().collect().await.unwrap().to_bytes();
    let text = String::from_utf8_lossy(&bytes).into_owned();
    let json: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    let show = || format!("{method} {path} answered {status}: {text}");

    let expect = &step["expect"];
    if let Some(want) = expect["status"].as_u64() {
        if u64::from(status) != want {
            return Err(format!("status {status}, expected {want}; {}", show()));
        }
    }
    if let Some(want) = expect.get("body") {
        let want = resolve_body(want, now, vars, None)?;
        matches(&want, &json, "").map_err(|e| format!("body{e}; {}", show()))?;
    }
    if let Some(want) = expect["text"].as_str() {
        if !text_matches(&substitute(want, now, vars)?, &text) {
            return Err(format!("text is not {want:?}; {}", show()));
        }
    }
    if let Some(want) = expect["bytes_hex"].as_str() {
        let got: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        if got != want.to_ascii_lowercase() {
            return Err(format!("bytes are {got}, expected {want}; {}", show()));
        }
    }
    if let Some(rows) = expect.get("csv") {
        let want = resolve_body(rows, now, vars, None)?;
        let got: Vec<Value> = parse_csv(&text)
            .into_iter()
            .map(|r| Value::from(r.into_iter().map(Value::from).collect::<Vec<_>>()))
            .collect();
        matches(&want, &Value::from(got), "").map_err(|e| format!("csv{e}; {}", show()))?;
    }
    if let Some(h) = expect["headers"].as_object() {
        for (k, want) in h {
            let got = headers.get(k).and_then(|v| v.to_str().ok());
            let ok = match (want.as_str(), got) {
                (Some("$absent"), g) => g.is_none(),
                (Some("$present"), g) => g.is_some(),
                (Some(w), Some(g)) => text_matches(&substitute(w, now, vars)?, g),
                _ => false,
            };
            if !ok {
                return Err(format!(
                    "header {k} is {got:?}, expected {want}; {}",
                    show()
                ));
            }
        }
    }
    if let Some(save) = req["save"].as_object() {
        for (var, ptr) in save {
            let v = json
                .pointer(ptr.as_str().unwrap_or_default())
                .ok_or_else(|| format!("nothing at {ptr} to save; {}", show()))?;
            let v = v.as_str().map_or_else(|| v.to_string(), str::to_owned);
            vars.insert(var.clone(), v);
        }
    }
    if let Some(save) = req["save_header"].as_object() {
        for (var, name) in save {
            let v = headers
                .get(name.as_str().unwrap_or_default())
                .and_then(|v| v.to_str().ok())
                .ok_or_else(|| format!("no header {name} to save; {}", show()))?;
            vars.insert(var.clone(), v.to_owned());
        }
    }
    Ok(())
}

/// The first instant at or after `now` whose UTC time of day is `time`
/// (`HH:MM` or `HH:MM:SS`).
fn next_time_of_day(now: DateTime<Utc>, time: &str) -> Option<DateTime<Utc>> {
    let t = chrono::NaiveTime::parse_from_str(time, "%H:%M:%S")
        .or_else(|_| chrono::NaiveTime::parse_from_str(time, "%H:%M"))
        .ok()?;
    let today = now.date_naive().and_time(t).and_utc();
    Some(if today >= now {
        today
    } else {
        today + Duration::days(1)
    })
}

/// `[+-]N(d|h|m|s)` or `now`.
fn offset(raw: &str) -> Option<Duration> {
    if raw == "now" {
        return Some(Duration::zero());
    }
    if !raw.is_ascii() {
        return None;
    }
    let sign = match raw.as_bytes().first()? {
        b'-' => -1,
        b'+' => 1,
        _ => return None,
    };
    let (num, unit) = raw[1..].split_at(raw.len().checked_sub(2)?);
    let n: i64 = num.parse().ok()?;
    let d = match unit {
        "d" => Duration::days(n),
        "h" => Duration::hours(n),
        "m" => Duration::minutes(n),
        "s" => Duration::seconds(n),
        _ => return None,
    };
    Some(d * sign)
}

fn instant(now: DateTime<Utc>, raw: &str) -> Result<DateTime<Utc>, String> {
    offset(raw)
        .map(|d| now + d)
        .ok_or_else(|| format!("bad time offset {raw:?}"))
}

/// Replaces `{day:..}`, `{hour:..}`, `{ts:..}` and `{var:..}` in a string.
fn substitute(
    s: &str,
    now: DateTime<Utc>,
    vars: &HashMap<String, String>,
) -> Result<String, String> {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(start) = rest.find('{') {
        let Some(len) = rest[start..].find('}') else {
            break;
        };
        let inner = &rest[start + 1..start + len];
        let replaced = match inner.split_once(':') {
            Some(("day", off)) => Some(instant(now, off)?.format("%Y-%m-%d").to_string()),
            Some(("hour", off)) => {
                Some(instant(now, off)?.format("%Y-%m-%dT%H:00:00Z").to_string())
            }
            Some(("ts", off)) => {
                Some(instant(now, off)?.to_rfc3339_opts(SecondsFormat::Millis, true))
            }
            Some(("var", name)) => Some(
                vars.get(name)
                    .cloned()
                    .ok_or_else(|| format!("variable {name} was never saved"))?,
            ),
            _ => None,
        };
        out.push_str(&rest[..start]);
        match replaced {
            Some(r) => out.push_str(&r),
            None => out.push_str(&rest[start..=start + len]),
        }
        rest = &rest[start + len + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

/// Substitutes placeholders in every string of a JSON value, and turns a
/// relative `"timestamp"` field into an RFC 3339 instant.
fn resolve_body(
    v: &Value,
    now: DateTime<Utc>,
    vars: &HashMap<String, String>,
    field: Option<&str>,
) -> Result<Value, String> {
    Ok(match v {
        Value::String(s) if field == Some("timestamp") && offset(s).is_some() => {
            Value::from(instant(now, s)?.to_rfc3339_opts(SecondsFormat::Millis, true))
        }
        Value::String(s) => Value::from(substitute(s, now, vars)?),
        Value::Array(a) => Value::from(
            a.iter()
                .map(|x| resolve_body(x, now, vars, None))
                .collect::<Result<Vec<_>, _>>()?,
        ),
        Value::Object(o) => Value::Object(
            o.iter()
                .map(|(k, x)| Ok((k.clone(), resolve_body(x, now, vars, Some(k))?)))
                .collect::<Result<_, String>>()?,
        ),
        other => other.clone(),
    })
}

fn text_matches(want: &str, got: &str) -> bool {
    match want.strip_prefix("$contains:") {
        Some(part) => got.contains(part),
        None => want == "$any" || want == got,
    }
}

/// Whether `got` holds everything `want` describes; the error is the JSON
/// path where they differ.
fn matches(want: &Value, got: &Value, at: &str) -> Result<(), String> {
    let differ = || format!(" at {at}: got {got}, expected {want}");
    match (want, got) {
        (Value::String(w), _) if w == "$any" => Ok(()),
        (Value::String(w), _) if w == "$present" => Ok(()),
        (Value::String(w), Value::Number(g)) if w.starts_with("$approx:") => {
            let want: f64 = w["$approx:".len()..]
                .parse()
                .map_err(|_| format!(" at {at}: bad expectation {w}"))?;
            let got = g.as_f64().unwrap_or(f64::NAN);
            ((got - want).abs() <= 1e-6)
                .then_some(())
                .ok_or_else(differ)
        }
        (Value::String(w), Value::String(g)) => text_matches(w, g).then_some(()).ok_or_else(differ),
        (Value::Number(w), Value::Number(g)) => {
            let same = match (w.as_i64(), g.as_i64()) {
                (Some(a), Some(b)) => a == b,
                _ => w.as_f64() == g.as_f64(),
            };
            same.then_some(()).ok_or_else(differ)
        }
        (Value::Object(w), Value::Object(g)) => {
            for (k, wv) in w {
                let path = format!("{at}/{k}");
                match (wv.as_str(), g.get(k)) {
                    (Some("$absent"), None) => {}
                    (Some("$absent"), Some(gv)) => {
                        return Err(format!(" at {path}: got {gv}, expected no such key"))
                    }
                    (_, None) => return Err(format!(" at {path}: missing, expected {wv}")),
                    (_, Some(gv)) => matches(wv, gv, &path)?,
                }
            }
            Ok(())
        }
        (Value::Array(w), Value::Array(g)) => {
            if w.len() != g.len() {
                return Err(format!(
                    " at {at}: {} elements, expected {}: got {got}",
                    g.len(),
                    w.len()
                ));
            }
            for (i, (wv, gv)) in w.iter().zip(g).enumerate() {
                matches(wv, gv, &format!("{at}/{i}"))?;
            }
            Ok(())
        }
        _ => (want == got).then_some(()).ok_or_else(differ),
    }
}

/// A small RFC 4180 reader: quoted fields, doubled quotes, CRLF or LF rows.
fn parse_csv(text: &str) -> Vec<Vec<String>> {
    let mut rows = Vec::new();
    let mut row = Vec::new();
    let mut field = String::new();
    let mut quoted = false;
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match (quoted, c) {
            (true, '"') if chars.peek() == Some(&'"') => {
                chars.next();
                field.push('"');
            }
            (true, '"') => quoted = false,
            (true, c) => field.push(c),
            (false, '"') => quoted = true,
            (false, ',') => row.push(std::mem::take(&mut field)),
            (false, '\r') => {}
            (false, '\n') => {
                row.push(std::mem::take(&mut field));
                rows.push(std::mem::take(&mut row));
            }
            (false, c) => field.push(c),
        }
    }
    if !field.is_empty() || !row.is_empty() {
        row.push(field);
        rows.push(row);
    }
    rows
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn subset_matching_reports_where_it_differs() {
        let got = json!({"a": 1, "b": [{"x": 2.5, "y": "t"}], "c": "hello world"});
        assert!(matches(&json!({"b": [{"x": 2.5}]}), &got, "").is_ok());
        assert!(matches(&json!({"c": "$contains:world", "d": "$absent"}), &got, "").is_ok());
        let e = matches(&json!({"b": [{"x": 3}]}), &got, "").unwrap_err();
        assert!(e.contains("/b/0/x"), "{e}");
        assert!(matches(&json!({"b": []}), &got, "").is_err());
        assert!(matches(&json!({"a": "$absent"}), &got, "").is_err());
        assert!(matches(&json!({"z": 1}), &got, "").is_err());
        assert!(matches(&json!({"b": [{"x": "$approx:2.5000004"}]}), &got, "").is_ok());
        assert!(matches(&json!({"b": [{"x": "$approx:2.500002"}]}), &got, "").is_err());
        assert!(matches(&json!({"b": [{"y": "$approx:2.5"}]}), &got, "").is_err());
    }

    #[test]
    fn times_are_relative_to_the_pinned_now() {
        let now: DateTime<Utc> = "2026-11-30T10:00:00Z".parse().unwrap();
        let vars = HashMap::from([("c".to_string(), "abc".to_string())]);
        assert_eq!(
            substitute("/x?from={day:-3d}&cursor={var:c}&k={other}", now, &vars).unwrap(),
            "/x?from=2026-11-27&cursor=abc&k={other}"
        );
        assert_eq!(
            substitute("{hour:-2h}", now, &vars).unwrap(),
            "2026-11-30T08:00:00Z"
        );
        let body = resolve_body(
            &json!({"timestamp": "-2h", "t": "{ts:+0d}"}),
            now,
            &vars,
            None,
        )
        .unwrap();
        assert_eq!(
            body,
            json!({"timestamp": "2026-11-30T08:00:00.000Z", "t": "2026-11-30T10:00:00.000Z"})
        );
        assert!(substitute("{var:nope}", now, &vars).is_err());
    }

    #[test]
    fn csv_reader_handles_quotes() {
        assert_eq!(
            parse_csv("a,b\r\n\"x,\"\"y\"\"\",\r\n"),
            vec![vec!["a", "b"], vec!["x,\"y\"", ""]]
        );
    }
}
