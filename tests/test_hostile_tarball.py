"""Hostile and broken ``model.tar.gz`` archives: :func:`model_build.artifact.tarball.safe_extract` (what
verify, the local endpoint and the smoke test's local serving unpack with) refuses each before
writing a byte, in a subprocess under a memory limit and a time bound, with one message naming
the archive or the member.

The runner prints ``error: <message>`` and exits 1 on a ``ModelBuildError``, as the CLI does.
"""

from __future__ import annotations

import gzip
import io
import tarfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hostile_helpers import assert_refused, run_bounded

from triton_mme_cdk.model_build.artifact.tarball import (
    MAX_HEADER_BYTES,
    MAX_MEMBERS,
    MAX_RATIO,
    MAX_UNPACKED_BYTES,
)

RUNNER = """
import sys
from pathlib import Path
from triton_mme_cdk.model_build.errors import ModelBuildError
from triton_mme_cdk.model_build.artifact.tarball import safe_extract
try:
    safe_extract(Path(sys.argv[1]), Path(sys.argv[2]), model="m")
except ModelBuildError as error:
    print(f"error: {error}", file=sys.stderr)
    sys.exit(1)
print("ok")
"""


class _Zeros(io.RawIOBase):
    """``size`` zero bytes without holding them: the body of a bomb member."""

    def __init__(self, size: int) -> None:
        self.left = size

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        n = min(len(buffer), self.left)
        buffer[:n] = bytes(n)
        self.left -= n
        return n

    def readable(self) -> bool:
        return True


def _tar(path: Path, members: list[tuple[tarfile.TarInfo, bytes | None]], **kwargs: object) -> None:
    with tarfile.open(path, "w:gz", **kwargs) as tar:  # type: ignore[call-overload]
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)


