# Shared body of the single-node test-engine launchers (scripts/elasticsearch-node.sh,
# scripts/opensearch3.sh): build the node's jars with Maven, start it in the background,
# wait for its URL line, stop it by pid, or run a command with it. Sourced, not run.
#
# The caller sets, before sourcing:
#   NODE_NAME        word that starts every message (e.g. elasticsearch)
#   NODE_ENV         prefix of the node's environment variables (e.g. ELASTICSEARCH: _PORT, _JAVA_OPTS...)
#   NODE_ROOT        the Maven project (pom.xml, src/)
#   NODE_MAIN_CLASS  the Java main, also how a pid is recognized as our node
#   NODE_URL_KEY     the stdout line's key the main prints when ready (e.g. ELASTICSEARCH_URL)
#   NODE_JAVA_HINT   what to install when java is missing or too old
#   NODE_JAVA_MIN    least Java feature version (e.g. 11)
#   NODE_USAGE_LINES the range of the caller's header lines to print as usage (e.g. 2,20)
#   NODE_SCRIPT      the caller's path (for usage)
# and may define node_java_candidates (prints candidate java paths, best first).
#
# Exit codes: 3 = unavailable here (no suitable java/mvn, Maven cannot resolve/build); stderr has
# one line "$NODE_NAME: unavailable: <reason>". 4 = the node did not start. 2 = usage.

TARGET="$NODE_ROOT/target"
CLASSPATH_FILE="$TARGET/classpath.txt"
STAMP="$TARGET/.build-ok"

unavailable() { echo "$NODE_NAME: unavailable: $*" >&2; exit 3; }
die() { echo "$NODE_NAME: $*" >&2; exit "${2:-1}"; }
node_env() { local v="${NODE_ENV}_$1"; echo "${!v:-$2}"; }

java_feature() { "$1" -XshowSettings:properties -version 2>&1 | sed -n 's/^ *java.specification.version = //p' | head -n1; }

# the first java (JAVA_HOME's, then the caller's candidates, then PATH's) of at least NODE_JAVA_MIN
java_bin() {
  local c v
  while IFS= read -r c; do
    [[ -n "$c" && -x "$c" ]] || continue
    v="$(java_feature "$c")"
    [[ "$v" =~ ^[0-9]+$ ]] && (( v >= NODE_JAVA_MIN )) && { echo "$c"; return 0; }
  done < <(
    [[ -n "${JAVA_HOME:-}" ]] && echo "$JAVA_HOME/bin/java"
    declare -F node_java_candidates >/dev/null && node_java_candidates
    command -v java 2>/dev/null || true
  )
  return 1
}

up_to_date() {
  [[ -f "$STAMP" && -f "$CLASSPATH_FILE" ]] || return 1
  [[ "$STAMP" -nt "$NODE_ROOT/pom.xml" ]] || return 1
  local src
  while IFS= read -r src; do [[ "$STAMP" -nt "$src" ]] || return 1; done < <(find "$NODE_ROOT/src" -type f)
  local jar jars=()
  IFS=: read -r -a jars < "$CLASSPATH_FILE" || true
  for jar in "${jars[@]}"; do [[ -f "$jar" ]] || return 1; done
}

