//! Counting once per actor on Elasticsearch: the marks of events with
//! `unique`, each a document of its own (`<prefix>_<tenant>_actor_marks`
//! for likes, monthly `..._actor_day_marks-YYYY.MM` for views, routed by
//! counter id), changed by the stored script `<prefix>-actor-mark-v2`.
//!
//! A mark and its counter are two documents, which no transaction spans,
//! so the guarantee is **never counted twice**, in three steps per flush:
//!
//! 1. one `_bulk` of mark updates, in the flush's order: a like (`add`)
//!    counts only if the mark is off, an unlike (`take`) only if it is
//!    counted, and it then leaves the mark `retracting`; the mark also
//!    remembers the event's `id`, so a retry is a duplicate there;
//! 2. the flush itself (`writes.rs`), with only the events their mark let
//!    through, their ids left to the mark;
//! 3. one `_bulk` that settles the marks by what step 2 did: a `retracting`
//!    mark whose decrement landed is set off (deleted when it remembers no
//!    id), a mark whose count did not land is set back (and forgets the
//!    ids of those events, so that their retry counts). Every change in
//!    step 3 is guarded by the flush's random token: a mark another flush
//!    has changed since is left alone.
//!
//! A `day` mark is a document of its day, so it cannot hold an event's id
//! for the idempotency window: a retry after midnight UTC (a pixel URL
//! fetched again the next morning) finds the new day's mark, which never
//! saw it. So before step 1, the ids of `day` events go through a
//! registry of their own ([`ids_doc_id`]: one document per counter and
//! actor in the `actor_marks` index, always `off`, so never exported),
//! and a retry stops there as a duplicate, its day mark untouched, as on
//! the embedded store, where the id is checked first. An id whose event
//! did not count (its request failed, its count did not land) is
//! forgotten in step 3, so that its retry counts.
//!
//! So a mark says "counted" before its count lands, and "off" only after
//! its decrement landed. A crash (or a cluster that keeps failing) between
//! the steps can therefore lose a count (a like marked but not counted;
//! an unlike left `retracting`, which counts as a like again only after
//! [`STALE_RETRACTION`], and whose decrement may then be taken again), and
//! can never count an actor twice. Which is what src/api/README.md ("Once per actor") says.

use std::collections::HashMap;
use std::sync::Arc;

use serde_json::{json, Map, Value};

use super::indices::{first_day, months_to_ensure, Month, MAX_ENSURED_MONTHS};
use super::request::{self, BulkAction};
use super::response::ItemClass;
use super::writes::Fate;
use super::{templates, ElasticsearchStore};

use crate::domain::{to_hex, Increment, Scope};
use crate::store::{ActorMark, BatchOutcome, RequestOutcome, StoreError, WriteBatch};

/// How long a retraction left by another flush stays a retraction; past it,
/// the mark counts as counted again (that flush is taken to have died: no
/// flush takes this long, `--ack-timeout` and the back-off budget included).
pub const STALE_RETRACTION: std::time::Duration = std::time::Duration::from_secs(600);

/// What one mark update asks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Op {
    /// A like or a view.
    Add,
    /// An unlike.
    Take,
}

/// What step 1 said of one event.
#[derive(Clone, Debug, PartialEq)]
enum Claim {
    /// Its mark let it through: it is to be counted.
    Counted,
    /// Its actor was counted already, or had nothing to take back.
    Repeat,
    /// Its id was seen by its mark before.
    Duplicate,
    /// The update failed (or nobody knows whether it applied).
    Failed { reason: String },
}

/// One event with `unique`, and where its mark is.
struct MarkEvent {
    request: usize,
    event: usize,
    op: Op,
    id: Option<Arc<str>>,
    /// The mark document: index and id.
    doc: (String, String),
    action: BulkAction,
}

/// Reads a mark update's bulk item.
fn claim_of(class: &ItemClass, noop: bool, source: Option<&Value>, has_id: bool) -> Claim {
    match class {
        ItemClass::Done if noop && has_id => Claim::Duplicate,
        ItemClass::Done if noop => Claim::Repeat,
        ItemClass::Done => match source
            .and_then(|s| s.get("outcome"))
            .and_then(Value::as_str)
        {
            Some("counted") => Claim::Counted,
            Some("repeat") => Claim::Repeat,
            other => Claim::Failed {
                reason: format!("the actor mark answered outcome {other:?}"),
            },
        },
        ItemClass::Unknown(r)
        | ItemClass::Retry(r)
        | ItemClass::Rejected(r)
        | ItemClass::Overflow(r) => Claim::Failed { reason: r.clone() },
    }
}

