"""``triton-mme doctor`` and the repair of what is served, against moto's S3 server on loopback.

- A served object deleted, or overwritten, while routed: ``doctor`` names the object and the
  route (exit 3), a re-activation of the routed release repairs it from the store with no upload,
  and ``doctor --repair`` does the same.
- The routes document restored to an older S3 version whose object the retention window removed:
  named, and repaired by routing that release again.
- A store that lost the build too: exit 4, and ``--repair`` refuses it saying why.
- Bad input: a bucket that is not this project's (no routes document), another stack's routes,
  another prefix's routes, S3 refusing the reads: one line each, exit 1, no stack trace; and no
  request that writes is ever sent without ``--repair``.
"""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from s3_faults import FaultProxy, Rule

from triton_mme_cdk.model_build.__main__ import main
from triton_mme_cdk.model_build.aws_clients import make_s3_client
from triton_mme_cdk.model_build.release import Release, routes_key
from triton_mme_cdk.model_build.release.invariants import check_bucket
from triton_mme_cdk.model_build.release.routes import served_name
from triton_mme_cdk.model_build.release.serving import activate_release
from triton_mme_cdk.model_build.release.store import (
    ReleaseTarget,
    StoredModel,
    assemble_release,
    publish_unit,
)
from triton_mme_cdk.model_build.types import Artifact

PREFIX = "models"
STACK = "arn:aws:cloudformation:us-east-1:123456789012:stack/TritonMme/5d1c0f3e"
DAY = 86400.0


@pytest.fixture
def s3(endpoint: str) -> Any:
    return make_s3_client(endpoint_url=endpoint)


@pytest.fixture
def bucket(s3: Any) -> str:
    name = f"doctor-{uuid.uuid4().hex[:12]}"
    s3.create_bucket(Bucket=name)
    s3.put_bucket_versioning(Bucket=name, VersioningConfiguration={"Status": "Enabled"})  # as the stack's bucket
    return name


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _release(s3: Any, bucket: str, tmp: Path, models: dict[str, bytes], release_id: str) -> None:
    """Store each model and assemble the release (its index written; nothing routed)."""
    stored = []
    for name, payload in models.items():
        path = tmp / f"{name}-{_sha(payload)[:8]}.tar.gz"
        path.write_bytes(payload)
        key = "k-" + _sha(payload)[:32]
        publish_unit(Artifact(name=name, format="onnx", path=path, sha256=_sha(payload), size=len(payload),
                              targets=(name,)), key, s3_client=s3, bucket=bucket, model_prefix=PREFIX)
        stored.append(StoredModel(name, key, (name,), "onnx"))
    assemble_release(stored, ReleaseTarget.of(Release(release_id, "0" * 64, "c" * 64), s3, bucket, PREFIX))


def _served(name: str, payload: bytes) -> str:
    return f"{PREFIX}/served/{served_name(name, _sha(payload))}"


