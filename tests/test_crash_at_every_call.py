"""Crash at every call: the steps that change what the fleet serves, each S3 call of each failing in
turn, then run again, and the invariants (:mod:`model_build.release.invariants`) checked on moto's
server's bucket after each.

The steps: the activation (``activate_release``, as ``publish`` runs it: verify, delete what expired,
write the routes), and the custom resource's Create, Update (an expired object deleted), rollback
(an Update back to a release whose object the retention window removed: copied back from the store)
and Delete (``OnDelete: destroy`` while the stack is deleted), through its two handlers
(``on_event``, ``is_complete``) with the store's builds in place. The Create goes as the default
stack's does: ``on_event`` starts the build state machine (on moto's Step Functions API), whose
Finish task (``place_step``: each stored tarball read and admitted, the release assembled, its
index written) the test runs, then ``is_complete`` routes it. The Update assembles the release in
``is_complete`` itself (a stack without a state machine). The rollback has the state machine too:
the old release's index exists, so ``on_event`` reads it and starts no build.

And the build state machine's own steps, as its tasks invoke them, for a release {a, c} whose a is
stored and c is not: ``Plan`` (``build_step``: the manifest read, the store listed, c's source
sized, the plan and the failure record written), a Map item's ``BuildModel`` (``build_step``: c
really built from a tiny ONNX file in the bucket, about 0.5 s, and stored) and its ``PlaceModel``
(``place_step``: c's stored tarball read, admitted and copied into ``served/``). And the item's
SageMaker Processing branch, for a stack with the Processing engine (``BuildEngine`` in the
request): ``OutgrewLambda`` (``build_step`` ``outgrew_lambda``, after c's BuildModel ran past the
Lambda's timeout: c's job input document written under ``_jobs/``), ``StoreBuild`` (``store_job``:
the finished job's output under ``_jobs/``, which the job's entry point
(:mod:`model_build.handler.processing_job`) really built, run on the inputs SageMaker would
download, read, gated again and stored) and ``JobFailed`` (``job_failed``: a job that really failed,
the same entry point without its source, its reason recorded and the item failed).
``PlaceJobModel`` is the same ``place_step`` as PlaceModel. Each also checks what it leaves: the
plan lists c alone and records no failure; c is stored whole (its tarball's bytes, read and
hashed, are its store index's), after BuildModel and after StoreBuild; c's served object holds
those bytes; OutgrewLambda answers the same Job, its input document is for c, its key and the
request, c's source folder mounted, and no failure is recorded; after JobFailed the failure
record holds c's name and the job's own reason, as ``is_complete`` reads it.

Each step runs once without a fault behind the fault proxy (:mod:`s3_faults`), which records its
calls: that list is the enumeration, so a call a step gains is covered without editing this file.
Then, for each call (method, path, and which occurrence of that pair it is) and each fault:

- ``error``: the call answers ``403 AccessDenied``, which botocore does not retry: the step fails there;
- ``landed``: the call lands, its answer never comes (a reset): a timeout after landing; the client's
  retry meets what it did (the routes PUT's retry gets 412);
- ``kill``: the call lands, then the process is dead. The faulted run is a forked child process
  (:meth:`s3_faults.FaultProxy.run_killable`, its own clients); the proxy forwards the call, sends
  the child SIGKILL and waits for its death before it resets the connection, so the child never has
  the answer and does nothing after the call: no S3 call, no Step Functions ``StartExecution``,
  nothing written anywhere, and its answer (to CloudFormation, Step Functions, the user) is lost.
  Calls its other threads had already sent land; any sent later is refused;

the step runs again without a fault, as CloudFormation, Step Functions or the user would, and then:
every routed target is in ``served/`` with its digest's bytes (read and hashed), nothing retained is
deleted, the routes match an index that exists, the routes are the fault-free run's, and no object
was written more often than the fault-free run writes it (the plan's two documents and the job's
input document, which every attempt writes again by design, are checked for what they hold
instead).

One set-up per step: its starting state is built once and copied back into the bucket before each
case (only what the case changed). A case whose faulted run left the bucket exactly as an earlier
case's did is not rerun (the rerun starts from the same state, and was checked); its own writes are
still counted against the fault-free run's.
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import boto3
import pytest
import yaml
from s3_faults import FaultProxy, Record, Rule

from triton_mme_cdk.model_build.artifact.pack import write_tarball
from triton_mme_cdk.model_build.aws_clients import make_s3_client
from triton_mme_cdk.model_build.handler import build_step, custom_resource, is_complete, on_event, place_step
from triton_mme_cdk.model_build.handler.build_steps import NO_FAILURE, item_request, recorded_failure
from triton_mme_cdk.model_build.handler.processing import failure_reason, job_prefix
from triton_mme_cdk.model_build.handler.request import HandlerError
from triton_mme_cdk.model_build.manifest import parse_manifest
from triton_mme_cdk.model_build.manifest.build_engine import EngineSettings
from triton_mme_cdk.model_build.release import compute_release, identity, routes_key
from triton_mme_cdk.model_build.release.identity import (
    BUILDS_DIR,
    INDEX_NAME,
    JOBS_DIR,
    PLANS_DIR,
    served_prefix,
    store_prefix,
)
from triton_mme_cdk.model_build.release.index import read_index, read_routes
from triton_mme_cdk.model_build.release.invariants import (
    check_bucket,
    kept_since,
    repeated_writes,
    serving_difference,
)
from triton_mme_cdk.model_build.release.routes import served_name
from triton_mme_cdk.model_build.release.serving import activate_release
from triton_mme_cdk.model_build.release.store import (
    ReleaseTarget,
    assemble_release,
    publish_unit,
    stored_models,
)
from triton_mme_cdk.model_build.types import Artifact

PREFIX = "models"
STACK = "arn:aws:cloudformation:us-east-1:123456789012:stack/TritonMme/5d1c0f3e"
DAY = 86400.0
FAULTS = ("error", "landed", "kill")
TINY = {"kind": "synthetic", "architecture": "resnet",
        "config": {"embedding_size": 8, "hidden_sizes": [8, 8, 8, 8], "depths": [1, 1, 1, 1],
                   "layer_type": "basic", "num_labels": 4}}


def _entry(name: str, seed: int, batch: int = 2) -> dict[str, Any]:
    return {"name": name, "source": dict(copy.deepcopy(TINY), seed=seed), "task": "image-classification", "max_batch_size": batch,
            "image": {"image_size": 32, "channels": 3}}


#: Small manifests: the Create's {a}; R0 {a, z}; R1 {a, b} (z removed); R2 {a, b changed}.
MANIFESTS = {
    "new": {"version": 1, "models": [_entry("a", 0)]},
    "r0": {"version": 1, "models": [_entry("a", 0), _entry("z", 9)]},
    "r1": {"version": 1, "models": [_entry("a", 0), _entry("b", 1)]},
    "r2": {"version": 1, "models": [_entry("a", 0), _entry("b", 1, batch=4)]},
}
#: Where the state machine's build steps' model comes from: a ready ONNX file in the bucket.
SOURCE_KEY = "sources/c/model.onnx"


def _built_manifest(bucket: str) -> dict[str, Any]:
    """R3 {a, c}: a is stored, c is not, so the plan lists c alone and its Map item really builds
    it: an ONNX file source, the cheapest the manifest takes (no export: the file is downloaded,
    checked, validated under ONNX Runtime against the file it came from, packaged and stored, about
    0.5 s)."""
    c = {"name": "c", "source": {"kind": "onnx", "path": f"s3://{bucket}/{SOURCE_KEY}"},
         "task": "image-classification", "max_batch_size": 2, "image": {"image_size": 32, "channels": 3}}
    return {"version": 1, "models": [_entry("a", 0), c]}


def _tiny_onnx() -> bytes:
    """An image classifier in two nodes: ``pixel_values`` [N, 3, 32, 32] flattened, times a seeded
    [3072, 4] matrix: ``logits`` [N, 4]."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    weights = np.random.default_rng(7).standard_normal((3 * 32 * 32, 4)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Reshape", ["pixel_values", "shape"], ["flat"]),
         helper.make_node("MatMul", ["flat", "weights"], ["logits"])],
        "tiny",
        [helper.make_tensor_value_info("pixel_values", TensorProto.FLOAT, ["batch", 3, 32, 32])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 4])],
        [numpy_helper.from_array(weights, "weights"), numpy_helper.from_array(np.array([0, -1], np.int64), "shape")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return bytes(model.SerializeToString())


@dataclass
class Step:
    name: str
    #: The state the step starts from, built once (bucket contents to copy back before each case).
    setup: str
    run: Callable[[], None]
    #: Extra check after the rerun (the Delete's: nothing of the stack left but the store).
    check: Callable[[Any, str], list[str]] | None = None
    #: Whether the step keeps what was routed or retained (all but a destroying Delete).
    keeps: bool = True


@dataclass
class World:
    direct: Any
    proxy: FaultProxy
    bucket: str
    props: dict[str, dict[str, str]]
    folder: Path
    snapshots: dict[str, dict[str, str]] = field(default_factory=dict)
    #: The routes each snapshot starts from.
    before: dict[str, Any] = field(default_factory=dict)
    #: The build state machine (on moto's Step Functions API), as the default stack has one.
    machine: str = ""
    snapshot_bucket: str = ""
    #: The Map item of R3's model c, as its plan must list it.
    item: dict[str, Any] = field(default_factory=dict)
    #: c's ``Job`` as OutgrewLambda returned it (the state machine's ``$.Job``).
    job: dict[str, Any] = field(default_factory=dict)
    #: A failed job's description, as the RunBuildJob task's ``Cause`` carries it.
    job_failure: dict[str, Any] = field(default_factory=dict)
    #: When the item's execution started (its budget is counted from there).
    started: str = field(default_factory=lambda: datetime.now(UTC).isoformat().replace("+00:00", "Z"))


# ---------------------------------------------------------------------------------------------
# The bucket: built once, copied back before each case
# ---------------------------------------------------------------------------------------------


def _listing(s3: Any, bucket: str) -> dict[str, str]:
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket=bucket)
    return {item["Key"]: item["ETag"] for page in pages for item in page.get("Contents", [])}


