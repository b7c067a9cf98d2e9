#!/usr/bin/env python3
"""Times `GET /v1/top/{entity}/{action}?interval=first_<N>_days` (issue 24)
on a running gateway: loads N counters (default 1,000,000) through
`POST /v1/events` in batches of 1,000, each counter with 3 daily buckets from
its first touch, first touches spread over the last 60 days, one counter in
four with a `published` time set; then times each list of DAYS (default
3,7,30,14: the gateway's default `--milestone-days` keeps totals for the
first three, the last is summed by a pass over the counters) RUNS times,
one request at a time, and prints min, median and the first request's
milliseconds (without `--milestone-days` given, the first list of a kept N
builds the totals).

    python3 scripts/bench/milestones.py http://127.0.0.1:PORT [COUNTERS] [RUNS] [DAYS]

Python standard library only. Asserts nothing about time."""

import http.client
import json
import statistics
import sys
import time
import urllib.parse

DAY = 86_400


def main():
    base = urllib.parse.urlparse(sys.argv[1])
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 1_000_000
    runs = int(sys.argv[3]) if len(sys.argv) > 3 else 5
    lists = [int(d) for d in (sys.argv[4] if len(sys.argv) > 4 else "3,7,30,14").split(",")]
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

    for i in range(n):
        first = today - (i % 60)
        for k in range(3):
            day = first + k
            if day > today:
                break
            # Noon of that day, or now for today (never in the future).
            at = min(day * DAY + 43_200, now)
            ts = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at))
            e = {"entity": "MILESTONE", "action": "VIEW", "uuid": f"a{i:07d}",
                 "count": (i * 2_654_435_761 + k) % 1000 + 1, "timestamp": ts}
            if k == 0 and i % 4 == 0:
                e["published"] = ts
            events.append(e)
            if len(events) == 1000:
                flush()
    flush()
    load = time.time() - started
    print(f"loaded {n} counters ({sent} events) in {load:.1f} s")
    for days in lists:
        path = f"/v1/top/MILESTONE/VIEW?interval=first_{days}_days&size=100"
        times = []
        for _ in range(runs):
            t = time.perf_counter()
            conn.request("GET", path)
            r = conn.getresponse()
            text = r.read()
            times.append((time.perf_counter() - t) * 1e3)
            if r.status != 200 or len(json.loads(text)["counters"]) != 100:
                sys.exit(f"GET {path} answered {r.status}: {text[:300]!r}")
        # The first list of a kept N builds the totals in a store that has
        # none yet (a gateway without `--milestone-days`): shown apart.
        print(f"{'GET ' + path:<64} min {min(times):9.1f} ms   median {statistics.median(times):9.1f} ms   first {times[0]:9.1f} ms   ({runs} runs, {n} counters)")


if __name__ == "__main__":
    main()