def _doctor(capsys: pytest.CaptureFixture[str], endpoint: str, bucket: str, *args: str) -> tuple[int, str, str]:
    code = main(["doctor", "--bucket", bucket, "--prefix", PREFIX, "--endpoint-url", endpoint, *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.fixture
def routed(s3: Any, bucket: str, tmp_path: Path) -> dict[str, bytes]:
    models = {"a": b"A1" * 100, "b": b"B1" * 100}
    _release(s3, bucket, tmp_path, models, "r-000000000000000a")
    activate_release(s3, bucket, PREFIX, "r-000000000000000a", stack=STACK)
    return models


def test_a_served_object_deleted_while_routed_is_named_and_a_reactivation_copies_it_back(
        s3: Any, bucket: str, endpoint: str, routed: dict[str, bytes], capsys: pytest.CaptureFixture[str]) -> None:
    key = _served("b", routed["b"])
    s3.delete_object(Bucket=bucket, Key=key)
    code, out, _ = _doctor(capsys, endpoint, bucket)
    assert code == 3, out
    (line,) = [line for line in out.splitlines() if line.startswith("routed-object")]
    assert f"s3://{bucket}/{key}" in line and "route 'b'" in line and "missing" in line, line
    assert "repair: copy back from" in line and "_builds/" in line
    # Routing the same release again repairs it from the store: a server-side copy, nothing uploaded.
    with FaultProxy(endpoint) as proxy:
        report = activate_release(make_s3_client(endpoint_url=proxy.url), bucket, PREFIX, "r-000000000000000a",
                                  stack=STACK)
        assert report.copied == 1 and proxy.bytes_uploaded() == 0
    assert check_bucket(s3, bucket, PREFIX, read_bytes=True).holds
    assert _doctor(capsys, endpoint, bucket)[0] == 0


def test_a_served_object_overwritten_while_routed_is_named_and_repaired_by_doctor(
        s3: Any, bucket: str, endpoint: str, routed: dict[str, bytes], capsys: pytest.CaptureFixture[str]) -> None:
    key = _served("a", routed["a"])
    s3.put_object(Bucket=bucket, Key=key, Body=b"tampered", Metadata={"sha256": _sha(b"tampered")})
    code, out, _ = _doctor(capsys, endpoint, bucket, "--format", "json")
    document = json.loads(out)
    assert code == 3 and document["exit_code"] == 3
    (found,) = document["violations"]
    assert found["invariant"] == "routed-object" and found["object"] == f"s3://{bucket}/{key}"
    assert found["route"] == "a" and "holds other bytes" in found["problem"]
    code, out, _ = _doctor(capsys, endpoint, bucket, "--repair")
    assert code == 0, out
    assert any(line.startswith("repaired: routed-object") for line in out.splitlines()), out
    assert s3.get_object(Bucket=bucket, Key=key)["Body"].read() == routed["a"]
    assert _doctor(capsys, endpoint, bucket, "--read-bytes")[0] == 0


def test_routes_restored_to_an_older_version_are_named_and_repaired_by_routing_that_release(
        s3: Any, bucket: str, endpoint: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    now = time.time()
    _release(s3, bucket, tmp_path, {"a": b"A1" * 100, "b": b"B1" * 100}, "r-000000000000000a")
    activate_release(s3, bucket, PREFIX, "r-000000000000000a", stack=STACK, clock=lambda: now - 20 * DAY)
    old_version = s3.head_object(Bucket=bucket, Key=routes_key(PREFIX))["VersionId"]
    _release(s3, bucket, tmp_path, {"a": b"A1" * 100, "b": b"B2" * 100}, "r-000000000000000b")
    activate_release(s3, bucket, PREFIX, "r-000000000000000b", stack=STACK, clock=lambda: now - 19 * DAY)
    report = activate_release(s3, bucket, PREFIX, "r-000000000000000b", stack=STACK, clock=lambda: now - DAY)
    gone = _served("b", b"B1" * 100)
    assert report.deleted == [gone.rsplit("/", 1)[1]], "the window removed the old b"
    # Someone restores the routes document's older version (S3 versioning's "restore").
    s3.copy_object(Bucket=bucket, Key=routes_key(PREFIX),
                   CopySource={"Bucket": bucket, "Key": routes_key(PREFIX), "VersionId": old_version})
    code, out, _ = _doctor(capsys, endpoint, bucket)
    assert code == 3, out
    assert any(f"s3://{bucket}/{gone}" in line and "route 'b'" in line for line in out.splitlines()), out
    again = activate_release(s3, bucket, PREFIX, "r-000000000000000a", stack=STACK)
    assert again.copied == 1
    assert _doctor(capsys, endpoint, bucket, "--read-bytes")[0] == 0


def test_an_object_the_store_lost_too_is_refused_with_the_reason(
        s3: Any, bucket: str, endpoint: str, routed: dict[str, bytes], capsys: pytest.CaptureFixture[str]) -> None:
    key = _served("b", routed["b"])
    s3.delete_object(Bucket=bucket, Key=key)
    store = f"{PREFIX}/_builds/k-{_sha(routed['b'])[:32]}/model.tar.gz"
    s3.delete_object(Bucket=bucket, Key=store)
    code, out, _ = _doctor(capsys, endpoint, bucket)
    assert code == 4 and "not repairable from the store" in out and store in out, out
    code, out, _ = _doctor(capsys, endpoint, bucket, "--repair")
    assert code == 4, out
    (line,) = [line for line in out.splitlines() if line.startswith("refused:")]
    assert "route 'b'" in line and "is gone too: build and deploy the model again" in line, line


@pytest.fixture
def watched(endpoint: str) -> Iterator[FaultProxy]:
    with FaultProxy(endpoint) as proxy:
        yield proxy


def _writes(proxy: FaultProxy) -> list[str]:
    return [f"{r.method} {r.target}" for r in proxy.records if r.method in {"PUT", "POST", "DELETE"}]


def test_doctor_without_repair_sends_no_write(
        s3: Any, bucket: str, watched: FaultProxy, routed: dict[str, bytes], capsys: pytest.CaptureFixture[str]) -> None:
    s3.delete_object(Bucket=bucket, Key=_served("a", routed["a"]))
    s3.put_object(Bucket=bucket, Key=_served("b", routed["b"]), Body=b"x", Metadata={"sha256": _sha(b"x")})
    code, out, _ = _doctor(capsys, watched.url, bucket, "--read-bytes")
    assert code == 3 and out.count("routed-object") == 2, out
    assert watched.records and _writes(watched) == []


def test_bad_input_is_one_line_naming_what_was_read_and_what_was_expected(
        s3: Any, bucket: str, endpoint: str, watched: FaultProxy, routed: dict[str, bytes],
        capsys: pytest.CaptureFixture[str]) -> None:
    where = f"s3://{bucket}/{routes_key(PREFIX)}"
    # Not this project's: no routes document under the prefix.
    other = f"other-{uuid.uuid4().hex[:12]}"
    s3.create_bucket(Bucket=other)
    s3.put_object(Bucket=other, Key=f"{PREFIX}/data.csv", Body=b"1,2\n")
    code, out, err = _doctor(capsys, endpoint, other, "--repair")
    assert code == 1 and out == "" and "Traceback" not in err
    assert f"s3://{other}/{routes_key(PREFIX)}: no routes document; expected" in " ".join(err.split()), err
    assert s3.list_objects_v2(Bucket=other)["KeyCount"] == 1, "nothing written, even with --repair"
    # Another stack's routes.
    code, _, err = _doctor(capsys, endpoint, bucket, "--stack", "SomeOtherStack")
    text = " ".join(err.split())
    assert code == 1 and f"{where}: written by stack {STACK}; expected stack SomeOtherStack" in text, err
    assert _doctor(capsys, endpoint, bucket, "--stack", "TritonMme")[0] == 0, "its own stack, by name"
    # The routes of another prefix, copied under this one.
    s3.copy_object(Bucket=bucket, Key=f"moved/{routes_key('')}", CopySource={"Bucket": bucket, "Key": routes_key(PREFIX)})
    code = main(["doctor", "--bucket", bucket, "--prefix", "moved", "--endpoint-url", endpoint])
    text = " ".join(capsys.readouterr().err.split())
    assert code == 1 and f"serves s3://{bucket}/{PREFIX}/served/; expected s3://{bucket}/moved/served/" in text, text
    # S3 refuses the reads: the permissions doctor needs.
    watched.add(Rule("error", status=403, code="AccessDenied", times=10_000))
    code, out, err = _doctor(capsys, watched.url, bucket, "--repair")
    text = " ".join(err.split())
    assert code == 1 and out == "" and "Traceback" not in err
    assert f"reading {where}: AccessDenied; doctor needs s3:ListBucket on arn:aws:s3:::{bucket}" in text, text
    assert f"s3:GetObject on arn:aws:s3:::{bucket}/{PREFIX}/*" in text and "s3:PutObject" in text, text
    assert _writes(watched) == []
    # A usage error: argparse's exit 2, naming the option.
    with pytest.raises(SystemExit) as usage:
        main(["doctor", "--bucket", bucket, "--retention-days", "0"])
    assert usage.value.code == 2 and "--retention-days: got '0'" in capsys.readouterr().err


def test_a_retained_object_deleted_is_named_and_repaired_and_a_lost_index_is_refused(
        s3: Any, bucket: str, endpoint: str, tmp_path: Path, routed: dict[str, bytes],
        capsys: pytest.CaptureFixture[str]) -> None:
    _release(s3, bucket, tmp_path, {"a": routed["a"], "b": b"B2" * 100}, "r-000000000000000b")
    activate_release(s3, bucket, PREFIX, "r-000000000000000b", stack=STACK)  # b of release a: kept for the window
    kept = _served("b", routed["b"])
    s3.delete_object(Bucket=bucket, Key=kept)
    code, out, _ = _doctor(capsys, endpoint, bucket)
    assert code == 3, out
    (line,) = [line for line in out.splitlines() if line.startswith("retained-object")]
    assert f"s3://{bucket}/{kept}" in line and "route 'b'" in line and "missing" in line, line
    assert _doctor(capsys, endpoint, bucket, "--repair")[0] == 0
    assert s3.get_object(Bucket=bucket, Key=kept)["Body"].read() == routed["b"]
    # The routed release's index is gone: nothing in the store can write it again.
    index = f"{PREFIX}/_releases/r-000000000000000b/_index.json"
    s3.delete_object(Bucket=bucket, Key=index)
    code, out, _ = _doctor(capsys, endpoint, bucket, "--repair")
    assert code == 4, out
    (line,) = [line for line in out.splitlines() if line.startswith("refused: release-index")]
    assert f"s3://{bucket}/{index}" in line and "deploy (or publish) a release again" in line, line
