#!/usr/bin/env python3
"""Times `GET /v1/trending/{entity}/{action}` (issue 24) on a running
gateway: loads N counters (default 1,000,000) through `POST /v1/events` in
batches of 1,000, each counter with three counts: one in an hour of the
last 14 days (hour buckets, inside the default hourly retention), one in
an hour of the last 6 hours, and one at noon 15 to 19 days ago (a day
bucket, before the hourly retention, inside a 24h half-life's 20-day
horizon); then times each list RUNS times, one request at a time, and
prints min and median milliseconds.

    python3 scripts/bench/trending.py http://127.0.0.1:PORT [COUNTERS] [RUNS]

Python standard library only. Asserts nothing about time."""

import http.client
import json
import statistics
import sys
import time
import urllib.parse

DAY = 86_400
HOUR = 3_600


def main():
    base = urllib.parse.urlparse(sys.argv[1])
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 1_000_000
    runs = int(sys.argv[3]) if len(sys.argv) > 3 else 5
    conn = http.client.HTTPConnection(base.hostname, base.port, timeout=600)
    now = int(time.time())
    today = now // DAY
    events, sent, started = [], 0, time.time()

    def flush():
        nonlocal events, sent
        if not events:
            return
        body = json.dumps({"events": events})
        conn.request("POST", "/v1/events", body, {"content-type": "application/json"})
        r = conn.getresponse()
        text = r.read()
        if r.status != 200:
            sys.exit(f"POST /v1/events answered {r.status}: {text[:300]!r}")
        sent += len(events)
        events = []

    def ts(at):
        return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at))

    for i in range(n):
        h = (i * 2_654_435_761) % 1000
        for count, at in (
            (h % 100 + 1, now - (i % (14 * 24)) * HOUR),
            (h % 7 + 1, now - (i % 6) * HOUR),
            (h % 50 + 1, (today - 15 - i % 5) * DAY + 43_200),
        ):
            events.append({"entity": "TRENDING", "action": "VIEW", "uuid": f"t{i:07d}",
                           "count": count, "timestamp": ts(at)})
            if len(events) == 1000:
                flush()
    flush()
    load = time.time() - started
    print(f"loaded {n} counters ({sent} events) in {load:.1f} s")
    for half_life in ("24h", "1h", "7d"):
        path = f"/v1/trending/TRENDING/VIEW?half_life={half_life}&size=100"
        times = []
        for _ in range(runs):
            t = time.perf_counter()
            conn.request("GET", path)
            r = conn.getresponse()
            text = r.read()
            times.append((time.perf_counter() - t) * 1e3)
            if r.status != 200 or len(json.loads(text)["counters"]) != 100:
                sys.exit(f"GET {path} answered {r.status}: {text[:300]!r}")
        print(f"{'GET ' + path:<64} min {min(times):9.1f} ms   median {statistics.median(times):9.1f} ms   ({runs} runs, {n} counters)")


if __name__ == "__main__":
    main()
