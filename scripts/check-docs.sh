#!/usr/bin/env bash
# Every relative link (and #anchor) of every tracked Markdown page resolves,
# and the README's first commands still run (`serve --help`). Fast: no build
# beyond the debug binary the gate has already built.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 - <<'PY'
import re, subprocess, sys, os
files = subprocess.run(['git', 'ls-files', '*.md'], capture_output=True, text=True, check=True).stdout.split()
def anchors(path):
    out, inside = set(), False
    for line in open(path, encoding='utf-8'):
        if line.startswith('```'):
            inside = not inside
        elif not inside and line.startswith('#'):
            h = line.lstrip('#').strip().lower()
            h = re.sub(r'[^\w\- ]', '', h).replace(' ', '-')
            out.add(h)
    return out
bad = 0
link = re.compile(r'\]\(([^)\s]+)\)')
for f in files:
    text, inside = [], False
    for line in open(f, encoding='utf-8'):
        if line.startswith('```'):
            inside = not inside
        elif not inside:
            text.append(line)
    for target in link.findall(''.join(text)):
        if re.match(r'[a-z]+:', target):
            continue
        path, _, anchor = target.partition('#')
        dest = os.path.normpath(os.path.join(os.path.dirname(f), path)) if path else f
        if not os.path.exists(dest):
            print(f'{f}: broken link {target}'); bad += 1
        elif anchor and dest.endswith('.md') and anchor not in anchors(dest):
            print(f'{f}: no heading #{anchor} in {dest}'); bad += 1
print(f'{len(files)} pages checked, {bad} broken links')
sys.exit(1 if bad else 0)
PY
bin=target/debug/counter-gateway
if [[ ! -x $bin ]]; then
  echo "README commands: skipped (no debug binary; cargo build builds it)"
  exit 0
fi
timeout 20 "$bin" serve --help >/dev/null
echo "serve --help: ok"
# The session of the README, against a server on a free port and a fresh store.
dir=$(mktemp -d)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$bin" serve --listen "127.0.0.1:$port" --data-dir "$dir/data" >"$dir/log" 2>&1 &
pid=$!
trap 'kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; rm -rf "$dir"' EXIT
base="http://127.0.0.1:$port"
for _ in $(seq 100); do curl -sf "$base/healthz" >/dev/null && break; sleep 0.1; done
uuid=88d19b07-86d2-471d-be33-ed10eef5d38e
check() { # expected substring, then curl's arguments
  local want=$1; shift
  local got; got=$(timeout 10 curl -s "$@") || { echo "README command failed: curl $*"; cat "$dir/log"; exit 1; }
  [[ $got == *"$want"* ]] || { echo "README command answered $got, expected $want: curl $*"; exit 1; }
}
check '"value":1' -XPOST "$base/v1/counters/VIDEO/VIEW/$uuid/increment"
check '"value":5' -XPOST -H 'content-type: application/json' -d '{"count": 5, "category": "sports"}' "$base/v1/counters/VIDEO/like/$uuid/increment"
check '{"accepted":2,"duplicates":0}' -XPOST -H 'content-type: application/json' "$base/v1/events" -d '{"events": [
    {"entity": "ARTICLE", "action": "VIEW", "uuid": "a1", "id": "evt-1"},
    {"entity": "ARTICLE", "action": "VIEW", "uuid": "a2", "count": 3}]}'
check '"action":"like"' "$base/v1/targets/VIDEO/$uuid/counters"
check '"counters":[{"id":"ARTICLE_VIEW_a2"' "$base/v1/top/ARTICLE/VIEW?interval=last_week&size=10"
check 'invalid_request' -XPOST -H 'content-type: application/json' -d '{"count": 1.5}' "$base/v1/counters/VIDEO/VIEW/x/increment"
check 'openapi' "$base/openapi.json"
check '<' "$base/dashboard"
echo "README session: ok"
