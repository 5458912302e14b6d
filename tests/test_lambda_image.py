"""The build Lambda image's dependencies resolve to wheels for its platform, and fit its budget.

Resolved by pip against this machine's configured index (PyPI and the local wheel folders pip's
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
    image_python,
    installed_size,
    resolve,
    sizes,
    torch_line,
)

#: Slow: pip resolves the image's requirements against the index (make test runs it; make test-fast leaves it out).
pytestmark = pytest.mark.slow

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


@needs_index
def test_the_lambda_requirements_resolve_to_wheels_that_run_on_the_image(tmp_path: Path) -> None:
    python = image_python()
    assert python == "3.12"
    report = resolve(tmp_path)
    installed = {item["metadata"]["name"].lower().replace("_", "-"): item for item in report["install"]}
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


@needs_index
def test_a_requirement_with_no_wheel_for_the_image_is_named(tmp_path: Path) -> None:
    requirements = tmp_path / "requirements.txt"
    requirements.write_text("pyyaml==6.0.3\nnumpy==1.21.0\n")  # numpy 1.21 has no CPython 3.12 wheel
    with pytest.raises(NoWheel) as caught:
        resolve(tmp_path / "work", requirements)
    assert str(caught.value).startswith("numpy==1.21.0: no wheel for the Lambda image's platform"), caught.value
    assert "CPython 3.12" in str(caught.value)


def test_the_image_torch_line_resolves_from_its_index(tmp_path: Path) -> None:
    version, index = torch_line()
    if not _reachable(f"{index.rstrip('/')}/torch/"):
        pytest.skip(f"PyTorch's CPU index ({index}) cannot be reached from this machine: the image's first "
                    f"line (torch=={version}) is not resolved here")
    (tmp_path / "torch.txt").write_text(f"torch=={version}\n--index-url {index}\n")
    report = resolve(tmp_path / "work", tmp_path / "torch.txt", with_torch=False)
    assert any(item["metadata"]["name"] == "torch" for item in report["install"])
