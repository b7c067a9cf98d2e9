//! `migrate`: every tenant of the embedded store into Elasticsearch.
//! Setup first (templates, scripts), then per tenant an export of the
//! embedded store piped in process into an import of the cluster (the same
//! code and format as the two commands), then a verification that reads
//! both stores again side by side, in key order, and compares every
//! counter and average: totals, bucket sums and each day.

use std::collections::VecDeque;
use std::path::Path;

use super::{export, format, import, open_elasticsearch, open_embedded, progress, Unit};
use crate::config::StoreArgs;
use crate::domain::{format_day, Clock, CounterKey};
use crate::store::{AverageHistory, CounterHistory, Store};
use crate::tenant::{validate_tenant, DEFAULT_TENANT};

/// Differences printed per tenant; the rest are counted.
const SHOWN: usize = 50;

/// The tenants with an embedded store in `data_dir`, the default first.
pub fn tenants(data_dir: &Path) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    if data_dir.join(crate::store::sqlite::DB_FILE).exists() {
        out.push(DEFAULT_TENANT.to_string());
    }
    let dir = data_dir.join("tenants");
    let entries = match std::fs::read_dir(&dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(format!("{}: {e}", dir.display())),
    };
    let mut others = Vec::new();
    for e in entries {
        let e = e.map_err(|e| format!("{}: {e}", dir.display()))?;
        let name = e.file_name().to_string_lossy().into_owned();
        if validate_tenant(&name).is_ok()
            && name != DEFAULT_TENANT
            && e.path().join(crate::store::sqlite::DB_FILE).exists()
        {
            others.push(name);
        }
    }
    others.sort();
    out.extend(others);
    Ok(out)
}

/// What the two stores disagree on, for one tenant.
#[derive(Debug, Default)]
pub struct Verified {
    /// Counters and averages compared.
    pub compared: u64,
    /// In the cluster only (it held data before): not a difference, the
    /// import merges.
    pub only_in_cluster: u64,
    /// One line per difference, the first [`SHOWN`] of them.
    pub differences: Vec<String>,
    /// All differences, shown or not.
    pub count: u64,
}

impl Verified {
    fn differ(&mut self, what: String) {
        self.count += 1;
        if self.differences.len() < SHOWN {
            self.differences.push(what);
        }
    }
}

fn key_text(k: &CounterKey) -> String {
    format!("{}/{}/{}", k.entity, k.action, k.uuid)
}

fn order(a: &CounterKey, b: &CounterKey) -> std::cmp::Ordering {
    (&*a.entity, &*a.action, &*a.uuid).cmp(&(&*b.entity, &*b.action, &*b.uuid))
}

/// The first day two day lists disagree on, and how many do.
fn day_differences<T: PartialEq + std::fmt::Debug + Copy>(
    a: &[(i64, T)],
    b: &[(i64, T)],
) -> Option<String> {
    let mut all: Vec<i64> = a.iter().chain(b).map(|(d, _)| *d).collect();
    all.sort_unstable();
    all.dedup();
    let get = |l: &[(i64, T)], d: i64| l.iter().find(|(x, _)| *x == d).map(|(_, v)| *v);
    let differing: Vec<(i64, Option<T>, Option<T>)> = all
        .into_iter()
        .map(|d| (d, get(a, d), get(b, d)))
        .filter(|(_, x, y)| x != y)
        .collect();
    let (day, x, y) = differing.first()?;
    let show = |v: &Option<T>| v.map_or("none".to_string(), |v| format!("{v:?}"));
    Some(format!(
        "{} day(s) differ, first {}: {} in the embedded store, {} in the cluster",
        differing.len(),
        format_day(*day),
        show(x),
        show(y)
    ))
}

fn compare_counters(v: &mut Verified, a: &CounterHistory, b: &CounterHistory) {
    let key = key_text(&a.counter.key);
    if a.counter.value != b.counter.value {
        v.differ(format!(
            "counter {key}: value {} in the embedded store, {} in the cluster",
            a.counter.value, b.counter.value
        ));
    }
    let sum = |h: &CounterHistory| h.days.iter().map(|d| i128::from(d.value)).sum::<i128>();
    if sum(a) != sum(b) {
        v.differ(format!(
            "counter {key}: bucket sum {} in the embedded store, {} in the cluster",
            sum(a),
            sum(b)
        ));
    }
    let days = |h: &CounterHistory| h.days.iter().map(|d| (d.day, d.value)).collect::<Vec<_>>();
    if let Some(d) = day_differences(&days(a), &days(b)) {
        v.differ(format!("counter {key}: {d}"));
    }
    if a.counter.category != b.counter.category
        || a.counter.first_ms != b.counter.first_ms
        || a.counter.recorded_ms != b.counter.recorded_ms
    {
        v.differ(format!(
            "counter {key}: category or timestamps differ ({:?} {} {} in the embedded store, {:?} {} {} in the cluster)",
            a.counter.category,
            crate::domain::format_ms(a.counter.first_ms),
            crate::domain::format_ms(a.counter.recorded_ms),
            b.counter.category,
            crate::domain::format_ms(b.counter.first_ms),
            crate::domain::format_ms(b.counter.recorded_ms),
        ));
    }
}

