#!/usr/bin/env bash
# Per-thread CPU and context switches of the release gateway under one
# load of scripts/bench.sh, per request: which thread a request's CPU goes
# to (the tokio workers, the flusher's and the syncer's blocking threads)
# and how often each is switched out. Read from /proc/<pid>/task/*/{stat,status}
# before and after the load; no profiler, so nothing is added to the load.
#
#   scripts/bench/threads.sh                       # single increments, 10k keys, fsync'd
#   scripts/bench/threads.sh healthz
#   BENCH_BIN=/tmp/cg-base scripts/bench/threads.sh # another build
#   DURATION=10 scripts/bench/threads.sh
set -euo pipefail
cd "$(dirname "$0")/../.."

LOAD=${1:-single}
DURATION=${DURATION:-8}
case $LOAD in
  single) script=(-s scripts/bench/increment.lua) ;;
  healthz) script=() ;;
  *) echo "unknown load $LOAD (single, healthz)" >&2; exit 2 ;;
esac
. scripts/bench/gateway.sh
start_gateway "$work/log"
url=$base
[ "$LOAD" = healthz ] && url="$base/healthz"
wrk -t 2 -c 256 -d 2s "${script[@]}" "$url" >/dev/null

# One line per thread: id, voluntary and involuntary switches, CPU ticks, name.
snap() {
  for t in /proc/"$gw"/task/*; do
    echo "$(basename "$t") $(awk '/^voluntary_ctxt/ {v=$2} /^nonvoluntary_ctxt/ {n=$2} END {print v, n}' "$t/status") $(awk '{print $14 + $15}' "$t/stat") $(cat "$t/comm")"
  done | sort
}
snap >"$work/before"
out=$(wrk -t 2 -c 256 -d "${DURATION}s" "${script[@]}" "$url")
snap >"$work/after"
n=$(echo "$out" | awk '/requests in/ {print $1}')
echo "$out" | awk '/Requests\/sec/ {print "requests/s " $2}'
printf '%-8s %-18s %10s %10s %12s\n' "thread" "name" "vol/req" "invol/req" "CPU us/req"
join "$work/before" "$work/after" | awk -v n="$n" -v tick="$((1000000 / $(getconf CLK_TCK)))" '
  { dv = $6 - $2; dn = $7 - $3; dc = $8 - $4
    if (dv + dn + dc > 0) printf "%-8s %-18s %10.3f %10.3f %12.2f\n", $1, $5, dv / n, dn / n, dc * tick / n
    tv += dv; tn += dn; tc += dc }
  END { printf "%-8s %-18s %10.3f %10.3f %12.2f\n", "all", "", tv / n, tn / n, tc * tick / n }'
