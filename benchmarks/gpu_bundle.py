"""``make gpu-bundle``: the GPU check in one folder, for a GPU host that cannot reach a package registry.

``make gpu-check`` installs its GPU runtimes from the package registries. This module writes one
folder instead that holds everything the check needs on a host that has Python and an NVIDIA driver,
and a script that runs it there with nothing downloaded (issue 51)::

    DIR/run.sh                  run.sh [--cpu] [--python PY] [--keep] OUT_DIR [-- CHECK_ARGS]
    DIR/bundle.env              the Python, machine and glibc it was built for (run.sh refuses others)
    DIR/bundle.json             what it holds: every wheel with its size and sha256, the libpython, sizes
    DIR/SHA256SUMS              one line per part (or for the one archive)
    DIR/<archive>.tar.xz        or <archive>.tar.xz.part-000, -001, ... with PART_MB

The archive holds ``wheels/`` (for that Python and platform only), ``check.txt`` and ``triton.txt``
(the exact versions each environment installs, without resolving), ``project/`` (``benchmarks/``,
the package ``triton_mme_cdk`` with its ``model_build``, ``models.yaml``, ``cdk.json``) and
``libpython/`` (the shared library the python backend stub links, for a host that lacks it).

Two environments, as the local endpoint has two (``.venv`` and ``.venv-triton``):

- **check**: the check itself (numpy 2, onnxruntime-gpu, transformers, onnx, the MiniLM package ...);
- **triton**: ``nvidia-pytriton``'s tritonserver and what its python backend stub imports: numpy 1.26
  (``nvidia-pytriton`` pins numpy<2), onnxruntime-gpu.

PyTorch is the host's by default (``--torch host``): a GPU host that runs this check has a CUDA
PyTorch (the lent GPU machines: torch cu130 in ``/opt/torch/.venv``), and its CUDA build with its
NVIDIA libraries is gigabytes. Each environment then sees the host Python's site-packages *after*
its own (a ``.pth`` file), so the bundle's pinned packages win and torch comes from the host.
``--torch bundle`` carries PyPI's torch instead (and the host's packages are not used). The CUDA and
cuDNN wheels (``nvidia-*``) are carried only with ``--cuda-libs bundle``; by default ``run.sh``
links the host's (those of its torch) beside onnxruntime for ``onnxruntime.preload_dlls()``, or uses
the system's, and says which it found.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

ROOT = Path(__file__).resolve().parents[1]
REQUIREMENTS = ROOT / "requirements-gpu.txt"
CONSTRAINTS = ROOT / "constraints.txt"
RUN_SCRIPT = Path(__file__).resolve().parent / "gpu_bundle_run.sh"
DEFAULT_DIR = ROOT / ".gpu-bundle"
#: Downloads (wheels, a Debian libpython) are kept here between builds, per Python.
DEFAULT_CACHE = ROOT / ".gpu-bundle-cache"
SCHEMA = "triton-mme/gpu-bundle/1"
#: The Pythons a bundle can be built for: the project needs 3.11 or newer, and numpy 1.26 (which
#: nvidia-pytriton's python backend needs, numpy<2) has no wheels after 3.12.
SUPPORTED_PYTHONS = ("3.11", "3.12")
#: nvidia-pytriton 0.7.0's wheel is manylinux_2_35: the lowest glibc a bundle can ask of its host.
DEFAULT_GLIBC = "2.35"
MACHINE = "x86_64"
#: Installed into the triton environment without its dependencies: only its tritonserver binary,
#: backends and python backend stubs are used (the stub imports numpy and the backends' runtimes).
NO_DEPS = ("nvidia-pytriton",)
#: What the triton environment installs of requirements-gpu.txt (besides torch with --torch bundle).
TRITON_PACKAGES = ("nvidia-pytriton", "numpy", "onnxruntime-gpu")
#: PyTorch and what only it brings (its compiler); the host's with --torch host.
TORCH_FAMILY = ("torch", "triton")
#: Manifest sources the bundle carries: a PyPI package (its wheel) and synthetic weights (nothing).
CARRIED_SOURCES = ("package", "synthetic")
XZ_PRESET = 6
#: Files and folders of benchmarks/ that the check never reads.
PROJECT_EXCLUDE = ("__pycache__", "results", ".work")


class BundleError(Exception):
    """A bundle that cannot be built as asked: one line, exit 2."""


def log(message: str) -> None:
    print(f"gpu-bundle: {message}", file=sys.stderr, flush=True)


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def is_cuda_library(name: str) -> bool:
    """An NVIDIA CUDA, cuDNN or cuBLAS wheel (``nvidia-cublas``, ``nvidia-cudnn-cu13``,
    ``cuda-toolkit``...), not ``nvidia-pytriton``."""
    name = canonical(name)
    return (name.startswith("nvidia-") and name not in NO_DEPS) or name.startswith("cuda-")


# ---------------------------------------------------------------------------------------------
# What each environment installs
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Options:
    dir: Path
    python: str
    part_mb: int | None = None
    cuda_libs: str = "host"
    torch: str = "host"
    manifest: Path = ROOT / "models.yaml"
    cache: Path = DEFAULT_CACHE
    glibc: str = DEFAULT_GLIBC
    #: "auto": Debian's libpython3.X where apt knows it, else the builder's python3.X's own shared
    #: library; "none": carry none; else a path to a libpython3.X.so.1.0.
    libpython: str = "auto"
    #: Requirement files instead of requirements-gpu.txt's split (one per environment).
    check_requirements: Path | None = None
    triton_requirements: Path | None = None
    #: pip's own wheel, which installs the wheels on the host (pip runs from its wheel there).
    pip: str = "pip"
    find_links: tuple[str, ...] = ()
    no_index: bool = False
    #: xz's preset: 6 (its default); the wheels inside are compressed already, so 0 to 9 differ by
    #: about 1% in size (onnxruntime-gpu's wheel: 221.7 MB at -1, 219.1 at -6) and much in time.
    xz_preset: int = XZ_PRESET


def _requirement_lines(path: Path) -> list[str]:
    lines = []
    for raw in path.read_text(encoding="utf-8").splitlines():
        line = raw.split("#", 1)[0].strip()
        if line:
            lines.append(line)
    return lines


def _pins(path: Path) -> dict[str, str]:
    """name -> version of a constraints file's ``name==version`` lines (local versions kept)."""
    pins = {}
    for line in _requirement_lines(path):
        name, sep, version = line.partition("==")
        if sep:
            pins[canonical(name.split("[")[0])] = version.strip()
    return pins


