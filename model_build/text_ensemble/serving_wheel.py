"""The ``tokenizers`` wheel a raw-text tarball carries, and the Python of each Triton image.

The SageMaker Triton image's Python has numpy but not ``tokenizers``. Two ways to bring it were
weighed: a packed execution environment (conda-pack, the python backend's
``EXECUTION_ENV_PATH``), which carries a whole interpreter and its libraries (not built or
measured here: no conda on these machines); or the one wheel, unpacked beside the tokenizer's
``model.py`` (measured: 11 MB unpacked, about 4 MB in the gzip, loaded with one ``sys.path``
entry; the text ensemble's cold start 1.02x of the hand-written tokenizer's, docs/benchmarks.md,
text_ensemble). The wheel was chosen on size: it is all an environment would add that the image
lacks.

The wheel is pinned by name and hash in ``serving-wheels.txt`` (pip's hash-checking format) and
downloaded by ``make setup`` and by the build image's Dockerfile into a wheelhouse; the build
never reaches the network for it. It is ``cp310-abi3`` manylinux x86_64: one file loads on every
CPython from 3.10 on, so one tarball serves every image version in :data:`IMAGE_PYTHON` and its
bytes (and the model key) do not depend on the image. An image version whose Python is not in
that table is refused at synth (:func:`serving_python_problem`), not found out on the endpoint.

Only the standard library and ``packaging`` are imported at module level: synth stays light.
"""

from __future__ import annotations

import hashlib
import os
import re
import zipfile
from dataclasses import dataclass
from functools import lru_cache
from importlib import metadata
from pathlib import Path

from packaging.tags import Tag, cpython_tags
from packaging.utils import parse_wheel_filename

from triton_mme_cdk.model_build.errors import PackageError

PIN_FILE = Path(__file__).resolve().parent / "serving-wheels.txt"
#: Where the build looks for the pinned wheel: this variable, else the checkout's ``.wheelhouse``
#: (``make setup``), else ``.wheelhouse`` in the current folder (an installed package: see
#: :data:`DOWNLOAD_COMMAND`), else the build image's folder (model_build/Dockerfile).
WHEELHOUSE_VARIABLE = "MODEL_BUILD_WHEELHOUSE"
CHECKOUT_WHEELHOUSE = Path(__file__).resolve().parents[2] / ".wheelhouse"
IMAGE_WHEELHOUSE = Path("/opt/serving-wheels")
#: The one command that puts the pinned wheel in ``./.wheelhouse`` (as ``make setup`` and the image do).
DOWNLOAD_COMMAND = ("pip download --no-deps --only-binary=:all: --platform manylinux2014_x86_64 --implementation cp "
                    f"--python-version 3.10 --require-hashes -r {PIN_FILE} -d .wheelhouse")
#: The package inside the wheel; type stubs (``.pyi``) are left out (nothing reads them at run time).
PACKAGE = "tokenizers"


@dataclass(frozen=True)
class ImagePython:
    """The Python (and glibc) of a range of Triton image versions, with where that is written."""

    first: str
    last: str
    python: tuple[int, int]
    glibc: tuple[int, int]
    source: str


#: The Python of the SageMaker Triton images (built on NVIDIA's tritonserver containers, whose
#: python backend stub runs on the container's system Python). Sources: NVIDIA's Triton release
#: notes ("The container also includes the following: Ubuntu 22.04 including Python 3.10"; from
#: 24.12 "Ubuntu 24.04 including Python 3.12"). Releases after 24.12 share its Ubuntu 24.04 base;
#: should a later one move to a newer CPython 3.x, the cp310-abi3 wheel still loads on it.
IMAGE_PYTHON: tuple[ImagePython, ...] = (
    ImagePython("23.12", "24.11", (3, 10), (2, 35), "Triton release notes 23.12-24.11: Ubuntu 22.04, Python 3.10"),
    ImagePython("24.12", "26.05", (3, 12), (2, 39), "Triton release notes 24.12: Ubuntu 24.04, Python 3.12"),
)


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) if part.isdigit() else -1 for part in version.split("."))


def image_python(version: str) -> ImagePython | None:
    """The row of :data:`IMAGE_PYTHON` holding image ``version``, or None when it is not known."""
    key = _version_key(version)
    for row in IMAGE_PYTHON:
        if _version_key(row.first) <= key <= _version_key(row.last):
            return row
    return None


@dataclass(frozen=True)
class PinnedWheel:
    """The wheel line of ``serving-wheels.txt``."""

    filename: str
    version: str
    sha256: str

    @property
    def tags(self) -> frozenset[Tag]:
        return parse_wheel_filename(self.filename)[3]

    def loads_on(self, python: tuple[int, int], glibc: tuple[int, int]) -> bool:
        """Whether CPython ``python`` on x86_64 Linux with ``glibc`` can import this wheel."""
        platforms = [f"manylinux_{glibc[0]}_{minor}_x86_64" for minor in range(glibc[1], 16, -1)]
        platforms.append("manylinux2014_x86_64")
        wanted = set(cpython_tags(python, abis=[f"cp{python[0]}{python[1]}"], platforms=platforms))
        return bool(wanted & self.tags)