/// One event of a flush on a mark, as step 3 sees it.
#[derive(Clone, Debug, PartialEq)]
enum Step {
    /// A claimed op and what became of its count.
    Op(Op, Fate, Option<Arc<str>>),
    /// A repeat of a request that was not applied: its id, remembered by
    /// the mark, is forgotten, so that a retry is decided afresh.
    Forget(Arc<str>),
}

/// What step 3 does to one mark, from its steps in the flush's order:
/// `None` when it is as it should be; else the state to set (`None`: leave
/// it) and the ids to forget.
fn settle(steps: &[Step]) -> Option<(Option<&'static str>, Vec<String>)> {
    let ops: Vec<(Op, Fate)> = steps
        .iter()
        .filter_map(|s| match s {
            Step::Op(op, fate, _) => Some((*op, *fate)),
            Step::Forget(_) => None,
        })
        .collect();
    let forget: Vec<String> = steps
        .iter()
        .filter_map(|s| match s {
            Step::Op(_, Fate::NotApplied, id) => id.as_deref(),
            Step::Op(..) => None,
            Step::Forget(id) => Some(&**id),
        })
        .map(str::to_string)
        .collect();
    let state = match (ops.first(), ops.last()) {
        // Whether a count landed is not known: the state stays as it is (a
        // like counted, an unlike retracting until it is stale).
        _ if ops.iter().any(|(_, f)| *f == Fate::Unknown) => None,
        (Some(first), Some(last)) => {
            // Before the flush: a like counted from "off", an unlike from "counted".
            let mut want = match first.0 {
                Op::Add => "off",
                Op::Take => "counted",
            };
            for (op, fate) in &ops {
                if *fate == Fate::Counted {
                    want = match op {
                        Op::Add => "counted",
                        Op::Take => "off",
                    };
                }
            }
            let now = match last.0 {
                Op::Add => "counted",
                Op::Take => "retracting",
            };
            (want != now).then_some(want)
        }
        _ => None,
    };
    (state.is_some() || !forget.is_empty()).then_some((state, forget))
}

/// The id of the document that remembers the event ids of one actor's
/// `day` events on one counter, in the `actor_marks` index (beside the
/// `ever` marks, whose ids end with the mark: this one ends with `@ids`).
fn ids_doc_id(counter_id: &str, mark: &str) -> String {
    request::mark_doc_id(counter_id, &format!("{mark}@ids"), None)
}

/// One `day` event with an id, and what its registry said.
struct IdEvent {
    request: usize,
    event: usize,
    id: Arc<str>,
    doc: (String, String),
    routing: String,
}

/// Whether an id the registry took for an event is to be forgotten:
/// unless the event counted (or may have), or was a repeat of an applied
/// request (whose id is used up, as on the embedded store).
fn forget_registered(failed: bool, claim: Option<&Claim>, fate: Option<Fate>) -> bool {
    if failed {
        return true;
    }
    match claim {
        Some(Claim::Counted) => fate == Some(Fate::NotApplied),
        Some(Claim::Repeat | Claim::Duplicate) => false,
        Some(Claim::Failed { .. }) | None => true,
    }
}

