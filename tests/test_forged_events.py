"""Custom-resource events the handlers refuse because CloudFormation did not send them
(``model_build.handler.stack_check``), and the retention floor built into the function.

Everything runs against moto's server on loopback: CloudFormation (a stack created from a template
that holds a ``Custom::TritonModelRelease``, which moto keeps in CREATE_IN_PROGRESS until the
resource answers: the state in which CloudFormation really sends a Create), Lambda (the handler's
function and its tags) and S3 (the model bucket the stack created, the manifest asset). moto does
not tag a stack's Lambda functions with ``aws:cloudformation:stack-id`` as CloudFormation does, so
each test tags the handler's function itself. Nor can moto's API put a stack in
UPDATE_ROLLBACK_IN_PROGRESS: the rollback rule's test sets that status in moto's backend (served from
this process), and the handlers read it through the API as they would CloudFormation's.
"""

from __future__ import annotations

import contextlib
import io
import json
import uuid
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import boto3
import pytest
import yaml

from triton_mme_cdk.model_build import handler
from triton_mme_cdk.model_build.handler.request import MIN_RETENTION_DAYS, Request
from triton_mme_cdk.model_build.manifest import parse_manifest
from triton_mme_cdk.model_build.release import compute_release

REGION, ACCOUNT = "us-east-1", "123456789012"
ASSETS = f"assets-{ACCOUNT}-{REGION}"
TINY = {"kind": "synthetic", "architecture": "resnet", "config": {
    "embedding_size": 8, "hidden_sizes": [8, 8, 8, 8], "depths": [1, 1, 1, 1], "layer_type": "basic", "num_labels": 4}}


def manifest(seed: int) -> dict[str, Any]:
    return {"version": 1, "models": [{"name": "tiny", "source": dict(TINY, seed=seed), "task": "image-classification",
                                      "max_batch_size": 2, "image": {"image_size": 32, "channels": 3}}]}


@dataclass
class Moto:
    url: str

    def client(self, service: str) -> Any:
        return boto3.client(service, endpoint_url=self.url, region_name=REGION,
                            aws_access_key_id="testing", aws_secret_access_key="testing")


@pytest.fixture(scope="module")
def moto() -> Iterator[Moto]:
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield Moto(f"http://{host}:{port}")
    server.stop()


