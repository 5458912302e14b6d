"""Running a tool on hostile input the way a user would: in a subprocess, bounded in time and memory.

Shared by the ``test_hostile_*`` files. A refused input must end the process with status 1 and
exactly one ``error:`` line that names the offending file or field, with no traceback, before
any slow work: the process runs under an address-space limit (``RLIMIT_AS``) and a wall-clock
bound, so an input that made the tool expand or loop fails the test instead of the machine.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

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


def run_bounded(
    args: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    cwd: Path = ROOT,
    memory_limit: int = MEMORY_LIMIT_BYTES,
    time_limit: float = TIME_LIMIT_S,
) -> Outcome:
    """Run ``python <args>`` under the memory limit; a run past ``time_limit`` is killed (and fails)."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    full_env.update(env or {})
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