def split_requirements(options: Options) -> tuple[list[str], list[str]]:
    """The requirements of the check's and of the triton environment, from requirements-gpu.txt.

    The check environment: every line but nvidia-pytriton, with the project's numpy 2
    (constraints.txt) instead of the stub's numpy 1.26. The triton environment: nvidia-pytriton,
    numpy 1.26 and onnxruntime-gpu. torch in both only with ``--torch bundle``; the extras that
    pull the CUDA and cuDNN wheels (``onnxruntime-gpu[cuda,cudnn]``) only with ``--cuda-libs bundle``.
    """
    from packaging.requirements import Requirement

    if options.check_requirements or options.triton_requirements:
        return ((_requirement_lines(options.check_requirements) if options.check_requirements else []),
                (_requirement_lines(options.triton_requirements) if options.triton_requirements else []))
    numpy2 = _pins(CONSTRAINTS).get("numpy")
    check: list[str] = []
    triton: list[str] = []
    for line in _requirement_lines(REQUIREMENTS):
        requirement = Requirement(line)
        name = canonical(requirement.name)
        if name in TORCH_FAMILY and options.torch == "host":
            continue
        if options.cuda_libs == "host" and requirement.extras:
            requirement.extras = {extra for extra in requirement.extras if extra not in ("cuda", "cudnn")}
        text = str(requirement)
        if name == "numpy":
            triton.append(text)
            check.append(f"numpy=={numpy2}" if numpy2 else "numpy>=2")
            continue
        if name in TRITON_PACKAGES or name in TORCH_FAMILY:
            triton.append(text)
        if name not in NO_DEPS:
            check.append(text)
    return check, triton


@dataclass(frozen=True)
class Wheel:
    name: str
    version: str
    filename: str


@dataclass
class Resolution:
    """One environment's wheels, and what was left to the host."""

    wheels: list[Wheel]
    left_to_host: list[str] = field(default_factory=list)
    #: pip's own wheel, resolved with the environment (one pip run fewer), installed into neither.
    installer: Wheel | None = None


