"""The local multi-model endpoint, on the real ``tritonserver`` (no mock): boto3 in, Triton out.

A small release (an ONNX ResNet published as two copies, and a TorchScript one) is built for real,
published to moto's S3 server, and served by :func:`model_build.tools.local_endpoint.server.local_endpoint`.
Hostile targets are added to the same release index: a tampered tarball, one whose member path
escapes its folder, a config the server refuses, and a python model that runs out of memory.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient
from botocore.exceptions import ClientError
from tar_helpers import tar_gz  # tests/ is on sys.path
from triton_helpers import requires_triton

from triton_mme_cdk.model_build.aws_clients import make_s3_client
from triton_mme_cdk.model_build.manifest import parse_manifest
from triton_mme_cdk.model_build.pipeline import BuildOptions, build_release
from triton_mme_cdk.model_build.reference import read_reference
from triton_mme_cdk.model_build.release import INDEX_NAME, compute_release
from triton_mme_cdk.model_build.release.publish import publish_release
from triton_mme_cdk.model_build.tools.local_endpoint.server import LocalEndpoint, local_endpoint
from triton_mme_cdk.model_build.tools.local_s3 import local_s3
from triton_mme_cdk.model_build.tools.smoke.prepare import make_client, make_runtime_client
from triton_mme_cdk.model_build.tools.smoke.runner import run_smoke

ROOT = Path(__file__).resolve().parents[1]
BUCKET = "local-endpoint"
BINARY = "application/vnd.sagemaker-triton.binary+json;json-header-size={}"
RESNET = {"embedding_size": 8, "hidden_sizes": [8, 8, 16, 16], "depths": [1, 1, 1, 1], "layer_type": "basic",
          "num_labels": 4}
MANIFEST = {
    "version": 1,
    "models": [
        {"name": "tiny-onnx", "source": {"kind": "synthetic", "architecture": "resnet", "seed": 1, "config": RESNET},
         "task": "image-classification", "max_batch_size": 4, "image": {"image_size": 32},
         "dynamic_batching": {"preferred_batch_size": [2, 4]}, "copies": 2},
        {"name": "tiny-ts", "source": {"kind": "synthetic", "architecture": "resnet", "seed": 2, "config": RESNET},
         "task": "image-classification", "format": "torchscript", "max_batch_size": 4, "image": {"image_size": 32}},
    ],
}

pytestmark = [pytest.mark.slow, requires_triton]


OOM_MODEL = b'''
class TritonPythonModel:
    def initialize(self, args):
        raise MemoryError("out of memory while allocating the weights (test)")
    def execute(self, requests):
        return []
'''
OOM_CONFIG = b'name: "oom"\nbackend: "python"\nmax_batch_size: 0\ninput { name: "x" data_type: TYPE_FP32 dims: 1 }\noutput { name: "y" data_type: TYPE_FP32 dims: 1 }\n'
# A model that holds "device memory" while loaded: its flag file exists from initialize to finalize.
HOG_MODEL = b'''
import json, os
import triton_python_backend_utils as pb_utils
class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.flag = config["parameters"]["flag"]["string_value"]
        open(self.flag, "w").close()
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("y", pb_utils.get_input_tensor_by_name(r, "x").as_numpy())])
                for r in requests]
    def finalize(self):
        os.remove(self.flag)
'''
# A model that runs out of memory while the hog is loaded, and loads once it is gone.
GREEDY_MODEL = b'''
import json, os
import triton_python_backend_utils as pb_utils
class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        if os.path.exists(config["parameters"]["flag"]["string_value"]):
            raise MemoryError("out of memory: another model holds the memory (test)")
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("y", pb_utils.get_input_tensor_by_name(r, "x").as_numpy() * 2)])
                for r in requests]
'''


def _python_config(name: str, flag: Path) -> bytes:
    return OOM_CONFIG.replace(b'"oom"', f'"{name}"'.encode()) + (
        f'parameters {{ key: "flag" value {{ string_value: "{flag}" }} }}\n'.encode())


def _with_parameters(config: bytes, **parameters: str) -> bytes:
    return config + b"".join(f'parameters {{ key: "{key}" value {{ string_value: "{value}" }} }}\n'.encode()
                             for key, value in parameters.items())


def _two_input_onnx() -> bytes:
    """A graph with two inputs (y = a + b); a config that lists only ``a`` is refused by the backend."""
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Add", ["a", "b"], ["y"])], "two",
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, [1]), helper.make_tensor_value_info("b", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return bytes(model.SerializeToString())


TWO_INPUT_CONFIG = (b'name: "two"\nbackend: "onnxruntime"\nmax_batch_size: 0\n'
                    b'input { name: "a" data_type: TYPE_FP32 dims: 1 }\noutput { name: "y" data_type: TYPE_FP32 dims: 1 }\n')


@pytest.fixture(scope="module")
def release(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A built and published release, plus hostile targets in its index; yields what tests need."""
    work = tmp_path_factory.mktemp("endpoint")
    manifest = parse_manifest(MANIFEST)
    rel = compute_release(manifest, base_dir=work)
    record, release_dir = build_release(manifest, rel, BuildOptions(base_dir=work), out_dir=work / "build")
    with local_s3() as url:
        s3 = make_s3_client(endpoint_url=url)
        s3.create_bucket(Bucket=BUCKET)
        prefix = f"models/{rel.release_id}"  # the earlier per-release layout: a prefix with its own index
        publish_release(record.artifacts(release_dir), s3_client=s3, bucket=BUCKET, release_prefix=prefix,
                        index_extra={"release_id": rel.release_id})
        good = (release_dir / "tiny-onnx.tar.gz").read_bytes()
        config = (release_dir / "tiny-onnx.config.pbtxt").read_bytes()
        with tarfile.open(release_dir / "tiny-onnx.tar.gz") as tar:
            onnx_bytes = tar.extractfile("tiny-onnx/1/model.onnx").read()  # type: ignore[union-attr]
        with tarfile.open(release_dir / "tiny-ts.tar.gz") as tar:
            ts_members = {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}  # type: ignore[union-attr]
        ts_config = ts_members["tiny-ts/config.pbtxt"]
        flag = work / "hog-loaded.flag"
        hostile: dict[str, bytes | tuple[bytes, str]] = {
            # The index promises the good bytes; the object holds others.
            "tampered.tar.gz": (good[:-8] + b"\0" * 8, hashlib.sha256(good).hexdigest()),
            "escaping.tar.gz": tar_gz({"../outside/config.pbtxt": config}),
            # Dims 3x16x16 where the model takes 3x32x32: our checks cannot see it, the server refuses it.
            "refused.tar.gz": tar_gz({
                "m/config.pbtxt": config.replace(b"dims: 32", b"dims: 16"), "m/1/model.onnx": onnx_bytes}),
            "oom.tar.gz": tar_gz({"oom/config.pbtxt": OOM_CONFIG, "oom/1/model.py": OOM_MODEL}),
            "badconfig.tar.gz": tar_gz({"m/config.pbtxt": b'name: "m"\nbackend: "onnxruntime"\ninput { oops\n',
                                        "m/1/model.onnx": onnx_bytes}),
            "hog.tar.gz": tar_gz({"hog/config.pbtxt": _python_config("hog", flag), "hog/1/model.py": HOG_MODEL}),
            "greedy.tar.gz": tar_gz({"greedy/config.pbtxt": _python_config("greedy", flag),
                                     "greedy/1/model.py": GREEDY_MODEL}),
            "two-inputs.tar.gz": tar_gz({"two/config.pbtxt": TWO_INPUT_CONFIG, "two/1/model.onnx": _two_input_onnx()}),
            "shrink.tar.gz": tar_gz({"tiny-onnx/config.pbtxt": _with_parameters(
                config, **{"memory.enable_memory_arena_shrinkage": "cpu:0"}), "tiny-onnx/1/model.onnx": onnx_bytes}),
            "bad-shrink.tar.gz": tar_gz({"tiny-onnx/config.pbtxt": _with_parameters(
                config, **{"memory.enable_memory_arena_shrinkage": "tpu:7"}), "tiny-onnx/1/model.onnx": onnx_bytes}),
            "interop.tar.gz": tar_gz({**ts_members, "tiny-ts/config.pbtxt": _with_parameters(
                ts_config, INTER_OP_THREAD_COUNT="2", INTRA_OP_THREAD_COUNT="1")}),
            "bad-interop.tar.gz": tar_gz({**ts_members, "tiny-ts/config.pbtxt": _with_parameters(
                ts_config, INTER_OP_THREAD_COUNT="two")}),
        }
        index_key = f"{prefix}/{INDEX_NAME}"
        index = json.loads(s3.get_object(Bucket=BUCKET, Key=index_key)["Body"].read())
        for target, spec in hostile.items():
            body, digest = spec if isinstance(spec, tuple) else (spec, hashlib.sha256(spec).hexdigest())
            key = f"{prefix}/{target}"
            s3.put_object(Bucket=BUCKET, Key=key, Body=body)
            index["models"].append({"target_model": target, "key": key, "sha256": digest, "size": len(body),
                                    "format": "onnx", "source_model": target.removesuffix(".tar.gz")})
        s3.put_object(Bucket=BUCKET, Key=index_key, Body=json.dumps(index).encode())
        yield {"s3": s3, "url": url, "release": rel, "dir": release_dir, "record": record, "index": index,
               "prefix": prefix, "flag": flag}


