"""The build Lambda image's Python dependencies, resolved for the image's platform without Docker.

The image (``model_build/Dockerfile``) is Lambda's Python base image on x86_64 (Amazon Linux
2023: glibc 2.34), pinned by digest, with two ``pip install`` lines: torch alone (``--no-deps``)
from PyTorch's CPU index, then ``requirements-lambda.txt``, a lock of every other package with
its hashes (``--require-hashes --no-deps``; :func:`read_lock` reads it). :func:`resolve` asks pip
what that lock needs for that platform and Python, with binary wheels only (``--dry-run
--report``: pip reads each wheel's metadata, not the wheel), with torch already installed as the
first line leaves it.
:func:`unpacked_size` reads a wheel's zip directory over HTTP range requests (a few kB) to sum
what it unpacks to, so the image's size is measured without downloading gigabytes.
"""

from __future__ import annotations

import functools
import io
import json
import re
import shutil
import ssl
import subprocess
import sys
import urllib.request
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = ROOT / "model_build" / "Dockerfile"
REQUIREMENTS = ROOT / "model_build" / "requirements-lambda.txt"
#: Lambda's python3.12 base image runs on Amazon Linux 2023, whose glibc is 2.34 (Lambda
#: runtimes table): wheels tagged manylinux_2_34 and older run there.
GLIBC_MINOR = 34
PLATFORMS = [f"manylinux_2_{minor}_x86_64" for minor in range(GLIBC_MINOR, 16, -1)] + ["manylinux2014_x86_64"]


class NoWheel(AssertionError):
    """A requirement that has no wheel for the image's platform and Python (names it)."""


def image_python(dockerfile: Path = DOCKERFILE) -> str:
    """The Python version of the image's base (``FROM public.ecr.aws/lambda/python:3.12``)."""
    match = re.search(r"^FROM\s+public\.ecr\.aws/lambda/python:(\d+\.\d+)", dockerfile.read_text(), re.M)
    if match is None:
        raise ValueError(f"{dockerfile}: no FROM public.ecr.aws/lambda/python:<version> line")
    return match.group(1)


#: A requirement of the lock: ``name==version`` and one or more ``--hash=sha256:...``.
_LOCKED = re.compile(r"^(?P<name>[A-Za-z0-9][A-Za-z0-9_.-]*)(?:\[[^\]]*\])?==(?P<version>[^\s;\\]+)")
_HASH = re.compile(r"--hash=sha256:([0-9a-f]{64})\b")


def canonical(name: str) -> str:
    """A distribution's name as the index compares it (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def read_lock(path: Path = REQUIREMENTS) -> dict[str, tuple[str, frozenset[str]]]:
    """``{name: (version, sha256 hashes)}`` of a hashed lock; raises ``ValueError`` naming a line
    that is not ``name==version`` with at least one hash (an option, a URL, a range, no hash)."""
    entries: dict[str, tuple[str, frozenset[str]]] = {}
    logical: list[str] = []
    for raw in path.read_text(encoding="utf-8").splitlines():
        line = raw.split(" #", 1)[0].strip() if not raw.lstrip().startswith("#") else ""
        if not line:
            continue
        logical.append(line)
        if line.endswith("\\"):
            continue
        requirement = " ".join(part.rstrip("\\").strip() for part in logical)
        logical = []
        pinned, hashes = _LOCKED.match(requirement), frozenset(_HASH.findall(requirement))
        if pinned is None or not hashes:
            raise ValueError(f"{path.name}: {requirement[:120]!r} is not a pinned requirement with its hashes "
                             "(name==version --hash=sha256:...)")
        name = canonical(pinned["name"])
        if name in entries:
            raise ValueError(f"{path.name}: {name} is locked twice")
        entries[name] = (pinned["version"], hashes)
    return entries


def base_image(dockerfile: Path = DOCKERFILE) -> tuple[str, str | None]:
    """(image reference, sha256 digest or None) of the Dockerfile's only ``FROM``."""
    froms = re.findall(r"^FROM\s+(?:--platform=\S+\s+)?(\S+)", dockerfile.read_text(), re.M)
    if len(froms) != 1:
        raise ValueError(f"{dockerfile}: {len(froms)} FROM lines; expected one")
    digest = re.fullmatch(r"[^@\s]+@sha256:([0-9a-f]{64})", froms[0])
    return froms[0], digest.group(1) if digest else None


def pip_lines(dockerfile: Path = DOCKERFILE) -> list[str]:
    """Every ``pip install`` command of the Dockerfile, continuation lines joined."""
    text = re.sub(r"\\\n\s*", " ", dockerfile.read_text())
    return [line.strip() for line in text.splitlines() if re.search(r"\bpip install\b", line)]


def torch_line(dockerfile: Path = DOCKERFILE) -> tuple[str, str]:
    """(torch version, index URL) of the image's first ``pip install``."""
    text = dockerfile.read_text()
    version = re.search(r"pip install[^\n]*torch==([\w.+]+)", text)
    index = re.search(r"pip install[^\n]*torch==[^\n]*--index-url\s+(\S+)", text)
    if version is None or index is None:
        raise ValueError(f"{dockerfile}: no `pip install torch==<version> --index-url <url>` line")
    return version.group(1), index.group(1)