@lru_cache(maxsize=1)
def pinned_wheel(path: Path = PIN_FILE) -> PinnedWheel:
    """Parse the pin file: its ``# wheel:`` line and its ``tokenizers==X --hash=sha256:Y`` line."""
    text = path.read_text(encoding="utf-8")
    name = re.search(r"^# wheel: (\S+\.whl)$", text, re.MULTILINE)
    pin = re.search(rf"^{PACKAGE}==(\S+) --hash=sha256:([0-9a-f]{{64}})$", text, re.MULTILINE)
    if name is None or pin is None:
        raise PackageError(f"{path}: expected a '# wheel: <file>.whl' line and a "
                           f"'{PACKAGE}==<version> --hash=sha256:<hex>' line")
    wheel = PinnedWheel(filename=name.group(1), version=pin.group(1), sha256=pin.group(2))
    parsed_name, parsed_version = parse_wheel_filename(wheel.filename)[:2]
    if parsed_name != PACKAGE or str(parsed_version) != wheel.version:
        raise PackageError(f"{path}: the wheel {wheel.filename} is not {PACKAGE}=={wheel.version}")
    return wheel


def serving_python_problem(image_version: str, *, setting: str = "mme:triton_image_version") -> str | None:
    """The error when a raw-text tarball would not load on image ``image_version``, or None."""
    row = image_python(image_version)
    known = ", ".join(f"{r.first}-{r.last} (Python {r.python[0]}.{r.python[1]})" for r in IMAGE_PYTHON)
    if row is None:
        return (f"{setting}: got {image_version!r}, whose Python is not known to this version of the app; a "
                f"raw-text target (inputs: text) carries a tokenizers wheel for the image's Python. Known: {known}; "
                "pick one of those, or add the image's Python to model_build/text_ensemble/serving_wheel.py "
                "(IMAGE_PYTHON) with its source")
    wheel = pinned_wheel()
    if not wheel.loads_on(row.python, row.glibc):
        return (f"{setting}: got {image_version!r} (Python {row.python[0]}.{row.python[1]}); the pinned wheel "
                f"{wheel.filename} does not load on it: pin a wheel for that Python in "
                "model_build/text_ensemble/serving-wheels.txt")
    return None


def wheelhouse() -> Path:
    """The folder holding the pinned wheel (see :data:`WHEELHOUSE_VARIABLE`)."""
    given = os.environ.get(WHEELHOUSE_VARIABLE)
    if given:
        return Path(given)
    for folder in (CHECKOUT_WHEELHOUSE, Path.cwd() / ".wheelhouse"):
        if folder.is_dir():
            return folder
    return IMAGE_WHEELHOUSE


def vendored_files(model: str, pin_file: Path = PIN_FILE) -> dict[str, bytes]:
    """The wheel's package files, keyed ``tokenizers/...``, after three checks.

    The file is the pinned one (sha256), it loads on every image of :data:`IMAGE_PYTHON`, and its
    version is the builder's own ``tokenizers`` (which serialized ``tokenizer.json`` and checked
    the ids): each failure is a :class:`PackageError` naming the file and what to run.
    """
    wheel = pinned_wheel(pin_file)
    builder = metadata.version(PACKAGE)
    if builder != wheel.version:
        raise PackageError(f"inputs: text: the builder has {PACKAGE} {builder} but {PIN_FILE.name} pins "
                           f"{wheel.version}; the served tokenizer must be the version that checked the ids: "
                           "install the pinned version (make setup)", model=model)
    path = wheelhouse() / wheel.filename
    if not path.is_file():
        raise PackageError(f"inputs: text: the serving wheel {path} is missing; run `make setup` in a checkout, or "
                           f"`{DOWNLOAD_COMMAND}` where you build, or set {WHEELHOUSE_VARIABLE}", model=model)
    data = path.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    if digest != wheel.sha256:
        raise PackageError(f"inputs: text: {path} has sha256 {digest}, {PIN_FILE.name} pins {wheel.sha256}; "
                           "download it again", model=model)
    for row in IMAGE_PYTHON:
        if not wheel.loads_on(row.python, row.glibc):
            raise PackageError(f"inputs: text: {wheel.filename} does not load on images {row.first}-{row.last} "
                               f"(Python {row.python[0]}.{row.python[1]})", model=model)
    return _package_files(path)


def _package_files(path: Path) -> dict[str, bytes]:
    """The wheel's package files (``tokenizers/...``, type stubs left out), as a tarball carries them."""
    files: dict[str, bytes] = {}
    with zipfile.ZipFile(path) as archive:
        for info in sorted(archive.infolist(), key=lambda item: item.filename):
            name = info.filename
            if name.startswith(f"{PACKAGE}/") and not info.is_dir() and not name.endswith(".pyi"):
                files[name] = archive.read(info)
    return files


def pinned_file_digests(pin_file: Path = PIN_FILE) -> dict[str, str]:
    """``tokenizers/... -> sha256`` of every file a raw-text tarball carries from the pinned wheel,
    read from the wheelhouse's wheel after its own SHA-256 is found equal to the pin (the placing
    step's rule: a tarball's vendored files must be these bytes). Raises :class:`PackageError`
    naming the wheel when it is missing or is not the pinned one."""
    wheel = pinned_wheel(pin_file)
    path = wheelhouse() / wheel.filename
    if not path.is_file():
        raise PackageError(f"the pinned serving wheel {path} is missing; the placing step compares a raw-text "
                           f"tarball's tokenizers files with it: `{DOWNLOAD_COMMAND}`, or set {WHEELHOUSE_VARIABLE}")
    data = path.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    if digest != wheel.sha256:
        raise PackageError(f"{path} has sha256 {digest}, {PIN_FILE.name} pins {wheel.sha256}; not the pinned wheel")
    return {name: hashlib.sha256(content).hexdigest() for name, content in _package_files(path).items()}
