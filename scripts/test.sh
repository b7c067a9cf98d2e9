#!/usr/bin/env bash
# The project's test gate, as CI runs it (`.ci/run`) and as a developer runs it:
# formatting, lints with warnings denied, every test suite, and the suites that
# need outside components, each of which runs or says plainly why it did not.
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== cargo fmt --check"
cargo fmt --all -- --check

echo "== cargo clippy (warnings denied)"
cargo clippy --locked --all-targets -- -D warnings

echo "== cargo test"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
cargo test --locked 2>&1 | tee "$log"
# Totals over every test binary, for the closing line below.
count() { awk -v what="$2" '/^test result:/ { for (i = 2; i <= NF; i++) if ($i == what) n += $(i - 1) } END { print n + 0 }' "$1"; }
passed=$(count "$log" "passed;"); failed=$(count "$log" "failed;"); ignored=$(count "$log" "ignored;")

# Every relative link of every Markdown page resolves; the README's commands run.
echo "== docs check"
scripts/check-docs.sh

# The suites whose answers depend on the date, again at chosen dates: a
# month's last day, 31 December, 29 February, a second before midnight and
# half a minute after one (the 1st of March, after a 28-day February)
# (day_change.rs also starts a tenth of a second before midnight and crosses
# it mid-test, on every date). The test apps' clocks start at
# COUNTER_GATEWAY_TEST_NOW instead of the wall clock (tests/common/mod.rs).
just_after_midnight=2027-03-01T00:00:30Z
echo "== date-dependent suites at injected dates"
dated=(--test window_totals --test day_change --test conformance_embedded --test api_queries
       --test api_events --test api_counters --test es_behaviour --test transfer --test actors
       --test hours --test first_days --test milestones --test trending --test backfill
       --test set_value --test store_log --test stream)
for at in 2027-01-31T12:00:00Z 2027-12-31T12:00:00Z 2028-02-29T12:00:00Z 2026-12-31T23:59:59Z "$just_after_midnight"; do
  echo "-- COUNTER_GATEWAY_TEST_NOW=$at"
  at_log=$(mktemp)
  status=0
  COUNTER_GATEWAY_TEST_NOW=$at cargo test --locked "${dated[@]}" >"$at_log" 2>&1 || status=$?
  grep -E '^test result:|FAILED|panicked' "$at_log" || true
  passed=$((passed + $(count "$at_log" "passed;"))); failed=$((failed + $(count "$at_log" "failed;")))
  if [ "$status" -ne 0 ]; then
    cat "$at_log"
    echo "date-dependent suites FAILED at $at"
    failed=$((failed > 0 ? failed : 1))
  fi
  rm -f "$at_log"
done

echo "== real search engine suites (tests/es_real.rs, tests/es_transfer.rs, tests/es_node_faults.rs)"
# Against ELASTICSEARCH_URL when set (any Elasticsearch 7.8+ or OpenSearch 2/3);
# otherwise against real single-node engines that the launchers build from
# Maven Central jars and start for this run, one stage each: OpenSearch 2.19
# (scripts/opensearch.sh), Elasticsearch 7.10.2 (scripts/elasticsearch-node.sh,
# the OSS build: no ILM) and OpenSearch 3.3 (scripts/opensearch3.sh, Java 21+).
# They need Java and Maven; an engine that cannot run here is reported as
# skipped, with the launcher's reason.
if ! command -v java >/dev/null 2>&1 || ! command -v mvn >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "installing Java 17 and Maven for the test nodes"
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openjdk-17-jdk-headless maven) >/dev/null 2>&1 || true
  fi
fi
real_suites=(--test es_real --test es_transfer --test es_node_faults)
# The plain run above built these binaries (every stage reuses them) and
# counted their tests, all #[ignore]d, as skipped. `listed SUITES...` says
# how many tests they hold. From here each stage counts the runs it made, so a test
# that ran on three engines counts three times, and a stage that could not
# run counts its tests as skipped once more.
listed() { cargo test --locked "$@" -- --ignored --list 2>/dev/null | grep -c ': test$' || true; }
ignored=$((ignored - $(listed "${real_suites[@]}")))

