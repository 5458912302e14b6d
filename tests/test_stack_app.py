"""The app as users run it: ``python app.py`` and ``npx cdk synth``; errors, determinism, snapshot."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import aws_cdk as cdk
import pytest
from aws_cdk import aws_s3 as s3
from cdk_helpers import ROOT, SNAPSHOTS, snapshot_text, subprocess_env
from hostile_helpers import Outcome, run_app_refusals

import app as cdk_app

HEAVY = {"torch", "sagemaker", "transformers", "onnx", "onnxruntime", "tritonclient", "boto3"}
SNAPSHOT = SNAPSHOTS / "TritonMme.template.json"
SYNTH_AND_LIST_MODULES = (
    "import json, sys\n"
    f"sys.path.insert(0, {str(ROOT)!r})\n"
    "import app\n"
    "rc = app.main()\n"
    f"print(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}} & set({sorted(HEAVY)!r}))))\n"
    "sys.exit(rc)\n"
)


#: Each synth's process result and its output folder.
Synths = list[tuple[subprocess.CompletedProcess[str], Path]]


@pytest.fixture(scope="module")
def two_synths(tmp_path_factory: pytest.TempPathFactory) -> Synths:
    """The default app synthesized twice, in two processes with different hash seeds, with the
    CDK's built-in template validation on, as users run it (the other tests leave it off:
    tests/conftest.py)."""
    runs = []
    for seed in ("1", "2"):
        outdir = tmp_path_factory.mktemp(f"synth{seed}")
        env = subprocess_env(CDK_OUTDIR=str(outdir), CDK_CONTEXT_JSON="{}", PYTHONHASHSEED=seed,
                             CDK_VALIDATION="true")
        result = subprocess.run(
            [sys.executable, "-c", SYNTH_AND_LIST_MODULES], cwd=ROOT, env=env,
            capture_output=True, text=True, timeout=300,
        )
        runs.append((result, outdir))
    return runs


def test_app_synthesizes_without_credentials_or_heavy_imports(two_synths: Synths) -> None:
    for result, outdir in two_synths:
        assert result.returncode == 0, result.stderr
        assert json.loads(result.stdout.strip().splitlines()[-1]) == []
        manifest = json.loads((outdir / "manifest.json").read_text())
        # Environment-agnostic: no account or region looked up or baked in.
        assert manifest["artifacts"]["TritonMme"]["environment"] == "aws://unknown-account/unknown-region"
        assert not (ROOT / "cdk.context.json").exists()


#: A bucket whose versioning status CloudFormation's schema does not allow: what the CDK's built-in
#: validation reports (cfn-lint's rule W3030), in a process started as the app's are.
INVALID_BUCKET = (
    "import sys\n"
    "import aws_cdk as cdk\n"
    "app = cdk.App(outdir=sys.argv[1])\n"
    "stack = cdk.Stack(app, 'Invalid')\n"
    "cdk.CfnResource(stack, 'Bucket', type='AWS::S3::Bucket',\n"
    "                properties={'VersioningConfiguration': {'Status': 'Sometimes'}})\n"
    "app.synth()\n"
)


def _builtin_validation_findings(outdir: Path) -> list[str]:
    """The rules the CDK's built-in validation ("CloudFormation Validate") reported in a synth's report."""
    report = json.loads((outdir / "validation-report.json").read_text())
    return [violation["ruleName"] for plugin in report["pluginReports"]
            if plugin["pluginName"] == "CloudFormation Validate" for violation in plugin["violations"]]


def test_the_cdks_builtin_validation_runs_on_the_app_and_finds_nothing(
    two_synths: Synths, tmp_path: Path
) -> None:
    """The validation the other tests leave off (tests/conftest.py): on in the app's runs, and in
    the same environment it reports a template CloudFormation would refuse."""
    for result, outdir in two_synths:
        assert result.returncode == 0, result.stderr
        assert _builtin_validation_findings(outdir) == [], (outdir / "validation-report.json").read_text()
        assert "Template validation found issues" not in result.stdout + result.stderr
    invalid = subprocess.run(
        [sys.executable, "-c", INVALID_BUCKET, str(tmp_path)], cwd=ROOT,
        env=subprocess_env(CDK_VALIDATION="true"), capture_output=True, text=True, timeout=300,
    )
    assert invalid.returncode == 0, invalid.stderr  # warnings only, as the CDK reports them by default
    assert _builtin_validation_findings(tmp_path) == ["W3030"], invalid.stdout + invalid.stderr


def test_two_synths_are_byte_identical(two_synths: Synths) -> None:
    (first, first_dir), (second, second_dir) = two_synths
    assert first.returncode == second.returncode == 0
    template = "TritonMme.template.json"
    assert (first_dir / template).read_bytes() == (second_dir / template).read_bytes()
    assert (first_dir / "TritonMme.assets.json").read_bytes() == (second_dir / "TritonMme.assets.json").read_bytes()


def test_snapshot(two_synths: Synths) -> None:
    (result, outdir), _ = two_synths
    assert result.returncode == 0, result.stderr
    current = snapshot_text((outdir / "TritonMme.template.json").read_text())
    if os.environ.get("UPDATE_SNAPSHOTS") == "1":
        SNAPSHOT.parent.mkdir(parents=True, exist_ok=True)
        SNAPSHOT.write_text(current)
    assert SNAPSHOT.exists(), f"no snapshot yet: run with UPDATE_SNAPSHOTS=1 to write {SNAPSHOT}"
    assert current == SNAPSHOT.read_text(), (
        "the template changed; review the diff and rewrite the snapshot with UPDATE_SNAPSHOTS=1"
    )


def test_the_build_image_context_holds_the_runtime_and_no_tool(two_synths: Synths) -> None:
    """The Docker context CDK stages for the build image is ``runtime_files()``: what the keys
    hash is what the image runs, and a tool edit changes no image asset (issue 9)."""
    from triton_mme_cdk.model_build.release import PACKAGE_DIR, runtime_files

    (result, outdir), _ = two_synths
    assert result.returncode == 0, result.stderr
    (context,) = [folder for folder in outdir.glob("asset.*") if (folder / "Dockerfile").is_file()]
    staged = {path.relative_to(context).as_posix() for path in context.rglob("*") if path.is_file()}
    runtime = {path.relative_to(PACKAGE_DIR).as_posix() for path in runtime_files()}
    assert staged - {".dockerignore"} == runtime
    assert not {"__main__.py", "smoke.py", "verify.py"} & staged
    assert not any(name.startswith("tools/") for name in staged)


# ---------------------------------------------------------------------------------------------
# Bad input: one message, exit status 1, no traceback
# ---------------------------------------------------------------------------------------------


def _manifest(tmp_path: Path, models: list[dict[str, object]]) -> str:
    path = tmp_path / "models.yaml"
    path.write_text(json.dumps({"version": 1, "models": models}))
    return str(path)


SYNTHETIC = {"kind": "synthetic", "architecture": "resnet"}
MODEL = {"task": "image-classification", "image": {"image_size": 32}}


#: Each bad input's expected message; the first runs as a fresh ``python app.py``, the others in one
#: process (``run_app_refusals``: jsii's node starts once, not per case).
BAD_INPUT = {
    "unknown key": "error: mme:foo: unknown setting; known settings: mme:stack_name",
    "instance type": "error: mme:instance_type: got 'ml.m5.xlarge'; a GPU multi-model endpoint runs on one of",
    "duplicate models": "models: target model name 'bert' is given twice",
    "local source": "models[0](mine).source: kind 'local' with path 'exports/mine' is a file on this machine",
}


def _bad_settings(folder: Path, case: str) -> dict[str, object]:
    if case == "unknown key":
        return {"foo": "1"}
    if case == "instance type":
        return {"instance_type": "ml.m5.xlarge"}
    folder.mkdir(parents=True, exist_ok=True)
    if case == "duplicate models":
        return {"manifest_path": _manifest(folder, [
            {**MODEL, "name": "bert", "source": SYNTHETIC}, {**MODEL, "name": "bert", "source": SYNTHETIC}])}
    return {"manifest_path": _manifest(folder, [
        {**MODEL, "name": "mine", "source": {"kind": "local", "path": "exports/mine"}}])}


@pytest.fixture(scope="module")
def bad_inputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Outcome, Path]]:
    root = tmp_path_factory.mktemp("bad-input")
    cases = {}
    for index, case in enumerate(BAD_INPUT):
        settings = _bad_settings(root / f"case{index}", case)
        cases[case] = ({f"mme:{k}": v for k, v in settings.items()}, root / f"case{index}" / "out")
    outcomes = run_app_refusals(cases, root / "_runs", fresh="unknown key")
    return {case: (outcomes[case], cases[case][1]) for case in cases}


@pytest.mark.parametrize("case", list(BAD_INPUT))
def test_bad_input_exits_1_with_one_message(bad_inputs: dict[str, tuple[Outcome, Path]], case: str) -> None:
    result, out = bad_inputs[case]
    assert result.returncode == 1, result.stderr
    assert BAD_INPUT[case] in result.stderr
    assert "Traceback" not in result.stderr and "jsii" not in result.stderr
    assert result.stderr.startswith("error: ")
    assert not (out / "TritonMme.template.json").exists()


def test_missing_manifest_file_names_the_setting(tmp_path: Path) -> None:
    with pytest.raises(cdk_app.SettingsError, match=r"mme:manifest_path: got 'nope\.yaml'; no such file"):
        cdk_app.build_app(cdk.App(context={"mme:manifest_path": "nope.yaml"}, outdir=str(tmp_path)))


def test_the_nag_plugin_is_a_synth_gate(tmp_path: Path) -> None:
    app = cdk.App(context={**cdk_app.cdk_json_context(), "mme:manifest_path": "",
                           "mme:release_id": "r-0123456789abcdef"}, outdir=str(tmp_path))
    stack = cdk_app.build_app(app)
    s3.Bucket(stack, "Insecure")  # no TLS enforcement, no access logs
    with pytest.raises(Exception, match="ValidationFailed"):
        app.synth()
    report = json.loads((tmp_path / "validation-report.json").read_text())
    rules = {v["ruleName"] for p in report["pluginReports"] for v in p["violations"]}
    assert {"AwsSolutions-S1", "AwsSolutions-S10"} <= rules


# ---------------------------------------------------------------------------------------------
# The CDK CLI pinned in package.json
# ---------------------------------------------------------------------------------------------


def _cdk(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["npx", "--no-install", "cdk", "synth", "--quiet", "--output", str(tmp_path / "cdk.out"), *args],
        cwd=ROOT, env=subprocess_env(), capture_output=True, text=True, timeout=300,
    )


def test_cdk_cli_reports_a_bad_setting_without_traceback(tmp_path: Path) -> None:
    result = _cdk(tmp_path, "-c", "mme:instance_type=ml.m5.xlarge")
    assert result.returncode != 0
    assert "error: mme:instance_type: got 'ml.m5.xlarge'; a GPU multi-model endpoint runs on one of" in result.stderr
    assert "Traceback" not in result.stderr


def test_cdk_cli_synthesizes_the_default_app(tmp_path: Path) -> None:
    result = _cdk(tmp_path, "-c", "mme:max_instance_count=2")
    assert result.returncode == 0, result.stderr
    template = json.loads((tmp_path / "cdk.out" / "TritonMme.template.json").read_text())
    targets = [r for r in template["Resources"].values() if r["Type"] == "AWS::ApplicationAutoScaling::ScalableTarget"]
    assert targets[0]["Properties"]["MaxCapacity"] == 2
