"""The build Lambda image's pins, and its dependencies resolve to wheels for its platform and fit
its budget.

The pins are read from the Dockerfile and the lock (no index needed): the base image by digest,
torch alone by version from its index, everything else from ``requirements-lambda.txt`` with
``--require-hashes --no-deps``, every line of which is ``name==version`` with its hashes. Resolved by pip against this machine's configured index (PyPI and the local wheel folders pip's
configuration names), for the image's platform (x86_64, glibc 2.34) and Python (the Dockerfile's
base image tag), binary wheels only, without Docker and without downloading the wheels: see
``tests/lambda_image.py``. Skipped, saying so, where the index cannot be reached.
"""

from __future__ import annotations

import re
import urllib.request
from pathlib import Path

import pytest
from lambda_image import (
    GLIBC_MINOR,
    REQUIREMENTS,
    NoWheel,
    base_image,
    canonical,
    image_python,
    installed_size,
    pip_lines,
    read_lock,
    resolve,
    sizes,
    torch_line,
)
from packaging.requirements import Requirement

#: Slow: pip resolves the image's requirements against the index (make test runs it; make test-fast leaves it out).
slow = pytest.mark.slow
#: The lock's input: what the image needs by name (torch aside).
LOCK_INPUT = REQUIREMENTS.with_suffix(".in")

#: Lambda's limit on a container image (uncompressed, all layers).
IMAGE_LIMIT = 10 * 1024**3
#: What the test allows for Lambda's python3.12 base image, which it cannot measure without a
#: registry it can reach (the base is a few hundred MB: Amazon Linux 2023, Python, the runtime client).
BASE_IMAGE_ALLOWANCE = 1024**3
_WHEEL = re.compile(r"-(?P<python>[^-]+)-(?P<abi>[^-]+)-(?P<platform>[^-]+)\.whl$")


def _reachable(url: str) -> bool:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=10):
            return True
    except OSError:
        return False


needs_index = pytest.mark.skipif(not _reachable("https://pypi.org/simple/"),
                                 reason="the configured package index (PyPI) cannot be reached from this machine")


def _runs_on_the_image(filename: str, python: str) -> bool:
    tags = _WHEEL.search(filename)
    assert tags, filename
    cpython = "cp" + python.replace(".", "")
    pythons, abis = tags["python"].split("."), tags["abi"].split(".")
    python_ok = any(p in ("py3", "py2.py3", cpython) or p.startswith("py3") for p in pythons) or (
        "abi3" in abis and any(p.startswith("cp3") and int(p[3:]) <= int(cpython[3:]) for p in pythons))
    platform_ok = any(
        p == "any" or p in ("manylinux1_x86_64", "manylinux2010_x86_64", "manylinux2014_x86_64")
        or (p.startswith("manylinux_2_") and p.endswith("_x86_64") and int(p.split("_")[2]) <= GLIBC_MINOR)
        for p in tags["platform"].split("."))
    return python_ok and platform_ok and (cpython in abis or "none" in abis or "abi3" in abis)


def test_the_base_image_is_pinned_by_digest() -> None:
    reference, digest = base_image()
    assert reference.startswith("public.ecr.aws/lambda/python:3.12@sha256:"), reference
    assert digest is not None and len(digest) == 64, f"the base image is taken by tag: {reference}"


def test_a_base_image_by_tag_is_found(tmp_path: Path) -> None:
    dockerfile = tmp_path / "Dockerfile"
    dockerfile.write_text("FROM public.ecr.aws/lambda/python:3.12\nRUN pip install --no-deps x==1\n")
    assert base_image(dockerfile) == ("public.ecr.aws/lambda/python:3.12", None)
    dockerfile.write_text("FROM a@sha256:" + "0" * 64 + "\nFROM b\n")
    with pytest.raises(ValueError, match="2 FROM lines"):
        base_image(dockerfile)


def test_every_pip_install_of_the_image_is_pinned() -> None:
    """Two installs: torch alone, by exact version from its index without its dependencies (the
    lock has them), then the lock, hash-checked and without resolving anything beside it."""
    torch, lock = pip_lines()  # no third install
    version, index = torch_line()
    assert re.fullmatch(r"\d+\.\d+\.\d+", version) and index.startswith("https://"), (version, index)
    assert "--no-deps" in torch.split() and f"torch=={version}" in torch.split(), torch
    words = lock.split()
    assert {"--require-hashes", "--no-deps"} <= set(words), lock
    assert words[-2:] == ["-r", "/tmp/requirements-lambda.txt"], lock
    assert "COPY requirements-lambda.txt /tmp/requirements-lambda.txt" in REQUIREMENTS.parent.joinpath(
        "Dockerfile").read_text()


