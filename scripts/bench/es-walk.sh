#!/usr/bin/env bash
# Windowed lists across two monthly indices on a real engine (the threshold
# walk of src/store/elasticsearch/walk.rs) against the one 10,000-term search
# the store sent before it. Run under a launcher, which sets ELASTICSEARCH_URL:
#   scripts/opensearch.sh run -- scripts/bench/es-walk.sh [COUNTERS]
# Each counter gets a uniform random count (1-1000) on the last day of the
# previous month and on today: no counter leads either month, the walk's
# worst shape. BIN picks the build (default target/release/counter-gateway).
set -euo pipefail
cd "$(dirname "$0")/../.."
n="${1:-50000}"
bin="${BIN:-target/release/counter-gateway}"
work=$(mktemp -d)
trap 'kill "${pid:-}" 2>/dev/null || true; rm -rf "$work"' EXIT
old_day=$(date -u -d "$(date -u +%Y-%m-01) -1 day" +%Y-%m-%d)
new_day=$(date -u +%Y-%m-%d)
python3 - "$n" "$old_day" "$new_day" >"$work/data.ndjson" <<'PY'
import json, random, sys
n, old, new = int(sys.argv[1]), sys.argv[2], sys.argv[3]
random.seed(7)
print(json.dumps({"kind": "header", "format": "counter-gateway", "version": 5}))
for i in range(n):
    a, b = random.randint(1, 1000), random.randint(1, 1000)
    print(json.dumps({"kind": "counter", "entity": "ART", "action": "view", "uuid": f"u{i:06d}",
                      "value": a + b, "days": {old: a, new: b}, "hours": {}}))
PY
"$bin" import --elasticsearch-url "$ELASTICSEARCH_URL" --index-prefix eswalk -i "$work/data.ndjson" 2>/dev/null | tail -1
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$bin" serve --elasticsearch-url "$ELASTICSEARCH_URL" --index-prefix eswalk --listen "127.0.0.1:$port" >"$work/serve.log" 2>&1 &
pid=$!
for _ in $(seq 50); do curl -sf "http://127.0.0.1:$port/healthz" >/dev/null && break; sleep 0.2; done
curl -s -XPOST "$ELASTICSEARCH_URL/eswalk_*/_refresh" >/dev/null
field() { python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print($2)" "$1"; }
# The last week spans both days only when they are within 7 days.
from=$old_day
for path in "/v1/top/ART/view?from=$from&to=$new_day&size=10" "/v1/top/ART/view?from=$from&to=$new_day&size=100" \
            "/v1/top/ART/view?from=$new_day&to=$new_day&size=10"; do
  printf '%-60s' "$path"
  for _ in 1 2 3 4 5; do curl -s -o "$work/out.json" -w '%{time_total}s ' "http://127.0.0.1:$port$path"; done
  echo " exact=$(field "$work/out.json" 'd["exact"]')"
done
body=$(printf '{"size":0,"track_total_hits":false,"query":{"bool":{"filter":[{"term":{"entity":"ART"}},{"term":{"action":"view"}},{"range":{"day":{"gte":"%s","lte":"%s"}}}]}},"aggs":{"top":{"terms":{"field":"uuid","size":10000,"shard_size":10000,"order":[{"total":"desc"},{"_key":"asc"}]},"aggs":{"total":{"sum":{"field":"value"}}}}}}' "$old_day" "$new_day")
printf '%-60s' "the one 10,000-term search before the walk"
for _ in 1 2 3 4 5; do
  curl -s -o "$work/old.json" -w '%{time_total}s ' -H 'content-type: application/json' \
    -XPOST "$ELASTICSEARCH_URL/eswalk_default_histogram_counters-*/_search" -d "$body"
done
echo " sum_other_doc_count=$(field "$work/old.json" 'd["aggregations"]["top"]["sum_other_doc_count"]') (0 would be exact)"
