"""``TritonMmeClientLayer``: a Lambda layer that brings the client (``triton_mme_client``) and numpy
to a Python function, so that its code calls a model by its name (``TritonMmeClient.from_env()``).

What the layer holds (``python/``, which Lambda puts on the function's ``sys.path`` as ``/opt/python``):

- ``triton_mme_client/``: the modules of the client this app has installed (``*.py`` and
  ``py.typed``, found with importlib: the checkout's ``client/`` or the installed wheel);
- ``numpy/``, ``numpy.libs/``, ``numpy-<version>.dist-info/``: numpy's manylinux x86_64 wheel for the
  runtime's CPython, unpacked as pip would install it. The wheel is pinned by name and sha256 in
  ``client-layer-wheels.txt`` and read from the wheelhouse (``make setup`` downloads it).

boto3 is not in it: Lambda's Python runtimes include it (the client needs boto3 >= 1.28).

Three ways were weighed: bundling with pip at synth (needs the network, or Docker for the
platform's wheels), a container-image function (Docker at synth), and this one: the files of a
pinned wheel and of the installed client, staged by Python at synth. Only this one synthesizes
with no Docker and no network, and it is reproducible: the same client and wheel give the same
files and so the same asset hash, on any machine (CDK hashes relative paths and contents; the
files are staged in a fixed order with fixed permissions).

Size (numpy 2.4.6, Python 3.14): 56.6 MB unpacked, of which numpy's wheel is 56.5 MB (numpy
27.8 MB, its bundled OpenBLAS and gfortran runtime in ``numpy.libs`` 28.5 MB) and the client about
0.05 MB; 16.5 MB zipped (deflate, measured on the staged folder). Lambda allows 250 MB unzipped for a
function and all its layers. :attr:`TritonMmeClientLayer.unzipped_bytes` has the exact figure;
synth refuses a layer over the limit.
"""

from __future__ import annotations

import atexit
import hashlib
import importlib.util
import re
import shutil
import tempfile
import zipfile
from dataclasses import dataclass
from functools import lru_cache
from importlib import metadata
from pathlib import Path

import jsii
from aws_cdk import Annotations, Stack
from aws_cdk import aws_lambda as lambda_
from packaging.requirements import Requirement
from packaging.utils import parse_wheel_filename

from constructs import Construct, IValidation
from triton_mme_cdk.constructs.sagemaker_limits import PropsError
from triton_mme_cdk.model_build.text_ensemble.serving_wheel import WHEELHOUSE_VARIABLE, PinnedWheel
from triton_mme_cdk.model_build.text_ensemble.serving_wheel import wheelhouse as default_wheelhouse

#: The pinned numpy wheels, one per runtime (pip's hash-checking format with ``# wheel:`` lines).
PIN_FILE = Path(__file__).resolve().parent / "client-layer-wheels.txt"
#: The client's import name and distribution.
CLIENT_PACKAGE = "triton_mme_client"
CLIENT_DISTRIBUTION = "triton-mme-client"
#: What the layer supplies of the client's dependencies, and what the runtime does.
SUPPLIED = {"numpy": "the layer", "boto3": "the Lambda runtime"}
#: Lambda's Python runtimes the layer is built for: their CPython. All run on Amazon Linux 2023,
#: glibc 2.34 (Lambda developer guide, "Lambda runtimes": python3.12 and later on AL2023).
RUNTIME_PYTHON: dict[str, tuple[int, int]] = {"python3.12": (3, 12), "python3.13": (3, 13), "python3.14": (3, 14)}
RUNTIME_GLIBC = (2, 34)
#: Lambda's limit on a function and its layers, unzipped (Lambda developer guide, "Lambda quotas").
LAMBDA_UNZIPPED_LIMIT = 250 * 1000 * 1000
#: The files of the client package that run (no ``__pycache__``, nothing else left in the folder).
CLIENT_SUFFIXES = (".py", ".typed")


@lru_cache(maxsize=1)
def pinned_wheels(path: Path = PIN_FILE) -> tuple[PinnedWheel, ...]:
    """The ``# wheel: <file> sha256:<hex>`` lines of the pin file, each checked against its
    ``numpy==<version> --hash=...`` line (the version, and the hash among those pip checks)."""
    text = path.read_text(encoding="utf-8")
    pin = re.search(r"^numpy==(\S+)((?: --hash=sha256:[0-9a-f]{64})+)$", text, re.MULTILINE)
    lines = re.findall(r"^# wheel: (\S+\.whl) sha256:([0-9a-f]{64})$", text, re.MULTILINE)
    if pin is None or not lines:
        raise PropsError(f"{path}: expected '# wheel: <file>.whl sha256:<hex>' lines and a "
                         "'numpy==<version> --hash=sha256:<hex> ...' line")
    hashes = set(re.findall(r"[0-9a-f]{64}", pin.group(2)))
    wheels = []
    for filename, sha256 in lines:
        name, version = parse_wheel_filename(filename)[:2]
        if name != "numpy" or str(version) != pin.group(1) or sha256 not in hashes:
            raise PropsError(f"{path}: the wheel line {filename} is not numpy=={pin.group(1)} with a pinned hash")
        wheels.append(PinnedWheel(filename=filename, version=str(version), sha256=sha256))
    return tuple(wheels)


