"""The S3 side of the publish benchmark in its own process: moto's server behind the latency proxy.

Why a separate process: moto and the proxy are Python servers. In the benchmark's own process
they would compete with the client for one interpreter lock, and a concurrent client would be
slowed by its own server, which no real S3 does. In a child process the server side gets its own
interpreter (and core), and its CPU time can be read separately: that is how the benchmark tells
whether a run was limited by the latency or by the local server.

The parent talks to it over a pipe (:class:`S3Side`); everything listens on 127.0.0.1 only.
:func:`empty_bucket` frees what a run stored there.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import sys
import time
from collections import Counter
from multiprocessing.connection import Connection
from typing import Any

#: TCP_NODELAY on the proxy's client sockets (set by tests/s3_faults.py; recorded in the results).
NODELAY = True


def empty_bucket(client: Any, bucket: str) -> None:
    """Delete a bucket and its objects: moto keeps every body in memory, 200 copies per run."""
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        keys = [{"Key": item["Key"]} for item in page.get("Contents", [])]
        if keys:
            client.delete_objects(Bucket=bucket, Delete={"Objects": keys, "Quiet": True})
    client.delete_bucket(Bucket=bucket)


def _cpu_seconds() -> float:
    """CPU seconds of the whole server process, all threads (nanosecond clock, not 10 ms ticks)."""
    return time.process_time()


def _counts(proxy: Any) -> dict[str, int]:
    """Requests that reached the server, by kind (a copy is a PUT with x-amz-copy-source)."""
    counts: Counter[str] = Counter()
    for record in proxy.forwarded():
        kind = "COPY" if record.is_copy else record.method
        if record.method == "GET" and "list-type" in record.target:
            kind = "LIST"
        counts[kind] += 1
    return dict(sorted(counts.items()))


def _serve(conn: Connection, tests_dir: str) -> None:
    """Child process: start moto, then answer commands until ``exit`` (or the pipe closes)."""
    sys.path.insert(0, tests_dir)
    from s3_faults import FaultProxy

    from triton_mme_cdk.model_build.tools.local_s3 import local_s3

    proxy: FaultProxy | None = None
    with local_s3() as endpoint:
        conn.send({"endpoint": endpoint})
        try:
            while True:
                try:
                    command, argument = conn.recv()
                except EOFError:
                    break
                if command == "proxy":
                    if proxy is not None:
                        proxy.close()
                    proxy = FaultProxy(endpoint, latency=float(argument))
                    conn.send({"url": proxy.url})
                elif command == "reset":
                    assert proxy is not None
                    proxy.reset_records()
                    conn.send({"cpu_s": _cpu_seconds()})
                elif command == "stats":
                    assert proxy is not None
                    conn.send({"bytes_uploaded": proxy.bytes_uploaded(), "requests": _counts(proxy),
                               "cpu_s": _cpu_seconds()})
                elif command == "exit":
                    conn.send({})
                    break
                else:
                    conn.send({"error": f"unknown command {command!r}"})
        finally:
            if proxy is not None:
                proxy.close()


class S3Side:
    """Handle on the child process: ``endpoint`` (moto, direct) and ``start_proxy(latency)``."""

    def __init__(self, tests_dir: str) -> None:
        context = multiprocessing.get_context("spawn")  # no fork of a process holding threads
        self._conn, child = context.Pipe()
        self._process = context.Process(target=_serve, args=(child, tests_dir), name="bench-s3", daemon=True)
        self._process.start()
        child.close()
        self.endpoint: str = self._ask_ready()["endpoint"]

    def _ask_ready(self) -> dict[str, Any]:
        if not self._conn.poll(120):
            raise RuntimeError("the S3 server process did not start within 120 s")
        return dict(self._conn.recv())

    def _call(self, command: str, argument: Any = None) -> dict[str, Any]:
        self._conn.send((command, argument))
        if not self._conn.poll(120):
            raise RuntimeError(f"the S3 server process did not answer {command!r} within 120 s")
        answer = dict(self._conn.recv())
        if "error" in answer:
            raise RuntimeError(answer["error"])
        return answer

    def start_proxy(self, latency_s: float) -> str:
        """A new proxy with this fixed latency per request (the previous one is closed)."""
        return str(self._call("proxy", latency_s)["url"])

    def reset(self) -> float:
        """Forget the recorded requests; returns the server's CPU seconds so far."""
        return float(self._call("reset")["cpu_s"])

    def stats(self) -> dict[str, Any]:
        """Body bytes of forwarded PUTs, requests by kind and CPU seconds, since :meth:`reset`."""
        return self._call("stats")

    def close(self) -> None:
        if self._process.is_alive():
            with contextlib.suppress(OSError, RuntimeError, EOFError):
                self._call("exit")
            self._process.join(timeout=30)
        if self._process.is_alive():
            self._process.terminate()  # our own child only
            self._process.join(timeout=10)
        self._conn.close()

    def __enter__(self) -> S3Side:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
