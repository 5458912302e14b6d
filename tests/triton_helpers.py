"""The real ``tritonserver`` in tests: a missing environment is a broken set-up, never a skip.

``make test`` runs ``make setup`` first, which installs ``.venv-triton``; a test module that needs
the server imports this module, and where the environment is missing its collection fails with
the reason and what to run (``make setup``), so no test passes by being skipped.
"""

from __future__ import annotations

import pytest

from model_build.tools.triton_server import TritonEnvironment, TritonEnvironmentError


def _missing() -> str:
    try:
        TritonEnvironment.find()
    except TritonEnvironmentError as error:
        return str(error)
    return ""


MISSING = _missing()
if MISSING:
    pytest.fail(f"the Triton test environment is missing: {MISSING}. Run `make setup` (make test does it first); "
                "these tests do not skip.", pytrace=False)

#: Kept for the modules that mark themselves with it: never skips (the check above ran at import).
requires_triton = pytest.mark.skipif(False, reason="the Triton environment is installed (checked at import)")
