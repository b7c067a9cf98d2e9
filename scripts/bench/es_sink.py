#!/usr/bin/env python3
"""A load sink standing in for Elasticsearch in scripts/bench.sh. NOT a test fake.

This is a benchmark tool only: it lets the gateway's Elasticsearch write path
run at full load on one machine so the benchmark can count what the gateway
sends (bulk requests, bulk items, distinct keys per bulk). It is not an
Elasticsearch, it checks nothing about the correctness of what is sent beyond
counting it, and no test relies on it; tests/es_behaviour.rs has the fake that
tests use, and tests/es_real.rs runs against a real cluster.

What it answers (Python 3 standard library only, threaded, HTTP/1.1 keep-alive):
  GET  /                      the root document (the gateway's readiness probe)
  POST /_bulk                 every item successful, in Elasticsearch's shape:
                              {"update": {..., "status": 200|201, "get":
                              {"found": true, "_source": {...}}}}, the _source
                              holding the fields the action asked for, computed
                              from per-document state kept in memory the way the
                              stored scripts do (value += delta and the deltas
                              of not-yet-seen event ids, first/recorded
                              timestamps as min/max, last category; averages:
                              sum and quantity). The gateway answers an increment
                              with that document, so it must be right.
  GET  /<index>/_doc/<id>     the stored document, or not found
  GET|PUT /_scripts|_ilm|_component_template|_index_template/...
                              404 / acknowledged (only if run without --skip-setup)
  GET  /_sink/stats           counts as JSON (see Stats.snapshot)
  POST /_sink/reset           zero the counts (documents are kept)
Anything else gets a 400 in Elasticsearch's error shape and is counted.

    python3 scripts/bench/es_sink.py --port 9299
"""

import argparse
import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ROOT = {
    "name": "es-sink",
    "cluster_name": "counter-gateway-bench-sink",
    "cluster_uuid": "bench-sink-not-elasticsearch",
    "version": {
        "number": "8.15.0",
        "build_flavor": "default",
        "lucene_version": "9.11.1",
        "minimum_wire_compatibility_version": "7.17.0",
        "minimum_index_compatibility_version": "7.0.0",
    },
    "tagline": "You Know, for Search",
}

SETUP_PREFIXES = ("/_scripts", "/_ilm", "/_component_template", "/_index_template")


class Stats:
    """Counts of what the gateway sent. Guarded by the sink's lock."""

    def __init__(self):
        self.reset()

    def reset(self):
        self.started = time.time()
        self.bulk_requests = 0
        self.bulk_items = 0
        self.counter_items = 0
        self.bucket_items = 0
        self.average_items = 0
        self.average_bucket_items = 0
        # Sum over counter items of params.delta plus the deltas of the
        # id events applied: the increments carried (each +1 increment adds 1).
        self.counter_delta_sum = 0
        self.id_events = 0
        self.distinct_keys_sum = 0  # per bulk: distinct params.counter_id
        self.max_items = 0
        self.max_distinct_keys = 0
        self.max_items_per_key = 0.0
        # Bounds checked per bulk request:
        # a document appears at most once per bulk (items <= keys + key-day buckets)
        self.bulks_with_repeated_doc = 0
        # for bulks touching one day only: items <= 3 x distinct keys (a
        # counter, a day and an hour item per key; an hour changing inside
        # a bulk is held only to the next check)
        self.bulks_one_day = 0
        self.bulks_over_2x_keys = 0
        self.gets = 0
        self.setup_calls = 0
        self.unexpected = []
        self.busy_seconds = 0.0  # time spent handling bulks

    def snapshot(self):
        n = self.bulk_requests
        return {
            "note": "benchmark load sink, not Elasticsearch and not a test fake",
            "seconds": round(time.time() - self.started, 3),
            "bulk_requests": n,
            "bulk_items": self.bulk_items,
            "counter_items": self.counter_items,
            "bucket_items": self.bucket_items,
            "average_items": self.average_items,
            "average_bucket_items": self.average_bucket_items,
            "counter_delta_sum": self.counter_delta_sum,
            "id_events": self.id_events,
            "distinct_keys_sum": self.distinct_keys_sum,
            "mean_items_per_bulk": self.bulk_items / n if n else 0.0,
            "mean_distinct_keys_per_bulk": self.distinct_keys_sum / n if n else 0.0,
            "max_items_per_bulk": self.max_items,
            "max_distinct_keys_per_bulk": self.max_distinct_keys,
            "max_items_per_distinct_key": self.max_items_per_key,
            "bulks_with_repeated_doc": self.bulks_with_repeated_doc,
            "bulks_one_day": self.bulks_one_day,
            "bulks_over_2x_distinct_keys": self.bulks_over_2x_keys,
            "gets": self.gets,
            "setup_calls": self.setup_calls,
            "unexpected": len(self.unexpected),
            "unexpected_first": self.unexpected[:5],
            "busy_seconds": round(self.busy_seconds, 3),
        }


