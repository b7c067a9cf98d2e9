#!/usr/bin/env bash
# Real single-node OpenSearch 2.19 for tests, run in a JVM from Maven Central jars
# (see scripts/opensearch/README.md).
#
#   scripts/opensearch.sh build                      resolve jars + compile (fast when up to date)
#   scripts/opensearch.sh start [--pidfile F] [--parent-pid PID] [--watch-stdin]
#                                                    start in background; prints OPENSEARCH_URL=, OPENSEARCH_PID=, OPENSEARCH_LOG=
#   scripts/opensearch.sh stop [--pidfile F] [--drain]
#                                                    SIGTERM, SIGKILL after a grace period, wait; --drain first moves
#                                                    the node's shards away (allocation exclude) and waits for that
#   scripts/opensearch.sh run [--nodes N] [--] CMD... start (N nodes: a cluster on loopback, all started at once), run
#                                                    CMD with ELASTICSEARCH_URL/OPENSEARCH_URL (the first node) and
#                                                    OPENSEARCH_URLS (every node, comma-separated), always stop,
#                                                    exit with CMD's status
#
# Exit codes: 3 = unavailable here (no java/mvn, Maven cannot resolve/build); stderr has one line
# "opensearch: unavailable: <reason>". 4 = the node did not start. 2 = usage.
#
# Environment: OPENSEARCH_PORT (fixed HTTP port), OPENSEARCH_TRANSPORT_PORT, OPENSEARCH_DATA_DIR (kept
# across runs; default is a fresh temp dir removed on exit), OPENSEARCH_JAVA_OPTS (default -Xms1g -Xmx1g),
# OPENSEARCH_LOG_LEVEL (default WARN), OPENSEARCH_START_TIMEOUT (s, default 180),
# OPENSEARCH_STOP_GRACE (s, default 30), OPENSEARCH_DRAIN_TIMEOUT (s, default 120), JAVA_HOME.
# A cluster member (start): OPENSEARCH_NODE_NAME, OPENSEARCH_SEED_HOSTS (host:transport_port,...) and
# OPENSEARCH_INITIAL_MANAGERS (node names); it prints its URL once the cluster is yellow.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/opensearch"
TARGET="$ROOT/target"
CLASSPATH_FILE="$TARGET/classpath.txt"
STAMP="$TARGET/.build-ok"
MAIN_CLASS=counter.gateway.TestNode

unavailable() { echo "opensearch: unavailable: $*" >&2; exit 3; }
die() { echo "opensearch: $*" >&2; exit "${2:-1}"; }

java_bin() {
  if [[ -n "${JAVA_HOME:-}" && -x "$JAVA_HOME/bin/java" ]]; then echo "$JAVA_HOME/bin/java"
  elif command -v java >/dev/null 2>&1; then command -v java
  else return 1; fi
}

up_to_date() {
  [[ -f "$STAMP" && -f "$CLASSPATH_FILE" && -f "$TARGET/classes/counter/gateway/TestNode.class" ]] || return 1
  [[ "$STAMP" -nt "$ROOT/pom.xml" ]] || return 1
  local src
  while IFS= read -r src; do [[ "$STAMP" -nt "$src" ]] || return 1; done < <(find "$ROOT/src" -type f)
  local jar
  IFS=: read -r -a jars < "$CLASSPATH_FILE" || true
  for jar in "${jars[@]}"; do [[ -f "$jar" ]] || return 1; done
}

