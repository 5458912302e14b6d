"""The custom-resource Lambda driven with CloudFormation event documents of each request type.

Everything is real: the build exports a small synthetic ResNet with torch, validates it with
ONNX Runtime and publishes to moto's S3 server over HTTP on loopback. The stack status that
tells a stack deletion from an update clean-up comes from a tiny CloudFormation query endpoint
on loopback.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import pytest
import yaml

from triton_mme_cdk.model_build import handler
from triton_mme_cdk.model_build.aws_clients import make_s3_client
from triton_mme_cdk.model_build.handler import custom_resource
from triton_mme_cdk.model_build.manifest import parse_manifest
from triton_mme_cdk.model_build.release import compute_release
from triton_mme_cdk.model_build.release.index import read_index
from triton_mme_cdk.model_build.tools.local_s3 import local_s3

MANIFEST: dict[str, Any] = {
    "version": 1,
    "models": [
        {
            "name": "tiny-resnet",
            "source": {
                "kind": "synthetic",
                "architecture": "resnet",
                "seed": 0,
                "config": {
                    "embedding_size": 8,
                    "hidden_sizes": [8, 16, 16, 32],
                    "depths": [1, 1, 1, 1],
                    "layer_type": "basic",
                    "num_labels": 4,
                },
            },
            "task": "image-classification",
            "max_batch_size": 4,
            "image": {"image_size": 32, "channels": 3},
            "copies": 3,
        },
        {
            "name": "tiny-resnet-ts",
            "source": {
                "kind": "synthetic",
                "architecture": "resnet",
                "seed": 1,
                "config": {
                    "embedding_size": 8,
                    "hidden_sizes": [8, 16, 16, 32],
                    "depths": [1, 1, 1, 1],
                    "layer_type": "basic",
                    "num_labels": 4,
                },
            },
            "task": "image-classification",
            "format": "torchscript",
            "max_batch_size": 4,
            "image": {"image_size": 32, "channels": 3},
        },
    ],
}
BUCKET = "model-bucket"
ASSETS = "asset-bucket"
STACK_ID = "arn:aws:cloudformation:us-east-1:123456789012:stack/TritonMme/0f0e"


class _CloudFormation(BaseHTTPRequestHandler):
    """Answers DescribeStacks (query protocol) with whatever status the test sets."""

    status = "UPDATE_COMPLETE_CLEANUP_IN_PROGRESS"
    calls = 0

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length", 0))
        form = parse_qs(self.rfile.read(length).decode())
        assert form["Action"] == ["DescribeStacks"], form
        type(self).calls += 1
        body = f"""<DescribeStacksResponse xmlns="http://cloudformation.amazonaws.com/doc/2010-05-15/">
<DescribeStacksResult><Stacks><member><StackId>{STACK_ID}</StackId><StackName>TritonMme</StackName>
<CreationTime>2026-11-01T00:00:00Z</CreationTime><StackStatus>{type(self).status}</StackStatus>
</member></Stacks></DescribeStacksResult></DescribeStacksResponse>""".encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/xml")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def endpoints() -> Iterator[tuple[str, str]]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _CloudFormation)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    with local_s3() as s3_url:
        yield s3_url, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture()
def env(endpoints: tuple[str, str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Any:
    s3_url, cfn_url = endpoints
    monkeypatch.setenv("MODEL_BUILD_S3_ENDPOINT_URL", s3_url)
    monkeypatch.setenv("MODEL_BUILD_CLOUDFORMATION_ENDPOINT_URL", cfn_url)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    s3 = make_s3_client(endpoint_url=s3_url)
    for bucket in (BUCKET, ASSETS):
        with contextlib.suppress(s3.exceptions.BucketAlreadyOwnedByYou):
            s3.create_bucket(Bucket=bucket)
    return s3


def put_manifest(s3: Any, data: dict[str, Any], key: str = "manifest.yaml") -> dict[str, str]:
    """Upload a manifest as the stack's asset would be, and give the resource properties for it."""
    s3.put_object(Bucket=ASSETS, Key=key, Body=yaml.safe_dump(data).encode())
    manifest = parse_manifest(data)
    release = compute_release(manifest)
    return {
        "ServiceToken": "arn:aws:lambda:us-east-1:123456789012:function:provider",
        "ManifestBucket": ASSETS,
        "ManifestKey": key,
        "ManifestSha256": release.manifest_sha256,
        "ModelBucket": BUCKET,
        "ModelPrefix": "models",
        "ReleaseId": release.release_id,
        "CodeSha256": release.code_sha256,
        "OnDelete": "retain",
        "RetiredTagKey": "triton-mme:release-state",
    }