impl ElasticsearchStore {
    /// A flush with events that carry `unique`: steps 1 to 3 of the module doc.
    pub(super) async fn apply_marked(&self, batch: WriteBatch) -> Result<BatchOutcome, StoreError> {
        // Before this version's first mark on this tenant: its marks are
        // recorded as keyed for it, or refused (see `mark_keying`).
        if !self.marks_keyed.load(std::sync::atomic::Ordering::Relaxed) {
            self.ensure_marks_keyed().await?;
            self.marks_keyed
                .store(true, std::sync::atomic::Ordering::Relaxed);
        }
        let now_ms = self.clock.now_ms();
        let token = new_token();
        let prefix = self.config.names.prefix();
        let script = templates::actor_mark_script_id(prefix);
        let id_window_ms = i64::try_from(self.config.id_window.as_millis()).unwrap_or(i64::MAX);
        let stale_ms = STALE_RETRACTION.as_millis() as i64;
        let mut claims: HashMap<(usize, usize), Claim> = HashMap::new();
        let mut failed: HashMap<usize, String> = HashMap::new();
        let mut sent = 0;

        // The ids of `day` events, each registered with its counter and actor.
        let mut registered: Vec<IdEvent> = Vec::new();
        let mut registry = Vec::new();
        for (r, events) in batch.requests.iter().enumerate() {
            for (e, inc) in events.iter().enumerate() {
                let (Some(u), Some(id)) = (&inc.unique, &inc.id) else {
                    continue;
                };
                if u.scope != Scope::Day {
                    continue;
                }
                let counter_id = inc.key.doc_id();
                let mut p = Map::new();
                // A `take` of a mark that is always off: it only remembers
                // the id (a "repeat"), or is a duplicate when it knew it.
                p.insert("op".into(), json!("take"));
                p.insert("counter_id".into(), json!(counter_id));
                p.insert(
                    "counter_hash".into(),
                    json!(to_hex(&ActorMark::counter_hash(&inc.key))),
                );
                p.insert("mark".into(), json!(u.mark.hex()));
                p.insert("scope".into(), json!(u.scope.as_str()));
                p.insert("day".into(), Value::Null);
                p.insert("token".into(), json!(token));
                p.insert("now_ms".into(), json!(now_ms));
                p.insert("stale_ms".into(), json!(stale_ms));
                p.insert("id".into(), json!(&**id));
                p.insert("id_window_ms".into(), json!(id_window_ms));
                p.insert("max_ids".into(), json!(self.config.max_ids_per_doc));
                let doc = (
                    self.config.names.actor_marks(),
                    ids_doc_id(&counter_id, &u.mark.hex()),
                );
                registry.push(mark_action(&doc.0, &doc.1, &counter_id, &script, p));
                registered.push(IdEvent {
                    request: r,
                    event: e,
                    id: id.clone(),
                    doc,
                    routing: counter_id,
                });
            }
        }
        // Per registered event: whether the registry took its id now.
        let mut taken = vec![false; registered.len()];
        if !registry.is_empty() {
            let (results, n) = self
                .send_actions(&registry, self.config.retry_on_conflict)
                .await;
            sent += n;
            for ((i, reg), res) in registered.iter().enumerate().zip(&results) {
                match claim_of(&res.class, res.noop, res.source.as_ref(), true) {
                    Claim::Duplicate => {
                        claims.insert((reg.request, reg.event), Claim::Duplicate);
                    }
                    Claim::Failed { reason } => {
                        // Whether it took the id is not known: forget it.
                        taken[i] = true;
                        failed.entry(reg.request).or_insert(reason);
                    }
                    Claim::Counted | Claim::Repeat => taken[i] = true,
                }
            }
        }

        let mut marks = Vec::new();
        let mut days = Vec::new();
        for (r, events) in batch.requests.iter().enumerate() {
            if failed.contains_key(&r) {
                continue;
            }
            for (e, inc) in events.iter().enumerate() {
                let Some(u) = &inc.unique else { continue };
                if claims.contains_key(&(r, e)) {
                    // A duplicate by its id: its mark is left alone.
                    continue;
                }
                let counter_id = inc.key.doc_id();
                let (index, day) = match u.scope {
                    Scope::Ever => (self.config.names.actor_marks(), None),
                    Scope::Day => {
                        days.push(inc.day);
                        (self.config.names.actor_day_marks(inc.day), Some(inc.day))
                    }
                };
                let id = request::mark_doc_id(&counter_id, &u.mark.hex(), day);
                let op = if inc.delta > 0 { Op::Add } else { Op::Take };
                let mut p = Map::new();
                p.insert(
                    "op".into(),
                    json!(if op == Op::Add { "add" } else { "take" }),
                );
                p.insert("counter_id".into(), json!(counter_id));
                // Where `export` lists the mark (`ActorMark::order`).
                p.insert(
                    "counter_hash".into(),
                    json!(to_hex(&ActorMark::counter_hash(&inc.key))),
                );
                p.insert("mark".into(), json!(u.mark.hex()));
                p.insert("scope".into(), json!(u.scope.as_str()));
                p.insert("day".into(), json!(day.map(|d| d * 86_400_000)));
                p.insert("token".into(), json!(token));
                p.insert("now_ms".into(), json!(now_ms));
                p.insert("stale_ms".into(), json!(stale_ms));
                p.insert("id".into(), json!(inc.id.as_deref()));
                p.insert("id_window_ms".into(), json!(id_window_ms));
                p.insert("max_ids".into(), json!(self.config.max_ids_per_doc));
                let action = mark_action(&index, &id, &counter_id, &script, p);
                marks.push(MarkEvent {
                    request: r,
                    event: e,
                    op,
                    id: inc.id.clone(),
                    doc: (index, id),
                    action,
                });
            }
        }
        self.ensure_mark_months(&days).await;

        // Step 1.
        let actions: Vec<BulkAction> = marks.iter().map(|m| m.action.clone()).collect();
        let (results, n) = self
            .send_actions(&actions, self.config.retry_on_conflict)
            .await;
        sent += n;
        for (m, res) in marks.iter().zip(&results) {
            let claim = claim_of(&res.class, res.noop, res.source.as_ref(), m.id.is_some());
            if let Claim::Failed { reason, .. } = &claim {
                failed.entry(m.request).or_insert_with(|| reason.clone());
            }
            claims.insert((m.request, m.event), claim);
        }

        // Step 2: the events their marks let through, a failed request's none.
        let mut dups = vec![0u32; batch.requests.len()];
        let mut repeats = vec![0u32; batch.requests.len()];
        let mut through: Vec<Vec<Increment>> = Vec::with_capacity(batch.requests.len());
        // Per request, the index in `through` of each event (None: left out).
        let mut at: Vec<Vec<Option<usize>>> = Vec::with_capacity(batch.requests.len());
        for (r, events) in batch.requests.iter().enumerate() {
            let mut kept = Vec::with_capacity(events.len());
            let mut pos = Vec::with_capacity(events.len());
            for (e, inc) in events.iter().enumerate() {
                if failed.contains_key(&r) {
                    pos.push(None);
                    continue;
                }
                match claims.get(&(r, e)) {
                    None => {
                        pos.push(Some(kept.len()));
                        kept.push(inc.clone());
                    }
                    Some(Claim::Counted) => {
                        pos.push(Some(kept.len()));
                        // The mark keeps the id: the counter need not.
                        kept.push(Increment {
                            id: None,
                            ..inc.clone()
                        });
                    }
                    Some(Claim::Repeat) => {
                        repeats[r] += 1;
                        pos.push(None);
                    }
                    Some(Claim::Duplicate) => {
                        dups[r] += 1;
                        pos.push(None);
                    }
                    Some(Claim::Failed { .. }) => pos.push(None),
                }
            }
            through.push(kept);
            at.push(pos);
        }
        let mut fates = Vec::with_capacity(through.len());
        let applied = self
            .apply_requests(&through, &batch.wanted, Some(&mut fates))
            .await;

        // Step 3: settle every mark a claim changed, by what became of its events.
        let mut chains: Vec<(&MarkEvent, Vec<Step>)> = Vec::new();
        let mut chain_of: HashMap<&(String, String), usize> = HashMap::new();
        for m in &marks {
            let claim = &claims[&(m.request, m.event)];
            let step = match claim {
                Claim::Counted => Step::Op(
                    m.op,
                    match (&applied, at[m.request][m.event]) {
                        (Ok(_), Some(i)) => fates
                            .get(m.request)
                            .and_then(|f| f.get(i))
                            .copied()
                            .unwrap_or(Fate::Unknown),
                        // Its request failed at step 1: nothing of it was sent.
                        (Ok(_), None) => Fate::NotApplied,
                        // The whole flush failed before or while sending.
                        (Err(_), _) => Fate::Unknown,
                    },
                    m.id.clone(),
                ),
                Claim::Repeat if failed.contains_key(&m.request) => match &m.id {
                    Some(id) => Step::Forget(id.clone()),
                    None => continue,
                },
                _ => continue,
            };
            let c = *chain_of.entry(&m.doc).or_insert_with(|| {
                chains.push((m, Vec::new()));
                chains.len() - 1
            });
            chains[c].1.push(step);
        }
        let mut settles = Vec::new();
        // The registry forgets the ids of events that did not count.
        let mut forgets: Vec<(&IdEvent, Vec<String>)> = Vec::new();
        let mut forget_of: HashMap<&(String, String), usize> = HashMap::new();
        for (reg, _) in registered.iter().zip(&taken).filter(|(_, t)| **t) {
            let fate = match (&applied, at.get(reg.request).and_then(|a| a[reg.event])) {
                (Ok(_), Some(i)) => fates.get(reg.request).and_then(|f| f.get(i)).copied(),
                (Ok(_), None) => Some(Fate::NotApplied),
                (Err(_), _) => Some(Fate::Unknown),
            };
            let claim = claims.get(&(reg.request, reg.event));
            if !forget_registered(failed.contains_key(&reg.request), claim, fate) {
                continue;
            }
            let f = *forget_of.entry(&reg.doc).or_insert_with(|| {
                forgets.push((reg, Vec::new()));
                forgets.len() - 1
            });
            forgets[f].1.push(reg.id.to_string());
        }
        for (reg, ids) in forgets {
            let mut p = Map::new();
            p.insert("op".into(), json!("set"));
            p.insert("state".into(), Value::Null);
            p.insert("forget".into(), json!(ids));
            p.insert("token".into(), json!(token));
            p.insert("now_ms".into(), json!(now_ms));
            settles.push(settle_action(
                &reg.doc.0,
                &reg.doc.1,
                &reg.routing,
                &script,
                p,
            ));
        }
        for (m, steps) in &chains {
            let Some((state, forget)) = settle(steps) else {
                continue;
            };
            let mut p = Map::new();
            p.insert("op".into(), json!("set"));
            p.insert("state".into(), json!(state));
            p.insert("forget".into(), json!(forget));
            p.insert("token".into(), json!(token));
            p.insert("now_ms".into(), json!(now_ms));
            let routing = m.action.routing.as_deref().unwrap_or_default();
            settles.push(settle_action(&m.doc.0, &m.doc.1, routing, &script, p));
        }
        if !settles.is_empty() {
            let (results, n) = self
                .send_actions(&settles, self.config.retry_on_conflict)
                .await;
            sent += n;
            let lost = results
                .iter()
                .filter(|r| r.class != ItemClass::Done)
                .count();
            if lost > 0 {
                tracing::error!(
                    marks = lost,
                    "settling actor marks failed: an actor may stay marked without its count (a lost like), or retracting until it is stale; never counted twice"
                );
            }
        }

        let mut out = applied?;
        out.store_writes += sent;
        for (r, outcome) in out.requests.iter_mut().enumerate() {
            if let Some(reason) = failed.get(&r) {
                *outcome = RequestOutcome::Failed {
                    reason: format!(
                        "the actor marks of the request could not be written: {reason}"
                    ),
                };
            } else if let RequestOutcome::Applied { duplicates } = outcome {
                *duplicates += dups[r];
            }
        }
        out.repeats = repeats;
        Ok(out)
    }