fn compare_averages(v: &mut Verified, a: &AverageHistory, b: &AverageHistory) {
    let key = key_text(&a.key);
    if (a.sum, a.quantity) != (b.sum, b.quantity) {
        v.differ(format!(
            "average {key}: sum/quantity {}/{} in the embedded store, {}/{} in the cluster",
            a.sum, a.quantity, b.sum, b.quantity
        ));
    }
    let sums = |h: &AverageHistory| {
        h.days.iter().fold((0i128, 0i128), |(s, q), d| {
            (s + i128::from(d.sum), q + i128::from(d.quantity))
        })
    };
    if sums(a) != sums(b) {
        v.differ(format!(
            "average {key}: bucket sums {:?} in the embedded store, {:?} in the cluster",
            sums(a),
            sums(b)
        ));
    }
    let days = |h: &AverageHistory| {
        h.days
            .iter()
            .map(|d| (d.day, (d.sum, d.quantity)))
            .collect::<Vec<_>>()
    };
    if let Some(d) = day_differences(&days(a), &days(b)) {
        v.differ(format!("average {key}: {d}"));
    }
    if a.category != b.category || a.first_ms != b.first_ms || a.recorded_ms != b.recorded_ms {
        v.differ(format!("average {key}: category or timestamps differ"));
    }
}

/// Reads `from` and `to` side by side in key order, a page at a time, and
/// compares each counter and average of `from` with the cluster's.
pub async fn verify(from: &dyn Store, to: &dyn Store, from_day: i64) -> Result<Verified, String> {
    let mut v = Verified::default();
    let err = |e: crate::store::StoreError| format!("verifying: {e}");
    // Counters.
    let (mut a, mut b) = (VecDeque::new(), VecDeque::new());
    let (mut a_after, mut b_after): (Option<CounterKey>, Option<CounterKey>) = (None, None);
    let (mut a_end, mut b_end) = (false, false);
    loop {
        if a.is_empty() && !a_end {
            let page = from
                .counter_page(a_after.clone(), export::PAGE, from_day)
                .await
                .map_err(err)?;
            a_end = page.len() < export::PAGE;
            a_after = page.last().map(|c| c.counter.key.clone());
            a.extend(page);
        }
        if b.is_empty() && !b_end {
            let page = to
                .counter_page(b_after.clone(), export::PAGE, from_day)
                .await
                .map_err(err)?;
            b_end = page.len() < export::PAGE;
            b_after = page.last().map(|c| c.counter.key.clone());
            b.extend(page);
        }
        match (a.front(), b.front()) {
            (None, None) => break,
            (Some(x), None) => {
                v.compared += 1;
                v.differ(format!(
                    "counter {}: missing in the cluster",
                    key_text(&x.counter.key)
                ));
                a.pop_front();
            }
            (None, Some(_)) => {
                v.only_in_cluster += 1;
                b.pop_front();
            }
            (Some(x), Some(y)) => match order(&x.counter.key, &y.counter.key) {
                std::cmp::Ordering::Less => {
                    v.compared += 1;
                    v.differ(format!(
                        "counter {}: missing in the cluster",
                        key_text(&x.counter.key)
                    ));
                    a.pop_front();
                }
                std::cmp::Ordering::Greater => {
                    v.only_in_cluster += 1;
                    b.pop_front();
                }
                std::cmp::Ordering::Equal => {
                    v.compared += 1;
                    compare_counters(&mut v, x, y);
                    a.pop_front();
                    b.pop_front();
                }
            },
        }
    }
    // Averages.
    let (mut a, mut b) = (VecDeque::new(), VecDeque::new());
    let (mut a_after, mut b_after): (Option<CounterKey>, Option<CounterKey>) = (None, None);
    let (mut a_end, mut b_end) = (false, false);
    loop {
        if a.is_empty() && !a_end {
            let page = from
                .average_page(a_after.clone(), export::PAGE, from_day)
                .await
                .map_err(err)?;
            a_end = page.len() < export::PAGE;
            a_after = page.last().map(|x| x.key.clone());
            a.extend(page);
        }
        if b.is_empty() && !b_end {
            let page = to
                .average_page(b_after.clone(), export::PAGE, from_day)
                .await
                .map_err(err)?;
            b_end = page.len() < export::PAGE;
            b_after = page.last().map(|x| x.key.clone());
            b.extend(page);
        }
        match (a.front(), b.front()) {
            (None, None) => break,
            (Some(x), None) => {
                v.compared += 1;
                v.differ(format!(
                    "average {}: missing in the cluster",
                    key_text(&x.key)
                ));
                a.pop_front();
            }
            (None, Some(_)) => {
                v.only_in_cluster += 1;
                b.pop_front();
            }
            (Some(x), Some(y)) => match order(&x.key, &y.key) {
                std::cmp::Ordering::Less => {
                    v.compared += 1;
                    v.differ(format!(
                        "average {}: missing in the cluster",
                        key_text(&x.key)
                    ));
                    a.pop_front();
                }
                std::cmp::Ordering::Greater => {
                    v.only_in_cluster += 1;
                    b.pop_front();
                }
                std::cmp::Ordering::Equal => {
                    v.compared += 1;
                    compare_averages(&mut v, x, y);
                    a.pop_front();
                    b.pop_front();
                }
            },
        }
    }
    Ok(v)
}

