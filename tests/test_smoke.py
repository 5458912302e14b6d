"""The endpoint smoke test, end to end over HTTP on loopback.

A tiny synthetic ResNet is built with the project's own pipeline (export, validate, config,
package), published with ``publish_release`` to moto's S3 server, and served by
``fake_sagemaker_runtime.FakeSageMaker``, which loads the real tarballs from S3 and runs them with
ONNX Runtime like the Triton container would. boto3 clients talk to both servers unpatched.
"""

from __future__ import annotations

import argparse
import shutil
import tarfile
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pytest
from fake_sagemaker_runtime import FakeSageMaker, Fault  # tests/ is on sys.path (as for s3_faults)

from model_build.build import build_model
from model_build.errors import ModelBuildError
from model_build.local_s3 import local_s3, make_s3_client
from model_build.manifest import parse_manifest
from model_build.publish import publish_release
from model_build.smoke import (
    add_smoke_parser,
    cmd_smoke,
    main,
    make_client,
    make_runtime_client,
    run_smoke,
    select_targets,
)
from model_build.types import Artifact
from model_build.validate import read_reference, write_reference
from model_build.verify import decode_request

BUCKET = "smoke-test-releases"
RELEASE_A = "r-aaaaaaaaaaaaaaaa"
RELEASE_B = "r-bbbbbbbbbbbbbbbb"  # only tiny-0, to tell its index from A's
RELEASE_C = "r-cccccccccccccccc"  # no _reference/<model>.config.pbtxt (published before it existed)
RELEASE_D = "r-dddddddddddddddd"  # reference outputs shifted: the endpoint answers "wrongly"
RELEASE_E = "r-eeeeeeeeeeeeeeee"  # tarballs and index but no reference .npz
RELEASE_F = "r-ffffffffffffffff"  # reference .npz replaced after the index was written
ENDPOINT = "mme-smoke"
TARGETS = ["tiny-0.tar.gz", "tiny-1.tar.gz", "tiny-2.tar.gz"]

