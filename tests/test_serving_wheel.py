"""The tokenizers wheel raw-text tarballs carry, and the Python of each Triton image (issue 24).

The wheel is pinned by name and sha256 (model_build/text_ensemble/serving-wheels.txt), fetched
offline-ready by ``make setup`` into ``.wheelhouse`` and by the build image's Dockerfile, and
checked against every image Python the stack accepts; an image whose Python is unknown is refused
at synth.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from triton_mme_cdk.model_build.errors import PackageError
from triton_mme_cdk.model_build.text_ensemble import serving_wheel
from triton_mme_cdk.model_build.text_ensemble.serving_wheel import (
    IMAGE_PYTHON,
    PIN_FILE,
    WHEELHOUSE_VARIABLE,
    PinnedWheel,
    image_python,
    pinned_wheel,
    serving_python_problem,
    vendored_files,
    wheelhouse,
)

ROOT = Path(__file__).resolve().parents[1]


def _pinned_version(path: Path, package: str = "tokenizers") -> str:
    found = re.search(rf"^{package}==(\S+)", path.read_text(), re.MULTILINE)
    assert found, f"{path} pins no {package}"
    return found.group(1)


def test_the_served_tokenizers_is_the_builders_own_version():
    """The build serializes tokenizer.json and checks the ids with its tokenizers: the wheel the
    endpoint runs must be that version, on the laptop and in the build image."""
    wheel = pinned_wheel()
    assert wheel.version == _pinned_version(ROOT / "constraints.txt")
    assert wheel.version == _pinned_version(ROOT / "model_build" / "requirements-lambda.txt")
    assert wheel.filename.startswith(f"tokenizers-{wheel.version}-") and "abi3" in wheel.filename


def test_make_setup_fetched_the_pinned_wheel_and_the_tarball_gets_the_package_alone():
    assert (wheelhouse() / pinned_wheel().filename).is_file(), "run `make setup`: it fills .wheelhouse"
    files = vendored_files("m")
    assert "tokenizers/__init__.py" in files and "tokenizers/tokenizers.abi3.so" in files
    assert not [name for name in files if name.endswith(".pyi") or ".dist-info" in name]
    assert all(name.startswith("tokenizers/") for name in files)


def test_a_wheel_with_other_bytes_is_refused_naming_both_hashes(tmp_path, monkeypatch):
    wheel = pinned_wheel()
    tampered = bytearray((wheelhouse() / wheel.filename).read_bytes())
    tampered[-100] ^= 0xFF
    (tmp_path / wheel.filename).write_bytes(bytes(tampered))
    monkeypatch.setenv(WHEELHOUSE_VARIABLE, str(tmp_path))
    with pytest.raises(PackageError) as caught:
        vendored_files("m")
    assert f"pins {wheel.sha256}" in str(caught.value) and "download it again" in str(caught.value)


def test_a_missing_wheel_says_what_to_run(tmp_path, monkeypatch):
    monkeypatch.setenv(WHEELHOUSE_VARIABLE, str(tmp_path / "empty"))
    with pytest.raises(PackageError, match=r"the serving wheel .* is missing; run `make setup` in a checkout, or "
                                           r"`pip download .* -d \.wheelhouse` where you build"):
        vendored_files("m")


def test_an_installed_package_finds_the_wheel_in_the_current_folder(tmp_path, monkeypatch):
    """Installed from a wheel there is no checkout: ``./.wheelhouse`` (the documented download's
    folder) is where the build looks, after the variable and the checkout's."""
    import triton_mme_cdk.model_build.text_ensemble.serving_wheel as module

    wheel = pinned_wheel()
    (tmp_path / ".wheelhouse").mkdir()
    (tmp_path / ".wheelhouse" / wheel.filename).write_bytes((wheelhouse() / wheel.filename).read_bytes())
    monkeypatch.delenv(WHEELHOUSE_VARIABLE, raising=False)
    monkeypatch.setattr(module, "CHECKOUT_WHEELHOUSE", tmp_path / "no-checkout" / ".wheelhouse")
    monkeypatch.chdir(tmp_path)
    assert module.wheelhouse() == tmp_path / ".wheelhouse"
    assert vendored_files("m")


