"""The fork server ("zygote") behind :func:`hostile_helpers.run_bounded`; never imported.

``hostile_helpers`` starts it as ``python -c <this file's text>`` in the repository root, with the
environment a run would get less its per-test variables, and talks to it over its stdin and
stdout, one JSON line per request and per reply. What it shares with every run and what it does
not is written in ``hostile_helpers``' docstring. It uses the standard library only: what it
imports besides ``model_build.__main__``'s own imports is a few small modules of its own (json,
resource, runpy, select), all cheap and none of them a dependency of the tool.

Start: the imports of a fresh ``python -m model_build`` (``model_build.__main__``, not run), then
checks that fail loudly (a ``{"error": ...}`` reply and exit 1): none of the heavy libraries
(:data:`HEAVY`) was imported, nothing was printed, ``tempfile`` has no cached directory, and
the process has one thread (numpy's OpenBLAS starts a worker thread at import; OpenBLAS stops it
before a fork, so one fork of a child that exits at once leaves the zygote with one thread,
which is checked again before each fork). Then ``{"ready": true}``.

A request: ``{"args": ["-m", "model_build", ...] or ["-c", code, ...], "env": {...}, "cwd": ...,
"memory_limit": bytes, "timeout": seconds, "stdout": path, "stderr": path}``. The zygote forks a
child that sets the address-space limit, the directory and ``os.environ``, points fd 1 and 2 at
the two files, runs the module or the code as the interpreter would, and exits with the status
the interpreter would give. The zygote kills the child with SIGKILL past ``timeout`` (watched
through a pidfd, so no other process can get the signal) and replies
``{"returncode": ..., "timed_out": ...}`` (the return code as ``subprocess`` gives it).
"""

from __future__ import annotations

import atexit
import builtins
import contextlib
import json
import os
import resource
import runpy
import select
import signal
import sys
import threading
import types
from typing import Any, NoReturn

#: Libraries the CLI must not import before it reads its input: the zygote refuses to start if
#: importing ``model_build.__main__`` pulled any of them in.
HEAVY = frozenset({"torch", "transformers", "onnx", "onnxruntime", "boto3", "aws_cdk"})


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


def _reply(fd: int, message: dict[str, Any]) -> None:
    data = (json.dumps(message) + "\n").encode()
    while data:
        data = data[os.write(fd, data):]


def _fail(fd: int, reason: str) -> NoReturn:
    _reply(fd, {"error": reason})
    os._exit(1)


def _start() -> tuple[int, int]:
    """The requests' and replies' descriptors, once the zygote holds the CLI's imports."""
    requests, replies = os.dup(0), os.dup(1)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    os.dup2(2, 1)  # what the imports print goes where the zygote's stderr goes: checked below
    sys.path[0] = os.getcwd()  # as `python -m` sets it (`python -c` sets "")
    import tempfile

    import triton_mme_cdk.model_build.__main__  # noqa: F401  (its imports, as a fresh `python -m model_build` makes them)

    heavy = sorted(name for name in sys.modules if name.partition(".")[0] in HEAVY)
    if heavy:
        _fail(replies, f"importing model_build.__main__ imported {', '.join(heavy[:8])}: the CLI must "
                       "refuse bad input before it imports them (no zygote: that is the regression to fix)")
    if tempfile.tempdir is not None:
        _fail(replies, f"importing model_build.__main__ fixed tempfile.tempdir ({tempfile.tempdir}): "
                       "the runs' TMPDIR would not apply")
    sys.stdout.flush()
    sys.stderr.flush()
    if os.fstat(2).st_size:
        _fail(replies, "importing model_build.__main__ printed something (a fresh run prints it each "
                       "time; a forked one would not): see the zygote's log")
    pid = os.fork()  # OpenBLAS's fork handler stops its worker threads
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    if _threads() != 1:
        _fail(replies, f"the zygote has {_threads()} threads after its imports; it forks only with one")
    return requests, replies