def platform_args(python: str, glibc: str) -> list[str]:
    """pip's options for wheels of CPython ``python`` on manylinux x86_64 up to ``glibc``
    (pip takes each manylinux tag literally, so every older one is named too)."""
    major, minor = (int(part) for part in glibc.split("."))
    if major != 2 or minor < 17:
        raise BundleError(f"--glibc {glibc}: expected 2.17 or newer")
    tags = [f"manylinux_2_{n}_{MACHINE}" for n in range(minor, 4, -1)]
    tags += [f"manylinux2014_{MACHINE}", f"manylinux2010_{MACHINE}", f"manylinux1_{MACHINE}"]
    args = ["--only-binary=:all:", "--implementation", "cp", "--python-version", python]
    for tag in tags:
        args += ["--platform", tag]
    return args


def _pip(options: Options, *args: str) -> subprocess.CompletedProcess[str]:
    index = ["--no-index"] if options.no_index else []
    for link in options.find_links:
        index += ["--find-links", link]
    command = [sys.executable, "-m", "pip", *args, *index, "--disable-pip-version-check"]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        errors = [line for line in done.stderr.splitlines() if line.startswith("ERROR")]
        raise BundleError(f"pip {args[0]} failed: {' '.join(errors) or done.stderr.strip()[-500:]}")
    return done


def _target_environment(python: str) -> dict[str, str]:
    from packaging.markers import default_environment

    environment = {key: str(value) for key, value in default_environment().items()}
    environment.update(python_version=python, python_full_version=f"{python}.0", sys_platform="linux",
                       platform_system="Linux", platform_machine=MACHINE, os_name="posix",
                       implementation_name="cpython", platform_python_implementation="CPython")
    return environment


def _wheel(item: dict[str, Any]) -> Wheel:
    return Wheel(item["metadata"]["name"], item["metadata"]["version"],
                 item["download_info"]["url"].rsplit("/", 1)[-1])


def resolve(options: Options, requirements: Sequence[str], work: Path, label: str,
            installer: str | None = None) -> Resolution:
    """Every wheel ``requirements`` need for the bundle's Python and platform, by pip's resolver
    (``--dry-run --report``: metadata only, nothing downloaded), less what is left to the host: the
    torch family with ``--torch host``, the CUDA libraries with ``--cuda-libs host``, and whatever
    only those need. ``nvidia-pytriton``'s own dependencies are never taken (:data:`NO_DEPS`).
    ``installer`` (pip's requirement) is resolved in the same run and returned apart."""
    from packaging.requirements import Requirement

    if not requirements and installer is None:
        return Resolution([])
    constraints = work / f"{label}-constraints.txt"
    pinned = {canonical(Requirement(line).name) for line in requirements}
    constraints.write_text("".join(f"{name}=={version}\n" for name, version in _pins(CONSTRAINTS).items()
                                   if name not in pinned and name not in TORCH_FAMILY
                                   and "+" not in version), encoding="utf-8")
    report = work / f"{label}-report.json"
    resolved_requirements = [line for line in requirements if canonical(Requirement(line).name) not in NO_DEPS]
    if installer is not None and canonical(Requirement(installer).name) not in {
            canonical(Requirement(line).name) for line in resolved_requirements}:
        resolved_requirements.append(installer)
    items: dict[str, dict[str, Any]] = {}
    if resolved_requirements:
        _pip(options, "install", "--dry-run", "--quiet", "--ignore-installed", "--report", str(report),
             "--target", str(work / f"{label}-target"), *platform_args(options.python, options.glibc),
             "-c", str(constraints), *resolved_requirements)
        for item in json.loads(report.read_text(encoding="utf-8"))["install"]:
            items[canonical(item["metadata"]["name"])] = item
    for line in requirements:
        if canonical(Requirement(line).name) in NO_DEPS:
            nodeps = work / f"{label}-nodeps.json"
            _pip(options, "install", "--dry-run", "--quiet", "--ignore-installed", "--no-deps", "--report",
                 str(nodeps), "--target", str(work / f"{label}-target"),
                 *platform_args(options.python, options.glibc), line)
            for item in json.loads(nodeps.read_text(encoding="utf-8"))["install"]:
                items[canonical(item["metadata"]["name"])] = item

    def left_to_host(name: str) -> bool:
        return ((options.torch == "host" and name in TORCH_FAMILY)
                or (options.cuda_libs == "host" and is_cuda_library(name)))

    environment = _target_environment(options.python)
    kept: set[str] = set()
    skipped: set[str] = set()
    seen: set[tuple[str, frozenset[str]]] = set()
    queue = [(canonical(Requirement(line).name), frozenset(Requirement(line).extras)) for line in requirements]
    while queue:
        name, extras = queue.pop()
        if name not in items or (name, extras) in seen:
            continue
        seen.add((name, extras))
        if left_to_host(name):
            skipped.add(name)
            continue
        kept.add(name)
        if name in NO_DEPS:
            continue
        for text in items[name]["metadata"].get("requires_dist") or []:
            requirement = Requirement(text)
            marker = requirement.marker
            if marker is not None and not any(marker.evaluate({**environment, "extra": extra})
                                              for extra in [*extras, ""]):
                continue
            queue.append((canonical(requirement.name), frozenset(requirement.extras)))
    found = items.get(canonical(Requirement(installer).name)) if installer is not None else None
    return Resolution([_wheel(items[name]) for name in sorted(kept)], sorted(skipped),
                      _wheel(found) if found is not None else None)