def wheel_for(runtime: lambda_.Runtime, path: Path = PIN_FILE) -> PinnedWheel:
    """The pinned wheel that loads on ``runtime`` (a Lambda Python runtime the layer supports)."""
    python = RUNTIME_PYTHON.get(runtime.name)
    if python is None:
        raise PropsError(f"runtime: got {runtime.name}; the layer is built for {', '.join(RUNTIME_PYTHON)} "
                         "(Amazon Linux 2023; numpy's wheels need glibc 2.27 or later)")
    for wheel in pinned_wheels(path):
        if wheel.loads_on(python, RUNTIME_GLIBC):
            return wheel
    raise PropsError(f"runtime: got {runtime.name}; {path.name} pins no numpy wheel for Python "
                     f"{python[0]}.{python[1]}: add one (its '# wheel:' line and its hash)")


def client_files() -> dict[str, Path]:
    """``triton_mme_client/<file>`` -> the installed file, for each module of the client."""
    spec = importlib.util.find_spec(CLIENT_PACKAGE)
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    if not folders:
        raise PropsError(f"runtime: the client ({CLIENT_PACKAGE}) is not installed in this Python, so the layer "
                         "cannot carry it: install it (pip install ./client from a checkout, or its wheel)")
    root = Path(folders[0])
    files = {f"{CLIENT_PACKAGE}/{path.relative_to(root).as_posix()}": path
             for path in sorted(root.rglob("*"))
             if path.is_file() and path.suffix in CLIENT_SUFFIXES and "__pycache__" not in path.parts}
    if f"{CLIENT_PACKAGE}/__init__.py" not in files:
        raise PropsError(f"runtime: {root} has no __init__.py; not the client package")
    return files


def unsupplied_requirements() -> list[str] | None:
    """The client's dependencies that neither the layer nor the runtime supplies (None: its
    metadata cannot be read, so this is unknown)."""
    try:
        requires = metadata.requires(CLIENT_DISTRIBUTION) or []
    except metadata.PackageNotFoundError:
        return None
    found = [Requirement(line) for line in requires]
    return [str(r) for r in found if r.marker is None and r.name.lower() not in SUPPLIED]


@dataclass(frozen=True)
class StagedLayer:
    """A staged layer folder and its size."""

    folder: Path
    unzipped_bytes: int
    files: int


_STAGED: dict[tuple[str, str], StagedLayer] = {}
_STAGING_ROOT: list[Path] = []


def _staging_root() -> Path:
    if not _STAGING_ROOT:
        root = Path(tempfile.mkdtemp(prefix="triton-mme-client-layer-"))
        atexit.register(shutil.rmtree, root, True)
        _STAGING_ROOT.append(root)
    return _STAGING_ROOT[0]


def _write(path: Path, data: bytes, executable: bool) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    path.chmod(0o755 if executable else 0o644)


def stage(wheel_path: Path, client: dict[str, Path]) -> StagedLayer:
    """The layer folder for ``wheel_path`` (checked already) and the ``client`` files: staged once
    per process for the same inputs, in a fixed order with fixed permissions."""
    digest = hashlib.sha256()
    for name, path in client.items():
        digest.update(name.encode() + b"\0" + path.read_bytes() + b"\0")
    key = (str(wheel_path), digest.hexdigest())
    if key in _STAGED:
        return _STAGED[key]
    folder = Path(tempfile.mkdtemp(dir=_staging_root(), prefix="layer-"))
    python = folder / "python"
    size = count = 0
    with zipfile.ZipFile(wheel_path) as archive:
        for info in sorted(archive.infolist(), key=lambda item: item.filename):
            name = info.filename
            if info.is_dir():
                continue
            if name.startswith("/") or ".." in name.split("/") or name.split("/", 1)[0].endswith(".data"):
                raise PropsError(f"runtime: {wheel_path.name} holds {name!r}, which a layer cannot carry")
            data = archive.read(info)
            _write(python / name, data, bool((info.external_attr >> 16) & 0o111))
            size, count = size + len(data), count + 1
    for name, path in client.items():
        data = path.read_bytes()
        _write(python / name, data, False)
        size, count = size + len(data), count + 1
    staged = StagedLayer(folder=folder, unzipped_bytes=size, files=count)
    _STAGED[key] = staged
    return staged


