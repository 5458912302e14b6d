"""Running a tool on hostile input the way a user would: in a separate process, bounded in time and memory.

Shared by the ``test_hostile_*`` files. A refused input must end the process with status 1 and
exactly one ``error:`` line that names the offending file or field, with no traceback, before
any slow work: the process runs under an address-space limit (``RLIMIT_AS``) and a wall-clock
bound, so an input that made the tool expand or loop fails the test instead of the machine.

How a run is made. ``python app.py`` (synth: jsii starts node) and any run the zygote cannot
give (below) is a plain fresh subprocess; a corpus of app refusals runs all but one of its
entries in one process instead (:func:`run_app_refusals`, which says what its cases share). ``python -m model_build ...`` and ``python -c CODE ...``
are forked from a fork server, the *zygote* (``tests/hostile_zygote.py``): one long-lived
interpreter per test process, started at its first such run and stopped when the process exits
(``atexit``, and ``pytest_sessionfinish`` in conftest.py). It has imported what a fresh
``python -m model_build`` imports before it reads its arguments (``model_build.__main__``'s
imports; the module itself is not run) and nothing else of note. Each run is a forked child of
it: a separate process, under the same ``RLIMIT_AS`` (set in the child, as ``preexec_fn`` did)
and the same wall-clock bound (killed past ``time_limit * 3``), with the run's directory,
``os.environ`` (AWS_* removed, the test's variables added), ``sys.argv`` and ``sys.path[0]``,
fd 1 and 2 to files; it runs the module with ``runpy.run_module(..., alter_sys=True)`` or the code
in a fresh ``__main__``, and exits with the status the interpreter would (``SystemExit`` as Python
maps it; an uncaught exception's traceback through ``sys.excepthook`` and 1), after the
interpreter's finalization (non-daemon threads joined, ``atexit``, streams flushed).

What the runs share, so what these tests do not check per run: the interpreter's start (its
flags, ``site``, the locale, the hash seed: one per zygote, not per run) and the CLI's
module-level imports, done once (their module-level code does not run again per input, except
``model_build/__main__.py``'s own, which ``runpy`` runs each time). The check "refused before any
slow work" keeps its teeth: the zygote refuses to start (the tests fail with its reason) if that
import pulled in torch, transformers, onnx, onnxruntime, boto3 or aws_cdk, or printed anything;
what a run imports beyond it (boto3 for the handler, torch for a build) is imported in the child,
within its limits and its time. It is single-threaded when it forks (checked before each fork).
The first corpus entry of each hostile test still runs in a plain fresh subprocess
(``fresh=True``), so the real interpreter path stays covered.

A run goes to a plain subprocess instead when the zygote could not give it what a fresh
interpreter would: another directory than the repository root (``model_build`` is found through
``sys.path[0]``, the root), another module than ``model_build``, or an environment that differs
from the zygote's in a variable that is not read only when the code runs (see
:data:`_RUN_TIME_VARIABLES`: ``PYTHON*``, locale or thread-count variables are read at start).
"""

from __future__ import annotations

import atexit
import json
import os
import resource
import select
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
#: Address space a refusing CLI process may use. A bare `python -m model_build` needs about
#: 80 MB resident; 1 GiB of address space leaves room for the interpreter's mappings, and an
#: alias bomb or a whole-file read of a huge input would exceed it.
MEMORY_LIMIT_BYTES = 1 << 30
#: Address space of a refusing ``python app.py``: jsii starts node (V8 reserves address space
#: up front); a refusal measured well under this.
SYNTH_MEMORY_LIMIT_BYTES = 2 << 30
#: Wall-clock bound of one refused input to ``python -m model_build`` or the handler's runner.
#: Measured (2026-11-23, a 2-core machine at load 4-5): a refused ``validate`` used 0.7 s of CPU
#: (about its wall time on an idle core) and 2.0-3.6 s of wall time under that load; the handler
#: runner 1.3 s to import. The bound is about 3x the loaded wall time.
TIME_LIMIT_S = 10.0
#: Wall-clock bound of a refused ``python app.py``: jsii starts node before the app reads its
#: settings. Measured: 2.2-2.6 s of CPU, 9.8-10.4 s of wall time under the same load; 3x that.
SYNTH_TIME_LIMIT_S = 30.0


