# File growth of the embedded store under a known load: N counters, each
# incremented once in every hour of yesterday (24 hour buckets and one day
# bucket per counter), sent as batches of 1,000 events with timestamps;
# the gateway is stopped (SIGTERM: it folds and checkpoints) and the data
# directory measured. Run once per build; the difference is the hours' cost.
# HOUR_LOAD_ES=<url>: the gateway writes to that Elasticsearch/OpenSearch
# node instead (a fresh index prefix), and the node's store size per hour
# document is printed from `_cat/indices` after a refresh and a force merge.
import datetime, json, os, signal, socket, subprocess, sys, tempfile, time, urllib.request
binary, counters = sys.argv[1], int(sys.argv[2])
es = os.environ.get("HOUR_LOAD_ES")
prefix = "hourbench-%d" % os.getpid()
d = tempfile.mkdtemp()
s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
extra = ["--elasticsearch-url", es, "--index-prefix", prefix] if es else []
p = subprocess.Popen([binary, "serve", "--listen", f"127.0.0.1:{port}", "--data-dir", d] + extra,
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
for _ in range(100):
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz"); break
    except Exception: time.sleep(0.1)
day = datetime.datetime.now(datetime.timezone.utc).replace(hour=0, minute=0, second=0, microsecond=0) - datetime.timedelta(days=1)
events = []
def flush():
    global events
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/events", data=json.dumps({"events": events}).encode(),
                                 headers={"content-type": "application/json"})
    urllib.request.urlopen(req).read(); events = []
for h in range(24):
    ts = (day + datetime.timedelta(hours=h, minutes=30)).strftime("%Y-%m-%dT%H:%M:%S.000Z")
    for c in range(counters):
        events.append({"entity": "VIDEO", "action": "VIEW", "uuid": f"c{c:07d}", "count": 1, "timestamp": ts})
        if len(events) == 1000: flush()
if events: flush()
p.send_signal(signal.SIGTERM); p.wait()
if es:
    def call(method, path):
        return urllib.request.urlopen(urllib.request.Request(es + path, method=method)).read()
    call("POST", f"/{prefix}_*/_refresh")
    call("POST", f"/{prefix}_*/_forcemerge?max_num_segments=1")
    call("POST", f"/{prefix}_*/_refresh")
    rows = json.loads(call("GET", f"/_cat/indices/{prefix}_*?format=json&bytes=b&h=index,docs.count,store.size"))
    for r in sorted(rows, key=lambda r: r["index"]):
        n, size = int(r["docs.count"]), int(r["store.size"])
        per = f"{size / n:.1f} bytes per document" if n else ""
        print(f"{r['index']}: {n} documents, {size} bytes {per}")
    sys.exit(0)
size = sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d) if f.startswith("counters.sqlite3"))
print(f"{binary}: {counters} counters x 24 hours: data files {size} bytes")
