"""The CLI end to end, in subprocesses, as a user runs it: demo, build, publish, verify."""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from triton_mme_cdk.model_build.aws_clients import make_s3_client
from triton_mme_cdk.model_build.manifest import load_manifest
from triton_mme_cdk.model_build.release import compute_release
from triton_mme_cdk.model_build.tools.local_s3 import local_s3

ROOT = Path(__file__).resolve().parents[1]

SMALL: dict[str, Any] = {
    "version": 1,
    "models": [
        {
            "name": "small-resnet",
            "source": {
                "kind": "synthetic",
                "architecture": "resnet",
                "seed": 3,
                "config": {"embedding_size": 8, "hidden_sizes": [8, 16, 16, 32], "depths": [1, 1, 1, 1],
                           "layer_type": "basic", "num_labels": 5},
            },
            "task": "image-classification",
            "max_batch_size": 4,
            "image": {"image_size": 32},
            "dynamic_batching": {"preferred_batch_size": [2, 4]},
            "copies": 4,
        }
    ],
}


def cli(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "model_build", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout)


@pytest.fixture()
def small_manifest(tmp_path: Path) -> Path:
    path = tmp_path / "models.yaml"
    path.write_text(yaml.safe_dump(SMALL))
    return path


@pytest.mark.slow
def test_demo_builds_publishes_to_local_s3_and_verifies(small_manifest: Path, tmp_path: Path) -> None:
    result = cli("demo", "--manifest", str(small_manifest), "--out", str(tmp_path / "build"))
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "small-resnet x4" in out
    # The build is stored once (tarball, reference, config, store index) and the release index
    # is written; the 4 targets are server-side copies of the store into the served prefix.
    assert "4 target models; objects (tarballs, references, index): 5 uploaded, 4 copied server-side" in out
    assert "second publish of the unchanged release" in out and "0 B sent" in out
    assert re.search(r"routed r-[0-9a-f]{16}: 4 routes in s3://triton-mme-demo/models/_routes/routes.json", out)
    assert "ModelDataUrl: s3://triton-mme-demo/models/served/" in out
    # Served by the real tritonserver the demo started, every target invoked through boto3.
    assert "endpoint local ready at http://127.0.0.1:" in out and "tritonserver 2.51.0" in out
    assert "cold ms" in out and "warm ms" in out
    for i in range(4):
        assert re.search(rf"small-resnet-{i}-[0-9a-f]{{12}}\.tar\.gz", out), i
    assert out.count(" ok ") == 4 and "FAILED" not in out
    assert "Traceback" not in result.stderr


@pytest.mark.slow
def test_publish_then_verify_against_an_s3_endpoint(small_manifest: Path, tmp_path: Path) -> None:
    release = compute_release(load_manifest(small_manifest), base_dir=small_manifest.parent).release_id
    with local_s3() as url:
        make_s3_client(endpoint_url=url).create_bucket(Bucket="models")
        published = cli("publish", "--manifest", str(small_manifest), "--out", str(tmp_path / "b"),
                        "--bucket", "models", "--endpoint-url", url)
        assert published.returncode == 0, published.stderr
        assert f"routed {release}: 4 routes" in published.stdout
        assert "ModelDataUrl: s3://models/models/served/" in published.stdout
        verified = cli("verify", "--manifest", str(small_manifest), "--out", str(tmp_path / "b"),
                       "--bucket", "models", "--endpoint-url", url)
        assert verified.returncode == 0, verified.stderr
        assert verified.stdout.count(" ok ") == 4
        # Tamper with one published copy: verify must refuse it, naming the object.
        s3 = make_s3_client(endpoint_url=url)
        routes = json.loads(s3_routes(url))
        key = f"models/served/{routes['routes']['small-resnet-2']['target_model']}"
        s3.put_object(Bucket="models", Key=key, Body=b"not a tarball",
                      Metadata=s3.head_object(Bucket="models", Key=key)["Metadata"])
        tampered = cli("verify", "--manifest", str(small_manifest), "--out", str(tmp_path / "b"),
                       "--bucket", "models", "--endpoint-url", url)
        assert tampered.returncode == 1
        assert "FAILED" in tampered.stdout and "small-resnet-2-" in tampered.stdout
        assert "sha256" in tampered.stdout and "Traceback" not in tampered.stderr


def s3_routes(url: str) -> bytes:
    return make_s3_client(endpoint_url=url).get_object(Bucket="models", Key="models/_routes/routes.json")["Body"].read()


def test_publish_without_bucket_is_a_usage_error(small_manifest: Path) -> None:
    result = cli("publish", "--manifest", str(small_manifest))
    assert result.returncode == 2 and "--bucket is required" in result.stderr


@pytest.mark.slow
def test_building_the_default_manifest_twice_gives_byte_identical_tarballs(tmp_path: Path) -> None:
    digests = []
    for run in ("one", "two"):
        result = cli("build", "--out", str(tmp_path / run), timeout=900)
        assert result.returncode == 0, result.stderr
        # The release folder (its files are links into the store, <out>/_builds/<key>/).
        tarballs = sorted((tmp_path / run).glob("r-*/*.tar.gz"))
        assert [t.name for t in tarballs] == [
            "minilm-l6-embedding.tar.gz", "minilm-l6-text.tar.gz", "resnet-synthetic-ts.tar.gz",
            "resnet-synthetic.tar.gz",
        ]
        digests.append({t.name: hashlib.sha256(t.read_bytes()).hexdigest() for t in tarballs})
    assert digests[0] == digests[1]
