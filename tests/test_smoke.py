"""The endpoint smoke test, end to end over HTTP on loopback, against the real ``tritonserver``.

A tiny synthetic ResNet is built with the project's own pipeline (export, validate, config,
package), published with ``publish_release`` to moto's S3 server, and served by the local
endpoint (:mod:`model_build.tools.local_endpoint.server`): boto3 clients talk unpatched to S3 and to the
SageMaker API, and Triton loads and runs the tarballs. Faults are real ones: a python model that
runs out of memory at load (the server's 507), one that answers too late, a model with another
output shape, an object missing from S3.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import tarfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pytest
from tar_helpers import tar_gz  # tests/ is on sys.path
from triton_helpers import requires_triton  # tests/ is on sys.path

from triton_mme_cdk.model_build.aws_clients import make_s3_client
from triton_mme_cdk.model_build.errors import ModelBuildError
from triton_mme_cdk.model_build.manifest import parse_manifest
from triton_mme_cdk.model_build.pipeline import BuildOptions, build_model
from triton_mme_cdk.model_build.reference import read_reference, write_reference
from triton_mme_cdk.model_build.release import INDEX_NAME
from triton_mme_cdk.model_build.release.publish import publish_release
from triton_mme_cdk.model_build.tools.local_endpoint.server import LocalEndpoint, local_endpoint
from triton_mme_cdk.model_build.tools.local_s3 import local_s3
from triton_mme_cdk.model_build.tools.smoke.cli import add_smoke_parser, cmd_smoke, main
from triton_mme_cdk.model_build.tools.smoke.prepare import make_client, make_runtime_client
from triton_mme_cdk.model_build.tools.smoke.runner import run_smoke, select_targets
from triton_mme_cdk.model_build.types import Artifact

#: Slow: the real tritonserver behind the local endpoint (make test-fast leaves it out).
pytestmark = [requires_triton, pytest.mark.slow]

BUCKET = "smoke-test-releases"
RELEASE_A = "r-aaaaaaaaaaaaaaaa"
RELEASE_B = "r-bbbbbbbbbbbbbbbb"  # only tiny-0, to tell its index from A's
RELEASE_C = "r-cccccccccccccccc"  # no _reference/<model>.config.pbtxt (published before it existed)
RELEASE_D = "r-dddddddddddddddd"  # reference outputs shifted: the endpoint answers "wrongly"
RELEASE_E = "r-eeeeeeeeeeeeeeee"  # tarballs and index but no reference .npz
RELEASE_F = "r-ffffffffffffffff"  # reference .npz replaced after the index was written
RELEASE_G = "r-1111111111111111"  # A's targets and the faulty ones
ENDPOINT = "local"  # the one endpoint a local endpoint serves
TARGETS = ["tiny-0.tar.gz", "tiny-1.tar.gz", "tiny-2.tar.gz"]
#: Release G also lists these; each is invoked with tiny's reference (source_model "tiny").
FAULTY = {
    "oom.tar.gz": "a python model whose load runs out of memory: the server answers 507",
    "slow.tar.gz": "a python model that answers after 15 s",
    "nine.tar.gz": "an ONNX ResNet with 9 labels where the reference has 10",
    "gone.tar.gz": "listed in the index, missing from S3",
}

TINY: dict[str, Any] = {
    "name": "tiny",
    "source": {
        "kind": "synthetic",
        "architecture": "resnet",
        "seed": 0,
        "config": {"hidden_sizes": [8, 16, 32, 64], "embedding_size": 8, "depths": [1, 1, 1, 1],
                   "num_labels": 10},
    },
    "task": "image-classification",
    "max_batch_size": 4,
    "image": {"image_size": 32},
    "copies": 3,
}
PYTHON_CONFIG = """name: "{name}"
backend: "python"
max_batch_size: 4
input {{ name: "pixel_values" data_type: TYPE_FP32 dims: [3, 32, 32] }}
output {{ name: "logits" data_type: TYPE_FP32 dims: [10] }}
"""
OOM_MODEL = """
class TritonPythonModel:
    def initialize(self, args):
        raise MemoryError("CUDA out of memory (a test model)")
"""
SLOW_MODEL = """
import time
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        time.sleep(15)
        return [pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("logits", np.zeros(
            (pb_utils.get_input_tensor_by_name(r, "pixel_values").as_numpy().shape[0], 10), np.float32))])
            for r in requests]
