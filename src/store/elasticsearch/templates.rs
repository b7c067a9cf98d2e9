//! The files of `index-templates/` (stored scripts, ILM policy, component and
//! composable index templates), named after the index prefix and installed
//! idempotently: each carries a version, an installed copy at the same or a
//! newer version is left alone, an older one is replaced. What is installed
//! depends on the [`Engine`]: OpenSearch and Elasticsearch's OSS build have
//! no ILM (they refuse the policy endpoint and the `index.lifecycle.name`
//! setting).

use serde_json::{json, Value};

use super::request::IndexNames;

/// Bumped with any change to the scripts' behaviour; part of their ids, so
/// gateways of two versions can run side by side during an upgrade.
pub const SCRIPT_VERSION: u32 = 1;

/// The four update scripts' version (counters, averages and their day
/// buckets): 2 remembers the last writes a document took (`applied_ops`),
/// so a replayed or resent bulk item is taken once.
pub const UPDATE_SCRIPT_VERSION: u32 = 2;

/// The actor mark script's own version: 2 writes `counter_hash` and `mark`
/// (the order `export` lists marks in), which 1 did not.
pub const ACTOR_MARK_SCRIPT_VERSION: u32 = 2;

const COUNTER_SCRIPT: &str =
    include_str!("../../../index-templates/scripts/counter-update.painless");
const BUCKET_SCRIPT: &str = include_str!("../../../index-templates/scripts/bucket-update.painless");
const AVERAGE_SCRIPT: &str =
    include_str!("../../../index-templates/scripts/average-update.painless");
const AVERAGE_BUCKET_SCRIPT: &str =
    include_str!("../../../index-templates/scripts/average-bucket-update.painless");
const COUNTER_SET_SCRIPT: &str =
    include_str!("../../../index-templates/scripts/counter-set.painless");
const ACTOR_MARK_SCRIPT: &str =
    include_str!("../../../index-templates/scripts/actor-mark.painless");
const ILM_BUCKETS: &str = include_str!("../../../index-templates/ilm/bucket-retention.json");

const COMPONENTS: &[(&str, &str)] = &[
    (
        "settings",
        include_str!("../../../index-templates/component/settings.json"),
    ),
    (
        "counter-mappings",
        include_str!("../../../index-templates/component/counter-mappings.json"),
    ),
    (
        "bucket-mappings",
        include_str!("../../../index-templates/component/bucket-mappings.json"),
    ),
    (
        "average-mappings",
        include_str!("../../../index-templates/component/average-mappings.json"),
    ),
    (
        "average-bucket-mappings",
        include_str!("../../../index-templates/component/average-bucket-mappings.json"),
    ),
    (
        "actor-mark-mappings",
        include_str!("../../../index-templates/component/actor-mark-mappings.json"),
    ),
    (
        "target-mappings",
        include_str!("../../../index-templates/component/target-mappings.json"),
    ),
    (
        "countapi-mappings",
        include_str!("../../../index-templates/component/countapi-mappings.json"),
    ),
];

/// `(collection, time-based?, file)`.
const INDEX_TEMPLATES: &[(&str, bool, &str)] = &[
    (
        "counters",
        false,
        include_str!("../../../index-templates/index/counters.json"),
    ),
    (
        "histogram_counters",
        true,
        include_str!("../../../index-templates/index/histogram_counters.json"),
    ),
    (
        "average_counters",
        false,
        include_str!("../../../index-templates/index/average_counters.json"),
    ),
    (
        "average_histogram_counters",
        true,
        include_str!("../../../index-templates/index/average_histogram_counters.json"),
    ),
    (
        "actor_marks",
        false,
        include_str!("../../../index-templates/index/actor_marks.json"),
    ),
    (
        "actor_day_marks",
        true,
        include_str!("../../../index-templates/index/actor_day_marks.json"),
    ),
    (
        "targets",
        false,
        include_str!("../../../index-templates/index/targets.json"),
    ),
    (
        "countapi",
        false,
        include_str!("../../../index-templates/index/countapi.json"),
    ),
    (
        "hour_counters",
        true,
        include_str!("../../../index-templates/index/hour_counters.json"),
    ),
];

/// The time-based collection that no ILM policy retires: hour buckets.
/// ILM's `min_age` counts from an index's creation, which for a monthly
/// index made ahead of its writes is up to a month before its first day,
/// so one policy cannot follow `--hourly-retention-days` (14 by default)
/// without deleting hours still asked for or keeping them weeks longer;
/// the gateway deletes expired hour indices itself, on every engine
/// (`indices.rs`).
const NO_LIFECYCLE: &str = "hour_counters";

