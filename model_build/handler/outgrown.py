"""The build state machine's ``OutgrewLambda`` step: a Map item whose build ran past the build
Lambda's timeout (``Sandbox.Timedout``) or whose runtime died (``Lambda.Unknown``: out of memory,
a signal; retried once before it gets here) is not a model's error but a limit it hit.

The item moves to SageMaker Processing (the same code on an instance without Lambda's 15 minutes
or 10,240 MB) when all of these hold; otherwise it fails naming the model, the limit (the
timeout's seconds or the memory's MB) and why it did not move:

- the stack has the Processing engine (``Processing`` in the event);
- the model is not pinned to the Lambda (``build.runs_on`` or ``mme:build_runs_on`` ``lambda``);
- the execution's budget left (``BudgetSeconds``, its ``TimeoutSeconds``, less the time since
  ``Started``, the parent execution's start) is at least what a job needs: the time the build
  already proved it needs (the Lambda's timeout, for a timeout), its estimate where known, and
  :data:`JOB_START_ALLOWANCE_S` for the instance's start. A budget that cannot be read is
  logged as unknown and does not stop the move: the execution's own timeout still bounds it.

This module decides; the step itself is ``build_steps.outgrew_lambda``, which writes the job's
input document under ``<prefix>/_jobs/`` (as the plan does for a model placed on Processing) and
returns the item's ``Job``; the state machine then runs the same Processing branch as for a model
the plan placed there.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from triton_mme_cdk.model_build.handler.request import LOG

#: Seconds this step allows for a Processing instance to start and pull the image before the
#: build runs (SageMaker publishes no start time: an allowance, not a measurement).
JOB_START_ALLOWANCE_S = 180
#: The error name of a timeout (Lambda's current runtimes); a ``Lambda.Unknown`` whose cause
#: says "Task timed out" is one too (Step Functions names every unhandled Lambda error so).
TIMED_OUT = "Sandbox.Timedout"


def where_it_goes(event: dict[str, Any], spec: Any, settings: Any, s3: Any) -> tuple[Any | None, str]:
    """``(the model's placement on Processing, what happened)``, or ``(None, the reason it fails)``
    naming the model, the limit and why it does not move; ``event`` is the step's
    (``Error``, ``Cause``, ``Started``, ``BudgetSeconds``, ``Processing``)."""
    error, cause = str(event.get("Error") or "?"), " ".join(str(event.get("Cause") or "").split())
    timed_out = error == TIMED_OUT or "timed out" in cause.lower()
    hit = (f"ran past the build Lambda's {settings.lambda_timeout_s} s timeout" if timed_out else
           f"was killed on the build Lambda twice, out of its {settings.lambda_memory_mb} MB of memory or ended by a "
           "signal")
    limit = f"model {spec.name!r}: its build {hit} ({error})"
    asked = spec.build.runs_on if spec.build and spec.build.runs_on else settings.runs_on
    placement = _on_processing(spec, s3, settings)
    needed = JOB_START_ALLOWANCE_S + max(settings.lambda_timeout_s if timed_out else 0,
                                         placement.estimate.seconds or 0)
    left = _budget_left(event)
    why_not = None
    if not event.get("Processing"):
        why_not = "this stack has no Processing engine"
    elif asked == "lambda":
        where = "build.runs_on" if spec.build and spec.build.runs_on else "mme:build_runs_on"
        why_not = (f"it is pinned to the Lambda ({where}: 'lambda'); set it to 'auto' or 'processing', or raise "
                   + ("mme:build_timeout_minutes" if timed_out else "mme:build_memory_mb"))
    elif left is not None and left < needed:
        why_not = (f"the build's budget has {left:.0f} s left of its {event.get('BudgetSeconds')} s, less than the "
                   f"{needed} s a Processing job needs here; raise mme:build_total_timeout_minutes")
    if why_not is not None:
        return None, f"{limit}; not moved to SageMaker Processing: {why_not}"[:400]
    return placement, (f"{limit}; moved to SageMaker Processing ({placement.label(settings)}; budget left "
                       f"{'unknown' if left is None else f'{left:.0f} s'})")


def _on_processing(spec: Any, s3: Any, settings: Any) -> Any:
    """The model's placement on Processing: its instance and volume as the plan would choose them."""
    from dataclasses import replace

    from triton_mme_cdk.model_build.handler.processing import s3_weight_bytes
    from triton_mme_cdk.model_build.manifest.build_engine import Placement, estimate

    weights, why = s3_weight_bytes(s3, spec)  # sized as the plan sizes it (an S3 source; others unknown)
    built = estimate(spec, weights, why)
    settings = replace(settings, runs_on="processing")
    instance = spec.build.instance_type if spec.build and spec.build.instance_type else settings.instance_type
    volume = spec.build.volume_gb if spec.build and spec.build.volume_gb else settings.volume_gb
    return Placement(spec.name, "processing", built, "processing", instance, volume)


def _budget_left(event: dict[str, Any]) -> float | None:
    """Seconds left of the execution's budget, or None when the event does not tell them."""
    try:
        started = datetime.fromisoformat(str(event["Started"]).replace("Z", "+00:00"))
        budget = float(event["BudgetSeconds"])
    except (KeyError, TypeError, ValueError):
        LOG.warning("outgrew_lambda: the execution's budget left is unknown (Started %r, BudgetSeconds %r)",
                    event.get("Started"), event.get("BudgetSeconds"))
        return None
    if started.tzinfo is None:
        started = started.replace(tzinfo=UTC)
    return budget - (datetime.now(UTC) - started).total_seconds()