def event(request_type: str, props: dict[str, str], **extra: Any) -> dict[str, Any]:
    """A CloudFormation custom-resource request as the Provider framework passes it on."""
    document: dict[str, Any] = {
        "RequestType": request_type,
        "ServiceToken": props["ServiceToken"],
        "ResponseURL": "https://cloudformation-custom-resource-response-useast1.s3.amazonaws.com/x",
        "StackId": STACK_ID,
        "RequestId": "5d478078-13e9-baf0-464a-7ef285ecc786",
        "LogicalResourceId": "ModelBuildResource",
        "ResourceType": "Custom::TritonModelBuild",
        "ResourceProperties": props,
    }
    document.update(extra)
    return document


class Context:
    """The part of the Lambda context the handler reads: the time left in this run."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def get_remaining_time_in_millis(self) -> int:
        return int(self.seconds * 1000)


def keys(s3: Any, prefix: str) -> set[str]:
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix)
    return {obj["Key"] for page in pages for obj in page.get("Contents", [])}


def tiny(name: str, seed: int, **extra: Any) -> dict[str, Any]:
    """One tiny synthetic ResNet entry (seconds to build)."""
    entry = json.loads(json.dumps(MANIFEST["models"][0]))  # a deep copy: no YAML anchors
    entry["source"]["seed"] = seed
    return {**entry, "name": name, "copies": 1, **extra}


def served(s3: Any) -> dict[str, str]:
    """The served prefix: object name -> its sha256 metadata."""
    return {key.rsplit("/", 1)[1]: s3.head_object(Bucket=BUCKET, Key=key)["Metadata"]["sha256"]
            for key in keys(s3, "models/served/")}


def routes_of(s3: Any) -> dict[str, Any]:
    return json.loads(s3.get_object(Bucket=BUCKET, Key="models/_routes/routes.json")["Body"].read())


@pytest.fixture()
def counted(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The models the handler builds (the real build, counted)."""
    built: list[str] = []
    real = custom_resource.build_and_store

    def build_and_count(s3: Any, request: Any, spec: Any, key: str) -> None:
        built.append(spec.name)
        real(s3, request, spec, key)

    monkeypatch.setattr(custom_resource, "build_and_store", build_and_count)  # where is_complete looks it up
    return built


def deploy(kind: str, props: dict[str, str], old: dict[str, str] | None = None) -> dict[str, Any]:
    """on_event then is_complete, as the Provider runs them for one request."""
    extra: dict[str, Any] = {"PhysicalResourceId": f"s3://{BUCKET}/models/served/"} if kind != "Create" else {}
    if old is not None:
        extra["OldResourceProperties"] = old
    started = handler.on_event(event(kind, props, **extra))
    assert started == {"PhysicalResourceId": f"s3://{BUCKET}/models/served/"}, "one physical id for every release"
    extra["PhysicalResourceId"] = started["PhysicalResourceId"]
    done = handler.is_complete(event(kind, props, **extra), Context(seconds=900))
    assert done["IsComplete"] is True
    return done


