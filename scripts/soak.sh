#!/usr/bin/env bash
# Overload soak of counter-gateway (issue 14): measure its capacity, then drive
# it at twice that or more for SOAK_SECONDS, and check that resident memory
# stays flat, every request gets 200 or 503 with Retry-After, and every
# acknowledged increment is in the store afterwards. A benchmark, not a test:
# it needs minutes and a quiet machine. Exits non-zero when a check fails.
#
#   scripts/soak.sh                                   # 20 s probe, 600 s overload
#   SOAK_SECONDS=30 SOAK_PROBE_SECONDS=10 scripts/soak.sh
#   SOAK_GATEWAY_FLAGS='--queue-capacity 200000' scripts/soak.sh
#
# Load: closed-loop wrk (scripts/bench/soak.lua), SOAK_CONNECTIONS connections
# sending POST /v1/events batches of SOAK_BATCH events beside
# SOAK_SINGLE_CONNECTIONS sending single increments. Enough connections that
# their batches exceed the queue bound, so the surplus is refused with 503 at
# once and comes straight back: offered load is what wrk sends, measured.
# Results (wrk outputs, RSS samples, gateway log, summary) stay in SOAK_OUT.
set -euo pipefail
cd "$(dirname "$0")/.."

SOAK_SECONDS=${SOAK_SECONDS:-600}
SOAK_PROBE_SECONDS=${SOAK_PROBE_SECONDS:-20}
SOAK_CONNECTIONS=${SOAK_CONNECTIONS:-896}
SOAK_SINGLE_CONNECTIONS=${SOAK_SINGLE_CONNECTIONS:-64}
SOAK_PROBE_CONNECTIONS=${SOAK_PROBE_CONNECTIONS:-256}
SOAK_PROBE_SINGLE_CONNECTIONS=${SOAK_PROBE_SINGLE_CONNECTIONS:-16}
SOAK_BATCH=${SOAK_BATCH:-2000}
SOAK_THREADS=${SOAK_THREADS:-2}
SOAK_INTERVAL=${SOAK_INTERVAL:-5}
SOAK_MIN_RATIO=${SOAK_MIN_RATIO:-2}
SOAK_FLAT_TOLERANCE=${SOAK_FLAT_TOLERANCE:-0.10}
SOAK_STOP_TIMEOUT=${SOAK_STOP_TIMEOUT:-120}
SOAK_OUT=${SOAK_OUT:-target/soak/$(date -u +%Y%m%dT%H%M%SZ)}
read -ra gateway_flags <<<"${SOAK_GATEWAY_FLAGS:-}"

if ! command -v wrk >/dev/null 2>&1; then
  echo "installing wrk (Debian package)..." >&2
  apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wrk >/dev/null
fi
# Both ends hold a socket per connection.
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
if [ "$(ulimit -n)" != unlimited ] && [ "$(ulimit -n)" -lt $((SOAK_CONNECTIONS + SOAK_SINGLE_CONNECTIONS + 256)) ]; then
  echo "open file limit $(ulimit -n) is below the $((SOAK_CONNECTIONS + SOAK_SINGLE_CONNECTIONS)) connections" >&2
  exit 2
fi

cargo build --release --locked --quiet
BIN=target/release/counter-gateway