@pytest.fixture(scope="module")
def endpoint(release: dict[str, Any]) -> Iterator[LocalEndpoint]:
    with local_endpoint(s3_client=release["s3"], bucket=BUCKET, release_id=release["release"].release_id) as ep:
        yield ep


def _request(name: str, array: np.ndarray, *, binary: bool) -> tuple[bytes, str]:
    tensor = httpclient.InferInput(name, list(array.shape), "FP32")
    tensor.set_data_from_numpy(array, binary_data=binary)
    output = httpclient.InferRequestedOutput("logits" if name == "pixel_values" else "logits__0", binary_data=binary)
    body, header_length = httpclient.InferenceServerClient.generate_request_body([tensor], outputs=[output])
    return body, (BINARY.format(header_length) if header_length else "application/json")


def _answer(response: dict[str, Any]) -> np.ndarray:
    body, content_type = response["Body"].read(), response["ContentType"]
    header = int(content_type.rpartition("=")[2]) if "json-header-size" in content_type else None
    result = httpclient.InferenceServerClient.parse_response_body(body, header_length=header)
    return result.as_numpy(result.get_response()["outputs"][0]["name"])


def _reference(release: dict[str, Any], model: str) -> tuple[np.ndarray, np.ndarray]:
    inputs, outputs = read_reference(release["dir"] / f"{model}.reference.npz")
    return next(iter(inputs.values())), next(iter(outputs.values()))


