#!/usr/bin/env python3
"""Judges an overload soak of scripts/soak.sh and prints its one summary table.

Inputs: the output of each wrk run (the lines scripts/bench/soak.lua prints
in `done`), the gateway's SQLite file after a clean stop, and the RSS samples
of scripts/bench/soak_sample.py. Exits 1 when a check fails:

- every response was 200 or 503, every 503 carried Retry-After, every 200
  said what it acknowledged, and wrk saw no socket error or timeout;
- per wrk thread (each writes only its own keys): acknowledged <= stored <=
  acknowledged + what may have been applied (503s other than `overloaded`,
  and requests left unanswered when wrk stopped), and no other key stored;
- offered increments per second were at least MIN_RATIO x the capacity,
  taken as the higher of the probe's acknowledged rate and the soak's;
- resident memory stayed flat: the highest RSS of the soak's last third is
  within FLAT_TOLERANCE of the highest of its middle third (the first third
  is the warm-up: the queue fills, SQLite's page cache grows to its cap);
- the gateway exited 0 after SIGTERM and logged no panic.
"""

import argparse
import csv
import os
import re
import sqlite3
import sys

FIELDS = ("sent", "ok", "acked", "overloaded", "maybe", "timeouts", "unavailable",
          "no_retry_after", "other", "bad_body", "per_request", "tid")


