"""Release identity: which key each model's artifact is stored under, and which S3 prefix a
manifest publishes to.

Two levels, so that a change costs only what it must:

- A **model key** (``k-`` and 32 hex digits) hashes what can change the bytes a manifest entry
  builds into (tarball, reference ``.npz``, ``config.pbtxt``): the entry itself except
  ``copies`` (copies are server-side copies of one tarball), the content of its local source,
  the runtime code that builds it and the versions of the libraries that produce its bytes. A
  built model is stored once per key under ``<prefix>/_builds/<key>/`` and reused by every
  later release that has the same key.
- A **release id** (``r-`` and 16 hex digits) derives from the models' keys and targets plus the
  code that lays the release out (index, publish, handler). A release prefix is immutable:
  instances that cached ``bert-0.tar.gz`` from the old release never mix it with the new one.
  An unchanged manifest gives the same id, so ``cdk deploy`` with nothing changed publishes
  nothing; one changed entry gives a new id whose other models are server-side copies.

Runtime code is found by following ``model_build`` imports from the build and release entry
modules, so the tools users run on their machine (``model_build/tools/``: the local endpoint, the
smoke client, ``plan``; and the CLI front ``__main__.py``) are not part of any identity: editing a
tool leaves every key and release id unchanged (issue 9).

Imports neither torch nor boto3: the CDK app computes the ids at synth.
"""

from __future__ import annotations

import ast
import hashlib
import json
import sys
import threading
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import metadata
from pathlib import Path
from typing import Any

from triton_mme_cdk.model_build.manifest import LocalSource, Manifest, ModelSpec, OnnxFileSource

PACKAGE_DIR = Path(__file__).resolve().parents[1]
#: The import name of the package ``model_build/`` is (whose imports are followed).
PACKAGE = "triton_mme_cdk.model_build"
#: Modules whose imports (followed transitively) are the code that produces a model's bytes.
MODEL_ENTRY_MODULES = ("pipeline",)
#: ... and the code that lays out a release (index format, copies, the Lambda's build path).
RELEASE_ENTRY_MODULES = ("pipeline", "handler", "handler.processing_job", "release", "release.store", "release.serving")
#: Never runtime, even if something imported them by mistake: what users run on their machine.
TOOL_MODULES = ("__main__", "tools")
#: Non-Python files that define the build image's toolchain (pins of torch and friends).
RUNTIME_DATA_FILES = ("Dockerfile", "requirements-lambda.txt", "text_ensemble/serving-wheels.txt")
#: The client distribution's package, which owns the routes format the runtime imports
#: (``triton_mme_client.routes``): the image holds it beside the build (a link to the
#: repository's ``client/triton_mme_client``; a real folder in an installed wheel).
IMAGE_CLIENT_DIR = "image/triton_mme_client"
CLIENT_PACKAGE = "triton_mme_client"
#: Distributions whose version can change the bytes of an export, a validation or a tarball.
BYTE_LIBRARIES = (
    "torch",
    "onnx",
    "onnxruntime",
    "onnxscript",
    "transformers",
    "sentence-transformers",
    "tokenizers",
    "safetensors",
    "numpy",
)
#: Index of a release (in its bookkeeping folder, never among the served tarballs); references
#: are for ``verify`` and smoke tests.
INDEX_NAME = "_index.json"
REFERENCE_DIR = "_reference"
#: Folder (under the model prefix) of the content-addressed store of built models.
BUILDS_DIR = "_builds"
#: Folder (under the model prefix) of the SageMaker Processing build jobs' inputs and outputs.
JOBS_DIR = "_jobs"
#: Folder (under the model prefix) of the build state machine's item sources, one JSON array per
#: release, and of each release's failure record.
PLANS_DIR = "_plans"
#: Folder (under the model prefix) the endpoint serves: its ``ModelDataUrl``, fixed for the life
#: of the stack. It holds model tarballs only, each under an immutable content-named key (see
#: :func:`served_name`), so no ``TargetModel`` can name a bookkeeping document.
SERVED_DIR = "served"
#: Folder (under the model prefix) of each release's index: ``_releases/<release_id>/_index.json``.
RELEASES_DIR = "_releases"
#: The routes document (logical model name -> current ``TargetModel``), at a fixed key.
ROUTES_KEY_NAME = "_routes/routes.json"
#: gzip level of the tarballs. ONNX weights barely compress: level 1 gave a MiniLM tarball 0.4%
#: larger than level 9 but packed faster, and unpacking (what an instance pays on a cold load)
#: takes the same time at every level (docs/benchmarks.md, "Artifact size and load"). Another
#: level gives other tarball bytes, so it is part of a model's key.
DEFAULT_COMPRESSLEVEL = 1
#: Fields of a manifest entry that do not change what it builds into.
#: ``build`` says where a model builds, which gives the same bytes on every engine.
KEY_EXCLUDED_FIELDS = frozenset({"copies", "build"})