/// The stored script id of the counter update for this prefix.
pub fn counter_script_id(prefix: &str) -> String {
    format!("{prefix}-counter-update-v{UPDATE_SCRIPT_VERSION}")
}

pub fn bucket_script_id(prefix: &str) -> String {
    format!("{prefix}-bucket-update-v{UPDATE_SCRIPT_VERSION}")
}

pub fn average_script_id(prefix: &str) -> String {
    format!("{prefix}-average-update-v{UPDATE_SCRIPT_VERSION}")
}

pub fn average_bucket_script_id(prefix: &str) -> String {
    format!("{prefix}-average-bucket-update-v{UPDATE_SCRIPT_VERSION}")
}

/// The stored script that applies a backfilled day to a counter (see
/// `backfill.rs`): remembers per day the last set applied, so it is safe to resend.
pub fn counter_set_script_id(prefix: &str) -> String {
    format!("{prefix}-counter-set-v{SCRIPT_VERSION}")
}

/// The stored script of actor marks (`unique`; see `marks.rs`).
pub fn actor_mark_script_id(prefix: &str) -> String {
    format!("{prefix}-actor-mark-v{ACTOR_MARK_SCRIPT_VERSION}")
}

pub fn ilm_policy_name(prefix: &str) -> String {
    format!("{prefix}-bucket-retention")
}

/// The search engine behind the URL, as `GET /` describes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Engine {
    /// `ilm` is false on a build without index lifecycle management (the
    /// OSS distribution of 7.x): there the gateway sweeps expired indices
    /// itself, as on OpenSearch.
    Elasticsearch {
        major: u32,
        minor: u32,
        ilm: bool,
    },
    OpenSearch {
        major: u32,
        minor: u32,
    },
}

impl Engine {
    /// Reads `version.distribution` (only OpenSearch sends it),
    /// `version.number` and `version.build_flavor` (`oss`: no ILM) of a
    /// `GET /` answer. An Elasticsearch that does not say `oss` is taken to
    /// have ILM until [`Engine::with_ilm_probe`] says otherwise: builds
    /// assembled from jars report `unknown`.
    pub fn from_root(root: &Value) -> Result<Engine, String> {
        let number = root
            .pointer("/version/number")
            .and_then(Value::as_str)
            .ok_or_else(|| format!("GET / answered no version.number: {root}"))?;
        let mut parts = number.split(|c: char| !c.is_ascii_digit());
        let mut next = || parts.next().and_then(|p| p.parse::<u32>().ok());
        let (Some(major), Some(minor)) = (next(), next()) else {
            return Err(format!("GET / answered an unreadable version {number:?}"));
        };
        match root
            .pointer("/version/distribution")
            .and_then(Value::as_str)
        {
            Some("opensearch") => Ok(Engine::OpenSearch { major, minor }),
            None | Some("elasticsearch") => Ok(Engine::Elasticsearch {
                major,
                minor,
                ilm: root
                    .pointer("/version/build_flavor")
                    .and_then(Value::as_str)
                    != Some("oss"),
            }),
            Some(other) => Err(format!("unknown search engine distribution {other:?}")),
        }
    }

    /// Index lifecycle management: Elasticsearch, except its OSS build.
    pub fn has_ilm(&self) -> bool {
        matches!(self, Engine::Elasticsearch { ilm: true, .. })
    }

    /// Corrects `ilm` with the answer to `GET /_ilm/status`. Only a 200
    /// with an `operation_mode` proves ILM; an OSS build reads `_ilm` as an
    /// index name (400 `invalid_index_name_exception`) or has no such
    /// route (404/405). A 401/403 means the user may not read ILM's state,
    /// which only a build with ILM checks: ILM stays assumed, and setup's
    /// own `PUT _ilm/policy` then names the missing privilege.
    pub fn with_ilm_probe(self, status: u16, body: &Value) -> Engine {
        match self {
            Engine::Elasticsearch {
                major,
                minor,
                ilm: true,
            } => {
                let ilm = status == 401
                    || status == 403
                    || (status == 200 && body.get("operation_mode").is_some());
                Engine::Elasticsearch { major, minor, ilm }
            }
            other => other,
        }
    }

    /// Composable index templates and component templates: Elasticsearch
    /// 7.8+, every OpenSearch.
    pub fn supported(&self) -> Result<(), String> {
        match *self {
            Engine::Elasticsearch { major, minor, .. } if (major, minor) < (7, 8) => Err(format!(
                "Elasticsearch {major}.{minor} is too old: composable index templates need 7.8 or later (8.x and 9.x are supported)"
            )),
            Engine::OpenSearch { major, .. } if major < 1 => {
                Err(format!("OpenSearch {major} is not supported (2.x and 3.x are)"))
            }
            _ => Ok(()),
        }
    }
}

