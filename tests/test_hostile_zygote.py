"""The hostile tests' fork server (``tests/hostile_zygote.py``) gives what a fresh interpreter gives:
the same exit status, output and traceback for the ways a run can end, the test's environment,
the memory limit, and a kill past the time bound. Each case runs both ways and is compared.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from hostile_helpers import run_bounded

#: name -> ``python`` arguments; each prints or raises what the comparison looks at.
CASES: dict[str, list[str]] = {
    "argv-and-path": ["-c", "import sys; print(sys.argv, repr(sys.path[0]), __name__, __spec__); sys.exit(3)", "a"],
    "exit-message": ["-c", "import sys; sys.exit('refused')"],
    "exit-256": ["-c", "raise SystemExit(256)"],
    "traceback": ["-c", "def f():\n    raise ValueError('x')\nf()"],
    "environment": ["-c", "import os, tempfile; print(os.environ.get('MODEL_BUILD_X'), "
                          "os.environ.get('AWS_ACCESS_KEY_ID'), tempfile.gettempdir())"],
    "memory-limit": ["-c", "import resource; print(resource.getrlimit(resource.RLIMIT_AS)); bytearray(2 << 30)"],
    "finalization": ["-c", "import atexit, threading, time; atexit.register(print, 'atexit');"
                           "threading.Thread(target=lambda: (time.sleep(0.2), print('thread'))).start()"],
    "cli-usage-error": ["-m", "model_build", "no-such-command"],
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_zygote_run_matches_a_fresh_interpreter(name: str, tmp_path: Path) -> None:
    env = {"MODEL_BUILD_X": "1", "AWS_ACCESS_KEY_ID": "testing", "TMPDIR": str(tmp_path)}
    fresh = run_bounded(CASES[name], env=env, fresh=True)
    forked = run_bounded(CASES[name], env=env)
    assert (forked.returncode, forked.stdout, forked.stderr) == (fresh.returncode, fresh.stdout, fresh.stderr)


def test_zygote_kills_a_run_past_its_bound() -> None:
    with pytest.raises(subprocess.TimeoutExpired):
        run_bounded(["-c", "import time; time.sleep(30)"], time_limit=0.3)
    assert run_bounded(["-c", "print('next')"]).stdout == "next\n", "the zygote serves the next run"
