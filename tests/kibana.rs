//! The Kibana objects of `index-templates/kibana/`: saved objects in the
//! documented NDJSON shape whose references resolve, whose field names all
//! exist in the strict mappings of `index-templates/component/` (so the two
//! cannot drift apart), and `setup --kibana-url`'s import request, checked
//! against a local fake Kibana.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::routing::post;
use axum::Router;
use counter_gateway::kibana::{saved_objects, BOUNDARY, SAVED_OBJECTS};
use serde_json::{json, Value};

fn objects() -> Vec<Value> {
    SAVED_OBJECTS
        .lines()
        .enumerate()
        .map(|(i, l)| {
            serde_json::from_str(l).unwrap_or_else(|e| panic!("line {}: {e}: {l}", i + 1))
        })
        .collect()
}

/// A JSON document kept as a string inside an attribute (Kibana's way).
fn inner(o: &Value, pointer: &str) -> Value {
    let raw = o
        .pointer(pointer)
        .and_then(Value::as_str)
        .unwrap_or_else(|| panic!("{} has no {pointer}", o["id"]));
    serde_json::from_str(raw).unwrap_or_else(|e| panic!("{} {pointer}: {e}", o["id"]))
}

#[test]
fn the_file_is_ndjson_of_saved_objects_whose_references_resolve() {
    assert!(SAVED_OBJECTS.ends_with('\n'));
    let objs = objects();
    let mut ids = HashMap::new();
    for o in &objs {
        for k in ["type", "id", "attributes", "references"] {
            assert!(o.get(k).is_some(), "{o} has no {k}");
        }
        assert!(o["attributes"]["title"].is_string(), "{o}");
        let prev = ids.insert(o["id"].as_str().unwrap().to_string(), o["type"].clone());
        assert!(prev.is_none(), "id {} twice", o["id"]);
    }
    let mut types: Vec<&str> = objs.iter().map(|o| o["type"].as_str().unwrap()).collect();
    types.sort_unstable();
    types.dedup();
    assert_eq!(
        types,
        ["dashboard", "index-pattern", "search", "visualization"]
    );
    for o in &objs {
        let refs = o["references"].as_array().expect("references");
        let names: BTreeSet<&str> = refs.iter().map(|r| r["name"].as_str().unwrap()).collect();
        for r in refs {
            let id = r["id"].as_str().unwrap();
            assert_eq!(ids.get(id), Some(&r["type"]), "{} refers to {r}", o["id"]);
        }
        match o["type"].as_str().unwrap() {
            "visualization" | "search" => {
                let source = inner(o, "/attributes/kibanaSavedObjectMeta/searchSourceJSON");
                let name = source["indexRefName"].as_str().expect("indexRefName");
                assert!(names.contains(name), "{}: {name}", o["id"]);
            }
            "dashboard" => {
                let panels = inner(o, "/attributes/panelsJSON");
                let panels = panels.as_array().unwrap();
                assert_eq!(panels.len(), 4, "top, histogram, averages, stale");
                for p in panels {
                    let pi = p["panelIndex"].as_str().unwrap();
                    let name = format!("{pi}:{}", p["panelRefName"].as_str().unwrap());
                    assert!(names.contains(name.as_str()), "panel {p}");
                }
            }
            _ => {}
        }
    }
}