def _copy(s3: Any, source_bucket: str, key: str, bucket: str, target: str) -> None:
    s3.copy_object(Bucket=bucket, Key=target, CopySource={"Bucket": source_bucket, "Key": key},
                   MetadataDirective="COPY", ChecksumAlgorithm="SHA256")


def _snapshot(world: World, name: str) -> None:
    """Keep the bucket as it is now under ``<name>/`` of the snapshot bucket."""
    listing = _listing(world.direct, world.bucket)
    for key in listing:
        _copy(world.direct, world.bucket, key, world.snapshot_bucket, f"{name}/{key}")
    world.snapshots[name] = listing
    world.before[name] = read_routes(world.direct, world.bucket, PREFIX, stack=STACK)


def _restore(world: World, name: str) -> None:
    """Make the bucket what the snapshot holds, copying and deleting only what differs."""
    want, have = world.snapshots[name], _listing(world.direct, world.bucket)
    extra = [key for key in have if key not in want]
    if extra:
        world.direct.delete_objects(Bucket=world.bucket, Delete={"Objects": [{"Key": k} for k in extra], "Quiet": True})
    for key, etag in want.items():
        if have.get(key) != etag:
            _copy(world.direct, world.snapshot_bucket, f"{name}/{key}", world.bucket, key)