@pytest.mark.parametrize("binary", [True, False], ids=["binary+json", "json"])
def test_every_target_answers_through_boto3_like_the_build_reference(
    endpoint: LocalEndpoint, release: dict[str, Any], binary: bool
) -> None:
    runtime = make_runtime_client(endpoint_url=endpoint.url, timeout_seconds=120)
    for target, model, name in (("tiny-onnx-0.tar.gz", "tiny-onnx", "pixel_values"),
                                ("tiny-onnx-1.tar.gz", "tiny-onnx", "pixel_values"),
                                ("tiny-ts.tar.gz", "tiny-ts", "pixel_values__0")):
        inputs, expected = _reference(release, model)
        body, content_type = _request(name, inputs, binary=binary)
        response = runtime.invoke_endpoint(EndpointName="local", TargetModel=target, ContentType=content_type,
                                           Body=body)
        assert response["ContentType"].startswith("application/vnd.sagemaker-triton.binary+json" if binary
                                                  else "application/json")
        np.testing.assert_allclose(_answer(response), expected, atol=1e-4, rtol=1e-3)
    # Two copies of one tarball load under their own names: two models on the server.
    assert {"tiny-onnx-0.tar.gz", "tiny-onnx-1.tar.gz", "tiny-ts.tar.gz"} <= set(endpoint.cache.loaded_targets())


def test_concurrent_first_calls_load_a_target_once(endpoint: LocalEndpoint, release: dict[str, Any]) -> None:
    runtime = make_runtime_client(endpoint_url=endpoint.url, timeout_seconds=120)
    inputs, expected = _reference(release, "tiny-onnx")
    body, content_type = _request("pixel_values", inputs[:1], binary=True)
    # A fresh endpoint state for the target: unload it first if an earlier test loaded it.
    endpoint.cache.unload_all()
    loads = endpoint.cache.loads
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda _: _answer(runtime.invoke_endpoint(
            EndpointName="local", TargetModel="tiny-onnx-0.tar.gz", ContentType=content_type, Body=body)), range(8)))
    assert endpoint.cache.loads == loads + 1
    for answer in answers:
        np.testing.assert_allclose(answer, expected[:1], atol=1e-4, rtol=1e-3)


def _error(endpoint: LocalEndpoint, target: str, body: bytes = b"{}") -> dict[str, Any]:
    runtime = make_runtime_client(endpoint_url=endpoint.url, timeout_seconds=120)
    with pytest.raises(ClientError) as caught:
        runtime.invoke_endpoint(EndpointName="local", TargetModel=target, ContentType="application/json", Body=body)
    return caught.value.response


