#!/usr/bin/env bash
# Real single-node OpenSearch 3.3 for tests, run in a JVM (Java 21+) from Maven Central jars
# (see scripts/opensearch/README.md).
#
#   scripts/opensearch3.sh build                    resolve jars + compile (fast when up to date)
#   scripts/opensearch3.sh start [--pidfile F] [--parent-pid PID] [--watch-stdin]
#                                                   start in background; prints OPENSEARCH_URL=,
#                                                   OPENSEARCH_PID=, OPENSEARCH_LOG=
#   scripts/opensearch3.sh stop [--pidfile F]       SIGTERM, SIGKILL after a grace period, wait
#   scripts/opensearch3.sh run [--] CMD...          start, run CMD with ELASTICSEARCH_URL/OPENSEARCH_URL,
#                                                   always stop, exit with CMD's status
#
# Exit codes: 3 = unavailable here (no Java 21+, no mvn, Maven cannot resolve/build); stderr has
# one line "opensearch3: unavailable: <reason>". 4 = the node did not start. 2 = usage.
#
# Environment: the same OPENSEARCH_* variables as scripts/opensearch.sh (OPENSEARCH_PORT,
# OPENSEARCH_TRANSPORT_PORT, OPENSEARCH_DATA_DIR, OPENSEARCH_JAVA_OPTS (default -Xms512m -Xmx512m),
# OPENSEARCH_LOG_LEVEL, OPENSEARCH_START_TIMEOUT, OPENSEARCH_STOP_GRACE), and JAVA_HOME: a Java
# 21+ is taken from JAVA_HOME, then /usr/lib/jvm, then PATH.
set -euo pipefail

NODE_NAME=opensearch3
NODE_ENV=OPENSEARCH
NODE_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/opensearch3"
NODE_MAIN_CLASS=counter.gateway.OpenSearch3TestNode
NODE_URL_KEY=OPENSEARCH_URL
NODE_JAVA_MIN=21
NODE_JAVA_HINT="OpenSearch 3 needs Java 21+; set JAVA_HOME to one (e.g. a Temurin 21 or 25)"
NODE_USAGE_LINES=2,20
NODE_SCRIPT="${BASH_SOURCE[0]}"
# any JDK under /usr/lib/jvm, newest first (java_bin keeps the first of at least 21)
node_java_candidates() { ls -d /usr/lib/jvm/*/bin/java 2>/dev/null | sort -rV || true; }
# shellcheck source=scripts/lib/jvm-test-node.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/jvm-test-node.sh"
node_main "$@"
