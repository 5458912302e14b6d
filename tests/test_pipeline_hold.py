"""What needs a person in the delivery pipeline itself: the self-mutation hold
(``stacks/pipeline_hold.py``) read from the synthesized pipeline and its check's own commands
(from the synthesized buildspec) run against moto's CloudFormation; and the plan step when its
read-only role cannot be assumed, or when the access stack's roles change."""

from __future__ import annotations

import copy
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import boto3
import pytest
from cdk_helpers import PIPELINE, PipelineSynth, synth_pipeline

from triton_mme_cdk.model_build.tools import pipeline_plan

PIPELINE_STACK = "TritonMmePipeline"


@pytest.fixture(scope="module")
def synthesized(tmp_path_factory: pytest.TempPathFactory) -> PipelineSynth:
    return synth_pipeline(tmp_path_factory.mktemp("hold") / "out")


def _pipeline(template: dict[str, Any]) -> dict[str, Any]:
    (pipeline,) = [r["Properties"] for r in template["Resources"].values() if r["Type"] == "AWS::CodePipeline::Pipeline"]
    return dict(pipeline)


def _stage(pipeline: dict[str, Any], name: str) -> dict[str, Any]:
    return next(stage for stage in pipeline["Stages"] if stage["Name"] == name)


def _check_spec(synthesized: PipelineSynth) -> dict[str, Any]:
    template = synthesized.templates[PIPELINE_STACK]
    (check,) = _stage(_pipeline(template), "PipelineChange")["Actions"]
    project = template["Resources"][check["Configuration"]["ProjectName"]["Ref"]]["Properties"]
    return dict(json.loads(project["Source"]["BuildSpec"]))


def test_the_hold_comes_before_self_mutation_and_runs_nothing_of_the_commit(synthesized: PipelineSynth) -> None:
    pipeline = _pipeline(synthesized.templates[PIPELINE_STACK])
    names = [stage["Name"] for stage in pipeline["Stages"]]
    assert names.index("PipelineChange") + 1 == names.index("PipelineChange-approve") == names.index("UpdatePipeline") - 1
    (check,) = _stage(pipeline, "PipelineChange")["Actions"]
    assert check["Namespace"] == "pipeline-change"
    assert [a["Name"] for a in check["InputArtifacts"]] == ["Synth_Output"]  # the cloud assembly, not the source
    spec = _check_spec(synthesized)
    assert spec["env"]["exported-variables"] == ["PIPELINE_CHANGE_APPROVAL", "PIPELINE_CHANGE"]
    commands = spec["phases"]["build"]["commands"]
    assert set(spec["phases"]) == {"build"}  # no install phase
    assert all(c.split()[0] in ("aws", "python3", "cat", "set") for c in commands), commands
    assert not any(".venv" in c or "make " in c or "model_build" in c for c in commands)
    (approve,) = _stage(pipeline, "PipelineChange-approve")["Actions"]
    assert approve["ActionTypeId"]["Provider"] == "Manual"
    assert approve["Configuration"]["NotificationArn"] == PIPELINE["approval_topic_arn"]
    assert "#{pipeline-change.PIPELINE_CHANGE}" in approve["Configuration"]["CustomData"]
    (condition,) = _stage(pipeline, "PipelineChange-approve")["BeforeEntry"]["Conditions"]
    (rule,) = condition["Rules"]
    assert condition["Result"] == "SKIP" and rule["RuleTypeId"]["Provider"] == "VariableCheck"
    assert rule["Configuration"] == {"Variable": "#{pipeline-change.PIPELINE_CHANGE_APPROVAL}", "Value": "true",
                                     "Operator": "EQ"}


def _creatable(template: dict[str, Any]) -> dict[str, Any]:
    """A template moto's CloudFormation accepts (it cannot create a pipeline's resources): every
    resource under a condition that is false, no parameters, rules or outputs. Applied to both
    sides alike, so the check compares the same resources as in the pipeline."""
    resources = {k: {**r, "Condition": "Never"} for k, r in template["Resources"].items()}
    return {"Conditions": {"Never": {"Fn::Equals": ["a", "b"]}}, "Resources": resources}