def download(options: Options, wheels: Iterable[Wheel], folder: Path) -> None:
    """The wheels into ``folder`` (kept between builds: pip skips a file already there)."""
    folder.mkdir(parents=True, exist_ok=True)
    wanted = sorted({(w.name, w.version, w.filename) for w in wheels})
    missing = [(name, version) for name, version, filename in wanted if not (folder / filename).is_file()]
    if missing:
        log(f"downloading {len(missing)} wheels into {folder}")
    # One pip download per batch in which each project appears once (numpy 2 for the check and 1.26
    # for the stub would conflict in one).
    batches: list[dict[str, str]] = []
    for name, version in missing:
        batch = next((b for b in batches if canonical(name) not in b), None)
        if batch is None:
            batch = {}
            batches.append(batch)
        batch[canonical(name)] = f"{name}=={version}"
    for batch in batches:
        _pip(options, "download", "--no-deps", "--quiet", "--dest", str(folder),
             *platform_args(options.python, options.glibc), *batch.values())
    absent = [filename for _, _, filename in wanted if not (folder / filename).is_file()]
    if absent:
        raise BundleError(f"pip download did not write {', '.join(absent)} into {folder}")


# ---------------------------------------------------------------------------------------------
# The libpython, the project, the glibc
# ---------------------------------------------------------------------------------------------


_GLIBC_SYMBOL = re.compile(rb"GLIBC_2\.([0-9]+)")


def glibc_needed(path: Path) -> str | None:
    """The newest ``GLIBC_2.x`` symbol version a shared library names (its version needs)."""
    found = [int(minor) for minor in _GLIBC_SYMBOL.findall(path.read_bytes())]
    return f"2.{max(found)}" if found else None


def wheel_glibc(filename: str) -> str | None:
    """The glibc a manylinux wheel needs: the lowest of its platform tags (None: pure Python)."""
    from packaging.utils import parse_wheel_filename

    needs = []
    for tag in parse_wheel_filename(filename)[3]:
        platform = tag.platform
        legacy = {"manylinux1": 5, "manylinux2010": 12, "manylinux2014": 17}
        match = re.match(r"manylinux_2_([0-9]+)_", platform)
        if match:
            needs.append(int(match.group(1)))
        elif platform.split("_")[0] in legacy:
            needs.append(legacy[platform.split("_")[0]])
    return f"2.{min(needs)}" if needs else None


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


def _debian_libpython(python: str, cache: Path) -> tuple[Path, str] | None:
    """``libpython3.X.so.1.0`` from Debian's package ``libpython3.X`` (apt-get download, dpkg-deb
    -x), where apt knows the package; None where it does not (Debian 12 has 3.11 only)."""
    if not (shutil.which("apt-get") and shutil.which("dpkg-deb") and shutil.which("apt-cache")):
        return None
    package = f"libpython{python}"
    policy = subprocess.run(["apt-cache", "policy", package], capture_output=True, text=True, check=False)
    candidate = re.search(r"Candidate:\s*(\S+)", policy.stdout)
    if not candidate or candidate.group(1) == "(none)":
        return None
    folder = cache / "debian"
    folder.mkdir(parents=True, exist_ok=True)
    debs = sorted(folder.glob(f"{package}_*.deb"))
    if not debs:
        done = subprocess.run(["apt-get", "download", "-qq", package], cwd=folder, capture_output=True, text=True,
                              check=False)
        debs = sorted(folder.glob(f"{package}_*.deb"))
        if done.returncode != 0 or not debs:
            log(f"apt-get download {package} failed: {done.stderr.strip()[-300:]}")
            return None
    unpacked = folder / debs[-1].stem
    if not unpacked.is_dir():
        subprocess.run(["dpkg-deb", "-x", str(debs[-1]), str(unpacked)], check=True)
    found = sorted(unpacked.rglob(f"libpython{python}.so.1.0"))
    if not found:
        return None
    return found[0].resolve(), f"Debian package {debs[-1].name}"