impl std::fmt::Display for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Engine::Elasticsearch {
                major,
                minor,
                ilm: true,
            } => write!(f, "Elasticsearch {major}.{minor}"),
            Engine::Elasticsearch {
                major,
                minor,
                ilm: false,
            } => write!(f, "Elasticsearch {major}.{minor} without ILM"),
            Engine::OpenSearch { major, minor } => write!(f, "OpenSearch {major}.{minor}"),
        }
    }
}

/// What kind of object a step installs: decides how its installed version is read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Script,
    IlmPolicy,
    ComponentTemplate,
    IndexTemplate,
}

/// One object to install: `PUT put_path body`, unless the copy read by
/// `GET path` is current.
#[derive(Clone, Debug, PartialEq)]
pub struct Step {
    pub kind: Kind,
    pub name: String,
    pub path: String,
    /// Where the object is written. For a script, `path/update`: storing it
    /// with its context compiles it on the spot, so a script error fails
    /// `setup` instead of every write.
    pub put_path: String,
    pub body: Value,
}

impl Step {
    /// Our version of the object (scripts: their source, compared whole).
    fn version(&self) -> Option<u64> {
        match self.kind {
            Kind::Script => None,
            Kind::IlmPolicy => self
                .body
                .pointer("/policy/_meta/version")
                .and_then(Value::as_u64),
            Kind::ComponentTemplate | Kind::IndexTemplate => {
                self.body.get("version").and_then(Value::as_u64)
            }
        }
    }