cmd_build() {
  java_bin >/dev/null || unavailable "java not found (need Java 11+, e.g. apt-get install openjdk-17-jdk-headless)"
  up_to_date && return 0
  command -v mvn >/dev/null 2>&1 || unavailable "mvn not found (apt-get install maven)"
  mkdir -p "$TARGET"
  local log="$TARGET/mvn.log"
  local goals=(compile dependency:build-classpath "-Dmdep.outputFile=$CLASSPATH_FILE")
  (
    # serialize concurrent builds
    if command -v flock >/dev/null 2>&1; then exec 9>"$TARGET/.build.lock"; flock 9; fi
    up_to_date && exit 0
    rm -f "$STAMP"
    # offline first (works without network once ~/.m2 is warm), then online
    if mvn -B -q -o -f "$ROOT/pom.xml" "${goals[@]}" >"$log" 2>&1 \
       || mvn -B -q -f "$ROOT/pom.xml" "${goals[@]}" >"$log" 2>&1; then
      touch "$STAMP"
    else
      reason="$(grep -m1 -E '\[ERROR\]' "$log" | sed -e 's/\x1b\[[0-9;]*m//g' -e 's/^\[ERROR\] *//' | cut -c1-300)"
      unavailable "maven could not resolve/build the node (${reason:-see $log}); log: $log"
    fi
  )
}

# is PID a live process (not a zombie)?
alive() {
  local pid="$1" stat
  stat="$(cat "/proc/$pid/stat" 2>/dev/null)" || return 1
  stat="${stat##*) }"
  [[ "${stat:0:1}" != Z ]]
}

# is PID a live TestNode JVM?
is_node() {
  local pid="$1"
  [[ -n "$pid" && -r "/proc/$pid/cmdline" ]] && tr '\0' ' ' < "/proc/$pid/cmdline" | grep -q "$MAIN_CLASS"
}

cmd_start() {
  local pidfile="$TARGET/opensearch.pid" parent="" watch_stdin=0
  while [[ $# -gt 0 ]]; do
    case "$1" in
      --pidfile) pidfile="$2"; shift 2 ;;
      --parent-pid) parent="$2"; shift 2 ;;
      --watch-stdin) watch_stdin=1; shift ;;
      *) die "start: unknown option $1" 2 ;;
    esac
  done
  cmd_build || exit $?
  local java; java="$(java_bin)"
  if [[ -f "$pidfile" ]] && is_node "$(cat "$pidfile")"; then
    die "start: a node is already running (pid $(cat "$pidfile"), pidfile $pidfile)" 4
  fi
  mkdir -p "$TARGET/runs" "$(dirname "$pidfile")"
  find "$TARGET/runs" -mindepth 1 -maxdepth 1 -mtime +1 -exec rm -rf {} + 2>/dev/null || true
  local rundir; rundir="$(mktemp -d "$TARGET/runs/node.XXXXXX")"
  local out="$rundir/stdout" log="$rundir/node.log"
  : >"$out"; : >"$log"
  local args=()
  [[ -n "$parent" ]] && args+=(--parent-pid "$parent")
  # shellcheck disable=SC2206
  local opts=(${OPENSEARCH_JAVA_OPTS:--Xms1g -Xmx1g})
  opts+=(-XX:+UseG1GC -XX:+ExitOnOutOfMemoryError -XX:-OmitStackTraceInFastThrow
         -Dfile.encoding=UTF-8 -Djava.awt.headless=true -Dlog4j2.disable.jmx=true
         -Dlog4j.shutdownHookEnabled=false -Dio.netty.allocator.numDirectArenas=0)
  local cp="$TARGET/classes:$(cat "$CLASSPATH_FILE")"
  if [[ $watch_stdin == 1 ]]; then
    OPENSEARCH_WATCH_STDIN=1 "$java" "${opts[@]}" -cp "$cp" "$MAIN_CLASS" "${args[@]}" >"$out" 2>"$log" &
  else
    OPENSEARCH_WATCH_STDIN=0 "$java" "${opts[@]}" -cp "$cp" "$MAIN_CLASS" "${args[@]}" >"$out" 2>"$log" </dev/null &
  fi
  local pid=$!
  echo "$pid" > "$pidfile"
  local timeout="${OPENSEARCH_START_TIMEOUT:-180}" t0=$SECONDS url=""
  while :; do
    url="$(sed -n 's/^OPENSEARCH_URL=//p' "$out" 2>/dev/null | head -n1)" || url=""
    [[ -n "$url" ]] && break
    if ! alive "$pid"; then
      wait "$pid" 2>/dev/null || true
      rm -f "$pidfile"
      { echo "opensearch: start failed: node exited before becoming ready; log: $log"
        log_excerpt "$log"; } >&2
      exit 4
    fi
    if (( SECONDS - t0 >= timeout )); then
      kill -TERM "$pid" 2>/dev/null || true
      stop_pid "$pid"
      rm -f "$pidfile"
      { echo "opensearch: start failed: no OPENSEARCH_URL within ${timeout}s; log: $log"
        log_excerpt "$log"; } >&2
      exit 4
    fi
    sleep 0.2
  done
  echo "$url" > "$pidfile.url"
  local name="${OPENSEARCH_NODE_NAME:-}"
  if [[ -n "${OPENSEARCH_SEED_HOSTS:-}" && -n "$name" ]]; then
    echo "$name" > "$pidfile.name"
    include_again "$url" "$name"
  fi
  echo "OPENSEARCH_URL=$url"
  echo "OPENSEARCH_PID=$pid"
  echo "OPENSEARCH_LOG=$log"
}