def _builder_libpython(python: str) -> tuple[Path, str] | None:
    """The shared ``libpython3.X.so.1.0`` of this machine's Python 3.X (a pyenv, uv or conda Python
    built with ``--enable-shared``): ``python3.X`` on PATH, else one installed beside this Python's
    base (pyenv's versions/), where it has one."""
    candidates = [shutil.which(f"python{python}"),
                  *map(str, sorted(Path(sys.base_prefix).parent.glob(f"{python}*/bin/python{python}")))]
    for executable in filter(None, candidates):
        done = subprocess.run([executable, "-c", "import sys, sysconfig; print(sysconfig.get_config_var('LIBDIR')); "
                               "print(sys.version.split()[0])"], capture_output=True, text=True, check=False)
        if done.returncode != 0 or len(done.stdout.split()) != 2:
            continue  # a pyenv shim of a version that is not selected
        libdir, version = done.stdout.split()
        library = Path(libdir) / f"libpython{python}.so.1.0"
        if library.is_file():
            return library.resolve(), f"the shared library of this machine's Python {version} ({library})"
    return None


def find_libpython(options: Options) -> tuple[Path, str] | None:
    if options.libpython == "none":
        return None
    if options.libpython != "auto":
        path = Path(options.libpython)
        if not path.is_file() or not path.name.startswith(f"libpython{options.python}.so"):
            raise BundleError(f"--libpython {path}: expected an existing libpython{options.python}.so.1.0")
        return path.resolve(), f"given ({path})"
    found = _debian_libpython(options.python, options.cache) or _builder_libpython(options.python)
    if found is None:
        raise BundleError(f"no libpython{options.python}.so.1.0 to carry: Debian's apt has no libpython"
                          f"{options.python} here and no python{options.python} on PATH has a shared one; give "
                          f"LIBPYTHON=<path> (or LIBPYTHON=none to carry none)")
    return found


def copy_libpython(source: Path, folder: Path, python: str) -> Path:
    """The library into ``folder`` under its soname, stripped of its symbol tables where ``strip`` is there."""
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / f"libpython{python}.so.1.0"
    shutil.copyfile(source, target)
    if shutil.which("strip"):
        subprocess.run(["strip", "--strip-unneeded", str(target)], check=True)
    target.chmod(0o755)
    return target


def _ignore(folder: str, names: list[str]) -> set[str]:
    return {name for name in names if name in PROJECT_EXCLUDE or name.endswith(".pyc")}


def copy_project(options: Options, folder: Path) -> None:
    """``benchmarks/``, the package ``triton_mme_cdk`` with its ``model_build`` (real files, not
    the checkout's links; the constructs and stacks stay behind: the check needs no CDK), the
    manifest as ``models.yaml`` and ``cdk.json`` (the stack's SHM sizes the served rows use)."""
    shutil.copytree(ROOT / "benchmarks", folder / "benchmarks", ignore=_ignore)
    package = folder / "triton_mme_cdk"
    package.mkdir(parents=True)
    for name in ("__init__.py", "checkout.py", "py.typed"):
        shutil.copy2(ROOT / "triton_mme_cdk" / name, package / name)
    shutil.copytree((ROOT / "triton_mme_cdk" / "model_build").resolve(), package / "model_build", ignore=_ignore)
    shutil.copyfile(options.manifest, folder / "models.yaml")
    shutil.copyfile(ROOT / "cdk.json", folder / "cdk.json")


def check_sources(manifest: Path, check_wheels: Sequence[Wheel] | None = None) -> None:
    """Each model source of the manifest is carried: synthetic, or a package among the check's
    wheels (``check_wheels``; None: the kinds only, before anything is resolved)."""
    from triton_mme_cdk.model_build.errors import ModelBuildError
    from triton_mme_cdk.model_build.manifest import PackageSource, load_manifest

    try:
        models = load_manifest(manifest).models
    except ModelBuildError as error:
        raise BundleError(str(error).splitlines()[0]) from None
    for spec in models:
        kind = spec.source.kind
        if kind not in CARRIED_SOURCES:
            raise BundleError(f"{manifest}: {spec.name}: a {kind} source cannot be carried (the bundle carries "
                              "package and synthetic sources; no hub, bucket or folder is reachable there)")
        if check_wheels is None:
            continue
        names = {canonical(w.name) for w in check_wheels}
        if isinstance(spec.source, PackageSource) and canonical(spec.source.package) not in names:
            raise BundleError(f"{manifest}: {spec.name}: its package {spec.source.package} is not among the check's "
                              "wheels: add its distribution to requirements-gpu.txt")


