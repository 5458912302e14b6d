"""The build's steps under separate roles (issue 49, point 4), in the executed state machine.

The synthesized build state machine runs on moto (as in ``tests/test_deploy_path_asl.py``): its
Plan and Map tasks invoke the build function (``build_step``, the build role, which parses the
model sources), its Finish task the placing function (``place_step``, the placing role, also
``on_event``'s and ``is_complete``'s). moto enforces no IAM, so every S3 call is recorded with
the function that made it, and checked twice against that function's own role in the template:
its grants (``tests/iam_grants.py``) and the decision of the bucket policy with the role's
identity policies (``tests/policy_eval.py``). Then a build whose stored tarball is forged (as a
subverted parser could forge it): the placing step reads and gates it again and places nothing.
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
import threading
from pathlib import Path
from typing import Any

import pytest
from asl_moto import wait_for
from cdk_helpers import policy_of_role
from deploy_harness import (
    BUILD_STEP,
    IS_COMPLETE,
    ON_EVENT,
    PLACE_STEP,
    LocalAws,
    S3CallsByFunction,
    Templates,
    cfn_request,
    function_roles,
    local_aws,
    tiny_manifest,
)
from iam_grants import granted, role_s3_grants, s3_actions
from policy_eval import arn_of, decide, resolve

from triton_mme_cdk.model_build import handler
from triton_mme_cdk.model_build.release.identity import store_prefix
from triton_mme_cdk.model_build.release.index import read_index
from triton_mme_cdk.model_build.release.store import publish_unit
from triton_mme_cdk.model_build.types import Artifact

#: Slow: real builds through the executed state machine.
pytestmark = pytest.mark.slow

TLS = {"aws:SecureTransport": "true", "s3:TlsVersion": "1.3"}
#: What the fleet serves: only the placing role writes it.
PLACED = ("served", "_routes", "_releases")


@pytest.fixture(scope="module")
def templates(tmp_path_factory: pytest.TempPathFactory) -> Templates:
    return Templates(tmp_path_factory.mktemp("roles"))


@pytest.fixture
def aws(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Any:
    with local_aws(monkeypatch, tmp_path) as local:
        yield local


def _run(aws: LocalAws, recorder: S3CallsByFunction, deployment: Any) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """``on_event`` as the provider framework calls it, the execution run to its end."""
    props = deployment.custom_resource_properties()
    request = cfn_request("Create", props, physical_id=None)
    with recorder.running(ON_EVENT):
        started = handler.on_event(request)
    described = wait_for(deployment.states, started["Data"]["BuildExecutionArn"], 120.0)
    return request, started, described


def test_each_step_makes_only_the_s3_calls_its_own_role_is_allowed(
        templates: Templates, aws: LocalAws, monkeypatch: pytest.MonkeyPatch) -> None:
    template = templates.get(tiny_manifest(3))
    deployment = aws.deploy(template)
    recorder = S3CallsByFunction(monkeypatch, aws.runtime)
    request, started, described = _run(aws, recorder, deployment)
    assert described["status"] == "SUCCEEDED", (described.get("error"), described.get("cause"))
    with recorder.running(IS_COMPLETE):
        done = handler.is_complete(dict(request, PhysicalResourceId=started["PhysicalResourceId"], Data=started["Data"]))
    assert done["IsComplete"] is True

    data = template.data
    roles = function_roles(deployment)
    build_role, place_role = roles[aws.runtime.function(BUILD_STEP).name], roles[aws.runtime.function(PLACE_STEP).name]
    assert build_role != place_role and roles[aws.runtime.function(ON_EVENT).name] == place_role
    assert roles[aws.runtime.function(IS_COMPLETE).name] == place_role
    props = request["ResourceProperties"]
    model_bucket = props["ModelBucket"]
    bucket_id = next(k for k, v in data["Resources"].items()
                     if v["Type"] == "AWS::S3::Bucket" and deployment.resolver.ref(k) == model_bucket)
    (policy,) = [v for v in data["Resources"].values() if v["Type"] == "AWS::S3::BucketPolicy"
                 and v["Properties"]["Bucket"] == {"Ref": bucket_id}]
    bucket_policy = resolve(data, policy["Properties"]["PolicyDocument"]["Statement"])
    identity = {role: resolve(data, policy_of_role(data, role)) for role in (build_role, place_role)}
    grants = {role: role_s3_grants(data, role) for role in (build_role, place_role)}

    def arn(bucket: str) -> str:
        return "arn:aws:s3:::" + ("MODEL" if bucket == model_bucket else "ASSET" if bucket == props["ManifestBucket"]
                                  else bucket)

    denied, writes = [], set()
    for owner, operation, params in recorder.calls:
        assert owner is not None, (operation, params)  # every call is some function's
        role = roles[owner]
        for action, resource, prefix in s3_actions(operation, params, arn):
            where = f"{roles[owner]}: {operation} needs {action} on {resource}"
            if not granted(grants[role], action, resource, prefix):
                denied.append(f"{where} (not granted)")
            if resource.startswith("arn:aws:s3:::MODEL"):
                context = {**TLS, "aws:PrincipalArn": arn_of(data, role), **({"s3:prefix": prefix} if prefix else {})}
                decided = decide(action, resource.replace("MODEL", arn_of(data, bucket_id).rsplit(":", 1)[-1], 1),
                                 context, identity=identity[role], resource_policy=bucket_policy)
                if decided != "Allow":
                    denied.append(f"{where} ({decided} by the bucket policy and the role's policies)")
                if action == "s3:PutObject":
                    writes.add((role, resource.split("/")[2]))
    assert denied == [], "\n".join(sorted(set(denied)))
    # Each item was placed by its own placing task, the release finished by one.
    steps = sorted(call.event["Step"] for call in aws.runtime.invocations(PLACE_STEP))
    assert steps == ["finish", "place", "place", "place"], steps
    # The step that parses the sources wrote the store and the plans only; the placing step what is served.
    assert {folder for role, folder in writes if role == build_role} == {"_builds", "_plans"}, writes
    assert {folder for role, folder in writes if role == place_role} == set(PLACED), writes
    # Whatever the build role's own policies said, the bucket policy denies it what the fleet serves.
    bucket_arn = arn_of(data, bucket_id)
    widened = [*identity[build_role], {"Effect": "Allow", "Action": "s3:*", "Resource": f"{bucket_arn}/*"}]
    for key in ("models/served/unit-00-0123456789ab.tar.gz", "models/_routes/routes.json",
                "models/_releases/r-0123456789abcdef/_index.json"):
        for action in ("s3:PutObject", "s3:DeleteObject", "s3:PutObjectTagging"):
            context = {**TLS, "aws:PrincipalArn": arn_of(data, build_role)}
            assert decide(action, f"{bucket_arn}/{key}", context, identity=widened,
                          resource_policy=bucket_policy) == "Deny", (action, key)


def _bad_tarball(folder: Path, name: str) -> Artifact:
    """A tarball the pre-publish gate refuses (a model folder without its config.pbtxt)."""
    payload = b"not a model" * 100
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        info = tarfile.TarInfo(f"{name}/1/model.onnx")
        info.size = len(payload)
        tar.addfile(info, io.BytesIO(payload))
    path = folder / "forged.tar.gz"
    path.write_bytes(buffer.getvalue())
    data = path.read_bytes()
    return Artifact(name=name, format="onnx", path=path, sha256=hashlib.sha256(data).hexdigest(), size=len(data),
                    targets=(name,))


def _forge(how: str, tmp_path: Path) -> Any:
    """A build step that builds for real, then, for unit-00, does what a subverted parser with the
    build role could do to the store: ``indexed``: store a tarball the gate refuses, with an index
    that matches it; ``swapped``: replace the tarball's bytes under the index; ``elsewhere``: an
    index that names another object to place. One build at a time, as the local runtime runs the
    real build step (a stand-in is not serialized for it; torch's exporter is process-global)."""
    one_at_a_time = threading.Lock()

    def stand_in(event: dict[str, Any], context: Any, real: Any) -> Any:
        with one_at_a_time:
            result = real(event, context)
        if event.get("Step") != "build" or event["Model"] != "unit-00":
            return result
        from triton_mme_cdk.model_build.handler.request import s3_client

        props, s3 = event["Request"], s3_client()
        bucket, store = props["ModelBucket"], store_prefix(props["ModelPrefix"], event["Key"])
        if how == "indexed":
            publish_unit(_bad_tarball(tmp_path, "unit-00"), event["Key"], s3_client=s3, bucket=bucket,
                         model_prefix=props["ModelPrefix"])
        elif how == "swapped":
            s3.put_object(Bucket=bucket, Key=f"{store}/model.tar.gz", Body=_bad_tarball(tmp_path, "x").path.read_bytes())
        else:
            index = json.loads(s3.get_object(Bucket=bucket, Key=f"{store}/_index.json")["Body"].read())
            index["models"][0]["key"] = f"{props['ModelPrefix']}/_jobs/r/unit-00/output/model.tar.gz"
            s3.put_object(Bucket=bucket, Key=f"{store}/_index.json", Body=json.dumps(index).encode())
        return result
    return stand_in


@pytest.mark.parametrize(("how", "says"), [
    ("indexed", "config.pbtxt"),  # the gate, run again by the placing step
    ("swapped", "its store index says"),  # the placing step's own SHA-256 of the bytes
    ("elsewhere", "nothing else is placed"),  # the index may name its own key's tarball only
])
def test_the_placing_step_gates_each_stored_tarball_again_and_places_nothing_forged(
        how: str, says: str, templates: Templates, aws: LocalAws, monkeypatch: pytest.MonkeyPatch,
        tmp_path: Path) -> None:
    deployment = aws.deploy(templates.get(tiny_manifest(2)))
    recorder = S3CallsByFunction(monkeypatch, aws.runtime)
    aws.runtime.stand_in(BUILD_STEP, _forge(how, tmp_path))
    request, started, described = _run(aws, recorder, deployment)
    assert described["status"] == "FAILED", described
    # The item's own placing task refuses it; the Map fails, and no release is finished.
    placed = {call.event["Model"]: call for call in aws.runtime.invocations(PLACE_STEP) if call.event["Step"] == "place"}
    refused = placed["unit-00"]
    assert refused.outcome == "error" and "unit-00" in refused.result["errorMessage"], refused.result
    assert says in refused.result["errorMessage"], refused.result
    assert not [call for call in aws.runtime.invocations(PLACE_STEP) if call.event["Step"] == "finish"]
    props = request["ResourceProperties"]
    served = deployment.s3.list_objects_v2(Bucket=props["ModelBucket"], Prefix="models/served/unit-00")
    assert served.get("KeyCount", 0) == 0, "nothing of it placed: the check runs before any copy"
    assert read_index(deployment.s3, props["ModelBucket"], f"models/_releases/{props['ReleaseId']}/_index.json") is None
    with recorder.running(IS_COMPLETE), pytest.raises(handler.HandlerError) as caught:
        handler.is_complete(dict(request, PhysicalResourceId=started["PhysicalResourceId"], Data=started["Data"]))
    assert "unit-00" in str(caught.value) and "Traceback" not in str(caught.value)


def test_each_function_takes_only_its_own_steps(aws: LocalAws) -> None:
    with pytest.raises(handler.HandlerError, match="field Step: got 'finish'; expected one of plan, build"):
        handler.build_step({"Step": "finish", "Request": {}})
    with pytest.raises(handler.HandlerError, match="field Step: got 'build'; expected place or finish"):
        handler.place_step({"Step": "build", "Request": {}})


def test_the_placing_step_reads_tarballs_at_once_only_within_its_disk_budget() -> None:
    from triton_mme_cdk.model_build.handler.place import _DiskBudget

    budget, order = _DiskBudget(10), []
    first_in, release_first = threading.Event(), threading.Event()

    def first() -> None:
        with budget.hold(6):
            order.append("first in")
            first_in.set()
            release_first.wait(5)
            order.append("first out")

    def second() -> None:
        first_in.wait(5)
        with budget.hold(6):  # 6 + 6 > 10: waits for the first
            order.append("second in")

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for thread in threads:
        thread.start()
    first_in.wait(5)
    threads[1].join(0.2)
    assert order == ["first in"], "the second waits while the first holds its bytes"
    release_first.set()
    for thread in threads:
        thread.join(5)
    assert order == ["first in", "first out", "second in"]
    with budget.hold(50):  # larger than the budget: it runs, alone
        assert budget.used == 50
    assert budget.used == 0


def test_finish_checks_what_no_item_placed(templates: Templates, aws: LocalAws, tmp_path: Path) -> None:
    """A model stored earlier and not served now is placed by Finish, not by an item: Finish
    checks it the same way (a forged store refused, naming the model, nothing copied)."""
    deployment = aws.deploy(templates.get(tiny_manifest(2)))
    props = {k: v for k, v in deployment.custom_resource_properties().items() if k != "ServiceToken"}
    plan = handler.build_step({"Step": "plan", "Request": props})
    items = json.loads(deployment.s3.get_object(Bucket=plan["Bucket"], Key=plan["Key"])["Body"].read())
    for item in items:
        handler.build_step({"Step": "build", "Request": props, **item})
    key = next(item["Key"] for item in items if item["Model"] == "unit-00")
    publish_unit(_bad_tarball(tmp_path, "unit-00"), key, s3_client=deployment.s3, bucket=props["ModelBucket"],
                 model_prefix=props["ModelPrefix"])
    with pytest.raises(handler.HandlerError) as caught:
        handler.place_step({"Step": "finish", "Request": props})
    assert "unit-00" in str(caught.value) and "config.pbtxt" in str(caught.value), caught.value
    served = deployment.s3.list_objects_v2(Bucket=props["ModelBucket"], Prefix="models/served/")
    assert served.get("KeyCount", 0) == 0, "nothing copied: every object is checked before any copy"