@jsii.implements(IValidation)
class _X86Functions:
    """Synth fails where a function of the layer's stack that uses it is not x86_64 (CDK checks a
    layer's runtimes, not its architectures; numpy's extension modules would not load)."""

    def __init__(self, layer: lambda_.LayerVersion) -> None:
        self._layer = layer

    def validate(self) -> list[str]:
        stack = Stack.of(self._layer)
        arn = stack.resolve(self._layer.layer_version_arn)
        return [f"runtime: the function {node.node.path} uses the x86_64 layer {self._layer.node.path} but runs "
                f"on {', '.join(stack.resolve(node.architectures))}; give it lambda_.Architecture.X86_64"
                for node in stack.node.find_all()
                if isinstance(node, lambda_.CfnFunction) and arn in (stack.resolve(node.layers) or [])
                and stack.resolve(node.architectures) not in (None, ["x86_64"])]


class TritonMmeClientLayer(lambda_.LayerVersion):
    """A Lambda layer with the client (``triton_mme_client``) and numpy for ``runtime`` (Lambda's
    python3.12, python3.13 or python3.14; default python3.14), x86_64.

    ``wheelhouse``: the folder holding the pinned numpy wheel (default: ``MODEL_BUILD_WHEELHOUSE``,
    else the checkout's ``.wheelhouse`` that ``make setup`` fills, else ``./.wheelhouse``). Give the
    layer to a function with ``layers=[layer]``, and the endpoint's environment and grant with
    ``endpoint.connect_client(function)``. The function must be x86_64 (synth checks those of the
    layer's stack). The staged folder is temporary: CDK copies it into the cloud assembly; with asset
    staging disabled (``aws:cdk:disable-asset-staging``, as SAM's local runs set) the path the
    assembly names is gone after synth.
    """

    def __init__(self, scope: Construct, id: str, *, runtime: lambda_.Runtime | None = None,
                 wheelhouse: str | Path | None = None) -> None:
        runtime = runtime or lambda_.Runtime.PYTHON_3_14
        wheel = wheel_for(runtime)
        path = (Path(wheelhouse) if wheelhouse is not None else default_wheelhouse()) / wheel.filename
        command = (f"pip download --no-deps --only-binary=:all: --platform manylinux_2_28_x86_64 --implementation cp "
                   f"--python-version {RUNTIME_PYTHON[runtime.name][0]}.{RUNTIME_PYTHON[runtime.name][1]} "
                   f"--require-hashes -r {PIN_FILE} -d .wheelhouse")
        if not path.is_file():
            raise PropsError(f"wheelhouse: {path} is missing (numpy for {runtime.name}); run `make setup` in a "
                             f"checkout, or `{command}` where you synthesize, or set {WHEELHOUSE_VARIABLE}")
        sha256 = hashlib.sha256(path.read_bytes()).hexdigest()
        if sha256 != wheel.sha256:
            raise PropsError(f"wheelhouse: {path} has sha256 {sha256}, {PIN_FILE.name} pins {wheel.sha256}; "
                             f"download it again: `{command}`")
        unsupplied = unsupplied_requirements()
        if unsupplied:
            raise PropsError(f"runtime: the client requires {', '.join(unsupplied)}, which neither the layer "
                             "(numpy) nor the Lambda runtime (boto3) supplies")
        staged = stage(path, client_files())
        if staged.unzipped_bytes > LAMBDA_UNZIPPED_LIMIT:
            raise PropsError(f"runtime: the layer is {staged.unzipped_bytes / 1e6:.1f} MB unzipped; Lambda allows "
                             f"{LAMBDA_UNZIPPED_LIMIT / 1e6:.0f} MB for a function and its layers")
        super().__init__(
            scope, id, code=lambda_.Code.from_asset(str(staged.folder)), compatible_runtimes=[runtime],
            compatible_architectures=[lambda_.Architecture.X86_64],
            description=f"triton-mme-client and numpy {wheel.version} for {runtime.name} (x86_64)",
        )
        self.node.add_validation(_X86Functions(self))
        if unsupplied is None:
            Annotations.of(self).add_warning_v2(
                "triton-mme:client-requirements-unknown",
                f"runtime: the metadata of {CLIENT_DISTRIBUTION} cannot be read, so whether the layer (numpy) "
                "and the runtime (boto3) supply all its dependencies is unknown")
        #: The runtime the layer is built for.
        self.runtime = runtime
        #: The numpy wheel unpacked into it.
        self.numpy_wheel = wheel.filename
        #: The layer's size unzipped, in bytes (what counts toward Lambda's 250 MB), and its file count.
        self.unzipped_bytes = staged.unzipped_bytes
        self.file_count = staged.files