/// Copies one tenant: `from` exported into an in-memory pipe that `to`
/// imports from, the two running together (memory holds a page and a
/// batch, whatever the size).
pub async fn copy(
    from: &dyn Store,
    to: &dyn Store,
    rules: &format::Rules,
    bar: &indicatif::ProgressBar,
) -> Result<import::Imported, String> {
    let (mut writer, reader) = tokio::io::duplex(1 << 20);
    let hidden = indicatif::ProgressBar::hidden();
    let exporting = async move {
        let done = export::write_all(from, &mut writer, rules.oldest_day(), &hidden).await;
        // Dropping the writer ends the stream for the import.
        drop(writer);
        done
    };
    let options = import::Options {
        input_name: "the embedded store".into(),
        ..import::Options::default()
    };
    let importing = import::read_all(to, tokio::io::BufReader::new(reader), rules, &options, bar);
    let (exported, imported) = tokio::try_join!(exporting, importing)?;
    if imported.counters != exported.counters || imported.averages != exported.averages {
        return Err(format!(
            "{} counters and {} averages were exported, but {} and {} imported",
            exported.counters, exported.averages, imported.counters, imported.averages
        ));
    }
    Ok(imported)
}

/// `counter-gateway migrate`: every tenant, copied then verified. Fails
/// (non-zero exit) when a copy fails or the verification finds a difference.
pub async fn run(args: &StoreArgs, clock: Clock) -> Result<(), String> {
    args.validate()?;
    if args.elasticsearch.url.is_none() {
        return Err("migrate needs --elasticsearch-url (or COUNTER_GATEWAY_ELASTICSEARCH_URL): the cluster to copy into".into());
    }
    crate::store::sqlite::set_memory_budget(args.sqlite_memory_budget);
    let names = tenants(&args.data_dir)?;
    if names.is_empty() {
        return Err(format!(
            "no embedded store in {} (no {} there nor under tenants/): check --data-dir",
            args.data_dir.display(),
            crate::store::sqlite::DB_FILE
        ));
    }
    let rules = format::Rules {
        now: clock.now(),
        policy: args.time_policy(),
    };
    // Setup once (templates and scripts serve every tenant).
    open_elasticsearch(args, DEFAULT_TENANT, true, clock.clone()).await?;
    let mut failed = 0u64;
    for tenant in &names {
        let from = open_embedded(args, tenant, false, clock.clone())?;
        let to = open_elasticsearch(args, tenant, false, clock.clone())
            .await?
            .ok_or("no --elasticsearch-url")?;
        let bar = progress(Unit::Bytes(None));
        bar.set_message(format!("tenant {tenant}"));
        let started = std::time::Instant::now();
        let copied = copy(&from, &to, &rules, &bar).await;
        bar.finish_and_clear();
        let copied = copied.map_err(|e| {
            format!("tenant {tenant}: {e}\nnothing is lost: the embedded store is untouched; run migrate again (it sets, so what was copied is set to the same values again)")
        })?;
        let v = verify(&from, &to, rules.oldest_day()).await?;
        eprintln!(
            "tenant {tenant}: copied {} counters and {} averages ({} day buckets) in {:.1} s; verified {} of them: {}",
            copied.counters,
            copied.averages,
            copied.days,
            started.elapsed().as_secs_f64(),
            v.compared,
            if v.count == 0 { "all agree".to_string() } else { format!("{} differences", v.count) }
        );
        if v.only_in_cluster > 0 {
            eprintln!(
                "tenant {tenant}: the cluster also holds {} counters or averages the embedded store has not (kept: import merges)",
                v.only_in_cluster
            );
        }
        for d in &v.differences {
            eprintln!("tenant {tenant}: {d}");
        }
        if v.count > v.differences.len() as u64 {
            eprintln!(
                "tenant {tenant}: and {} more differences",
                v.count - v.differences.len() as u64
            );
        }
        failed += v.count;
    }
    if failed > 0 {
        return Err(format!(
            "verification found {failed} differences between the embedded store and the cluster (listed above)"
        ));
    }
    eprintln!(
        "migrated {} tenants; every counter and average agrees",
        names.len()
    );
    Ok(())
}
