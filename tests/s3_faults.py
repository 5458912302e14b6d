"""A fault-injecting HTTP reverse proxy for a local S3 endpoint (moto's server), on 127.0.0.1 only.

Tests point boto3 at the proxy instead of the server, so the real HTTP path (retries, timeouts,
connection reuse, checksums) meets the faults real S3 produces: ``503 SlowDown`` throttling,
``500 InternalError``, connections reset mid-request, responses that never come, slow links. The
proxy also records every request it sees, which lets a test tell a PUT that carried bytes from a
server-side copy.

Everything is bounded: a rule applies to a fixed number of requests, a stall to at most
``max_stall`` seconds, upstream calls time out, idle client connections are dropped, and
:meth:`FaultProxy.close` (or leaving the ``with`` block) ends every thread it started.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import re
import signal
import socket
import struct
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Literal
from urllib.parse import urlsplit

Action = Literal["error", "reset", "stall", "delay", "corrupt", "hold", "landed", "kill"]

#: Headers that describe one hop, not the message; never forwarded.
_HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "proxy-connection", "te", "trailer", "transfer-encoding", "upgrade", "expect"}
)
_MESSAGES = {
    "SlowDown": "Please reduce your request rate.",
    "ThrottlingException": "Rate exceeded",
    "InternalError": "We encountered an internal error. Please try again.",
    "ServiceUnavailable": "Service is unable to handle request.",
    "ProcessKilled": "The process that sent this request was killed (injected by the test's fault proxy).",
}


@dataclass
class Rule:
    """Apply ``action`` to the next ``times`` requests that match.

    ``method`` (``PUT``...) and ``path`` (a regex searched in the request target, path and query,
    e.g. ``r"partNumber=2"``) select requests; ``copy`` selects server-side copies (True), requests
    that are not copies (False) or both (None).

    - ``error``: answer ``status`` with an S3 XML error ``code`` (the request is not forwarded);
      with ``service="sagemaker-runtime"``, the JSON error SageMaker's runtime sends (``x-amzn-ErrorType``),
      and for ``code="ModelError"`` the model's ``original_status`` (507: out of memory) as it relays it.
    - ``reset``: read the request, then reset the connection (TCP RST) without answering.
    - ``stall``: read the request, answer nothing for ``seconds``, then close the connection.
    - ``delay``: wait ``seconds``, then forward.
    - ``corrupt``: forward, then flip one byte of the response body.
    - ``hold``: wait until ``gate`` is set (at most the proxy's ``max_stall``), then forward: a test
      orders concurrent requests with it (``hits`` says a request is being held).
    - ``landed``: forward (the request lands), then reset the connection without answering: a
      timeout after the call landed; the client's retry meets what it did.
    - ``kill``: forward (the request lands), then the process that sent it is dead: with a process
      run by :meth:`FaultProxy.run_killable`, it is sent SIGKILL and reaped-ready (dead) before
      the connection is reset, so it never gets the answer and does nothing after the call, S3 or
      not. Either way every later request is answered ``400 ProcessKilled`` (not retried) until
      :meth:`FaultProxy.revive`: a request the dead process had sent, still unread, never lands.

    ``after``: let that many matching requests through first (the ``after + 1``-th is the first
    one the rule applies to): the enumeration of a step's calls fails its n-th call of a key.
    """

    action: Action
    method: str | None = None
    path: str = ""
    copy: bool | None = None
    times: int = 1
    status: int = 503
    code: str = "SlowDown"
    seconds: float = 0.0
    gate: threading.Event | None = None
    service: Literal["s3", "sagemaker-runtime"] = "s3"
    original_status: int | None = None
    after: int = 0
    hits: int = field(default=0, init=False)
    seen: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        if not 1 <= self.times <= 10_000:
            raise ValueError(f"times: got {self.times}; a rule applies to 1 to 10000 requests")
        if (self.action == "hold") != (self.gate is not None):
            raise ValueError(f"gate: got {self.gate!r} for action {self.action!r}; 'hold' and only 'hold' takes one")
        self._pattern = re.compile(self.path)

    def matches(self, method: str, target: str, is_copy: bool) -> bool:
        return (
            self.hits < self.times
            and (self.method is None or self.method == method)
            and (self.copy is None or self.copy == is_copy)
            and self._pattern.search(target) is not None
        )

    def passes(self) -> bool:
        """For a matching request: whether it is one of the first ``after``, let through."""
        if self.seen < self.after:
            self.seen += 1
            return True
        return False


@dataclass(frozen=True)
class Record:
    """One request the proxy received and what it did with it."""

    method: str
    target: str
    status: int | None  # None when no answer was sent (reset, stall)
    body_bytes: int
    is_copy: bool
    injected: Action | None
    checksum_sha256: str | None  # the x-amz-checksum-sha256 header, when sent
    at: float


class FaultProxy:
    """A threaded reverse proxy in front of ``upstream`` (an ``http://127.0.0.1:<port>`` URL)."""

    def __init__(
        self,
        upstream: str,
        *,
        latency: float = 0.0,
        max_stall: float = 30.0,
        upstream_timeout: float = 60.0,
        idle_timeout: float = 15.0,
    ) -> None:
        parts = urlsplit(upstream)
        if parts.scheme != "http" or parts.hostname not in {"127.0.0.1", "localhost"} or not parts.port:
            raise ValueError(f"upstream: got {upstream!r}; expected http://127.0.0.1:<port>")
        self.upstream = (parts.hostname, parts.port)
        #: Seconds added before every request is handled (a slow link), e.g. 0.030.
        self.latency = latency
        self.max_stall = max_stall
        self.upstream_timeout = upstream_timeout
        self.records: list[Record] = []
        self._rules: list[Rule] = []
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._connections: set[socket.socket] = set()
        #: Set by a ``kill`` rule: every request is refused until :meth:`revive`.
        self.killed = False
        #: The process a ``kill`` rule kills (:meth:`run_killable`'s child while it runs).
        self._victim: int | None = None
        self._server = _Server(("127.0.0.1", 0), _handler_class(self, idle_timeout))
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.1},
                                        name="s3-fault-proxy", daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        assert isinstance(host, str)  # an AF_INET server's address: (host, port), host a str
        return f"http://{host}:{port}"

    # -- rules and records ---------------------------------------------------------------------

    def add(self, rule: Rule) -> Rule:
        with self._lock:
            self._rules.append(rule)
        return rule

    def clear(self) -> None:
        """Drop every rule (the records stay)."""
        with self._lock:
            self._rules.clear()

    def reset_records(self) -> None:
        with self._lock:
            self.records.clear()

    def revive(self) -> None:
        """After a ``kill``: requests reach the server again (the next process, a rerun)."""
        with self._lock:
            self.killed = False

    def run_killable(self, step: Callable[[], None], *, timeout: float = 120.0) -> Literal["ok", "failed", "killed"]:
        """Run ``step`` in a forked child process, the one a ``kill`` rule kills; wait for it to end.

        Returns ``ok`` (it returned), ``failed`` (it raised) or ``killed`` (SIGKILL, by a ``kill``
        rule). The child makes its own clients (a client made before the fork shares the parent's
        pooled connections); it starts only once the proxy knows its pid, so a kill rule that
        matches its first request finds it, and it leaves by ``os._exit`` (no exit handler of the
        test process runs in it). A child still running after ``timeout`` seconds is killed and
        raises :class:`AssertionError`. POSIX only (``os.fork``)."""
        ready_read, ready_write = os.pipe()
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        pid = os.fork()
        if pid == 0:  # the child
            code = 1
            try:
                os.close(ready_write)
                os.read(ready_read, 1)  # until the proxy knows this pid
                step()
                code = 0
            except BaseException:  # a failed step: its exit status says so, its traceback does not matter
                code = 1
            finally:
                os._exit(code)
        os.close(ready_read)
        with self._lock:
            self._victim = pid
        overdue = threading.Event()

        def end_overdue() -> None:
            overdue.set()
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

        timer = threading.Timer(timeout, end_overdue)
        timer.start()
        try:
            os.write(ready_write, b"x")
            os.close(ready_write)
            _, status = os.waitpid(pid, 0)
        finally:
            timer.cancel()
            with self._lock:
                self._victim = None
        if overdue.is_set():
            raise AssertionError(f"the step's process was still running after {timeout} s (killed)")
        if os.WIFSIGNALED(status):
            if os.WTERMSIG(status) != signal.SIGKILL:
                raise AssertionError(f"the step's process ended by signal {os.WTERMSIG(status)}, not by a kill rule")
            return "killed"
        return "ok" if os.WEXITSTATUS(status) == 0 else "failed"

    def forwarded(self, method: str | None = None, *, is_copy: bool | None = None) -> list[Record]:
        """Requests that reached the server (no fault injected instead of them)."""
        with self._lock:
            records = list(self.records)
        return [
            r
            for r in records
            if r.injected in (None, "delay", "corrupt", "hold", "landed", "kill")
            and (method is None or r.method == method)
            and (is_copy is None or r.is_copy == is_copy)
        ]

    def bytes_uploaded(self) -> int:
        """Body bytes of the PUT requests forwarded to the server (object and part uploads)."""
        return sum(r.body_bytes for r in self.forwarded("PUT", is_copy=False))

    # -- lifecycle -----------------------------------------------------------------------------

    def close(self) -> None:
        """Stop serving, wake any stall or delay, drop open connections and join the threads."""
        if self._closing.is_set():
            return
        self._closing.set()
        self._server.shutdown()
        with self._lock:
            connections = list(self._connections)
        for conn in connections:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        self._server.server_close()  # joins the handler threads (block_on_close)
        self._thread.join(timeout=5)

    def __enter__(self) -> FaultProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- used by the handler -------------------------------------------------------------------

    def _match(self, method: str, target: str, is_copy: bool) -> Rule | None:
        with self._lock:
            if self.killed:
                return _DEAD
            for rule in self._rules:
                if rule.matches(method, target, is_copy) and not rule.passes():
                    rule.hits += 1
                    if rule.action == "kill":
                        self.killed = True
                    return rule
        return None

    def _kill_victim(self) -> None:
        """SIGKILL :meth:`run_killable`'s child and return once it is dead (it is left for the
        parent to reap); nothing to do without one."""
        with self._lock:
            pid = self._victim
        if pid is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        # Dead, not yet reaped (WNOWAIT): run_killable's waitpid reaps it; ECHILD: it already did.
        with contextlib.suppress(ChildProcessError):
            os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)

    def _record(self, record: Record) -> None:
        with self._lock:
            self.records.append(record)

    def _hold(self, gate: threading.Event) -> None:
        """Wait for ``gate``, at most ``max_stall`` seconds; return at once when the proxy closes."""
        deadline = time.monotonic() + self.max_stall
        while not gate.wait(0.02) and not self._closing.is_set() and time.monotonic() < deadline:
            pass

    def _sleep(self, seconds: float) -> None:
        """Sleep, but return at once when the proxy closes."""
        if seconds > 0:
            self._closing.wait(min(seconds, self.max_stall))


