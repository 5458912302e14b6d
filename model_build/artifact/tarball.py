"""The one place that reads ``model.tar.gz`` archives: listing (``inspect``) and safe unpacking.

Tarballs come from buckets other teams write, so every archive is treated as hostile. Before a
single byte is written, one streaming pass reads every header and checks:

* member names: relative, no ``..``, no drive letters or backslashes, no duplicates, at most
  :data:`MAX_NAME_LENGTH` characters;
* member types: regular files and directories only (no symlinks, hard links, devices, FIFOs);
* decompression bombs: at most :data:`MAX_MEMBERS` members, at most :data:`MAX_UNPACKED_BYTES`
  unpacked in all, and past :data:`RATIO_FLOOR_BYTES` at most :data:`MAX_RATIO` times the
  compressed size; one header (a PAX or GNU long-name record) at most :data:`MAX_HEADER_BYTES`;
* integrity: a truncated or corrupt gzip stream (the pass reads to the gzip trailer, so its
  CRC is checked) or a file that is not a tar archive at all.

The limits are enforced on the *decompressed stream position*, not on what the headers claim,
so a header that lies about its size cannot make the reader decompress more than the limit.
Only then is the archive opened a second time and extracted, with :mod:`tarfile`'s ``data``
filter as a second line of defence; a failure during that pass removes what it wrote.
"""

from __future__ import annotations

import gzip
import io
import re
import shutil
import tarfile
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO

from triton_mme_cdk.model_build.errors import VerifyError

#: Most members one archive may hold (a Triton model directory holds a handful).
MAX_MEMBERS = 10_000
#: Most bytes an archive may unpack to in all: 32 GiB, above the largest model an ``ml.g5``
#: instance's volume would hold next to others.
MAX_UNPACKED_BYTES = 32 << 30
#: Most unpacked bytes per compressed byte once an archive is past :data:`RATIO_FLOOR_BYTES`.
#: Model weights barely compress (about 1.1x); gzip's own ceiling is about 1030x.
MAX_RATIO = 100
#: Below this unpacked size the ratio is not checked (tar padding of tiny files compresses 50x).
RATIO_FLOOR_BYTES = 64 << 20
#: Most bytes one tar header record (PAX extended header, GNU long name) may take.
MAX_HEADER_BYTES = 1 << 20
#: Longest member name accepted.
MAX_NAME_LENGTH = 1024

_GZIP_MAGIC = b"\x1f\x8b"
_DRIVE = re.compile(r"^[A-Za-z]:")


class TarballError(VerifyError):
    """An archive that must not be unpacked: unsafe member, over a limit, truncated or corrupt."""

    step = "unpack"


@dataclass(frozen=True)
class TarMember:
    """One entry of a tarball as stored (for checks and for ``inspect`` output)."""

    name: str
    type: str  # "dir", "file", "symlink", "hardlink" or "other"
    size: int
    mode: int
    uid: int
    gid: int
    uname: str
    gname: str
    mtime: int

    @classmethod
    def of(cls, info: tarfile.TarInfo) -> TarMember:
        """The entry as stored: its tar header fields, the type named, the mtime in whole seconds."""
        kept = ("name", "size", "mode", "uid", "gid", "uname", "gname")
        return cls(type=_member_type(info), mtime=int(info.mtime), **{f: getattr(info, f) for f in kept})


@dataclass(frozen=True)
class Limits:
    """The limits one read runs under; the module constants unless a caller narrows them."""

    max_members: int = MAX_MEMBERS
    max_unpacked_bytes: int = MAX_UNPACKED_BYTES
    max_ratio: float = MAX_RATIO
    ratio_floor_bytes: int = RATIO_FLOOR_BYTES
    max_header_bytes: int = MAX_HEADER_BYTES


class _Bomb(Exception):
    """Raised inside tarfile's reads; turned into a :class:`TarballError` naming the archive."""