def _module_path(package_dir: Path, module: str) -> Path | None:
    parts = module.split(".")
    for candidate in (package_dir.joinpath(*parts).with_suffix(".py"), package_dir.joinpath(*parts, "__init__.py")):
        if candidate.is_file():
            return candidate
    return None


def _imported_modules(path: Path) -> frozenset[str]:
    """``model_build`` modules named by any import in ``path`` (lazy imports in functions too):
    ``x`` of ``from model_build.x import y``, and ``x.y`` where ``y`` is a module of package ``x``
    (a name that is not a module is dropped by :func:`_module_path`)."""
    return _imported_modules_of(path.read_text(), str(path))


#: ``ast.parse`` one module at a time: CPython 3.11 can fail two parses on threads at once with
#: "SystemError: AST constructor recursion depth mismatch" (the build's steps run on threads).
_PARSE_LOCK = threading.Lock()


def parse_source(source: str, filename: str) -> ast.Module:
    """``ast.parse`` of ``source``, serialized across threads (see :data:`_PARSE_LOCK`)."""
    with _PARSE_LOCK:
        return ast.parse(source, filename=filename)


@lru_cache(maxsize=1024)
def _imported_modules_of(source: str, filename: str) -> frozenset[str]:
    """:func:`_imported_modules` of one file's text, cached by that text.

    A synth reads the runtime's imports three times (the image's files, the build code's hash,
    the model code's hash), and a process that synthesizes several stacks does so for each:
    parsing about 100 modules each time was a quarter of a synth's Python time. Keyed by the
    source itself, an edited file is parsed again."""
    found: set[str] = set()
    for node in ast.walk(parse_source(source, filename)):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == PACKAGE:
                found.update(alias.name for alias in node.names)
            elif node.module.startswith(PACKAGE + "."):
                module = node.module[len(PACKAGE) + 1 :]
                found.add(module)
                found.update(f"{module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name[len(PACKAGE) + 1 :] for a in node.names if a.name.startswith(PACKAGE + "."))
    return frozenset(found)


def runtime_files(package_dir: Path = PACKAGE_DIR, entries: Iterable[str] = RELEASE_ENTRY_MODULES) -> list[Path]:
    """The files of the runtime reached from ``entries``: their ``model_build`` imports, followed
    transitively, the ``__init__.py`` of their packages, plus the image's toolchain files. Tool
    modules are never included. The build image holds exactly these files (see
    ``constructs.model_build_resource.runtime_only_exclude``), so what the keys hash is what runs."""
    seen: set[str] = set()
    todo = list(entries)
    files: set[Path] = set()
    while todo:
        module = todo.pop()
        if module in seen or module.split(".")[0] in TOOL_MODULES:
            continue
        seen.add(module)
        path = _module_path(package_dir, module)
        if path is None:
            continue
        files.add(path)
        todo.extend(_imported_modules(path))
        # Importing a module runs its packages' __init__.py first: they are runtime code too, and
        # so is what they import (a package's re-exports).
        parts = module.split(".")
        todo.extend(".".join(parts[:depth]) for depth in range(1, len(parts)))
    # The root package's __init__.py, and any folder's met on the way.
    files.update(
        init
        for path in list(files)
        for folder in path.relative_to(package_dir).parents
        if (init := package_dir / folder / "__init__.py").is_file()
    )
    files.update(package_dir / name for name in RUNTIME_DATA_FILES if (package_dir / name).is_file())
    if any(_imports_client(path) for path in list(files)):
        client = package_dir / IMAGE_CLIENT_DIR
        files.update(path for path in client.glob("*") if path.is_file() and path.suffix in {".py", ".typed"})
    return sorted(files)


def _imports_client(path: Path) -> bool:
    """Whether the module at ``path`` imports the client distribution (``triton_mme_client``)."""
    if path.suffix != ".py":
        return False
    for node in ast.walk(parse_source(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == CLIENT_PACKAGE:
            return True
        if isinstance(node, ast.Import) and any(alias.name.split(".")[0] == CLIENT_PACKAGE for alias in node.names):
            return True
    return False


def _files_sha256(package_dir: Path, files: Iterable[Path]) -> str:
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.relative_to(package_dir).as_posix().encode() + b"\0")
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def model_code_sha256(package_dir: Path = PACKAGE_DIR) -> str:
    """Hash of the code that builds a model's bytes (independent of paths and mtimes)."""
    return _files_sha256(package_dir, runtime_files(package_dir, MODEL_ENTRY_MODULES))


def build_code_sha256(package_dir: Path = PACKAGE_DIR) -> str:
    """Hash of the whole runtime (model build + release layout + the Lambda's build path)."""
    return _files_sha256(package_dir, runtime_files(package_dir, RELEASE_ENTRY_MODULES))


@lru_cache(maxsize=1)
def library_versions() -> tuple[tuple[str, str], ...]:
    """Installed versions of :data:`BYTE_LIBRARIES` (read from package metadata: no import).

    The builder's own versions, not the pins: a laptop with another torch builds other bytes,
    so its keys differ and it never reuses (or overwrites) what the Lambda built. The Python
    version (``major.minor``) and the zlib the tarballs are deflated with are part of it too:
    gzip's bytes depend on the zlib build, and nothing promises an export's bytes across Python
    versions. A laptop on the project's Python 3.11 and the Lambda image on 3.12 therefore keep
    separate keys; the same image run elsewhere shares the Lambda's.
    """
    versions = [("python", f"{sys.version_info.major}.{sys.version_info.minor}"),
                ("zlib", zlib.ZLIB_RUNTIME_VERSION)]
    for name in BYTE_LIBRARIES:
        try:
            versions.append((name, metadata.version(name)))
        except metadata.PackageNotFoundError:
            versions.append((name, "absent"))
    return tuple(versions)


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


def local_source_sha256(spec: ModelSpec, base_dir: Path) -> str | None:
    """Content hash of a local source (S3 and hub sources are pinned by their address)."""
    source = spec.source
    if isinstance(source, (LocalSource, OnnxFileSource)) and not source.path.startswith("s3://"):
        path = (base_dir / source.path).resolve()
        if path.exists():
            return _tree_sha256(path)
    return None


def local_sources_sha256(manifest: Manifest, base_dir: Path) -> dict[str, str]:
    """Content hash of each local source, keyed by model name."""
    hashes = {spec.name: local_source_sha256(spec, base_dir) for spec in manifest.models}
    return {name: value for name, value in hashes.items() if value is not None}


def model_key(
    spec: ModelSpec,
    *,
    base_dir: Path,
    code_sha256: str,
    versions: Iterable[tuple[str, str]],
    compresslevel: int = DEFAULT_COMPRESSLEVEL,
) -> str:
    """``k-`` and 32 hex digits over what can change the bytes ``spec`` builds into."""
    entry = {k: v for k, v in spec.model_dump(mode="json").items() if k not in KEY_EXCLUDED_FIELDS}
    document = {
        "entry": entry,
        "source_sha256": local_source_sha256(spec, base_dir),
        "code_sha256": code_sha256,
        "versions": dict(versions),
        "compresslevel": compresslevel,
    }
    text = json.dumps(document, sort_keys=True, separators=(",", ":"))
    return "k-" + hashlib.sha256(text.encode()).hexdigest()[:32]


@dataclass(frozen=True)
class Release:
    """Where a manifest's artifacts live: ``s3://<bucket>/<prefix>/<release_id>/<target>.tar.gz``,
    and where each model's build is stored: ``s3://<bucket>/<prefix>/_builds/<key>/``."""

    release_id: str
    manifest_sha256: str
    code_sha256: str
    #: ``model name -> key``, in manifest order (empty when only the id is known, e.g. a Delete).
    model_keys: Mapping[str, str] = field(default_factory=dict, compare=False, hash=False)
    #: Hash of the code that builds a model's bytes (part of every key); "" when not known.
    model_code_sha256: str = field(default="", compare=False)
    #: ``model name -> entry_sha256`` (what ``plan`` compares), in manifest order.
    entry_hashes: Mapping[str, str] = field(default_factory=dict, compare=False, hash=False)

    def prefix(self, model_prefix: str) -> str:
        """``<prefix>/_releases/<release_id>``: the release's bookkeeping folder (its index)."""
        return _under(model_prefix, f"{RELEASES_DIR}/{self.release_id}")

    def index_key(self, model_prefix: str) -> str:
        return f"{self.prefix(model_prefix)}/{INDEX_NAME}"

    def index_fields(self) -> dict[str, Any]:
        """What a release's index records of where it came from, beside its models."""
        return {
            "release_id": self.release_id,
            "manifest_sha256": self.manifest_sha256,
            "code_sha256": self.code_sha256,
            "model_keys": dict(self.model_keys),
            "model_code_sha256": self.model_code_sha256,
        }


def _under(model_prefix: str, path: str) -> str:
    base = model_prefix.strip("/")
    return f"{base}/{path}" if base else path


def served_prefix(model_prefix: str) -> str:
    """``<prefix>/served``: what the endpoint's ``ModelDataUrl`` names (tarballs only)."""
    return _under(model_prefix, SERVED_DIR)


def routes_key(model_prefix: str) -> str:
    """``<prefix>/_routes/routes.json``: the routes document's fixed key (outside the served prefix)."""
    return _under(model_prefix, ROUTES_KEY_NAME)


def entry_sha256(spec: ModelSpec, base_dir: Path) -> str:
    """Hash of what a manifest entry says (copies aside) and of its local source's content: what
    ``plan`` compares with the live routes. Unlike the model key it leaves out the builder's
    Python and library versions, so a laptop (Python 3.11) and the build Lambda (3.12) agree on
    whether an entry changed."""
    entry = {k: v for k, v in spec.model_dump(mode="json").items() if k not in KEY_EXCLUDED_FIELDS}
    text = json.dumps({"entry": entry, "source_sha256": local_source_sha256(spec, base_dir)},
                      sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def store_prefix(model_prefix: str, key: str) -> str:
    """``<prefix>/_builds/<key>``: where the build of a model key is stored (once)."""
    base = model_prefix.strip("/")
    return f"{base}/{BUILDS_DIR}/{key}" if base else f"{BUILDS_DIR}/{key}"


def entry_model_key(
    spec: ModelSpec,
    *,
    base_dir: Path | None = None,
    package_dir: Path = PACKAGE_DIR,
    compresslevel: int = DEFAULT_COMPRESSLEVEL,
) -> str:
    """The key :func:`compute_release` gives ``spec``, computed for that entry alone: a Map item
    builds one model and need not hash every entry of a manifest of thousands."""
    return model_key(spec, base_dir=base_dir or Path.cwd(), code_sha256=model_code_sha256(package_dir),
                     versions=library_versions(), compresslevel=compresslevel)


def compute_release(
    manifest: Manifest,
    *,
    base_dir: Path | None = None,
    code_sha256: str | None = None,
    package_dir: Path = PACKAGE_DIR,
    versions: Iterable[tuple[str, str]] | None = None,
    compresslevel: int = DEFAULT_COMPRESSLEVEL,
    model_code: str | None = None,
) -> Release:
    """The release of a manifest and the key of each of its models.

    ``code_sha256`` (the whole runtime's hash) and ``model_code`` (the model-building part's)
    may be given by a caller that already has them;
    ``package_dir`` is the runtime that builds (the CDK app passes the image's build context).
    """
    base = base_dir or Path.cwd()
    model_code = model_code or model_code_sha256(package_dir)
    code = code_sha256 or build_code_sha256(package_dir)
    pinned = tuple(versions) if versions is not None else library_versions()
    keys = {
        spec.name: model_key(
            spec, base_dir=base, code_sha256=model_code, versions=pinned, compresslevel=compresslevel
        )
        for spec in manifest.models
    }
    digest = hashlib.sha256()
    digest.update(code.encode() + b"\0")
    for spec in manifest.models:
        digest.update(f"{spec.name}={keys[spec.name]}:{','.join(spec.target_names())}\0".encode())
    return Release(
        release_id=f"r-{digest.hexdigest()[:16]}",
        manifest_sha256=manifest.content_sha256(),
        code_sha256=code,
        model_keys=keys,
        model_code_sha256=model_code,
        entry_hashes={spec.name: entry_sha256(spec, base) for spec in manifest.models},
    )