def _run_check(commands: list[str], endpoint: str, work: Path, new: dict[str, Any], deployed: dict[str, Any] | None,
               stack: str) -> str:
    """The check's commands as the buildspec has them (the stack's name made unique per case),
    in a folder holding the new pipeline template as the cloud assembly does, against a deployed
    stack in moto's CloudFormation (None: no such stack)."""
    work.mkdir()
    (work / f"{stack}.template.json").write_text(json.dumps(_creatable(new)))
    if deployed is not None:
        client = boto3.client("cloudformation", endpoint_url=endpoint, region_name="us-east-1",
                              aws_access_key_id="testing", aws_secret_access_key="testing")
        client.create_stack(StackName=stack, TemplateBody=json.dumps(_creatable(deployed)))
    lines = [c.replace(PIPELINE_STACK, stack).replace("/tmp/", f"{work}/") for c in commands]
    script = "\n".join(["set -e", *lines, 'echo "approval=$PIPELINE_CHANGE_APPROVAL change=$PIPELINE_CHANGE"'])
    env = {**os.environ, "AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
           "AWS_DEFAULT_REGION": "us-east-1"}
    done = subprocess.run(["bash", "-c", script], cwd=work, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return done.stdout.strip().splitlines()[-1]


def test_the_check_holds_a_change_of_the_pipeline_and_lets_assets_and_models_pass(
    synthesized: PipelineSynth, endpoint: str, tmp_path: Path
) -> None:
    """Run for real: the same definition passes; the prod approval removed is held and named; a
    change of the asset publishing only (what a model or code change does) passes; a deployed
    template that cannot be read is held (a person decides, never 'unchanged')."""
    commands = _check_spec(synthesized)["phases"]["build"]["commands"]
    deployed = synthesized.templates[PIPELINE_STACK]

    same = _run_check(commands, endpoint, tmp_path / "same", deployed, deployed, "HoldSame")
    assert same == "approval=false change=no change of the pipeline's own definition", same

    weaker = copy.deepcopy(deployed)
    pipeline = _pipeline(weaker)
    pipeline["Stages"][:] = [s for s in pipeline["Stages"] if s["Name"] != "prod-approve"]
    held = _run_check(commands, endpoint, tmp_path / "weaker", weaker, deployed, "HoldWeaker")
    (pipeline_id,) = [k for k, r in deployed["Resources"].items() if r["Type"] == "AWS::CodePipeline::Pipeline"]
    assert held == f"approval=true change=the pipeline's own definition changes: {pipeline_id}", held

    assets = copy.deepcopy(deployed)
    (stage,) = [s for s in _pipeline(assets)["Stages"] if s["Name"] == "Assets"]
    for action in stage["Actions"]:
        action["Configuration"]["EnvironmentVariables"] = "[]"
        project = assets["Resources"][action["Configuration"]["ProjectName"]["Ref"]]["Properties"]
        project["Source"]["BuildSpec"] = project["Source"]["BuildSpec"].replace("publish", "publish --verbose")
    passed = _run_check(commands, endpoint, tmp_path / "assets", assets, deployed, "HoldAssets")
    assert passed.startswith("approval=false"), passed

    missing = _run_check(commands, endpoint, tmp_path / "missing", deployed, None, "HoldMissing")
    assert missing.startswith("approval=true change=the deployed pipeline's template could not be read"), missing


def test_the_plan_asks_a_person_when_its_role_cannot_be_assumed(
    synthesized: PipelineSynth, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nothing is read with other credentials: no AWS call is made (none is reachable here)."""
    monkeypatch.setenv("PLAN_NO_ACCESS", "arn:aws:iam::222222222222:role/TritonMme-staging-plan-reader")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # any call would fail the test
    variables = pipeline_plan.run("TritonMme-staging", [], synthesized.outdir, tmp_path / "plan",
                                  access_stack="TritonMme-staging-pipeline-access")
    assert variables["PLAN_VERDICT"] == "security-changed" and variables["PLAN_APPROVAL"] == "true"
    assert "cannot be assumed" in (tmp_path / "plan" / "plan.md").read_text()


def test_the_plan_asks_a_person_when_the_access_stacks_roles_change(
    synthesized: PipelineSynth, endpoint: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The access stack's new template (a cloud assembly holding the synthesized one, made
    creatable for moto as in the check above) against its deployed one in moto: the same passes
    (None); one statement fewer in a reader role's policy (the deployed stack was narrower: the
    new one widens) is named; a stack that cannot be read asks."""
    for key, value in {"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                       "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(key, value)
    name = "TritonMme-staging-pipeline-access"
    new = _creatable(synthesized.templates[name])
    cdk_out = tmp_path / "cdk.out"
    cdk_out.mkdir()
    (cdk_out / "access.template.json").write_text(json.dumps(new))
    (cdk_out / "manifest.json").write_text(json.dumps({"artifacts": {"Access": {
        "type": "aws:cloudformation:stack", "properties": {"stackName": name, "templateFile": "access.template.json"}}}}))
    client = boto3.client("cloudformation")
    missing = pipeline_plan.access_change(cdk_out, name)
    assert missing is not None and missing.startswith(f"the deployed template of {name} cannot be read"), missing
    client.create_stack(StackName=name, TemplateBody=json.dumps(new))
    assert pipeline_plan.access_change(cdk_out, name) is None
    client.delete_stack(StackName=name)
    narrower = copy.deepcopy(new)
    (policy_id,) = [k for k, r in narrower["Resources"].items() if r["Type"] == "AWS::IAM::Policy" and "PlanReader" in k]
    narrower["Resources"][policy_id]["Properties"]["PolicyDocument"]["Statement"].pop()
    client.create_stack(StackName=f"{name}", TemplateBody=json.dumps(narrower))
    change = pipeline_plan.access_change(cdk_out, name)
    assert change == f"the read-only roles of {name} change: {policy_id}", change