@pytest.mark.slow
def test_create_update_rollback_delete_keep_one_fleet_prefix(env: Any, counted: list[str]) -> None:
    """Create -> Update (one model added, one changed, one removed) -> rollback -> Delete, with
    the builds, the served objects and the routes counted at each step."""
    s3 = env
    base = {"version": 1, "models": [tiny("keep", 0, copies=2), tiny("change", 1), tiny("drop", 2)]}
    props = put_manifest(s3, base, key="lifecycle-1.yaml")
    created = deploy("Create", props)
    assert created["Data"] == {
        "ModelDataUrl": f"s3://{BUCKET}/models/served/",
        "RoutesKey": "models/_routes/routes.json",
        "IndexKey": f"models/_releases/{props['ReleaseId']}/_index.json",
        "ModelCount": "4",
        "ReleaseId": props["ReleaseId"],
    }
    assert len(json.dumps(created)) < 4096
    assert sorted(counted) == ["change", "drop", "keep"]
    first = served(s3)
    routes = routes_of(s3)
    assert routes["release_id"] == props["ReleaseId"] and routes["stack"] == STACK_ID
    assert sorted(routes["routes"]) == ["change", "drop", "keep-0", "keep-1"]
    for logical, route in routes["routes"].items():
        assert route["target_model"] == f"{logical}-{route['sha256'][:12]}.tar.gz"
        assert first[route["target_model"]] == route["sha256"]
    assert set(first) == {route["target_model"] for route in routes["routes"].values()}, "tarballs only"

    # One added, one changed, one removed: two builds, two new served objects, nothing else touched.
    counted.clear()
    stored_before = keys(s3, "models/_builds/")
    update = {"version": 1, "models": [tiny("keep", 0, copies=2), tiny("change", 5), tiny("add", 3)]}
    new_props = put_manifest(s3, update, key="lifecycle-2.yaml")
    deploy("Update", new_props, old=props)
    assert sorted(counted) == ["add", "change"]
    uploaded = {key.split("/")[2] for key in keys(s3, "models/_builds/") - stored_before}
    assert len(uploaded) == 2, "two builds uploaded to the store, nothing else"
    second = served(s3)
    new_routes = routes_of(s3)
    assert new_routes["release_id"] == new_props["ReleaseId"]
    assert sorted(new_routes["routes"]) == ["add", "change", "keep-0", "keep-1"]
    for name in ("keep-0", "keep-1"):
        assert new_routes["routes"][name] == routes["routes"][name], "an unchanged model keeps its name"
    assert new_routes["routes"]["change"]["target_model"] != routes["routes"]["change"]["target_model"]
    assert set(second) - set(first) == {new_routes["routes"][n]["target_model"] for n in ("add", "change")}
    assert {k: v for k, v in second.items() if k in first} == first, "no served name got other bytes"
    # Unrouted at once, kept for the retention window so that a rollback needs no upload.
    assert set(new_routes["unrouted"]) == {routes["routes"][n]["target_model"] for n in ("change", "drop")}

    # Rollback: CloudFormation sends an Update with the old properties: zero builds, zero copies.
    counted.clear()
    before = {key: s3.head_object(Bucket=BUCKET, Key=key)["LastModified"] for key in keys(s3, "models/served/")}
    deploy("Update", props, old=new_props)
    assert counted == []
    after = {key: s3.head_object(Bucket=BUCKET, Key=key)["LastModified"] for key in keys(s3, "models/served/")}
    assert after == before, "nothing uploaded or copied"
    rolled = routes_of(s3)
    assert rolled["release_id"] == props["ReleaseId"] and rolled["routes"] == routes["routes"]
    assert set(rolled["unrouted"]) == {new_routes["routes"][n]["target_model"] for n in ("add", "change")}

    # A failed update (a model that fails its validation) leaves the previous routes serving.
    broken = {"version": 1, "models": [tiny("keep", 0, copies=2),
                                       tiny("strict", 9, fp16=True, tolerance={"atol": 0.0, "rtol": 0.0})]}
    broken_props = put_manifest(s3, broken, key="lifecycle-3.yaml")
    routes_body = s3.get_object(Bucket=BUCKET, Key="models/_routes/routes.json")["Body"].read()
    with pytest.raises(handler.HandlerError, match="validation of model 'strict' failed"):
        deploy("Update", broken_props, old=props)
    assert s3.get_object(Bucket=BUCKET, Key="models/_routes/routes.json")["Body"].read() == routes_body
    assert served(s3) == second, "nothing served changed"

    # A Delete while the stack lives (a replaced resource, an update's rollback) deletes nothing.
    _CloudFormation.status = "UPDATE_ROLLBACK_COMPLETE_CLEANUP_IN_PROGRESS"
    physical = f"s3://{BUCKET}/models/served/"
    assert handler.is_complete(event("Delete", props, PhysicalResourceId=physical)) == {"IsComplete": True}
    assert served(s3) == second
    # The per-release resource of an earlier version of the stack: its prefix is left for rollback.
    s3.put_object(Bucket=BUCKET, Key="models/r-0123456789abcdef/old.tar.gz", Body=b"old")
    handler.is_complete(event("Delete", props, PhysicalResourceId=f"s3://{BUCKET}/models/r-0123456789abcdef/"))
    assert keys(s3, "models/r-0123456789abcdef/") == {"models/r-0123456789abcdef/old.tar.gz"}
    # Stack deletion with OnDelete=retain keeps everything; destroy removes the served objects.
    _CloudFormation.status = "DELETE_IN_PROGRESS"
    assert handler.is_complete(event("Delete", props, PhysicalResourceId=physical)) == {"IsComplete": True}
    assert served(s3) == second
    handler.is_complete(event("Delete", dict(props, OnDelete="destroy"), PhysicalResourceId=physical))
    assert keys(s3, "models/served/") == set() and keys(s3, "models/_routes/") == set()
    assert keys(s3, "models/_builds/"), "the store of builds stays"
    _CloudFormation.status = "UPDATE_COMPLETE_CLEANUP_IN_PROGRESS"