cmd_build() {
  local java
  java="$(java_bin)" || unavailable "no Java $NODE_JAVA_MIN+ found ($NODE_JAVA_HINT)"
  up_to_date && return 0
  command -v mvn >/dev/null 2>&1 || unavailable "mvn not found (apt-get install maven)"
  mkdir -p "$TARGET"
  local log="$TARGET/mvn.log"
  local goals=(compile dependency:build-classpath "-Dmdep.outputFile=$CLASSPATH_FILE")
  (
    # maven compiles with the java the node runs on
    export JAVA_HOME; JAVA_HOME="$(dirname "$(dirname "$(readlink -f "$java")")")"
    if command -v flock >/dev/null 2>&1; then exec 9>"$TARGET/.build.lock"; flock 9; fi
    up_to_date && exit 0
    rm -f "$STAMP"
    # offline first (works without network once ~/.m2 is warm), then online
    if mvn -B -q -o -f "$NODE_ROOT/pom.xml" "${goals[@]}" >"$log" 2>&1 \
       || mvn -B -q -f "$NODE_ROOT/pom.xml" "${goals[@]}" >"$log" 2>&1; then
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

# is PID a live JVM running our main class?
is_node() {
  local pid="$1"
  [[ -n "$pid" && -r "/proc/$pid/cmdline" ]] && tr '\0' ' ' < "/proc/$pid/cmdline" | grep -q "$NODE_MAIN_CLASS"
}

cmd_start() {
  local pidfile="$TARGET/node.pid" parent="" watch_stdin=0
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
  # 1 GiB, as the OpenSearch 2.19 node: at 512 MiB, Elasticsearch 7.10's parent
  # circuit breaker refused setups (429 "Data too large") once es_transfer ran
  # six tests side by side over hour, CountAPI and target indices.
  # shellcheck disable=SC2206
  local opts=($(node_env JAVA_OPTS "-Xms1g -Xmx1g"))
  opts+=(-XX:+UseG1GC -XX:+ExitOnOutOfMemoryError -XX:-OmitStackTraceInFastThrow
         -Dfile.encoding=UTF-8 -Djava.awt.headless=true -Dlog4j2.disable.jmx=true
         -Dlog4j2.formatMsgNoLookups=true -Dlog4j.shutdownHookEnabled=false
         -Dio.netty.allocator.numDirectArenas=0)
  local cp="$TARGET/classes:$(cat "$CLASSPATH_FILE")"
  local watch_var="${NODE_ENV}_WATCH_STDIN"
  if [[ $watch_stdin == 1 ]]; then
    env "$watch_var=1" "$java" "${opts[@]}" -cp "$cp" "$NODE_MAIN_CLASS" "${args[@]}" >"$out" 2>"$log" &
  else
    env "$watch_var=0" "$java" "${opts[@]}" -cp "$cp" "$NODE_MAIN_CLASS" "${args[@]}" >"$out" 2>"$log" </dev/null &
  fi
  local pid=$!
  echo "$pid" > "$pidfile"
  local timeout; timeout="$(node_env START_TIMEOUT 180)"
  local t0=$SECONDS url=""
  while :; do
    url="$(sed -n "s/^$NODE_URL_KEY=//p" "$out" 2>/dev/null | head -n1)" || url=""
    [[ -n "$url" ]] && break
    if ! alive "$pid"; then
      wait "$pid" 2>/dev/null || true
      rm -f "$pidfile"
      { echo "$NODE_NAME: start failed: node exited before becoming ready; log: $log"
        log_excerpt "$log"; } >&2
      exit 4
    fi
    if (( SECONDS - t0 >= timeout )); then
      stop_pid "$pid"
      rm -f "$pidfile"
      { echo "$NODE_NAME: start failed: no $NODE_URL_KEY within ${timeout}s; log: $log"
        log_excerpt "$log"; } >&2
      exit 4
    fi
    sleep 0.2
  done
  echo "$url" > "$pidfile.url"
  echo "$NODE_URL_KEY=$url"
  echo "${NODE_ENV}_PID=$pid"
  echo "${NODE_ENV}_LOG=$log"
}

# the launcher's own lines (they name the failure) and the log's tail
log_excerpt() {
  # (no such line is no error: under set -e and pipefail it would turn exit 4 into 1)
  { grep -E "^$NODE_NAME test node:" "$1" || true; } | head -n 5 | sed 's/^/  | /'
  echo "  | ... last lines:"
  tail -n 20 "$1" | sed 's/^/  | /'
}

# SIGTERM, then SIGKILL after the grace period; wait until gone
stop_pid() {
  local pid="$1" grace i
  grace="$(node_env STOP_GRACE 30)"
  is_node "$pid" || return 0   # not ours (or already gone): never signal a recycled pid
  kill -TERM "$pid" 2>/dev/null || true
  # wait for the process itself (a JVM in exit has an empty cmdline for a while)
  for ((i = 0; i < grace * 10; i++)); do alive "$pid" || return 0; sleep 0.1; done
  echo "$NODE_NAME: pid $pid still running after ${grace}s, sending SIGKILL" >&2
  kill -KILL "$pid" 2>/dev/null || true
  for ((i = 0; i < 100; i++)); do alive "$pid" || return 0; sleep 0.1; done
  die "stop: pid $pid did not exit" 1
}

cmd_stop() {
  local pidfile="$TARGET/node.pid"
  while [[ $# -gt 0 ]]; do
    case "$1" in
      --pidfile) pidfile="$2"; shift 2 ;;
      *) die "stop: unknown option $1" 2 ;;
    esac
  done
  [[ -f "$pidfile" ]] || { echo "$NODE_NAME: stop: no pidfile $pidfile" >&2; return 0; }
  stop_pid "$(cat "$pidfile")"
  rm -f "$pidfile" "$pidfile.url"
}

cmd_run() {
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
  local url; url="$(sed -n "s/^$NODE_URL_KEY=//p" "$RUN_PIDFILE.start")"
  rm -f "$RUN_PIDFILE.start"
  export "$NODE_URL_KEY=$url" ELASTICSEARCH_URL="$url"
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

node_main() {
  case "${1:-}" in
    build) shift; cmd_build "$@" ;;
    start) shift; cmd_start "$@" ;;
    stop) shift; cmd_stop "$@" ;;
    run) shift; cmd_run "$@" ;;
    *) sed -n "${NODE_USAGE_LINES}p" "$NODE_SCRIPT" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
  esac
}
