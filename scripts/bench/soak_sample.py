#!/usr/bin/env python3
"""Memory sampler for scripts/soak.sh: every INTERVAL seconds, one CSV row with
the gateway's VmRSS, VmHWM, threads and CPU seconds used (from /proc) and its
queue depth (from /metrics),
tagged with the phase soak.sh names in PHASE_FILE. Stops when the process is
gone, when STOP_FILE appears, or after MAX_SECONDS, whichever comes first."""

import argparse
import os
import time
import urllib.request


def status_field(pid, field):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def cpu_seconds(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            # Fields after the command name, which may hold spaces: utime is the 14th.
            rest = f.read().rsplit(")", 1)[1].split()
        return (int(rest[11]) + int(rest[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return ""


def queue_depth(url):
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            for line in r.read().decode().splitlines():
                if line.startswith("counter_gateway_queue_depth"):
                    return int(float(line.split()[-1]))
    except Exception:  # a busy or stopping gateway: leave the cell empty
        return ""
    return ""


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--pid", type=int, required=True)
    p.add_argument("--metrics", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--phase-file", required=True)
    p.add_argument("--stop-file", required=True)
    p.add_argument("--interval", type=float, default=5.0)
    p.add_argument("--max-seconds", type=float, required=True)
    a = p.parse_args()
    start = time.monotonic()
    with open(a.out, "w", buffering=1) as out:
        out.write("unix_time,elapsed_s,phase,rss_kib,hwm_kib,threads,cpu_s,queue_depth\n")
        k = 0
        while time.monotonic() - start < a.max_seconds and not os.path.exists(a.stop_file):
            rss = status_field(a.pid, "VmRSS")
            if rss is None:
                break
            hwm = status_field(a.pid, "VmHWM")
            threads = status_field(a.pid, "Threads")
            cpu = cpu_seconds(a.pid)
            try:
                phase = open(a.phase_file).read().strip()
            except OSError:
                phase = ""
            depth = queue_depth(a.metrics)
            out.write(f"{time.time():.1f},{time.monotonic() - start:.1f},{phase},{rss},{hwm},{threads},{cpu},{depth}\n")
            k += 1
            # Sample on a fixed grid, so a slow /metrics does not stretch it.
            time.sleep(max(0.0, start + k * a.interval - time.monotonic()))


if __name__ == "__main__":
    main()
