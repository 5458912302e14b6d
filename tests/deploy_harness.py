"""What the deploy-path tests share: synthesized templates per manifest and settings, the local
AWS (moto in this process, its Step Functions executing), CloudFormation's request documents.

See ``tests/cfn_local.py`` (the template's resources in moto), ``tests/local_lambda.py`` (the
functions behind moto's Invoke API) and ``tests/asl_moto.py`` (the States Language interpreter).
"""

from __future__ import annotations

import copy
import json
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from asl_moto import Waits, aws_semantics, wait_for
from cdk_helpers import synth
from cfn_local import REGION, STACK_ID, LocalDeployment, Template
from local_lambda import LocalLambda

BUILD_STEP = "triton_mme_cdk.model_build.handler.build_step"
PLACE_STEP = "triton_mme_cdk.model_build.handler.place_step"
ON_EVENT = "triton_mme_cdk.model_build.handler.on_event"
IS_COMPLETE = "triton_mme_cdk.model_build.handler.is_complete"
RESOURCE_TYPE = "Custom::TritonModelRelease"

#: Functions' timeouts are enforced at this share of the template's (900 s: 45 s). Not the retry
#: waits' 0.01: a wait is only time and scales exactly, but a run is real work (imports, a torch
#: export, a node start) that does not shrink, and 9 s would end real builds on a loaded 2-core
#: machine (the Processing tests found the same of MaxRuntime at 0.01: JOB_TIME_SCALE). The
#: timeout tests scale it down further, with builds held past it.
LAMBDA_TIME_SCALE = 0.05

TINY = {
    "kind": "synthetic",
    "architecture": "resnet",
    "config": {"embedding_size": 8, "hidden_sizes": [8, 8, 8, 8], "depths": [1, 1, 1, 1],
               "layer_type": "basic", "num_labels": 4},
}


def tiny_manifest(count: int, *, broken: tuple[str, ...] = (), changed: int | None = None) -> dict[str, Any]:
    """``count`` tiny synthetic ResNets (a real build takes about 0.1 s each), the first with two
    copies and the second in TorchScript; ``broken`` adds entries whose S3 source does not exist;
    ``changed`` doubles that entry's batch size (a new key for it alone)."""
    models: list[dict[str, Any]] = []
    for index in range(count):
        models.append({
            "name": f"unit-{index:02d}",
            "source": dict(copy.deepcopy(TINY), seed=index),
            "task": "image-classification",
            "format": "torchscript" if index == 1 else "onnx",
            "max_batch_size": 4 if index == changed else 2,
            "image": {"image_size": 32, "channels": 3},
            "copies": 2 if index == 0 else 1,
        })
    for name in broken:
        models.append({"name": name, "source": {"kind": "s3", "uri": f"s3://no-such-source-{name}/x/"},
                       "task": "feature-extraction", "max_batch_size": 2})
    return {"version": 1, "models": models}


def scale_manifest(path: Path, count: int) -> Path:
    """``count`` small synthetic ResNets with names of a realistic length (30 characters), written
    as a manifest file (what a platform team's catalogue of several thousand models looks like)."""
    models = [{
        "name": f"resnet-image-classifier-{index:05d}",
        "source": dict(copy.deepcopy(TINY), seed=index),
        "task": "image-classification",
        "max_batch_size": 2,
        "image": {"image_size": 32, "channels": 3},
    } for index in range(count)]
    # The C dumper where libyaml is installed: the pure-Python one takes 4 s for 3,000 entries.
    dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
    path.write_text(yaml.dump({"version": 1, "models": models}, Dumper=dumper, sort_keys=False), encoding="utf-8")
    return path


