#!/usr/bin/env python3
"""Splits a `perf script` profile of the gateway into the stages of a write.

    perf script -i perf.data | scripts/bench/stages.py --requests N --cpu-us U

Each sample goes to the first stage, in the order of STAGES, that a frame
of its stack names anywhere (so a malloc called by the JSON parser counts
as parsing, a pwrite called by SQLite as SQLite, and hyper, an ancestor of
every handler, only what no later stage claims). With the gateway's CPU time over the load and
the requests it answered, each stage is also given in CPU microseconds per
request. Also prints the share of each thread and the top leaf functions.
"""
import argparse
import collections
import re
import sys

# (stage, pattern) in priority order: the first whose pattern a frame matches.
STAGES = [
    ("fsync", r"fdatasync|sync_data|ext4_sync_file|file_write_and_wait|jbd2_"),
    ("coalescing", r"domain::coalesce|Coalesced::|coalesce_fresh"),
    ("SQLite", r"sqlite3|rusqlite"),
    ("store (writer's memory, log)", r"store::sqlite"),
    ("answer (serialize)", r"serde_json::ser|IntoResponse>::into_response|Serialize>::serialize"),
    ("parse + validate", r"serde_json::de|serde_core::de|serde::de|parse_json|from_spec|IncrementSpec|CounterKey::new|validate_name|Interner|read_batch|parse_batch|chrono|Deserialize|deserialize|api::model"),
    ("context switches", r"finish_task_switch|__schedule|^schedule$"),
    ("HTTP + routing", r"epoll|mio::"),
    ("queue + hand-offs", r"pipeline::|flusher|sync_loop|sync::oneshot|mpsc|spawn_blocking|Notify|futex|try_to_wake_up|wake_up_q|park|Condvar|pthread_cond"),
    ("HTTP + routing", r"hyper|axum|tower|http::|h1::|tcp_|sock_|epoll|mio::|__sys_sendto|__sys_recvfrom|inet_|ip_|__x64_sys_(sendto|recvfrom|write|read|writev)|net_rx|skb|api::|metrics::|access::|tenant::"),
    ("runtime (tokio)", r"tokio::"),
    ("allocator", r"malloc|free|realloc|_int_|mi_|cfree"),
]
COMPILED = [(s, re.compile(p)) for s, p in STAGES]


def strip_generics(f):
    """`<A<T> as B<U>>::poll` -> `<A as B>::poll`; `call<X, Y>` -> `call`:
    type arguments name types a frame works for, not what it does."""
    f = re.sub(r"\+0x[0-9a-f]+", "", f.split(" (")[0]).replace("->", " returns ")
    if f.startswith("<"):
        depth = 0
        for j, ch in enumerate(f):
            depth += (ch == "<") - (ch == ">")
            if depth == 0:
                break
        inner = f[1:j]
        parts, depth, start = [], 0, 0
        for i, ch in enumerate(inner):
            depth += (ch == "<") - (ch == ">")
            if depth == 0 and inner.startswith(" as ", i):
                parts.append(inner[start:i])
                start = i + 4
        parts.append(inner[start:])
        return "<" + " as ".join(strip_generics(p) for p in parts) + ">" + strip_generics(f[j + 1:])
    out, depth = [], 0
    for ch in f:
        if ch == "<":
            depth += 1
        elif ch == ">" and depth:
            depth -= 1
        elif depth == 0:
            out.append(ch)
    return "".join(out)


def classify(frames):
    frames = [strip_generics(f) for f in frames]
    for stage, pat in COMPILED:
        if any(pat.search(f) for f in frames):
            return stage
    return "other"


def samples(lines):
    head, frames = None, []
    for line in lines:
        line = line.rstrip("\n")
        if not line:
            if head is not None:
                yield head, frames
            head, frames = None, []
        elif line.startswith(("\t", " ")) and head is not None:
            parts = line.strip().split(None, 1)
            frames.append(parts[1] if len(parts) > 1 else parts[0])
        else:
            head, frames = line, []
    if head is not None:
        yield head, frames


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=float, default=0)
    ap.add_argument("--cpu-us", type=float, default=0, help="gateway CPU microseconds over the load")
    ap.add_argument("--top", type=int, default=25)
    a = ap.parse_args()
    by_stage = collections.Counter()
    by_thread = collections.Counter()
    leaves = collections.Counter()
    n = 0
    for head, frames in samples(sys.stdin):
        n += 1
        by_stage[classify(frames)] += 1
        thread = re.sub(r"[-\d]+$", "", head.split()[0]) if head.split() else "?"
        by_thread[thread] += 1
        leaves[frames[0] if frames else "?"] += 1
    if n == 0:
        print("no samples")
        return
    per_req = a.cpu_us / a.requests if a.requests else 0
    print(f"{n} samples; gateway CPU {per_req:.1f} us per request" if per_req else f"{n} samples")
    print(f"{'stage':28} {'share':>7} {'us/request':>11}")
    for stage, c in by_stage.most_common():
        us = f"{per_req * c / n:11.2f}" if per_req else ""
        print(f"{stage:28} {100 * c / n:6.1f}% {us}")
    print(f"\n{'thread':28} {'share':>7}")
    for t, c in by_thread.most_common():
        print(f"{t:28} {100 * c / n:6.1f}%")
    print(f"\ntop {a.top} leaf functions")
    for f, c in leaves.most_common(a.top):
        print(f"{100 * c / n:6.1f}%  {f[:110]}")


if __name__ == "__main__":
    main()
