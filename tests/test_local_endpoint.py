"""The local multi-model endpoint, on the real ``tritonserver`` (no mock): boto3 in, Triton out.

A small release (an ONNX ResNet published as two copies, and a TorchScript one) is built for real,
published to moto's S3 server, and served by :func:`model_build.tools.endpoint.local_endpoint`.
Hostile targets are added to the same release index: a tampered tarball, one whose member path
escapes its folder, a config the server refuses, and a python model that runs out of memory.
"""

from __future__ import annotations

import hashlib
import io
import json
import signal
import socket
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient
from botocore.exceptions import ClientError
from triton_helpers import requires_triton  # tests/ is on sys.path

from model_build.build import build_release
from model_build.local_s3 import local_s3, make_s3_client
from model_build.manifest import parse_manifest
from model_build.publish import publish_release
from model_build.release import INDEX_NAME, compute_release
from model_build.smoke import make_client, make_runtime_client, run_smoke
from model_build.tools.endpoint import LocalEndpoint, local_endpoint
from model_build.validate import read_reference

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


def _tarball(members: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


OOM_MODEL = b'''
class TritonPythonModel:
    def initialize(self, args):
        raise MemoryError("out of memory while allocating the weights (test)")
    def execute(self, requests):
        return []
'''
OOM_CONFIG = b'name: "oom"\nbackend: "python"\nmax_batch_size: 0\ninput { name: "x" data_type: TYPE_FP32 dims: 1 }\noutput { name: "y" data_type: TYPE_FP32 dims: 1 }\n'


@pytest.fixture(scope="module")
def release(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A built and published release, plus hostile targets in its index; yields what tests need."""
    work = tmp_path_factory.mktemp("endpoint")
    manifest = parse_manifest(MANIFEST)
    rel = compute_release(manifest, base_dir=work)
    record, release_dir = build_release(manifest, rel, base_dir=work, out_dir=work / "build")
    with local_s3() as url:
        s3 = make_s3_client(endpoint_url=url)
        s3.create_bucket(Bucket=BUCKET)
        prefix = rel.prefix("models")
        publish_release(record.artifacts(release_dir), s3_client=s3, bucket=BUCKET, release_prefix=prefix,
                        index_extra={"release_id": rel.release_id})
        good = (release_dir / "tiny-onnx.tar.gz").read_bytes()
        config = (release_dir / "tiny-onnx.config.pbtxt").read_bytes()
        with tarfile.open(release_dir / "tiny-onnx.tar.gz") as tar:
            onnx_bytes = tar.extractfile("tiny-onnx/1/model.onnx").read()  # type: ignore[union-attr]
        hostile = {
            # The index promises the good bytes; the object holds others.
            "tampered.tar.gz": (good[:-8] + b"\0" * 8, hashlib.sha256(good).hexdigest()),
            "escaping.tar.gz": _tarball({"../outside/config.pbtxt": config}),
            # Dims 3x16x16 where the model takes 3x32x32: our checks cannot see it, the server refuses it.
            "refused.tar.gz": _tarball({
                "m/config.pbtxt": config.replace(b"dims: 32", b"dims: 16"), "m/1/model.onnx": onnx_bytes}),
            "oom.tar.gz": _tarball({"oom/config.pbtxt": OOM_CONFIG, "oom/1/model.py": OOM_MODEL}),
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
        yield {"s3": s3, "url": url, "release": rel, "dir": release_dir, "record": record}


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
    assert report.targets_in_release == 7 and report.release_id == release["release"].release_id
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


def test_the_command_serves_until_sigterm_and_leaves_nothing_behind(release: dict[str, Any]) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    process = _start(release, "--port", str(port))
    try:
        _serve_then_stop(process, release, port)
    finally:  # a failed assertion must not leave the endpoint (and its tritonserver) running
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=60)


def _serve_then_stop(process: subprocess.Popen[str], release: dict[str, Any], port: int) -> None:
    assert process.stdout is not None
    line = process.stdout.readline()
    assert f"endpoint local ready at http://127.0.0.1:{port}" in line, line or process.stderr.read()
    assert "tritonserver 2.51.0" in line and "7 targets" in line and "KIND_GPU served as KIND_CPU" in line
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
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=60) == 0
    assert "stopped" in process.stdout.read()
    for pid in group:
        assert not Path(f"/proc/{pid}").exists() or "Z" in (Path(f"/proc/{pid}/stat").read_text().split()[2])
    assert not workdir.exists()


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
            expected = "no index at s3://local-endpoint/models/r-0000000000000000/_index.json"
        _, stderr = process.communicate(timeout=60)
    assert process.returncode == 1
    assert stderr.startswith("error:") and expected in stderr, stderr
    assert "Traceback" not in stderr
