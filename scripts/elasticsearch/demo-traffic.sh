#!/usr/bin/env bash
# Sends demo traffic to a running gateway: skewed views over a few videos,
# likes with categories, a batch with idempotency ids sent twice, logins.
# Then prints one counter and the counters of one target.
#
#   scripts/elasticsearch/demo-traffic.sh [gateway URL] [rounds]
#
# Optionally imports the Kibana data views and dashboard of
# index-templates/kibana/ (default index prefix) when KIBANA_URL is set
# (e.g. KIBANA_URL=http://localhost:5601); `counter-gateway setup
# --kibana-url` does the same for any prefix.
set -euo pipefail

GW="${1:-http://127.0.0.1:8080}"
ROUNDS="${2:-20}"
VIDEOS=(88d19b07-86d2-471d-be33-ed10eef5d38e 3f1c2d4e-0000-4000-8000-000000000001
        3f1c2d4e-0000-4000-8000-000000000002 3f1c2d4e-0000-4000-8000-000000000003)
CATEGORIES=(sports news music)

post() { curl -fsS -X POST -H 'content-type: application/json' "$GW$1" -d "${2:-}" >/dev/null; }

curl -fsS "$GW/readyz" >/dev/null || { echo "gateway at $GW is not ready" >&2; exit 1; }

for ((r = 0; r < ROUNDS; r++)); do
  # Zipf-like: video i gets about 1/(i+1) of the views.
  for i in "${!VIDEOS[@]}"; do
    if (( RANDOM % (i + 1) == 0 )); then
      post "/v1/counters/VIDEO/VIEW/${VIDEOS[$i]}/increment" &
    fi
  done
  cat="${CATEGORIES[$((RANDOM % ${#CATEGORIES[@]}))]}"
  post "/v1/counters/VIDEO/like/${VIDEOS[$((RANDOM % ${#VIDEOS[@]}))]}/increment" "{\"category\":\"$cat\"}" &
  post "/v1/counters/USER/user:number_of_logins/user-$((RANDOM % 5))/increment" &
  wait
done

# A batch with ids, sent twice: the second time every event is a duplicate.
batch="{\"events\":["
for i in 1 2 3; do
  batch+="{\"entity\":\"VIDEO\",\"action\":\"share\",\"uuid\":\"${VIDEOS[0]}\",\"id\":\"demo-share-$i\"}"
  [[ $i -lt 3 ]] && batch+=","
done
batch+="]}"
for attempt in 1 2; do
  echo "batch attempt $attempt: $(curl -fsS -X POST -H 'content-type: application/json' "$GW/v1/events" -d "$batch")"
done

echo "one counter:"
curl -fsS "$GW/v1/counters/VIDEO/VIEW/${VIDEOS[0]}"; echo
echo "every counter of the first video:"
curl -fsS "$GW/v1/targets/VIDEO/${VIDEOS[0]}/counters"; echo

if [[ -n "${KIBANA_URL:-}" ]]; then
  here="$(cd "$(dirname "$0")" && pwd)"
  curl -fsS -X POST "$KIBANA_URL/api/saved_objects/_import?overwrite=true" \
    -H 'kbn-xsrf: true' --form file=@"$here/../../index-templates/kibana/counter-gateway.ndjson" >/dev/null
  echo "Kibana dashboard imported: $KIBANA_URL/app/dashboards#/view/counter-gateway-overview"
fi
