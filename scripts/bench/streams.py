#!/usr/bin/env python3
"""Holds N idle live streams (GET /v1/stream) open against a gateway.

usage: streams.py BASE_URL N HOLD_SECONDS [PATH]

Opens N connections (at most 200 connecting at once), each asking for its
own counter (STREAM/VIEW/s<i>), and waits for each one's first `counter`
event. Then prints `open N` on stdout and flushes, holds every stream for
HOLD_SECONDS while reading what comes (keep-alive comments only, since
nothing writes), prints `held N` with the streams still open, and exits.
With PATH (e.g. /healthz), each connection asks that once instead and is
held open idle: the cost of a connection alone, to compare.
"""
import asyncio
import sys
from urllib.parse import urlparse


async def open_stream(host, port, i, gate, path):
    async with gate:
        reader, writer = await asyncio.open_connection(host, port)
        target = path or f"/v1/stream?keys=STREAM/VIEW/s{i}"
        writer.write(f"GET {target} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode())
        await writer.drain()
        buf = b""
        until = b"\r\n\r\n" if path else b"event: counter"
        while until not in buf:
            chunk = await reader.read(4096)
            if not chunk:
                raise RuntimeError(f"stream {i} ended before its first event: {buf[:200]!r}")
            buf += chunk
        if not buf.startswith(b"HTTP/1.1 200"):
            raise RuntimeError(f"stream {i}: {buf[:200]!r}")
    return reader, writer


async def drain(reader):
    """Reads until the stream ends; True if it ended."""
    while await reader.read(4096):
        pass
    return True


async def main():
    base, n, hold = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    path = sys.argv[4] if len(sys.argv) > 4 else None
    url = urlparse(base)
    gate = asyncio.Semaphore(200)
    streams = await asyncio.gather(*(open_stream(url.hostname, url.port, i, gate, path) for i in range(n)))
    print(f"open {len(streams)}", flush=True)
    readers = [asyncio.ensure_future(drain(r)) for r, _ in streams]
    await asyncio.sleep(hold)
    ended = sum(1 for t in readers if t.done())
    print(f"held {n - ended}", flush=True)
    for t in readers:
        t.cancel()
    for _, w in streams:
        w.close()


asyncio.run(main())