MANIFEST = {
    "models": [
        {
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
    ]
}


@dataclass
class Env:
    s3_url: str
    s3: Any
    fake: FakeSageMaker
    sagemaker: Any
    artifact: Artifact
    config_text: str
    reference_inputs: dict[str, np.ndarray]
    reference_outputs: dict[str, np.ndarray]

    def runtime(self, timeout: float = 30.0) -> Any:
        return make_runtime_client(endpoint_url=self.fake.url, timeout_seconds=timeout)

    def smoke(self, endpoint: str = ENDPOINT, timeout: float = 30.0, **kwargs: Any) -> Any:
        return run_smoke(
            endpoint_name=endpoint, sagemaker_client=self.sagemaker, runtime_client=self.runtime(timeout),
            s3_client=self.s3, timeout_seconds=timeout, **kwargs,
        )

    def argv(self, *extra: str, endpoint: str = ENDPOINT) -> list[str]:
        return [
            "--endpoint", endpoint, "--sagemaker-endpoint-url", self.fake.url,
            "--runtime-endpoint-url", self.fake.url, "--s3-endpoint-url", self.s3_url, *extra,
        ]


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


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    base = tmp_path_factory.mktemp("smoke")
    release_dir = base / "release"
    release_dir.mkdir()
    spec = parse_manifest(MANIFEST).models[0]
    result = build_model(spec, base_dir=base, release_dir=release_dir, work_dir=base / "work")
    artifact = result.artifact(release_dir)
    with tarfile.open(artifact.path) as tar:
        member = tar.extractfile("tiny/config.pbtxt")
        assert member is not None
        config_text = member.read().decode()
    inputs, outputs = read_reference(artifact.reference_path)  # type: ignore[arg-type]

    # Release D: the same tarball, with a reference whose outputs are off by 1.0.
    shifted = base / "shifted" / "tiny.reference.npz"
    write_reference(shifted, inputs, {k: v + 1.0 for k, v in outputs.items()})
    shifted_tar = base / "shifted" / "tiny.tar.gz"
    shutil.copyfile(artifact.path, shifted_tar)

    with local_s3() as s3_url:
        s3 = make_s3_client(endpoint_url=s3_url)
        s3.create_bucket(Bucket=BUCKET)
        url_a = _publish(s3, artifact, RELEASE_A)
        _publish(s3, replace(artifact, targets=("tiny-0",)), RELEASE_B)
        url_c = _publish(s3, replace(artifact, config_path=None), RELEASE_C)
        url_d = _publish(s3, replace(artifact, path=shifted_tar, reference_path=shifted), RELEASE_D)
        url_e = _publish(s3, replace(artifact, reference_path=None), RELEASE_E)
        url_f = _publish(s3, artifact, RELEASE_F)
        s3.put_object(Bucket=BUCKET, Key=f"models/{RELEASE_F}/_reference/tiny.npz", Body=shifted.read_bytes())
        with FakeSageMaker(make_s3_client(endpoint_url=s3_url)) as fake:
            fake.add_endpoint(ENDPOINT, url_a)
            fake.add_endpoint("mme-old-release", url_c)
            fake.add_endpoint("mme-shifted", url_d)
            fake.add_endpoint("mme-no-reference", url_e)
            fake.add_endpoint("mme-tampered", url_f)
            fake.add_endpoint("mme-unpublished", f"s3://{BUCKET}/models/r-0000000000000000/")
            fake.add_endpoint("mme-creating", url_a, status="Creating")
            yield Env(
                s3_url=s3_url, s3=s3, fake=fake, sagemaker=make_client("sagemaker", endpoint_url=fake.url),
                artifact=artifact, config_text=config_text, reference_inputs=inputs, reference_outputs=outputs,
            )


@pytest.fixture(autouse=True)
def _fresh(env: Env) -> None:
    env.fake.clear()


def _row(report: Any, target: str) -> Any:
    return next(row for row in report.rows if row.target == target)


def _invoked(env: Env) -> Counter[str]:
    return Counter(call.target for call in env.fake.invocations)


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
        # Same ONNX Runtime on CPU as the build: the answer is the reference, to float noise.
        assert row.max_diff is not None and row.max_diff < 1e-4
        assert row.error is None and row.kind is None
    # Each target exactly twice (cold, warm), and nothing else: no retries, no stray calls.
    assert _invoked(env) == Counter({target: 2 for target in TARGETS})
    assert [op for op, _ in env.fake.control_calls] == ["DescribeEndpoint", "DescribeEndpointConfig", "DescribeModel"]


def test_request_bodies_decode_to_the_reference_inputs(env: Env) -> None:
    env.smoke()
    assert len(env.fake.invocations) == 6
    for call in env.fake.invocations:
        prefix, _, size = call.content_type.partition(";json-header-size=")
        assert prefix == "application/vnd.sagemaker-triton.binary+json"
        decoded = decode_request(call.body, int(size))
        assert set(decoded) == set(env.reference_inputs)
        for name, array in env.reference_inputs.items():
            assert decoded[name].dtype == array.dtype
            np.testing.assert_array_equal(decoded[name], array)


def test_sample_invokes_exactly_n_deterministic_targets(env: Env) -> None:
    first = env.smoke(sample=2)
    assert first.ok
    chosen = [row.target for row in first.rows]
    assert len(chosen) == 2 and len(set(chosen)) == 2
    assert chosen == select_targets(TARGETS, 2, seed=0)
    assert _invoked(env) == Counter({target: 2 for target in chosen})
    env.fake.clear()
    again = env.smoke(sample=2)
    assert [row.target for row in again.rows] == chosen
    assert set(_invoked(env)) == set(chosen)
    # The sample depends on the seed alone: some seed picks another pair.
    assert any(select_targets(TARGETS, 2, seed=s) != chosen for s in range(1, 20))


def test_plain_json_answer_is_accepted(env: Env) -> None:
    env.fake.set_fault("tiny-1.tar.gz", Fault(json_answer=True))
    report = env.smoke()
    assert report.ok, _row(report, "tiny-1.tar.gz").error
    assert _row(report, "tiny-1.tar.gz").max_diff < 1e-4


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
    report = env.smoke("mme-old-release")
    assert report.ok, [row.error for row in report.rows]
    assert len(report.rows) == 3


def test_cli_prints_the_table_and_exits_zero(env: Env, capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m model_build")
    add_smoke_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["smoke", *env.argv("--timeout", "30")])
    assert args.timeout == 30.0 and args.sample is None
    assert cmd_smoke(args) == 0
    out = capsys.readouterr().out
    for header in ("target", "result", "cold ms", "warm ms", "max difference", "error"):
        assert header in out
    for target in TARGETS:
        assert f"{target} " in out or f"{target}│" in out
    assert "3 of 3 targets passed" in out
    assert "FAILED" not in out


# ---------------------------------------------------------------------------------------------
# Failures
# ---------------------------------------------------------------------------------------------


def test_out_of_gpu_memory_507_fails_that_target(env: Env, capsys: pytest.CaptureFixture[str]) -> None:
    env.fake.set_fault("tiny-1.tar.gz", Fault(status=507, message='{"error":"CUDA out of memory"}'))
    report = env.smoke()
    assert not report.ok
    assert [row.target for row in report.failures] == ["tiny-1.tar.gz"]
    row = _row(report, "tiny-1.tar.gz")
    assert (row.kind, row.status, row.code) == ("http", 507, "ModelError")
    assert "507" in row.error and "out of gpu memory" in row.error and "CUDA out of memory" in row.error
    assert row.cold_ms is None and row.warm_ms is None
    assert _row(report, "tiny-0.tar.gz").ok and _row(report, "tiny-2.tar.gz").ok

    assert main(env.argv()) == 1
    out = capsys.readouterr().out
    line = next(text for text in out.splitlines() if "tiny-1.tar.gz" in text)
    assert "FAILED" in line and "507" in line
    assert "2 of 3 targets passed" in out


def test_validation_error_400_fails_that_target(env: Env, capsys: pytest.CaptureFixture[str]) -> None:
    env.fake.set_fault("tiny-2.tar.gz", Fault(validation_error=True, message="Invalid TargetModel header."))
    report = env.smoke()
    assert [row.target for row in report.failures] == ["tiny-2.tar.gz"]
    row = _row(report, "tiny-2.tar.gz")
    assert (row.kind, row.status, row.code) == ("http", 400, "ValidationError")
    assert row.error == "cold and warm: ValidationError 400: Invalid TargetModel header."
    assert main(env.argv()) == 1
    assert "ValidationError 400" in capsys.readouterr().out


def test_stall_past_the_timeout_is_a_timeout(env: Env) -> None:
    env.fake.set_fault("tiny-0.tar.gz", Fault(stall_seconds=4.0))
    started = time.monotonic()
    report = env.smoke(timeout=1.0)
    elapsed = time.monotonic() - started
    row = _row(report, "tiny-0.tar.gz")
    assert not row.ok and row.kind == "timeout"
    assert row.error.startswith("cold and warm: timeout: no answer after 1.")
    assert "read timeout" in row.error
    assert row.status is None and row.cold_ms is None
    assert _row(report, "tiny-1.tar.gz").ok and _row(report, "tiny-2.tar.gz").ok
    # One attempt per call (no retry of a timed-out invocation), and the run waited ~2 x 1 s.
    assert _invoked(env)["tiny-0.tar.gz"] == 2
    assert elapsed < 8.0


def test_answer_later_than_the_limit_counts_as_timeout(env: Env) -> None:
    """A client built with a longer read timeout still gets the run's limit applied."""
    env.fake.set_fault("tiny-0.tar.gz", Fault(stall_seconds=1.2))
    report = run_smoke(
        endpoint_name=ENDPOINT, sagemaker_client=env.sagemaker, runtime_client=env.runtime(30.0),
        s3_client=env.s3, timeout_seconds=1.0, sample=None,
    )
    row = _row(report, "tiny-0.tar.gz")
    assert row.kind == "timeout" and "over the 1 s limit" in row.error


def test_wrong_output_shape_is_reported(env: Env) -> None:
    env.fake.set_fault("tiny-2.tar.gz", Fault(wrong_shape=True))
    report = env.smoke()
    row = _row(report, "tiny-2.tar.gz")
    assert not report.ok and not row.ok and row.kind == "output"
    assert "output 'logits': shape [2, 9]; expected [2, 10]" in row.error
    assert row.cold_ms is not None  # the call itself worked; its answer is wrong


def test_outputs_far_from_the_reference_are_reported(env: Env) -> None:
    report = env.smoke("mme-shifted")
    assert not report.ok and len(report.failures) == 3
    row = report.rows[0]
    assert row.kind == "output" and "largest |difference| 1" in row.error
    assert row.max_diff is not None and abs(row.max_diff - 1.0) < 1e-3  # shown in the table


def test_missing_reference_fails_every_target_without_invoking(env: Env) -> None:
    report = env.smoke("mme-no-reference", sample=2)
    assert not report.ok and len(report.failures) == 2
    for row in report.rows:
        assert row.kind == "reference"
        assert row.error == f"reference s3://{BUCKET}/models/{RELEASE_E}/_reference/tiny.npz: missing"
    assert not env.fake.invocations  # nothing to compare with: the endpoint is not bothered


def test_reference_changed_after_publish_is_refused(env: Env) -> None:
    report = env.smoke("mme-tampered", sample=1)
    assert not report.ok
    assert report.rows[0].error == (
        f"reference s3://{BUCKET}/models/{RELEASE_F}/_reference/tiny.npz: sha256 differs from the index"
    )


def test_missing_index_gives_one_clear_error(env: Env, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ModelBuildError) as caught:
        env.smoke("mme-unpublished")
    message = str(caught.value)
    assert "'mme-unpublished'" in message
    assert f"s3://{BUCKET}/models/r-0000000000000000/_index.json" in message
    assert "model data url s3://" in message and "no release index" in message
    assert env.fake.invocations.maxlen and not env.fake.invocations  # nothing was invoked

    assert main(env.argv(endpoint="mme-unpublished")) == 1
    captured = capsys.readouterr()
    assert "error:" in captured.err and "no release index" in captured.err
    assert "Traceback" not in captured.err + captured.out


def test_unknown_endpoint_and_dead_endpoint_are_clear_errors(env: Env) -> None:
    with pytest.raises(ModelBuildError, match=r"endpoint 'nope': describe_endpoint failed: ValidationException: "
                                              r"Could not find endpoint"):
        env.smoke("nope")
    with pytest.raises(ModelBuildError, match=r"endpoint 'mme-creating': status Creating"):
        env.smoke("mme-creating")


def test_sample_must_be_positive() -> None:
    with pytest.raises(ModelBuildError, match="sample: got 0"):
        select_targets(TARGETS, 0)
    assert select_targets(TARGETS, 10) == TARGETS


def test_fake_runtime_answers_like_triton(env: Env) -> None:
    """The fake itself: a model missing in S3 is SageMaker's ValidationError, garbage is a 400 from Triton."""
    from botocore.exceptions import ClientError

    runtime = env.runtime()
    with pytest.raises(ClientError) as caught:
        runtime.invoke_endpoint(EndpointName=ENDPOINT, TargetModel="absent.tar.gz",
                                ContentType="application/json", Body=b"{}")
    assert caught.value.response["Error"]["Code"] == "ValidationError"
    assert "Failed to download model data" in caught.value.response["Error"]["Message"]
    with pytest.raises(ClientError) as caught:
        runtime.invoke_endpoint(EndpointName=ENDPOINT, TargetModel="tiny-0.tar.gz",
                                ContentType="application/json", Body=b'{"inputs": []}')
    assert caught.value.response["Error"]["Code"] == "ModelError"
    assert caught.value.response["OriginalStatusCode"] == 400
    assert "pixel_values" in caught.value.response["OriginalMessage"]