def _pip_env(folder: Path, with_torch: bool) -> Path:
    """An empty environment whose only installed distribution is torch's metadata (the CPU
    wheel's, from this project's virtualenv: the same version as the image's first line), with
    pip run from a copy outside it. Returns its Python."""
    from importlib import metadata

    import pip

    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder / "env")], check=True)
    site = next((folder / "env" / "lib").glob("python*/site-packages"))
    if with_torch:
        torch = metadata.distribution("torch")
        info = Path(str(torch.locate_file(""))) / f"torch-{torch.version}.dist-info"
        shutil.copytree(info, site / info.name)
    shutil.copytree(Path(pip.__file__).parent, folder / "pip-only" / "pip")
    return folder / "env" / "bin" / "python"


def resolve(folder: Path, requirements: Path = REQUIREMENTS, python: str | None = None, *,
            with_torch: bool = True) -> dict[str, Any]:
    """pip's install report for ``requirements`` on the image's platform and Python, binary wheels
    only (``with_torch``: torch already installed, as the image's first line leaves it); raises
    :class:`NoWheel` naming the requirement pip found no wheel for."""
    python = python or image_python()
    interpreter = _pip_env(folder, with_torch)
    report = folder / "report.json"
    command = [str(interpreter), "-m", "pip", "install", "--dry-run", "--quiet", "--report", str(report),
               "--python-version", python, "--implementation", "cp", "--only-binary=:all:",
               *(f"--platform={platform}" for platform in PLATFORMS), "-r", str(requirements)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600,
                          env={"PYTHONPATH": str(folder / "pip-only"), "PATH": "/usr/bin:/bin",
                               "HOME": str(Path.home()), **_pip_settings()})
    if done.returncode != 0:
        missing = re.search(r"No matching distribution found for (\S+)", done.stderr) or re.search(
            r"Could not find a version that satisfies the requirement (\S+)", done.stderr)
        if missing:
            raise NoWheel(f"{missing.group(1)}: no wheel for the Lambda image's platform (x86_64, glibc "
                          f"2.{GLIBC_MINOR}, CPython {python}) in the configured index")
        raise RuntimeError(f"pip failed ({done.returncode}): {done.stderr[-2000:]}")
    return dict(json.loads(report.read_text()))


def _pip_settings() -> dict[str, str]:
    """pip's own configuration of this machine (index, find-links, certificates): the configured index."""
    import os

    return {k: v for k, v in os.environ.items() if k.startswith("PIP_") or k in ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE")}


@functools.cache
def _tls() -> ssl.SSLContext:
    """One TLS context for every request: ``urlopen`` without one builds a new context and loads
    the system's CA bundle each time (about 0.2 s of CPU, 12 s over the wheels' range reads)."""
    return ssl.create_default_context()


class _HttpRange(io.RawIOBase):
    """A read-only, seekable file over HTTP range requests (what zipfile needs to read a directory)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.position = 0
        request = urllib.request.Request(url, method="HEAD")
        with urllib.request.urlopen(request, timeout=60, context=_tls()) as response:
            self.size = int(response.headers["Content-Length"])

    def seekable(self) -> bool:
        return True

    def readable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.position, io.SEEK_END: self.size}[whence]
        self.position = base + offset
        return self.position

    def readinto(self, buffer: Any) -> int:
        if self.position >= self.size:
            return 0
        end = min(self.size, self.position + len(buffer)) - 1
        request = urllib.request.Request(self.url, headers={"Range": f"bytes={self.position}-{end}"})
        with urllib.request.urlopen(request, timeout=60, context=_tls()) as response:
            data = response.read()
        buffer[: len(data)] = data
        self.position += len(data)
        return len(data)


@dataclass(frozen=True)
class WheelSize:
    name: str
    version: str
    download: int
    unpacked: int


def unpacked_size(url: str) -> tuple[int, int]:
    """(bytes to download, bytes the wheel unpacks to) of a wheel, from its zip directory alone
    (a wheel of a ``file://`` index is read from the disk)."""
    if url.startswith("file://"):
        path = Path(urllib.request.url2pathname(url[len("file://"):]))
        with zipfile.ZipFile(path) as wheel:
            return path.stat().st_size, sum(info.file_size for info in wheel.infolist())
    raw = _HttpRange(url)
    with zipfile.ZipFile(io.BufferedReader(raw, buffer_size=1 << 20)) as wheel:
        return raw.size, sum(info.file_size for info in wheel.infolist())


def sizes(report: dict[str, Any]) -> list[WheelSize]:
    """Each resolved wheel's download and unpacked size."""
    found = []
    for item in report["install"]:
        download, unpacked = unpacked_size(item["download_info"]["url"])
        found.append(WheelSize(item["metadata"]["name"], item["metadata"]["version"], download, unpacked))
    return sorted(found, key=lambda wheel: -wheel.unpacked)


def installed_size(distribution: str) -> int:
    """Bytes a distribution takes in this project's virtualenv (its RECORD's sizes)."""
    from importlib import metadata

    files = metadata.distribution(distribution).files or []
    return sum(int(f.size or 0) for f in files)