def test_the_lock_pins_every_package_with_its_hashes() -> None:
    """Every line ``name==version`` with its hashes; what the input names is locked at a version it
    allows; torch is not in it (the first install's)."""
    lock = read_lock()
    assert len(lock) > 50 and "torch" not in lock
    wanted = [Requirement(line.split("#", 1)[0].strip()) for line in LOCK_INPUT.read_text().splitlines()
              if line.split("#", 1)[0].strip()]
    assert {"transformers", "huggingface-hub", "sympy", "filelock"} <= set(lock) | {canonical(r.name) for r in wanted}
    for requirement in wanted:
        name = canonical(requirement.name)
        assert name in lock, f"{name}: named in {LOCK_INPUT.name} but not locked"
        assert requirement.specifier.contains(lock[name][0], prereleases=True), (name, lock[name][0])
    # torch's own dependencies (its wheel's metadata, the version the image installs) are locked.
    from importlib import metadata

    for dependency in metadata.requires("torch") or []:
        requirement = Requirement(dependency)
        if requirement.marker is None:
            assert canonical(requirement.name) in lock, f"torch needs {requirement.name}; the lock lacks it"


def test_a_lock_line_without_its_hash_or_pin_is_refused(tmp_path: Path) -> None:
    lock = tmp_path / "lock.txt"
    good = "six==1.17.0 \\\n    --hash=sha256:" + "a" * 64 + "\n"
    lock.write_text(good)
    assert read_lock(lock) == {"six": ("1.17.0", frozenset({"a" * 64}))}
    for bad in ("six==1.17.0\n", "six>=1.0 --hash=sha256:" + "a" * 64 + "\n", "--index-url https://x\n"):
        lock.write_text(good + bad)
        with pytest.raises(ValueError, match="is not a pinned requirement with its hashes"):
            read_lock(lock)


@slow
@needs_index
def test_the_lambda_requirements_resolve_to_wheels_that_run_on_the_image(tmp_path: Path) -> None:
    python = image_python()
    assert python == "3.12"
    report = resolve(tmp_path)
    installed = {canonical(item["metadata"]["name"]): item for item in report["install"]}
    # The lock is whole: what pip resolves for it (dependencies followed) is the lock, no more,
    # and each wheel pip picks is one the lock names by hash (the index's own hash of it).
    lock = read_lock()
    assert sorted(set(installed) - set(lock)) == [], "dependencies outside the lock"
    assert sorted(set(lock) - set(installed)) == [], "locked but not needed"
    for name, item in installed.items():
        assert item["metadata"]["version"] == lock[name][0], name
        digest = item["download_info"].get("archive_info", {}).get("hashes", {}).get("sha256")
        assert digest in lock[name][1], f"{name}: the index's wheel {digest} is not among the lock's hashes"
    for line in REQUIREMENTS.read_text().splitlines():
        pin = re.match(r"^([A-Za-z0-9_.-]+)(?:\[[^\]]*\])?==(\S+)", line.strip())
        if pin:
            name = pin.group(1).lower().replace("_", "-")
            assert installed[name]["metadata"]["version"] == pin.group(2), name
    assert "torch" not in installed, "torch comes from the image's first line (the CPU wheel), not this one"
    not_for_the_image = [item["download_info"]["url"].rsplit("/", 1)[1] for item in report["install"]
                         if not _runs_on_the_image(item["download_info"]["url"].rsplit("/", 1)[1], python)]
    assert not_for_the_image == []

    # The image's size: what the wheels unpack to, torch's CPU build (as installed in this
    # project's virtualenv: the same version and build), and an allowance for the base image.
    wheels = sizes(report)
    torch_bytes = installed_size("torch")
    total = sum(wheel.unpacked for wheel in wheels) + torch_bytes
    print(f"\nLambda image, Python {python} x86_64: {len(wheels)} wheels unpack to "
          f"{sum(w.unpacked for w in wheels) / 1e9:.2f} GB ({sum(w.download for w in wheels) / 1e9:.2f} GB "
          f"to download); torch {torch_bytes / 1e9:.2f} GB; largest: "
          + ", ".join(f"{w.name} {w.unpacked / 1e6:.0f} MB" for w in wheels[:6]))
    assert total + BASE_IMAGE_ALLOWANCE < IMAGE_LIMIT, f"{total / 1e9:.2f} GB of packages"


@slow
@needs_index
def test_a_requirement_with_no_wheel_for_the_image_is_named(tmp_path: Path) -> None:
    requirements = tmp_path / "requirements.txt"
    requirements.write_text("pyyaml==6.0.3\nnumpy==1.21.0\n")  # numpy 1.21 has no CPython 3.12 wheel
    with pytest.raises(NoWheel) as caught:
        resolve(tmp_path / "work", requirements)
    assert str(caught.value).startswith("numpy==1.21.0: no wheel for the Lambda image's platform"), caught.value
    assert "CPython 3.12" in str(caught.value)


@slow
def test_the_image_torch_line_resolves_from_its_index(tmp_path: Path) -> None:
    version, index = torch_line()
    if not _reachable(f"{index.rstrip('/')}/torch/"):
        pytest.skip(f"PyTorch's CPU index ({index}) cannot be reached from this machine: the image's first "
                    f"line (torch=={version}) is not resolved here")
    (tmp_path / "torch.txt").write_text(f"torch=={version}\n--index-url {index}\n")
    report = resolve(tmp_path / "work", tmp_path / "torch.txt", with_torch=False)
    assert any(item["metadata"]["name"] == "torch" for item in report["install"])
