#!/usr/bin/env bash
# Checks a live gateway against its own /openapi.json with schemathesis: no
# 5xx, no status, header, content type or body outside the description.
# Every answer has a schema with its fields (generated from the structs the
# handlers serialize, tests/openapi.rs makes sure), so a field of the wrong
# type or missing is a failure here (ST108 "Response violates schema").
#
# Installs schemathesis (PyPI) in a venv under target/schemathesis, builds the
# debug binary, starts it on a free loopback port over a temporary data
# directory with a write, a read and an admin key, runs every check with a
# bounded number of examples per operation, and stops the server.
#
# Every check runs but `positive_data_acceptance`: some refusals depend on
# things JSON Schema cannot say (a timestamp within the retention of *now*, a
# window not in the future, names counted in bytes, a document id of at most
# 512 bytes), so the schema admits a few inputs the gateway refuses with a
# documented 400. The reverse, `negative_data_rejection`, does run: whatever
# the schema refuses, the gateway refuses too.
#
#   scripts/schemathesis.sh                 # defaults
#   EXAMPLES=50 scripts/schemathesis.sh     # more examples per operation
set -euo pipefail
cd "$(dirname "$0")/.."

EXAMPLES="${EXAMPLES:-25}"
VENV="$(pwd)/${SCHEMATHESIS_VENV:-target/schemathesis/venv}"
SEED="${SEED:-1}"

if [ ! -x "$VENV/bin/schemathesis" ]; then
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install --quiet --upgrade pip
    "$VENV/bin/pip" install --quiet "schemathesis>=4,<5"
fi

cargo build --quiet --bin counter-gateway
BIN=target/debug/counter-gateway

WORK="$(mktemp -d)"
SERVER_PID=""
cleanup() {
    if [ -n "$SERVER_PID" ]; then
        kill "$SERVER_PID" 2>/dev/null || true
        wait "$SERVER_PID" 2>/dev/null || true
    fi
    rm -rf "$WORK"
}
trap cleanup EXIT

ADMIN_KEY="st-admin-$RANDOM$RANDOM$RANDOM"
sha() { printf %s "$1" | sha256sum | cut -d' ' -f1; }
{
    echo "write * $(sha "st-write-$RANDOM$RANDOM")"
    echo "read * $(sha "st-read-$RANDOM$RANDOM")"
    echo "admin * $(sha "$ADMIN_KEY")"
} > "$WORK/keys.txt"

PORT="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
"$BIN" serve --listen "127.0.0.1:$PORT" --data-dir "$WORK/data" \
    --api-keys-file "$WORK/keys.txt" > "$WORK/server.log" 2>&1 &
SERVER_PID=$!
for _ in $(seq 1 100); do
    curl -fsS "http://127.0.0.1:$PORT/healthz" > /dev/null 2>&1 && break
    sleep 0.1
done

status=0
# Run from the temporary directory: schemathesis keeps a cache in its
# working directory, which has no place in the repository.
cd "$WORK"
"$VENV/bin/schemathesis" run "http://127.0.0.1:$PORT/openapi.json" \
    --checks all \
    --exclude-checks positive_data_acceptance \
    --max-examples "$EXAMPLES" \
    --seed "$SEED" \
    --header "Authorization: Bearer $ADMIN_KEY" \
    --workers 1 \
    --generation-database none \
    || status=$?

if [ "$status" -ne 0 ]; then
    echo "schemathesis failed; the gateway's log:" >&2
    tail -n 50 "$WORK/server.log" >&2
fi
exit "$status"
