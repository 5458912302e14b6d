"""The build state machine as synthesized, executed: its definition from the template (tokens
resolved as CloudFormation resolves them) run by moto's States Language interpreter, its Lambda
tasks answered by the real handlers behind moto's Invoke API, S3 in moto.

What runs for real: the definition, the interpreter (moto's, with AWS's semantics where
``tests/asl_moto.py`` says they differ), ``on_event`` starting the execution, ``build_step``
(plan, the per-model build with torch and ONNX Runtime, finish), ``is_complete`` reading the
outcome. What is simulated, and where: see ``tests/local_lambda.py`` and docs/architecture.md.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from asl_moto import STATE_PAYLOAD_LIMIT, payload_bytes, wait_for
from cfn_local import Resolver
from deploy_harness import (
    BUILD_STEP,
    PLACE_STEP,
    LocalAws,
    Templates,
    cfn_request,
    local_aws,
    scale_manifest,
    tiny_manifest,
)

from triton_mme_cdk.model_build import handler
from triton_mme_cdk.model_build.handler import build_steps
from triton_mme_cdk.model_build.release.index import read_index
from triton_mme_cdk.model_build.release.store import stored_keys

#: Slow: real builds through the executed state machine (make test runs it; make test-fast leaves it out).
pytestmark = pytest.mark.slow

#: Settings whose build state machine definitions differ from the default's (MaxConcurrency,
#: TimeoutSeconds and a Processing job's MaxRuntime are the only settings in it): the ebs variant (30 minutes) and a small Map.
VARIANTS: dict[str, dict[str, str]] = {
    "default": {},
    "ebs-timeout": {"build_total_timeout_minutes": "30", "build_query_interval_seconds": "30"},
    "small-map": {"build_max_concurrency": "3", "build_total_timeout_minutes": "5"},
}


@pytest.fixture(scope="module")
def templates(tmp_path_factory: pytest.TempPathFactory) -> Templates:
    return Templates(tmp_path_factory.mktemp("asl"))


@pytest.fixture
def aws(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Any:
    with local_aws(monkeypatch, tmp_path) as local:
        yield local


def _build(aws: LocalAws, deployment: Any, kind: str = "Create", *, old: dict[str, Any] | None = None,
           timeout_s: float = 120.0) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """``on_event`` as the provider framework calls it, the execution it starts run to its end;
    returns (request, on_event's answer, DescribeExecution)."""
    props = deployment.custom_resource_properties()
    physical = f"s3://{props['ModelBucket']}/models/served/"
    request = cfn_request(kind, props, physical_id=None if kind == "Create" else physical, old=old)
    started = handler.on_event(request)
    execution = started["Data"]["BuildExecutionArn"]
    return request, started, wait_for(deployment.states, execution, timeout_s)


def _history_payloads(states: Any, execution_arn: str) -> dict[str, int]:
    """Bytes of every state input and output in the execution's history, by event."""
    sizes: dict[str, int] = {}
    pages = states.get_execution_history(executionArn=execution_arn, maxResults=1000)["events"]
    for event in pages:
        for details in event.values():
            if isinstance(details, dict):
                for name in ("input", "output"):
                    if isinstance(details.get(name), str):
                        label = f"{event['type']}:{details.get('name', '')}:{name}"
                        sizes[label] = max(sizes.get(label, 0), payload_bytes(details[name]))
    return sizes


def _build_events(aws: LocalAws, step: str) -> list[Any]:
    """The state machine's task invocations of ``step``: ``finish`` on the placing function, the
    others on the build function."""
    return [call for call in aws.runtime.invocations(PLACE_STEP if step == "finish" else BUILD_STEP)
            if call.event.get("Step") == step]


def test_the_definitions_differ_only_in_the_settings_they_carry(templates: Templates) -> None:
    resolved = {}
    for name, settings in VARIANTS.items():
        template = templates.get(tiny_manifest(2), **settings)
        logical_id = template.one("AWS::StepFunctions::StateMachine", "ModelBuildBuildStateMachine")
        resolved[name] = json.loads(Resolver(template).resolve(
            template.resources[logical_id]["Properties"]["DefinitionString"]))
    def job_runtime(definition: dict[str, Any]) -> dict[str, Any]:
        (branch,) = definition["States"]["BuildModels"]["ItemProcessor"]["States"]["BuildOnProcessing"]["Branches"]
        return dict(branch["States"]["RunBuildJob"]["Parameters"]["StoppingCondition"])

    def outgrown(definition: dict[str, Any]) -> dict[str, Any]:
        return dict(definition["States"]["BuildModels"]["ItemProcessor"]["States"]["OutgrewLambda"]["Parameters"])

    carried = {name: (d["States"]["BuildModels"]["MaxConcurrency"], d["TimeoutSeconds"],
                      job_runtime(d)["MaxRuntimeInSeconds"], outgrown(d)["BudgetSeconds"]) for name, d in resolved.items()}
    # A Processing job's MaxRuntime is the total timeout unless set; OutgrewLambda's budget is the total timeout.
    assert carried == {"default": (50, 3000, 3000, 3000), "ebs-timeout": (50, 1800, 1800, 1800),
                       "small-map": (3, 300, 300, 300)}
    for definition in resolved.values():
        definition.pop("TimeoutSeconds")
        definition["States"]["BuildModels"]["ItemProcessor"]["States"]["OutgrewLambda"]["Parameters"].pop(
            "BudgetSeconds")
        definition["States"]["BuildModels"].pop("MaxConcurrency")
        (branch,) = definition["States"]["BuildModels"]["ItemProcessor"]["States"]["BuildOnProcessing"]["Branches"]
        branch["States"]["RunBuildJob"]["Parameters"].pop("StoppingCondition")
    assert resolved["ebs-timeout"] == resolved["default"] == resolved["small-map"]


@pytest.mark.parametrize(("variant", "units"), [("default", 8), ("ebs-timeout", 3)])
def test_a_full_build_of_many_units_runs_the_synthesized_definition(
    variant: str, units: int, templates: Templates, aws: LocalAws
) -> None:
    """Default settings with many units, and the variant whose timeout differs (the small Map's
    variant runs end to end in the concurrency test below)."""
    data = tiny_manifest(units)
    deployment = aws.deploy(templates.get(data, **VARIANTS[variant]))
    request, started, described = _build(aws, deployment)
    assert described["status"] == "SUCCEEDED", (described.get("error"), described.get("cause"))

    # One plan, one build per unit (none built twice), one finish.
    assert len(_build_events(aws, "plan")) == 1 and len(_build_events(aws, "finish")) == 1
    builds = _build_events(aws, "build")
    assert sorted(call.event["Model"] for call in builds) == [f"unit-{i:02d}" for i in range(units)]
    assert all(call.outcome == "ok" and call.result == {"Model": call.event["Model"], "Key": call.event["Key"],
                                                         "Built": True} for call in builds)
    props = request["ResourceProperties"]
    assert stored_keys(deployment.s3, props["ModelBucket"], "models") == {call.event["Key"] for call in builds}
    index = read_index(deployment.s3, props["ModelBucket"], f"models/_releases/{props['ReleaseId']}/_index.json")
    assert index is not None and len(index["models"]) == units + 1  # unit-00 has two copies

    # Every state's input and output, and every child execution's input, fits Step Functions.
    sizes = _history_payloads(deployment.states, started["Data"]["BuildExecutionArn"])
    assert sizes and max(sizes.values()) < STATE_PAYLOAD_LIMIT, sizes
    assert max(payload_bytes(call.event) for call in builds) < STATE_PAYLOAD_LIMIT

    # The Map ran at most MaxConcurrency units at once.
    limit = deployment.definition("ModelBuildBuildStateMachine")["States"]["BuildModels"]["MaxConcurrency"]
    assert 1 <= aws.runtime.peak_concurrency(BUILD_STEP) <= limit

    # is_complete finds the index and routes the release.
    done = handler.is_complete(dict(request, PhysicalResourceId=started["PhysicalResourceId"], Data=started["Data"]))
    assert done["IsComplete"] is True and done["Data"]["ModelCount"] == str(units + 1)


def test_an_incremental_build_builds_only_the_changed_unit(templates: Templates, aws: LocalAws) -> None:
    first = aws.deploy(templates.get(tiny_manifest(3)))
    request, started, described = _build(aws, first)
    assert described["status"] == "SUCCEEDED"
    handler.is_complete(dict(request, PhysicalResourceId=started["PhysicalResourceId"], Data=started["Data"]))
    aws.runtime.reset()

    # The next deploy: a new template (one entry changed), its asset published, an Update.
    second = first.update(templates.get(tiny_manifest(3, changed=2)))
    _, _, described = _build(aws, second, "Update", old=request["ResourceProperties"])
    assert described["status"] == "SUCCEEDED"
    assert [call.event["Model"] for call in _build_events(aws, "build")] == ["unit-02"]
    plan = _build_events(aws, "plan")[0].result
    assert plan["Count"] == 1


def test_a_failing_unit_fails_the_execution_with_its_reason_after_a_throttled_one_is_retried(
    templates: Templates, aws: LocalAws
) -> None:
    deployment = aws.deploy(templates.get(tiny_manifest(2, broken=("gone",))))
    # Lambda throttles unit-01's first invocation: the Retry on Lambda.TooManyRequestsException runs it again.
    aws.runtime.throttle(BUILD_STEP, lambda event: event.get("Model") == "unit-01", times=1)
    request, started, described = _build(aws, deployment)
    assert described["status"] == "FAILED"
    assert described["error"] == "States.ExceedToleratedFailureThreshold", described
    assert "1 of 3 items failed" in described["cause"]

    outcomes: dict[str, list[str]] = {}
    for call in _build_events(aws, "build"):
        outcomes.setdefault(call.event["Model"], []).append(call.outcome)
    assert outcomes["unit-01"] == ["throttled", "ok"], outcomes
    assert outcomes["gone"] == ["error"], "a model's own failure is not retried: it would fail again"
    assert 0 <= aws.waits.requested[0] <= 2.0, aws.waits.requested  # IntervalSeconds 2, full jitter
    assert not _build_events(aws, "finish"), "no release is assembled"

    with pytest.raises(handler.HandlerError) as caught:
        handler.is_complete(dict(request, PhysicalResourceId=started["PhysicalResourceId"], Data=started["Data"]))
    reason = str(caught.value)
    assert "model 'gone'" in reason and "no-such-source-gone" in reason and len(reason) <= 400, reason


def test_transient_lambda_errors_are_retried_six_times_then_the_execution_fails_with_the_error(
    templates: Templates, aws: LocalAws
) -> None:
    deployment = aws.deploy(templates.get(tiny_manifest(1)))
    aws.runtime.throttle(BUILD_STEP, lambda event: event.get("Step") == "plan", times=7)
    request, started, described = _build(aws, deployment)
    assert described["status"] == "FAILED" and described["error"] == "Lambda.TooManyRequestsException", described
    assert [call.outcome for call in _build_events(aws, "plan")] == ["throttled"] * 7
    # 2, 4, 8, 16, 32, 64 s, each with full jitter (a random wait of 0 up to the interval).
    assert len(aws.waits.requested) == 6
    assert all(0 <= wait <= 2.0 * 2**attempt for attempt, wait in enumerate(aws.waits.requested)), aws.waits.requested
    with pytest.raises(handler.HandlerError, match=r"Lambda\.TooManyRequestsException"):
        handler.is_complete(dict(request, PhysicalResourceId=started["PhysicalResourceId"], Data=started["Data"]))


def test_the_map_runs_max_concurrency_units_at_once_and_every_planned_item(
    templates: Templates, aws: LocalAws
) -> None:
    deployment = aws.deploy(templates.get(tiny_manifest(5), **VARIANTS["small-map"]))
    limit = deployment.definition("ModelBuildBuildStateMachine")["States"]["BuildModels"]["MaxConcurrency"]
    assert limit == 3
    release = aws.runtime.hold(BUILD_STEP, lambda event: event.get("Step") == "build")

    def open_when_the_map_stops_adding() -> None:
        last, stable_since = -1, time.monotonic()
        while time.monotonic() - stable_since < 1.0:
            now = aws.runtime.peak_concurrency(BUILD_STEP)
            if now != last:
                last, stable_since = now, time.monotonic()
            time.sleep(0.05)
        release.set()

    threading.Thread(target=open_when_the_map_stops_adding, daemon=True).start()
    _, _, described = _build(aws, deployment)
    assert described["status"] == "SUCCEEDED"
    assert aws.runtime.peak_concurrency(BUILD_STEP) == limit
    assert len(_build_events(aws, "build")) == _build_events(aws, "plan")[0].result["Count"] == 5


# ---------------------------------------------------------------------------------------------
# Several thousand models: every state stays under Step Functions' 256 KiB
# ---------------------------------------------------------------------------------------------

SCALE = 3000


def _stored_unit_stand_in(event: dict[str, Any], context: Any, real: Any) -> Any:
    """The build function with the per-model build and the assembly left out (3000 torch exports
    and copies do not fit a unit test): plan runs for real; a build answers what ``build_item``
    answers (the full-build test checks that document against the real handler's); finish
    answers what ``finish_release`` answers; an item's placing task is answered the same way
    (its output is discarded)."""
    if event["Step"] == "plan":
        return real(event, context)
    if event["Step"] == "build":
        return {"Model": event["Model"], "Key": event["Key"], "Built": True}
    request = build_steps.item_request(event)
    return request.data(SCALE)


def test_several_thousand_models_keep_every_state_under_the_payload_limit(
    templates: Templates, aws: LocalAws, tmp_path: Path
) -> None:
    manifest = scale_manifest(tmp_path / "models.yaml", SCALE)
    deployment = aws.deploy(templates.get(manifest))
    aws.runtime.stand_in(BUILD_STEP, _stored_unit_stand_in)
    aws.runtime.stand_in(PLACE_STEP, _stored_unit_stand_in)
    _, started, described = _build(aws, deployment, timeout_s=300)
    assert described["status"] == "SUCCEEDED", (described.get("error"), described.get("cause"))
    builds = _build_events(aws, "build")
    assert len(builds) == SCALE == _build_events(aws, "plan")[0].result["Count"]

    sizes = _history_payloads(deployment.states, started["Data"]["BuildExecutionArn"])
    assert max(sizes.values()) < 16 * 1024, sizes  # nothing in the parent grows with the manifest
    assert max(payload_bytes(call.event) for call in builds) < 16 * 1024


def test_a_map_whose_child_outputs_exceed_the_limit_fails_even_with_its_result_discarded(
    templates: Templates, aws: LocalAws
) -> None:
    """The rule the fix above relies on (and the interpreter's check of it can fail): the
    Distributed Map's collected child outputs count, whatever its ResultPath says."""
    template = templates.get(tiny_manifest(300))
    deployment = aws.deploy(template)
    definition = deployment.definition("ModelBuildBuildStateMachine")
    assert definition["States"]["BuildModels"]["ResultPath"] is None
    # The item's last state (its placing task) without the discard: child outputs kept, as before the fix.
    processor = definition["States"]["BuildModels"]["ItemProcessor"]["States"]["PlaceModel"]
    processor.pop("OutputPath", None)
    arn = deployment.states.create_state_machine(name="without-output-path", definition=json.dumps(definition),
                                                 roleArn="arn:aws:iam::123456789012:role/x")["stateMachineArn"]
    padding = "x" * 1000

    def big_outputs(event: dict[str, Any], context: Any, real: Any) -> Any:
        if event["Step"] in ("build", "place"):
            return {"Model": event["Model"], "Key": event["Key"], "Built": True, "Log": padding}
        return real(event, context) if event["Step"] == "plan" else {}

    aws.runtime.stand_in(BUILD_STEP, big_outputs)
    aws.runtime.stand_in(PLACE_STEP, big_outputs)
    props = deployment.custom_resource_properties()
    execution = deployment.states.start_execution(
        stateMachineArn=arn, input=json.dumps({"Request": {k: v for k, v in props.items() if k != "ServiceToken"}}))
    described = wait_for(deployment.states, execution["executionArn"], 120)
    assert described["status"] == "FAILED" and described["error"] == "States.DataLimitExceeded", described
    assert "BuildModels" in described["cause"]
