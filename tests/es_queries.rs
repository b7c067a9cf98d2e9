//! Contract tests of the Elasticsearch read queries and of average sample
//! writes: each request body compared as JSON with the expected file under
//! `tests/fixtures/es/queries/`, and each parser fed answers in the shapes
//! the Elasticsearch reference documents (`tests/fixtures/es/responses/`).

use std::path::PathBuf;

use chrono::{DateTime, Utc};
use counter_gateway::domain::{
    CounterKey, Increment, IncrementSpec, SampleSpec, TimePolicy, Window,
};
use counter_gateway::store::elasticsearch::query::{self, CategoryFilter};
use counter_gateway::store::elasticsearch::request::{self, IndexNames, Target, WriteSettings};
use counter_gateway::store::elasticsearch::templates;
use counter_gateway::store::{
    AverageEntry, Bucket, StaleQuery, TopAveragesQuery, TopEntry, TopQuery, UnusedPair,
};
use serde_json::{json, Value};

fn fixture(name: &str) -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/es")
        .join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
}

/// The engine the contract fixtures describe (with ILM).
const ES8: counter_gateway::store::elasticsearch::templates::Engine =
    counter_gateway::store::elasticsearch::templates::Engine::Elasticsearch {
        major: 8,
        minor: 15,
        ilm: true,
    };