# the launcher's own lines (they name the failure) and the log's tail
log_excerpt() {
  # (no such line is no error: under set -e and pipefail it would turn exit 4 into 1)
  { grep -E '^opensearch test node:' "$1" || true; } | head -n 5 | sed 's/^/  | /'
  echo "  | ... last lines:"
  tail -n 20 "$1" | sed 's/^/  | /'
}

# SIGTERM, then SIGKILL after the grace period; wait until gone
stop_pid() {
  local pid="$1" grace="${OPENSEARCH_STOP_GRACE:-30}" i
  is_node "$pid" || return 0   # not ours (or already gone): never signal a recycled pid
  kill -TERM "$pid" 2>/dev/null || true
  # wait for the process itself (a JVM in exit has an empty cmdline for a while)
  for ((i = 0; i < grace * 10; i++)); do alive "$pid" || return 0; sleep 0.1; done
  echo "opensearch: pid $pid still running after ${grace}s, sending SIGKILL" >&2
  kill -KILL "$pid" 2>/dev/null || true
  for ((i = 0; i < 100; i++)); do alive "$pid" || return 0; sleep 0.1; done
  die "stop: pid $pid did not exit" 1
}

# a node restarted after a drain takes shards again (the exclusion names it until cleared)
include_again() {
  local url="$1" name="$2" excluded
  excluded="$(curl -sf "$url/_cluster/settings?flat_settings=true" | jq -r '.transient["cluster.routing.allocation.exclude._name"] // ""')" || return 0
  [[ "$excluded" == "$name" ]] || return 0
  curl -sf -XPUT -H 'content-type: application/json' "$url/_cluster/settings" \
    -d '{"transient":{"cluster.routing.allocation.exclude._name":null}}' >/dev/null \
    || echo "opensearch: could not clear the allocation exclusion of $name" >&2
}

# move every shard off the node (allocation exclude by name), wait until it holds none
drain() {
  local pidfile="$1" url name timeout="${OPENSEARCH_DRAIN_TIMEOUT:-120}" t0=$SECONDS left
  url="$(cat "$pidfile.url" 2>/dev/null)" || die "stop --drain: no $pidfile.url" 1
  name="$(cat "$pidfile.name" 2>/dev/null)" || die "stop --drain: not a cluster member (no $pidfile.name)" 1
  command -v curl >/dev/null && command -v jq >/dev/null || die "stop --drain needs curl and jq" 1
  curl -sf -XPUT -H 'content-type: application/json' "$url/_cluster/settings" \
    -d "{\"transient\":{\"cluster.routing.allocation.exclude._name\":\"$name\"}}" >/dev/null \
    || die "stop --drain: $url refused the allocation exclusion" 1
  while :; do
    left="$(curl -sf "$url/_cat/shards?format=json&h=node" | jq --arg n "$name" '[.[] | select(.node == $n)] | length')" || left="?"
    [[ "$left" == 0 ]] && break
    (( SECONDS - t0 >= timeout )) && die "stop --drain: $name still holds $left shards after ${timeout}s" 1
    sleep 0.5
  done
  echo "opensearch: $name drained in $((SECONDS - t0))s" >&2
}