def _info(name: str, kind: bytes = tarfile.REGTYPE, size: int = 0, linkname: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.size = size
    info.linkname = linkname
    return info


def _good(path: Path) -> None:
    _tar(path, [(_info("m", tarfile.DIRTYPE), None), (_info("m/config.pbtxt", size=5), b"name:")])


def _bomb(path: Path) -> None:
    size = 100 << 20  # past RATIO_FLOOR_BYTES, and zeros compress about 1000x
    with tarfile.open(path, "w:gz", compresslevel=1) as tar:
        tar.addfile(_info("m/1/model.onnx", size=size), io.BufferedReader(_Zeros(size)))


def _lying_header(path: Path) -> None:
    """A header claims 40 GiB; the archive is a few hundred bytes."""
    info = _info("m/1/model.onnx", size=40 << 30)
    raw = info.tobuf(tarfile.GNU_FORMAT)
    path.write_bytes(gzip.compress(raw + bytes(1024)))


def _many(path: Path) -> None:
    _tar(path, [(_info(f"m/{i}"), b"") for i in range(MAX_MEMBERS + 1)])


def _huge_pax(path: Path) -> None:
    info = _info("m/config.pbtxt", size=1)
    info.pax_headers = {"comment": "x" * (MAX_HEADER_BYTES + 10)}
    _tar(path, [(info, b"x")], format=tarfile.PAX_FORMAT)


def _truncated(path: Path) -> None:
    _tar(path, [(_info("m/1/model.onnx", size=200_000), bytes(range(256)) * 781 + bytes(64))])
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _bad_crc(path: Path) -> None:
    _good(path)
    data = bytearray(path.read_bytes())
    data[-8] ^= 0xFF  # the CRC32 of the gzip trailer
    path.write_bytes(bytes(data))


#: name -> (writer, fragments of the error line besides the archive path)
CORPUS: dict[str, tuple[Callable[[Path], object], tuple[str, ...]]] = {
    "dotdot": (lambda p: _tar(p, [(_info("m/../../evil", size=1), b"x")]), ("'m/../../evil'", "contains '..'")),
    "absolute": (lambda p: _tar(p, [(_info("/etc/evil", size=1), b"x")]), ("'/etc/evil'", "absolute")),
    "backslash": (lambda p: _tar(p, [(_info("m\\..\\..\\evil", size=1), b"x")]), ("backslash",)),
    "symlink": (lambda p: _tar(p, [(_info("m/model.onnx", tarfile.SYMTYPE, linkname="/etc/passwd"), None)]),
                ("'m/model.onnx'", "symlink to '/etc/passwd'")),
    "hardlink": (lambda p: _tar(p, [(_info("m/a", size=1), b"x"), (_info("m/b", tarfile.LNKTYPE, linkname="m/a"), None)]),
                 ("'m/b'", "hard link to 'm/a'")),
    "char-device": (lambda p: _tar(p, [(_info("m/null", tarfile.CHRTYPE), None)]), ("'m/null'", "character device")),
    "block-device": (lambda p: _tar(p, [(_info("m/sda", tarfile.BLKTYPE), None)]), ("'m/sda'", "block device")),
    "fifo": (lambda p: _tar(p, [(_info("m/pipe", tarfile.FIFOTYPE), None)]), ("'m/pipe'", "FIFO")),
    "duplicate": (lambda p: _tar(p, [(_info("m/a", size=1), b"x"), (_info("m/a", size=1), b"y")]), ("'m/a'", "appears twice")),
    "ratio-bomb": (_bomb, (f"ratio above {MAX_RATIO}", "decompression bomb")),
    "lying-header": (_lying_header, (f"more than {MAX_UNPACKED_BYTES} bytes",)),
    "too-many-members": (_many, (f"more than {MAX_MEMBERS} members",)),
    "huge-pax-header": (_huge_pax, ("header record", f"at most {MAX_HEADER_BYTES}")),
    "truncated-gzip": (_truncated, ("truncated or corrupt",)),
    "bad-crc": (_bad_crc, ("truncated or corrupt", "CRC")),
    "not-a-tar": (lambda p: p.write_bytes(gzip.compress(b"<html>503 Slow Down</html>\n" * 40)), ("not a tar archive",)),
    "empty-file": (lambda p: p.write_bytes(b""), ("not a tar archive",)),
}

#: The corpus entry whose runs are plain fresh subprocesses (``run_bounded(fresh=True)``); the
#: others are forked from the zygote (tests/hostile_helpers.py says what that shares).
FRESH = min(CORPUS)


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_safe_extract_refuses(name: str, tmp_path: Path) -> None:
    tarball = tmp_path / f"{name}.tar.gz"
    CORPUS[name][0](tarball)
    dest = tmp_path / "dest"
    outcome = run_bounded(["-c", RUNNER, str(tarball), str(dest)], fresh=name == FRESH)
    line = assert_refused(outcome, *CORPUS[name][1])
    assert str(tarball) in line or "tarball member" in line, line
    assert "model 'm'" in line
    assert not dest.exists() or not any(dest.iterdir()), "a refused archive must leave nothing behind"
    assert not (tmp_path / "evil").exists() and not Path("/etc/evil").exists()


def test_safe_extract_unpacks_a_good_archive(tmp_path: Path) -> None:
    """The same runner accepts a well-formed archive, so the refusals above are about the input."""
    tarball = tmp_path / "good.tar.gz"
    _good(tarball)
    outcome = run_bounded(["-c", RUNNER, str(tarball), str(tmp_path / "dest")])
    assert outcome.returncode == 0, outcome.stderr
    assert (tmp_path / "dest" / "m" / "config.pbtxt").read_bytes() == b"name:"


def test_safe_extract_sets_a_directorys_attributes_after_its_files(tmp_path: Path) -> None:
    """Members are extracted as the one read reaches them, and directories get their attributes
    last, as ``extractall`` does: a directory whose mode in the archive is read-only is filled
    before its mode is set (as a user without root, writing into it first would fail). Seen
    here through its time: set before its file was written, it would be the time of the write."""
    from triton_mme_cdk.model_build.artifact.tarball import safe_extract

    folder = _info("m", tarfile.DIRTYPE)
    folder.mode, folder.mtime = 0o555, 1_000_000_000
    tarball = tmp_path / "read-only.tar.gz"
    _tar(tarball, [(folder, None), (_info("m/config.pbtxt", size=5), b"name:")])
    safe_extract(tarball, tmp_path / "dest")
    unpacked = tmp_path / "dest" / "m"
    assert (unpacked / "config.pbtxt").read_bytes() == b"name:"
    assert unpacked.stat().st_mtime == 1_000_000_000


def test_inspect_tarball_is_bounded_on_a_bomb(tmp_path: Path) -> None:
    """Listing a bomb costs no more than refusing it (inspect shares the limits)."""
    from triton_mme_cdk.model_build.artifact.tarball import TarballError, inspect_tarball

    tarball = tmp_path / "bomb.tar.gz"
    _lying_header(tarball)
    with pytest.raises(TarballError, match="more than"):
        inspect_tarball(tarball)


def test_read_member_reads_one_file_and_refuses_a_bomb(tmp_path: Path) -> None:
    """What the smoke test's fallback reads ``config.pbtxt`` with: bounded like ``safe_extract``."""
    from triton_mme_cdk.model_build.artifact.tarball import TarballError, read_member

    good = tmp_path / "good.tar.gz"
    _good(good)
    assert read_member(good, lambda p: p.name == "config.pbtxt", max_bytes=100) == b"name:"
    assert read_member(good, lambda p: p.name == "config.pbtxt", max_bytes=4) is None
    assert read_member(good, lambda p: p.name == "model.onnx", max_bytes=100) is None
    bomb = tmp_path / "bomb.tar.gz"
    _bomb(bomb)
    with pytest.raises(TarballError, match="decompression bomb"):
        read_member(bomb, lambda p: p.name == "config.pbtxt", max_bytes=100)


# ---------------------------------------------------------------------------------------------
# The real command: `python -m model_build verify` on a published release holding a hostile tarball
# ---------------------------------------------------------------------------------------------

#: Wall-clock bound of one verify run: it starts the real tritonserver (measured 9.6 s of wall
#: time on the 2-core machine at load 4-5, most of it the server's start), about 4x that.
VERIFY_TIME_LIMIT = 45.0
#: tritonserver and its Python backend stubs run under the same address-space limit.
VERIFY_MEMORY_LIMIT = 16 << 30


def _not_onnx(real: Path) -> Callable[[Path], None]:
    """A well-formed copy of a real build's tarball whose ``model.onnx`` is not ONNX."""

    def write(path: Path) -> None:
        with tarfile.open(real, "r:gz") as source, tarfile.open(path, "w:gz") as tar:
            for member in source.getmembers():
                data = source.extractfile(member).read() if member.isfile() else None  # type: ignore[union-attr]
                if member.name.endswith("model.onnx"):
                    data = b"<Error><Code>SlowDown</Code></Error>"
                    member.size = len(data)
                tar.addfile(member, io.BytesIO(data) if data is not None else None)

    return write


#: name -> fragments of the target's error in verify's table (which cuts a reason at about 180
#: characters: the bomb's names its size limit, the ratio comes later).
VERIFY_CASES: dict[str, tuple[str, ...]] = {
    "dotdot": CORPUS["dotdot"][1],
    "symlink": CORPUS["symlink"][1],
    "ratio-bomb": ("tarball", "unpacks to more than"),
    "truncated-gzip": CORPUS["truncated-gzip"][1],
    "onnx-not-onnx": ("load failed for model 'tiny-", "INVALID_PROTOBUF"),
}


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path, Any, Any]]:
    """moto's S3 server and one real build of a tiny ONNX model (its reference and config are
    published next to each hostile tarball, so verify gets as far as unpacking it)."""
    import yaml

    from triton_mme_cdk.model_build.manifest import load_manifest
    from triton_mme_cdk.model_build.pipeline import BuildOptions, build_release
    from triton_mme_cdk.model_build.release import compute_release
    from triton_mme_cdk.model_build.tools.local_s3 import local_s3

    folder = tmp_path_factory.mktemp("verify")
    manifest = folder / "models.yaml"
    manifest.write_text(yaml.safe_dump({"version": 1, "models": [{
        "name": "tiny", "task": "image-classification", "format": "onnx", "max_batch_size": 2,
        "image": {"image_size": 32, "channels": 3},
        "source": {"kind": "synthetic", "architecture": "resnet", "seed": 0,
                   "config": {"embedding_size": 8, "hidden_sizes": [8, 8], "depths": [1, 1], "num_labels": 4}},
    }]}))
    release = compute_release(load_manifest(manifest), base_dir=folder)
    record, release_dir = build_release(load_manifest(manifest), release, BuildOptions(base_dir=folder), out_dir=folder / "build")
    with local_s3() as endpoint:
        yield endpoint, manifest, release, record.models[0].artifact(release_dir)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(VERIFY_CASES))