fn fixture_json(name: &str) -> Value {
    serde_json::from_str(&fixture(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// A body equals its expected file, compared as JSON.
fn assert_body(actual: &Value, expected_file: &str) {
    let want = fixture_json(&format!("queries/{expected_file}"));
    assert_eq!(
        actual,
        &want,
        "body differs from queries/{expected_file}; got:\n{}",
        serde_json::to_string_pretty(actual).unwrap()
    );
}

/// 2026-11-30
const GIVEN_DAY: i64 = 20_787;

fn now() -> DateTime<Utc> {
    "2026-11-30T12:00:00Z".parse().unwrap()
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

fn sample(uuid: &str, value: i64, retract: bool, ts: &str, id: Option<&str>) -> Increment {
    let spec = SampleSpec {
        entity: "ARTICLE",
        action: "rating",
        uuid,
        value,
        retract,
        category: Some("tech"),
        timestamp: Some(ts),
        id,
    };
    Increment::sample(&spec, &TimePolicy::default(), now()).unwrap()
}

fn increment(uuid: &str, count: i64) -> Increment {
    let spec = IncrementSpec {
        entity: "ARTICLE",
        action: "rating",
        uuid,
        count: Some(count),
        timestamp: Some("2026-11-30T10:00:00Z"),
        ..Default::default()
    };
    Increment::from_spec(&spec, &TimePolicy::default(), now()).unwrap()
}

fn week() -> Window {
    Window {
        from_day: GIVEN_DAY - 6,
        to_day: GIVEN_DAY,
    }
}

// ---------------------------------------------------------------------------
// Average writes
// ---------------------------------------------------------------------------

/// Two samples of one average coalesce into one scripted upsert (sum 9,
/// quantity 2) plus a day bucket; a retraction with an id travels on its own
/// with quantity -1; a counter of the same key stays a separate document.
#[test]
fn average_samples_are_scripted_upserts_of_their_own_documents() {
    let requests = [
        vec![sample("a1", 4, false, "2026-11-30T10:00:00Z", None)],
        vec![
            sample("a1", 5, false, "2026-11-30T11:00:00Z", None),
            increment("a1", 1),
        ],
        vec![sample("a1", 1, true, "2026-11-27T09:00:00Z", Some("r-1"))],
    ];
    let slices: Vec<&[Increment]> = requests.iter().map(Vec::as_slice).collect();
    let plan = request::plan(&slices, i64::MAX).unwrap();
    let targets: Vec<Target> = plan.writes.iter().map(|w| w.target).collect();
    assert_eq!(
        targets,
        [
            Target::Average,
            Target::AverageBucket(GIVEN_DAY),
            Target::AverageBucket(GIVEN_DAY - 3),
            Target::Counter,
            Target::Bucket(GIVEN_DAY),
        ]
    );
    assert_eq!((plan.writes[0].delta, plan.writes[0].quantity), (9, 2));
    assert_eq!(plan.writes[0].events[0].quantity, -1);
    assert_eq!(plan.writes[3].quantity, 0);
    let actions: Vec<_> = plan
        .writes
        .iter()
        .map(|w| request::action(w, &names(), &settings(), "0123456789abcdef-2a", false))
        .collect();
    let refs: Vec<_> = actions.iter().collect();
    let body = String::from_utf8(request::bulk_body(&refs, 5)).unwrap();
    let expected = fixture("bulk_averages.ndjson");
    let got: Vec<Value> = body
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let want: Vec<Value> = expected
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(got.len(), want.len(), "{body}");
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(g, w, "line {i} of bulk_averages.ndjson differs");
    }
}

#[test]
fn an_average_undo_takes_back_sum_and_quantity() {
    let requests = [vec![
        sample("a1", 4, false, "2026-11-30T10:00:00Z", None),
        sample("a1", 2, true, "2026-11-30T10:00:00Z", Some("r-1")),
        sample("a1", 3, false, "2026-11-30T10:00:00Z", Some("s-2")),
    ]];
    let slices: Vec<&[Increment]> = requests.iter().map(Vec::as_slice).collect();
    let plan = request::plan(&slices, i64::MAX).unwrap();
    let w = &plan.writes[0];
    // The script skipped id event 0 ("r-1") as already counted.
    let undo = w.undo(&[0]);
    assert_eq!((undo.delta, undo.quantity), (-4 - 3, -1 - 1));
    assert_eq!(undo.forget.len(), 1);
    assert_eq!(&*undo.forget[0], "s-2");
}

#[test]
fn a_flush_whose_sample_sum_leaves_i64_goes_one_by_one() {
    let requests = [
        vec![sample("big", i64::MAX, false, "2026-11-30T10:00:00Z", None)],
        vec![sample("big", 1, false, "2026-11-30T10:00:00Z", None)],
    ];
    let slices: Vec<&[Increment]> = requests.iter().map(Vec::as_slice).collect();
    let err = request::plan(&slices, i64::MAX).unwrap_err();
    assert_eq!(err.0, CounterKey::new("ARTICLE", "rating", "big").unwrap());
}

#[test]
fn the_average_scripts_keep_the_quotient_for_sorting() {
    let steps = templates::steps(&names(), ES8);
    let avg = steps
        .iter()
        .find(|s| s.name == "counter-gateway-average-update-v2")
        .expect("average script installed");
    let src = avg.body["script"]["source"].as_str().unwrap();
    assert!(src.contains("s.average = (double) total.longValue() / (double) quantity.longValue()"));
    assert!(
        src.contains("s.remove('average')"),
        "no quotient while quantity is 0"
    );
    assert!(src.contains("e[5]"), "id events carry their quantity");
    let bucket = steps
        .iter()
        .find(|s| s.name == "counter-gateway-average-bucket-update-v2")
        .expect("average bucket script installed");
    let src = bucket.body["script"]["source"].as_str().unwrap();
    assert!(src.contains("s.day = params.day") && !src.contains("average ="));
}

// ---------------------------------------------------------------------------
// Indices of a window
// ---------------------------------------------------------------------------

#[test]
fn a_window_reads_only_the_months_it_overlaps() {
    let n = names();
    let one = n.window_buckets(week(), false);
    assert_eq!(one.months, 1);
    assert_eq!(
        one.path,
        "counter-gateway_default_histogram_counters-2026.11"
    );
    let across = Window {
        from_day: GIVEN_DAY - 6,
        to_day: GIVEN_DAY + 2,
    };
    let two = n.window_buckets(across, true);
    assert_eq!(two.months, 2);
    assert_eq!(
        two.path,
        "counter-gateway_default_average_histogram_counters-2026.11,counter-gateway_default_average_histogram_counters-2026.12"
    );
    // last_year (365 days) from 2026-11-30 starts 2025-12-01: 12 months.
    let year = Window {
        from_day: GIVEN_DAY - 364,
        to_day: GIVEN_DAY,
    };
    assert_eq!(n.window_buckets(year, false).months, 12);
    let year_and_a_day = Window {
        from_day: GIVEN_DAY - 365,
        to_day: GIVEN_DAY,
    };
    assert_eq!(n.window_buckets(year_and_a_day, false).months, 13);
    let long = Window {
        from_day: GIVEN_DAY - 3000,
        to_day: GIVEN_DAY,
    };
    let all = n.window_buckets(long, false);
    assert!(all.months > request::MAX_NAMED_MONTHS);
    assert_eq!(all.path, "counter-gateway_default_histogram_counters-*");
}

// ---------------------------------------------------------------------------
// Query bodies
// ---------------------------------------------------------------------------

fn top(window: Option<Window>, category: Option<&str>, size: usize) -> TopQuery {
    TopQuery {
        entity: "VIDEO".into(),
        action: "VIEW".into(),
        window,
        category: category.map(str::to_string),
        size,
    }
}

#[test]
fn histogram_and_average_window_bodies() {
    assert_body(
        &query::buckets_query("VIDEO_VIEW_x", week(), &["day", "value"]),
        "histogram.json",
    );
    assert_body(
        &query::buckets_query("ARTICLE_rating_a1", week(), &["day", "sum", "quantity"]),
        "average_window.json",
    );
}

#[test]
fn top_list_bodies() {
    assert_body(
        &query::top_all_time_query(&top(None, Some("sports"), 10)),
        "top_all_time.json",
    );
    assert_body(
        &query::top_window_query(
            &top(Some(week()), None, 10),
            week(),
            &CategoryFilter::None,
            true,
        ),
        "top_window_one_month.json",
    );
    let uuids = CategoryFilter::Uuids(vec!["a".into(), "x".into()]);
    assert_body(
        &query::top_window_query(
            &top(Some(week()), Some("sports"), 10),
            week(),
            &uuids,
            false,
        ),
        "top_window_months_category.json",
    );
    assert_body(
        &query::category_uuids_query("VIDEO", "VIEW", "sports"),
        "category_uuids.json",
    );
}

#[test]
fn stale_bodies_page_with_search_after() {
    let mut q = StaleQuery {
        entity: Some("PAGE".into()),
        action: None,
        before_ms: 1_793_404_800_000,
        after: None,
        limit: 3,
    };
    assert_body(&query::stale_query(&q), "stale_first.json");
    q.after = Some((
        1_791_849_600_000,
        CounterKey::new("PAGE", "VIEW", "p2").unwrap(),
    ));
    assert_body(&query::stale_query(&q), "stale_after.json");
}

#[test]
fn unused_bodies_page_a_composite_aggregation() {
    assert_body(&query::unused_query(None), "unused_first.json");
    let after = json!({"entity": "OLD", "action": "VIEW"});
    assert_body(&query::unused_query(Some(&after)), "unused_after.json");
}

#[test]
fn top_average_bodies() {
    let mut q = TopAveragesQuery {
        entity: "ARTICLE".into(),
        action: "rating".into(),
        window: None,
        category: None,
        min_quantity: 2,
        size: 10,
        rank: counter_gateway::domain::rank::Rank::Average,
    };
    assert_body(
        &query::top_averages_all_time_query(&q),
        "top_averages_all_time.json",
    );
    q.window = Some(week());
    let after = json!({"uuid": "a4"});
    assert_body(
        &query::top_averages_window_query(&q, week(), &CategoryFilter::None, Some(&after)),
        "top_averages_window.json",
    );
}

/// A ranked list walks every average of the pair in uuid order, by
/// `search_after` (a windowed one uses the composite pages above).
#[test]
fn ranked_average_bodies_walk_by_uuid() {
    let q = TopAveragesQuery {
        entity: "ARTICLE".into(),
        action: "rating".into(),
        window: None,
        category: Some("tech".into()),
        min_quantity: 2,
        size: 10,
        rank: counter_gateway::domain::rank::Rank::Bayesian { prior_weight: 5.0 },
    };
    let first = query::ranked_averages_all_time_query(&q, None);
    assert!(first.get("search_after").is_none());
    assert_body(
        &query::ranked_averages_all_time_query(&q, Some("a4")),
        "ranked_averages_all_time_after.json",
    );
}

// ---------------------------------------------------------------------------
// Answers
// ---------------------------------------------------------------------------

#[test]
fn bucket_hits_become_days_and_sums() {
    let b = query::buckets_from_search(&fixture_json("responses/search_buckets.json")).unwrap();
    assert_eq!(
        b,
        [
            Bucket {
                day: GIVEN_DAY - 2,
                value: 1
            },
            Bucket {
                day: GIVEN_DAY,
                value: -2
            }
        ]
    );
    // Sums of average buckets are taken exactly, past what a double holds
    // and past i64.
    let (sum, quantity) =
        query::average_window_from_search(&fixture_json("responses/search_average_buckets.json"))
            .unwrap();
    assert_eq!((sum, quantity), (i128::from(i64::MAX) - 9, 3));
    // Past i64 (each bucket in range, their sum not): exact all the same.
    let mut over = fixture_json("responses/search_average_buckets.json");
    over["hits"]["hits"][2]["_source"]["sum"] = json!(9);
    assert_eq!(
        query::average_window_from_search(&over).unwrap(),
        (i128::from(i64::MAX) + 9, 3)
    );
}

#[test]
fn top_hits_and_terms_become_entries() {
    let e = query::top_from_search(&fixture_json("responses/search_top.json")).unwrap();
    assert_eq!(
        e,
        [
            TopEntry {
                uuid: "x".into(),
                value: 101,
                category: Some("sports".into())
            },
            TopEntry {
                uuid: "old".into(),
                value: 50,
                category: None
            },
        ]
    );
    let t = query::window_top_from_aggs(&fixture_json("responses/terms_top.json")).unwrap();
    let order: Vec<(&str, i128)> = t.entries.iter().map(|(u, v)| (u.as_str(), *v)).collect();
    assert_eq!(order, [("y", 6), ("t", 4), ("z", 4), ("x", 1)]);
    assert!(t.sums_exact);
    assert_eq!(t.sum_other_doc_count, 0);
    // Terms left out and a sum past 2^53: the parser says so.
    let t =
        query::window_top_from_aggs(&fixture_json("responses/terms_top_truncated.json")).unwrap();
    assert_eq!(t.sum_other_doc_count, 3);
    assert!(!t.sums_exact);
    let (uuids, complete) =
        query::uuids_from_search(&fixture_json("responses/search_category_uuids.json")).unwrap();
    assert_eq!(uuids, ["a", "x"]);
    assert!(complete);
    let mut more = fixture_json("responses/search_category_uuids.json");
    more["hits"]["total"] = json!({"value": 10_000, "relation": "gte"});
    assert!(!query::uuids_from_search(&more).unwrap().1);
}

#[test]
fn mget_answers_give_categories_of_found_documents() {
    let found = query::found_from_mget(&fixture_json("responses/mget_categories.json")).unwrap();
    let ids: Vec<&str> = found.iter().map(|(id, _)| id.as_str()).collect();
    assert_eq!(ids, ["VIDEO_VIEW_y", "VIDEO_VIEW_x"]);
    let c = query::categories_by_uuid(&found);
    assert_eq!(c.get("y"), Some(&Value::Null));
    assert_eq!(c.get("x"), Some(&json!("sports")));
    assert_eq!(c.get("gone"), None);
}

#[test]
fn composite_pages_give_unused_pairs_with_exact_totals() {
    let p1 = fixture_json("responses/composite_unused_page1.json");
    let (buckets, after) = query::composite_page(&p1, "pairs").unwrap();
    assert_eq!(after, Some(&json!({"entity": "OLD", "action": "VIEW"})));
    // Cut-off 2026-11-01: NEW/VIEW (touched 2026-11-30) is in use.
    let cutoff = 1_793_491_200_000;
    let pairs = query::unused_page(buckets, cutoff).unwrap();
    assert_eq!(
        pairs,
        [UnusedPair {
            entity: "OLD".into(),
            action: "VIEW".into(),
            last_ms: 1_793_358_000_000,
            total: i128::from(i64::MAX) + 17,
            counters: 3,
        }]
    );
    let p2 = fixture_json("responses/composite_unused_page2.json");
    let (buckets, _) = query::composite_page(&p2, "pairs").unwrap();
    let mut all = pairs;
    all.extend(query::unused_page(buckets, i64::MAX).unwrap());
    query::sort_unused(&mut all);
    let order: Vec<(&str, &str, i128)> = all
        .iter()
        .map(|p| (p.entity.as_str(), p.action.as_str(), p.total))
        .collect();
    assert_eq!(
        order,
        [
            ("PAGE", "VIEW", 10),
            ("OLD", "VIEW", i128::from(i64::MAX) + 17),
            ("PAGE", "like", 10)
        ]
    );
    // An empty page ends the paging even if an after_key came with it.
    let empty = fixture_json("responses/composite_empty.json");
    let (b, after) = query::composite_page(&empty, "pairs").unwrap();
    assert!(b.is_empty() && after.is_none());
}

#[test]
fn averages_are_read_and_ranked_like_the_embedded_store() {
    let key = CounterKey::new("ARTICLE", "rating", "a1").unwrap();
    let a = query::average_from_get(&key, 200, &fixture_json("responses/get_average.json"))
        .unwrap()
        .unwrap();
    assert_eq!(
        (a.sum, a.quantity, a.category.as_deref()),
        (9, 2, Some("tech"))
    );
    assert_eq!(a.first_ms, 1_795_737_600_000);
    assert_eq!(
        query::average_from_get(&key, 404, &fixture_json("responses/get_missing.json")).unwrap(),
        None
    );
    let top = query::top_averages_from_search(&fixture_json("responses/search_top_averages.json"))
        .unwrap();
    assert_eq!(top[1].category.as_deref(), Some("tech"));
    let page = fixture_json("responses/composite_averages.json");
    let (buckets, after) = query::composite_page(&page, "averages").unwrap();
    assert_eq!(after, Some(&json!({"uuid": "a4"})));
    let (rows, exact) = query::averages_page(buckets).unwrap();
    assert!(exact);
    let mut entries: Vec<AverageEntry> = rows
        .into_iter()
        .map(|(uuid, sum, quantity)| AverageEntry {
            uuid,
            sum,
            quantity,
            category: None,
            score: None,
        })
        .collect();
    query::rank_averages(&mut entries, 10);
    let order: Vec<(&str, i128, i128)> = entries
        .iter()
        .map(|e| (e.uuid.as_str(), e.sum, e.quantity))
        .collect();
    assert_eq!(
        order,
        [("a3", 5, 1), ("a1", 9, 2), ("a4", 8, 2), ("a2", 3, 1)]
    );
}

/// Every field a stored script writes exists in the strict mapping of the
/// documents it writes, so no update is refused as a new field at run time.
#[test]
fn scripts_write_only_mapped_fields() {
    let steps = templates::steps(&names(), ES8);
    let mapping = |component: &str| -> Vec<String> {
        let step = steps
            .iter()
            .find(|s| s.name == format!("counter-gateway-{component}"))
            .unwrap_or_else(|| panic!("no component {component}"));
        step.body["template"]["mappings"]["properties"]
            .as_object()
            .unwrap()
            .keys()
            .cloned()
            .collect()
    };
    for (script, component) in [
        ("counter-update", "counter-mappings"),
        ("bucket-update", "bucket-mappings"),
        ("average-update", "average-mappings"),
        ("average-bucket-update", "average-bucket-mappings"),
    ] {
        let step = steps
            .iter()
            .find(|s| s.name == format!("counter-gateway-{script}-v2"))
            .unwrap();
        let src = step.body["script"]["source"].as_str().unwrap();
        let fields = mapping(component);
        let mut written = Vec::new();
        for part in src.split("s.").skip(1) {
            let name: String = part
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if part[name.len()..].trim_start().starts_with('=')
                && !part[name.len()..].trim_start().starts_with("==")
            {
                written.push(name);
            }
        }
        assert!(written.len() >= 6, "{script}: found {written:?}");
        for f in &written {
            assert!(
                fields.contains(f),
                "{script} writes {f}, not in {component}"
            );
        }
    }
}

/// A search whose index pattern matches no index (a new tenant, a window
/// before any data) answers with zero shards and no `aggregations` key: the
/// shape captured from OpenSearch 2.19.6, which Elasticsearch's source also
/// produces. Empty data is an empty list, not an error.
#[test]
fn a_search_over_no_index_reads_as_empty() {
    let answer = fixture_json("responses/search_no_index.json");
    let top = query::window_top_from_aggs(&answer).unwrap();
    assert!(top.entries.is_empty());
    assert_eq!(top.sum_other_doc_count, 0);
    let (buckets, after) = query::composite_page(&answer, "pairs").unwrap();
    assert!(buckets.is_empty() && after.is_none());
    // With shards searched, a missing aggregation is still an error.
    let mut broken = answer.clone();
    broken["_shards"]["total"] = json!(1);
    assert!(query::window_top_from_aggs(&broken).is_err());
    assert!(query::composite_page(&broken, "pairs").is_err());
}

/// `GET /` of the test node: OpenSearch, detected as such (no ILM there).
#[test]
fn the_engine_is_detected_from_the_root_answer() {
    use counter_gateway::store::elasticsearch::templates::Engine;
    let os = Engine::from_root(&fixture_json("responses/root_opensearch.json")).unwrap();
    assert_eq!(
        os,
        Engine::OpenSearch {
            major: 2,
            minor: 19
        }
    );
    assert!(!os.has_ilm());
    let es = Engine::from_root(&fixture_json("responses/root.json")).unwrap();
    assert!(es.has_ilm(), "{es}");
}
