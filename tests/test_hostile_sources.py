"""Broken model sources: an ``s3`` prefix that is empty or holds a partial upload, a ``package``
that is not installed, an ``onnx`` file that is not ONNX. ``python -m model_build publish`` stops
at the source step with one error naming the field and the file or prefix, before any export,
in bounded time and memory, and publishes nothing (moto's real S3 server) nor packs a tarball.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from hostile_helpers import assert_refused, run_bounded

from triton_mme_cdk.model_build.aws_clients import make_s3_client
from triton_mme_cdk.model_build.tools.local_s3 import local_s3

SOURCES = "hostile-sources"
MODELS = "hostile-release"
#: The build imports torch (its CPU build maps about 1.5 GB of address space) before a source
#: is resolved; a refusal needs nothing beyond that.
MEMORY_LIMIT = 4 << 30
TIME_LIMIT = 60.0
CONFIG = json.dumps({"model_type": "bert", "hidden_size": 8}).encode()


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    with local_s3() as endpoint:
        s3 = make_s3_client(endpoint_url=endpoint)
        for bucket in (SOURCES, MODELS):
            s3.create_bucket(Bucket=bucket)
        s3.put_object(Bucket=SOURCES, Key="no-config/model.safetensors", Body=b"\0" * 64)
        s3.put_object(Bucket=SOURCES, Key="no-weights/config.json", Body=CONFIG)
        s3.put_object(Bucket=SOURCES, Key="no-weights/tokenizer.json", Body=b"{}")
        s3.put_object(Bucket=SOURCES, Key="shards/config.json", Body=CONFIG)
        index = {"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}
        s3.put_object(Bucket=SOURCES, Key="shards/model.safetensors.index.json", Body=json.dumps(index).encode())
        s3.put_object(Bucket=SOURCES, Key="shards/model-00001-of-00002.safetensors", Body=b"\0" * 64)
        s3.put_object(Bucket=SOURCES, Key="not-onnx.onnx", Body=b"<Error><Code>SlowDown</Code></Error>")
        yield endpoint


TEXT = "    task: sentence-embedding\n    format: onnx\n    max_batch_size: 2\n    text: {max_sequence_length: 8}\n"
IMAGE = "    task: image-classification\n    format: onnx\n    max_batch_size: 2\n    image: {image_size: 8}\n"

#: name -> (source line, extra files next to the manifest, fragments of the error line)
CORPUS: dict[str, tuple[str, dict[str, bytes], str, tuple[str, ...]]] = {
    "s3-empty-prefix": (f"{{kind: s3, uri: 's3://{SOURCES}/nothing-here/'}}", {}, TEXT,
                        ("source.uri", f"s3://{SOURCES}/nothing-here/", "no objects")),
    "s3-no-config": (f"{{kind: s3, uri: 's3://{SOURCES}/no-config'}}", {}, TEXT,
                     ("source.uri", "no-config/", "no config.json", "partial upload")),
    "s3-no-weights": (f"{{kind: s3, uri: 's3://{SOURCES}/no-weights'}}", {}, TEXT,
                      ("source.uri", "no-weights/", "no weights", "partial upload")),
    "s3-missing-shard": (f"{{kind: s3, uri: 's3://{SOURCES}/shards'}}", {}, TEXT,
                         ("source.uri", "2 weight shard(s) and 1 are missing", "model-00002-of-00002.safetensors")),
    "package-not-installed": ("{kind: package, package: no_such_package_xyz, path: model}", {}, TEXT,
                              ("source.package", "'no_such_package_xyz' is not installed")),
    "onnx-text-file": ("{kind: onnx, path: model.onnx}", {"model.onnx": b"hello, not a model"}, IMAGE,
                       ("source.path", "'model.onnx' is not an ONNX model")),
    "onnx-empty-file": ("{kind: onnx, path: model.onnx}", {"model.onnx": b""}, IMAGE,
                        ("source.path", "'model.onnx' is an empty file")),
    "onnx-lfs-pointer": ("{kind: onnx, path: model.onnx}",
                         {"model.onnx": b"version https://git-lfs.github.com/spec/v1\noid sha256:00\nsize 9\n"}, IMAGE,
                         ("source.path", "Git LFS pointer")),
    "onnx-s3-not-onnx": (f"{{kind: onnx, path: 's3://{SOURCES}/not-onnx.onnx'}}", {}, IMAGE,
                         ("source.path", "not-onnx.onnx", "is not an ONNX model")),
}

#: The corpus entry whose runs are plain fresh subprocesses (``run_bounded(fresh=True)``); the
#: others are forked from the zygote (tests/hostile_helpers.py says what that shares).
FRESH = min(CORPUS)


@pytest.mark.slow  # a build process (torch imported) per case; source errors in-process: tests/test_export_validate.py
@pytest.mark.parametrize("name", sorted(CORPUS))
def test_publish_refuses_broken_source(name: str, tmp_path: Path, s3_endpoint: str) -> None:
    source, files, body, fragments = CORPUS[name]
    for file_name, data in files.items():
        (tmp_path / file_name).write_bytes(data)
    manifest = tmp_path / "models.yaml"
    manifest.write_text(f"version: 1\nmodels:\n  - name: broken\n    source: {source}\n{body}", encoding="utf-8")
    out = tmp_path / "build"
    outcome = run_bounded(
        ["-m", "model_build", "publish", "--manifest", str(manifest), "--out", str(out),
         "--bucket", MODELS, "--endpoint-url", s3_endpoint],
        env={"AWS_DEFAULT_REGION": "us-east-1"}, memory_limit=MEMORY_LIMIT, time_limit=TIME_LIMIT, fresh=name == FRESH,
    )
    assert_refused(outcome, *fragments, time_limit=TIME_LIMIT)
    assert not out.exists() or not any(out.iterdir()), f"the build folder holds {sorted(out.rglob('*'))}"
    assert make_s3_client(endpoint_url=s3_endpoint).list_objects_v2(Bucket=MODELS).get("KeyCount", 0) == 0