def _exit_status(code: object) -> int:
    """What the interpreter exits with on ``SystemExit(code)``."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def _run(args: list[str]) -> int:
    """Runs ``python <args>`` in this process, as the interpreter would; its exit status."""
    try:
        if args[0] == "-m":
            sys.argv = ["-m", *args[2:]]  # run_module puts the module's path in argv[0]
            sys.path[0] = os.getcwd()
            # `python -m model_build[.x]` runs triton_mme_cdk.model_build[.x] (triton_mme_cdk.checkout).
            module = f"triton_mme_cdk.{args[1]}" if args[1].split(".")[0] == "model_build" else args[1]
            # A fresh interpreter has not imported the package's __main__ (runpy would warn).
            sys.modules.pop(f"{module}.__main__", None)
            package = sys.modules.get(module)
            if package is not None and hasattr(package, "__main__"):
                delattr(package, "__main__")
            runpy.run_module(module, run_name="__main__", alter_sys=True)
        else:
            sys.argv = ["-c", *args[2:]]
            sys.path[0] = ""
            loader = getattr(sys.modules["__main__"], "__loader__", None)  # the zygote's own: `-c`'s
            main = types.ModuleType("__main__")
            main.__dict__.update(__loader__=loader, __annotations__={}, __builtins__=builtins)
            sys.modules["__main__"] = main
            exec(compile(args[1], "<string>", "exec"), main.__dict__)
    except SystemExit as exit:
        return _exit_status(exit.code)
    except BaseException as error:  # as the interpreter: the traceback (less this frame), status 1
        tb = error.__traceback__.tb_next if error.__traceback__ else None
        sys.excepthook(type(error), error.with_traceback(tb), tb)  # the hook shows error.__traceback__
        return 1
    return 0


def _child(request: dict[str, Any], requests: int, replies: int) -> NoReturn:
    status = 1
    try:
        os.close(requests)
        os.close(replies)
        for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
            opened = os.open(path, os.O_WRONLY | os.O_TRUNC)
            os.dup2(opened, fd)
            os.close(opened)
        limit = request["memory_limit"]
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        import tempfile

        tempfile.tempdir = None  # read from the new TMPDIR when first needed, as in a fresh process
        status = _run(request["args"])
        # The interpreter's finalization, in its order: wait for non-daemon threads, atexit, flush.
        threading._shutdown()  # type: ignore[attr-defined]
        atexit._run_exitfuncs()
    except BaseException as error:  # setting up the child failed: the test fails with this traceback
        sys.excepthook(type(error), error, error.__traceback__)
        status = status or 1
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(BaseException):  # as the interpreter: a failed flush is not fatal
                stream.flush()
        os._exit(status)


def _wait(pid: int, timeout: float) -> dict[str, Any]:
    pidfd = os.pidfd_open(pid)
    try:
        ready, _, _ = select.select([pidfd], [], [], timeout)
        timed_out = not ready
        if timed_out:
            os.kill(pid, signal.SIGKILL)  # not reaped yet: the pid is still this child's
    finally:
        os.close(pidfd)
    _, status = os.waitpid(pid, 0)
    return {"returncode": os.waitstatus_to_exitcode(status), "timed_out": timed_out}


def main() -> None:
    requests, replies = _start()
    _reply(replies, {"ready": True})
    with os.fdopen(requests, "rb", buffering=0) as reader:
        buffer = b""
        while True:
            while b"\n" not in buffer:
                chunk = reader.read(1 << 16)
                if not chunk:  # the test process closed the pipe (or died): stop
                    return
                buffer += chunk
            line, _, buffer = buffer.partition(b"\n")
            request = json.loads(line)
            if _threads() != 1:
                _fail(replies, f"the zygote has {_threads()} threads; it forks only with one")
            pid = os.fork()
            if pid == 0:
                _child(request, requests, replies)
            _reply(replies, _wait(pid, request["timeout"]))


if __name__ == "__main__":
    main()