# ---------------------------------------------------------------------------------------------
# The archive and its parts
# ---------------------------------------------------------------------------------------------


class Parts:
    """A byte stream written as files of at most ``size`` bytes (one file when ``size`` is None),
    with the sha256 of each."""

    def __init__(self, folder: Path, name: str, size: int | None) -> None:
        self.folder, self.name, self.size = folder, name, size
        self.done: list[tuple[str, str, int]] = []  # (file, sha256, bytes)
        self._file: IO[bytes] | None = None
        self._hash = hashlib.sha256()
        self._written = 0

    def _open(self) -> IO[bytes]:
        if self._file is None:
            file = self.name if self.size is None else f"{self.name}.part-{len(self.done):03d}"
            self._current = file
            self._file = (self.folder / file).open("wb")
            self._hash, self._written = hashlib.sha256(), 0
        return self._file

    def _close(self) -> None:
        if self._file is not None:
            self._file.close()
            self.done.append((self._current, self._hash.hexdigest(), self._written))
            self._file = None

    def write(self, data: bytes) -> None:
        while data:
            file = self._open()
            room = len(data) if self.size is None else self.size - self._written
            chunk, data = data[:room], data[room:]
            file.write(chunk)
            self._hash.update(chunk)
            self._written += len(chunk)
            if self.size is not None and self._written >= self.size:
                self._close()

    def close(self) -> None:
        if self._file is None and not self.done:
            self._open()
        self._close()


def _tar_members(root: Path) -> Iterator[Path]:
    yield root
    yield from sorted(root.rglob("*"))


def write_archive(staging: Path, parts: Parts, preset: int = XZ_PRESET) -> None:
    """``staging`` as a tar (sorted, owner root, one mtime: the same tree gives the same bytes),
    compressed with xz (the ``xz`` program with a thread per core where it is there, else Python's
    lzma), streamed into ``parts``."""
    def reset(info: tarfile.TarInfo) -> tarfile.TarInfo:
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        info.mtime = 0
        return info

    xz = shutil.which("xz")
    if xz:
        process = subprocess.Popen([xz, f"-{preset}", "-T0", "-c"], stdin=subprocess.PIPE,
                                   stdout=subprocess.PIPE)
        assert process.stdin is not None and process.stdout is not None
        stdout = process.stdout

        def pump() -> None:
            while chunk := stdout.read(1 << 20):
                parts.write(chunk)

        import threading

        reader = threading.Thread(target=pump)
        reader.start()
        with tarfile.open(fileobj=process.stdin, mode="w|", format=tarfile.PAX_FORMAT) as tar:
            for path in _tar_members(staging):
                tar.add(path, arcname=str(Path("bundle") / path.relative_to(staging)), recursive=False,
                        filter=reset)
        process.stdin.close()
        reader.join()
        if process.wait() != 0:
            raise BundleError("xz failed")
    else:
        import lzma

        class Sink:
            def __init__(self) -> None:
                self.compressor = lzma.LZMACompressor(preset=preset)

            def write(self, data: bytes) -> int:
                parts.write(self.compressor.compress(data))
                return len(data)

            def flush(self) -> None:
                parts.write(self.compressor.flush())

        sink = Sink()
        with tarfile.open(fileobj=sink, mode="w|", format=tarfile.PAX_FORMAT) as tar:  # type: ignore[call-overload]
            for path in _tar_members(staging):
                tar.add(path, arcname=str(Path("bundle") / path.relative_to(staging)), recursive=False,
                        filter=reset)
        sink.flush()
    parts.close()


# ---------------------------------------------------------------------------------------------
# The bundle
# ---------------------------------------------------------------------------------------------


