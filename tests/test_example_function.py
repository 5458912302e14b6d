"""The example app's Lambda function (``examples/platform_app/client_function/index.py``, issue 61) run
for real: its handler, in a fresh interpreter, with the client modules of the staged layer and the
environment ``connect_client`` sets, calls a model by its logical name on the local endpoint (the
real ``tritonserver``) that serves a release ``triton-mme publish`` put into moto's S3 server.

boto3 reaches the two servers through its own endpoint variables (``AWS_ENDPOINT_URL_S3``,
``AWS_ENDPOINT_URL_SAGEMAKER_RUNTIME``), as the function's code is unchanged. numpy is this Python's
(the layer's is built for Lambda's CPython 3.14).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aws_cdk.aws_lambda as lambda_
import boto3
import numpy as np
import pytest
from cdk_helpers import subprocess_env  # tests/ is on sys.path
from triton_helpers import requires_triton

from triton_mme_cdk.constructs.client_layer import client_files, stage, wheel_for
from triton_mme_cdk.model_build.aws_clients import make_s3_client
from triton_mme_cdk.model_build.tools.local_endpoint.server import local_endpoint
from triton_mme_cdk.model_build.tools.local_s3 import local_s3
from triton_mme_client import TritonMmeClient

pytestmark = [pytest.mark.slow, requires_triton]
ROOT = Path(__file__).resolve().parents[1]
FUNCTION = ROOT / "examples" / "platform_app" / "client_function"
BUCKET, PREFIX, MODEL = "example-function", "models", "resnet-tiny"
ROUTES_URL = f"s3://{BUCKET}/{PREFIX}/_routes/routes.json"
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", "AWS_DEFAULT_REGION": "us-east-1"}


def _manifest(folder: Path) -> Path:
    """One synthetic ResNet (no file, no download)."""
    path = folder / "models.yaml"
    path.write_text(json.dumps({"version": 1, "models": [{
        "name": MODEL, "source": {"kind": "synthetic", "architecture": "resnet", "seed": 0, "config": {
            "embedding_size": 8, "hidden_sizes": [8, 8, 8, 8], "depths": [1, 1, 1, 1], "layer_type": "basic",
            "num_labels": 4}},
        "task": "image-classification", "format": "onnx", "max_batch_size": 4,
        "image": {"image_size": 32, "channels": 3}}]}))
    return path


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    work = tmp_path_factory.mktemp("example-function")
    with local_s3() as s3_url:
        s3 = make_s3_client(endpoint_url=s3_url)
        s3.create_bucket(Bucket=BUCKET)
        done = subprocess.run(
            [sys.executable, "-m", "model_build", "publish", "--manifest", str(_manifest(work)), "--out",
             str(work / "build"), "--bucket", BUCKET, "--prefix", PREFIX, "--endpoint-url", s3_url],
            cwd=ROOT, capture_output=True, text=True, timeout=900, check=False, env=subprocess_env(**CREDENTIALS))
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        with local_endpoint(s3_client=s3, bucket=BUCKET, model_prefix=PREFIX) as endpoint:
            yield {"s3_url": s3_url, "s3": s3, "endpoint": endpoint, "work": work}


def _run_handler(served: dict[str, Any], events: list[dict[str, Any]], tmp_path: Path) -> list[dict[str, Any]]:
    """The handler on each event, in one fresh interpreter, as Lambda runs it: the layer's client
    modules first on the path, the function's environment, the module loaded once."""
    staged = stage(ROOT / ".wheelhouse" / wheel_for(lambda_.Runtime.PYTHON_3_14).filename, client_files())
    layer = tmp_path / "opt-python"
    layer.mkdir()
    (layer / "triton_mme_client").symlink_to(staged.folder / "python" / "triton_mme_client")
    code = ("import json, sys; sys.path[:0] = sys.argv[1:3]; import index, triton_mme_client\n"
            "assert triton_mme_client.__file__.startswith(sys.argv[1]), triton_mme_client.__file__\n"
            "print(json.dumps([index.handler(event, None) for event in json.load(sys.stdin)]))")
    env = subprocess_env(TRITON_MME_ENDPOINT_NAME="local", TRITON_MME_ROUTES_URL=ROUTES_URL,
                         AWS_ENDPOINT_URL_S3=served["s3_url"], AWS_ENDPOINT_URL_SAGEMAKER_RUNTIME=served["endpoint"].url,
                         **CREDENTIALS)
    env.pop("PYTHONPATH", None)
    done = subprocess.run([sys.executable, "-c", code, str(layer), str(FUNCTION)], input=json.dumps(events),
                          capture_output=True, text=True, timeout=300, check=False, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    return list(json.loads(done.stdout.strip().splitlines()[-1]))


def test_the_function_calls_a_model_by_its_logical_name(served: dict[str, Any], tmp_path: Path) -> None:
    runtime = boto3.client("sagemaker-runtime", endpoint_url=served["endpoint"].url, region_name="us-east-1",
                           aws_access_key_id="test", aws_secret_access_key="test")
    client = TritonMmeClient("local", routes_url=ROUTES_URL, runtime=runtime, s3=served["s3"])
    info = client.models()[MODEL]
    assert info.signature is not None
    (spec,) = info.signature.inputs
    pixels = np.random.default_rng(3).standard_normal((2, *spec.dims)).astype(np.float32)
    expected = client.infer(MODEL, {spec.name: pixels})
    answers = _run_handler(served, [
        {"model": MODEL, "inputs": {spec.name: pixels.tolist()}},
        {"model": "no-such-model", "inputs": {spec.name: pixels.tolist()}},
        {"model": MODEL, "inputs": {spec.name: pixels[0].tolist()}},  # one rank short
        {"inputs": {}},
    ], tmp_path)
    ok, unknown, short, malformed = answers
    assert ok["model"] == MODEL and sorted(ok["outputs"]) == sorted(expected)
    for name, array in expected.items():
        np.testing.assert_array_equal(np.asarray(ok["outputs"][name], dtype=array.dtype), array, err_msg=name)
    assert unknown["kind"] == "ModelNotFound" and "no-such-model" in unknown["error"]
    assert short["kind"] == "InvalidInput" and f"input {spec.name!r}: rank 3" in short["error"], short
    assert malformed == {"error": 'expected {"model": "<logical name>", "inputs": {"<input>": [...]}}'}
