"""What ``make gpu-check`` measures of each row: latency percentiles, parity against PyTorch FP32,
and whether a variant's answers are within the gates of its precision.

Shared by the in-process rows (:mod:`benchmarks.gpu_check`) and the served ones
(:mod:`benchmarks.gpu_served`); it imports neither.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

#: Warm iterations per batch size (after 5 unmeasured ones); p99 of 100 is its second-largest.
ITERATIONS = int(__import__("os").environ.get("GPU_CHECK_ITERATIONS", "100"))


def percentiles(samples: Sequence[float]) -> dict[str, float]:
    """p50 and p99 in milliseconds of ``samples`` (seconds), by the nearest-rank rule."""
    ordered = sorted(samples)
    rank = max(0, min(len(ordered) - 1, round(0.99 * len(ordered)) - 1))
    return {"p50_ms": round(statistics.median(ordered) * 1000, 3), "p99_ms": round(ordered[rank] * 1000, 3)}


def parity(candidate: Any, reference: Any) -> dict[str, float]:
    """Lowest cosine of any row and largest absolute difference, ``candidate`` against ``reference``."""
    import numpy as np

    a = np.asarray(candidate, dtype=np.float64).reshape(len(candidate), -1)
    b = np.asarray(reference, dtype=np.float64).reshape(len(reference), -1)
    cosine = (a * b).sum(axis=1) / np.maximum(np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1), 1e-30)
    return {
        "min_cosine": round(float(cosine.min()), 7),
        "max_abs_diff": float(f"{float(np.abs(a - b).max()):.3e}"),
    }


def judge(outputs: Any, reference: Any, variant: str) -> dict[str, Any]:
    """Whether a variant's answers on the GPU are within what the fleet accepts of its precision
    (``fp16`` in the variant's name: FP16, else FP32): the smoke test's tolerance for an answer
    served at that precision (:func:`model_build.compare.served_tolerance`) and the build's lowest
    cosine (:data:`model_build.manifest.fields.DEFAULT_GATES`), against PyTorch FP32 on the GPU."""
    import numpy as np

    from triton_mme_cdk.model_build.compare import compare_arrays, served_tolerance
    from triton_mme_cdk.model_build.manifest.fields import DEFAULT_GATES

    precision = "fp16" if "fp16" in variant else "fp32"
    atol, rtol = served_tolerance(precision)
    lowest = DEFAULT_GATES[precision][0]
    problems = []
    comparison = compare_arrays("output", np.asarray(outputs), np.asarray(reference), atol=atol, rtol=rtol)
    if comparison.problem:
        problems.append(comparison.problem)
    cosine = parity(outputs, reference)["min_cosine"]
    if cosine < lowest:
        problems.append(f"min cosine {cosine} is below the {precision} gate {lowest}")
    return {"precision": precision, "atol": atol, "rtol": rtol, "min_cosine": lowest, "passed": not problems,
            "problem": "; ".join(problems) or None}


def outside_gates(result: dict[str, Any]) -> list[str]:
    """One line per measured row whose answers are outside its precision's gates."""
    return [f"{row['model']} {row['variant']} ({row['runtime']}): {row['gate']['problem']}"
            for row in result["rows"] if row.get("gate") and not row["gate"]["passed"]]