@dataclass(frozen=True)
class Outcome:
    returncode: int
    stdout: str
    stderr: str
    seconds: float


def _limit_memory(limit: int) -> Callable[[], None]:
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    return apply


#: Variables a run may set or change without a plain subprocess: nothing reads them at the
#: interpreter's start or in ``model_build.__main__``'s imports (names, or prefixes ending in "_").
#: ``PYTEST_CURRENT_TEST`` is pytest's own, changed at every test.
_RUN_TIME_VARIABLES = ("AWS_", "MODEL_BUILD_", "TMPDIR", "PYTEST_CURRENT_TEST")
_ZYGOTE_SOURCE = Path(__file__).with_name("hostile_zygote.py")
#: Seconds the zygote may take to import the CLI (about 0.5 s idle) or to answer past a run's
#: bound before the test process gives up on it.
_ZYGOTE_GRACE_S = 60.0


def _run_time(name: str) -> bool:
    return any(name.startswith(p) if p.endswith("_") else name == p for p in _RUN_TIME_VARIABLES)


def _start_time_env(env: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if not _run_time(k)}


class ZygoteError(RuntimeError):
    """The zygote refused to start or stopped answering: the tests cannot trust it."""


class _Zygote:
    """The test process's end of ``tests/hostile_zygote.py``."""

    def __init__(self, env: Mapping[str, str]) -> None:
        self.env = _start_time_env(env)
        self.folder = Path(tempfile.mkdtemp(prefix="hostile-zygote-"))
        self.log = self.folder / "zygote.log"
        self.owner = os.getpid()
        self.count = 0
        self.buffer = b""
        #: Why the zygote was stopped, once it was: each later run fails with it.
        self.failure: str | None = None
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-c", _ZYGOTE_SOURCE.read_text(encoding="utf-8")], cwd=ROOT, env=self.env,
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, bufsize=0,
            )
        reply = self._read(_ZYGOTE_GRACE_S)
        if reply != {"ready": True}:
            self.stop()
            raise ZygoteError(f"the hostile-input zygote did not start: {reply.get('error', reply)}")

    def _read(self, timeout: float) -> dict[str, object]:
        """One reply line; the zygote is stopped and :class:`ZygoteError` raised if none comes."""
        assert self.process.stdout is not None
        fd = self.process.stdout.fileno()
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buffer:
            left = deadline - time.monotonic()
            ready = select.select([fd], [], [], max(left, 0))[0] if left > 0 else []
            chunk = os.read(fd, 1 << 16) if ready else b""
            if not chunk:
                log = self.log.read_text(errors="replace")[-3000:]
                self.stop()
                self.failure = f"the hostile-input zygote {'timed out' if not ready else 'exited'}; its log:\n{log}"
                raise ZygoteError(self.failure)
            self.buffer += chunk
        line, _, self.buffer = self.buffer.partition(b"\n")
        reply: dict[str, object] = json.loads(line)
        return reply

    def run(self, args: Sequence[str], env: Mapping[str, str], memory_limit: int, time_limit: float) -> Outcome:
        assert self.process.stdin is not None
        if self.failure is not None:
            raise ZygoteError(self.failure)
        self.count += 1
        stdout, stderr = self.folder / f"{self.count}.out", self.folder / f"{self.count}.err"
        stdout.touch()
        stderr.touch()
        request = {"args": list(args), "env": dict(env), "cwd": str(ROOT), "memory_limit": memory_limit,
                   "timeout": time_limit * 3, "stdout": str(stdout), "stderr": str(stderr)}
        start = time.perf_counter()
        data = memoryview((json.dumps(request) + "\n").encode())
        while data:
            data = data[self.process.stdin.write(data) or 0:]
        reply = self._read(time_limit * 3 + _ZYGOTE_GRACE_S)
        seconds = time.perf_counter() - start
        if "error" in reply:
            self.stop()
            self.failure = f"the hostile-input zygote refused to fork: {reply['error']}"
            raise ZygoteError(self.failure)
        # Decoded as subprocess's text mode does: the locale's encoding, universal newlines.
        out, err = stdout.read_text(), stderr.read_text()
        stdout.unlink()
        stderr.unlink()
        if reply["timed_out"]:
            raise subprocess.TimeoutExpired([sys.executable, *args], time_limit * 3, output=out, stderr=err)
        returncode = reply["returncode"]
        assert isinstance(returncode, int), reply
        return Outcome(returncode, out, err, seconds)

    def stop(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()  # the zygote stops at the end of its input
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        if self.process.stdout is not None:
            self.process.stdout.close()
        shutil.rmtree(self.folder, ignore_errors=True)


_zygote: _Zygote | None = None


def stop_zygote() -> None:
    """Stops this process's zygote, if it started one (at exit, and at the end of pytest's session)."""
    global _zygote
    if _zygote is not None and _zygote.owner == os.getpid():
        _zygote.stop()
    _zygote = None


def _zygote_for(args: Sequence[str], env: Mapping[str, str], cwd: Path) -> _Zygote | None:
    """This process's zygote if it can make this run as a fresh interpreter would, else None."""
    global _zygote
    runnable = list(args[:2]) == ["-m", "model_build"] or (len(args) >= 2 and args[0] == "-c")
    if not runnable or Path(cwd).resolve() != ROOT:
        return None
    if _zygote is None or _zygote.owner != os.getpid():
        if _zygote is None:
            atexit.register(stop_zygote)
        _zygote = _Zygote(env)
    return _zygote if _start_time_env(env) == _zygote.env else None


def run_bounded(
    args: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    cwd: Path = ROOT,
    memory_limit: int = MEMORY_LIMIT_BYTES,
    time_limit: float = TIME_LIMIT_S,
    fresh: bool = False,
) -> Outcome:
    """Run ``python <args>`` under the memory limit; a run past ``time_limit * 3`` is killed (and fails:
    ``subprocess.TimeoutExpired``). Forked from the zygote where it can (see the module's docstring),
    else, or with ``fresh``, a plain fresh subprocess."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    full_env.update(env or {})
    zygote = None if fresh else _zygote_for(args, full_env, cwd)
    if zygote is not None:
        return zygote.run(args, full_env, memory_limit, time_limit)
    start = time.perf_counter()
    result = subprocess.run(
        [sys.executable, *args], cwd=cwd, env=full_env, capture_output=True, text=True,
        timeout=time_limit * 3, preexec_fn=_limit_memory(memory_limit),
    )
    return Outcome(result.returncode, result.stdout, result.stderr, time.perf_counter() - start)


def assert_refused(outcome: Outcome, *fragments: str, time_limit: float = TIME_LIMIT_S) -> str:
    """Exit status 1, one ``error:`` line holding every fragment, no traceback, within the bound."""
    assert outcome.returncode == 1, (outcome.returncode, outcome.stderr[-2000:])
    assert "Traceback" not in outcome.stderr + outcome.stdout, outcome.stderr[-2000:]
    errors = [line for line in outcome.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, outcome.stderr[-2000:]
    for fragment in fragments:
        assert fragment in errors[0], (fragment, errors[0])
    assert len(errors[0]) < 2000, "a refusal must be short, whatever the input's size"
    assert outcome.seconds < time_limit, f"took {outcome.seconds:.1f} s"
    return errors[0]


#: The app's refusals in one process (:func:`run_app_refusals`): ``app.main(context, outdir)`` once
#: per case (the context and output folder the CDK CLI would pass in ``CDK_CONTEXT_JSON`` and
#: ``CDK_OUTDIR``, which the app's node process reads only when it starts), fd 1 and 2 pointed at the
#: case's files (what the app and jsii's node print goes there, as in a fresh process), the
#: traceback of an uncaught exception written there too (status 1), one JSON line per case.
_APP_REFUSALS = """
import json, os, sys, time, traceback
sys.path.insert(0, os.getcwd())
cases = json.loads(sys.stdin.read())
import app
for case in cases:
    sys.stdout.flush(); sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    out = os.open(case["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    err = os.open(case["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(out, 1); os.dup2(err, 2)
    start = time.perf_counter()
    try:
        code = app.main(context=case["context"], outdir=case["outdir"])
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else 1
    except BaseException:
        traceback.print_exc()
        code = 1
    seconds = time.perf_counter() - start
    sys.stdout.flush(); sys.stderr.flush()
    os.dup2(saved[0], 1); os.dup2(saved[1], 2)
    for fd in (out, err, *saved):
        os.close(fd)
    print(json.dumps({"returncode": code, "seconds": seconds}), flush=True)
"""


def run_app_refusals(cases: Mapping[str, tuple[Mapping[str, object], Path]], folder: Path, *,
                     fresh: str) -> dict[str, Outcome]:
    """``python app.py`` on each case's context and output folder (what ``cdk synth -c ...`` passes),
    all in one process: the app's imports and jsii's node start once, not per case (about 1.5 s
    of CPU each).

    What this shares across cases, so what a test of it does not check per case: the interpreter,
    the imports, jsii's node process and the app's module-level code. Each case still runs
    ``app.main()`` with a new ``cdk.App`` on its own context (cdk.json's, then the case's, as the CLI
    merges them) and output folder, and is timed alone. The whole process runs under
    :data:`SYNTH_MEMORY_LIMIT_BYTES` of address space, so a case that made the app expand fails
    its test (and the ones after it). The case named ``fresh`` runs as a plain ``python app.py``
    instead (``run_bounded``, its context in ``CDK_CONTEXT_JSON`` and its folder in ``CDK_OUTDIR``):
    the fresh-interpreter path, context from the environment, stays covered."""
    folder.mkdir(parents=True, exist_ok=True)
    # The project's Node.js first, as `make` puts it (another node on PATH makes jsii print a
    # banner on stderr before the app's error).
    path = f"{ROOT / '.venv' / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"
    context, outdir = cases[fresh]
    alone = run_bounded(["app.py"], env={"CDK_OUTDIR": str(outdir), "CDK_CONTEXT_JSON": json.dumps(context),
                                         "PATH": path},
                        memory_limit=SYNTH_MEMORY_LIMIT_BYTES, time_limit=SYNTH_TIME_LIMIT_S)
    names = sorted(name for name in cases if name != fresh)
    requests: list[dict[str, Any]] = [
        {"context": dict(cases[name][0]), "outdir": str(cases[name][1]),
         "stdout": str(folder / f"{index}.out"), "stderr": str(folder / f"{index}.err")}
        for index, name in enumerate(names)]
    env = {**{k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "CDK_"))}, "PATH": path,
           "CDK_VALIDATION": os.environ.get("CDK_VALIDATION", "false")}  # tests/conftest.py
    result = subprocess.run(
        [sys.executable, "-c", _APP_REFUSALS], cwd=ROOT, env=env, input=json.dumps(requests), capture_output=True,
        text=True, timeout=SYNTH_TIME_LIMIT_S * 3 + 10 * len(names), preexec_fn=_limit_memory(SYNTH_MEMORY_LIMIT_BYTES),
    )
    replies = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    assert len(replies) == len(names), f"the app's refusals stopped after {len(replies)} of {len(names)}: {result.stderr[-3000:]}"
    outcomes = {name: Outcome(reply["returncode"], Path(request["stdout"]).read_text(),
                              Path(request["stderr"]).read_text(), reply["seconds"])
                for name, reply, request in zip(names, replies, requests, strict=True)}
    return {fresh: alone, **outcomes}
