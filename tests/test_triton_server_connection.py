"""The local endpoint's client of ``tritonserver``: one kept-alive connection per thread.

Against a real HTTP server on loopback that closes each connection after one answer (as a server
closing an idle kept-alive connection does), so the reuse and the one resend are exercised for real.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from triton_mme_cdk.model_build.tools.local_endpoint.triton_server import TritonServer


@contextmanager
def _one_answer_per_connection(answers_per_connection: int) -> Iterator[tuple[int, list[int]]]:
    """A loopback HTTP/1.1 server: answers ``answers_per_connection`` requests per connection
    (keep-alive, no ``Connection: close``), then closes it. Yields (port, requests per connection)."""
    listener = socket.create_server(("127.0.0.1", 0))
    served: list[int] = []
    stop = threading.Event()
    lock = threading.Lock()

    def answer(conn: socket.socket) -> None:
        with conn, conn.makefile("rb") as reader:  # both closed: the client sees the connection end
            with lock:
                served.append(0)
                index = len(served) - 1
            for _ in range(answers_per_connection):
                if not reader.readline():
                    break
                length = 0
                while (header := reader.readline()) not in (b"\r\n", b""):
                    name, _, value = header.decode().partition(":")
                    if name.lower() == "content-length":
                        length = int(value)
                reader.read(length)
                with lock:
                    served[index] += 1
                    body = f"answer {sum(served)}".encode()
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n"
                             + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)

    def serve() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            conn.settimeout(10)
            threading.Thread(target=answer, args=(conn,), daemon=True).start()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1], served
    finally:
        stop.set()
        thread.join(5)
        listener.close()


def _server(port: int) -> TritonServer:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return TritonServer(process, port, Path("unused.log"), version="test")


def test_calls_of_one_thread_share_one_connection() -> None:
    with _one_answer_per_connection(answers_per_connection=100) as (port, served):
        server = _server(port)
        answers = [server.request("POST", "/models/m/invoke", b"{}", timeout=5) for _ in range(5)]
    assert [a.status for a in answers] == [200] * 5
    assert [a.body for a in answers] == [f"answer {i}".encode() for i in range(1, 6)]
    assert served == [5], "five calls, one connection"


def test_a_connection_the_server_closed_is_replaced_and_the_call_sent_once_more() -> None:
    with _one_answer_per_connection(answers_per_connection=1) as (port, served):
        server = _server(port)
        answers = [server.request("GET", "/ping", timeout=5) for _ in range(3)]
    assert [a.body for a in answers] == [b"answer 1", b"answer 2", b"answer 3"]
    assert served == [1, 1, 1], "each call after a closed connection went out once, on a new one"


def test_threads_do_not_share_a_connection() -> None:
    with _one_answer_per_connection(answers_per_connection=100) as (port, served):
        server = _server(port)
        results: list[int] = []
        threads = [threading.Thread(target=lambda: results.extend(
            server.request("GET", "/ping", timeout=5).status for _ in range(3))) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(10)
    assert results == [200] * 6
    assert sorted(served) == [3, 3]


def test_a_server_that_is_gone_raises_at_once() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # closed again below: nothing listens there
    with pytest.raises(ConnectionRefusedError):
        _server(port).request("GET", "/ping", timeout=5)