cmd_stop() {
  local pidfile="$TARGET/opensearch.pid" drain=0
  while [[ $# -gt 0 ]]; do
    case "$1" in
      --pidfile) pidfile="$2"; shift 2 ;;
      --drain) drain=1; shift ;;
      *) die "stop: unknown option $1" 2 ;;
    esac
  done
  [[ -f "$pidfile" ]] || { echo "opensearch: stop: no pidfile $pidfile" >&2; return 0; }
  [[ $drain == 1 ]] && is_node "$(cat "$pidfile")" && drain "$pidfile"
  stop_pid "$(cat "$pidfile")"
  rm -f "$pidfile" "$pidfile.url" "$pidfile.name"
}

# a loopback port nothing listens on (nothing answers a connect), below the
# kernel's ephemeral range: a port inside it can become some connection's
# source port between this probe and the node's bind
free_port() {
  local p low=32768
  read -r low _ < /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || true
  (( low > 11000 )) || low=32768
  while :; do
    p=$((10000 + RANDOM % (low - 10000)))
    (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null || { echo "$p"; return; }
  done
}

# start N cluster members at once (each waits for the others); pidfiles BASE.1 .. BASE.N
start_cluster() {
  local n="$1" base="$2" i seeds="" managers="" pids=() rc=0
  local -a http transport
  cmd_build || return $?
  for ((i = 1; i <= n; i++)); do
    http[i]="$(free_port)"; transport[i]="$(free_port)"
    seeds+="${seeds:+,}127.0.0.1:${transport[i]}"; managers+="${managers:+,}node-$i"
  done
  for ((i = 1; i <= n; i++)); do
    OPENSEARCH_PORT="${http[i]}" OPENSEARCH_TRANSPORT_PORT="${transport[i]}" OPENSEARCH_NODE_NAME="node-$i" \
      OPENSEARCH_SEED_HOSTS="$seeds" OPENSEARCH_INITIAL_MANAGERS="$managers" \
      OPENSEARCH_JAVA_OPTS="${OPENSEARCH_JAVA_OPTS:--Xms512m -Xmx512m}" \
      cmd_start --pidfile "$base.$i" --parent-pid $$ > "$base.$i.start" 2> "$base.$i.err" &
    pids[i]=$!
  done
  for ((i = 1; i <= n; i++)); do wait "${pids[i]}" || rc=$?; done
  return "$rc"
}

# start_cluster, again on fresh ports (at most 3 tries) when a node could not
# bind the port it was given; any other failure is reported at once
start_cluster_retrying() {
  local n="$1" base="$2" try rc i
  for try in 1 2 3; do
    rc=0
    start_cluster "$n" "$base" || rc=$?
    for ((i = 1; i <= n; i++)); do cat "$base.$i.err" >&2 2>/dev/null || true; done
    (( rc == 0 )) && break
    cat "$base".*.err 2>/dev/null | grep -q 'BindException' || break
    (( try < 3 )) || break
    echo "opensearch: a node could not bind its port; starting the cluster again on other ports" >&2
    for ((i = 1; i <= n; i++)); do
      [[ -f "$base.$i" ]] && cmd_stop --pidfile "$base.$i"
      rm -f "$base.$i.start"
    done
  done
  rm -f "$base".*.err
  return "$rc"
}

cmd_run_cluster() {
  local n="$1"; shift
  mkdir -p "$TARGET/runs"
  RUN_PIDFILE="$(mktemp "$TARGET/runs/run.XXXXXX")"; rm -f "$RUN_PIDFILE"
  RUN_CHILD=""; RUN_NODES="$n"
  trap 'for ((j = 1; j <= RUN_NODES; j++)); do [[ -f "$RUN_PIDFILE.$j" ]] && cmd_stop --pidfile "$RUN_PIDFILE.$j"; done' EXIT
  trap 'on_signal 130 INT' INT
  trap 'on_signal 143 TERM' TERM
  local rc=0 i urls=""
  start_cluster_retrying "$n" "$RUN_PIDFILE" || rc=$?
  for ((i = 1; i <= n; i++)); do
    cat "$RUN_PIDFILE.$i.start" >&2 2>/dev/null || true
    urls+="${urls:+,}$(sed -n 's/^OPENSEARCH_URL=//p' "$RUN_PIDFILE.$i.start" 2>/dev/null)"
    rm -f "$RUN_PIDFILE.$i.start"
  done
  (( rc == 0 )) || exit "$rc"
  OPENSEARCH_URL="${urls%%,*}"
  export OPENSEARCH_URL ELASTICSEARCH_URL="$OPENSEARCH_URL" OPENSEARCH_URLS="$urls"
  if [[ -e /dev/fd/0 ]]; then "$@" 0<&0 & else "$@" 0<&- & fi
  RUN_CHILD=$!
  wait "$RUN_CHILD" || rc=$?
  RUN_CHILD=""
  exit "$rc"
}

cmd_run() {
  if [[ "${1:-}" == "--nodes" ]]; then
    local n="${2:-}"; shift 2 || die "run: --nodes needs a number" 2
    [[ "$n" =~ ^[1-9]$ ]] || die "run: --nodes takes 1 to 9, got $n" 2
    [[ "${1:-}" == "--" ]] && shift
    [[ $# -gt 0 ]] || die "run: missing command" 2
    if (( n > 1 )); then cmd_run_cluster "$n" "$@"; fi
  fi
  [[ "${1:-}" == "--" ]] && shift
  [[ $# -gt 0 ]] || die "run: missing command" 2
  mkdir -p "$TARGET/runs"
  RUN_PIDFILE="$(mktemp "$TARGET/runs/run.XXXXXX")"; rm -f "$RUN_PIDFILE"
  RUN_CHILD=""
  trap '[[ -f "$RUN_PIDFILE" ]] && cmd_stop --pidfile "$RUN_PIDFILE"' EXIT
  trap 'on_signal 130 INT' INT
  trap 'on_signal 143 TERM' TERM
  # not in $(...): a failing start must exit this shell (3 or 4), which runs the EXIT trap
  cmd_start --pidfile "$RUN_PIDFILE" --parent-pid $$ > "$RUN_PIDFILE.start"
  cat "$RUN_PIDFILE.start" >&2
  OPENSEARCH_URL="$(sed -n 's/^OPENSEARCH_URL=//p' "$RUN_PIDFILE.start")"
  rm -f "$RUN_PIDFILE.start"
  export OPENSEARCH_URL ELASTICSEARCH_URL="$OPENSEARCH_URL"
  # in the background + wait, so that a signal to this script is handled at once
  local rc=0
  # (explicit stdin: a background job would get /dev/null; a closed stdin stays closed)
  if [[ -e /dev/fd/0 ]]; then "$@" 0<&0 & else "$@" 0<&- & fi
  RUN_CHILD=$!
  wait "$RUN_CHILD" || rc=$?
  RUN_CHILD=""
  exit "$rc"
}

# run: pass INT/TERM on to CMD, wait for it, then exit (the EXIT trap stops the node)
on_signal() {
  trap '' INT TERM
  if [[ -n "${RUN_CHILD:-}" ]]; then
    kill -"$2" "$RUN_CHILD" 2>/dev/null || true
    wait "$RUN_CHILD" 2>/dev/null || true
  fi
  exit "$1"
}

case "${1:-}" in
  build) shift; cmd_build "$@" ;;
  start) shift; cmd_start "$@" ;;
  stop) shift; cmd_stop "$@" ;;
  run) shift; cmd_run "$@" ;;
  *) sed -n '2,26p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
esac