class _LimitedStream(io.RawIOBase):
    """A read-only, forward-seekable view of the decompressed stream that enforces the limits.

    tarfile skips member data with ``seek`` and reads headers with ``read``, so the high-water
    mark of the position is the number of bytes decompressed so far.
    """

    def __init__(self, inner: IO[bytes], compressed_size: int, limits: Limits, *, data_reads: bool) -> None:
        super().__init__()
        self._inner = inner
        self._compressed = max(compressed_size, 1)
        self._limits = limits
        self._pos = 0
        # During extraction member data is read in chunks bigger than a header.
        self._data_reads = data_reads

    def _check(self, end: int) -> None:
        limits = self._limits
        if end > limits.max_unpacked_bytes:
            raise _Bomb(
                f"unpacks to more than {limits.max_unpacked_bytes} bytes (the limit, MAX_UNPACKED_BYTES)"
            )
        if end > limits.ratio_floor_bytes and end > limits.max_ratio * self._compressed:
            raise _Bomb(
                f"unpacks to more than {end} bytes from {self._compressed} compressed bytes, a ratio "
                f"above {limits.max_ratio:g} (the limit, MAX_RATIO); a decompression bomb?"
            )

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def read(self, size: int | None = -1) -> bytes:
        if size is None or size < 0:
            size = self._limits.max_header_bytes + 1
        if not self._data_reads and size > self._limits.max_header_bytes:
            raise _Bomb(
                f"holds a header record of {size} bytes; at most {self._limits.max_header_bytes} "
                "(MAX_HEADER_BYTES) are allowed"
            )
        data = self._inner.read(size)
        self._pos += len(data)
        self._check(self._pos)
        return data

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        target = {io.SEEK_SET: offset, io.SEEK_CUR: self._pos + offset}.get(whence)
        if target is None:
            raise OSError("seeking from the end is not supported")
        self._check(target)
        self._inner.seek(target)
        self._pos = target
        return target

    def drain(self) -> None:
        """Read to the end of the compressed stream, so the gzip trailer and CRC are checked."""
        while True:
            chunk = self._inner.read(1 << 20)
            if not chunk:
                return
            self._pos += len(chunk)
            self._check(self._pos)


def _open_stream(path: Path, limits: Limits, *, data_reads: bool) -> tuple[IO[bytes], _LimitedStream]:
    raw = path.open("rb")
    try:
        magic = raw.read(2)
        raw.seek(0)
        size = path.stat().st_size
        inner: IO[bytes] = gzip.GzipFile(fileobj=raw, mode="rb") if magic == _GZIP_MAGIC else raw  # type: ignore[assignment]
        return raw, _LimitedStream(inner, size, limits, data_reads=data_reads)
    except BaseException:
        raw.close()
        raise


def _member_type(info: tarfile.TarInfo) -> str:
    if info.isdir():
        return "dir"
    if info.isreg():
        return "file"
    if info.issym():
        return "symlink"
    if info.islnk():
        return "hardlink"
    return "other"


def _fail(where: str, detail: str, model: str | None) -> TarballError:
    who = f"model {model!r}: " if model else ""
    return TarballError(f"{who}{where}: {detail}", model=model)


def _read_members(path: Path, limits: Limits, model: str | None) -> list[tarfile.TarInfo]:
    """Every header of the archive, read once under the limits; the stream is read to its end."""
    where = f"tarball {str(path)!r}"
    try:
        raw, stream = _open_stream(path, limits, data_reads=False)
    except OSError as error:
        raise _fail(where, f"cannot be read: {error.strerror or error}", model) from None
    members: list[tarfile.TarInfo] = []
    try:
        with raw, tarfile.open(fileobj=stream, mode="r:") as tar:
            while True:
                info = tar.next()
                if info is None:
                    break
                members.append(info)
                if len(members) > limits.max_members:
                    raise _fail(
                        where,
                        f"holds more than {limits.max_members} members (the limit, MAX_MEMBERS)",
                        model,
                    )
            stream.drain()
    except TarballError:
        raise
    except _Bomb as error:
        raise _fail(where, str(error), model) from None
    except (EOFError, zlib.error, gzip.BadGzipFile) as error:
        raise _fail(where, f"is truncated or corrupt ({error}); upload it again", model) from None
    except tarfile.ReadError as error:
        detail = str(error)
        if "empty file" in detail or "invalid header" in detail or "bad checksum" in detail:
            detail = "is not a tar archive (or is corrupt): " + detail
        raise _fail(where, f"{detail}; expected a gzip-compressed tar (model.tar.gz)", model) from None
    except (OSError, tarfile.TarError) as error:
        raise _fail(where, f"cannot be read: {error}", model) from None
    if not members:
        raise _fail(where, "holds no members; expected a Triton model directory", model)
    return members


def _check_member(info: tarfile.TarInfo, seen: set[str], model: str | None) -> str:
    """Refuse a member that could escape ``dest``, alias a file or is not a plain file/directory."""
    name = info.name
    where = f"tarball member {name!r}"
    if len(name) > MAX_NAME_LENGTH:
        raise _fail(where[:80] + "...'", f"name is {len(name)} characters; at most {MAX_NAME_LENGTH}", model)
    path = PurePosixPath(name)
    if not name or "\\" in name or "\x00" in name or path.is_absolute() or _DRIVE.match(name) or ".." in path.parts:
        raise _fail(
            where,
            "path is absolute or contains '..' (or a backslash, drive letter or NUL); "
            "allowed: relative paths inside the archive",
            model,
        )
    if info.issym() or info.islnk():
        kind = "symlink" if info.issym() else "hard link"
        raise _fail(where, f"is a {kind} to {info.linkname!r}; allowed: regular files and directories only", model)
    if not (info.isreg() or info.isdir()):
        kinds = {tarfile.CHRTYPE: "character device", tarfile.BLKTYPE: "block device", tarfile.FIFOTYPE: "FIFO"}
        kind = kinds.get(info.type, f"special file (type {info.type!r})")
        raise _fail(where, f"is a {kind}; allowed: regular files and directories only", model)
    normal = str(path)
    if normal in seen:
        raise _fail(where, "appears twice; a second copy would overwrite the first", model)
    seen.add(normal)
    return normal


