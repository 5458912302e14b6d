"""One tolerance rule for every place that compares model outputs with a reference.

The build (exported model against PyTorch), ``verify`` (packaged artifact against the build's
reference) and ``smoke`` (the live endpoint against it) all ask the same question, so they share
one answer and one wording; each caller raises its own typed error with the message.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

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


#: How far an endpoint's answer may be from the build's reference, by the precision the target
#: serves (``atol``, ``rtol``). The build's reference is the served graph itself on CPU, so the
#: only legitimate differences are the serving device's numerics: FP32 on a GPU (TF32 matmuls,
#: other kernels) moves values by about 1e-4..1e-3; FP16 weights/engines and dynamic INT8 by far
#: more. A wrong model, garbled bytes or a swapped output differ by orders of magnitude more.
SERVED_TOLERANCE: dict[str, tuple[float, float]] = {
    "fp32": (1e-3, 1e-3),
    "fp16": (2e-2, 2e-2),
    "int8": (5e-2, 5e-2),
}
#: Where the served precision is not recorded (token targets: their config carries none), the
#: loosest rule applies.
UNKNOWN_PRECISION_TOLERANCE: tuple[float, float] = (5e-2, 5e-2)
#: The key of a raw-text ensemble's ``config.pbtxt`` ``parameters`` that records the precision
#: served (Triton ignores an ensemble's parameters; smoke and verify read it).
SERVED_PRECISION_KEY = "served_precision"


def served_tolerance(precision: str | None) -> tuple[float, float]:
    """``(atol, rtol)`` for an answer served at ``precision`` (``None``: not recorded)."""
    if precision is None:
        return UNKNOWN_PRECISION_TOLERANCE
    if precision not in SERVED_TOLERANCE:
        raise ValueError(f"precision: got {precision!r}; allowed: " + ", ".join(SERVED_TOLERANCE))
    return SERVED_TOLERANCE[precision]


def config_served_precision(config: Any) -> str | None:
    """The precision a (parsed) ``config.pbtxt`` records under :data:`SERVED_PRECISION_KEY`, if any."""
    if SERVED_PRECISION_KEY not in config.parameters:
        return None
    value = config.parameters[SERVED_PRECISION_KEY].string_value
    return value if value in SERVED_TOLERANCE else None
