"""A route names only the object its digest names (issue 49, point 4): ``RouteResolver``, the
activation and the smoke client refuse a ``target_model`` that is not
``<name>-<sha256[:12]>.tar.gz`` of the route's own sha256, in one line naming the route; placing
and activation compare each served object with S3's own SHA-256 checksum, not only the metadata
its writer set. Against moto's server on loopback (S3, and SageMaker for the smoke client)."""

from __future__ import annotations

import hashlib
import json
import uuid
from pathlib import Path
from typing import Any

import boto3
import pytest

from triton_mme_cdk.model_build.aws_clients import make_s3_client
from triton_mme_cdk.model_build.errors import PublishError
from triton_mme_cdk.model_build.release import Release, routes_key
from triton_mme_cdk.model_build.release.routes import RoutesError, served_name, target_problem
from triton_mme_cdk.model_build.release.serving import activate_release
from triton_mme_cdk.model_build.release.store import (
    ReleaseTarget,
    StoredModel,
    assemble_release,
    publish_unit,
)
from triton_mme_cdk.model_build.types import Artifact
from triton_mme_client import RouteResolver
from triton_mme_client import errors as client_errors

PREFIX = "models"


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture(scope="module")
def s3(endpoint: str) -> Any:
    """A client of the module's local S3 endpoint (tests/conftest.py)."""
    return make_s3_client(endpoint_url=endpoint)


@pytest.fixture()
def bucket(s3: Any) -> str:
    name = f"routes-{uuid.uuid4().hex[:12]}"
    s3.create_bucket(Bucket=name)
    return name


def _release(s3: Any, bucket: str, tmp: Path, models: dict[str, bytes], release_id: str) -> Release:
    """Store each model, place the release in the served prefix and write its index (no routing)."""
    stored = []
    for name, payload in models.items():
        tmp.mkdir(parents=True, exist_ok=True)
        path = tmp / f"{name}-{_sha(payload)[:8]}.tar.gz"
        path.write_bytes(payload)
        artifact = Artifact(name=name, format="onnx", path=path, sha256=_sha(payload), size=len(payload),
                            targets=(name,))
        key = "k-" + artifact.sha256[:32]
        publish_unit(artifact, key, s3_client=s3, bucket=bucket, model_prefix=PREFIX)
        stored.append(StoredModel(name, key, (name,), "onnx", entry_sha256=f"e-{name}"))
    release = Release(release_id, "0" * 64, "c" * 64)
    assemble_release(stored, ReleaseTarget.of(release, s3, bucket, PREFIX))
    return release


def _edit_json(s3: Any, bucket: str, key: str, edit: Any) -> None:
    document = json.loads(s3.get_object(Bucket=bucket, Key=key)["Body"].read())
    edit(document)
    s3.put_object(Bucket=bucket, Key=key, Body=json.dumps(document).encode())


SHA = _sha(b"A1")


@pytest.mark.parametrize(("name", "target", "sha256", "expected"), [
    ("a", served_name("a", SHA), SHA, None),
    ("a", served_name("b", SHA), SHA, "is not 'a-"),  # another route's name
    ("a", served_name("a", _sha(b"other")), SHA, "is not 'a-"),  # another digest's name
    ("a", "a.tar.gz", SHA, "is not 'a-"),  # the earlier per-release name
    ("a", f"../_routes/{served_name('a', SHA)}", SHA, "is not 'a-"),
    ("a", served_name("a", SHA), SHA.upper(), "not 64 lowercase hex"),
    ("a", served_name("a", SHA), "", "not 64 lowercase hex"),
])
def test_a_target_is_the_content_name_of_its_routes_digest(name: str, target: str, sha256: str,
                                                            expected: str | None) -> None:
    problem = target_problem(name, target, sha256)
    if expected is None:
        assert problem is None
    else:
        assert problem is not None and expected in problem and problem.startswith(f"route {name!r}: ")
        assert "\n" not in problem


def test_the_resolver_never_returns_a_target_that_is_not_its_digests_name(s3: Any, bucket: str, tmp_path: Path) -> None:
    _release(s3, bucket, tmp_path, {"a": b"A1", "b": b"B1"}, "r-000000000000000a")
    activate_release(s3, bucket, PREFIX, "r-000000000000000a")
    # Whoever writes the routes points 'a' at b's object (a name alone would pass any listing).
    _edit_json(s3, bucket, routes_key(PREFIX),
               lambda doc: doc["routes"]["a"].update(target_model=served_name("b", _sha(b"B1"))))
    resolver = RouteResolver(s3, bucket, routes_key(PREFIX), refresh_seconds=3600)
    with pytest.raises(client_errors.RoutesError) as refused:
        resolver.target_model("a")
    message = str(refused.value)
    assert "\n" not in message and "route 'a'" in message and routes_key(PREFIX) in message
    assert refused.value.model == "a"
    assert resolver.target_model("b") == served_name("b", _sha(b"B1")), "the other routes still resolve"


