# Sourced by the benchmark scripts that measure one embedded gateway
# (threads.sh, profile.sh, pause.sh): the build to measure, a gateway on a
# free port over a fresh data directory, and its cleanup on exit.
#
#   . scripts/bench/gateway.sh
#   start_gateway LOG [serve flags...]   # sets BIN, gw (its pid), base (its URL)

# BENCH_BIN: another build (e.g. one of an earlier commit) instead of this
# tree's release binary, built here when not given.
if [ -n "${BENCH_BIN:-}" ]; then
  BIN=$BENCH_BIN
else
  cargo build --release --locked --quiet
  BIN=target/release/counter-gateway
fi
work=$(mktemp -d)
gw=""
cleanup() {
  [ -n "$gw" ] && kill "$gw" 2>/dev/null || true
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

# start_gateway LOG [FLAGS...]: serves the embedded store with FLAGS, its
# output to LOG, and waits until it answers /healthz.
start_gateway() {
  local log=$1 port
  shift
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  NO_COLOR=1 RUST_LOG=warn "$BIN" serve --listen "127.0.0.1:$port" --data-dir "$work/data" "$@" >"$log" 2>&1 &
  gw=$!
  base="http://127.0.0.1:$port"
  for _ in $(seq 100); do curl -sf "$base/healthz" >/dev/null && break; sleep 0.1; done
}
