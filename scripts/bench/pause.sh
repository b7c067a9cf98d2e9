#!/usr/bin/env bash
# Single increments after a pause against back to back, on one gateway:
# what a load of single increments runs at right after a /healthz load,
# after a sleep, and with no pause before it (ROUNDS loads of DURATION
# each, 256 connections, 10k keys, after a 3 s warm-up that creates them).
# A store that empties its memory at every pause shows it here first.
#
#   scripts/bench/pause.sh
#   BENCH_BIN=/tmp/cg-base ROUNDS=6 DURATION=2 scripts/bench/pause.sh
set -euo pipefail
cd "$(dirname "$0")/../.."

DURATION=${DURATION:-2}
ROUNDS=${ROUNDS:-4}
. scripts/bench/gateway.sh
start_gateway "$work/log"

single() {
  wrk -t 2 -c 256 -d "${DURATION}s" -s scripts/bench/increment.lua "$base" | awk '/Requests\/sec/ {printf " %.0f", $2}'
}
wrk -t 2 -c 256 -d 3s -s scripts/bench/increment.lua "$base" >/dev/null
printf 'single increments a second, %s s loads\n' "$DURATION"
printf '%-24s' "after a /healthz load"
for _ in $(seq "$ROUNDS"); do
  wrk -t 2 -c 256 -d "${DURATION}s" "$base/healthz" >/dev/null
  single
done
printf '\n%-24s' "after ${DURATION} s of sleep"
for _ in $(seq "$ROUNDS"); do
  sleep "$DURATION"
  single
done
printf '\n%-24s' "back to back"
for _ in $(seq "$ROUNDS"); do single; done
echo