@pytest.mark.parametrize(("target", "code", "status", "words"), [
    ("nope.tar.gz", "ValidationError", 400, "not in release"),
    ("tampered.tar.gz", "ValidationError", 400, "sha256"),
    ("escaping.tar.gz", "ValidationError", 400, ".."),
    ("refused.tar.gz", "ModelError", 424, "dims"),
    ("oom.tar.gz", "ModelError", 424, "out of memory"),
    ("badconfig.tar.gz", "ModelError", 424, "config.pbtxt: not a valid model config"),
    ("two-inputs.tar.gz", "ModelError", 424, "configuration expects 1 inputs, model provides 2"),
    ("bad-interop.tar.gz", "ModelError", 424, "INTER_OP_THREAD_COUNT"),
])
def test_bad_targets_get_one_clear_error_and_the_endpoint_keeps_serving(
    endpoint: LocalEndpoint, release: dict[str, Any], target: str, code: str, status: int, words: str
) -> None:
    response = _error(endpoint, target)
    assert response["Error"]["Code"] == code
    assert response["ResponseMetadata"]["HTTPStatusCode"] == status
    assert target in response["Error"]["Message"]
    assert words in response["Error"]["Message"]
    assert target not in endpoint.cache.loaded_targets()
    # The rest still answers.
    inputs, expected = _reference(release, "tiny-ts")
    body, content_type = _request("pixel_values__0", inputs, binary=True)
    runtime = make_runtime_client(endpoint_url=endpoint.url, timeout_seconds=120)
    answer = _answer(runtime.invoke_endpoint(EndpointName="local", TargetModel="tiny-ts.tar.gz",
                                             ContentType=content_type, Body=body))
    np.testing.assert_allclose(answer, expected, atol=1e-4, rtol=1e-3)


def test_out_of_memory_is_a_507_from_the_real_server(endpoint: LocalEndpoint) -> None:
    response = _error(endpoint, "oom.tar.gz")
    assert response["OriginalStatusCode"] == 507


def test_a_bad_request_is_the_servers_400_relayed_as_model_error(endpoint: LocalEndpoint) -> None:
    response = _error(endpoint, "tiny-ts.tar.gz", body=b'{"inputs": []}')
    assert response["Error"]["Code"] == "ModelError"
    assert response["OriginalStatusCode"] == 400
    assert "pixel_values__0" in response["Error"]["Message"]


def test_a_507_load_unloads_the_least_recently_used_model_and_then_succeeds(
    endpoint: LocalEndpoint, release: dict[str, Any]
) -> None:
    runtime = make_runtime_client(endpoint_url=endpoint.url, timeout_seconds=120)
    x = np.array([1.5], dtype=np.float32)
    body = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": x.tolist()}]}).encode()
    endpoint.cache.unload_all()
    assert not release["flag"].exists()

    def call(target: str) -> np.ndarray:
        return _answer(runtime.invoke_endpoint(EndpointName="local", TargetModel=target,
                                               ContentType="application/json", Body=body))

    np.testing.assert_array_equal(call("hog.tar.gz"), x)
    assert release["flag"].exists() and endpoint.cache.loaded_targets() == ["hog.tar.gz"]
    unloads = endpoint.cache.unloads
    # greedy's first load answers 507 (the hog holds the memory); the hog is unloaded, the retry loads.
    np.testing.assert_array_equal(call("greedy.tar.gz"), x * 2)
    assert endpoint.cache.loaded_targets() == ["greedy.tar.gz"]
    assert endpoint.cache.unloads == unloads + 1
    assert not release["flag"].exists()
    log = endpoint.server.log_path.read_text(errors="replace")
    assert "out of memory: another model holds the memory" in log  # the first load really failed


def test_a_model_always_out_of_memory_unloads_at_most_max_oom_retries_models(
    endpoint: LocalEndpoint, release: dict[str, Any]
) -> None:
    from triton_mme_cdk.model_build.tools.local_endpoint.model_cache import MAX_OOM_RETRIES

    runtime = make_runtime_client(endpoint_url=endpoint.url, timeout_seconds=120)
    endpoint.cache.unload_all()
    order = ["tiny-onnx-0.tar.gz", "tiny-onnx-1.tar.gz", "tiny-ts.tar.gz", "shrink.tar.gz"]
    for target in order:
        model = "tiny-ts" if target == "tiny-ts.tar.gz" else "tiny-onnx"
        inputs, expected = _reference(release, model)
        body, content_type = _request("pixel_values__0" if model == "tiny-ts" else "pixel_values", inputs, binary=True)
        np.testing.assert_allclose(_answer(runtime.invoke_endpoint(
            EndpointName="local", TargetModel=target, ContentType=content_type, Body=body)), expected, atol=1e-4, rtol=1e-3)
    assert endpoint.cache.loaded_targets() == order
    unloads = endpoint.cache.unloads
    response = _error(endpoint, "oom.tar.gz")
    assert response["OriginalStatusCode"] == 507 and "oom.tar.gz" in response["Error"]["Message"]
    assert endpoint.cache.unloads == unloads + MAX_OOM_RETRIES
    # The least recently used went first; the rest stay loaded.
    assert endpoint.cache.loaded_targets() == order[MAX_OOM_RETRIES:]