def test_activation_refuses_an_index_whose_target_is_not_its_digests_name(s3: Any, bucket: str, tmp_path: Path) -> None:
    release = _release(s3, bucket, tmp_path, {"a": b"A1"}, "r-000000000000000a")
    index_key = release.index_key(PREFIX)
    _edit_json(s3, bucket, index_key, lambda doc: doc["models"][0].update(target_model="a.tar.gz"))
    with pytest.raises(RoutesError) as refused:
        activate_release(s3, bucket, PREFIX, "r-000000000000000a")
    assert "route 'a'" in str(refused.value) and "nothing was routed" in str(refused.value)
    assert "Contents" not in s3.list_objects_v2(Bucket=bucket, Prefix=routes_key(PREFIX)), "no routes written"


def test_activation_compares_s3s_checksum_not_the_writers_metadata(s3: Any, bucket: str, tmp_path: Path) -> None:
    _release(s3, bucket, tmp_path, {"a": b"A1"}, "r-000000000000000a")
    key = f"{PREFIX}/served/{served_name('a', SHA)}"
    # Other bytes of the same size, with the metadata of the right ones and no checksum.
    s3.put_object(Bucket=bucket, Key=key, Body=b"XX", Metadata={"sha256": SHA})
    with pytest.raises(RoutesError) as refused:
        activate_release(s3, bucket, PREFIX, "r-000000000000000a")
    assert "S3 checksum none" in str(refused.value) and "'a'" in str(refused.value)
    # The same bytes S3 checksums itself pass.
    s3.copy_object(Bucket=bucket, Key=key, CopySource={"Bucket": bucket, "Key": key}, Metadata={"sha256": SHA},
                   MetadataDirective="REPLACE", ChecksumAlgorithm="SHA256")
    with pytest.raises(RoutesError, match="S3 checksum "):
        activate_release(s3, bucket, PREFIX, "r-000000000000000a")  # S3's checksum is of b"XX"


def test_placing_refuses_a_served_name_whose_checksum_is_not_its_digest(s3: Any, bucket: str, tmp_path: Path) -> None:
    key = f"{PREFIX}/served/{served_name('a', SHA)}"
    s3.put_object(Bucket=bucket, Key=key, Body=b"XX", Metadata={"sha256": SHA})
    with pytest.raises(PublishError) as refused:
        _release(s3, bucket, tmp_path, {"a": b"A1"}, "r-000000000000000a")
    assert refused.value.model == "a"
    assert s3.get_object(Bucket=bucket, Key=key)["Body"].read() == b"XX", "nothing overwritten"


def test_the_smoke_client_refuses_a_target_that_is_not_its_digests_name(
        endpoint: str, s3: Any, bucket: str, tmp_path: Path) -> None:
    from triton_mme_cdk.model_build.tools.smoke.runner import run_smoke

    release = _release(s3, bucket, tmp_path, {"a": b"A1"}, "r-000000000000000a")
    activate_release(s3, bucket, PREFIX, "r-000000000000000a")
    _edit_json(s3, bucket, release.index_key(PREFIX),
               lambda doc: doc["models"][0].update(target_model=served_name("a", _sha(b"other"))))
    options = {"endpoint_url": endpoint, "region_name": "us-east-1", "aws_access_key_id": "testing",
               "aws_secret_access_key": "testing"}
    sagemaker = boto3.client("sagemaker", **options)
    name = f"smoke-{uuid.uuid4().hex[:8]}"
    sagemaker.create_model(ModelName=name, ExecutionRoleArn="arn:aws:iam::123456789012:role/r", PrimaryContainer={
        "Image": "123456789012.dkr.ecr.us-east-1.amazonaws.com/triton:1", "Mode": "MultiModel",
        "ModelDataUrl": f"s3://{bucket}/{PREFIX}/served/"})
    sagemaker.create_endpoint_config(EndpointConfigName=name, ProductionVariants=[{
        "VariantName": "AllTraffic", "ModelName": name, "InstanceType": "ml.g4dn.xlarge", "InitialInstanceCount": 1}])
    sagemaker.create_endpoint(EndpointName=name, EndpointConfigName=name)
    runtime = boto3.client("sagemaker-runtime", **options)
    report = run_smoke(endpoint_name=name, sagemaker_client=sagemaker, runtime_client=runtime, s3_client=s3)
    (row,) = report.rows
    assert not row.ok and row.kind == "route" and "route 'a'" in str(row.error) and row.cold_ms is None