def _prepare_dir(folder: Path) -> None:
    if folder.exists() and any(folder.iterdir()) and not (folder / "bundle.env").is_file():
        raise BundleError(f"{folder} exists and holds no bundle: give an empty or new DIR")
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        while chunk := file.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def build(options: Options) -> dict[str, Any]:
    """Write the bundle into ``options.dir``; returns what bundle.json records."""
    if options.python not in SUPPORTED_PYTHONS:
        raise BundleError(f"PYTHON={options.python}: a bundle is for Python {' or '.join(SUPPORTED_PYTHONS)} "
                          "(the project needs 3.11 or newer; numpy 1.26, which nvidia-pytriton's python backend "
                          "needs, has no wheels after 3.12)")
    for value, name in ((options.cuda_libs, "CUDA_LIBS"), (options.torch, "TORCH")):
        if value not in ("host", "bundle"):
            raise BundleError(f"{name}={value}: expected host or bundle")
    if options.part_mb is not None and options.part_mb < 1:
        raise BundleError(f"PART_MB={options.part_mb}: expected a whole number of MiB, 1 or more")
    if not options.manifest.is_file():
        raise BundleError(f"{options.manifest}: no such manifest")
    started = time.monotonic()
    tag = f"cp{options.python.replace('.', '')}"
    wheel_cache = options.cache / f"wheels-{tag}"
    options.cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="gpu-bundle-", dir=options.cache) as scratch:
        work = Path(scratch)
        check_sources(options.manifest)
        check_reqs, triton_reqs = split_requirements(options)
        log(f"resolving the check's and the triton environment's wheels for CPython {options.python}, "
            f"manylinux glibc {options.glibc} {MACHINE}")
        check = resolve(options, check_reqs, work, "check")
        # pip's own wheel: run from its wheel, it installs the others on the host (whose Python may
        # have no pip: the environments are made --without-pip).
        triton = resolve(options, triton_reqs, work, "triton", installer=options.pip)
        if triton.installer is None:
            raise BundleError(f"pip found no wheel for {options.pip}")
        pip = triton.installer
        cpu_torch = [f"{w.name}=={w.version}" for w in [*check.wheels, *triton.wheels]
                     if canonical(w.name) == "torch" and "+cpu" in w.version]
        if cpu_torch:  # a pip find-links of this machine's (a CPU wheel's local version sorts higher)
            raise BundleError(f"pip resolved {cpu_torch[0]}, a CPU build, for TORCH=bundle: remove the find-links "
                              "or index that offers it from pip's configuration (pip config list)")
        check_sources(options.manifest, check.wheels)
        download(options, [pip, *check.wheels, *triton.wheels], wheel_cache)
        staging = work / "bundle"
        wheels_dir = staging / "wheels"
        wheels_dir.mkdir(parents=True)
        every = {w.filename: w for w in [pip, *check.wheels, *triton.wheels]}
        for filename in sorted(every):
            shutil.copyfile(wheel_cache / filename, wheels_dir / filename)
        for label, resolution in (("check", check), ("triton", triton)):
            (staging / f"{label}.txt").write_text(
                "".join(f"{w.name}=={w.version}\n" for w in resolution.wheels), encoding="utf-8")
        copy_project(options, staging / "project")
        libpython = find_libpython(options)
        libpython_record: dict[str, Any] | None = None
        glibc_needs = [g for g in (wheel_glibc(name) for name in every) if g]
        if libpython is not None:
            carried = copy_libpython(libpython[0], staging / "libpython", options.python)
            needs = glibc_needed(carried)
            glibc_needs += [needs] if needs else []
            libpython_record = {"file": f"libpython/{carried.name}", "from": libpython[1], "glibc": needs,
                                "bytes": carried.stat().st_size}
        glibc = max(glibc_needs, key=_version_key, default="2.17")
        record: dict[str, Any] = {
            "schema": SCHEMA,
            "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "python": options.python,
            #: Its compiled wheels are cp3X: this Python only (a bundle for another is one build away,
            #: for 3.11 or 3.12: numpy 1.26, the stub's, has no wheels after 3.12).
            "supported_pythons": [options.python],
            "machine": MACHINE,
            "glibc": glibc,
            "torch": options.torch,
            "cuda_libs": options.cuda_libs,
            "left_to_host": sorted(set(check.left_to_host) | set(triton.left_to_host)),
            "pip": pip.filename,
            "environments": {"check": [f"{w.name}=={w.version}" for w in check.wheels],
                             "triton": [f"{w.name}=={w.version}" for w in triton.wheels]},
            "wheels": [{"file": name, "bytes": (wheels_dir / name).stat().st_size,
                        "sha256": _sha256(wheels_dir / name), "glibc": wheel_glibc(name)} for name in sorted(every)],
            "libpython": libpython_record,
            "manifest": options.manifest.name,
        }
        (staging / "bundle.json").write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
        record["uncompressed_bytes"] = sum(p.stat().st_size for p in staging.rglob("*") if p.is_file())
        _prepare_dir(options.dir)
        archive = f"triton-mme-gpu-check-{tag}.tar.xz"
        log(f"compressing {record['uncompressed_bytes'] / 2**20:.0f} MiB with xz into {options.dir}")
        parts = Parts(options.dir, archive, None if options.part_mb is None else options.part_mb * 2**20)
        write_archive(staging, parts, options.xz_preset)
    record["archive"] = archive
    record["parts"] = [{"file": file, "sha256": digest, "bytes": size} for file, digest, size in parts.done]
    record["compressed_bytes"] = sum(size for _, _, size in parts.done)
    record["build_s"] = round(time.monotonic() - started, 1)
    (options.dir / "SHA256SUMS").write_text("".join(f"{digest}  {file}\n" for file, digest, _ in parts.done),
                                            encoding="utf-8")
    (options.dir / "bundle.env").write_text(
        f"BUNDLE_SCHEMA={SCHEMA}\nBUNDLE_PYTHON={options.python}\nBUNDLE_MACHINE={MACHINE}\n"
        f"BUNDLE_GLIBC={glibc}\nBUNDLE_ARCHIVE={archive}\nBUNDLE_TORCH={options.torch}\n"
        f"BUNDLE_CUDA_LIBS={options.cuda_libs}\n", encoding="utf-8")
    (options.dir / "bundle.json").write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    shutil.copyfile(RUN_SCRIPT, options.dir / "run.sh")
    (options.dir / "run.sh").chmod(0o755)
    return record


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu_bundle", description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", type=Path, default=DEFAULT_DIR, help=f"the bundle's folder (default {DEFAULT_DIR})")
    parser.add_argument("--python", default="3.12", help="the GPU host's Python, 3.11 or 3.12 (default 3.12)")
    parser.add_argument("--part-mb", type=int, default=None, help="parts of at most this many MiB")
    parser.add_argument("--cuda-libs", default="host", help="host (default) or bundle: carry the CUDA/cuDNN wheels")
    parser.add_argument("--torch", default="host", help="host (default: the host Python's torch) or bundle")
    parser.add_argument("--manifest", type=Path, default=ROOT / "models.yaml")
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE, help="where downloads are kept between builds")
    parser.add_argument("--glibc", default=DEFAULT_GLIBC, help="the newest manylinux glibc a wheel may need")
    parser.add_argument("--libpython", default="auto", help="auto, none, or a libpython3.X.so.1.0 to carry")
    parser.add_argument("--check-requirements", type=Path, help="the check environment's requirements "
                        "(instead of requirements-gpu.txt's)")
    parser.add_argument("--triton-requirements", type=Path, help="the triton environment's requirements")
    parser.add_argument("--pip", default="pip", help="the pip that installs on the host (a requirement)")
    parser.add_argument("--find-links", action="append", default=[], help="a folder of wheels (pip's option)")
    parser.add_argument("--no-index", action="store_true", help="no package index: --find-links only")
    parser.add_argument("--xz-preset", type=int, choices=range(10), default=XZ_PRESET, help="xz's -0 .. -9")
    args = parser.parse_args(argv)
    options = Options(dir=args.dir.resolve(), python=args.python, part_mb=args.part_mb, cuda_libs=args.cuda_libs,
                      torch=args.torch, manifest=args.manifest.resolve(), cache=args.cache.resolve(),
                      glibc=args.glibc, libpython=args.libpython, check_requirements=args.check_requirements,
                      triton_requirements=args.triton_requirements, pip=args.pip,
                      find_links=tuple(args.find_links), no_index=args.no_index, xz_preset=args.xz_preset)
    try:
        record = build(options)
    except BundleError as error:
        print(f"gpu-bundle: {error}", file=sys.stderr)
        return 2
    size = record["compressed_bytes"]
    print(f"gpu-bundle: {options.dir}: {size / 2**20:.1f} MiB xz in {len(record['parts'])} file(s) "
          f"({record['uncompressed_bytes'] / 2**20:.0f} MiB unpacked) for CPython {record['python']}, glibc "
          f"{record['glibc']}+ {record['machine']}, torch: {record['torch']}, CUDA libraries: {record['cuda_libs']}; "
          f"{len(record['wheels'])} wheels; built in {record['build_s']:.0f} s. On the GPU host: "
          f"bash {options.dir.name}/run.sh OUT_DIR")
    return 0


if __name__ == "__main__":
    sys.exit(main())
