"""``TritonMmeClientLayer`` (issue 61): the client and numpy as a Lambda layer, staged by the real CDK
from the installed client and the pinned numpy wheel in ``.wheelhouse`` (``make setup``): no Docker,
no network. The staged files, their size against Lambda's limit, the same asset hash from a second
staging, the client imported from the staged files, and each refusal as one line.

What is not run here: numpy from the layer on CPython 3.14 (this machine's Python is 3.11, and the
layer's numpy is built for the runtime's Python); its extension modules are checked by their tags.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import aws_cdk as cdk
import pytest
from aws_cdk import aws_lambda as lambda_

import triton_mme_cdk.constructs.client_layer as client_layer
from triton_mme_cdk import PropsError, TritonMmeClientLayer
from triton_mme_cdk.constructs.client_layer import LAMBDA_UNZIPPED_LIMIT, PIN_FILE, client_files, wheel_for

pytestmark = pytest.mark.slow  # real synths with a 57 MB asset (a few seconds each)

ROOT = Path(__file__).resolve().parents[1]
WHEELHOUSE = ROOT / ".wheelhouse"
RUNTIME = lambda_.Runtime.PYTHON_3_14


def _synth(out: Path, **options: Any) -> tuple[TritonMmeClientLayer, dict[str, Any], Path]:
    """One stack with the layer and a function that uses it; the template and the layer's asset folder."""
    app = cdk.App(outdir=str(out), analytics_reporting=False)
    stack = cdk.Stack(app, "Layered")
    layer = TritonMmeClientLayer(stack, "ClientLayer", runtime=RUNTIME, **options)
    lambda_.Function(stack, "Client", runtime=RUNTIME, handler="index.handler", layers=[layer],
                     code=lambda_.Code.from_inline("def handler(event, context): return None"))
    template = app.synth().get_stack_by_name("Layered").template
    [content] = [r["Properties"]["Content"] for r in template["Resources"].values()
                 if r["Type"] == "AWS::Lambda::LayerVersion"]
    asset = out / f"asset.{content['S3Key'].removesuffix('.zip')}"
    return layer, template, asset


@pytest.fixture(scope="module")
def synthesized(tmp_path_factory: pytest.TempPathFactory) -> tuple[TritonMmeClientLayer, dict[str, Any], Path]:
    wheel = WHEELHOUSE / wheel_for(RUNTIME).filename
    assert wheel.is_file(), "run `make setup`: it downloads the pinned numpy wheel into .wheelhouse"
    return _synth(tmp_path_factory.mktemp("layer"), wheelhouse=WHEELHOUSE)


def _files(folder: Path) -> dict[str, int]:
    return {path.relative_to(folder).as_posix(): path.stat().st_size
            for path in sorted(folder.rglob("*")) if path.is_file()}


def test_the_layer_holds_the_installed_client_and_the_pinned_numpy(
        synthesized: tuple[TritonMmeClientLayer, dict[str, Any], Path]) -> None:
    layer, template, asset = synthesized
    [resource] = [r["Properties"] for r in template["Resources"].values() if r["Type"] == "AWS::Lambda::LayerVersion"]
    assert resource["CompatibleRuntimes"] == ["python3.14"] and resource["CompatibleArchitectures"] == ["x86_64"]
    [function] = [r["Properties"] for r in template["Resources"].values() if r["Type"] == "AWS::Lambda::Function"]
    assert function["Layers"] == [{"Ref": next(lid for lid, r in template["Resources"].items()
                                               if r["Type"] == "AWS::Lambda::LayerVersion")}]
    files = _files(asset)
    # The client: every module of the installed package, byte for byte, and nothing else of its folder.
    installed = client_files()
    assert {name for name in files if name.startswith("python/triton_mme_client/")} == \
        {f"python/{name}" for name in installed}
    for name, path in installed.items():
        assert (asset / "python" / name).read_bytes() == path.read_bytes(), name
    # numpy: the pinned wheel's files, all of them, as the wheel holds them.
    wheel = WHEELHOUSE / layer.numpy_wheel
    with zipfile.ZipFile(wheel) as archive:
        expected = {f"python/{info.filename}": info.file_size for info in archive.infolist() if not info.is_dir()}
    assert {name: size for name, size in files.items() if not name.startswith("python/triton_mme_client/")} == expected
    # Built for the runtime's Python: its extension modules are CPython 3.14's.
    extensions = [name for name in files if name.startswith("python/numpy/") and name.endswith(".so")]
    assert extensions and all(".cpython-314-x86_64-linux-gnu.so" in name for name in extensions)
    assert not [name for name in files if "__pycache__" in name or name.endswith(".pyc")]