LOCK = threading.Lock()
STATS = Stats()
DOCS = {}  # (index, _id) -> _source dict
SEQ = [0]


def _apply(src, p, bucket, average):
    """The stored scripts' arithmetic, as far as the answer needs it."""
    if "counter_id" not in src:
        for f in ("counter_id", "entity", "action", "uuid"):
            src[f] = p.get(f)
        if bucket:
            src["day"] = p.get("day")
    total = src.get("value" if not average else "sum", 0) + (p.get("delta") or 0)
    quantity = src.get("quantity", 0) + (p.get("quantity") or 0)
    first = p.get("first_ms")
    last = p.get("last_ms")
    category = p.get("category")
    cat_pos = p.get("category_pos", -1)
    carried = p.get("delta") or 0
    seen = src.get("event_ids") or {}
    for i in p.get("forget") or ():
        seen.pop(i, None)
    skipped = []
    events = p.get("events")
    if events:
        now = p.get("now_ms", 0)
        for i, e in enumerate(events):
            if e[0] in seen:
                skipped.append(i)
                continue
            seen[e[0]] = now
            total += e[1]
            carried += e[1]
            if average and len(e) > 5:
                quantity += e[5]
            ts = e[2]
            first = ts if first is None else min(first, ts)
            last = ts if last is None else max(last, ts)
            if e[3] is not None and e[4] > cat_pos:
                category, cat_pos = e[3], e[4]
        # No expiry of old ids: the benchmark sends none; a sink need not.
    if average:
        src["sum"] = total
        src["quantity"] = quantity
        if not bucket:
            if quantity:
                src["average"] = total / quantity
            else:
                src.pop("average", None)
    else:
        src["value"] = total
    if category is not None:
        src["category"] = category
    if not bucket:
        if first is not None:
            old = src.get("first_timestamp")
            src["first_timestamp"] = first if old is None else min(old, first)
        if last is not None:
            old = src.get("recorded_timestamp")
            src["recorded_timestamp"] = last if old is None else max(old, last)
    if seen:
        src["event_ids"] = seen
    else:
        src.pop("event_ids", None)
    if skipped:
        src["skipped_events"] = skipped
    else:
        src.pop("skipped_events", None)
    return carried, len(events or ())


def bulk(body):
    started = time.perf_counter()
    text = body.decode("utf-8").strip()
    # NDJSON has no raw newline inside a line, so one C-level parse of the
    # whole body as an array is much faster than a parse per line.
    lines = json.loads("[" + text.replace("\n", ",") + "]") if text else []
    items = []
    with LOCK:
        SEQ[0] += 1
        seq = SEQ[0]
        keys = set()
        docs = set()
        days = set()
        st = STATS
        for k in range(0, len(lines) - 1, 2):
            meta = lines[k].get("update")
            payload = lines[k + 1]
            if meta is None:
                op, meta = next(iter(lines[k].items()))
                items.append({op: {"_index": meta.get("_index"), "_id": meta.get("_id"),
                                   "status": 400, "error": {"type": "illegal_argument_exception",
                                   "reason": "the bench sink only takes update actions"}}})
                st.unexpected.append("bulk action " + op)
                continue
            index = meta["_index"]
            doc_id = meta["_id"]
            p = payload.get("script", {}).get("params", {})
            bucket = "_histogram_counters-" in index
            # An hour bucket (issue 24): the bucket script on an hour document.
            hour = "_hour_counters-" in index
            bucket = bucket or hour
            average = "_average_" in index
            key = (index, doc_id)
            docs.add(key)
            keys.add(p.get("counter_id"))
            if bucket and not hour:
                days.add(p.get("day"))
            src = DOCS.get(key)
            existed = src is not None
            if not existed:
                src = DOCS[key] = {}
            carried, n_events = _apply(src, p, bucket, average)
            if average:
                if bucket:
                    st.average_bucket_items += 1
                else:
                    st.average_items += 1
            elif bucket:
                st.bucket_items += 1
            else:
                st.counter_items += 1
                st.counter_delta_sum += carried
                st.id_events += n_events
            includes = (payload.get("_source") or {}).get("includes")
            if includes is None:
                got = {f: v for f, v in src.items() if f != "event_ids"}
            else:
                got = {f: src[f] for f in includes if f in src}
            items.append({"update": {
                "_index": index, "_id": doc_id, "_version": 1,
                "result": "updated" if existed else "created",
                "_shards": {"total": 1, "successful": 1, "failed": 0},
                "_seq_no": seq, "_primary_term": 1,
                "status": 200 if existed else 201,
                "get": {"_seq_no": seq, "_primary_term": 1, "found": True, "_source": got},
            }})
        n = len(items)
        st.bulk_requests += 1
        st.bulk_items += n
        st.distinct_keys_sum += len(keys)
        st.max_items = max(st.max_items, n)
        st.max_distinct_keys = max(st.max_distinct_keys, len(keys))
        if keys:
            st.max_items_per_key = max(st.max_items_per_key, n / len(keys))
        if len(docs) < n:
            st.bulks_with_repeated_doc += 1
        if len(days) <= 1:
            st.bulks_one_day += 1
            if n > 3 * len(keys):
                st.bulks_over_2x_keys += 1
        took = time.perf_counter() - started
        st.busy_seconds += took
    return 200, {"took": int(took * 1000), "errors": False, "items": items}