@pytest.fixture(autouse=True)
def env(moto: Moto, monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    for name in ("MODEL_BUILD_S3_ENDPOINT_URL", "MODEL_BUILD_CLOUDFORMATION_ENDPOINT_URL", "MODEL_BUILD_LAMBDA_ENDPOINT_URL"):
        monkeypatch.setenv(name, moto.url)
    for name, value in (("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing"),
                        ("AWS_DEFAULT_REGION", REGION), ("TMPDIR", str(tmp_path))):
        monkeypatch.setenv(name, value)


class Context:
    """What the handlers read of the Lambda context: the function's ARN and the time left."""

    def __init__(self, arn: str) -> None:
        self.invoked_function_arn = arn

    def get_remaining_time_in_millis(self) -> int:
        return 900_000


@dataclass
class Stack:
    moto: Moto
    stack_id: str
    function_arn: str
    props: dict[str, str]
    bucket: str

    def event(self, kind: str, props: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
        """A request as CloudFormation sends it through the provider framework (``props``: other properties)."""
        document = {"RequestType": kind, "ServiceToken": self.props["ServiceToken"], "StackId": self.stack_id,
                    "ResponseURL": "https://localhost/response", "RequestId": str(uuid.uuid4()),
                    "LogicalResourceId": "ModelRelease", "ResourceType": "Custom::TritonModelRelease",
                    "ResourceProperties": dict(self.props if props is None else props)}
        if kind != "Create":
            document["PhysicalResourceId"] = f"s3://{self.bucket}/models/served/"
        document.update(extra)
        return document

    @property
    def context(self) -> Context:
        return Context(f"{self.function_arn}:$LATEST")

    def keys(self) -> dict[str, str]:
        pages = self.moto.client("s3").get_paginator("list_objects_v2").paginate(Bucket=self.bucket)
        return {o["Key"]: o["ETag"] for page in pages for o in page.get("Contents", [])}


def make_stack(moto: Moto, name: str, seed: int = 0) -> Stack:
    """A stack whose template holds the model release resource, its model bucket and (created
    outside it, as CDK's provider framework is to the resource) the function behind the token."""
    iam, lambda_, s3 = moto.client("iam"), moto.client("lambda"), moto.client("s3")
    with contextlib.suppress(iam.exceptions.EntityAlreadyExistsException):
        iam.create_role(RoleName="handlers", AssumeRolePolicyDocument="{}")
    code = io.BytesIO()
    with zipfile.ZipFile(code, "w") as archive:
        archive.writestr("index.py", "def handler(event, context):\n    return {}\n")
    arns = {}
    for function in (f"{name}-provider", f"{name}-is-complete"):
        arns[function] = lambda_.create_function(
            FunctionName=function, Runtime="python3.11", Role=f"arn:aws:iam::{ACCOUNT}:role/handlers",
            Handler="index.handler", Code={"ZipFile": code.getvalue()})["FunctionArn"]
    with contextlib.suppress(s3.exceptions.BucketAlreadyOwnedByYou):
        s3.create_bucket(Bucket=ASSETS)
    data = manifest(seed)
    s3.put_object(Bucket=ASSETS, Key=f"{name}.yaml", Body=yaml.safe_dump(data).encode())
    release = compute_release(parse_manifest(data))
    literal = {"ManifestKey": f"{name}.yaml", "ManifestSha256": release.manifest_sha256, "ModelPrefix": "models",
               "ReleaseId": release.release_id, "CodeSha256": release.code_sha256, "OnDelete": "retain",
               "RetiredTagKey": "triton-mme:release-state", "RetentionDays": "7"}
    template = {"Resources": {
        "Models": {"Type": "AWS::S3::Bucket"},
        "ModelRelease": {"Type": "Custom::TritonModelRelease", "Properties": {
            "ServiceToken": arns[f"{name}-provider"], "ServiceTimeout": 3600, "ModelBucket": {"Ref": "Models"},
            "ManifestBucket": {"Fn::Sub": "assets-${AWS::AccountId}-${AWS::Region}"}, **literal}},
    }}
    cloudformation = moto.client("cloudformation")
    stack_id = cloudformation.create_stack(StackName=name, TemplateBody=json.dumps(template))["StackId"]
    bucket = cloudformation.describe_stack_resource(StackName=stack_id, LogicalResourceId="Models")[
        "StackResourceDetail"]["PhysicalResourceId"]
    function_arn = arns[f"{name}-is-complete"]
    lambda_.tag_resource(Resource=function_arn, Tags={"aws:cloudformation:stack-id": stack_id})  # as CloudFormation does
    props = {"ServiceToken": arns[f"{name}-provider"], "ModelBucket": bucket, "ManifestBucket": ASSETS, **literal}
    assert cloudformation.describe_stacks(StackName=stack_id)["Stacks"][0]["StackStatus"] == "CREATE_IN_PROGRESS"
    return Stack(moto, stack_id, function_arn, props, bucket)


def refused(call: Any, *fragments: str) -> str:
    with pytest.raises(handler.HandlerError) as caught:
        call()
    message = str(caught.value)
    for fragment in fragments:
        assert fragment in message, message
    assert "\n" not in message
    return message


def test_cloudformations_own_request_is_served_and_routes_its_release(moto: Moto) -> None:
    """The check lets CloudFormation's own request through: a Create with the template's
    properties, while the stack is being created, builds and routes the release."""
    stack = make_stack(moto, "served")
    assert handler.on_event(stack.event("Create"), stack.context)["PhysicalResourceId"] == f"s3://{stack.bucket}/models/served/"
    done = handler.is_complete(stack.event("Create", PhysicalResourceId=f"s3://{stack.bucket}/models/served/"),
                               stack.context)
    assert done["IsComplete"] is True and done["Data"]["ReleaseId"] == stack.props["ReleaseId"]
    routes = json.loads(moto.client("s3").get_object(Bucket=stack.bucket, Key="models/_routes/routes.json")["Body"].read())
    assert routes["release_id"] == stack.props["ReleaseId"]


def test_a_routes_write_for_a_release_the_template_did_not_name_is_refused(moto: Moto) -> None:
    """An old ReleaseId sent to IsComplete by anyone who may invoke it: one line naming both
    releases, and the bucket exactly as it was (nothing routed, nothing deleted)."""
    stack = make_stack(moto, "old-release")
    old = compute_release(parse_manifest(manifest(seed=5)))
    forged = dict(stack.props, ReleaseId=old.release_id, ManifestSha256=old.manifest_sha256)
    before = stack.keys()
    refused(lambda: handler.is_complete(stack.event("Create", forged), stack.context),
            f"release '{old.release_id}'", f"release '{stack.props['ReleaseId']}'", "nothing is routed or deleted")
    refused(lambda: handler.on_event(stack.event("Create", forged), stack.context), old.release_id)
    # An Update while the stack is being created: not a request CloudFormation sends then.
    refused(lambda: handler.is_complete(stack.event("Update", forged), stack.context), "is CREATE_IN_PROGRESS")
    assert stack.keys() == before


def test_retention_days_zero_in_an_event_is_refused_and_floored(moto: Moto) -> None:
    stack = make_stack(moto, "retention")
    refused(lambda: handler.is_complete(stack.event("Create", dict(stack.props, RetentionDays="0")), stack.context),
            "property RetentionDays", "'0'", "'7'")
    # Whatever the event says, the function keeps an unrouted object at least a day.
    request = Request({"RequestType": "Create", "ResourceProperties": dict(stack.props, RetentionDays="0")})
    assert request.retention_days == MIN_RETENTION_DAYS == 1.0


@pytest.mark.parametrize("change", ["stack", "resource", "extra property", "bucket", "service timeout"])
def test_an_event_that_is_not_the_templates_is_refused(moto: Moto, change: str) -> None:
    stack = make_stack(moto, f"forged-{change.replace(' ', '-')}")
    other = f"arn:aws:cloudformation:{REGION}:{ACCOUNT}:stack/Other/0000"
    event, fragments = {
        "stack": (stack.event("Create", StackId=other), ("event StackId", "Other", stack.stack_id)),
        "resource": (stack.event("Create", LogicalResourceId="Models"), ("LogicalResourceId", "'Models'")),
        "extra property": (stack.event("Create", dict(stack.props, BuildEngine={"RunsOn": "lambda"})),
                           ("property BuildEngine", "no BuildEngine")),
        "bucket": (stack.event("Create", dict(stack.props, ModelBucket="someone-elses")),
                   ("property ModelBucket", "'someone-elses'", stack.bucket)),
        # CloudFormation's own property need not be sent; sent, it must be the template's.
        "service timeout": (stack.event("Create", dict(stack.props, ServiceTimeout="60")),
                            ("property ServiceTimeout", "'60'", "'3600'")),
    }[change]
    refused(lambda: handler.on_event(event, stack.context), *fragments)
    refused(lambda: handler.is_complete(event, stack.context), *fragments)


def test_a_request_when_no_operation_runs_is_refused(moto: Moto) -> None:
    """A stack no operation runs on (created, CREATE_COMPLETE): even properties like the
    template's are refused, since CloudFormation sends nothing then. (moto completes a stack
    whose resources are all its own at once; its custom resources wait for an answer that moto
    takes only from inside Docker, so this stack holds the bucket alone: the status is read first.)"""
    stack = make_stack(moto, "completed")
    cloudformation = moto.client("cloudformation")
    done = cloudformation.create_stack(StackName="completed-done", TemplateBody=json.dumps(
        {"Resources": {"Models": {"Type": "AWS::S3::Bucket"}}}))["StackId"]
    assert cloudformation.describe_stacks(StackName=done)["Stacks"][0]["StackStatus"] == "CREATE_COMPLETE"
    moto.client("lambda").tag_resource(Resource=stack.function_arn, Tags={"aws:cloudformation:stack-id": done})
    refused(lambda: handler.is_complete(stack.event("Update", StackId=done), stack.context),
            "is CREATE_COMPLETE", "UPDATE_IN_PROGRESS")


def test_a_function_whose_tags_cannot_be_read_refuses(moto: Moto) -> None:
    """What cannot be checked is not taken as checked: a function moto does not know."""
    stack = make_stack(moto, "no-function")
    context = Context(f"arn:aws:lambda:{REGION}:{ACCOUNT}:function:nobody")
    refused(lambda: handler.on_event(stack.event("Create"), context), "tags cannot be read", "refused")


def test_a_function_not_created_by_a_stack_is_not_checked_and_says_so(moto: Moto, caplog: pytest.LogCaptureFixture) -> None:
    """A local run (no aws:cloudformation:stack-id tag): served as before, the log saying it was
    not checked; only CloudFormation can put that tag on a function."""
    stack = make_stack(moto, "untagged")
    moto.client("lambda").untag_resource(Resource=stack.function_arn, TagKeys=["aws:cloudformation:stack-id"])
    with caplog.at_level("WARNING"):
        handler.on_event(stack.event("Create", dict(stack.props, RetentionDays="3")), stack.context)
    assert "not checked against CloudFormation" in caplog.text


def rolling_back(stack: Stack) -> None:
    """Put the stack where CloudFormation is when it rolls back an update. moto's API has no way
    there (it completes or fails an update at once), so its backend, which the server on loopback
    serves from this process, is set to the status CloudFormation reports then."""
    from moto.cloudformation.models import cloudformation_backends

    cloudformation_backends[ACCOUNT][REGION].stacks[stack.stack_id].status = "UPDATE_ROLLBACK_IN_PROGRESS"
    described = stack.moto.client("cloudformation").describe_stacks(StackName=stack.stack_id)["Stacks"][0]
    assert described["StackStatus"] == "UPDATE_ROLLBACK_IN_PROGRESS"


def test_a_rollback_is_checked_by_either_template_and_nothing_else_passes(moto: Moto) -> None:
    """While an update rolls back, CloudFormation sends an Update whose ResourceProperties are the
    previous template's and whose OldResourceProperties are the failed one's; which of the two
    GetTemplate returns then is not documented, so either side equal to the template passes. A
    rollback-time event whose two sides are both foreign is refused, and outside a rollback the
    OldResourceProperties never stand in for the properties."""
    from triton_mme_cdk.model_build.handler.stack_check import check_event

    stack = make_stack(moto, "rollback")
    old = compute_release(parse_manifest(manifest(seed=7)))
    previous = dict(stack.props, ReleaseId=old.release_id, ManifestSha256=old.manifest_sha256)
    rollback = stack.event("Update", previous, OldResourceProperties=dict(stack.props))
    # Not rolling back (the stack is being created): the exception does not apply.
    refused(lambda: handler.is_complete(rollback, stack.context), "is CREATE_IN_PROGRESS")
    rolling_back(stack)
    before = stack.keys()
    # GetTemplate gives the failed template: the event's OldResourceProperties are its properties.
    assert check_event(rollback, stack.context) == f"checked: {stack.stack_id} UPDATE_ROLLBACK_IN_PROGRESS"
    # GetTemplate gives the previous template: the event's ResourceProperties are its properties.
    assert check_event(stack.event("Update", dict(stack.props), OldResourceProperties=previous),
                       stack.context).endswith("UPDATE_ROLLBACK_IN_PROGRESS")
    # Both sides foreign: refused, naming both releases; nothing read, routed or deleted.
    forged = stack.event("Update", previous, OldResourceProperties=dict(previous, RetentionDays="0"))
    refused(lambda: handler.is_complete(forged, stack.context),
            f"release '{old.release_id}'", f"release '{stack.props['ReleaseId']}'", "nothing is routed or deleted")
    # A rollback-time event without OldResourceProperties is judged by its properties alone.
    refused(lambda: handler.is_complete(stack.event("Update", previous), stack.context), old.release_id)
    # A Create is not sent while an update rolls back.
    refused(lambda: handler.on_event(stack.event("Create"), stack.context), "is UPDATE_ROLLBACK_IN_PROGRESS")
    assert stack.keys() == before