"""


@dataclass
class Env:
    s3_url: str
    s3: Any
    endpoint: LocalEndpoint
    faulty: LocalEndpoint
    sagemaker: Any
    artifact: Artifact
    config_text: str
    reference_inputs: dict[str, np.ndarray]
    reference_outputs: dict[str, np.ndarray]

    @property
    def url(self) -> str:
        return self.endpoint.url

    def runtime(self, timeout: float = 60.0) -> Any:
        return make_runtime_client(endpoint_url=self.url, timeout_seconds=timeout)

    def smoke(self, timeout: float = 60.0, *, endpoint: LocalEndpoint | None = None, **kwargs: Any) -> Any:
        url = (endpoint or self.endpoint).url
        return run_smoke(
            endpoint_name=ENDPOINT, sagemaker_client=make_client("sagemaker", endpoint_url=url),
            runtime_client=make_runtime_client(endpoint_url=url, timeout_seconds=timeout),
            s3_client=self.s3, timeout_seconds=timeout, **kwargs,
        )

    def argv(self, *extra: str, endpoint: str = ENDPOINT) -> list[str]:
        return [
            "--endpoint", endpoint, "--sagemaker-endpoint-url", self.url,
            "--runtime-endpoint-url", self.url, "--s3-endpoint-url", self.s3_url, *extra,
        ]

    @contextmanager
    def serving(self, release: str) -> Iterator[LocalEndpoint]:
        """Another release on its own local endpoint (an endpoint serves one release)."""
        with local_endpoint(s3_client=self.s3, bucket=BUCKET, release_id=release) as endpoint:
            yield endpoint


def _publish(s3: Any, artifact: Artifact, release: str) -> str:
    """Publish with the project's publish: tarball, copies, ``_reference/tiny.npz`` and
    ``.config.pbtxt`` (when the artifact has them) and the index last."""
    prefix = f"models/{release}"
    publish_release(
        [artifact], s3_client=s3, bucket=BUCKET, release_prefix=prefix,
        index_extra={"release_id": release, "manifest_sha256": "m" * 64, "code_sha256": "c" * 64},
        concurrency=4,
    )
    return f"s3://{BUCKET}/{prefix}/"


def _add_targets(s3: Any, release: str, bodies: dict[str, bytes | None]) -> None:
    """List more targets in a published index (``None``: listed but never uploaded)."""
    prefix = f"models/{release}"
    index = json.loads(s3.get_object(Bucket=BUCKET, Key=f"{prefix}/{INDEX_NAME}")["Body"].read())
    for target, body in bodies.items():
        data = body if body is not None else b"never uploaded"
        if body is not None:
            s3.put_object(Bucket=BUCKET, Key=f"{prefix}/{target}", Body=body)
        index["models"].append({"target_model": target, "key": f"{prefix}/{target}", "size": len(data),
                                "sha256": hashlib.sha256(data).hexdigest(), "format": "onnx", "source_model": "tiny"})
    s3.put_object(Bucket=BUCKET, Key=f"{prefix}/{INDEX_NAME}", Body=json.dumps(index).encode())


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    base = tmp_path_factory.mktemp("smoke")
    release_dir = base / "release"
    release_dir.mkdir()
    spec = parse_manifest({"version": 1, "models": [TINY]}).models[0]
    result = build_model(spec, BuildOptions(base_dir=base), release_dir=release_dir, work_dir=base / "work")
    artifact = result.artifact(release_dir)
    with tarfile.open(artifact.path) as tar:
        member = tar.extractfile("tiny/config.pbtxt")
        assert member is not None
        config_text = member.read().decode()
    inputs, outputs = read_reference(artifact.reference_path)  # type: ignore[arg-type]
    nine_spec = parse_manifest({"version": 1, "models": [{**TINY, "name": "nine", "copies": 1, "source": {
        **TINY["source"], "config": {**TINY["source"]["config"], "num_labels": 9}}}]}).models[0]
    nine_dir = base / "nine"
    nine_dir.mkdir()
    nine = build_model(nine_spec, BuildOptions(base_dir=base), release_dir=nine_dir, work_dir=base / "work")

    # Release D: the same tarball, with a reference whose outputs are off by 1.0.
    shifted = base / "shifted" / "tiny.reference.npz"
    write_reference(shifted, inputs, {k: v + 1.0 for k, v in outputs.items()})
    shifted_tar = base / "shifted" / "tiny.tar.gz"
    shutil.copyfile(artifact.path, shifted_tar)

    with local_s3() as s3_url:
        s3 = make_s3_client(endpoint_url=s3_url)
        s3.create_bucket(Bucket=BUCKET)
        _publish(s3, artifact, RELEASE_A)
        _publish(s3, artifact, RELEASE_G)
        _add_targets(s3, RELEASE_G, {
            "oom.tar.gz": tar_gz({"oom/config.pbtxt": PYTHON_CONFIG.format(name="oom"), "oom/1/model.py": OOM_MODEL}),
            "slow.tar.gz": tar_gz({"slow/config.pbtxt": PYTHON_CONFIG.format(name="slow"),
                                   "slow/1/model.py": SLOW_MODEL}),
            "nine.tar.gz": (nine_dir / nine.tarball).read_bytes(),
            "gone.tar.gz": None,
        })
        _publish(s3, replace(artifact, targets=("tiny-0",)), RELEASE_B)
        _publish(s3, replace(artifact, config_path=None), RELEASE_C)
        _publish(s3, replace(artifact, path=shifted_tar, reference_path=shifted), RELEASE_D)
        _publish(s3, replace(artifact, reference_path=None), RELEASE_E)
        _publish(s3, artifact, RELEASE_F)
        s3.put_object(Bucket=BUCKET, Key=f"models/{RELEASE_F}/_reference/tiny.npz", Body=shifted.read_bytes())
        with local_endpoint(s3_client=s3, bucket=BUCKET, release_id=RELEASE_A) as endpoint, \
                local_endpoint(s3_client=s3, bucket=BUCKET, release_id=RELEASE_G) as faulty:
            yield Env(
                s3_url=s3_url, s3=s3, endpoint=endpoint, faulty=faulty, sagemaker=make_client("sagemaker", endpoint_url=endpoint.url),
                artifact=artifact, config_text=config_text, reference_inputs=inputs, reference_outputs=outputs,
            )


@pytest.fixture(autouse=True)
def _fresh(env: Env) -> None:
    env.endpoint.cache.invocations.clear()
    env.faulty.cache.invocations.clear()


def _row(report: Any, target: str) -> Any:
    return next(row for row in report.rows if row.target == target)


def _good(report: Any) -> list[Any]:
    return [row for row in report.rows if row.target in TARGETS]


# ---------------------------------------------------------------------------------------------
# Success paths
# ---------------------------------------------------------------------------------------------


def test_every_target_answers_and_matches_the_reference(env: Env) -> None:
    report = env.smoke()
    assert report.ok, [row.error for row in report.rows]
    assert [row.target for row in report.rows] == TARGETS
    assert report.release_id == RELEASE_A
    assert report.model_data_url == f"s3://{BUCKET}/models/{RELEASE_A}/"
    for row in report.rows:
        assert row.cold_ms is not None and row.cold_ms > 0
        assert row.warm_ms is not None and row.warm_ms > 0
        # ONNX Runtime on CPU as in the build: the answer is the reference, to float noise.
        assert row.max_diff is not None and row.max_diff < 1e-4
        assert row.error is None and row.kind is None
    # Each target exactly twice (cold, warm), and nothing else: no retries, no stray calls.
    assert env.endpoint.cache.invocations == {target: 2 for target in TARGETS}


def test_sample_invokes_exactly_n_deterministic_targets(env: Env) -> None:
    first = env.smoke(sample=2)
    assert first.ok
    chosen = [row.target for row in first.rows]
    assert len(chosen) == 2 and len(set(chosen)) == 2
    assert chosen == select_targets(TARGETS, 2, seed=0)
    assert env.endpoint.cache.invocations == {target: 2 for target in chosen}
    again = env.smoke(sample=2)
    assert [row.target for row in again.rows] == chosen
    # The sample depends on the seed alone: some seed picks another pair.
    assert any(select_targets(TARGETS, 2, seed=s) != chosen for s in range(1, 20))


def test_release_overrides_the_endpoints_release(env: Env) -> None:
    report = env.smoke(release=RELEASE_B)
    assert report.ok
    assert report.release_url == f"s3://{BUCKET}/models/{RELEASE_B}/"
    assert report.release_id == RELEASE_B
    assert [row.target for row in report.rows] == ["tiny-0.tar.gz"]  # B's index, not A's
    assert report.model_data_url == f"s3://{BUCKET}/models/{RELEASE_A}/"
    with pytest.raises(ModelBuildError) as caught:
        env.smoke(release="r-9999999999999999")
    assert "r-9999999999999999/_index.json" in str(caught.value)


def test_config_is_read_from_the_tarball_when_the_reference_config_is_missing(env: Env) -> None:
    assert "Contents" not in env.s3.list_objects_v2(
        Bucket=BUCKET, Prefix=f"models/{RELEASE_C}/_reference/tiny.config.pbtxt")
    published = env.s3.get_object(Bucket=BUCKET, Key=f"models/{RELEASE_A}/_reference/tiny.config.pbtxt")
    assert published["Body"].read().decode() == env.config_text  # what A's run read
    with env.serving(RELEASE_C) as endpoint:
        report = env.smoke(endpoint=endpoint)
    assert report.ok, [row.error for row in report.rows]
    assert len(report.rows) == 3


def test_cli_prints_the_table_and_exits_zero(env: Env, capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m model_build")
    add_smoke_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["smoke", *env.argv("--timeout", "60")])
    assert args.timeout == 60.0 and args.sample is None
    assert cmd_smoke(args) == 0
    out = capsys.readouterr().out
    for header in ("target", "result", "cold ms", "warm ms", "max difference", "error"):
        assert header in out
    for target in TARGETS:
        assert f"{target} " in out or f"{target}│" in out
    assert "3 of 3 targets passed" in out
    assert "FAILED" not in out


# ---------------------------------------------------------------------------------------------
# Failures, each of one target; the others pass
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def faulty_report(env: Env) -> Any:
    """One smoke run over release G, with an 8 s limit per call (the slow model needs 15 s)."""
    started = time.monotonic()
    report = env.smoke(timeout=8.0, endpoint=env.faulty)
    report.elapsed = time.monotonic() - started
    return report


def test_the_good_targets_pass_beside_the_faulty_ones(faulty_report: Any) -> None:
    assert not faulty_report.ok
    assert {row.target for row in faulty_report.failures} == set(FAULTY)
    assert all(row.ok for row in _good(faulty_report))


def test_out_of_memory_at_load_is_the_servers_507(faulty_report: Any) -> None:
    row = _row(faulty_report, "oom.tar.gz")
    assert (row.kind, row.status, row.code) == ("http", 507, "ModelError")
    assert "507" in row.error and "out of gpu memory" in row.error
    assert "load failed for model 'oom.tar.gz'" in row.error and "CUDA out of memory" in row.error
    assert row.cold_ms is None and row.warm_ms is None


def test_a_target_missing_from_s3_is_a_validation_error(faulty_report: Any) -> None:
    row = _row(faulty_report, "gone.tar.gz")
    assert (row.kind, row.status, row.code) == ("http", 400, "ValidationError")
    assert "cold and warm: ValidationError 400:" in row.error and "failed to download model data" in row.error


def test_an_answer_past_the_limit_is_a_timeout(env: Env, faulty_report: Any) -> None:
    row = _row(faulty_report, "slow.tar.gz")
    assert not row.ok and row.kind == "timeout"
    assert row.error == "cold and warm: timeout: no answer within the client's read timeout (8 s)", row.error
    assert row.status is None and row.cold_ms is None
    # One attempt per call: the endpoint saw the cold and the warm call, no retry.
    assert faulty_report.elapsed < 90.0


def test_wrong_output_shape_is_reported(faulty_report: Any) -> None:
    row = _row(faulty_report, "nine.tar.gz")
    assert not row.ok and row.kind == "output"
    assert "output 'logits': shape [2, 9]; expected [2, 10]" in row.error
    assert row.cold_ms is not None  # the call itself worked; its answer is wrong


def test_the_cli_exits_1_and_names_the_failed_target(env: Env, capsys: pytest.CaptureFixture[str]) -> None:
    # Release G's index checked against the endpoint that serves A: G's extra targets are unknown there.
    assert main(env.argv("--release", RELEASE_G)) == 1
    out = capsys.readouterr().out
    line = next(text for text in out.splitlines() if "oom.tar.gz" in text)
    assert "FAILED" in line and "ValidationError 400" in line
    assert f"3 of {3 + len(FAULTY)} targets passed" in out


def test_outputs_far_from_the_reference_are_reported(env: Env) -> None:
    with env.serving(RELEASE_D) as endpoint:
        report = env.smoke(endpoint=endpoint)
    assert not report.ok and len(report.failures) == 3
    row = report.rows[0]
    assert row.kind == "output" and "largest |difference| 1" in row.error
    assert row.max_diff is not None and abs(row.max_diff - 1.0) < 1e-3  # shown in the table


def test_missing_reference_fails_every_target_without_invoking(env: Env) -> None:
    with env.serving(RELEASE_E) as endpoint:
        report = env.smoke(endpoint=endpoint, sample=2)
        assert not endpoint.cache.invocations  # nothing to compare with: the endpoint is not bothered
    assert not report.ok and len(report.failures) == 2
    for row in report.rows:
        assert row.kind == "reference"
        assert row.error == f"reference s3://{BUCKET}/models/{RELEASE_E}/_reference/tiny.npz: missing"


def test_reference_changed_after_publish_is_refused(env: Env) -> None:
    with env.serving(RELEASE_F) as endpoint:
        report = env.smoke(endpoint=endpoint, sample=1)
    assert not report.ok
    assert report.rows[0].error == (
        f"reference s3://{BUCKET}/models/{RELEASE_F}/_reference/tiny.npz: sha256 differs from the index"
    )


def test_missing_index_gives_one_clear_error(env: Env, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ModelBuildError) as caught:
        env.smoke(release="r-0000000000000000")
    message = str(caught.value)
    assert "'local'" in message and "no release index" in message
    assert f"s3://{BUCKET}/models/r-0000000000000000/_index.json" in message
    assert not env.endpoint.cache.invocations  # nothing was invoked

    assert main(env.argv("--release", "r-0000000000000000")) == 1
    captured = capsys.readouterr()
    assert "error:" in captured.err and "no release index" in captured.err
    assert "Traceback" not in captured.err + captured.out


def test_unknown_endpoint_is_a_clear_error(env: Env) -> None:
    with pytest.raises(ModelBuildError, match=r"endpoint 'nope': describe_endpoint failed: ValidationException: "
                                              r"Could not find"):
        run_smoke(endpoint_name="nope", sagemaker_client=env.sagemaker, runtime_client=env.runtime(),
                  s3_client=env.s3, timeout_seconds=10)


def test_sample_must_be_positive() -> None:
    with pytest.raises(ModelBuildError, match="sample: got 0"):
        select_targets(TARGETS, 0)
    assert select_targets(TARGETS, 10) == TARGETS


# ---------------------------------------------------------------------------------------------
# The delivery pipeline's smoke step: its own command, from the synthesized buildspec
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pipeline_smoke(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The staging smoke action's last command, as the synthesized pipeline holds it."""
    from cdk_helpers import synth_pipeline

    synthesized = synth_pipeline(tmp_path_factory.mktemp("pipeline") / "out")
    template = synthesized.templates["TritonMmePipeline"]
    (pipeline,) = [r["Properties"] for r in template["Resources"].values() if r["Type"] == "AWS::CodePipeline::Pipeline"]
    (stage,) = [s for s in pipeline["Stages"] if s["Name"] == "staging"]
    (action,) = [a for a in stage["Actions"] if a["Name"] == "Smoke-staging"]
    project = template["Resources"][action["Configuration"]["ProjectName"]["Ref"]]["Properties"]
    command = str(json.loads(project["Source"]["BuildSpec"])["phases"]["build"]["commands"][-1])
    # The step runs the gate's code unpacked from the pipeline's own zip (stacks/pipeline_gate_code.py,
    # tests/test_pipeline_gate_code.py); here that code is this checkout, set up by `make setup`.
    from triton_mme_cdk.stacks.pipeline_gate_code import GATE_DIR

    assert f"{GATE_DIR}/.venv/bin/python" in command, command
    from cdk_helpers import ROOT

    return command.replace(GATE_DIR, str(ROOT))