@pytest.mark.slow
def test_create_builds_in_several_runs(env: Any) -> None:
    s3 = env
    props = put_manifest(s3, MANIFEST)
    created = handler.on_event(event("Create", props))
    # A run with no time left beyond its safety margin builds one model (a run always makes
    # progress), then hands over to the next call.
    first = handler.is_complete(event("Create", props, PhysicalResourceId=created["PhysicalResourceId"]),
                                Context(seconds=custom_resource.SAFETY_MARGIN_SECONDS))
    assert first == {"IsComplete": False}
    index_key = f"models/_releases/{props['ReleaseId']}/_index.json"
    assert read_index(s3, BUCKET, index_key) is None, "no index before every model is in"
    model_keys = compute_release(parse_manifest(MANIFEST)).model_keys
    stored = keys(s3, "models/_builds/")
    assert f"models/_builds/{model_keys['tiny-resnet']}/_index.json" in stored
    assert not any(key.startswith(f"models/_builds/{model_keys['tiny-resnet-ts']}/") for key in stored)
    second = handler.is_complete(event("Create", props, PhysicalResourceId=created["PhysicalResourceId"]),
                                 Context(seconds=900))
    assert second["IsComplete"] is True and second["Data"]["ModelCount"] == "4"
    index = read_index(s3, BUCKET, index_key)
    assert index is not None
    assert [m["logical_name"] for m in index["models"]] == ["tiny-resnet-0", "tiny-resnet-1", "tiny-resnet-2",
                                                            "tiny-resnet-ts"]
    assert {m["format"] for m in index["models"]} == {"onnx", "torchscript"}
    assert len({m["sha256"] for m in index["models"] if m["source_model"] == "tiny-resnet"}) == 1
    ref_keys = {r["key"] for r in index["references"]}
    assert f"models/_builds/{model_keys['tiny-resnet']}/_reference/tiny-resnet.npz" in ref_keys, "not copied"
    # The same request again (an Update with nothing changed) does no work and writes nothing.
    before = s3.head_object(Bucket=BUCKET, Key="models/_routes/routes.json")["LastModified"]
    again = handler.is_complete(event("Update", props, PhysicalResourceId=created["PhysicalResourceId"],
                                      OldResourceProperties=props), Context(seconds=900))
    assert again == second
    assert s3.head_object(Bucket=BUCKET, Key="models/_routes/routes.json")["LastModified"] == before


