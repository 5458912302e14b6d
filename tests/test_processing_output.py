"""A Processing job's output is untrusted until the Lambda has checked it (issue 49, point 4):
its ``artifact.json`` names only files the job left in its own output folder, of its own model
and key; its tarball passes the pre-publish gate again before it is stored; and the Lambda reads
the unit from the model's own job folder whatever the plan document says. Against moto's server
on loopback; the happy path (a real job's unit stored) is tests/test_deploy_path_processing.py's."""

from __future__ import annotations

import hashlib
import json
import uuid
from typing import Any

import pytest
from tar_helpers import tar_gz  # tests/ is on sys.path

from triton_mme_cdk.model_build.aws_clients import make_s3_client
from triton_mme_cdk.model_build.errors import ModelBuildError
from triton_mme_cdk.model_build.handler.processing import ARTIFACT_FILE, job_prefix, store_unit

PREFIX = "models"
RELEASE = "r-0123456789abcdef"
KEY = "k-" + "a" * 32


@pytest.fixture(scope="module")
def s3(endpoint: str) -> Any:
    """A client of the module's local S3 endpoint (tests/conftest.py)."""
    return make_s3_client(endpoint_url=endpoint)


@pytest.fixture()
def bucket(s3: Any) -> str:
    name = f"jobs-{uuid.uuid4().hex[:12]}"
    s3.create_bucket(Bucket=name)
    return name


def _job_output(s3: Any, bucket: str, model: str, files: dict[str, bytes], **described: Any) -> str:
    """Leave ``files`` and an ``artifact.json`` (the unit's own fields, overridden by ``described``)
    where the job of ``model`` leaves its unit; returns the output URI."""
    folder = f"{job_prefix(PREFIX, RELEASE, model)}/output/"
    tarball = files.get("model.tar.gz", b"")
    document = {"key": KEY, "name": model, "format": "onnx", "tarball": "model.tar.gz",
                "sha256": hashlib.sha256(tarball).hexdigest(), "size": len(tarball), "targets": [model],
                "reference": None, "config": None, **described}
    for name, data in {**files, ARTIFACT_FILE: json.dumps(document).encode()}.items():
        s3.put_object(Bucket=bucket, Key=folder + name, Body=data)
    return f"s3://{bucket}/{folder}"


def _stored(s3: Any, bucket: str) -> list[str]:
    return [item["Key"] for item in s3.list_objects_v2(Bucket=bucket, Prefix=f"{PREFIX}/_builds/").get("Contents", [])]


@pytest.mark.parametrize(("described", "expected"), [
    ({"tarball": "../../../etc/passwd"}, "tarball '../../../etc/passwd' is not a file the job left"),
    ({"tarball": "/etc/passwd"}, "tarball '/etc/passwd' is not a file the job left"),
    ({"tarball": "sub/model.tar.gz"}, "tarball 'sub/model.tar.gz' is not a file the job left"),
    ({"tarball": "missing.tar.gz"}, "tarball 'missing.tar.gz' is not a file the job left"),
    ({"tarball": ARTIFACT_FILE}, f"tarball '{ARTIFACT_FILE}' is not a file the job left"),
    ({"tarball": None}, "tarball missing"),
    ({"reference": "../other-model/output/reference.npz"}, "reference '../other-model/output/reference.npz'"),
    ({"config": "/var/task/config.pbtxt"}, "config '/var/task/config.pbtxt'"),
    ({"name": "other"}, "name 'other', not 'bert'"),
    ({"key": "k-" + "b" * 32}, "key 'k-bbbb"),
])
def test_an_artifact_json_that_reaches_outside_its_folder_is_refused(
        s3: Any, bucket: str, described: dict[str, Any], expected: str) -> None:
    files = {"model.tar.gz": tar_gz({"bert/config.pbtxt": b'name: "bert"'}),
             "sub/model.tar.gz": b"nested"}
    output = _job_output(s3, bucket, "bert", files, **described)
    with pytest.raises(ModelBuildError) as refused:
        store_unit(s3, bucket=bucket, model_prefix=PREFIX, output_uri=output, model="bert", key=KEY)
    message = str(refused.value)
    assert expected in message and "\n" not in message and "nothing was stored" in message, message
    assert refused.value.model == "bert"
    assert _stored(s3, bucket) == []


def test_a_jobs_tarball_passes_the_gate_again_before_it_is_stored(s3: Any, bucket: str) -> None:
    # A tarball the job's own gate would have refused (no config, no version folder), with a
    # digest and size that match: only the gate run by the Lambda stops it.
    files = {"model.tar.gz": tar_gz({"bert/model.py": b"import os; os.system('id')\n"})}
    output = _job_output(s3, bucket, "bert", files)
    with pytest.raises(ModelBuildError) as refused:
        store_unit(s3, bucket=bucket, model_prefix=PREFIX, output_uri=output, model="bert", key=KEY)
    assert refused.value.model == "bert" and "\n" not in str(refused.value)
    assert _stored(s3, bucket) == []


def test_the_lambda_reads_the_unit_from_the_models_own_job_folder_only(
        endpoint: str, s3: Any, bucket: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from triton_mme_cdk.model_build.handler.build_steps import store_job

    monkeypatch.setenv("MODEL_BUILD_S3_ENDPOINT_URL", endpoint)
    props = {"ModelBucket": bucket, "ModelPrefix": PREFIX, "ReleaseId": RELEASE, "ManifestBucket": bucket,
             "ManifestKey": "manifest.json", "ManifestSha256": "0" * 64}
    elsewhere = _job_output(s3, bucket, "other", {"model.tar.gz": b"x"}, name="bert")
    with pytest.raises(Exception) as refused:
        store_job({"Request": props, "Model": "bert", "Key": KEY, "Job": {"Output": elsewhere}})
    message = str(refused.value)
    assert "Job.Output" in message and repr(elsewhere) in message
    assert f"s3://{bucket}/{job_prefix(PREFIX, RELEASE, 'bert')}/output/" in message
    assert _stored(s3, bucket) == []