#: What a killed process's requests get: a 400 that botocore does not retry.
_DEAD = Rule("error", status=400, code="ProcessKilled", times=10_000)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = True
    allow_reuse_address = True

    def handle_error(self, request: socket.socket | tuple[bytes, socket.socket], client_address: Any) -> None:
        """A client that went away (a killed process's connections are reset) is no error."""
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


def _handler_class(proxy: FaultProxy, idle_timeout: float) -> type[BaseHTTPRequestHandler]:
    class Handler(_ProxyHandler):
        owner = proxy
        timeout = idle_timeout  # socket timeout: an idle keep-alive connection is dropped

    return Handler


class _ProxyHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as with S3: botocore reuses pooled connections
    # Headers and body go out in two sends; with Nagle's algorithm a response with a body would
    # wait for the client's delayed ACK (~40 ms), a stall no S3 endpoint has.
    disable_nagle_algorithm = True
    owner: FaultProxy

    def setup(self) -> None:
        super().setup()
        with self.owner._lock:
            self.owner._connections.add(self.connection)

    def finish(self) -> None:
        with self.owner._lock:
            self.owner._connections.discard(self.connection)
        with contextlib.suppress(OSError):  # a reset connection cannot be flushed
            super().finish()

    def log_message(self, format: str, *args: object) -> None:  # quiet: tests read records
        pass

    def do_GET(self) -> None:
        self._proxy()

    do_PUT = do_POST = do_DELETE = do_HEAD = do_GET

    def _proxy(self) -> None:
        owner = self.owner
        owner._sleep(owner.latency)
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            self._send_error(501, "NotImplemented")
            return
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        is_copy = "x-amz-copy-source" in self.headers
        rule = owner._match(self.command, self.path, is_copy)
        action = rule.action if rule else None
        if rule is not None and action == "delay":
            owner._sleep(rule.seconds)
        if rule is not None and rule.gate is not None:
            owner._hold(rule.gate)
        response = None
        if action not in {"error", "reset", "stall"}:
            response = self._forward(body)
        status = rule.status if rule is not None and action == "error" else response[0] if response else None
        # Recorded before anything goes back: once the client has its answer, the record exists.
        owner._record(
            Record(
                method=self.command,
                target=self.path,
                status=status,
                body_bytes=len(body),
                is_copy=is_copy,
                injected=action,
                checksum_sha256=self.headers.get("x-amz-checksum-sha256"),
                at=time.monotonic(),
            )
        )
        if action == "kill":  # dead before its answer could reach it
            owner._kill_victim()
        if rule is not None and action == "error" and rule.service == "sagemaker-runtime":
            self._send_json_error(rule.status, rule.code, rule.original_status)
        elif rule is not None and action == "error":
            self._send_error(rule.status, rule.code)
        elif action in {"reset", "landed", "kill"}:
            self._reset()
        elif rule is not None and action == "stall":
            owner._sleep(rule.seconds)
            self.close_connection = True
        elif response is not None:
            self._reply(*response, corrupt=action == "corrupt")

    def _forward(self, body: bytes) -> tuple[int, str, list[tuple[str, str]], bytes]:
        """Send the request to the server; returns its status, reason, headers and body."""
        host, port = self.owner.upstream
        upstream = http.client.HTTPConnection(host, port, timeout=self.owner.upstream_timeout)
        try:
            upstream.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
            for name, value in self.headers.items():
                if name.lower() not in _HOP_BY_HOP:
                    upstream.putheader(name, value)  # Host too: the client signed it
            upstream.endheaders(body if body or self.command in {"PUT", "POST"} else None)
            response = upstream.getresponse()
            return response.status, response.reason, response.getheaders(), response.read()
        finally:
            upstream.close()

    def _reply(self, status: int, reason: str, headers: list[tuple[str, str]], data: bytes, *, corrupt: bool) -> None:
        if corrupt and data:
            data = bytes([data[0] ^ 0xFF]) + data[1:]
        self.send_response_only(status, reason)
        length = str(len(data))
        for name, value in headers:
            lowered = name.lower()
            if lowered in _HOP_BY_HOP:
                continue
            if lowered == "content-length":
                # HEAD answers carry the object's length and no body: keep the server's value.
                length = value if self.command == "HEAD" else length
                continue
            self.send_header(name, value)
        self.send_header("Content-Length", length)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def _send_error(self, status: int, code: str) -> None:
        message = _MESSAGES.get(code, code)
        request_id = uuid.uuid4().hex[:16].upper()
        xml = (
            '<?xml version="1.0" encoding="UTF-8"?>\n'
            f"<Error><Code>{code}</Code><Message>{message}</Message>"
            f"<RequestId>{request_id}</RequestId></Error>"
        ).encode()
        self.send_response_only(status)
        self.send_header("Content-Type", "application/xml")
        self.send_header("x-amz-request-id", request_id)
        self.send_header("Content-Length", "0" if self.command == "HEAD" else str(len(xml)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(xml)

    def _send_json_error(self, status: int, code: str, original_status: int | None) -> None:
        """The error as SageMaker's runtime sends it (rest-json: the code in ``x-amzn-ErrorType``)."""
        request_id = str(uuid.uuid4())
        message = _MESSAGES.get(code, f"{code} (injected by the test's fault proxy)")
        document: dict[str, object] = {"message": message}
        if original_status is not None:
            document = {"ErrorCode": "SERVER_ERROR_FROM_MODEL" if original_status >= 500 else "CLIENT_ERROR_FROM_MODEL",
                        "Message": f"Received server error ({original_status}) from primary with message \"{message}\"",
                        "OriginalMessage": message, "OriginalStatusCode": original_status,
                        "LogStreamArn": "injected"}
        data = json.dumps(document).encode()
        self.send_response_only(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("x-amzn-ErrorType", f"{code}:http://internal.amazon.com/coral/com.amazon.sagemaker/")
        self.send_header("x-amzn-RequestId", request_id)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _reset(self) -> None:
        """Close with SO_LINGER 0, which sends a TCP RST instead of a FIN."""
        self.close_connection = True
        try:
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.rfile.close()  # the makefile() reference would otherwise keep the socket open
            self.connection.close()
        except OSError:
            pass