def test_manifest_that_does_not_match_the_template_fails_on_event(env: Any) -> None:
    props = put_manifest(env, MANIFEST, key="manifest-x.yaml")
    props["ManifestSha256"] = "0" * 64
    with pytest.raises(handler.HandlerError) as caught:
        handler.on_event(event("Create", props))
    reason = str(caught.value)
    assert reason.startswith("manifest validation failed: manifest: content sha256")
    assert "Traceback" not in reason and len(reason) <= 400


def test_bad_manifest_in_the_asset_names_the_field(env: Any) -> None:
    bad = json.loads(json.dumps(MANIFEST))
    env.put_object(Bucket=ASSETS, Key="bad.yaml", Body=b"")
    props = put_manifest(env, MANIFEST, key="bad.yaml")
    bad["models"][0]["max_batch_size"] = -1
    env.put_object(Bucket=ASSETS, Key="bad.yaml", Body=yaml.safe_dump(bad).encode())
    with pytest.raises(handler.HandlerError) as caught:
        handler.on_event(event("Create", props))
    assert "models[0](tiny-resnet).max_batch_size: got -1" in str(caught.value)


@pytest.mark.parametrize(
    ("name", "value", "expected"),
    [
        ("ReleaseId", "latest", "property ReleaseId: got 'latest'; expected r- and 16 hex digits"),
        ("OnDelete", "snapshot", "property OnDelete: got 'snapshot'; expected one of retain, destroy"),
        ("ModelBucket", "", "property ModelBucket: got ''; expected a non-empty string"),
        ("Deployed", "{\"schema\": \"other\"}",
         "deployed record property Deployed: schema 'other'; expected 'triton-mme/deployed/1'"),
        ("Deployed", "{", "deployed record property Deployed: not valid JSON"),
    ],
)
def test_bad_properties_are_refused_with_the_property_named(
    env: Any, name: str, value: str, expected: str
) -> None:
    props = put_manifest(env, MANIFEST, key="manifest-p.yaml")
    props[name] = value
    with pytest.raises(handler.HandlerError, match=expected):
        handler.on_event(event("Create", props))


@pytest.mark.slow
def test_a_model_that_fails_validation_reaches_cloudformation_as_a_short_reason(env: Any) -> None:
    strict = json.loads(json.dumps(MANIFEST))
    strict["models"] = [dict(strict["models"][0], name="strict-fp16", fp16=True, copies=1,
                             tolerance={"atol": 0.0, "rtol": 0.0})]
    props = put_manifest(env, strict, key="manifest-strict.yaml")
    physical = handler.on_event(event("Create", props))["PhysicalResourceId"]
    with pytest.raises(handler.HandlerError) as caught:
        handler.is_complete(event("Create", props, PhysicalResourceId=physical), Context(seconds=900))
    reason = str(caught.value)
    assert reason.startswith("validation of model 'strict-fp16' failed:")
    assert "logits" in reason and len(reason) <= 400
    assert read_index(env, BUCKET, f"models/_releases/{props['ReleaseId']}/_index.json") is None


def test_delete_of_a_create_that_never_named_a_release_does_nothing(env: Any) -> None:
    props = put_manifest(env, MANIFEST, key="manifest-d.yaml")
    calls = _CloudFormation.calls
    assert handler.on_event(event("Delete", props, PhysicalResourceId="req-123")) == {"PhysicalResourceId": "req-123"}
    assert handler.is_complete(event("Delete", props, PhysicalResourceId="req-123")) == {"IsComplete": True}
    assert _CloudFormation.calls == calls, "no stack lookup and no S3 change for a foreign id"