def _run_step(command: str, env: Env, endpoint_name: str, endpoint_url: str) -> Any:
    """The step's command in a shell, with what CodeBuild gives it (the endpoint's name from the
    stack's output, the region, the role's credentials) pointed at the local endpoint and S3."""
    import os
    import subprocess

    from cdk_helpers import ROOT

    variables = {**os.environ, "ENDPOINT_NAME": endpoint_name, "AWS_REGION": "us-east-1",
                 "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                 "AWS_ENDPOINT_URL_SAGEMAKER": endpoint_url, "AWS_ENDPOINT_URL_SAGEMAKER_RUNTIME": endpoint_url,
                 "AWS_ENDPOINT_URL_S3": env.s3_url}
    return subprocess.run(["bash", "-c", command], cwd=ROOT, env=variables, capture_output=True, text=True, timeout=300)


@requires_triton
def test_the_pipelines_smoke_step_invokes_every_routed_model(env: Env, pipeline_smoke: str) -> None:
    done = _run_step(pipeline_smoke, env, ENDPOINT, env.url)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "3 of 3 targets passed" in done.stdout


@requires_triton
def test_a_smoke_step_that_cannot_reach_the_endpoint_fails_with_its_error(env: Env, pipeline_smoke: str) -> None:
    """Nothing listens there: the step fails at once with the endpoint's error, not a timeout."""
    started = time.monotonic()
    done = _run_step(pipeline_smoke, env, ENDPOINT, "http://127.0.0.1:9")
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-2000:]
    (error,) = done.stderr.strip().splitlines()
    assert error == ("error: endpoint 'local': describe_endpoint failed: Could not connect to the endpoint URL: "
                     '"http://127.0.0.1:9/"'), error
    assert time.monotonic() - started < 120