def test_verify_refuses_a_published_hostile_tarball(name: str, tmp_path: Path, built: Any) -> None:
    import hashlib
    import re
    from dataclasses import replace

    from triton_mme_cdk.model_build.aws_clients import make_s3_client
    from triton_mme_cdk.model_build.release.store import ReleaseTarget, publish_incremental

    endpoint, manifest, release, artifact = built
    writer = _not_onnx(artifact.path) if name == "onnx-not-onnx" else CORPUS[name][0]
    fragments = VERIFY_CASES[name]
    tarball = tmp_path / "tiny.tar.gz"
    writer(tarball)
    data = tarball.read_bytes()
    # Published as a release would be: the index holds the hostile tarball's own digest, so the
    # digest check passes and the archive reaches the unpacking.
    hostile = replace(artifact, path=tarball, sha256=hashlib.sha256(data).hexdigest(), size=len(data))
    s3 = make_s3_client(endpoint_url=endpoint)
    bucket = f"verify-{name}"
    s3.create_bucket(Bucket=bucket)
    publish_incremental([(hostile, release.model_keys["tiny"])], ReleaseTarget.of(release, s3, bucket, "models"))
    outcome = run_bounded(["-m", "model_build", "verify", "--manifest", str(manifest), "--bucket", bucket,
                           "--endpoint-url", endpoint, "--out", str(tmp_path / "out")],
                          env={"AWS_DEFAULT_REGION": "us-east-1"}, memory_limit=VERIFY_MEMORY_LIMIT,
                          time_limit=VERIFY_TIME_LIMIT, fresh=name == min(VERIFY_CASES))
    assert outcome.returncode == 1, (outcome.stdout[-3000:], outcome.stderr[-3000:])
    assert "Traceback" not in outcome.stdout + outcome.stderr, outcome.stderr[-3000:]
    assert outcome.seconds < VERIFY_TIME_LIMIT, f"took {outcome.seconds:.1f} s"
    failed = [line for line in outcome.stdout.splitlines() if "FAILED" in line]
    # Served under its immutable name: the logical name and its tarball's digest.
    assert len(failed) == 1 and re.search(r"tiny-[0-9a-f]{12}\.tar\.gz", failed[0]), outcome.stdout[-3000:]
    table = " ".join(re.sub(r"[│┃]", " ", outcome.stdout).split())  # the table wraps its error column
    for fragment in fragments:
        assert fragment in table, (fragment, table[-2000:])
    assert not (tmp_path / "evil").exists() and not Path("/etc/evil").exists()
    assert not (tmp_path / "out").exists(), "verify of a published release writes no build folder"