    /// Whether the installed copy, as a `GET path` answered it (status and
    /// body), must be replaced. Pure, so it is tested with captured answers.
    pub fn needs_install(&self, status: u16, installed: &Value) -> Install {
        if status == 404 {
            return Install::Missing;
        }
        let theirs = match self.kind {
            Kind::Script => {
                let same =
                    installed.pointer("/script/source") == self.body.pointer("/script/source");
                return if installed.get("found") == Some(&Value::Bool(true)) && same {
                    Install::Current
                } else {
                    Install::Outdated
                };
            }
            Kind::IlmPolicy => installed
                .get(&self.name)
                .and_then(|p| p.pointer("/policy/_meta/version"))
                .and_then(Value::as_u64),
            Kind::ComponentTemplate => installed
                .pointer("/component_templates/0/component_template/version")
                .and_then(Value::as_u64),
            Kind::IndexTemplate => installed
                .pointer("/index_templates/0/index_template/version")
                .and_then(Value::as_u64),
        };
        match (theirs, self.version()) {
            (Some(t), Some(o)) if t == o => Install::Current,
            (Some(t), Some(o)) if t > o => Install::Newer,
            _ => Install::Outdated,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Install {
    Missing,
    Outdated,
    Current,
    /// Installed by a newer gateway: left alone.
    Newer,
}

fn parse(file: &str, what: &str) -> Value {
    // The files are compiled in and checked by the contract tests.
    serde_json::from_str(file).unwrap_or_else(|e| panic!("index-templates/{what} is not JSON: {e}"))
}

/// Every step of `setup` on `engine`, in install order: scripts and the ILM
/// policy before the templates that name them, component templates before
/// the index templates composed of them. Without ILM (OpenSearch, the OSS
/// build of Elasticsearch 7) there is
/// no policy and no lifecycle setting: the gateway deletes expired monthly
/// indices itself.
pub fn steps(names: &IndexNames, engine: Engine) -> Vec<Step> {
    let prefix = names.prefix();
    let mut out = Vec::new();
    for (id, source) in [
        (counter_script_id(prefix), COUNTER_SCRIPT),
        (bucket_script_id(prefix), BUCKET_SCRIPT),
        (average_script_id(prefix), AVERAGE_SCRIPT),
        (average_bucket_script_id(prefix), AVERAGE_BUCKET_SCRIPT),
        (counter_set_script_id(prefix), COUNTER_SET_SCRIPT),
        (actor_mark_script_id(prefix), ACTOR_MARK_SCRIPT),
    ] {
        out.push(Step {
            kind: Kind::Script,
            path: format!("/_scripts/{id}"),
            put_path: format!("/_scripts/{id}/update"),
            name: id,
            body: json!({"script": {"lang": "painless", "source": source}}),
        });
    }
    let ilm = ilm_policy_name(prefix);
    if engine.has_ilm() {
        out.push(Step {
            kind: Kind::IlmPolicy,
            path: format!("/_ilm/policy/{ilm}"),
            put_path: format!("/_ilm/policy/{ilm}"),
            name: ilm.clone(),
            body: parse(ILM_BUCKETS, "ilm/bucket-retention.json"),
        });
    }
    for (name, file) in COMPONENTS {
        let full = format!("{prefix}-{name}");
        out.push(Step {
            kind: Kind::ComponentTemplate,
            path: format!("/_component_template/{full}"),
            put_path: format!("/_component_template/{full}"),
            name: full,
            body: parse(file, name),
        });
    }
    for (collection, time_based, file) in INDEX_TEMPLATES {
        let mut body = parse(file, collection);
        let pattern = if *time_based {
            format!("{prefix}_*_{collection}-*")
        } else {
            format!("{prefix}_*_{collection}")
        };
        body["index_patterns"] = json!([pattern]);
        if let Some(parts) = body.get_mut("composed_of").and_then(Value::as_array_mut) {
            for p in parts {
                if let Some(s) = p.as_str() {
                    *p = json!(format!("{prefix}-{s}"));
                }
            }
        }
        if *time_based && engine.has_ilm() && *collection != NO_LIFECYCLE {
            body["template"]["settings"]["index.lifecycle.name"] = json!(ilm);
        }
        let full = format!("{prefix}-{collection}");
        out.push(Step {
            kind: Kind::IndexTemplate,
            path: format!("/_index_template/{full}"),
            put_path: format!("/_index_template/{full}"),
            name: full,
            body,
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_file_parses_and_steps_are_ordered() {
        let names = IndexNames::new("counter-gateway", "default").unwrap();
        let s = steps(&names, ES8);
        assert_eq!(s.len(), 6 + 1 + COMPONENTS.len() + INDEX_TEMPLATES.len());
        assert_eq!(s[0].path, "/_scripts/counter-gateway-counter-update-v2");
        assert_eq!(
            s[0].put_path,
            "/_scripts/counter-gateway-counter-update-v2/update"
        );
        assert_eq!(s.last().unwrap().kind, Kind::IndexTemplate);
    }

    const ES8: Engine = Engine::Elasticsearch {
        major: 8,
        minor: 15,
        ilm: true,
    };

    #[test]
    fn one_node_clusters_stay_green() {
        // A replica that cannot be placed keeps a one-node cluster yellow.
        let names = IndexNames::new("cg", "default").unwrap();
        let s = steps(&names, ES8);
        let settings = s.iter().find(|s| s.name == "cg-settings").unwrap();
        assert_eq!(
            settings
                .body
                .pointer("/template/settings/index/auto_expand_replicas"),
            Some(&json!("0-1"))
        );
    }

    #[test]
    fn opensearch_gets_no_ilm() {
        let names = IndexNames::new("cg", "default").unwrap();
        let os = steps(
            &names,
            Engine::OpenSearch {
                major: 2,
                minor: 19,
            },
        );
        assert_eq!(os.len(), steps(&names, ES8).len() - 1);
        assert!(os.iter().all(|s| s.kind != Kind::IlmPolicy));
        assert!(os.iter().all(|s| !s.body.to_string().contains("lifecycle")));
        let es = steps(&names, ES8);
        assert!(es
            .iter()
            .any(|s| s.body.to_string().contains("index.lifecycle.name")));
    }

    #[test]
    fn the_engine_is_read_from_the_root_answer() {
        // Shapes as GET / answers them (OpenSearch 2.19.6 captured from the
        // test node; Elasticsearch from the reference).
        let os = json!({"version": {"distribution": "opensearch", "number": "2.19.6"}});
        assert_eq!(
            Engine::from_root(&os),
            Ok(Engine::OpenSearch {
                major: 2,
                minor: 19
            })
        );
        let es = json!({"version": {"number": "9.1.0", "build_flavor": "default"}});
        assert_eq!(
            Engine::from_root(&es),
            Ok(Engine::Elasticsearch {
                major: 9,
                minor: 1,
                ilm: true
            })
        );
        assert!(Engine::from_root(&json!({"version": {"number": "7.4.2"}}))
            .unwrap()
            .supported()
            .is_err());
        assert!(Engine::from_root(&json!({})).is_err());
    }

    #[test]
    fn opensearch_3_is_read_supported_and_gets_no_ilm() {
        // GET / of the OpenSearch 3.3.2 node the gate starts
        // (scripts/opensearch3.sh): it says `minimum_wire_compatibility_version`
        // 2.19, which must not be read as its own version.
        let root = json!({"name": "node-0", "version": {"distribution": "opensearch",
            "number": "3.3.2", "build_type": "unknown", "lucene_version": "10.3.1",
            "minimum_wire_compatibility_version": "2.19.0",
            "minimum_index_compatibility_version": "2.0.0"},
            "tagline": "The OpenSearch Project: https://opensearch.org/"});
        let os3 = Engine::from_root(&root).unwrap();
        assert_eq!(os3, Engine::OpenSearch { major: 3, minor: 3 });
        assert_eq!(os3.to_string(), "OpenSearch 3.3");
        assert!(os3.supported().is_ok());
        assert!(!os3.has_ilm());
        assert_eq!(
            os3.with_ilm_probe(200, &json!({"operation_mode": "RUNNING"})),
            os3
        );
        let names = IndexNames::new("cg", "default").unwrap();
        let s = steps(&names, os3);
        let os2 = Engine::OpenSearch {
            major: 2,
            minor: 19,
        };
        assert_eq!(s, steps(&names, os2), "3.x takes what 2.19 takes");
        let old = json!({"version": {"distribution": "opensearch", "number": "0.9.0"}});
        let err = Engine::from_root(&old).unwrap().supported().unwrap_err();
        assert!(err.contains("2.x and 3.x"), "{err}");
    }

    #[test]
    fn an_elasticsearch_without_ilm_is_found_and_gets_no_ilm() {
        // GET / of the OSS 7.10.2 node the gate starts (assembled from jars:
        // `build_flavor` is "unknown", not "oss"), then its GET /_ilm/status.
        let root = json!({"version": {"number": "7.10.2", "build_flavor": "unknown", "build_type": "unknown"}});
        let es7 = Engine::from_root(&root).unwrap();
        assert!(es7.supported().is_ok());
        let no_route = json!({"error": "Incorrect HTTP method for uri [/_ilm/status] and method [GET], allowed: [POST]", "status": 405});
        let oss = es7.with_ilm_probe(405, &no_route);
        assert!(!oss.has_ilm(), "{oss}");
        assert_eq!(oss.to_string(), "Elasticsearch 7.10 without ILM");
        // An index-name reading of `_ilm` (400) says the same.
        let bad_name = json!({"error": {"type": "invalid_index_name_exception"}, "status": 400});
        assert!(!es7.with_ilm_probe(400, &bad_name).has_ilm());
        // A licensed build answers with its mode; a user without `read_ilm`
        // gets 403 from a build that has ILM.
        assert!(es7
            .with_ilm_probe(200, &json!({"operation_mode": "RUNNING"}))
            .has_ilm());
        assert!(es7.with_ilm_probe(403, &json!({})).has_ilm());
        // `build_flavor: oss` (the OSS tarball) needs no probe.
        let oss_root = json!({"version": {"number": "7.10.2", "build_flavor": "oss"}});
        assert!(!Engine::from_root(&oss_root).unwrap().has_ilm());
        let names = IndexNames::new("cg", "default").unwrap();
        let s = steps(&names, oss);
        assert_eq!(s.len(), steps(&names, ES8).len() - 1);
        assert!(s.iter().all(|s| s.kind != Kind::IlmPolicy));
        assert!(s.iter().all(|s| !s.body.to_string().contains("lifecycle")));
    }

    #[test]
    fn versions_decide_what_is_installed() {
        let names = IndexNames::new("cg", "default").unwrap();
        let s = steps(&names, ES8);
        let comp = s
            .iter()
            .find(|s| s.kind == Kind::ComponentTemplate)
            .unwrap();
        let at = |v: u64| json!({"component_templates": [{"name": comp.name, "component_template": {"version": v, "template": {}}}]});
        assert_eq!(comp.needs_install(404, &json!({})), Install::Missing);
        assert_eq!(comp.needs_install(200, &at(2)), Install::Current);
        // Copies installed before `auto_expand_replicas` are upgraded.
        assert_eq!(comp.needs_install(200, &at(1)), Install::Outdated);
        assert_eq!(comp.needs_install(200, &at(7)), Install::Newer);
        let script = &s[0];
        let same = json!({"_id": script.name, "found": true, "script": {"lang": "painless", "source": script.body["script"]["source"]}});
        assert_eq!(script.needs_install(200, &same), Install::Current);
        let other = json!({"_id": script.name, "found": true, "script": {"lang": "painless", "source": "x"}});
        assert_eq!(script.needs_install(200, &other), Install::Outdated);
    }
}
