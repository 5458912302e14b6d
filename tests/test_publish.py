"""Publishing against a real S3 API over HTTP: moto's server on loopback, behind a fault proxy.

No patched clients: every call goes through botocore's HTTP stack, so retries, checksums,
multipart uploads and timeouts are exercised as they run against AWS. ``direct`` is a second
client that talks to moto without the proxy, for setting up and inspecting buckets.

What moto 5.2.5 does not do, and how the tests deal with it:

- It stores whatever ``x-amz-checksum-sha256`` a client sends without checking it against the
  body (AWS answers ``BadDigest``). The tests therefore check what the client *sent* (the proxy
  records the header of every PUT and part) against digests computed here, and check what moto
  stored by reading the bytes back.
- A ``CopyObject`` with ``x-amz-checksum-algorithm`` makes moto compute the copy's checksum from
  the copied bytes, as AWS does: the tests use that as the server-side evidence for copies.
- For a multipart object moto's HeadObject returns the composite checksum without its ``-<parts>``
  suffix and without ``x-amz-checksum-type`` (GetObject has both); publish recognises a composite
  value by the multipart ETag as well, and the tests compare the value with the composite digest.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import random
import socket
import tarfile
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from boto3.s3.transfer import TransferConfig
from s3_faults import FaultProxy, Rule  # tests/ is on sys.path; a site-packages "tests" shadows tests.

from triton_mme_cdk.model_build.aws_clients import make_s3_client
from triton_mme_cdk.model_build.errors import PublishError
from triton_mme_cdk.model_build.release import transfer
from triton_mme_cdk.model_build.release.index import index_body, read_index
from triton_mme_cdk.model_build.release.publish import (
    PublishReport,
    delete_release,
    download_release,
    publish_naive,
    publish_release,
    retire_release,
)
from triton_mme_cdk.model_build.tools.local_s3 import local_s3
from triton_mme_cdk.model_build.types import Artifact

MIB = 1024**2
PREFIX = "models/r-0123456789abcdef"
EXTRA = {"release_id": "r-0123456789abcdef", "manifest_sha256": "m" * 64, "code_sha256": "c" * 64}
#: Multipart from 5 MiB (S3's smallest part), so an 11 MiB tarball goes up in 3 parts.
SMALL_MULTIPART = TransferConfig(multipart_threshold=5 * MIB, multipart_chunksize=5 * MIB)


# ---------------------------------------------------------------------------------------------
# Fixtures and helpers
# ---------------------------------------------------------------------------------------------


@pytest.fixture
def direct(endpoint: str) -> Any:
    return make_s3_client(endpoint_url=endpoint)


@pytest.fixture
def client(proxy: FaultProxy) -> Any:
    return make_s3_client(endpoint_url=proxy.url, max_attempts=5, read_timeout=5)


@pytest.fixture
def bucket(direct: Any) -> str:
    # moto keeps one in-memory state per process: a fresh bucket isolates each test.
    name = f"test-{uuid.uuid4().hex[:16]}"
    direct.create_bucket(Bucket=name)
    return name


def make_artifact(
    folder: Path, name: str, *, size: int, copies: int = 1, reference: bool = False, seed: int = 0
) -> Artifact:
    """A real ``model.tar.gz`` (random payload, so it does not compress) and, optionally, a
    reference ``.npz``; copies are named like the manifest names them."""
    folder.mkdir(parents=True, exist_ok=True)
    payload = random.Random(f"{name}-{seed}").randbytes(size)
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz", compresslevel=1) as tar:
        info = tarfile.TarInfo(f"{name}/1/model.onnx")
        info.size = len(payload)
        tar.addfile(info, io.BytesIO(payload))
    path = folder / f"{name}.tar.gz"
    path.write_bytes(buffer.getvalue())
    reference_path = None
    if reference:
        reference_path = folder / f"{name}-reference.npz"
        rng = np.random.default_rng(seed)
        np.savez(reference_path, input_ids=rng.integers(0, 100, (2, 8)), output=rng.random((2, 4)))
    data = path.read_bytes()
    targets = tuple(f"{name}-{i}" for i in range(copies)) if copies > 1 else (name,)
    return Artifact(
        name=name,
        format="onnx",
        path=path,
        sha256=hashlib.sha256(data).hexdigest(),
        size=len(data),
        targets=targets,
        reference_path=reference_path,
    )


def b64sha(data: bytes) -> str:
    return base64.b64encode(hashlib.sha256(data).digest()).decode()


def read(client: Any, bucket: str, key: str) -> bytes:
    return client.get_object(Bucket=bucket, Key=key)["Body"].read()


def keys_under(client: Any, bucket: str, prefix: str) -> dict[str, int]:
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
    return {item["Key"]: item["Size"] for page in pages for item in page.get("Contents", [])}


def assert_complete(direct: Any, bucket: str, artifacts: list[Artifact]) -> None:
    """Every target holds its artifact's bytes, sha256 metadata, and a SHA-256 checksum that S3
    stored with it."""
    for artifact in artifacts:
        data = artifact.path.read_bytes()
        for target in artifact.targets:
            key = f"{PREFIX}/{target}.tar.gz"
            head = direct.head_object(Bucket=bucket, Key=key, ChecksumMode="ENABLED")
            assert head["Metadata"]["sha256"] == artifact.sha256, key
            assert head["ContentLength"] == artifact.size, key
            assert "ChecksumSHA256" in head, f"{key}: no SHA-256 checksum stored"
            assert hashlib.sha256(read(direct, bucket, key)).hexdigest() == artifact.sha256, key
            if artifact.size < 5 * MIB:
                assert head["ChecksumSHA256"] == b64sha(data), key


def assert_no_partial_objects(direct: Any, bucket: str) -> None:
    """Whatever a failed publish left must be whole: its bytes hash to its sha256 metadata."""
    for key in keys_under(direct, bucket, f"{PREFIX}/"):
        head = direct.head_object(Bucket=bucket, Key=key)
        assert hashlib.sha256(read(direct, bucket, key)).hexdigest() == head["Metadata"]["sha256"], key


def open_uploads(direct: Any, bucket: str) -> list[dict[str, Any]]:
    return direct.list_multipart_uploads(Bucket=bucket, Prefix=f"{PREFIX}/").get("Uploads", [])


def run(artifacts: list[Artifact], client: Any, bucket: str, **kwargs: Any) -> PublishReport:
    return publish_release(
        artifacts, s3_client=client, bucket=bucket, release_prefix=PREFIX, index_extra=EXTRA, **kwargs
    )


@pytest.fixture
def three(tmp_path: Path) -> list[Artifact]:
    """Three models: one with a reference, one with 3 copies, one with 50 copies."""
    return [
        make_artifact(tmp_path, "alpha", size=3000, reference=True),
        make_artifact(tmp_path, "bravo", size=40_000, copies=3),
        make_artifact(tmp_path, "charlie", size=120_000, copies=50),
    ]


# ---------------------------------------------------------------------------------------------
# Publishing
# ---------------------------------------------------------------------------------------------


def test_publish_uploads_each_tarball_once_and_copies_the_rest_server_side(
    three: list[Artifact], proxy: FaultProxy, client: Any, direct: Any, bucket: str
) -> None:
    events: list[tuple[str, int]] = []
    report = run(three, client, bucket, progress=lambda key, sent: events.append((key, sent)))

    index_size = direct.head_object(Bucket=bucket, Key=f"{PREFIX}/_index.json")["ContentLength"]
    reference_size = three[0].reference_path.stat().st_size  # type: ignore[union-attr]
    unique = sum(a.size for a in three)
    assert report.targets == 54
    assert (report.uploaded, report.copied, report.skipped) == (5, 51, 0)  # 3 tarballs, 1 ref, index
    assert report.bytes_sent == unique + reference_size + index_size
    assert report.index_key == f"{PREFIX}/_index.json"
    # What crossed the wire: each tarball's bytes once, and 51 bodiless copy requests.
    assert proxy.bytes_uploaded() == report.bytes_sent
    body_puts = proxy.forwarded("PUT", is_copy=False)
    assert len(body_puts) == 5
    assert len(proxy.forwarded("PUT", is_copy=True)) == 51
    assert all(r.body_bytes == 0 for r in proxy.forwarded("PUT", is_copy=True))
    # Each body carried the SHA-256 S3 checks it against (moto does not check: we do, here).
    sent = {r.target.rsplit("/", 1)[-1]: r.checksum_sha256 for r in body_puts}
    assert sent["alpha.tar.gz"] == b64sha(three[0].path.read_bytes())
    assert sent["bravo-0.tar.gz"] == b64sha(three[1].path.read_bytes())
    assert sent["charlie-0.tar.gz"] == b64sha(three[2].path.read_bytes())
    assert sent["alpha.npz"] == b64sha(three[0].reference_path.read_bytes())  # type: ignore[union-attr]
    # The index is the last write of the release.
    writes = [r for r in proxy.forwarded() if r.method in {"PUT", "POST"}]
    assert writes[-1].target.endswith(f"{PREFIX}/_index.json")

    assert_complete(direct, bucket, three)
    assert read(direct, bucket, f"{PREFIX}/_reference/alpha.npz") == three[0].reference_path.read_bytes()  # type: ignore[union-attr]
    assert set(keys_under(direct, bucket, f"{PREFIX}/")) == (
        {f"{PREFIX}/{t}.tar.gz" for a in three for t in a.targets}
        | {f"{PREFIX}/_reference/alpha.npz", f"{PREFIX}/_index.json"}
    )
    assert len(events) == 5 + 51 and sum(n for _, n in events) == report.bytes_sent


def test_index_lists_every_target_sorted_with_the_callers_fields(
    three: list[Artifact], client: Any, direct: Any, bucket: str
) -> None:
    run(three, client, bucket)
    raw = read(direct, bucket, f"{PREFIX}/_index.json")
    index = read_index(client, bucket, f"{PREFIX}/_index.json")
    assert index is not None and json.loads(raw) == index
    assert raw == index_body(three, PREFIX, EXTRA, references=index["references"])  # deterministic
    assert index["schema"] == 1
    assert {k: index[k] for k in EXTRA} == EXTRA
    targets = [m["target_model"] for m in index["models"]]
    assert targets == sorted(targets) and len(targets) == 54
    assert index["models"][targets.index("charlie-17.tar.gz")] == {
        "target_model": "charlie-17.tar.gz",
        "key": f"{PREFIX}/charlie-17.tar.gz",
        "sha256": three[2].sha256,
        "size": three[2].size,
        "format": "onnx",
        "source_model": "charlie",
    }
    assert index["references"] == [
        {
            "source_model": "alpha",
            "key": f"{PREFIX}/_reference/alpha.npz",
            "sha256": hashlib.sha256(three[0].reference_path.read_bytes()).hexdigest(),  # type: ignore[union-attr]
            "size": three[0].reference_path.stat().st_size,  # type: ignore[union-attr]
        }
    ]
    assert read_index(client, bucket, "models/r-absent/_index.json") is None


def test_republishing_an_unchanged_release_sends_nothing(
    three: list[Artifact], proxy: FaultProxy, client: Any, bucket: str
) -> None:
    run(three, client, bucket)
    proxy.reset_records()
    again = run(three, client, bucket)
    assert (again.uploaded, again.copied, again.bytes_sent) == (0, 0, 0)
    assert again.skipped == 54 + 2  # every target, the reference and the index
    assert proxy.forwarded("PUT") == [] and proxy.forwarded("POST") == []


def test_an_object_with_other_content_under_a_key_is_replaced(
    three: list[Artifact], client: Any, direct: Any, bucket: str
) -> None:
    """Same size, different bytes and metadata (e.g. a stray upload): the skip rule must not trust it."""
    bogus = b"\0" * three[1].size
    direct.put_object(Bucket=bucket, Key=f"{PREFIX}/bravo-2.tar.gz", Body=bogus, Metadata={"sha256": "0" * 64})
    report = run(three, client, bucket)
    assert report.skipped == 0
    assert_complete(direct, bucket, three)


@pytest.mark.parametrize("copy_in_parts", [False, True], ids=["copy-object", "upload-part-copy"])
def test_multipart_upload_and_copies_round_trip(
    tmp_path: Path,
    proxy: FaultProxy,
    client: Any,
    direct: Any,
    bucket: str,
    monkeypatch: pytest.MonkeyPatch,
    copy_in_parts: bool,
) -> None:
    if copy_in_parts:
        # Copies above COPY_OBJECT_MAX (5 GiB on AWS) go part by part; lower it to cover that path.
        monkeypatch.setattr(transfer, "COPY_OBJECT_MAX", 1 * MIB)
    big = make_artifact(tmp_path, "big", size=11 * MIB, copies=3)
    report = run([big], client, bucket, transfer_config=SMALL_MULTIPART)
    index_size = direct.head_object(Bucket=bucket, Key=report.index_key)["ContentLength"]
    assert (report.uploaded, report.copied, report.bytes_sent) == (2, 2, big.size + index_size)
    assert proxy.bytes_uploaded() == report.bytes_sent

    parts = [r for r in proxy.forwarded("PUT", is_copy=False) if "partNumber=" in r.target]
    assert len(parts) == 3
    data = big.path.read_bytes()
    expected = {b64sha(data[i : i + 5 * MIB]) for i in range(0, len(data), 5 * MIB)}
    assert {r.checksum_sha256 for r in parts} == expected  # each part checked by S3 on its own
    # The stored checksum is composite (a digest of the part digests), not the file's digest:
    # that is why the full-object sha256 travels in the metadata. (moto's HEAD drops the "-3".)
    part_digests = b"".join(hashlib.sha256(data[i : i + 5 * MIB]).digest() for i in range(0, len(data), 5 * MIB))
    head = direct.head_object(Bucket=bucket, Key=f"{PREFIX}/big-0.tar.gz", ChecksumMode="ENABLED")
    assert head["ChecksumSHA256"].split("-")[0] == b64sha(part_digests) != b64sha(data)
    copy_requests = proxy.forwarded("PUT", is_copy=True)
    assert all(r.body_bytes == 0 for r in copy_requests)
    if copy_in_parts:
        assert len([r for r in copy_requests if "partNumber=" in r.target]) == len(copy_requests) == 2 * 3
    else:
        assert len(copy_requests) == 2 and not any("partNumber=" in r.target for r in copy_requests)
    assert_complete(direct, bucket, [big])
    assert open_uploads(direct, bucket) == []
    again = run([big], client, bucket, transfer_config=SMALL_MULTIPART)
    assert (again.skipped, again.bytes_sent) == (3 + 1, 0)  # composite checksums do not defeat the skip

    paths = download_release(client, bucket, PREFIX, tmp_path / "out")
    assert [p.name for p in paths] == ["big-0.tar.gz", "big-1.tar.gz", "big-2.tar.gz"]
    assert all(hashlib.sha256(p.read_bytes()).hexdigest() == big.sha256 for p in paths)


# ---------------------------------------------------------------------------------------------
# Faults
# ---------------------------------------------------------------------------------------------


def test_throttling_errors_resets_and_stalls_are_retried(
    three: list[Artifact], proxy: FaultProxy, endpoint: str, direct: Any, bucket: str
) -> None:
    client = make_s3_client(endpoint_url=proxy.url, max_attempts=5, read_timeout=1.0)
    rules = [
        proxy.add(Rule("error", method="PUT", path=r"/bravo-0\.tar\.gz$", copy=False, times=2)),  # 503 SlowDown
        proxy.add(Rule("error", method="PUT", path=r"/charlie-1\d\.tar\.gz$", copy=True, times=3,
                       status=500, code="InternalError")),
        proxy.add(Rule("reset", method="PUT", path=r"/alpha\.tar\.gz$")),
        proxy.add(Rule("stall", method="PUT", path=r"/_reference/", seconds=3.0)),
        proxy.add(Rule("error", method="PUT", path=r"/_index\.json$", status=503, code="SlowDown")),
        proxy.add(Rule("error", method="GET", path=r"list-type=2", status=500, code="InternalError")),
    ]
    report = run(three, client, bucket)
    assert [rule.hits for rule in rules] == [rule.times for rule in rules]
    assert (report.uploaded, report.copied, report.skipped) == (5, 51, 0)
    assert_complete(direct, bucket, three)
    assert read_index(direct, bucket, report.index_key) is not None


def test_a_fault_that_outlasts_the_retries_fails_cleanly_and_a_rerun_completes(
    tmp_path: Path, proxy: FaultProxy, direct: Any, bucket: str
) -> None:
    client = make_s3_client(endpoint_url=proxy.url, max_attempts=2, read_timeout=5)
    artifacts = [
        make_artifact(tmp_path, "big", size=11 * MIB, copies=2),
        make_artifact(tmp_path, "small", size=20_000, copies=4, reference=True),
    ]
    rule = proxy.add(Rule("error", method="PUT", path=r"/big-0\.tar\.gz\?.*partNumber=2", times=100,
                          status=500, code="InternalError"))
    with pytest.raises(PublishError) as failure:
        run(artifacts, client, bucket, transfer_config=SMALL_MULTIPART)
    message = str(failure.value)
    assert "'big-0'" in message and "InternalError" in message and "no index" in message
    assert failure.value.model == "big"
    assert rule.hits == 2  # the first try and botocore's one retry
    assert read_index(direct, bucket, f"{PREFIX}/_index.json") is None
    present = keys_under(direct, bucket, f"{PREFIX}/")
    assert f"{PREFIX}/big-0.tar.gz" not in present and f"{PREFIX}/big-1.tar.gz" not in present
    assert_no_partial_objects(direct, bucket)
    assert open_uploads(direct, bucket) == []  # the transfer manager aborted it
    assert any(r.method == "DELETE" and "uploadId=" in r.target for r in proxy.forwarded())

    proxy.clear()
    report = run(artifacts, client, bucket, transfer_config=SMALL_MULTIPART)
    assert report.skipped == len(present)  # what the failed run finished is not redone
    assert report.uploaded + report.copied + report.skipped == 6 + 1 + 1
    assert_complete(direct, bucket, artifacts)
    assert read_index(direct, bucket, report.index_key) is not None


def test_an_interrupted_publish_aborts_its_multipart_upload(
    tmp_path: Path, proxy: FaultProxy, client: Any, direct: Any, bucket: str
) -> None:
    """Ctrl-C while a multipart upload is in flight: the transfer manager is left with the
    exception, cancels the upload and aborts it, so no parts linger (they would be billed)."""
    artifacts = [make_artifact(tmp_path, "big", size=11 * MIB), make_artifact(tmp_path, "small", size=2000)]
    proxy.add(Rule("delay", method="PUT", path=r"partNumber=3", seconds=1.5))

    def interrupt(key: str, sent: int) -> None:
        deadline = time.monotonic() + 5
        while not any(r.method == "POST" and r.target.endswith("?uploads") for r in proxy.forwarded()):
            assert time.monotonic() < deadline, "the multipart upload never started"
            time.sleep(0.01)
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run(artifacts, client, bucket, transfer_config=SMALL_MULTIPART, progress=interrupt)
    assert any(r.method == "DELETE" and "uploadId=" in r.target for r in proxy.forwarded())
    assert open_uploads(direct, bucket) == []
    assert f"{PREFIX}/big.tar.gz" not in keys_under(direct, bucket, "")
    assert read_index(direct, bucket, f"{PREFIX}/_index.json") is None


def test_a_changed_artifact_file_is_refused_and_nothing_of_it_is_published(
    tmp_path: Path, client: Any, direct: Any, bucket: str
) -> None:
    artifact = make_artifact(tmp_path, "alpha", size=5000, copies=2)
    data = bytearray(artifact.path.read_bytes())
    data[100] ^= 1
    artifact.path.write_bytes(bytes(data))
    with pytest.raises(PublishError, match="changed after packaging"):
        run([artifact], client, bucket)
    assert keys_under(direct, bucket, "") == {}


def test_latency_is_added_to_every_request_and_naive_baseline_uploads_in_turn(
    tmp_path: Path, proxy: FaultProxy, client: Any, direct: Any, bucket: str
) -> None:
    artifact = make_artifact(tmp_path, "alpha", size=2000)
    paths = {f"naive/alpha-{i}.tar.gz": artifact.path for i in range(8)}
    proxy.latency = 0.030
    started = time.monotonic()
    sent = publish_naive(paths, s3_client=client, bucket=bucket)
    elapsed = time.monotonic() - started
    assert elapsed >= 8 * 0.030
    assert sent == 8 * artifact.size == proxy.bytes_uploaded()  # the baseline re-sends every copy
    assert len(proxy.forwarded("PUT", is_copy=False)) == 8
    assert all(read(direct, bucket, key) == artifact.path.read_bytes() for key in paths)


# ---------------------------------------------------------------------------------------------
# Retire, delete, download
# ---------------------------------------------------------------------------------------------


def test_retire_release_tags_every_object_and_keeps_other_tags(
    tmp_path: Path, client: Any, direct: Any, bucket: str
) -> None:
    artifacts = [make_artifact(tmp_path, "alpha", size=2000, copies=3, reference=True)]
    run(artifacts, client, bucket)
    sibling = f"{PREFIX}0/alpha-0.tar.gz"  # a release whose id starts like this one
    direct.put_object(Bucket=bucket, Key=sibling, Body=b"x")
    direct.put_object_tagging(
        Bucket=bucket, Key=f"{PREFIX}/alpha-1.tar.gz", Tagging={"TagSet": [{"Key": "team", "Value": "ml"}]}
    )
    assert retire_release(client, bucket, PREFIX) == 3 + 1 + 1
    for key in keys_under(direct, bucket, f"{PREFIX}/"):
        tags = {t["Key"]: t["Value"] for t in direct.get_object_tagging(Bucket=bucket, Key=key)["TagSet"]}
        assert tags.get("triton-mme:release-state") == "retired", key
    tags = direct.get_object_tagging(Bucket=bucket, Key=f"{PREFIX}/alpha-1.tar.gz")["TagSet"]
    assert sorted((t["Key"], t["Value"]) for t in tags) == [("team", "ml"), ("triton-mme:release-state", "retired")]
    assert direct.get_object_tagging(Bucket=bucket, Key=sibling)["TagSet"] == []
    assert retire_release(client, bucket, PREFIX) == 5  # idempotent


def test_delete_release_removes_every_object_and_leaves_other_releases(
    tmp_path: Path, client: Any, direct: Any, bucket: str
) -> None:
    run([make_artifact(tmp_path, "alpha", size=2000, copies=3, reference=True)], client, bucket)
    sibling = f"{PREFIX}0/alpha-0.tar.gz"
    direct.put_object(Bucket=bucket, Key=sibling, Body=b"x")
    assert delete_release(client, bucket, PREFIX) == 5
    assert keys_under(direct, bucket, f"{PREFIX}/") == {}
    assert list(keys_under(direct, bucket, "")) == [sibling]
    assert delete_release(client, bucket, PREFIX) == 0


def test_delete_release_removes_every_version_in_a_versioned_bucket(
    tmp_path: Path, client: Any, direct: Any, bucket: str
) -> None:
    direct.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
    run([make_artifact(tmp_path, "alpha", size=2000, copies=2)], client, bucket)  # 2 targets + index
    direct.put_object(Bucket=bucket, Key=f"{PREFIX}/alpha-1.tar.gz", Body=b"newer version")
    direct.delete_object(Bucket=bucket, Key=f"{PREFIX}/alpha-0.tar.gz")  # adds a delete marker
    assert delete_release(client, bucket, PREFIX) == 3 + 1 + 1
    listing = direct.list_object_versions(Bucket=bucket, Prefix=f"{PREFIX}/")
    assert listing.get("Versions", []) == [] and listing.get("DeleteMarkers", []) == []


def test_download_release_checks_every_file_against_the_index(
    three: list[Artifact], tmp_path: Path, proxy: FaultProxy, client: Any, direct: Any, bucket: str
) -> None:
    run(three[:2], client, bucket)
    paths = download_release(client, bucket, PREFIX, tmp_path / "ok")
    names = sorted(p.relative_to(tmp_path / "ok").as_posix() for p in paths)
    assert names == ["_reference/alpha.npz", "alpha.tar.gz", "bravo-0.tar.gz", "bravo-1.tar.gz", "bravo-2.tar.gz"]
    assert (tmp_path / "ok" / "bravo-2.tar.gz").read_bytes() == three[1].path.read_bytes()

    # Corrupted in transit: botocore's response checksum or our digest catches it.
    proxy.add(Rule("corrupt", method="GET", path=r"/alpha\.tar\.gz$"))
    with pytest.raises(PublishError, match=r"alpha\.tar\.gz"):
        download_release(client, bucket, PREFIX, tmp_path / "transit")
    assert not (tmp_path / "transit" / "alpha.tar.gz").exists()

    # Tampered in the bucket: same key, other bytes.
    direct.put_object(Bucket=bucket, Key=f"{PREFIX}/bravo-2.tar.gz", Body=b"not the model")
    with pytest.raises(PublishError, match=r"bravo-2\.tar\.gz.*index says"):
        download_release(client, bucket, PREFIX, tmp_path / "tampered")
    assert not (tmp_path / "tampered" / "bravo-2.tar.gz").exists()
    assert sorted(p.name for p in (tmp_path / "tampered").iterdir()) == [
        "_reference", "alpha.tar.gz", "bravo-0.tar.gz", "bravo-1.tar.gz"
    ]


def test_download_of_a_release_without_index_fails(client: Any, bucket: str, tmp_path: Path) -> None:
    with pytest.raises(PublishError, match="no index"):
        download_release(client, bucket, PREFIX, tmp_path)


# ---------------------------------------------------------------------------------------------
# Inputs, client and server
# ---------------------------------------------------------------------------------------------


def test_publish_refuses_bad_inputs(tmp_path: Path, client: Any, bucket: str) -> None:
    alpha = make_artifact(tmp_path, "alpha", size=100)
    with pytest.raises(ValueError, match="index_extra"):
        publish_release([alpha], s3_client=client, bucket=bucket, release_prefix=PREFIX, index_extra={"models": []})
    with pytest.raises(ValueError, match="release_prefix"):
        publish_release([alpha], s3_client=client, bucket=bucket, release_prefix="/", index_extra={})
    twin = Artifact(name="beta", format="onnx", path=alpha.path, sha256=alpha.sha256, size=alpha.size,
                    targets=("alpha",))
    with pytest.raises(PublishError, match="two artifacts"):
        run([alpha, twin], client, bucket)


def test_make_s3_client_sets_retries_and_dummy_credentials_on_that_client_only(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE",
                 "AWS_DEFAULT_PROFILE", "AWS_REGION", "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    before = dict(os.environ)

    local = make_s3_client(endpoint_url="http://127.0.0.1:9", max_attempts=7, retry_mode="adaptive")
    config = local.meta.config
    assert config.retries == {"mode": "adaptive", "total_max_attempts": 7}
    assert config.s3 == {"addressing_style": "path"}
    assert config.max_pool_connections >= 16
    assert local.meta.region_name == "us-east-1"
    assert local._request_signer._credentials.access_key == "testing"
    assert dict(os.environ) == before

    remote = make_s3_client(endpoint_url="https://s3.example.com", region="eu-west-1")
    assert remote._request_signer._credentials is None  # no dummy credentials off this machine

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAREALKEY")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret")
    assert make_s3_client(endpoint_url="http://127.0.0.1:9")._request_signer._credentials.access_key == "AKIAREALKEY"


def test_clients_share_botocores_data_loader_and_nothing_else() -> None:
    """One data loader per process (the endpoint table and S3's service model parsed once, not per
    client); each client keeps its own session, configuration, region and credentials (above)."""
    first = make_s3_client(endpoint_url="http://127.0.0.1:9")
    second = make_s3_client(endpoint_url="https://s3.example.com", region="eu-west-1", max_attempts=3)
    assert first._loader is second._loader
    assert first.meta.config is not second.meta.config
    assert (first.meta.region_name, second.meta.region_name) == ("us-east-1", "eu-west-1")
    assert second.meta.config.retries == {"mode": "standard", "total_max_attempts": 3}


def test_local_s3_serves_on_loopback_and_stops() -> None:
    with local_s3() as url:
        assert url.startswith("http://127.0.0.1:")
        port = int(url.rsplit(":", 1)[1])
        client = make_s3_client(endpoint_url=url)
        assert "Buckets" in client.list_buckets()
    with pytest.raises(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
        pass
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        with pytest.raises(PublishError, match="not available"), local_s3(busy.getsockname()[1]):
            pass


def test_read_index_tells_a_missing_index_from_a_refused_one_when_s3_answers_403(
    proxy: FaultProxy, client: Any, direct: Any, bucket: str
) -> None:
    """Without an unconditioned s3:ListBucket (the build role lists only under its prefix), S3
    answers a GET of a missing key with 403 AccessDenied, not 404: the index is then looked up
    by a listing, so a new release reads as "no index" and a real refusal still fails."""
    from triton_mme_cdk.model_build.release.index import read_index

    missing = f"{PREFIX}/_index.json"
    proxy.add(Rule("error", method="GET", path=r"/_index\.json", status=403, code="AccessDenied", times=2))
    assert read_index(client, bucket, missing) is None
    direct.put_object(Bucket=bucket, Key=missing, Body=b"{}")
    with pytest.raises(PublishError, match="AccessDenied"):
        read_index(client, bucket, missing)