# engine_stage LABEL PREFIX NODE LAUNCHER MODE -- SUITES...: run SUITES'
# ignored tests with COUNTER_GATEWAY_TEST_NODE=NODE (tests/es_node_faults.rs
# starts its own nodes with that launcher). MODE "run": with LAUNCHER's node
# up and ELASTICSEARCH_URL pointing at it; "url": against ELASTICSEARCH_URL
# as it is, after checking that LAUNCHER can build its node ("-": no node
# needed). A line "PREFIX: unavailable: why" from the launcher makes the
# stage SKIPPED; a failure to run is a failure, and so is every test that
# did not report.
engine_stage() {
  local label="$1" prefix="$2" node="$3" launcher="$4" mode="$5"; shift 6
  local log t0=$SECONDS status=0 n p f
  log=$(mktemp)
  echo "-- $label"
  if [ "$mode" = run ]; then
    RUST_LOG="${RUST_LOG:-warn}" COUNTER_GATEWAY_TEST_NODE="$node" \
      "$launcher" run -- cargo test --locked --no-fail-fast "$@" -- --ignored 2>&1 | tee "$log" || status=$?
  else
    [ "$launcher" = - ] || "$launcher" build 2>&1 | tee "$log" || status=$?
    [ "$status" -ne 0 ] || RUST_LOG="${RUST_LOG:-warn}" COUNTER_GATEWAY_TEST_NODE="$node" \
      cargo test --locked --no-fail-fast "$@" -- --ignored 2>&1 | tee -a "$log" || status=$?
  fi
  n=$(listed "$@"); p=$(count "$log" "passed;"); f=$(count "$log" "failed;")
  if [ "$status" -ne 0 ] && grep -q "^$prefix: unavailable:" "$log"; then
    echo "$label: SKIPPED, not run: $(grep -m1 "^$prefix: unavailable:" "$log" | cut -d: -f3- | sed 's/^ //'); its $n tests are counted as skipped"
    ignored=$((ignored + n))
  elif [ "$status" -ne 0 ] && { [ "$f" -eq 0 ] || [ $((p + f)) -lt "$n" ]; }; then
    echo "$label: FAILED to run (exit $status): $p passed, $f failed, $((n - p - f)) of $n did not report"
    passed=$((passed + p)); failed=$((failed + (n - p > 0 ? n - p : 1)))
  else
    passed=$((passed + p)); failed=$((failed + f))
    echo "$label: $p passed, $f failed of $n, in $((SECONDS - t0)) s"
  fi
  rm -f "$log"
}

if [ -n "${ELASTICSEARCH_URL:-}" ]; then
  echo "against ELASTICSEARCH_URL=${ELASTICSEARCH_URL}"
  # tests/es_node_faults.rs SIGKILLs and restarts a node, so it runs on a
  # node of its own (OpenSearch 2.19) even here.
  engine_stage "ELASTICSEARCH_URL" - opensearch - url -- --test es_real --test es_transfer
  engine_stage "node faults on OpenSearch 2.19" opensearch opensearch scripts/opensearch.sh url -- --test es_node_faults
else
  engine_stage "OpenSearch 2.19" opensearch opensearch scripts/opensearch.sh run -- "${real_suites[@]}"
  # Half a minute after midnight, when most of today's hours lie ahead of
  # the clock: a test that writes at "today, 02:00" is writing in the
  # future (es_transfer did, and turned CI red at 00:25 one night).
  COUNTER_GATEWAY_TEST_NOW=$just_after_midnight \
    engine_stage "OpenSearch 2.19 at $just_after_midnight" opensearch opensearch scripts/opensearch.sh run -- --test es_real --test es_transfer
  engine_stage "Elasticsearch 7.10.2" elasticsearch elasticsearch scripts/elasticsearch-node.sh run -- "${real_suites[@]}"
  engine_stage "OpenSearch 3.3" opensearch3 opensearch3 scripts/opensearch3.sh run -- "${real_suites[@]}"
fi
# (Multi-node stages go here, after the single-node engines, each through
# engine_stage with its own launcher and suites.)