def test_a_pin_of_another_version_than_the_builders_is_refused(tmp_path):
    pin = tmp_path / "serving-wheels.txt"
    text = PIN_FILE.read_text().replace(pinned_wheel().version, "0.20.0")
    pin.write_text(text)
    with pytest.raises(PackageError) as caught:
        vendored_files("m", pin_file=pin)
    assert f"the builder has tokenizers {pinned_wheel().version} but serving-wheels.txt pins 0.20.0" in str(caught.value)


def test_abi3_wheel_loads_on_every_image_python_and_a_too_old_or_foreign_one_does_not():
    wheel = pinned_wheel()
    for row in IMAGE_PYTHON:
        assert wheel.loads_on(row.python, row.glibc), row
    assert wheel.loads_on((3, 11), (2, 36))  # this machine's triton environment (the local endpoint)
    assert not wheel.loads_on((3, 9), (2, 35))  # cp310-abi3: CPython 3.10 or newer
    arm = PinnedWheel(filename=wheel.filename.replace("x86_64", "aarch64"), version=wheel.version, sha256="0" * 64)
    assert not arm.loads_on((3, 12), (2, 39))  # the endpoint's instances are x86_64
    only_313 = PinnedWheel(filename=f"tokenizers-{wheel.version}-cp313-cp313-manylinux_2_17_x86_64.whl",
                           version=wheel.version, sha256="0" * 64)
    assert not only_313.loads_on((3, 12), (2, 39))


def test_every_image_version_the_stack_accepts_has_a_known_python():
    from triton_mme_cdk.constructs.triton_image import load_image_table

    for version in load_image_table().versions:
        row = image_python(version)
        assert row is not None, f"image {version}: add its Python to IMAGE_PYTHON"
        assert serving_python_problem(version) is None
    assert image_python("24.11").python == (3, 10) and image_python("24.12").python == (3, 12)  # type: ignore[union-attr]


def test_an_image_whose_python_is_unknown_is_refused_naming_the_setting():
    problem = serving_python_problem("27.01")
    assert problem is not None
    assert "mme:triton_image_version: got '27.01', whose Python is not known" in problem
    assert "24.12-26.05 (Python 3.12)" in problem


def test_synth_refuses_a_text_manifest_on_an_image_of_unknown_python(tmp_path, monkeypatch):
    """The check runs at synth (not on the endpoint), and only when a target takes raw text."""
    from cdk_helpers import context, synth

    from triton_mme_cdk.constructs.sagemaker_limits import PropsError
    from triton_mme_cdk.stacks.settings import MmeSettings

    newest = MmeSettings.from_context(context()).fleet_host().image_version  # the default fleet's image
    monkeypatch.setattr(serving_wheel, "IMAGE_PYTHON",
                        tuple(row for row in IMAGE_PYTHON if image_python(newest) != row))
    with pytest.raises(PropsError) as caught:
        synth(tmp_path / "out", nag=False)  # models.yaml has raw-text targets
    assert f"mme:triton_image_version: got {newest!r}, whose Python is not known" in str(caught.value)
    tokens_only = tmp_path / "tokens.yaml"
    tokens_only.write_text("version: 1\nmodels:\n  - name: bert-tiny\n    source: {kind: synthetic, architecture: bert}\n"
                           "    task: sentence-embedding\n")
    assert synth(tmp_path / "out2", nag=False, manifest_path=tokens_only).template


def test_the_build_image_and_make_setup_download_the_pin_with_hashes_required():
    dockerfile = (ROOT / "model_build" / "Dockerfile").read_text()
    makefile = (ROOT / "Makefile").read_text()
    for text in (dockerfile, makefile):
        assert "--require-hashes" in text and "serving-wheels.txt" in text and "--only-binary=:all:" in text
    assert f"{WHEELHOUSE_VARIABLE}=/opt/serving-wheels" in dockerfile


def test_the_pin_is_runtime_so_changing_it_changes_every_model_key(tmp_path):
    from triton_mme_cdk.model_build.release import PACKAGE_DIR, model_code_sha256, runtime_files

    assert PIN_FILE in runtime_files(PACKAGE_DIR)
    copy = tmp_path / "model_build"
    shutil.copytree(PACKAGE_DIR, copy, ignore=shutil.ignore_patterns("__pycache__"))
    before = model_code_sha256(copy)
    pin = copy / "text_ensemble" / "serving-wheels.txt"
    pin.write_text(pin.read_text() + "# another wheel\n")
    assert model_code_sha256(copy) != before