def get_doc(index, doc_id):
    from urllib.parse import unquote
    doc_id = unquote(doc_id)
    with LOCK:
        STATS.gets += 1
        src = DOCS.get((index, doc_id))
        src = None if src is None else {f: v for f, v in src.items() if f != "event_ids"}
    if src is None:
        return 404, {"_index": index, "_id": doc_id, "found": False}
    return 200, {"_index": index, "_id": doc_id, "_version": 1, "_seq_no": 0,
                 "_primary_term": 1, "found": True, "_source": src}


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: the gateway pools connections
    # Without this, Nagle's algorithm holds a small answer until the client's
    # delayed ACK (about 40 ms a request on Linux).
    disable_nagle_algorithm = True
    server_version = "es-sink"
    sys_version = ""

    def log_message(self, fmt, *args):
        pass

    def _body(self):
        n = self.headers.get("Content-Length")
        if n is not None:
            return self.rfile.read(int(n)) if int(n) else b""
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            parts = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(parts)
                parts.append(self.rfile.read(size))
                self.rfile.readline()
        return b""

    def _send(self, status, obj):
        data = json.dumps(obj, separators=(",", ":")).encode()
        self.send_response_only(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("X-Elastic-Product", "Elasticsearch")
        self.send_header("Content-Length", str(len(data)))
        # Headers and body in one write, so the answer leaves in one go.
        self._headers_buffer.append(b"\r\n")
        if self.command != "HEAD":
            self._headers_buffer.append(data)
        self.wfile.write(b"".join(self._headers_buffer))
        self._headers_buffer = []

    def _route(self):
        body = self._body()
        path, _, _query = self.path.partition("?")
        m = self.command
        if m == "POST" and path == "/_bulk":
            return self._send(*bulk(body))
        if m in ("GET", "HEAD") and path == "/":
            return self._send(200, ROOT)
        if m == "GET" and path == "/_sink/stats":
            with LOCK:
                snap = STATS.snapshot()
            return self._send(200, snap)
        if m == "POST" and path == "/_sink/reset":
            with LOCK:
                STATS.reset()
            return self._send(200, {"acknowledged": True})
        if path.startswith(SETUP_PREFIXES):
            with LOCK:
                STATS.setup_calls += 1
            if m == "GET":
                return self._send(404, {})
            return self._send(200, {"acknowledged": True})
        parts = path.strip("/").split("/")
        if m == "GET" and len(parts) == 3 and parts[1] == "_doc":
            return self._send(*get_doc(parts[0], parts[2]))
        with LOCK:
            if len(STATS.unexpected) < 100:
                STATS.unexpected.append(f"{m} {path}")
        return self._send(400, {"error": {"type": "bench_sink_unsupported",
                                          "reason": f"the bench sink does not answer {m} {path}"},
                                "status": 400})

    do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = _route


class Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256
    allow_reuse_address = True


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=9299)
    a = ap.parse_args()
    srv = Server((a.host, a.port), Handler)
    print(f"es_sink (benchmark load sink, not Elasticsearch) on http://{a.host}:{a.port}",
          file=sys.stderr, flush=True)
    try:
        srv.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