def test_arena_shrinkage_is_applied_per_run(endpoint: LocalEndpoint, release: dict[str, Any]) -> None:
    inputs, expected = _reference(release, "tiny-onnx")
    body, content_type = _request("pixel_values", inputs, binary=True)
    runtime = make_runtime_client(endpoint_url=endpoint.url, timeout_seconds=120)
    np.testing.assert_allclose(_answer(runtime.invoke_endpoint(
        EndpointName="local", TargetModel="shrink.tar.gz", ContentType=content_type, Body=body)),
        expected, atol=1e-4, rtol=1e-3)
    # A value ONNX Runtime cannot apply fails each run that carries it (it loads: the key is a run option).
    with pytest.raises(ClientError) as caught:
        runtime.invoke_endpoint(EndpointName="local", TargetModel="bad-shrink.tar.gz", ContentType=content_type,
                                Body=body)
    assert caught.value.response["Error"]["Code"] == "ModelError"
    assert "bad-shrink.tar.gz" in endpoint.cache.loaded_targets()
    assert "tpu" in caught.value.response["Error"]["Message"], caught.value.response["Error"]["Message"]


def test_thread_counts_of_the_pytorch_backend_load_and_answer(endpoint: LocalEndpoint, release: dict[str, Any]) -> None:
    inputs, expected = _reference(release, "tiny-ts")
    body, content_type = _request("pixel_values__0", inputs, binary=True)
    runtime = make_runtime_client(endpoint_url=endpoint.url, timeout_seconds=120)
    np.testing.assert_allclose(_answer(runtime.invoke_endpoint(
        EndpointName="local", TargetModel="interop.tar.gz", ContentType=content_type, Body=body)),
        expected, atol=1e-4, rtol=1e-3)


def test_a_body_over_the_6_mb_invoke_limit_is_a_413_validation_error(endpoint: LocalEndpoint) -> None:
    from triton_mme_cdk.model_build.tools.local_endpoint.server import MAX_BODY_BYTES

    assert MAX_BODY_BYTES == 6291456  # botocore's sagemaker-runtime BodyBlob max
    response = _error(endpoint, "tiny-ts.tar.gz", body=b" " * (MAX_BODY_BYTES + 1))
    assert response["ResponseMetadata"]["HTTPStatusCode"] == 413
    assert response["Error"]["Code"] == "ValidationError"
    assert "6291456" in response["Error"]["Message"]
    # At the limit the body reaches the model (which refuses blank JSON: the server's 400, relayed).
    response = _error(endpoint, "tiny-ts.tar.gz", body=b" " * MAX_BODY_BYTES)
    assert response["ResponseMetadata"]["HTTPStatusCode"] == 424


def test_a_root_config_is_localized_too(tmp_path: Path) -> None:
    from triton_mme_cdk.model_build.tools.local_endpoint.model_cache import localize_configs

    (tmp_path / "1").mkdir()
    (tmp_path / "config.pbtxt").write_text('name: "m"\nbackend: "onnxruntime"\n'
                                           'instance_group { kind: KIND_GPU count: 1 gpus: 0 }\n')
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "config.pbtxt").write_text('name: "sub"\ninstance_group { kind: KIND_GPU gpus: 0 }\n')
    localize_configs(tmp_path)
    for path in (tmp_path / "config.pbtxt", tmp_path / "sub" / "config.pbtxt"):
        text = path.read_text()
        assert "KIND_CPU" in text and "KIND_GPU" not in text and "gpus" not in text, text


def test_a_server_with_gpu_runtimes_keeps_the_published_kinds(tmp_path: Path) -> None:
    from triton_mme_cdk.model_build.tools.local_endpoint.model_cache import CpuUnservable, localize_configs

    published = 'name: "m"\nbackend: "onnxruntime"\ninstance_group { kind: KIND_GPU count: 1 gpus: 0 }\n'
    (tmp_path / "config.pbtxt").write_text(published)
    localize_configs(tmp_path, gpu=True)
    assert (tmp_path / "config.pbtxt").read_text() == published  # the bytes as published
    (tmp_path / "config.pbtxt").write_text('name: "p"\nplatform: "tensorrt_plan"\n')
    with pytest.raises(CpuUnservable):  # no tensorrt backend in the local server, GPU or not
        localize_configs(tmp_path, gpu=True)