def test_the_size_is_stated_and_under_lambdas_limit(
        synthesized: tuple[TritonMmeClientLayer, dict[str, Any], Path]) -> None:
    layer, _, asset = synthesized
    files = _files(asset)
    assert layer.unzipped_bytes == sum(files.values()) and layer.file_count == len(files)
    assert layer.unzipped_bytes < LAMBDA_UNZIPPED_LIMIT
    # The figures the module's docstring and the docs state: numpy 2.4.6's files 56.5 MB, the client's
    # about 0.05 MB (it changes with the client).
    numpy = sum(size for name, size in files.items() if not name.startswith("python/triton_mme_client/"))
    assert numpy == 56_520_596 and 0 < layer.unzipped_bytes - numpy < 200_000, layer.unzipped_bytes


def test_a_second_staging_gives_the_same_asset(
        synthesized: tuple[TritonMmeClientLayer, dict[str, Any], Path], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Staged again into a new folder (new paths, new times, the wheel copied elsewhere), the asset
    hash and every file's bytes are the same: nothing of the machine or the moment is in it."""
    _, _, asset = synthesized
    monkeypatch.setattr(client_layer, "_STAGED", {})
    copied = tmp_path / "elsewhere"
    copied.mkdir()
    for path in WHEELHOUSE.glob("numpy-*.whl"):
        (copied / path.name).write_bytes(path.read_bytes())
    _, _, second = _synth(tmp_path / "out", wheelhouse=copied)
    assert second.name == asset.name

    def digest(folder: Path) -> str:
        return hashlib.sha256(json.dumps({name: hashlib.sha256((folder / name).read_bytes()).hexdigest()
                                          for name in _files(folder)}).encode()).hexdigest()

    assert digest(second) == digest(asset)


def test_the_client_imports_from_the_layers_files(
        synthesized: tuple[TritonMmeClientLayer, dict[str, Any], Path], tmp_path: Path) -> None:
    """The layer's client modules alone (numpy and boto3 from this Python, as the runtime's boto3
    would be), in a fresh interpreter: the package is complete and encodes a request."""
    _, _, asset = synthesized
    only_client = tmp_path / "python"
    only_client.mkdir()
    (only_client / "triton_mme_client").symlink_to(asset / "python" / "triton_mme_client")
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); import numpy as np, triton_mme_client as c\n"
        "from triton_mme_client.codec import encode_binary\n"
        "assert c.__file__.startswith(sys.argv[1]), c.__file__\n"
        "body, kind = encode_binary({'TEXT': np.array([['first'], ['second']], dtype=object)}, ['sentence_embedding'])\n"
        "client = c.TritonMmeClient.from_env({'TRITON_MME_ENDPOINT_NAME': 'e', 'TRITON_MME_ROUTES_URL': 's3://platform-models/models/_routes/routes.json'},"
        " runtime=object(), s3=object())\n"
        "print(kind, len(body), client.endpoint_name)\n"
    )
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    done = subprocess.run([sys.executable, "-c", code, str(only_client)], capture_output=True, text=True,
                          timeout=120, check=False, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    kind, length, name = done.stdout.split()
    assert kind.startswith("application/vnd.sagemaker-triton.binary+json;json-header-size=") and int(length) > 0
    assert name == "e"


def _refusal(case: str, tmp_path: Path) -> None:
    stack = cdk.Stack(cdk.App(outdir=str(tmp_path / "out")), "Refused")
    if case == "old-runtime":
        TritonMmeClientLayer(stack, "Layer", runtime=lambda_.Runtime.PYTHON_3_11, wheelhouse=WHEELHOUSE)
    elif case == "not-python":
        TritonMmeClientLayer(stack, "Layer", runtime=lambda_.Runtime.NODEJS_22_X, wheelhouse=WHEELHOUSE)
    elif case == "no-wheel":
        TritonMmeClientLayer(stack, "Layer", runtime=RUNTIME, wheelhouse=tmp_path / "empty")
    elif case == "tampered-wheel":
        tampered = tmp_path / "tampered"
        tampered.mkdir()
        name = wheel_for(RUNTIME).filename
        data = bytearray((WHEELHOUSE / name).read_bytes())
        data[-1] ^= 1
        (tampered / name).write_bytes(bytes(data))
        TritonMmeClientLayer(stack, "Layer", runtime=RUNTIME, wheelhouse=tampered)
    raise AssertionError(f"{case}: not refused")


@pytest.mark.parametrize(("case", "expected"), [
    ("old-runtime", "runtime: got python3.11; the layer is built for python3.12, python3.13, python3.14"),
    ("not-python", "runtime: got nodejs22.x; the layer is built for "),
    ("no-wheel", "wheelhouse: "),
    ("tampered-wheel", "wheelhouse: "),
])
def test_bad_input_is_one_line_naming_the_keyword(case: str, expected: str, tmp_path: Path) -> None:
    with pytest.raises(PropsError) as caught:
        _refusal(case, tmp_path)
    message = str(caught.value)
    assert message.startswith(expected), message
    assert "\n" not in message
    if case == "no-wheel":
        assert "is missing (numpy for python3.14)" in message and f"-r {PIN_FILE}" in message
    if case == "tampered-wheel":
        assert f"pins {wheel_for(RUNTIME).sha256}" in message


def test_a_function_on_arm_is_refused_at_synth(tmp_path: Path) -> None:
    """CDK refuses a runtime the layer was not built for; the layer refuses another architecture."""
    app = cdk.App(outdir=str(tmp_path), analytics_reporting=False)
    stack = cdk.Stack(app, "Arm")
    layer = TritonMmeClientLayer(stack, "ClientLayer", runtime=RUNTIME, wheelhouse=WHEELHOUSE)
    lambda_.Function(stack, "Graviton", runtime=RUNTIME, handler="index.handler", layers=[layer],
                     architecture=lambda_.Architecture.ARM_64, code=lambda_.Code.from_inline("x = 1"))
    with pytest.raises(RuntimeError, match=r"runtime: the function Arm/Graviton/Resource uses the x86_64 layer "
                                           r"Arm/ClientLayer but runs on arm64"):
        app.synth()
    with pytest.raises(RuntimeError, match=r"python3\.12 is not in \[python3\.14\]"):
        lambda_.Function(stack, "Older", runtime=lambda_.Runtime.PYTHON_3_12, handler="index.handler",
                         layers=[layer], code=lambda_.Code.from_inline("x = 1"))


def test_every_pinned_wheel_is_numpy_for_one_supported_runtime() -> None:
    """One wheel per runtime, each loading on that runtime's Python and glibc only."""
    for name in client_layer.RUNTIME_PYTHON:
        wheel = wheel_for(lambda_.Runtime(name, lambda_.RuntimeFamily.PYTHON))
        python = client_layer.RUNTIME_PYTHON[name]
        assert f"-cp{python[0]}{python[1]}-" in wheel.filename, (name, wheel.filename)
