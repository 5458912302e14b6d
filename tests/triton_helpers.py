"""The real ``tritonserver`` in tests: skipped, with the reason, where `make setup` did not install it."""

from __future__ import annotations

import pytest

from model_build.tools.triton_server import TritonEnvironment, TritonEnvironmentError


def _missing() -> str:
    try:
        TritonEnvironment.find()
    except TritonEnvironmentError as error:  # pragma: no cover - `make setup` installs it
        return str(error)
    return ""


MISSING = _missing()
requires_triton = pytest.mark.skipif(bool(MISSING), reason=MISSING or "tritonserver is installed")