def _store(world: World, manifest: dict[str, Any]) -> None:
    """Store a build of each model of ``manifest`` under its real key: a tarball the placing gate
    admits (a config of the entry's backend, a model file of its own bytes, which the gate does not
    parse); no model is built, the steps only place and route what is stored."""
    release = compute_release(parse_manifest(manifest))
    for name, key in release.model_keys.items():
        config = (f'name: "{name}"\nbackend: "onnxruntime"\nmax_batch_size: 2\n'
                  'input { name: "pixel_values" data_type: TYPE_FP32 dims: [3, 32, 32] }\n'
                  'output { name: "logits" data_type: TYPE_FP32 dims: [4] }\n').encode()
        path = world.folder / f"{key}.tar.gz"
        sha256, size = write_tarball({f"{name}/config.pbtxt": config, f"{name}/1/model.onnx": key.encode() * 64}, path)
        artifact = Artifact(name=name, format="onnx", path=path, sha256=sha256, size=size, targets=(name,))
        publish_unit(artifact, key, s3_client=world.direct, bucket=world.bucket, model_prefix=PREFIX)


def _props(world: World, label: str, manifest: dict[str, Any] | None = None) -> dict[str, str]:
    manifest = MANIFESTS[label] if manifest is None else manifest
    key = f"asset/{label}.yaml"
    world.direct.put_object(Bucket=world.bucket, Key=key, Body=yaml.safe_dump(manifest).encode())
    release = compute_release(parse_manifest(manifest))
    return {"ServiceToken": "arn:aws:lambda:us-east-1:123456789012:function:on-event", "ManifestBucket": world.bucket,
            "ManifestKey": key, "ManifestSha256": release.manifest_sha256, "ModelBucket": world.bucket,
            "ModelPrefix": PREFIX, "ReleaseId": release.release_id, "CodeSha256": release.code_sha256,
            "RetentionDays": "7", "OnDelete": "destroy"}


def _assemble(world: World, label: str) -> None:
    manifest = parse_manifest(MANIFESTS[label])
    release = compute_release(manifest)
    assemble_release(stored_models(manifest, release.model_keys),
                     ReleaseTarget.of(release, world.direct, world.bucket, PREFIX))


def _activate(world: World, label: str, days_ago: float) -> None:
    activate_release(world.direct, world.bucket, PREFIX, world.props[label]["ReleaseId"], stack=STACK,
                     clock=lambda: time.time() - days_ago * DAY)


def _event(world: World, kind: str, label: str, old: str | None = None, *, machine: bool = False) -> dict[str, Any]:
    props = dict(world.props[label], BuildStateMachineArn=world.machine) if machine else world.props[label]
    event: dict[str, Any] = {"RequestType": kind, "RequestId": str(uuid.uuid4()), "StackId": STACK,
                             "LogicalResourceId": "ModelBuildE2D089A7", "ResourceType": "Custom::TritonModelRelease",
                             "ResponseURL": "https://localhost/response", "ServiceToken": props["ServiceToken"],
                             "ResourceProperties": props}
    if kind != "Create":
        event["PhysicalResourceId"] = f"s3://{world.bucket}/{PREFIX}/served/"
    if old is not None:
        event["OldResourceProperties"] = world.props[old]
    return event


def _resource(world: World, kind: str, label: str, old: str | None = None, *,
              machine: bool = False) -> Callable[[], None]:
    """The custom resource's event as the Provider framework runs it: ``on_event``, then
    ``is_complete`` until it says complete. ``machine``: with the build state machine, as the
    default stack has it (for a release whose index exists: ``on_event`` reads it, starts nothing)."""

    def run() -> None:
        event = _event(world, kind, label, old, machine=machine)
        answer = on_event(event)
        polled = dict(event, PhysicalResourceId=answer["PhysicalResourceId"], Data=answer.get("Data") or {})
        if polled["Data"].get("BuildExecutionArn"):
            # The state machine's run: the builds are stored, so its Finish task alone acts (admits
            # each stored tarball it places, assembles the release, writes its index); a Finish
            # that fails fails the execution, and CloudFormation the resource.
            request = {k: v for k, v in event["ResourceProperties"].items() if k not in ("ServiceToken", "Deployed")}
            place_step({"Step": "finish", "Request": request})
        for _ in range(5):
            if is_complete(polled).get("IsComplete"):
                return
        raise AssertionError(f"{kind} {label}: is_complete never completed")

    return run


def _nothing_left(s3: Any, bucket: str) -> list[str]:
    """After a destroying Delete: no served object, index or routes document is left; the store is."""
    left = [key for key in _listing(s3, bucket) if key.startswith((f"{PREFIX}/served/", f"{PREFIX}/_releases/",
                                                                    f"{PREFIX}/_routes/"))]
    stored = [key for key in _listing(s3, bucket) if key.startswith(f"{PREFIX}/_builds/")]
    return [f"left after the destroy: {key}" for key in left] + ([] if stored else ["the store was deleted"])


