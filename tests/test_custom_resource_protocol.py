"""The custom resource answers CloudFormation through the real response protocol.

Each request is sent as CloudFormation sends it: the request document, with a pre-signed HTTPS
response URL, invoked asynchronously on the resource's ``ServiceToken`` (the CDK provider
framework's onEvent function). From there everything is the deployed code: the provider
framework's own Node.js handlers (the staged asset of the synthesized stack, with the AWS SDK v3
that Lambda's Node.js runtime provides) invoke our handlers through moto's Lambda Invoke API and
start the waiter state machine (the template's definition, executed by moto's interpreter), whose
isComplete / onTimeout tasks answer with one HTTPS ``PUT`` to the response URL, served by
``tests/cfn_responses.py``. Retry waits of the waiter run scaled (their requested seconds are
recorded and counted as simulated time); see ``tests/asl_moto.py`` and docs/architecture.md.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import pytest
from cfn_local import REGION, LocalDeployment, Resolver, Template
from cfn_responses import RESPONSE_LIMIT, ResponseServer
from deploy_harness import (
    BUILD_STEP,
    IS_COMPLETE,
    ON_EVENT,
    LocalAws,
    Templates,
    cfn_request,
    local_aws,
    tiny_manifest,
)

PROVIDER_SDK = Path(__file__).resolve().parent / "provider_framework" / "node_modules"
ROUTE_PRELOAD = Path(__file__).resolve().parent / "provider_framework" / "route_response.js"
CREATE_FAILED = "AWSCDK::CustomResourceProviderFramework::CREATE_FAILED"
#: What one waiter attempt may take on Lambda (the framework's isComplete and our is_complete, a
#: cold start of the build image included), and the final answer (onTimeout and its PUT). The
#: waiter's attempts follow each other by its interval plus their own run time.
ATTEMPT_ALLOWANCE_S = 10.0
FINAL_ANSWER_S = 60.0
#: A short build budget (5 attempts a minute apart) for the timeout case; the default's 50
#: attempts are checked by arithmetic below, with the per-attempt time measured here.
SHORT = {"build_total_timeout_minutes": "5"}

#: Slow: real builds behind the provider framework's own handlers (make test-fast leaves it out).
pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    not (PROVIDER_SDK / "@aws-sdk" / "client-lambda").is_dir(),
    reason="the provider framework's AWS SDK is not installed: run `make setup` (npm ci in tests/provider_framework)",
)]


@pytest.fixture(scope="module")
def templates(tmp_path_factory: pytest.TempPathFactory) -> Templates:
    return Templates(tmp_path_factory.mktemp("protocol"))


@dataclass
class Cloud:
    """CloudFormation's side: the deployed stack's resources, the response URL, the executions."""

    aws: LocalAws
    deployment: LocalDeployment
    responses: ResponseServer
    lambda_client: Any

    def send(self, kind: str, properties: dict[str, Any], *, physical_id: str | None = None,
             old: dict[str, Any] | None = None, timeout_s: float = 90.0, settle: bool = True) -> dict[str, Any]:
        """Send one request as CloudFormation does (an asynchronous invoke of the ServiceToken),
        wait for its answer and for every execution it started to end; return the request, its
        answers and the simulated seconds until the first answer."""
        request = cfn_request(kind, properties, physical_id=physical_id, old=old)
        request["ResponseURL"] = self.responses.url(request["RequestId"])
        waits_before, started = len(self.aws.waits.requested), time.monotonic()
        self.lambda_client.invoke(FunctionName=properties["ServiceToken"], InvocationType="Event",
                                  Payload=json.dumps(request).encode())
        first = self.responses.wait(request["RequestId"], timeout_s)
        waited = sum(self.aws.waits.requested[waits_before:])
        if settle:
            self.settle(timeout_s)
        answers = self.responses.for_request(request["RequestId"])
        return {"request": request, "answers": answers, "answer": first.body,
                "seconds": (first.at - started) + waited}

    def settle(self, timeout_s: float) -> None:
        """Wait until no execution of either state machine runs, and a little longer."""
        states = self.deployment.states
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            running = [e for arn in self.deployment.state_machines.values()
                       for e in states.list_executions(stateMachineArn=arn)["executions"] if e["status"] == "RUNNING"]
            if not running:
                time.sleep(0.5)
                return
            time.sleep(0.1)
        raise TimeoutError("executions still running")


@pytest.fixture
def cloud(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Any]:
    from moto.server import ThreadedMotoServer

    with ResponseServer(tmp_path) as responses, local_aws(monkeypatch, tmp_path) as aws:
        server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        server.start()
        host, port = server.get_host_and_port()
        aws.runtime.node_environment.update({
            "AWS_ENDPOINT_URL": f"http://{host}:{port}", "AWS_REGION": REGION, "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing", "NODE_PATH": str(PROVIDER_SDK),
            "NODE_OPTIONS": f"--require {ROUTE_PRELOAD}", "NODE_EXTRA_CA_CERTS": str(responses.certificate),
            "TEST_RESPONSE_HOST": "localhost", "TEST_RESPONSE_PORT": str(responses.port),
        })

        def deploy(template: Template) -> Cloud:
            deployment = aws.deploy(template)
            return Cloud(aws, deployment, responses, boto3.client("lambda", region_name=REGION))

        try:
            yield deploy
        finally:
            server.stop()


def _served(cloud: Cloud, properties: dict[str, Any]) -> str:
    routes = cloud.deployment.s3.get_object(Bucket=properties["ModelBucket"], Key="models/_routes/routes.json")
    return str(json.loads(routes["Body"].read())["release_id"])


def _check_body(answer: dict[str, Any], request: dict[str, Any], raw: bytes) -> None:
    assert len(raw) <= RESPONSE_LIMIT, f"{len(raw)} bytes: CloudFormation takes at most {RESPONSE_LIMIT}"
    for field in ("StackId", "RequestId", "LogicalResourceId"):
        assert answer[field] == request[field], field
    assert answer["Status"] in ("SUCCESS", "FAILED")
    assert isinstance(answer["PhysicalResourceId"], str) and 0 < len(answer["PhysicalResourceId"]) <= 1024


def test_create_update_rollback_and_delete_each_answer_once(templates: Templates, cloud: Any) -> None:
    first = templates.get(tiny_manifest(2))
    stack = cloud(first)
    props_a = stack.deployment.custom_resource_properties()
    physical = f"s3://{props_a['ModelBucket']}/models/served/"

    created = stack.send("Create", props_a)
    assert len(created["answers"]) == 1, created["answers"]
    answer = created["answer"]
    _check_body(answer, created["request"], created["answers"][0].raw)
    assert answer["Status"] == "SUCCESS", answer.get("Reason")
    assert answer["PhysicalResourceId"] == physical
    assert set(answer["Data"]) == {"ModelDataUrl", "RoutesKey", "IndexKey", "ModelCount", "ReleaseId",
                                   "BuildExecutionArn"}
    assert answer["Data"]["ModelCount"] == "3" and _served(stack, props_a) == props_a["ReleaseId"]

    # The next deploy: one entry changed, the new template's properties, an Update.
    stack_b = Cloud(stack.aws, stack.deployment.update(templates.get(tiny_manifest(2, changed=1))),
                    stack.responses, stack.lambda_client)
    props_b = stack_b.deployment.custom_resource_properties()
    stack.aws.runtime.reset()
    updated = stack_b.send("Update", props_b, physical_id=physical, old=props_a)
    assert len(updated["answers"]) == 1 and updated["answer"]["Status"] == "SUCCESS", updated["answer"]
    assert updated["answer"]["PhysicalResourceId"] == physical, "an update never replaces the served prefix"
    assert [c.event["Model"] for c in stack.aws.runtime.invocations(BUILD_STEP) if c.event.get("Step") == "build"] \
        == ["unit-01"]
    assert _served(stack, props_b) == props_b["ReleaseId"]

    # CloudFormation's rollback of that update: the old properties again; nothing is built.
    stack.aws.runtime.reset()
    rolled = stack_b.send("Update", props_a, physical_id=physical, old=props_b)
    assert len(rolled["answers"]) == 1 and rolled["answer"]["Status"] == "SUCCESS", rolled["answer"]
    assert "BuildExecutionArn" not in rolled["answer"]["Data"], "the release index exists: no build starts"
    assert not stack.aws.runtime.invocations(BUILD_STEP)
    assert _served(stack, props_a) == props_a["ReleaseId"]

    deleted = stack_b.send("Delete", props_a, physical_id=physical)
    assert len(deleted["answers"]) == 1 and deleted["answer"]["Status"] == "SUCCESS", deleted["answer"]
    assert deleted["answer"]["PhysicalResourceId"] == physical
    for sent in (created, updated, rolled, deleted):
        assert sent["seconds"] < float(props_a["ServiceTimeout"])


def test_every_failure_answers_once_with_a_short_reason(templates: Templates, cloud: Any) -> None:
    stack = cloud(templates.get(tiny_manifest(1, broken=("gone",))))
    props = stack.deployment.custom_resource_properties()

    # A model that cannot build: the build state machine fails, is_complete names the model.
    failed = stack.send("Create", props)
    assert len(failed["answers"]) == 1
    answer = failed["answer"]
    _check_body(answer, failed["request"], failed["answers"][0].raw)
    assert answer["Status"] == "FAILED" and "model 'gone'" in answer["Reason"], answer
    assert answer["PhysicalResourceId"] == f"s3://{props['ModelBucket']}/models/served/"

    # on_event refuses the request (the asset and the template disagree): the framework answers
    # FAILED with its marker id, and answers CloudFormation's Delete of that marker at once.
    refused = stack.send("Create", dict(props, ManifestSha256="0" * 64))
    assert len(refused["answers"]) == 1
    assert refused["answer"]["Status"] == "FAILED" and "does not match property ManifestSha256" in refused["answer"]["Reason"]
    assert refused["answer"]["PhysicalResourceId"] == CREATE_FAILED
    _check_body(refused["answer"], refused["request"], refused["answers"][0].raw)
    cleanup = stack.send("Delete", props, physical_id=CREATE_FAILED)
    assert len(cleanup["answers"]) == 1 and cleanup["answer"]["Status"] == "SUCCESS"

    # is_complete fails while the build runs (the manifest asset disappeared): still one answer.
    stack.aws.runtime.reset()
    release = stack.aws.runtime.hold(BUILD_STEP, lambda event: event.get("Step") == "plan")
    vanished = dict(props, ManifestKey="gone-later.yaml")
    body = stack.deployment.s3.get_object(Bucket=props["ManifestBucket"], Key=props["ManifestKey"])["Body"].read()
    stack.deployment.s3.put_object(Bucket=props["ManifestBucket"], Key="gone-later.yaml", Body=body)

    def delete_then_release(event: dict[str, Any], context: Any, real: Any) -> Any:
        stack.deployment.s3.delete_object(Bucket=props["ManifestBucket"], Key="gone-later.yaml")
        release.set()
        return real(event, context)

    stack.aws.runtime.stand_in(IS_COMPLETE, delete_then_release)
    lost = stack.send("Create", vanished)
    assert len(lost["answers"]) == 1
    assert lost["answer"]["Status"] == "FAILED" and "NoSuchKey" in lost["answer"]["Reason"], lost["answer"]
    _check_body(lost["answer"], lost["request"], lost["answers"][0].raw)


def test_a_build_longer_than_the_budget_answers_failed_once_before_cloudformation_gives_up(
    templates: Templates, cloud: Any
) -> None:
    stack = cloud(templates.get(tiny_manifest(1), **SHORT))
    props = stack.deployment.custom_resource_properties()
    waiter = stack.deployment.definition("ModelBuildProviderwaiterstatemachine")
    retry = waiter["States"]["framework-isComplete-task"]["Retry"][0]
    release = stack.aws.runtime.hold(BUILD_STEP, lambda event: event.get("Step") == "build")
    try:
        timed_out = stack.send("Create", props, timeout_s=120, settle=False)
    finally:
        release.set()
    stack.settle(60)  # the build ends after CloudFormation was answered: no second answer
    answers = stack.responses.for_request(timed_out["request"]["RequestId"])
    assert len(answers) == 1, [a.body for a in answers]
    assert timed_out["answer"]["Status"] == "FAILED" and timed_out["answer"]["Reason"] == "Operation timed out"
    _check_body(timed_out["answer"], timed_out["request"], answers[0].raw)
    attempts = [c for c in stack.aws.runtime.invocations(IS_COMPLETE)]
    assert len(attempts) == retry["MaxAttempts"] + 1, "the first attempt and every retry"
    assert timed_out["seconds"] >= retry["IntervalSeconds"] * retry["MaxAttempts"]
    assert timed_out["seconds"] < float(props["ServiceTimeout"]), "answered before CloudFormation stops waiting"


def test_the_waiter_of_every_variant_answers_before_cloudformation_stops_waiting(templates: Templates) -> None:
    """The waiter polls ``MaxAttempts`` times after its first attempt, ``IntervalSeconds`` apart
    plus each attempt's own run; its last answer (onTimeout's FAILED) must reach CloudFormation
    within the custom resource's ``ServiceTimeout``, or CloudFormation fails the resource with
    no reason from us and a late SUCCESS is lost."""
    from cdk_helpers import VARIANTS

    for name in ("default", "ebs"):
        settings = {k: v for k, v in VARIANTS[name].items() if k.startswith("build_")}
        template = templates.get(tiny_manifest(1), **settings)
        resolver = Resolver(template)
        logical_id = template.one("AWS::StepFunctions::StateMachine", "ModelBuildProviderwaiterstatemachine")
        waiter = json.loads(resolver.resolve(template.resources[logical_id]["Properties"]["DefinitionString"]))
        retry = waiter["States"]["framework-isComplete-task"]["Retry"][0]
        assert retry["BackoffRate"] == 1
        resource = template.one("Custom::TritonModelRelease", "ModelBuild")
        service_timeout = float(template.resources[resource]["Properties"]["ServiceTimeout"])
        last_answer = (retry["IntervalSeconds"] * retry["MaxAttempts"]
                       + ATTEMPT_ALLOWANCE_S * (retry["MaxAttempts"] + 1) + FINAL_ANSWER_S)
        assert last_answer <= service_timeout, (
            f"{name}: the waiter's last answer comes {last_answer:.0f} s after the request "
            f"({retry['MaxAttempts']} retries {retry['IntervalSeconds']} s apart); CloudFormation stops "
            f"waiting at {service_timeout:.0f} s")


def test_only_the_provider_frameworks_roles_may_invoke_the_handlers(templates: Templates) -> None:
    """No resource policy, function URL or other role of the template lets anyone else invoke
    on_event or is_complete: the framework's two roles hold the only grants. (Lambda has no
    resource policy that denies: a principal of the account whose own policy allows
    lambda:InvokeFunction can still call them, which is why each event is also checked against
    CloudFormation: tests/test_forged_events.py.)"""
    template = templates.get(tiny_manifest(2))
    resources = template.resources
    handlers = {logical_id for logical_id, resource in resources.items()
                if resource["Type"] == "AWS::Lambda::Function"
                and resource["Properties"].get("ImageConfig", {}).get("Command") in ([ON_EVENT], [IS_COMPLETE])}
    assert len(handlers) == 2, handlers
    named = {logical_id: resource for logical_id, resource in resources.items()
             if resource["Type"] in ("AWS::Lambda::Permission", "AWS::Lambda::Url")
             and set(json.dumps(resource["Properties"]).split('"')) & handlers}
    assert named == {}, "a resource policy or URL of a handler"
    invokers = set()
    for resource in resources.values():
        if resource["Type"] != "AWS::IAM::Policy":
            continue
        for statement in resource["Properties"]["PolicyDocument"]["Statement"]:
            actions = statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
            if any(a in ("lambda:InvokeFunction", "lambda:*", "*") for a in actions) and \
                    set(json.dumps(statement["Resource"]).split('"')) & handlers:
                invokers |= {role["Ref"] for role in resource["Properties"]["Roles"]}
    assert {resources[role]["Properties"]["Description"] for role in invokers} == {
        "CDK provider framework of the model release custom resource"}, invokers
    assert len(invokers) == 2
