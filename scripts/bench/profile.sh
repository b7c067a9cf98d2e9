#!/usr/bin/env bash
# CPU profile of the release gateway under one load of scripts/bench.sh,
# split by stage of a request (scripts/bench/stages.py), in CPU microseconds
# per request. Needs perf (Debian's linux-perf) and wrk.
#
#   scripts/bench/profile.sh            # single increments, 10k keys, fsync'd
#   scripts/bench/profile.sh batch      # POST /v1/events x1000
#   scripts/bench/profile.sh healthz
#   DURATION=10 CONNECTIONS=256 PROFILE_FLAGS='--durability relaxed' scripts/bench/profile.sh
#   BENCH_BIN=/tmp/cg-base scripts/bench/profile.sh     # another build
#   PAUSE=3 DURATION=3 scripts/bench/profile.sh         # a load that starts after 3 s of quiet
#
# The perf data, the stage table and a flat report stay in PROFILE_OUT.
# Sampling (cpu-clock, 499 Hz, DWARF call graphs) costs the gateway a few
# percent; compare stages within one profile, and CPU per request across
# runs of scripts/bench.sh, which does not sample.
set -euo pipefail
cd "$(dirname "$0")/../.."

LOAD=${1:-single}
DURATION=${DURATION:-10}
CONNECTIONS=${CONNECTIONS:-256}
THREADS=${THREADS:-2}
PROFILE_OUT=${PROFILE_OUT:-target/profile/$(date -u +%Y%m%dT%H%M%SZ)-$LOAD}
read -ra flags <<<"${PROFILE_FLAGS:-}"

case $LOAD in
  single) script=(-s scripts/bench/increment.lua) ;;
  batch) script=(-s scripts/bench/events.lua) ;;
  healthz) script=() ;;
  *) echo "unknown load $LOAD (single, batch, healthz)" >&2; exit 2 ;;
esac

mkdir -p "$PROFILE_OUT"
. scripts/bench/gateway.sh
start_gateway "$PROFILE_OUT/gateway.log" "${flags[@]}"
url=$base
[ "$LOAD" = healthz ] && url="$base/healthz"

# Warm up (the keys exist, caches are full), then profile one load.
wrk -t "$THREADS" -c "$CONNECTIONS" -d 3s "${script[@]}" "$url" >/dev/null
# Traffic that pauses: what the background does once flushes stop.
sleep "${PAUSE:-0}"
ticks() { awk '{print $14 + $15}' "/proc/$gw/stat"; }
before=$(ticks)
perf record -q -F 499 -e cpu-clock --call-graph dwarf,16384 -p "$gw" -o "$PROFILE_OUT/perf.data" \
  -- sleep "$DURATION" 2>"$PROFILE_OUT/perf-record.log" &
rec=$!
wrk -t "$THREADS" -c "$CONNECTIONS" -d "${DURATION}s" --latency "${script[@]}" "$url" >"$PROFILE_OUT/wrk.txt"
wait "$rec" || true
after=$(ticks)
requests=$(awk '/requests in/ {print $1}' "$PROFILE_OUT/wrk.txt")
cpu_us=$(( (after - before) * 1000000 / $(getconf CLK_TCK) ))

perf script -i "$PROFILE_OUT/perf.data" 2>/dev/null |
  python3 scripts/bench/stages.py --requests "$requests" --cpu-us "$cpu_us" | tee "$PROFILE_OUT/stages.txt"
perf report -i "$PROFILE_OUT/perf.data" --no-children --sort dso,symbol --stdio 2>/dev/null |
  grep -v '^$' | head -80 >"$PROFILE_OUT/flat.txt" || true
awk '/Requests\/sec/ {print "requests/s " $2} / 99%/ {print "p99 " $2}' "$PROFILE_OUT/wrk.txt"
echo "kept in $PROFILE_OUT"