class Templates:
    """Synthesized templates, one per (manifest, settings), synthesized once per test module."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._cache: dict[str, Template] = {}

    def get(self, manifest: dict[str, Any] | Path | None = None, **settings: Any) -> Template:
        if manifest is None:
            key = json.dumps({"default": True, **settings}, sort_keys=True)
        elif isinstance(manifest, Path):
            key = json.dumps({"path": str(manifest), **settings}, sort_keys=True)
        else:
            key = json.dumps({"manifest": manifest, **settings}, sort_keys=True)
        if key not in self._cache:
            folder = self.root / f"t{len(self._cache)}"
            folder.mkdir(parents=True)
            if isinstance(manifest, dict):
                path = folder / "models.yaml"
                path.write_text(yaml.safe_dump(manifest, sort_keys=False))
                manifest_path: Path | str = path
            else:
                manifest_path = "default" if manifest is None else manifest
            synthesized = synth(folder / "cdk.out", nag=False, manifest_path=manifest_path, **settings)
            self._cache[key] = Template(synthesized.data, synthesized.outdir)
        return self._cache[key]


@dataclass
class LocalAws:
    """moto in this process (Step Functions executing), with the local Lambda runtime behind it."""

    runtime: LocalLambda
    waits: Waits

    def deploy(self, template: Template) -> LocalDeployment:
        return LocalDeployment(template, self.runtime).deploy()


@contextmanager
def local_aws(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, *, time_scale: float = 0.01,
              lambda_time_scale: float = LAMBDA_TIME_SCALE,
              node_environment: dict[str, str] | None = None) -> Iterator[LocalAws]:
    """A fresh moto for one test: the handlers use AWS's default endpoints, which moto intercepts.
    Retry waits run ``time_scale`` times as long, functions' timeouts ``lambda_time_scale`` times."""
    import logging

    from moto import mock_aws

    # The interpreter logs every failed state with its whole parse tree; the tests read the outcome.
    logging.getLogger("moto.stepfunctions.parser").setLevel(logging.CRITICAL)
    for name in ("MODEL_BUILD_S3_ENDPOINT_URL", "MODEL_BUILD_STATES_ENDPOINT_URL",
                 "MODEL_BUILD_CLOUDFORMATION_ENDPOINT_URL", "AWS_PROFILE", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    runtime = LocalLambda(node_environment=dict(node_environment or {}), time_scale=lambda_time_scale)
    with mock_aws(config={"stepfunctions": {"execute_state_machine": True}}), runtime.installed(), \
            aws_semantics(time_scale=time_scale) as waits:
        try:
            yield LocalAws(runtime, waits)
        finally:  # no handler outlives moto: a held one is released, a late one ends here
            runtime.release_all()
            runtime.settle(120)


def cfn_request(kind: str, properties: dict[str, Any], *, response_url: str = "https://localhost/response",
                physical_id: str | None = None, old: dict[str, Any] | None = None) -> dict[str, Any]:
    """A custom-resource request document as CloudFormation sends it to the ServiceToken."""
    request: dict[str, Any] = {
        "RequestType": kind,
        "ServiceToken": properties["ServiceToken"],
        "ResponseURL": response_url,
        "StackId": STACK_ID,
        "RequestId": str(uuid.uuid4()),
        "LogicalResourceId": "ModelBuildE2D089A7",
        "ResourceType": RESOURCE_TYPE,
        "ResourceProperties": properties,
    }
    if physical_id is not None:
        request["PhysicalResourceId"] = physical_id
    if old is not None:
        request["OldResourceProperties"] = old
    return request


class S3CallsByFunction:
    """Every S3 call of the handlers, with the function it was made for: a function's clients are
    made while it runs (``s3_client()`` at the start of each handler), so each client is tagged
    with the function running on its thread then, and its calls (pool threads included) with it."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, runtime: LocalLambda) -> None:
        import triton_mme_cdk.model_build.aws_clients as aws_clients

        self.runtime = runtime
        self.calls: list[tuple[str | None, str, dict[str, Any]]] = []
        self._running = threading.local()
        real_run, real_make = self.runtime._run_python, aws_clients.make_s3_client

        def run(function: Any, event: dict[str, Any], **kwargs: Any) -> Any:
            self._running.name = function.name
            try:
                return real_run(function, event, **kwargs)
            finally:
                self._running.name = None

        def make(**kwargs: Any) -> Any:
            client = real_make(**kwargs)
            owner = getattr(self._running, "name", None)
            client.meta.events.register("provide-client-params.s3.*",
                                        lambda params, model, **_: self.calls.append((owner, model.name, dict(params))))
            return client

        monkeypatch.setattr(self.runtime, "_run_python", run)
        monkeypatch.setattr(aws_clients, "make_s3_client", make)

    @contextmanager
    def running(self, handler_path: str) -> Iterator[None]:
        """A handler the test calls itself (the provider framework's calls), as its function."""
        self._running.name = self.runtime.function(handler_path).name
        try:
            yield
        finally:
            self._running.name = None


def function_roles(deployment: LocalDeployment) -> dict[str, str]:
    """``function name -> role logical id`` of every function of the template."""
    template = deployment.template
    return {deployment.resolver.ref(logical_id): function["Properties"]["Role"]["Fn::GetAtt"][0]
            for logical_id, function in template.of_type("AWS::Lambda::Function").items()}


def start_build(deployment: Any, kind: str = "Create", *, old: dict[str, Any] | None = None,
                timeout: float = 300) -> tuple[Any, Any, Any]:
    """CloudFormation's ``kind`` request to the deployment's custom resource through ``on_event``,
    and the build execution it started, waited for (None when it started none: a rollback to a
    release already built)."""
    from triton_mme_cdk.model_build import handler

    props = deployment.custom_resource_properties()
    physical = f"s3://{props['ModelBucket']}/models/served/"
    request = cfn_request(kind, props, physical_id=None if kind == "Create" else physical, old=old)
    started = handler.on_event(request)
    if "Data" not in started:
        return request, started, None
    return request, started, wait_for(deployment.states, started["Data"]["BuildExecutionArn"], timeout)
