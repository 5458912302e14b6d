"""The gate's code as an asset of the pipeline stack (``stacks/pipeline_gate_code.py``): the zip
is the same bytes for the same files and leaves out the manifest, so a models-only change keeps it
and a code change makes a new one (which the self-mutation hold then shows a person); the plan
step's own commands (from the synthesized buildspec) fetch it from the asset's object in moto's
S3, check its digest, unpack it and find there every file ``make plan-setup`` needs; another
object at that key stops the step before anything of it runs."""

from __future__ import annotations

import json
import os
import subprocess
import zipfile
from pathlib import Path
from typing import Any

import boto3
import pytest
from cdk_helpers import ROOT, PipelineSynth, synth_pipeline

from triton_mme_cdk.stacks.pipeline_gate_code import GATE_DIR, gate_files, write_zip

PIPELINE_STACK = "TritonMmePipeline"


@pytest.fixture(scope="module")
def synthesized(tmp_path_factory: pytest.TempPathFactory) -> PipelineSynth:
    return synth_pipeline(tmp_path_factory.mktemp("gate") / "out")


def _plan_commands(synthesized: PipelineSynth) -> list[str]:
    template = synthesized.templates[PIPELINE_STACK]
    (project,) = [r["Properties"] for k, r in template["Resources"].items()
                  if r["Type"] == "AWS::CodeBuild::Project" and k.startswith("PipelinestagingplanPlanstaging")]
    commands: list[str] = json.loads(project["Source"]["BuildSpec"])["phases"]["build"]["commands"]
    return commands


def test_the_zip_is_the_same_for_the_same_code_and_leaves_the_manifest_out(tmp_path: Path) -> None:
    root = tmp_path / "checkout"
    for name in ("Makefile", "models.yaml", "cdk.json", "model_build/tools/review/pipeline_plan.py", "tests/test_x.py",
                 "model_build/__pycache__/x.pyc", "docs/notes.txt"):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(name)
    (root / "triton_mme_cdk").mkdir()
    (root / "triton_mme_cdk" / "model_build").symlink_to("../model_build")

    def digest(name: str) -> str:
        return write_zip(root, gate_files(root), tmp_path / name)

    first = digest("a.zip")
    assert digest("b.zip") == first and (tmp_path / "a.zip").read_bytes() == (tmp_path / "b.zip").read_bytes()
    with zipfile.ZipFile(tmp_path / "a.zip") as archive:
        assert archive.namelist() == ["Makefile", "model_build/tools/review/pipeline_plan.py", "triton_mme_cdk/model_build"]
    (root / "models.yaml").write_text("models: [another]")
    (root / "docs" / "notes.txt").write_text("other words")
    assert digest("c.zip") == first  # models and docs are not the gate's code
    (root / "model_build" / "tools" / "review" / "pipeline_plan.py").write_text("print('approve')")
    assert digest("d.zip") != first


def _aws_env(endpoint: str) -> dict[str, str]:
    return {**os.environ, "AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


def _fetch(commands: list[str], endpoint: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """The step's fetch, check and unpack commands (before its ``make plan-setup``), with its
    folders under ``tmp_path``."""
    fetch = [c.replace(GATE_DIR, str(tmp_path / "gate")).replace("/tmp/triton-mme-gate.zip", str(tmp_path / "gate.zip"))
             for c in commands[:3]]
    return subprocess.run(["bash", "-e", "-c", "\n".join(fetch)], cwd=tmp_path, env=_aws_env(endpoint),
                          capture_output=True, text=True, timeout=120)


def test_the_plan_step_runs_the_zip_its_definition_names(synthesized: PipelineSynth, endpoint: str,
                                                         tmp_path: Path) -> None:
    commands = _plan_commands(synthesized)
    url = commands[0].split()[-2]
    # The zip's object as the stack's asset manifest names it (what SelfMutate's cdk deploy publishes).
    assets = json.loads((synthesized.outdir / f"{PIPELINE_STACK}.assets.json").read_text())
    (entry,) = [e for e in assets["files"].values() if e["source"]["path"].endswith(".zip")]
    (destination,) = entry["destinations"].values()
    bucket, key = destination["bucketName"], destination["objectKey"]
    assert url == f"s3://{bucket}/{key}" and "111111111111" in bucket, (url, destination)
    staged = synthesized.outdir / entry["source"]["path"]
    s3: Any = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="testing",
                           aws_secret_access_key="testing")
    s3.create_bucket(Bucket=bucket)
    s3.put_object(Bucket=bucket, Key=key, Body=staged.read_bytes())

    (tmp_path / "good").mkdir()
    done = _fetch(commands, endpoint, tmp_path / "good")
    assert done.returncode == 0, done.stdout + done.stderr
    gate = tmp_path / "good" / "gate"
    for module in ("model_build/tools/review/pipeline_plan.py", "model_build/tools/review/plan_cli.py"):
        assert (gate / module).read_bytes() == (ROOT / module).read_bytes(), module
    assert (gate / "triton_mme_cdk" / "model_build").is_symlink()
    assert not (gate / "models.yaml").exists() and not (gate / "tests").exists()
    # Every file `make plan-setup` reads is there (a dry run names a missing prerequisite).
    dry = subprocess.run(["make", "-n", "-C", str(gate), "plan-setup"], capture_output=True, text=True, timeout=60)
    assert dry.returncode == 0 and "No rule to make target" not in dry.stderr, dry.stderr[-2000:]

    forged = tmp_path / "forged.zip"
    with zipfile.ZipFile(staged) as source, zipfile.ZipFile(forged, "w") as archive:
        for info in source.infolist():
            forgery = b"raise SystemExit('approved')" if info.filename == "model_build/tools/review/pipeline_plan.py" else None
            archive.writestr(info, forgery or source.read(info))
    s3.put_object(Bucket=bucket, Key=key, Body=forged.read_bytes())
    (tmp_path / "bad").mkdir()
    done = _fetch(commands, endpoint, tmp_path / "bad")
    assert done.returncode != 0 and "FAILED" in done.stdout + done.stderr, done.stdout + done.stderr
    assert not (tmp_path / "bad" / "gate").exists()  # nothing of it was unpacked
