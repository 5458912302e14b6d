"""Release identity: which S3 prefix a manifest publishes to.

A release is immutable. Its id is derived from everything that can change the bytes of an
artifact (the manifest, the build code, the content of local sources), so a changed manifest or
build publishes under a new prefix and the SageMaker Model is repointed at it: instances that
cached ``bert-0.tar.gz`` from the old release never mix it with the new one. An unchanged
manifest gives the same id, so ``cdk deploy`` with nothing changed publishes nothing.

Imports neither torch nor boto3: the CDK app computes the id at synth.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from model_build.manifest import LocalSource, Manifest, OnnxFileSource

PACKAGE_DIR = Path(__file__).resolve().parent
#: Files whose content shapes an artifact. Tests and caches are not part of the build code.
_CODE_SUFFIXES = {".py", ".txt", ".cfg", ".toml"}
_CODE_NAMES = {"Dockerfile"}
#: Index of a release, next to its tarballs; references are for ``verify`` and smoke tests.
INDEX_NAME = "_index.json"
REFERENCE_DIR = "_reference"


def build_code_sha256(package_dir: Path = PACKAGE_DIR) -> str:
    """Hash of the build code itself (this package), independent of paths and mtimes."""
    digest = hashlib.sha256()
    for path in sorted(package_dir.rglob("*")):
        if not path.is_file() or "__pycache__" in path.parts:
            continue
        if path.suffix not in _CODE_SUFFIXES and path.name not in _CODE_NAMES:
            continue
        rel = path.relative_to(package_dir).as_posix()
        digest.update(rel.encode() + b"\0")
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def _tree_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    for item in files:
        rel = item.name if path.is_file() else item.relative_to(path).as_posix()
        digest.update(rel.encode() + b"\0")
        with item.open("rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()


def local_sources_sha256(manifest: Manifest, base_dir: Path) -> dict[str, str]:
    """Content hash of each local source, keyed by model name (S3 and hub sources are pinned)."""
    hashes: dict[str, str] = {}
    for spec in manifest.models:
        source = spec.source
        if isinstance(source, (LocalSource, OnnxFileSource)) and not source.path.startswith("s3://"):
            path = (base_dir / source.path).resolve()
            if path.exists():
                hashes[spec.name] = _tree_sha256(path)
    return hashes


@dataclass(frozen=True)
class Release:
    """Where a manifest's artifacts live: ``s3://<bucket>/<prefix>/<release_id>/<target>.tar.gz``."""

    release_id: str
    manifest_sha256: str
    code_sha256: str

    def prefix(self, model_prefix: str) -> str:
        return f"{model_prefix.strip('/')}/{self.release_id}" if model_prefix.strip("/") else self.release_id

    def key(self, model_prefix: str, target: str) -> str:
        return f"{self.prefix(model_prefix)}/{target}.tar.gz"

    def index_key(self, model_prefix: str) -> str:
        return f"{self.prefix(model_prefix)}/{INDEX_NAME}"


def compute_release(
    manifest: Manifest,
    *,
    base_dir: Path | None = None,
    code_sha256: str | None = None,
) -> Release:
    """The release of a manifest: ``r-`` and 16 hex digits of a hash over what shapes its bytes."""
    code = code_sha256 or build_code_sha256()
    digest = hashlib.sha256()
    digest.update(manifest.canonical_json().encode())
    digest.update(code.encode())
    for name, value in sorted(local_sources_sha256(manifest, base_dir or Path.cwd()).items()):
        digest.update(f"{name}={value}".encode())
    return Release(
        release_id=f"r-{digest.hexdigest()[:16]}",
        manifest_sha256=manifest.content_sha256(),
        code_sha256=code,
    )