mkdir -p "$SOAK_OUT"
out=$(cd "$SOAK_OUT" && pwd)
work=$(mktemp -d)
gw=""
pids=()
cleanup() {
  touch "$work/stop"
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  [ -n "$gw" ] && kill "$gw" 2>/dev/null || true
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
port=$(free_port)
base="http://127.0.0.1:$port"
NO_COLOR=1 RUST_LOG=warn "$BIN" serve --listen "127.0.0.1:$port" --data-dir "$work/data" \
  "${gateway_flags[@]}" >"$out/gateway.log" 2>&1 &
gw=$!
for _ in $(seq 200); do curl -sf "$base/readyz" >/dev/null && break; sleep 0.1; done
curl -sf "$base/readyz" >/dev/null || { echo "the gateway did not become ready:" >&2; cat "$out/gateway.log" >&2; exit 1; }

echo idle >"$work/phase"
python3 scripts/bench/soak_sample.py --pid "$gw" --metrics "$base/metrics" --out "$out/rss.csv" \
  --phase-file "$work/phase" --stop-file "$work/stop" --interval "$SOAK_INTERVAL" \
  --max-seconds $((SOAK_PROBE_SECONDS + SOAK_SECONDS + 2 * SOAK_STOP_TIMEOUT + 60)) &
pids+=($!)

# load LABEL SECONDS BATCH-CONNECTIONS SINGLE-CONNECTIONS: both wrk runs at
# once, each thread on its own keys (entity LABEL), outputs in $out.
load() {
  local label=$1 secs=$2 bc=$3 sc=$4 a b
  local opts=(-t "$SOAK_THREADS" -d "${secs}s" --timeout 120s -s scripts/bench/soak.lua)
  wrk "${opts[@]}" -c "$bc" "$base" -- batch "$label" "$SOAK_BATCH" 5000 >"$out/wrk-$label-batch.txt" 2>&1 &
  a=$!
  wrk "${opts[@]}" -c "$sc" "$base" -- single "$label" 1 1000 >"$out/wrk-$label-single.txt" 2>&1 &
  b=$!
  wait "$a" && wait "$b"
}

echo "capacity probe: ${SOAK_PROBE_SECONDS} s, $SOAK_PROBE_CONNECTIONS batch + $SOAK_PROBE_SINGLE_CONNECTIONS single connections..." >&2
echo probe >"$work/phase"
load PROBE "$SOAK_PROBE_SECONDS" "$SOAK_PROBE_CONNECTIONS" "$SOAK_PROBE_SINGLE_CONNECTIONS"

# The overload starts from a drained queue (waiting at most
# SOAK_STOP_TIMEOUT): connections opened while the
# gateway is saturated can overflow its listen backlog, and the kernel then
# resets some of them (counted below as ListenOverflows).
for _ in $(seq $((SOAK_STOP_TIMEOUT * 2))); do
  depth=$(curl -s -m 2 "$base/metrics" | awk '/^counter_gateway_queue_depth/ {print $2}')
  [ "$depth" = 0 ] && break
  sleep 0.5
done
listen_overflows() { awk '/^TcpExt:/ { if (!h) { for (i = 1; i <= NF; i++) f[i] = $i; h = 1 } else for (i = 1; i <= NF; i++) if (f[i] == "ListenOverflows") print $i }' /proc/net/netstat; }
overflows_before=$(listen_overflows)
backlog=$(ss -Hltn "sport = :$port" 2>/dev/null | awk '{print $3; exit}')

echo "overload: ${SOAK_SECONDS} s, $SOAK_CONNECTIONS batch + $SOAK_SINGLE_CONNECTIONS single connections..." >&2
echo soak >"$work/phase"
soak_start=$(date +%s.%N)
load SOAK "$SOAK_SECONDS" "$SOAK_CONNECTIONS" "$SOAK_SINGLE_CONNECTIONS"
soak_end=$(date +%s.%N)
overflows=$(($(listen_overflows) - overflows_before))
echo drain >"$work/phase"
sleep "$SOAK_INTERVAL"
touch "$work/stop"

# A clean stop flushes what is queued; then the store file is complete.
kill -TERM "$gw"
for _ in $(seq $((SOAK_STOP_TIMEOUT * 2))); do kill -0 "$gw" 2>/dev/null || break; sleep 0.5; done
if kill -0 "$gw" 2>/dev/null; then
  echo "the gateway did not stop within ${SOAK_STOP_TIMEOUT} s of SIGTERM" >&2
  kill -KILL "$gw"
fi
gw_exit=0
wait "$gw" || gw_exit=$?
gw=""

cp "$work"/data/counters.sqlite3* "$out"/
set +e
python3 scripts/bench/soak_report.py \
  --probe "$out/wrk-PROBE-batch.txt" "$out/wrk-PROBE-single.txt" \
  --soak "$out/wrk-SOAK-batch.txt" "$out/wrk-SOAK-single.txt" \
  --db "$out/counters.sqlite3" --rss "$out/rss.csv" \
  --soak-start "$soak_start" --soak-end "$soak_end" \
  --min-ratio "$SOAK_MIN_RATIO" --flat-tolerance "$SOAK_FLAT_TOLERANCE" \
  --listen-overflows "$overflows" --backlog "${backlog:-?}" \
  --gateway-exit "$gw_exit" --gateway-log "$out/gateway.log" --flags "${SOAK_GATEWAY_FLAGS:-}" |
  tee "$out/summary.txt"
status=${PIPESTATUS[0]}
set -e
echo "machine: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg); files in $out" | tee -a "$out/summary.txt"
exit "$status"
