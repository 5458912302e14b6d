"""One tolerance rule for every place that compares model outputs with a reference.

The build (exported model against PyTorch), ``verify`` (packaged artifact against the build's
reference) and ``smoke`` (the live endpoint against it) all ask the same question, so they share
one answer and one wording; each caller raises its own typed error with the message.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Comparison:
    """The largest ``|actual - expected|`` and, when the rule is broken, why (else ``None``)."""

    max_abs_diff: float
    problem: str | None = None
    #: The tolerance at the worst element (``atol + rtol * |expected|``), when one was exceeded.
    allowed: float | None = None

    @property
    def ok(self) -> bool:
        return self.problem is None


def compare_arrays(name: str, actual: np.ndarray, expected: np.ndarray, *, atol: float, rtol: float) -> Comparison:
    """Check ``|a - b| <= atol + rtol * |b|`` everywhere, and that every value is finite.

    Non-finite values fail whatever the tolerance: NaN compares false with everything, so an
    ``allclose``-style check could pass an output that is all NaN. String (BYTES) tensors must
    be equal.
    """
    if actual.shape != expected.shape:
        return Comparison(
            math.inf, f"output {name!r}: shape {list(actual.shape)}; the reference has {list(expected.shape)}"
        )
    if actual.dtype == np.object_ or expected.dtype == np.object_:
        same = bool(np.array_equal(actual, expected))
        return Comparison(0.0 if same else math.inf, None if same else f"output {name!r}: bytes differ from the reference")
    a = np.asarray(actual, dtype=np.float64)
    b = np.asarray(expected, dtype=np.float64)
    for values, where in ((a, "output"), (b, "reference")):
        bad = int(np.count_nonzero(~np.isfinite(values)))
        if bad:
            return Comparison(
                math.inf,
                f"output {name!r}: {bad} non-finite value(s) (nan or inf) of {values.size} in the "
                f"{where}; every value must be finite",
            )
    if a.size == 0:
        return Comparison(0.0)
    diff = np.abs(a - b)
    allowed = atol + rtol * np.abs(b)
    largest = float(diff.max())
    excess = diff - allowed
    if float(excess.max()) <= 0:
        return Comparison(largest)
    at = tuple(int(i) for i in np.unravel_index(int(np.argmax(excess)), diff.shape))
    return Comparison(
        largest,
        f"output {name!r}: largest |difference| {largest:.3g} exceeds the tolerance; at index "
        f"{list(at)} got {a[at]:.6g}, reference {b[at]:.6g}; allowed |a - b| <= atol {atol:g} + "
        f"rtol {rtol:g} * |reference| = {float(allowed[at]):.3g}",
        float(allowed[at]),
    )