@pytest.fixture(scope="module")
def world(endpoint: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    monkeypatch = pytest.MonkeyPatch()
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    folder = tmp_path_factory.mktemp("crash")
    monkeypatch.setenv("TMPDIR", str(folder))
    # Each handler call computes the release's keys, which parses every runtime file (0.6 s here):
    # the files do not change while this module runs, so each answer is computed once.
    real_files, known = identity.runtime_files, {}

    def runtime_files(package_dir: Path = identity.PACKAGE_DIR,
                      entries: Iterable[str] = identity.RELEASE_ENTRY_MODULES) -> list[Path]:
        key = (package_dir, tuple(entries))
        if key not in known:
            known[key] = real_files(package_dir, key[1])
        return list(known[key])

    monkeypatch.setattr(identity, "runtime_files", runtime_files)
    # A Delete asks CloudFormation whether the stack is being deleted: here it is.
    monkeypatch.setattr(custom_resource, "_stack_status", lambda stack_id: "DELETE_IN_PROGRESS")
    direct = make_s3_client(endpoint_url=endpoint)
    with FaultProxy(endpoint) as proxy:
        monkeypatch.setenv("MODEL_BUILD_S3_ENDPOINT_URL", proxy.url)
        # The build state machine on moto's Step Functions API (it records executions; the test runs
        # their Finish task itself). Only S3 goes through the proxy.
        monkeypatch.setenv("MODEL_BUILD_STATES_ENDPOINT_URL", endpoint)
        states = boto3.client("stepfunctions", endpoint_url=endpoint)
        machine = str(states.create_state_machine(
            name=f"build-{uuid.uuid4().hex[:8]}", definition='{"StartAt":"x","States":{"x":{"Type":"Succeed"}}}',
            roleArn="arn:aws:iam::123456789012:role/build")["stateMachineArn"])
        bucket, snapshots = f"crash-{uuid.uuid4().hex[:10]}", f"snap-{uuid.uuid4().hex[:10]}"
        direct.create_bucket(Bucket=bucket)
        direct.create_bucket(Bucket=snapshots)
        world = World(direct, proxy, bucket, {}, folder, snapshot_bucket=snapshots, machine=machine)
        for label in MANIFESTS:
            _store(world, MANIFESTS[label])
            world.props[label] = _props(world, label)
        _snapshot(world, "stored")  # the builds are stored, nothing is served: a Create
        _assemble(world, "r0")
        _activate(world, "r0", 30)
        _assemble(world, "r1")
        _activate(world, "r1", 20)  # z unrouted 20 days ago: expired, the next activation deletes it
        _snapshot(world, "r1-routed")  # an Update to r2
        _assemble(world, "r2")
        _snapshot(world, "r2-placed")  # r2's index written: its activation
        _activate(world, "r2", 10)  # b of r1 unrouted 10 days ago ...
        _activate(world, "r2", 1)  # ... and deleted by this re-activation: a rollback copies it back
        _snapshot(world, "r2-routed")
        # R3's build: its manifest and c's source uploaded, nothing of c stored (the plan and build).
        direct.put_object(Bucket=bucket, Key=SOURCE_KEY, Body=_tiny_onnx())
        world.props["r3"] = _props(world, "r3", _built_manifest(bucket))
        keys = compute_release(parse_manifest(_built_manifest(bucket))).model_keys
        world.item = {"Model": "c", "Key": keys["c"], "Engine": "lambda", "Job": {}}
        _snapshot(world, "r3-start")
        build_step(_build_event(world))  # a real build of c, stored: its placing
        _snapshot(world, "r3-built")
        # The Processing branch: from R3's start, the plan run (its documents, the "no failure"
        # marker) and c's BuildModel timed out: OutgrewLambda moves c to Processing (its job's input
        # document written), the job runs for real (the project's entry point, on what SageMaker
        # would download), its output in the bucket under _jobs/: what StoreBuild stores.
        _restore(world, "r3-start")
        build_step(_plan_event(world, engine=True))
        _snapshot(world, "r3-planned")
        world.job = build_step(_outgrew_event(world))
        _snapshot(world, "r3-job-sent")  # the job failed (it uploads nothing): JobFailed records why
        world.job_failure = _run_job(world, folder / "failed-job", with_source=False)
        assert world.job_failure["ProcessingJobStatus"] == "Failed", world.job_failure
        _restore(world, "r3-job-sent")
        finished = _run_job(world, folder / "job")
        assert finished["ProcessingJobStatus"] == "Completed", finished
        _snapshot(world, "r3-job-done")
        yield world
    monkeypatch.undo()


def _steps(world: World) -> list[Step]:
    return [
        Step("activation", "r2-placed", lambda: _activate_now(world)),
        Step("create", "stored", _resource(world, "Create", "new", machine=True)),
        Step("update", "r1-routed", _resource(world, "Update", "r2", old="r1")),
        Step("rollback", "r2-routed", _resource(world, "Update", "r1", old="r2", machine=True)),
        Step("delete", "r2-routed", _resource(world, "Delete", "r2"), check=_nothing_left, keeps=False),
        # The build state machine's own steps, as its tasks invoke them (Plan; a Map item's
        # BuildModel and PlaceModel), for R3's model c.
        Step("plan", "r3-start", lambda: _no_answer(build_step(_plan_event(world))),
             check=lambda s3, bucket: _planned(world)),
        Step("build", "r3-start", lambda: _no_answer(build_step(_build_event(world))),
             check=lambda s3, bucket: _stored_whole(world)),
        Step("place", "r3-built", lambda: _no_answer(place_step(dict(_build_event(world), Step="place"))),
             check=lambda s3, bucket: _placed(world)),
        # The Processing branch of c's Map item (PlaceJobModel is the place step above): OutgrewLambda
        # after BuildModel timed out, StoreBuild after the job finished, JobFailed after it failed.
        Step("outgrown", "r3-planned", lambda: _outgrow(world), check=lambda s3, bucket: _job_sent(world)),
        Step("store_job", "r3-job-done", lambda: _no_answer(build_step(_store_job_event(world))),
             check=lambda s3, bucket: _stored_whole(world)),
        Step("job_failed", "r3-job-sent", lambda: _fail_job(world), check=lambda s3, bucket: _failure_recorded(world)),
    ]


def _request(world: World, *, engine: bool = False) -> dict[str, Any]:
    """What the state machine's tasks carry as ``Request``: the resource properties, less the token.
    ``engine``: a stack with the Processing engine, whose resource has the ``BuildEngine`` property
    (its defaults: ``auto``, c builds on the Lambda unless it outgrows it)."""
    request: dict[str, Any] = {k: v for k, v in world.props["r3"].items() if k not in ("ServiceToken", "Deployed")}
    return dict(request, BuildEngine=EngineSettings().properties()) if engine else request


def _plan_event(world: World, *, engine: bool = False) -> dict[str, Any]:
    return {"Step": "plan", "Request": _request(world, engine=engine)}


def _job_item(world: World) -> dict[str, Any]:
    """The fields the Processing branch's tasks pass along from the Map item."""
    return {"Request": _request(world, engine=True), "Model": world.item["Model"], "Key": world.item["Key"]}


def _outgrew_event(world: World) -> dict[str, Any]:
    """OutgrewLambda's payload after c's BuildModel ran past the Lambda's timeout (the catch's
    ``$.LambdaError``), the execution started a moment ago with a two-hour budget."""
    cause = json.dumps({"errorMessage": "2026-12-07T00:15:00.000Z 5c1e Task timed out after 900.00 seconds"})
    return {"Step": "outgrew_lambda", **_job_item(world), "Error": "Sandbox.Timedout", "Cause": cause,
            "Started": world.started, "BudgetSeconds": 7200, "Processing": True}


def _store_job_event(world: World) -> dict[str, Any]:
    return {"Step": "store_job", **_job_item(world), "Job": world.job}


def _job_failed_event(world: World) -> dict[str, Any]:
    """JobFailed's payload: the RunBuildJob task's error, its cause the job's description."""
    return {"Step": "job_failed", **_job_item(world), "Error": "States.TaskFailed",
            "Cause": json.dumps(world.job_failure)}


def _run_job(world: World, root: Path, *, with_source: bool = True) -> dict[str, Any]:
    """c's Processing job, run as SageMaker runs it: each of the Job's inputs downloaded under its
    LocalPath (``/opt/ml`` re-rooted at ``root``), the project's entry point run
    (:func:`model_build.handler.processing_job.run`: the real build), and on success its output
    folder uploaded to the Job's ``Output``. ``with_source=False``: the source's input is not
    downloaded, so the build finds no model file and fails for real. Returns the job's
    description, as the task's output or, failed, its error's ``Cause``."""
    import os

    from triton_mme_cdk.model_build.handler import processing_job
    from triton_mme_cdk.model_build.handler.processing import CONTAINER_OUTPUT

    def local(path: str) -> Path:
        return root / Path(path).relative_to("/opt/ml")

    for item in world.job["Inputs"]:
        if item["InputName"] == "source" and not with_source:
            continue
        bucket, _, prefix = item["S3Input"]["S3Uri"][len("s3://"):].partition("/")
        for page in world.direct.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            for listed in page.get("Contents", []):
                target = local(item["S3Input"]["LocalPath"]) / listed["Key"][len(prefix):]
                target.parent.mkdir(parents=True, exist_ok=True)
                world.direct.download_file(bucket, listed["Key"], str(target))
    tmpdir = os.environ.get("TMPDIR")
    try:
        code = processing_job.run(root)
    finally:  # the entry point points TMPDIR at the job's volume
        if tmpdir is not None:
            os.environ["TMPDIR"] = tmpdir
    name = f"{world.job['NamePrefix']}-{uuid.uuid4().hex[:8]}"
    described: dict[str, Any] = {"ProcessingJobName": name, "ProcessingJobArn":
                                 f"arn:aws:sagemaker:us-east-1:123456789012:processing-job/{name}"}
    if code != 0:
        return dict(described, ProcessingJobStatus="Failed", FailureReason="AlgorithmError: See job logs for more "
                    "information", ExitMessage=(root / "output" / "message").read_text()[:1024])
    bucket, _, prefix = world.job["Output"][len("s3://"):].partition("/")
    unit = local(CONTAINER_OUTPUT)
    for path in sorted(p for p in unit.rglob("*") if p.is_file()):
        world.direct.upload_file(str(path), bucket, prefix + path.relative_to(unit).as_posix())
    return dict(described, ProcessingJobStatus="Completed")


def _build_event(world: World) -> dict[str, Any]:
    """A Map item's input (the ItemSelector's fields), as BuildModel and PlaceModel get it."""
    return {"Step": "build", "Request": _request(world), **world.item, "Started": "2026-12-07T00:00:00Z"}


def _no_answer(answer: dict[str, Any]) -> None:
    """A task's answer goes to Step Functions; what the bucket holds is checked instead."""


def _planned(world: World) -> list[str]:
    """After the plan: its document lists c alone, and the failure record says no model failed."""
    request = _request(world)
    base = f"{PREFIX}/{PLANS_DIR}/{request['ReleaseId']}"
    problems = []
    try:
        items = json.loads(world.direct.get_object(Bucket=world.bucket, Key=f"{base}.json")["Body"].read())
        failure = world.direct.get_object(Bucket=world.bucket, Key=f"{base}.failure.json")["Body"].read()
    except world.direct.exceptions.NoSuchKey as error:
        return [f"the plan's documents are not both there: {error}"]
    if items != [world.item]:
        problems.append(f"the plan lists {items}; expected [{world.item}]")
    if failure != NO_FAILURE:
        problems.append(f"the failure record holds {failure!r}; expected {NO_FAILURE!r}")
    return problems


def _store_entry(world: World) -> tuple[dict[str, Any] | None, str]:
    """c's stored tarball as the store's index lists it, or None and why not."""
    index_key = f"{store_prefix(PREFIX, world.item['Key'])}/{INDEX_NAME}"
    document = read_index(world.direct, world.bucket, index_key)
    if document is None or len(document["models"]) != 1:
        return None, f"no whole stored build of c: s3://{world.bucket}/{index_key} is {document}"
    return document["models"][0], ""


def _bytes_problem(world: World, key: str, sha256: str, size: int) -> list[str]:
    try:
        body = world.direct.get_object(Bucket=world.bucket, Key=key)["Body"].read()
    except world.direct.exceptions.NoSuchKey:
        return [f"s3://{world.bucket}/{key} is missing"]
    if (hashlib.sha256(body).hexdigest(), len(body)) != (sha256, size):
        return [f"s3://{world.bucket}/{key} holds other bytes than its index's {sha256[:12]} ({size} bytes)"]
    return []


def _stored_whole(world: World) -> list[str]:
    """After the build: c is stored whole, its tarball's bytes (read and hashed) the index's."""
    entry, why = _store_entry(world)
    return [why] if entry is None else _bytes_problem(world, entry["key"], entry["sha256"], entry["size"])


def _placed(world: World) -> list[str]:
    """After the placing: c's served object holds its stored tarball's bytes (read and hashed)."""
    entry, why = _store_entry(world)
    if entry is None:
        return [why]
    return _bytes_problem(world, f"{served_prefix(PREFIX)}/{served_name('c', entry['sha256'])}",
                          entry["sha256"], entry["size"])


def _outgrow(world: World) -> None:
    """OutgrewLambda: c moved to Processing; its answer (the state machine's ``$.Job``, which
    RunBuildJob and StoreBuild read) is the one the set-up's run gave."""
    job = build_step(_outgrew_event(world))
    if job != world.job:
        raise AssertionError(f"OutgrewLambda answered {job}; expected {world.job}")


def _job_sent(world: World) -> list[str]:
    """After OutgrewLambda: c's job input document is there, for c's key and this request, its
    source folder mounted; no failure is recorded (c moved, it did not fail)."""
    key = f"{job_prefix(PREFIX, world.props['r3']['ReleaseId'], 'c')}/input/request.json"
    try:
        document = json.loads(world.direct.get_object(Bucket=world.bucket, Key=key)["Body"].read())
    except world.direct.exceptions.NoSuchKey:
        return [f"s3://{world.bucket}/{key} is missing: the job has no input"]
    problems = []
    got = (document.get("Model"), document.get("Key"), document.get("Request"))
    if got != ("c", world.item["Key"], _request(world, engine=True)):
        problems.append(f"the job's input document is for {got[:2]} with request {got[2]}")
    if list(document.get("Mounts") or {}) != [f"s3://{world.bucket}/{SOURCE_KEY.rsplit('/', 1)[0]}/"]:
        problems.append(f"the job's input document mounts {document.get('Mounts')}; expected c's source folder")
    if recorded_failure(world.direct, item_request(_job_item(world))) is not None:
        problems.append("a failure is recorded after c moved to Processing")
    return problems


def _expected_job_failure(world: World) -> str:
    return failure_reason("c", "States.TaskFailed", json.dumps(world.job_failure))[0]


def _fail_job(world: World) -> None:
    """JobFailed: it fails the item (as the state machine's task must) with the job's reason; any
    other error (an S3 call that failed) is the step failing."""
    try:
        build_step(_job_failed_event(world))
    except HandlerError as error:
        if str(error) == _expected_job_failure(world):
            return
        raise
    raise AssertionError("JobFailed did not fail the item")


def _failure_recorded(world: World) -> list[str]:
    """After JobFailed: the failure record names c and the job's own reason (the build's line
    from its ExitMessage), as ``is_complete`` reads it for CloudFormation."""
    recorded = recorded_failure(world.direct, item_request(_job_item(world)))
    message = str(world.job_failure["ExitMessage"])
    if recorded != _expected_job_failure(world) or message not in recorded or "'c'" not in recorded:
        return [f"the failure record holds {recorded!r}; expected c's job's reason ({message!r})"]
    return []


def _activate_now(world: World) -> None:
    # A client of its own each run, as each handler call makes one: a killed run's process cannot
    # leave pooled connections behind for the next.
    client = make_s3_client(endpoint_url=world.proxy.url)
    activate_release(client, world.bucket, PREFIX, world.props["r2"]["ReleaseId"], stack=STACK)


# ---------------------------------------------------------------------------------------------
# The enumeration
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Call:
    method: str
    target: str
    #: Which occurrence of (method, target) in the step's run (0: the first).
    occurrence: int

    def rule(self, fault: str) -> Rule:
        path = f"^{re.escape(self.target)}$"
        if fault == "error":
            return Rule("error", method=self.method, path=path, after=self.occurrence, status=403,
                        code="AccessDenied", times=10_000)
        return Rule(fault, method=self.method, path=path, after=self.occurrence)  # type: ignore[arg-type]


def _calls(records: list[Record]) -> list[Call]:
    seen: Counter[tuple[str, str]] = Counter()
    calls = []
    for record in records:
        pair = (record.method, record.target)
        calls.append(Call(record.method, record.target, seen[pair]))
        seen[pair] += 1
    return calls


def _writes(records: list[Record]) -> Counter[str]:
    """Objects written (a PUT or a copy that landed with 2xx), by key; the retry of a call whose
    answer was lost (``landed``, ``kill``) is that same call, not counted again. The plan's two
    documents (``_plans/``) and a job's input document (``_jobs/``, OutgrewLambda's) are not
    counted: every attempt writes them again by design (a new attempt clears the failure record;
    the same job input, for the job that starts next), and ``_planned``, ``_failure_recorded`` and
    ``_job_sent`` check what they hold."""
    counts: Counter[str] = Counter()
    lost: set[tuple[str, str]] = set()
    for record in records:
        pair = (record.method, record.target)
        if record.method != "PUT" or f"/{PLANS_DIR}/" in record.target or f"/{JOBS_DIR}/" in record.target:
            continue
        if pair in lost:
            lost.discard(pair)
            continue
        if record.injected in ("landed", "kill"):
            lost.add(pair)
        if record.injected in (None, "landed", "kill") and record.status is not None and 200 <= record.status < 300:
            counts[record.target.split("?")[0].split("/", 2)[2]] += 1  # /<bucket>/<key>: the key
    return counts


def _state(world: World) -> frozenset[tuple[str, str]]:
    return frozenset(_listing(world.direct, world.bucket).items())


def _violations(world: World, step: Step, clean: Any, clean_writes: Counter[str], writes: Counter[str]) -> list[str]:
    key = routes_key(PREFIX)
    live = read_routes(world.direct, world.bucket, PREFIX, stack=STACK)
    found = check_bucket(world.direct, world.bucket, PREFIX, routes=live, stack=STACK, read_bytes=True).violations
    if step.keeps:  # a destroying Delete removes all by design: its own check says what is left
        found += kept_since(world.direct, world.bucket, PREFIX, world.before[step.setup])
    found += serving_difference(clean, live, key=key)
    found += repeated_writes(clean_writes, writes)
    lines = [violation.line(world.bucket) for violation in found]
    return lines + (step.check(world.direct, world.bucket) if step.check else [])


@dataclass
class Tally:
    calls: int = 0
    injected: int = 0
    reran: int = 0
    violations: list[str] = field(default_factory=list)
    #: What the fault-free run did: ``copy`` (into served/), ``delete`` (expired objects),
    #: ``routes`` (the routes PUT); and whether a routes PUT's retry after it landed got 412.
    kinds: set[str] = field(default_factory=set)
    retry_got_412: bool = False


def _enumerate(world: World, step: Step) -> Tally:
    proxy = world.proxy
    _restore(world, step.setup)
    proxy.reset_records()
    step.run()
    clean_records = list(proxy.records)
    calls = _calls(clean_records)
    clean = read_routes(world.direct, world.bucket, PREFIX, stack=STACK)
    clean_writes = _writes(clean_records)
    tally = Tally(calls=len(calls))
    routes_path = f"/{world.bucket}/{routes_key(PREFIX)}"
    for record in clean_records:
        if record.is_copy and "/served/" in record.target:
            tally.kinds.add("copy")
        elif record.method == "POST" and record.target.endswith("?delete"):
            tally.kinds.add("delete")
        elif record.method == "PUT" and record.target == routes_path:
            tally.kinds.add("routes")
        elif record.method == "PUT" and record.target.endswith(".failure.json"):
            tally.kinds.add("failure")  # the plan's "no failure" marker, or a failure recorded
        elif record.method == "PUT" and f"/{PLANS_DIR}/" in record.target:
            tally.kinds.add("plan")
        elif record.method == "PUT" and f"/{JOBS_DIR}/" in record.target:
            tally.kinds.add("job-input")
        elif record.method == "GET" and f"/{JOBS_DIR}/" in record.target:
            tally.kinds.add("job-output")
        elif record.method == "PUT" and f"/{BUILDS_DIR}/" in record.target:
            tally.kinds.add("store")
        elif record.method == "GET" and record.target.startswith(f"/{world.bucket}/{SOURCE_KEY}"):
            tally.kinds.add("source")
    tally.violations += [f"{step.name} without a fault: {line}"
                         for line in _violations(world, step, clean, clean_writes, clean_writes)]
    reached: set[frozenset[tuple[str, str]]] = set()
    for call in calls:
        for fault in FAULTS:
            _restore(world, step.setup)
            proxy.reset_records()
            rule = proxy.add(call.rule(fault))
            try:
                if fault == "kill":  # in a child process, SIGKILLed once the call landed
                    outcome = proxy.run_killable(step.run)
                else:
                    step.run()
            except Exception:  # the step failed (error): it is rerun
                pass
            finally:
                proxy.clear()
                proxy.revive()
            faulted = list(proxy.records)
            tally.injected += 1
            assert rule.hits >= 1, f"{step.name}: {fault} at {call} never met its call: the step's calls changed"
            if fault == "kill":
                tally.violations += _after_the_kill(step, call, outcome)
            if fault == "landed" and call.method == "PUT" and call.target == routes_path:
                tally.retry_got_412 = any(r.target == routes_path and r.status == 412 for r in faulted)
            state = _state(world)
            if state in reached:  # the rerun from here was checked: what the faulted run wrote still is
                tally.violations += [f"{step.name}, {fault} at {call.method} {call.target} #{call.occurrence}: "
                                     f"{v.line(world.bucket)}" for v in repeated_writes(clean_writes, _writes(faulted))]
                continue
            reached.add(state)
            step.run()  # the rerun must succeed: CloudFormation, Step Functions or the user runs it again
            tally.reran += 1
            problems = _violations(world, step, clean, clean_writes, _writes(list(proxy.records)))
            tally.violations += [f"{step.name}, {fault} at {call.method} {call.target} #{call.occurrence}: {line}"
                                 for line in problems]
    return tally


def _after_the_kill(step: Step, call: Call, outcome: str) -> list[str]:
    """A killed run is dead at its call: its process ended by SIGKILL, before the call's answer.
    (Its other threads' calls already read by the proxy land, as in-flight calls would; any sent
    after the kill is refused. That nothing else of it happens, S3 or not, is
    ``test_a_kill_is_a_real_process_kill_nothing_after_the_call_happens``.)"""
    if outcome == "killed":
        return []
    return [f"{step.name}, kill at {call.method} {call.target} #{call.occurrence}: the step's process was not "
            f"killed (it {outcome})"]


#: What each step's fault-free run must do, so that its enumeration fails those calls.
EXERCISES = {"activation": {"delete", "routes"}, "create": {"copy", "routes"}, "update": {"copy", "delete", "routes"},
             "rollback": {"copy", "routes"}, "delete": {"delete"}, "plan": {"plan"}, "build": {"source", "store"},
             "place": {"copy"}, "outgrown": {"job-input"}, "store_job": {"job-output", "store"},
             "job_failed": {"failure"}}
#: The fewest S3 calls each step makes (JobFailed makes one: its failure record); the others 3.
FEWEST_CALLS = {"job_failed": 1}
#: What each step's enumeration counted (the figures of docs/operations.md "What survives what").
TALLIES: dict[str, Tally] = {}


@pytest.mark.slow  # 297 faults through the handlers: 55 to 95 s in all, up to 15 s a step
@pytest.mark.parametrize("name", ["activation", "create", "update", "rollback", "delete", "plan", "build", "place",
                                  "outgrown", "store_job", "job_failed"])
def test_every_s3_call_failing_in_turn_then_a_rerun_leaves_every_invariant_holding(world: World, name: str) -> None:
    step = next(step for step in _steps(world) if step.name == name)
    tally = _enumerate(world, step)
    TALLIES[name] = tally
    print(f"{name}: {tally.calls} calls, {tally.injected} faults injected, {tally.reran} reruns, "
          f"{len(tally.violations)} invariant violations")
    assert tally.calls >= FEWEST_CALLS.get(name, 3), f"{name}: {tally.calls} S3 calls recorded; the proxy sees the step's calls"
    # The calls the issue names are among those failed: a copy into served/, the deletion of what
    # expired (before the routes PUT), and the routes PUT, whose retry after it landed gets 412.
    assert tally.kinds >= EXERCISES[name], f"{name}: the fault-free run did {sorted(tally.kinds)}"
    if "routes" in EXERCISES[name]:
        assert tally.retry_got_412, f"{name}: the routes PUT's retry after it landed did not meet 412"
    assert tally.violations == [], "\n".join(tally.violations[:20])


def test_a_kill_is_a_real_process_kill_nothing_after_the_call_happens(
    proxy: FaultProxy, endpoint: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ``kill`` fault SIGKILLs the step's process once the call landed, before its answer: the
    call's object is there; nothing the step does after it happens, an S3 call, a Step Functions
    StartExecution (what the proxy could not cut off before) or a file written."""
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(name, "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    direct = make_s3_client(endpoint_url=endpoint)
    bucket = f"kill-{uuid.uuid4().hex[:10]}"
    direct.create_bucket(Bucket=bucket)
    states = boto3.client("stepfunctions", endpoint_url=endpoint)
    machine = states.create_state_machine(
        name=f"kill-{uuid.uuid4().hex[:8]}", definition='{"StartAt":"x","States":{"x":{"Type":"Succeed"}}}',
        roleArn="arn:aws:iam::123456789012:role/build")["stateMachineArn"]

    def step(run: str, fail: bool = False) -> Callable[[], None]:
        def steps() -> None:
            client = make_s3_client(endpoint_url=proxy.url)  # the process's own, as a handler makes one
            client.put_object(Bucket=bucket, Key=f"{run}/one", Body=b"1")
            boto3.client("stepfunctions", endpoint_url=endpoint).start_execution(stateMachineArn=machine, input="{}")
            (tmp_path / run).write_text("after the call")
            if fail:
                raise RuntimeError("the step fails after its calls")
            client.put_object(Bucket=bucket, Key=f"{run}/two", Body=b"2")
        return steps

    def executions() -> int:
        return len(states.list_executions(stateMachineArn=machine)["executions"])

    assert proxy.run_killable(step("clean")) == "ok"
    assert proxy.run_killable(step("failing", fail=True)) == "failed"
    assert executions() == 2 and (tmp_path / "clean").exists() and (tmp_path / "failing").exists()
    rule = proxy.add(Rule("kill", method="PUT", path=r"/killed/one$"))
    proxy.reset_records()
    assert proxy.run_killable(step("killed")) == "killed"
    proxy.clear()
    proxy.revive()
    assert rule.hits == 1
    assert direct.get_object(Bucket=bucket, Key="killed/one")["Body"].read() == b"1"  # it landed
    assert sorted(_listing(direct, bucket)) == ["clean/one", "clean/two", "failing/one", "killed/one"]
    assert executions() == 2, "the killed process started an execution after its call"
    assert not (tmp_path / "killed").exists(), "the killed process ran on after its call"
    assert [(r.method, r.target, r.injected) for r in proxy.records] == [("PUT", f"/{bucket}/killed/one", "kill")]
    # A step that never ends is ended at its bound, not waited for.
    with pytest.raises(AssertionError, match=r"still running after 0\.5 s"):
        proxy.run_killable(lambda: time.sleep(60), timeout=0.5)