echo "== three-node cluster (tests/es_real.rs on a cluster, tests/es_cluster_faults.rs)"
# A real three-node OpenSearch 2.19 cluster (three JVMs on loopback,
# scripts/opensearch.sh run --nodes 3): the real-engine suite again on it
# (its passes count again, as the date-dependent runs do), then the fault
# suite, which starts, kills, drains and restarts a cluster of its own.
# Wall time is printed against its 10-minute budget (a warning past it:
# a timing is not a test). Without java and
# mvn both are reported as skipped, never as passed.
cluster_t0=$SECONDS
cluster_log=$(mktemp)
if ! command -v java >/dev/null 2>&1 || ! command -v mvn >/dev/null 2>&1; then
  echo "three-node cluster: SKIPPED, not run: needs java and mvn for its nodes; its tests are counted as skipped"
else
  cluster_status=0
  RUST_LOG="${RUST_LOG:-warn}" scripts/opensearch.sh run --nodes 3 -- cargo test --locked --test es_real -- --ignored 2>&1 | tee "$cluster_log" || cluster_status=$?
  RUST_LOG="${RUST_LOG:-warn}" cargo test --locked --test es_cluster_faults -- --ignored --nocapture 2>&1 | tee -a "$cluster_log" || cluster_status=$?
  c_passed=$(count "$cluster_log" "passed;"); c_failed=$(count "$cluster_log" "failed;")
  if grep -q '^opensearch: unavailable:' "$cluster_log"; then
    echo "three-node cluster: SKIPPED, not run: $(grep -m1 '^opensearch: unavailable:' "$cluster_log" | cut -d: -f3-); its tests are counted as skipped"
  elif [ "$cluster_status" -ne 0 ] && [ "$c_failed" -eq 0 ]; then
    echo "three-node cluster suites FAILED to run (exit $cluster_status)"
    failed=$((failed + 1))
  else
    # es_cluster_faults' one test moves from skipped; es_real's ran before.
    passed=$((passed + c_passed)); failed=$((failed + c_failed))
    ignored=$((ignored - 1))
  fi
fi
rm -f "$cluster_log"
echo "three-node cluster stage: $((SECONDS - cluster_t0)) s wall time (budget 600)"
if [ $((SECONDS - cluster_t0)) -ge 600 ]; then
  # A budget for CI's time, not a test: a slow machine is told, not failed.
  echo "three-node cluster stage: WARNING, over its 10-minute budget"
fi

echo "== browser suite (tests/dashboard.rs and tests/badges.rs in headless Chromium)"
# The dashboard rendered by a real browser: Debian's chromium, installed here
# when missing and possible; without it the suite is reported as skipped.
CHROMIUM="${CHROMIUM:-chromium}"
browser_reason=""
if ! command -v "$CHROMIUM" >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "installing chromium for the browser suite"
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium) >/dev/null 2>&1 || true
    command -v "$CHROMIUM" >/dev/null 2>&1 || browser_reason="apt-get install chromium failed"
  elif [ "$(id -u)" != 0 ]; then
    browser_reason="$CHROMIUM is not installed and installing it needs root"
  else
    browser_reason="$CHROMIUM is not installed and there is no apt-get"
  fi
fi
if [ -n "$browser_reason" ]; then
  echo "browser suite: SKIPPED, not run: $browser_reason; its tests are counted as skipped"
else
  br_log=$(mktemp)
  br_status=0
  CHROMIUM="$CHROMIUM" cargo test --locked --test dashboard --test badges -- --ignored 2>&1 | tee "$br_log" || br_status=$?
  br_passed=$(count "$br_log" "passed;"); br_failed=$(count "$br_log" "failed;")
  if [ "$br_status" -ne 0 ] && [ "$br_failed" -eq 0 ]; then
    echo "browser suite FAILED to run (exit $br_status)"
    failed=$((failed + 1))
  else
    passed=$((passed + br_passed)); failed=$((failed + br_failed))
    ignored=$((ignored - br_passed - br_failed))
  fi
  echo "browser suite: screenshots in target/dashboard.png and target/badges.png"
  rm -f "$br_log"
fi

if [ -x scripts/schemathesis.sh ]; then
  echo "== schemathesis against a live server"
  scripts/schemathesis.sh
fi

# One closing line for the whole gate; the skipped tests are the query
# benchmark, and the real search engine and browser suites when they could
# not run.
echo "tests: ${passed} passed, ${failed} failed, ${ignored} skipped"
[ "$failed" -eq 0 ]
