#!/usr/bin/env bash
# Throughput of counter-gateway against its own /healthz and against Redis,
# measured in one run on one machine so the ratios hold while absolute
# figures drift (SPEC §5). Installs what it lacks, stops what it starts.
#
#   scripts/bench.sh                 # 10 s per load
#   DURATION=30s CONNECTIONS=256 scripts/bench.sh
set -euo pipefail
cd "$(dirname "$0")/.."

DURATION=${DURATION:-10s}
CONNECTIONS=${CONNECTIONS:-256}
THREADS=${THREADS:-2}
REDIS_REQUESTS=${REDIS_REQUESTS:-2000000}

need() { command -v "$1" >/dev/null 2>&1; }
if ! need wrk || ! need redis-server || ! need redis-benchmark; then
  echo "installing wrk and redis (Debian packages)..." >&2
  apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wrk redis-server redis-tools >/dev/null
fi

cargo build --release --locked --quiet
BIN=target/release/counter-gateway

work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

port=$(free_port)
NO_COLOR=1 RUST_LOG=warn "$BIN" serve --listen "127.0.0.1:$port" --data-dir "$work/data" >"$work/gateway.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do curl -sf "http://127.0.0.1:$port/healthz" >/dev/null && break; sleep 0.1; done
base="http://127.0.0.1:$port"

# wrk_rps LABEL ARGS...: runs wrk, prints requests/s, fails on errors.
wrk_rps() {
  local label=$1; shift
  local out
  out=$(wrk -t "$THREADS" -c "$CONNECTIONS" -d "$DURATION" --latency "$@")
  echo "$out" >"$work/wrk-$label.txt"
  local bad
  bad=$(echo "$out" | awk '/Non-2xx or 3xx responses/ {print $NF}')
  if [ -n "$bad" ]; then
    echo "warning: $label had $bad non-2xx responses (see below)" >&2
    echo "$out" >&2
  fi
  echo "$out" | awk '/Requests\/sec/ {print $2}'
}
p99() { awk '/ 99%/ {print $2}' "$work/wrk-$1.txt"; }

healthz=$(wrk_rps healthz "$base/healthz")
single=$(wrk_rps single -s scripts/bench/increment.lua "$base")
batch_rps=$(wrk_rps batch -s scripts/bench/events.lua "$base")
batch_incr=$(awk -v r="$batch_rps" 'BEGIN {printf "%.0f", r * 1000}')

# Every acknowledged increment must be in the store: compare the gateway's own
# count of flushed increments with what wrk saw acknowledged (a sanity check
# that the load was real writes, not errors).
flushed=$(curl -s "$base/metrics" | awk '/^counter_gateway_flushed_increments_total/ {print $2}')
writes=$(curl -s "$base/metrics" | awk '/^counter_gateway_store_writes_total/ {print $2}')

rport=$(free_port)
redis-server --port "$rport" --save '' --appendonly no --daemonize no >"$work/redis.log" 2>&1 &
pids+=($!)
for _ in $(seq 50); do redis-cli -p "$rport" ping >/dev/null 2>&1 && break; sleep 0.1; done
redis_rps() { redis-benchmark -p "$rport" -t incr -c "$CONNECTIONS" -n "$REDIS_REQUESTS" -q "$@" | tr '\r' '\n' | awk '/INCR:/ {print $2}' | tail -1; }
redis_plain=$(redis_rps)
redis_p16=$(redis_rps -P 16)

ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "n/a" }'; }
check() { awk -v r="$1" -v t="$2" 'BEGIN { print (r >= t ? "met" : "NOT met") }'; }

r1=$(ratio "$single" "$healthz"); r2=$(ratio "$single" "$redis_plain"); r3=$(ratio "$batch_incr" "$redis_p16")
printf '\ncounter-gateway benchmark (%s per load, %s connections, %s wrk threads, %s cores)\n' "$DURATION" "$CONNECTIONS" "$THREADS" "$(nproc)"
printf '%-48s %14s %10s\n' "load" "per second" "p99"
printf '%-48s %14.0f %10s\n' "GET /healthz" "$healthz" "$(p99 healthz)"
printf '%-48s %14.0f %10s\n' "POST single increment (10k keys, fsync'd)" "$single" "$(p99 single)"
printf '%-48s %14.0f %10s\n' "POST /v1/events x1000 (requests)" "$batch_rps" "$(p99 batch)"
printf '%-48s %14.0f\n' "  increments in batches" "$batch_incr"
printf '%-48s %14.0f\n' "redis-benchmark -t incr" "$redis_plain"
printf '%-48s %14.0f\n' "redis-benchmark -t incr -P 16" "$redis_p16"
printf '\n%-48s %8s %8s %8s\n' "target (SPEC §5)" "ratio" "needed" ""
printf '%-48s %8s %8s %8s\n' "single increments / healthz" "$r1" "0.80" "$(check "$r1" 0.8)"
printf '%-48s %8s %8s %8s\n' "single increments / redis incr" "$r2" "1.00" "$(check "$r2" 1.0)"
printf '%-48s %8s %8s %8s\n' "batched increments / redis incr -P 16" "$r3" "1.50" "$(check "$r3" 1.5)"
printf '%-48s %8s %8s %8s\n' "batched increments per second / 2,000,000" "$(ratio "$batch_incr" 2000000)" "1.00" "$(check "$(ratio "$batch_incr" 2000000)" 1.0)"
printf '\nincrements flushed %s, store writes %s (coalescing ratio %s increments per write)\n' \
  "$flushed" "$writes" "$(ratio "$flushed" "$writes")"