def parse_wrk(path):
    """The wrk summary and one dict per thread of one run."""
    run, threads = None, []
    for line in open(path):
        if line.startswith("soak-wrk "):
            run = {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", line)}
        elif line.startswith("soak-thread "):
            t = dict(re.findall(r'(\w+)=([^ "]+)', line.split(" first_other=")[0]))
            for k in FIELDS:
                t[k] = int(t[k])
            m = re.search(r'first_other=(".*")\s*$', line)
            t["first_other"] = m.group(1) if m else ""
            t["unanswered"] = max(0, t["sent"] - t["ok"] - t["overloaded"] - t["maybe"] - t["other"])
            threads.append(t)
    if run is None:
        sys.exit(f"{path}: no soak-wrk line; did wrk run scripts/bench/soak.lua?")
    return run, threads


def load(paths):
    runs = [parse_wrk(p) for p in paths]
    threads = [t for _, ts in runs for t in ts]
    seconds = max(r["duration_us"] for r, _ in runs) / 1e6
    return [r for r, _ in runs], threads, seconds


def total(threads, field, weighted=False):
    return sum(t[field] * (t["per_request"] if weighted else 1) for t in threads)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--probe", nargs="+", required=True, help="wrk outputs of the capacity probe")
    p.add_argument("--soak", nargs="+", required=True, help="wrk outputs of the overload")
    p.add_argument("--db", required=True)
    p.add_argument("--rss", required=True)
    p.add_argument("--soak-start", type=float, required=True, help="unix time the overload began")
    p.add_argument("--soak-end", type=float, required=True)
    p.add_argument("--min-ratio", type=float, default=2.0)
    p.add_argument("--flat-tolerance", type=float, default=0.10)
    p.add_argument("--listen-overflows", type=int, default=0,
                   help="the host's TcpExt ListenOverflows during the soak")
    p.add_argument("--backlog", default="?", help="the listening socket's backlog (ss Send-Q)")
    p.add_argument("--gateway-exit", type=int, required=True)
    p.add_argument("--gateway-log", required=True)
    p.add_argument("--flags", default="")
    a = p.parse_args()

    checks = []  # (name, passed, detail)

    probe_runs, probe_threads, probe_s = load(a.probe)
    soak_runs, soak_threads, soak_s = load(a.soak)
    all_runs, all_threads = probe_runs + soak_runs, probe_threads + soak_threads

    # Responses.
    others = total(all_threads, "other")
    no_ra = total(all_threads, "no_retry_after")
    bad = total(all_threads, "bad_body")
    sock = {k: sum(r[k] for r in all_runs) for k in ("connect", "read", "write", "timeout")}
    first = next((t["first_other"] for t in all_threads if t["first_other"] not in ("", '""')), "")
    checks.append(("every response 200 or 503", others == 0,
                   f"{others} others" + (f", first: {first}" if first else "")))
    checks.append(("every 503 with Retry-After", no_ra == 0,
                   f"{no_ra} without of {total(all_threads, 'overloaded') + total(all_threads, 'maybe')}"
                   f" ({total(all_threads, 'timeouts')} timeout, {total(all_threads, 'unavailable')} unavailable,"
                   f" {total(all_threads, 'overloaded')} overloaded)"))
    checks.append(("every 200 says what it counted", bad == 0, f"{bad} bodies without it"))
    checks.append(("no wrk timeout, connect or write error", sock["connect"] + sock["write"] + sock["timeout"] == 0,
                   f"connect {sock['connect']}, write {sock['write']}, timeout {sock['timeout']}"))
    # A read error is a connection closed or reset before its answer. Seen
    # when more connections open at once than the listen backlog holds while
    # the gateway is too busy to accept them: the kernel resets some.
    checks.append(("no connection reset (wrk read errors)", sock["read"] == 0,
                   f"read {sock['read']}; host listen queue overflows in the soak {a.listen_overflows},"
                   f" the gateway's listen backlog {a.backlog}"))

    # The store, per wrk thread's own keys.
    stored = {}
    unexpected = 0
    db = sqlite3.connect(f"file:{a.db}?mode=ro", uri=True)
    for entity, action, uuid, value in db.execute("SELECT entity, action, uuid, value FROM counters"):
        m = re.match(r"t(\d+)-k\d+$", uuid)
        if not m:
            unexpected += 1
            continue
        key = (entity, action, int(m.group(1)))
        stored[key] = stored.get(key, 0) + value
    db.close()
    lost = over = 0
    groups = set()
    sum_acked = sum_stored = sum_maybe = sum_sent = 0
    for t in all_threads:
        key = (t["label"], t["action"], t["tid"])
        groups.add(key)
        s = stored.get(key, 0)
        hi = t["acked"] + (t["maybe"] + t["unanswered"]) * t["per_request"]
        sum_acked += t["acked"]
        sum_stored += s
        sum_maybe += hi - t["acked"]
        sum_sent += t["sent"] * t["per_request"]
        if s < t["acked"]:
            lost += 1
            print(f"LOST: {key}: acknowledged {t['acked']}, stored {s}", file=sys.stderr)
        if s > hi:
            over += 1
            print(f"TOO MANY: {key}: stored {s}, at most {hi} may have been applied", file=sys.stderr)
    strays = [k for k in stored if k not in groups]
    checks.append(("acknowledged <= stored, per thread", lost == 0,
                   f"{len(groups)} key sets: acknowledged {sum_acked:,}, stored {sum_stored:,}"))
    checks.append(("stored <= acked + maybe applied", over == 0 and not strays and unexpected == 0,
                   f"maybe applied {sum_maybe:,} (503 not overloaded, unanswered), sent {sum_sent:,};"
                   f" stray key sets {len(strays)}, foreign keys {unexpected}"))

    # Load: offered against capacity.
    cap_probe = total(probe_threads, "acked") / probe_s
    acked_soak = total(soak_threads, "acked") / soak_s
    capacity = max(cap_probe, acked_soak)
    offered_req = total(soak_threads, "sent") / soak_s
    offered_inc = total(soak_threads, "sent", weighted=True) / soak_s
    ratio = offered_inc / capacity if capacity else 0.0
    checks.append((f"offered >= {a.min_ratio:g} x capacity", ratio >= a.min_ratio,
                   f"{ratio:.2f} x (capacity: the higher of probe {cap_probe:,.0f}/s and soak {acked_soak:,.0f}/s)"))

    # Memory.
    rows = list(csv.DictReader(open(a.rss)))
    soak_rows = [r for r in rows if a.soak_start <= float(r["unix_time"]) <= a.soak_end + 1]
    # The first third is the warm-up: the queue fills in seconds, but
    # SQLite's page cache grows with the database up to its cap (a quarter
    # of --sqlite-memory-budget for the writer) over minutes. Flat is what
    # follows: the last third's peak against the middle third's.
    length = a.soak_end - a.soak_start
    third = length / 3
    def rss_in(lo, hi):
        return [int(r["rss_kib"]) for r in soak_rows
                if lo <= float(r["unix_time"]) - a.soak_start < hi]
    warm_w, mid_w, last_w = rss_in(0, third), rss_in(third, 2 * third), rss_in(2 * third, length + 1)
    if warm_w and mid_w and last_w:
        m_max, l_max = max(mid_w), max(last_w)
        growth = l_max / m_max - 1
        flat = growth <= a.flat_tolerance
        detail = (f"last third max {l_max / 1024:.0f} MiB vs middle third max {m_max / 1024:.0f} MiB:"
                  f" {growth:+.1%} (flat: <= {a.flat_tolerance:+.0%}); warm-up third"
                  f" {min(warm_w) / 1024:.0f}-{max(warm_w) / 1024:.0f} MiB")
    else:
        flat, detail = False, f"too few samples in the soak ({len(soak_rows)})"
    checks.append(("resident memory flat", flat, detail))

    log = open(a.gateway_log, errors="replace").read()
    panics = log.count("panicked")
    checks.append(("clean exit on SIGTERM, no panic", a.gateway_exit == 0 and panics == 0,
                   f"exit {a.gateway_exit}, {panics} panics logged"))

    # The table.
    def mib(kib):
        return f"{int(kib) / 1024:.0f}"
    print(f"\novercapacity soak: {soak_s:.0f} s overload after a {probe_s:.0f} s capacity probe;"
          f" gateway flags: {a.flags or '(defaults)'}")
    print(f"{'':44} {'requests/s':>12} {'increments/s':>14}")
    print(f"{'probe: acknowledged (capacity)':44} {total(probe_threads, 'ok') / probe_s:12,.0f} {cap_probe:14,.0f}")
    print(f"{'soak: offered (sent)':44} {offered_req:12,.0f} {offered_inc:14,.0f}")
    print(f"{'soak: acknowledged (200)':44} {total(soak_threads, 'ok') / soak_s:12,.0f} {acked_soak:14,.0f}")
    print(f"{'soak: 503 overloaded':44} {total(soak_threads, 'overloaded') / soak_s:12,.0f}"
          f" {total(soak_threads, 'overloaded', True) / soak_s:14,.0f}")
    print(f"{'soak: 503 other (may be applied)':44} {total(soak_threads, 'maybe') / soak_s:12,.0f}"
          f" {total(soak_threads, 'maybe', True) / soak_s:14,.0f}")
    print(f"offered / acknowledged in the soak: {offered_inc / acked_soak if acked_soak else float('inf'):.2f} x;"
          f" offered / capacity: {ratio:.2f} x")
    def cores(rows):
        cpu = [(float(r["unix_time"]), float(r["cpu_s"])) for r in rows if r["cpu_s"]]
        return (cpu[-1][1] - cpu[0][1]) / (cpu[-1][0] - cpu[0][0]) if len(cpu) > 1 else 0.0
    if soak_rows:
        rss = [int(r["rss_kib"]) for r in soak_rows]
        depth = [int(r["queue_depth"]) for r in soak_rows if r["queue_depth"]]
        print(f"RSS in the soak (MiB): first {mib(rss[0])}, max {mib(max(rss))}, last {mib(rss[-1])};"
              f" VmHWM at the end {mib(soak_rows[-1]['hwm_kib'])}; threads max {max(int(r['threads']) for r in soak_rows)}")
        print(f"queue depth in the soak: mean {sum(depth) / max(len(depth), 1):,.0f}, max {max(depth, default=0):,};"
              f" gateway CPU {cores(soak_rows):.2f} cores in the soak,"
              f" {cores([r for r in rows if r['phase'] == 'probe']):.2f} in the probe (of {os.cpu_count()})")
        step = max(1, len(soak_rows) // 20)
        curve = [f"+{float(r['unix_time']) - a.soak_start:.0f}s {mib(r['rss_kib'])}" for r in soak_rows[::step]]
        print("RSS curve (MiB): " + ", ".join(curve))
    print(f"\n{'check':40} {'':4} detail")
    failed = 0
    for name, passed, detail in checks:
        failed += not passed
        print(f"{name:40} {'ok' if passed else 'FAIL':4} {detail}")
    print(f"\nsoak {'passed' if failed == 0 else f'FAILED ({failed} checks)'}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