    /// Creates the monthly indices of day marks a flush needs (as for
    /// buckets, `indices.rs`): only for flushes with views, so a tenant
    /// that never counts once per day has none.
    pub(super) async fn ensure_mark_months(&self, days: &[i64]) {
        if days.is_empty() {
            return;
        }
        let today = self.clock.now_ms().div_euclid(86_400_000);
        let missing: Vec<Month> = {
            let ensured = self.mark_months.lock().unwrap_or_else(|e| e.into_inner());
            months_to_ensure(today, days.iter().copied(), &ensured)
        };
        for month in missing {
            let Some(day) = first_day(month) else {
                continue;
            };
            let index = self.config.names.actor_day_marks(day);
            if let Err(e) = self.create_index(&index).await {
                tracing::warn!(%index, error = %e, "could not create an actor mark index ahead of writes");
                return;
            }
            let mut ensured = self.mark_months.lock().unwrap_or_else(|e| e.into_inner());
            ensured.insert(month);
            while ensured.len() > MAX_ENSURED_MONTHS {
                ensured.pop_first();
            }
        }
    }
}

/// One scripted upsert of a mark, routed by its counter, asking back the
/// outcome the script wrote (an `add` or a `take`: step 1).
fn mark_action(
    index: &str,
    id: &str,
    counter_id: &str,
    script: &str,
    params: Map<String, Value>,
) -> BulkAction {
    let mut a = settle_action(index, id, counter_id, script, params);
    a.body["_source"] = json!({"includes": ["outcome"]});
    a
}

/// A mark's update without asking anything back (a `set`: step 3). It may
/// delete the mark, and OpenSearch 2.19 answers an update that deletes its
/// document while asking for `_source` with a 500 (a null pointer where
/// the source would be), which no retry cures.
fn settle_action(
    index: &str,
    id: &str,
    counter_id: &str,
    script: &str,
    params: Map<String, Value>,
) -> BulkAction {
    BulkAction {
        index: index.to_string(),
        id: id.to_string(),
        routing: Some(counter_id.to_string()),
        body: json!({
            "scripted_upsert": true,
            "upsert": {},
            "script": {"id": script, "params": Value::Object(params)},
        }),
    }
}

/// A random token per flush, so step 3 changes only what this flush did.
fn new_token() -> String {
    let mut b = [0u8; 12];
    let _ = ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut b);
    b.iter().map(|x| format!("{x:02x}")).collect()
}