/// The mapped fields of a component template under index-templates/component/.
fn mapping(file: &str) -> HashMap<String, Value> {
    let path = format!(
        "{}/index-templates/component/{file}",
        env!("CARGO_MANIFEST_DIR")
    );
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    assert_eq!(v["template"]["mappings"]["dynamic"], "strict", "{file}");
    v["template"]["mappings"]["properties"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// Field names a KQL query compares (`field < x`, `field: x`).
fn kql_fields(q: &str) -> Vec<String> {
    let mut out = Vec::new();
    let words: Vec<&str> = q.split_whitespace().collect();
    for (i, w) in words.iter().enumerate() {
        if let Some(f) = w.strip_suffix(':') {
            out.push(f.to_string());
        } else if matches!(words.get(i + 1), Some(&("<" | "<=" | ">" | ">="))) {
            out.push(w.to_string());
        }
    }
    out
}

#[test]
fn every_field_the_objects_use_is_mapped_for_their_indices() {
    let objs = objects();
    // Which mapping a data view reads, by the collection its title names.
    let mut views = HashMap::new();
    for o in objs.iter().filter(|o| o["type"] == "index-pattern") {
        let title = o["attributes"]["title"].as_str().unwrap();
        let first = title.split(',').next().unwrap();
        let file = if first.ends_with("_average_counters") {
            "average-mappings.json"
        } else if first.ends_with("_histogram_counters-*") {
            "bucket-mappings.json"
        } else if first.ends_with("_counters") {
            "counter-mappings.json"
        } else {
            panic!("data view over an unknown collection: {title}")
        };
        // `<p>_*_counters` also matches `<p>_x_average_counters`: excluded.
        if file != "average-mappings.json" {
            assert!(title.contains(",-counter-gateway_*_average_"), "{title}");
        }
        let m = mapping(file);
        match o["attributes"].get("timeFieldName") {
            Some(t) => {
                assert_eq!(
                    file, "bucket-mappings.json",
                    "only buckets have a time field"
                );
                assert_eq!(m[t.as_str().unwrap()]["type"], "date");
            }
            None => assert_ne!(file, "bucket-mappings.json", "buckets are dated by `day`"),
        }
        views.insert(o["id"].as_str().unwrap().to_string(), m);
    }
    assert_eq!(views.len(), 3);
    let mut checked = 0;
    for o in objs
        .iter()
        .filter(|o| o["type"] == "visualization" || o["type"] == "search")
    {
        let view = o["references"][0]["id"].as_str().unwrap();
        let m = &views[view];
        let source = inner(o, "/attributes/kibanaSavedObjectMeta/searchSourceJSON");
        let mut fields = kql_fields(source["query"]["query"].as_str().unwrap_or(""));
        if o["type"] == "visualization" {
            let vis = inner(o, "/attributes/visState");
            for agg in vis["aggs"].as_array().unwrap() {
                if let Some(f) = agg["params"]["field"].as_str() {
                    fields.push(f.to_string());
                }
            }
        } else {
            for c in o["attributes"]["columns"].as_array().unwrap() {
                fields.push(c.as_str().unwrap().to_string());
            }
            for s in o["attributes"]["sort"].as_array().unwrap() {
                fields.push(s[0].as_str().unwrap().to_string());
            }
        }
        assert!(!fields.is_empty(), "{}", o["id"]);
        for f in fields {
            let t = m
                .get(&f)
                .unwrap_or_else(|| panic!("{}: field {f} is not in the mapping", o["id"]));
            // Aggregatable and searchable: not the unindexed bookkeeping fields.
            assert!(
                ["keyword", "long", "double", "date"].contains(&t["type"].as_str().unwrap_or("")),
                "{}: {f} is {t}",
                o["id"]
            );
            checked += 1;
        }
    }
    assert!(checked >= 15, "{checked}");
}

#[test]
fn kql_fields_are_found() {
    assert_eq!(
        kql_fields("recorded_timestamp < \"now-30d\" and entity: VIDEO"),
        ["recorded_timestamp", "entity"]
    );
}

/// One request the fake Kibana received.
#[derive(Clone, Debug)]
struct Seen {
    uri: String,
    headers: HeaderMap,
    body: Bytes,
}

/// A fake Kibana on port 0 answering every import with `answer`; returns
/// its URL and what it received.
async fn fake_kibana(status: StatusCode, answer: Value) -> (String, Arc<Mutex<Vec<Seen>>>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    let app = Router::new().route(
        "/api/saved_objects/_import",
        post(move |uri: Uri, headers: HeaderMap, body: Bytes| {
            let log = log.clone();
            let answer = answer.clone();
            async move {
                log.lock().unwrap().push(Seen {
                    uri: uri.to_string(),
                    headers,
                    body,
                });
                (status, axum::Json(answer))
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (url, seen)
}

/// Runs `counter-gateway setup <args>`; answers (success, stderr).
async fn setup(args: Vec<String>) -> (bool, String) {
    tokio::task::spawn_blocking(move || {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_counter-gateway"))
            .arg("setup")
            .args(&args)
            .env_remove("COUNTER_GATEWAY_ELASTICSEARCH_URL")
            .env("NO_PROXY", "127.0.0.1")
            .output()
            .expect("run counter-gateway setup");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    })
    .await
    .unwrap()
}

/// The one file part of a multipart body: (part headers, content).
fn file_part(content_type: &str, body: &[u8]) -> (String, String) {
    let boundary = content_type
        .strip_prefix("multipart/form-data; boundary=")
        .expect("a multipart content type");
    let body = std::str::from_utf8(body).expect("a UTF-8 body");
    let delimiter = format!("--{boundary}");
    let parts: Vec<&str> = body.split(delimiter.as_str()).collect();
    // Preamble (empty), the one part, then the closing `--\r\n`.
    assert_eq!(parts.len(), 3, "{body}");
    assert_eq!(parts[0], "");
    assert_eq!(parts[2], "--\r\n");
    let part = parts[1]
        .strip_prefix("\r\n")
        .and_then(|p| p.strip_suffix("\r\n"))
        .expect("CRLF around the part");
    let (head, content) = part.split_once("\r\n\r\n").expect("part headers");
    (head.to_string(), content.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn setup_imports_the_objects_with_the_prefix_into_kibana_idempotently() {
    let (url, seen) = fake_kibana(
        StatusCode::OK,
        json!({"success": true, "successCount": 8, "successResults": []}),
    )
    .await;
    let args: Vec<String> = [
        "--kibana-url",
        &format!("{url}/"),
        "--index-prefix",
        "acme",
        "--elasticsearch-username",
        "elastic",
        "--elasticsearch-password",
        "pw",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    for _ in 0..2 {
        let (ok, stderr) = setup(args.clone()).await;
        assert!(ok, "{stderr}");
    }
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 2, "one import per run");
    for s in &seen {
        assert_eq!(s.uri, "/api/saved_objects/_import?overwrite=true");
        assert_eq!(s.headers["kbn-xsrf"], "true");
        // elastic:pw
        assert_eq!(s.headers["authorization"], "Basic ZWxhc3RpYzpwdw==");
        let ct = s.headers["content-type"].to_str().unwrap();
        assert_eq!(ct, format!("multipart/form-data; boundary={BOUNDARY}"));
        let (head, content) = file_part(ct, &s.body);
        assert!(
            head.contains("Content-Disposition: form-data; name=\"file\"; filename=\"counter-gateway.ndjson\""),
            "{head}"
        );
        assert_eq!(content, saved_objects("acme").unwrap());
        assert!(content.contains("\"title\":\"acme_*_histogram_counters-*"));
        assert!(!content.contains("counter-gateway"));
    }
    assert_eq!(seen[0].body, seen[1].body, "the same import every time");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn setup_fails_saying_what_kibana_refused() {
    let (url, _) = fake_kibana(
        StatusCode::OK,
        json!({"success": false, "successCount": 7, "errors": [
            {"id": "counter-gateway-overview", "type": "dashboard", "error": {"type": "missing_references"}}
        ]}),
    )
    .await;
    let (ok, stderr) = setup(vec!["--kibana-url".into(), url]).await;
    assert!(!ok);
    assert!(
        stderr.contains("dashboard counter-gateway-overview: missing_references"),
        "{stderr}"
    );

    let (url, _) = fake_kibana(StatusCode::FORBIDDEN, json!({"message": "no"})).await;
    let (ok, stderr) = setup(vec!["--kibana-url".into(), url]).await;
    assert!(!ok);
    assert!(stderr.contains("Kibana answered 403"), "{stderr}");

    let (ok, stderr) = setup(vec![]).await;
    assert!(!ok);
    assert!(stderr.contains("--kibana-url"), "{stderr}");
}
