//! Contract tests of the Elasticsearch store: the exact JSON and NDJSON it
//! sends (bulk bodies, stored scripts, templates, queries), compared as JSON
//! with the expected files under `tests/fixtures/es/`, and the parsing of
//! answers in the shapes Elasticsearch documents.

use std::path::PathBuf;

use chrono::{DateTime, Utc};
use counter_gateway::domain::{Increment, IncrementSpec, TimePolicy};
use counter_gateway::store::elasticsearch::request::{self, IndexNames, WriteSettings};
use counter_gateway::store::elasticsearch::response::{self, ItemClass};
use counter_gateway::store::elasticsearch::templates;
use serde_json::{json, Value};

fn fixture_path(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/es")
        .join(name)
}

/// The engine the contract fixtures describe (with ILM).
const ES8: counter_gateway::store::elasticsearch::templates::Engine =
    counter_gateway::store::elasticsearch::templates::Engine::Elasticsearch {
        major: 8,
        minor: 15,
        ilm: true,
    };

fn fixture(name: &str) -> String {
    std::fs::read_to_string(fixture_path(name))
        .unwrap_or_else(|e| panic!("cannot read tests/fixtures/es/{name}: {e}"))
}

fn fixture_json(name: &str) -> Value {
    serde_json::from_str(&fixture(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// Compares NDJSON line by line, each line as JSON, and the final newline.
fn assert_ndjson_eq(actual: &[u8], expected_file: &str) {
    let actual = std::str::from_utf8(actual).expect("UTF-8");
    assert!(actual.ends_with('\n'), "a bulk body ends with a newline");
    let expected = fixture(expected_file);
    let a: Vec<&str> = actual.lines().collect();
    let e: Vec<&str> = expected.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(
        a.len(),
        e.len(),
        "line count differs from {expected_file}:\n{actual}"
    );
    for (i, (a, e)) in a.iter().zip(&e).enumerate() {
        let av: Value = serde_json::from_str(a).unwrap_or_else(|err| panic!("line {i}: {err}"));
        let ev: Value =
            serde_json::from_str(e).unwrap_or_else(|err| panic!("{expected_file} line {i}: {err}"));
        assert_eq!(av, ev, "line {i} of {expected_file} differs");
    }
}

const NOW: &str = "2026-11-30T12:00:00Z";

fn now() -> DateTime<Utc> {
    NOW.parse().unwrap()
}

fn inc(
    entity: &str,
    action: &str,
    uuid: &str,
    count: i64,
    ts: &str,
    category: Option<&str>,
    id: Option<&str>,
) -> Increment {
    let spec = IncrementSpec {
        entity,
        action,
        uuid,
        count: Some(count),
        timestamp: Some(ts),
        category,
        id,
        ..Default::default()
    };
    Increment::from_spec(&spec, &TimePolicy::default(), now()).unwrap()
}

fn names() -> IndexNames {
    IndexNames::new("counter-gateway", "default").unwrap()
}

fn settings() -> WriteSettings {
    WriteSettings {
        counter_script: templates::counter_script_id("counter-gateway"),
        bucket_script: templates::bucket_script_id("counter-gateway"),
        average_script: templates::average_script_id("counter-gateway"),
        average_bucket_script: templates::average_bucket_script_id("counter-gateway"),
        retry_on_conflict: 5,
        now_ms: now().timestamp_millis(),
        id_window_ms: 7 * 86_400_000,
        max_ids: 10_000,
    }
}

/// Three requests: two on one counter (coalesced, over two days, the later
/// category winning), one event with an idempotency id, and a key whose
/// parts hold `_` (escaped in the id).
fn flush() -> Vec<Vec<Increment>> {
    vec![
        vec![inc(
            "VIDEO",
            "VIEW",
            "88d19b07",
            1,
            "2026-11-30T10:00:00Z",
            Some("news"),
            None,
        )],
        vec![
            inc(
                "VIDEO",
                "VIEW",
                "88d19b07",
                2,
                "2026-11-29T23:30:00Z",
                Some("sports"),
                None,
            ),
            inc(
                "VIDEO",
                "like",
                "88d19b07",
                1,
                "2026-11-30T11:00:00Z",
                None,
                Some("evt-1"),
            ),
        ],
        vec![inc(
            "USER",
            "user:number_of_logins",
            "a_b",
            -1,
            "2026-10-31T08:00:00Z",
            None,
            None,
        )],
    ]
}

#[test]
fn a_flush_is_one_bulk_body_of_scripted_upserts() {
    let requests = flush();
    let slices: Vec<&[Increment]> = requests.iter().map(Vec::as_slice).collect();
    let plan = request::plan(&slices, i64::MAX).unwrap();
    // One counter write per key, one bucket write per (key, day).
    assert_eq!(plan.writes.len(), 3 + 4);
    assert_eq!(plan.touches, vec![vec![0, 1], vec![0, 2, 3, 4], vec![5, 6]]);
    assert_eq!(plan.id_events, vec![vec![], vec![(3, 0)], vec![]]);
    let actions: Vec<_> = plan
        .writes
        .iter()
        .map(|w| {
            // The view is a single increment's, which answers with its
            // counter; the others are a batch's, which answers with none.
            let wanted = &*w.key.action == "VIEW";
            request::action(w, &names(), &settings(), "0123456789abcdef-2a", wanted)
        })
        .collect();
    let refs: Vec<_> = actions.iter().collect();
    let body = request::bulk_body(&refs, 5);
    // A document comes back only where the gateway reads it: the wanted
    // counter, and the writes with event ids (their skipped events).
    assert_ndjson_eq(&body, "bulk_flush.ndjson");
}

#[test]
fn scripts_are_called_by_id_with_params_only() {
    let requests = flush();
    let slices: Vec<&[Increment]> = requests.iter().map(Vec::as_slice).collect();
    let plan = request::plan(&slices, i64::MAX).unwrap();
    for w in &plan.writes {
        let a = request::action(w, &names(), &settings(), "0123456789abcdef-2a", true);
        let script = &a.body["script"];
        assert!(script.get("source").is_none(), "no inline source: {script}");
        assert!(script["id"].as_str().unwrap().ends_with("-v2"));
        // Named, so the document takes it once however often it arrives.
        assert_eq!(script["params"]["op"], json!("0123456789abcdef-2a"));
        assert_eq!(script["params"]["max_ops"], json!(request::MAX_OPS_PER_DOC));
        assert_eq!(a.body["scripted_upsert"], json!(true));
        assert_eq!(a.body["upsert"], json!({}));
    }
}

#[test]
fn the_painless_scripts_handle_the_traps() {
    for step in templates::steps(&names(), ES8)
        .iter()
        .filter(|s| s.kind == templates::Kind::Script)
    {
        let src = step.body["script"]["source"].as_str().unwrap();
        assert_eq!(step.body["script"]["lang"], "painless");
        if step.name.contains("actor-mark") {
            // No arithmetic on counts here: times are widened, `none` (not
            // `noop`) skips a write, the key comes from params, and a mark
            // is never created by a `set` (only settled).
            assert!(src.contains("((Number) params.now_ms).longValue()"));
            assert!(src.contains("((Number) params.stale_ms).longValue()"));
            assert!(src.contains("ctx.op = 'none'") && !src.contains("ctx.op = 'noop'"));
            assert!(src.contains("s.counter_id = params.counter_id") && !src.contains("ctx._id"));
            assert!(src.contains("s.counter_id == null"));
            continue;
        }
        // Integer params are widened, never added as int; a backfill's
        // difference may leave the long range and comes as a decimal string.
        let widened = if step.name.contains("counter-set") {
            "new BigInteger((String) params.delta)"
        } else {
            "((Number) params.delta).longValue()"
        };
        assert!(src.contains(widened), "{}", step.name);
        // Bounds checked by hand (Math.addExact is not on the allow-list).
        assert!(src.contains("Long.MAX_VALUE") && src.contains("Long.MIN_VALUE"));
        assert!(!src.contains("addExact"));
        assert!(src.contains("throw new IllegalArgumentException('counter_overflow:"));
        // Missing fields are null-checked before arithmetic; averages
        // widen and bound their quantity as well as their sum.
        if step.name.contains("average") {
            assert!(src.contains("s.sum == null") && src.contains("s.quantity == null"));
            assert!(src.contains("((Number) params.quantity).longValue()"));
            assert!(src.contains("quantity.compareTo(hi) > 0 || quantity.compareTo(lo) < 0"));
        } else {
            assert!(src.contains("s.value == null"));
        }
        // Key parts come from params (no ctx._id on older versions).
        assert!(src.contains("s.entity = params.entity") && !src.contains("ctx._id"));
        assert!(!src.contains("ctx.op = 'noop'"));
        if step.name.contains("-update-") {
            // A write it took already (the engine's replay on a new primary,
            // a resend) is skipped whole, before anything is changed, and
            // `none` is the skip every version knows.
            let check = src.find("ops.contains(params.op)").expect(&step.name);
            assert!(src[check..]
                .starts_with("ops.contains(params.op)) {\n  ctx.op = 'none';\n  return;"));
            assert!(check < src.find("BigInteger total").unwrap());
            assert!(src.contains("while (ops.size() > maxOps) { ops.remove(0); }"));
        }
    }
}

#[test]
fn setup_installs_exactly_the_expected_objects() {
    let steps = templates::steps(&names(), ES8);
    let expected = fixture_json("setup_steps.json");
    let expected = expected.as_array().unwrap();
    assert_eq!(steps.len(), expected.len());
    for (s, e) in steps.iter().zip(expected) {
        assert_eq!(s.path, e["path"].as_str().unwrap());
        let mut want = e["body"].clone();
        // Script sources are the files themselves, compared whole.
        if let Some(file) = want.pointer("/script/source").and_then(Value::as_str) {
            if let Some(file) = file.strip_prefix("file:") {
                let src =
                    std::fs::read_to_string(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(file))
                        .unwrap();
                want["script"]["source"] = json!(src);
            }
        }
        assert_eq!(s.body, want, "body of {}", s.path);
    }
}

#[test]
fn mappings_are_strict_and_typed() {
    for step in templates::steps(&names(), ES8)
        .iter()
        .filter(|s| s.kind == templates::Kind::ComponentTemplate)
    {
        let Some(m) = step.body.pointer("/template/mappings") else {
            continue;
        };
        assert_eq!(m["dynamic"], "strict", "{}", step.name);
        for (field, def) in m["properties"].as_object().unwrap() {
            let ty = def["type"].as_str().unwrap();
            let want = match field.as_str() {
                "counter_id" | "entity" | "action" | "uuid" | "category" => "keyword",
                // Actor marks: the order `export` lists them in.
                "counter_hash" | "mark" => "keyword",
                // Actor marks: their scope and state, and what is only read back.
                "scope" | "state" | "token" | "outcome" => "keyword",
                "value" | "sum" | "quantity" | "skipped_events" => "long",
                "first_timestamp" | "recorded_timestamp" | "day" | "since" => "date",
                // A target's publication time (milestones).
                "published" => "date",
                "average" => "double",
                "event_ids" | "set_days" | "last_set" => "object",
                // The last writes a counter or bucket took, only read back by its script.
                "applied_ops" => "keyword",
                // CountAPI's records (`countapi-mappings.json`).
                "kind" | "namespace" | "key" | "admin_key_sha256" => "keyword",
                "enable_reset" => "boolean",
                "update_lowerbound" | "update_upperbound" => "long",
                "created" => "date",
                other => panic!("unexpected field {other} in {}", step.name),
            };
            assert_eq!(ty, want, "{field} in {}", step.name);
        }
    }
    // No data streams: templates without a data_stream section.
    for step in templates::steps(&names(), ES8) {
        assert!(step.body.get("data_stream").is_none());
    }
}

#[test]
fn read_and_delete_bodies() {
    assert_eq!(
        request::target_query("VIDEO", "88d19b07"),
        fixture_json("target_query.json")
    );
    assert_eq!(
        request::buckets_of_counter_query("VIDEO_VIEW_88d19b07"),
        fixture_json("delete_buckets_query.json")
    );
}

#[test]
fn a_mixed_bulk_answer_is_classified_item_by_item() {
    let answer = fixture_json("responses/bulk_mixed.json");
    let items = response::parse_bulk(&answer, 6).unwrap();
    let classes: Vec<_> = items.iter().map(|i| &i.class).collect();
    assert_eq!(classes[0], &ItemClass::Done);
    assert!(
        matches!(classes[1], ItemClass::Retry(r) if r.contains("es_rejected_execution_exception"))
    );
    assert!(
        matches!(classes[2], ItemClass::Retry(r) if r.contains("version_conflict_engine_exception"))
    );
    assert!(
        matches!(classes[3], ItemClass::Retry(r) if r.contains("unavailable_shards_exception"))
    );
    assert!(matches!(classes[4], ItemClass::Overflow(r) if r.contains("signed 64-bit")));
    assert!(
        matches!(classes[5], ItemClass::Rejected(r) if r.contains("strict_dynamic_mapping_exception"))
    );
    // The first item asked for its source back and got the counter.
    let c = response::counter_from_source(items[0].source.as_ref().unwrap()).unwrap();
    assert_eq!(c.value, 3);
    assert_eq!(c.category.as_deref(), Some("sports"));
    // An answer with a different number of items is refused whole.
    assert!(response::parse_bulk(&answer, 5).is_err());
}

#[test]
fn a_refused_bulk_request_is_retried_or_rejected_whole() {
    let busy = fixture_json("responses/bulk_request_429.json");
    assert!(matches!(
        response::classify_request(429, &busy),
        ItemClass::Retry(_)
    ));
    let bad = fixture_json("responses/bulk_request_400.json");
    assert!(
        matches!(response::classify_request(400, &bad), ItemClass::Rejected(r) if r.contains("illegal_argument_exception"))
    );
}

#[test]
fn get_and_search_answers_become_counters() {
    let found = fixture_json("responses/get_found.json");
    let c = response::counter_from_get(200, &found).unwrap().unwrap();
    assert_eq!(&*c.key.action, "VIEW");
    assert_eq!(c.value, 42);
    assert_eq!(c.first_ms, 1_764_460_800_000);
    assert_eq!(
        response::counter_from_get(404, &fixture_json("responses/get_missing.json")).unwrap(),
        None
    );
    assert_eq!(
        response::counter_from_get(404, &fixture_json("responses/get_index_missing.json")).unwrap(),
        None
    );
    let hits =
        response::counters_from_search(&fixture_json("responses/search_target.json")).unwrap();
    let actions: Vec<_> = hits.iter().map(|c| c.key.action.to_string()).collect();
    assert_eq!(actions, ["VIEW", "like"]);
}