@pytest.mark.parametrize(("mutate", "words"), [
    (lambda e: e.pop("sha256"), "missing field(s) sha256"),
    (lambda e: e.update(size="12"), "field 'size' must be a non-negative integer"),
    (lambda e: e.update(key="models/other-release/tiny-ts.tar.gz"), "is not under the release prefix"),
    (lambda e: e.update(key=e["key"].rpartition("/")[0] + "/../../escape.tar.gz"), "is not under the release prefix"),
])
def test_a_malformed_index_entry_is_one_clear_error(release: dict[str, Any], mutate: Any, words: str) -> None:
    from triton_mme_cdk.model_build.errors import ModelBuildError
    from triton_mme_cdk.model_build.tools.local_endpoint.served_release import read_release

    release_id = "r-malformed0000000"
    index = json.loads(json.dumps(release["index"]))
    for item in index["models"]:  # a well-formed copy of the release under another id...
        item["key"] = f"models/{release_id}/{item['key'].rpartition('/')[2]}"
    read_release_ok = json.dumps(index).encode()
    release["s3"].put_object(Bucket=BUCKET, Key=f"models/{release_id}/{INDEX_NAME}", Body=read_release_ok)
    assert len(read_release(release["s3"], BUCKET, "models", release_id).entries) == len(index["models"])
    entry = next(e for e in index["models"] if e["target_model"] == "tiny-ts.tar.gz")
    mutate(entry)  # ...then one entry spoiled
    release["s3"].put_object(Bucket=BUCKET, Key=f"models/{release_id}/{INDEX_NAME}", Body=json.dumps(index).encode())
    with pytest.raises(ModelBuildError) as caught:
        read_release(release["s3"], BUCKET, "models", release_id)
    message = str(caught.value)
    assert words in message and "tiny-ts.tar.gz" in message and release_id in message, message


# ------------------------------------------------------------------------------------------------
# Concurrency, with a memory budget: real concurrent calls on the real server
# ------------------------------------------------------------------------------------------------

_LOAD_EVENT = re.compile(r"successfully (loaded|unloaded) '([^']+)'")


def _peak_loaded(log: str) -> int:
    """The most models the server had loaded at once, from its own log lines."""
    loaded: set[str] = set()
    peak = 0
    for kind, name in _LOAD_EVENT.findall(log):
        if kind == "loaded":
            loaded.add(name)
        else:
            loaded.discard(name)
        peak = max(peak, len(loaded))
    return peak


def _budget_for_one(release: dict[str, Any]) -> int:
    with tarfile.open(release["dir"] / "tiny-onnx.tar.gz") as tar:
        return sum(member.size for member in tar.getmembers()) * 3 // 2


def test_two_targets_loading_at_once_stay_within_the_budget(release: dict[str, Any]) -> None:
    inputs, expected = _reference(release, "tiny-onnx")
    body, content_type = _request("pixel_values", inputs, binary=True)
    targets = ["tiny-onnx-0.tar.gz", "tiny-onnx-1.tar.gz"] * 3
    with local_endpoint(s3_client=release["s3"], bucket=BUCKET, release_id=release["release"].release_id,
                        memory_budget_bytes=_budget_for_one(release)) as ep:
        runtime = make_runtime_client(endpoint_url=ep.url, timeout_seconds=300)
        start = threading.Barrier(len(targets))

        def call(target: str) -> np.ndarray:
            start.wait()
            return _answer(runtime.invoke_endpoint(EndpointName="local", TargetModel=target,
                                                   ContentType=content_type, Body=body))

        with ThreadPoolExecutor(len(targets)) as pool:
            answers = list(pool.map(call, targets))
        for answer in answers:
            np.testing.assert_allclose(answer, expected, atol=1e-4, rtol=1e-3)
        log = ep.server.log_path.read_text(errors="replace")
        assert _LOAD_EVENT.search(log), log[-2000:]
        assert _peak_loaded(log) == 1, log[-4000:]
        assert ep.cache.loaded_bytes() <= _budget_for_one(release)
        assert ep.cache.loads >= 2


