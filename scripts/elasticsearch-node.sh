#!/usr/bin/env bash
# Real single-node Elasticsearch 7.10.2 (the OSS build: no ILM, no security) for tests, run in
# a JVM from Maven Central jars (see scripts/opensearch/README.md, "Other engines").
#
#   scripts/elasticsearch-node.sh build             resolve jars + compile (fast when up to date)
#   scripts/elasticsearch-node.sh start [--pidfile F] [--parent-pid PID] [--watch-stdin]
#                                                   start in background; prints ELASTICSEARCH_URL=,
#                                                   ELASTICSEARCH_PID=, ELASTICSEARCH_LOG=
#   scripts/elasticsearch-node.sh stop [--pidfile F] SIGTERM, SIGKILL after a grace period, wait
#   scripts/elasticsearch-node.sh run [--] CMD...   start, run CMD with ELASTICSEARCH_URL, always stop,
#                                                   exit with CMD's status
#
# Exit codes: 3 = unavailable here (no java/mvn, Maven cannot resolve/build); stderr has one line
# "elasticsearch: unavailable: <reason>". 4 = the node did not start. 2 = usage.
#
# Environment: ELASTICSEARCH_PORT (fixed HTTP port), ELASTICSEARCH_TRANSPORT_PORT,
# ELASTICSEARCH_DATA_DIR (kept across runs; default is a fresh temp dir removed on exit),
# ELASTICSEARCH_JAVA_OPTS (default -Xms512m -Xmx512m), ELASTICSEARCH_LOG_LEVEL (default WARN),
# ELASTICSEARCH_START_TIMEOUT (s, default 180), ELASTICSEARCH_STOP_GRACE (s, default 30), JAVA_HOME.
set -euo pipefail

NODE_NAME=elasticsearch
NODE_ENV=ELASTICSEARCH
NODE_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/elasticsearch-node"
NODE_MAIN_CLASS=counter.gateway.ElasticsearchTestNode
NODE_URL_KEY=ELASTICSEARCH_URL
NODE_JAVA_MIN=11
NODE_JAVA_HINT="need Java 11-17, e.g. apt-get install openjdk-17-jdk-headless"
NODE_USAGE_LINES=2,20
NODE_SCRIPT="${BASH_SOURCE[0]}"
# Elasticsearch 7.10 was built for Java 11-15; 17 works, newer ones are untried: prefer 17.
node_java_candidates() { ls -d /usr/lib/jvm/java-17-openjdk*/bin/java 2>/dev/null || true; }
# shellcheck source=scripts/lib/jvm-test-node.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/jvm-test-node.sh"
node_main "$@"