def _checked_members(path: Path, limits: Limits, model: str | None) -> list[tarfile.TarInfo]:
    members = _read_members(path, limits, model)
    seen: set[str] = set()
    declared = 0
    for info in members:
        _check_member(info, seen, model)
        declared += max(info.size, 0)
    if declared > limits.max_unpacked_bytes:
        raise _fail(
            f"tarball {str(path)!r}",
            f"declares {declared} bytes of files; at most {limits.max_unpacked_bytes} (MAX_UNPACKED_BYTES)",
            model,
        )
    return members


def safe_extract(tarball: Path, dest: Path, *, model: str | None = None, limits: Limits | None = None) -> None:
    """Unpack ``tarball`` into ``dest``, refusing anything that could escape, alias files or explode.

    Every member is checked before anything is written (so a refused archive leaves nothing
    behind); a failure while writing removes the entries this call created.

    The second read extracts each checked member as its header comes by, so the stream only ever
    seeks forward: a gzip stream cannot seek back without decompressing again from its start, and
    listing the members first (``getmembers``) then extracting them read the archive three times.
    """
    limits = limits or Limits()
    tarball = Path(tarball)
    dest = Path(dest)
    members = _checked_members(tarball, limits, model)
    dest.mkdir(parents=True, exist_ok=True)
    before = {p.name for p in dest.iterdir()}
    try:
        raw, stream = _open_stream(tarball, limits, data_reads=True)
        with raw, tarfile.open(fileobj=stream, mode="r:") as tar:
            checked = {m.name for m in members}
            extracted: list[str] = []

            def as_read() -> Iterator[tarfile.TarInfo]:
                for info in tar:
                    if info.name in checked:
                        extracted.append(info.name)
                        yield info

            # extractall takes each member as the iteration reaches it, and still sets the
            # directories' modes last (a read-only directory is filled before it is closed).
            tar.extractall(dest, members=as_read(), filter="data")
        if len(extracted) != len(members):
            raise KeyError(f"{len(members) - len(extracted)} checked member(s) gone on the second read")
    except BaseException as error:
        for entry in dest.iterdir():
            if entry.name not in before:
                shutil.rmtree(entry, ignore_errors=True) if entry.is_dir() else entry.unlink(missing_ok=True)
        if isinstance(error, _Bomb):
            raise _fail(f"tarball {str(tarball)!r}", str(error), model) from None
        if isinstance(error, (OSError, EOFError, zlib.error, tarfile.TarError, KeyError)):
            raise _fail(f"tarball {str(tarball)!r}", f"cannot be unpacked: {error}", model) from None
        raise


def read_member(
    path: Path, want: Callable[[PurePosixPath], bool], *, max_bytes: int, limits: Limits | None = None
) -> bytes | None:
    """The bytes of the first regular-file member whose path ``want`` accepts, read without
    unpacking anything to disk; ``None`` when there is none or it is over ``max_bytes``.

    The archive is read under the same limits as :func:`safe_extract` (a bomb or a truncated
    file raises :class:`TarballError`), so a caller never parses a tarball itself.
    """
    limits = limits or Limits()
    path = Path(path)
    found = next(
        (info for info in _read_members(path, limits, None) if info.isreg() and want(PurePosixPath(info.name))),
        None,
    )
    if found is None or found.size > max_bytes:
        return None
    try:
        raw, stream = _open_stream(path, limits, data_reads=True)
        with raw, tarfile.open(fileobj=stream, mode="r:") as tar:
            handle = tar.extractfile(found)
            return handle.read(max_bytes + 1)[:max_bytes] if handle is not None else None
    except _Bomb as error:
        raise _fail(f"tarball {str(path)!r}", str(error), None) from None
    except (OSError, EOFError, zlib.error, tarfile.TarError) as error:
        raise _fail(f"tarball {str(path)!r}", f"cannot be read: {error}", None) from None


def inspect_tarball(path: Path, *, limits: Limits | None = None) -> list[TarMember]:
    """Every entry of a ``.tar.gz`` in archive order, with the metadata packaging fixes.

    Links and special files are listed (this is for looking), but the size, ratio and member
    limits hold as for unpacking, so inspecting a bomb is as bounded as refusing it.
    """
    return [TarMember.of(info) for info in _read_members(Path(path), limits or Limits(), None)]


def tarball_members(path: Path) -> list[str]:
    """Entry names in archive order; directories end with ``/`` so they stand out."""
    return [m.name + "/" if m.type == "dir" else m.name for m in inspect_tarball(path)]