def test_a_target_evicted_while_called_again_reloads_into_its_own_files(release: dict[str, Any]) -> None:
    """Calls for A and B interleave with room for one: every load of one evicts the other."""
    inputs, expected = _reference(release, "tiny-onnx")
    body, content_type = _request("pixel_values", inputs, binary=True)
    targets = ["tiny-onnx-0.tar.gz", "tiny-onnx-1.tar.gz"] * 5
    failures: list[str] = []
    with local_endpoint(s3_client=release["s3"], bucket=BUCKET, release_id=release["release"].release_id,
                        memory_budget_bytes=_budget_for_one(release)) as ep:
        runtime = make_runtime_client(endpoint_url=ep.url, timeout_seconds=300)

        def call(target: str) -> None:
            for _ in range(2):
                try:
                    answer = _answer(runtime.invoke_endpoint(EndpointName="local", TargetModel=target,
                                                             ContentType=content_type, Body=body))
                    np.testing.assert_allclose(answer, expected, atol=1e-4, rtol=1e-3)
                except Exception as error:  # collected: every call must answer correctly
                    failures.append(f"{target}: {error}")
                with ep.cache._state:  # every loaded model still has its files on disk
                    for name, item in ep.cache._loaded.items():
                        if not (item.directory / "1").parent.is_dir():
                            failures.append(f"{name}: loaded, but its folder {item.directory} is gone")

        with ThreadPoolExecutor(len(targets)) as pool:
            list(pool.map(call, targets))
        assert not failures, failures
        assert ep.cache.unloads >= 1 and ep.cache.loads == ep.cache.unloads + len(ep.cache.loaded_targets())
        assert _peak_loaded(ep.server.log_path.read_text(errors="replace")) == 1


def test_a_missing_triton_environment_fails_the_tests_it_would_skip(tmp_path: Path) -> None:
    probe = tmp_path / "test_probe.py"
    probe.write_text("from triton_helpers import requires_triton\npytestmark = requires_triton\n"
                     "def test_needs_triton():\n    pass\n")
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(tmp_path), str(probe)],
        cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False,
        env={**os.environ, "MME_TRITON_ENV": str(tmp_path / "nowhere"), "PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), str(ROOT)])},
    )
    assert done.returncode != 0, done.stdout
    assert "make setup" in done.stdout and "skipped" not in done.stdout, done.stdout


def test_memory_budget_unloads_the_least_recently_used_model(release: dict[str, Any]) -> None:
    with tarfile.open(release["dir"] / "tiny-onnx.tar.gz") as tar:
        unpacked = sum(member.size for member in tar.getmembers())
    budget = unpacked * 3 // 2  # room for one model, not two
    inputs, expected = _reference(release, "tiny-onnx")
    body, content_type = _request("pixel_values", inputs, binary=True)
    with local_endpoint(s3_client=release["s3"], bucket=BUCKET, release_id=release["release"].release_id,
                        memory_budget_bytes=budget) as ep:
        runtime = make_runtime_client(endpoint_url=ep.url, timeout_seconds=120)
        for target in ("tiny-onnx-0.tar.gz", "tiny-onnx-1.tar.gz", "tiny-onnx-0.tar.gz"):
            answer = _answer(runtime.invoke_endpoint(EndpointName="local", TargetModel=target,
                                                     ContentType=content_type, Body=body))
            np.testing.assert_allclose(answer, expected, atol=1e-4, rtol=1e-3)
            assert ep.cache.loaded_targets() == [target]
            assert ep.cache.loaded_bytes() == unpacked
        assert (ep.cache.loads, ep.cache.unloads) == (3, 2)


def test_smoke_runs_unchanged_against_the_local_endpoint(endpoint: LocalEndpoint, release: dict[str, Any]) -> None:
    report = run_smoke(
        endpoint_name="local",
        sagemaker_client=make_client("sagemaker", endpoint_url=endpoint.url),
        runtime_client=make_runtime_client(endpoint_url=endpoint.url, timeout_seconds=120),
        s3_client=release["s3"],
        timeout_seconds=120,
    )
    rows = {row.target: row for row in report.rows}
    assert all(rows[t].ok for t in ("tiny-onnx-0.tar.gz", "tiny-onnx-1.tar.gz", "tiny-ts.tar.gz")), report.rows
    assert report.targets_in_release == 15 and report.release_id == release["release"].release_id
    assert not any(rows[t].ok for t in ("tampered.tar.gz", "escaping.tar.gz", "refused.tar.gz", "oom.tar.gz"))


# ------------------------------------------------------------------------------------------------
# The command, as a user runs it
# ------------------------------------------------------------------------------------------------


def _start(release: dict[str, Any], *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "model_build", "endpoint", "--bucket", BUCKET, "--release",
         release["release"].release_id, "--endpoint-url", release["url"], *extra],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (tritonserver and the python backend's stubs)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = int((entry / "stat").read_text().rpartition(")")[2].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    found, frontier = [], [pid]
    while frontier:
        children = [child for child, parent in parents.items() if parent in frontier]
        found += children
        frontier = children
    return found


#: The python backend's shared memory: ``/dev/shm/triton_<backend>_backend_shm_region_<uuid>``
#: (``triton_python_backend_shm_region_...`` for python models; the python-based onnxruntime
#: backend's models use ``triton_onnxruntime_backend_shm_region_...``).
_SHM = re.compile(r"/dev/shm/triton_\w+_backend_shm_region_\S+")


def _shm_regions(pids: list[int]) -> set[str]:
    """The python backend's shared-memory files these processes have mapped."""
    found = set()
    for pid in pids:
        try:
            maps = Path(f"/proc/{pid}/maps").read_text()
        except OSError:
            continue
        found |= {match.group(0) for match in map(_SHM.search, maps.splitlines()) if match}
    return found


def _gone(pid: int) -> bool:
    try:
        return "Z" in Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return True


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_the_command_serves_until_a_signal_and_leaves_nothing_behind(release: dict[str, Any], signum: int) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    process = _start(release, "--port", str(port))
    try:
        group, workdir, regions = _serve(process, release, port)
        process.send_signal(signum)
        assert process.wait(timeout=60) == 0
        assert "stopped" in process.stdout.read()  # type: ignore[union-attr]
        assert all(_gone(pid) for pid in group)
        assert not workdir.exists()
        assert not {path for path in regions if Path(path).exists()}, regions
    finally:  # a failed assertion must not leave the endpoint (and its tritonserver) running
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=60)


def test_a_killed_endpoint_takes_tritonserver_and_its_stubs_with_it(release: dict[str, Any]) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    process = _start(release, "--port", str(port))
    group: list[int] = []
    workdir = None
    try:
        group, workdir, regions = _serve(process, release, port)
        process.send_signal(signal.SIGKILL)  # no handler runs: only the kernel's parent-death signal
        process.wait(timeout=30)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not all(_gone(pid) for pid in group):
            time.sleep(0.2)
        assert [pid for pid in group if not _gone(pid)] == []
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(Path(path).exists() for path in regions):
            time.sleep(0.2)
        assert not {path for path in regions if Path(path).exists()}, regions
    finally:
        if process.poll() is None:  # failed before the kill: stop it the normal way
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=60)
        for pid in group:  # never leave a server behind, whatever failed above
            if not _gone(pid):
                os.kill(pid, signal.SIGKILL)
        if workdir is not None:  # the one thing a SIGKILLed endpoint cannot remove
            shutil.rmtree(workdir, ignore_errors=True)


def _serve(process: subprocess.Popen[str], release: dict[str, Any], port: int) -> tuple[list[int], Path, set[str]]:
    """Ready line checked, one invocation answered: (processes below it, its work folder, its shm files)."""
    assert process.stdout is not None and process.stderr is not None
    line = process.stdout.readline()
    assert f"endpoint local ready at http://127.0.0.1:{port}" in line, line or process.stderr.read()
    assert "tritonserver 2.51.0" in line and "15 targets" in line and "KIND_GPU served as KIND_CPU" in line
    runtime = make_runtime_client(endpoint_url=f"http://127.0.0.1:{port}", timeout_seconds=120)
    inputs, expected = _reference(release, "tiny-onnx")
    body, content_type = _request("pixel_values", inputs, binary=False)
    answer = _answer(runtime.invoke_endpoint(EndpointName="local", TargetModel="tiny-onnx-1.tar.gz",
                                             ContentType=content_type, Body=body))
    np.testing.assert_allclose(answer, expected, atol=1e-4, rtol=1e-3)
    # Under the endpoint now: tritonserver, and the python backend's stub of the loaded model.
    group = _descendants(process.pid)
    commands = [Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") for pid in group]
    assert any(cmd[0].endswith(b"/tritonserver") for cmd in commands if cmd)
    assert any(cmd[0].endswith(b"/triton_python_backend_stub") for cmd in commands if cmd)
    repository = next(arg for cmd in commands for arg in cmd if arg.startswith(b"--model-repository="))
    workdir = Path(repository.partition(b"=")[2].decode()).parent
    assert workdir.is_dir() and workdir.name.startswith("mme-endpoint-")
    regions = _shm_regions(group)
    assert regions, "the python backend maps its shared memory: none found"
    return group, workdir, regions


@pytest.mark.parametrize("case", ["port in use", "no release index"])
def test_the_command_refuses_with_one_error_line(release: dict[str, Any], case: str) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        if case == "port in use":
            process = _start(release, "--port", str(busy.getsockname()[1]))
            expected = f"port {busy.getsockname()[1]}"
        else:
            process = subprocess.Popen(
                [sys.executable, "-m", "model_build", "endpoint", "--bucket", BUCKET, "--release", "r-0000000000000000",
                 "--endpoint-url", release["url"]], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            expected = ("no index at s3://local-endpoint/models/_releases/r-0000000000000000/_index.json nor at "
                        "s3://local-endpoint/models/r-0000000000000000/_index.json")
        _, stderr = process.communicate(timeout=60)
    assert process.returncode == 1
    assert stderr.startswith("error:") and expected in stderr, stderr
    assert "Traceback" not in stderr
