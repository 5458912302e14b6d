"""The delivery pipeline (``mme:pipeline``), read from its synthesized stacks: the stages in order,
the plan step's commands and exported variables, the condition on each approval, the deploy and
the smoke step, the read-only roles in the targets; bad settings refused in one line; and the
plan step's own command (taken from the synthesized buildspec) run against moto's server."""

from __future__ import annotations

import copy
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from cdk_helpers import PIPELINE, ROOT, PipelineSynth, as_list, policy_of_role, synth_pipeline
from policy_eval import condition_holds

from triton_mme_cdk.stacks.pipeline_gate_code import GATE_DIR
from triton_mme_cdk.stacks.pipeline_settings import pipeline_settings
from triton_mme_cdk.stacks.settings import SettingsError

PIPELINE_STACK = "TritonMmePipeline"
PLAN_MODULE = "triton_mme_cdk.model_build.tools.review.pipeline_plan"


def _gate(tmp_path: Path, run: str) -> str:
    """``run`` with the gate's folder (:data:`GATE_DIR`) at ``tmp_path/gate``, set up as ``make
    plan-setup`` there would: this checkout's environment, whose package is this checkout's."""
    gate = tmp_path / "gate"
    gate.mkdir()
    (gate / ".venv").symlink_to(ROOT / ".venv")
    return run.replace(GATE_DIR, str(gate))


def _defendant(work: Path) -> None:
    """A commit's own model_build and triton_mme_cdk that would approve themselves: the step must
    not import them."""
    for package in ("model_build/tools/review", "triton_mme_cdk/model_build/tools/review"):
        folder = work / package
        folder.mkdir(parents=True)
        for parent in [folder, *folder.parents]:
            if parent == work:
                break
            (parent / "__init__.py").write_text("")
        (folder / "pipeline_plan.py").write_text("raise SystemExit('the commit judged itself')\n")
    (work / "model_build" / "__main__.py").write_text("raise SystemExit('the commit judged itself')\n")


@pytest.fixture(scope="module")
def synthesized(tmp_path_factory: pytest.TempPathFactory) -> PipelineSynth:
    return synth_pipeline(tmp_path_factory.mktemp("pipeline") / "out")


def _pipeline(synthesized: PipelineSynth) -> dict[str, Any]:
    template = synthesized.templates[PIPELINE_STACK]
    (pipeline,) = [r["Properties"] for r in template["Resources"].values() if r["Type"] == "AWS::CodePipeline::Pipeline"]
    return dict(pipeline)


def _buildspec(synthesized: PipelineSynth, project_ref: Any) -> dict[str, Any]:
    template = synthesized.templates[PIPELINE_STACK]
    project = template["Resources"][project_ref["Ref"]]["Properties"]
    return dict(json.loads(project["Source"]["BuildSpec"]))


def _stage(pipeline: dict[str, Any], name: str) -> dict[str, Any]:
    return next(stage for stage in pipeline["Stages"] if stage["Name"] == name)


def test_each_target_is_plan_approval_then_deploy_and_smoke_in_order(synthesized: PipelineSynth) -> None:
    """Nothing reaches a target before its plan and approval: the read-only roles of the access
    stack deploy in the gated stage, with the endpoint stack."""
    pipeline = _pipeline(synthesized)
    assert pipeline["PipelineType"] == "V2"
    names = [stage["Name"] for stage in pipeline["Stages"]]
    # The hold, then self-mutation, before any target.
    assert names[:5] == ["Source", "Build", "PipelineChange", "PipelineChange-approve", "UpdatePipeline"]
    targets = [n for n in names if n not in [*names[:5], "Assets"]]
    assert targets == ["staging-plan", "staging-approve", "staging", "prod-plan", "prod-approve", "prod"]
    source = _stage(pipeline, "Source")["Actions"][0]
    assert source["ActionTypeId"]["Provider"] == "CodeStarSourceConnection"
    assert source["Configuration"]["FullRepositoryId"] == "my-org/triton-models"
    assert source["Configuration"]["BranchName"] == "main"
    for target, account in (("staging", "222222222222"), ("prod", "333333333333")):
        actions = _stage(pipeline, target)["Actions"]
        deploys = [a for a in actions if a["ActionTypeId"]["Provider"] == "CloudFormation"]
        stacks = sorted({a["Configuration"]["StackName"] for a in deploys})
        assert stacks == [f"TritonMme-{target}", f"TritonMme-{target}-pipeline-access"], stacks
        assert all(a["Name"].endswith((".Prepare", ".Deploy")) for a in deploys)
        assert all(account in json.dumps(a["RoleArn"]) for a in deploys), "deployed with the target's bootstrap role"
        (smoke,) = [a for a in actions if a["Name"] == f"Smoke-{target}"]
        assert smoke["RunOrder"] > max(a["RunOrder"] for a in deploys), "smoke runs after the deploy"
        commands = _buildspec(synthesized, smoke["Configuration"]["ProjectName"])["phases"]["build"]["commands"]
        assert commands[-1] == (f'PYTHONSAFEPATH=1 {GATE_DIR}/.venv/bin/python -m triton_mme_cdk.model_build smoke '
                                '--endpoint "$ENDPOINT_NAME" --region "$AWS_REGION"')
        assert commands[3] == f"make -C {GATE_DIR} plan-setup"  # the gate's code, not the commit's
        assert f"arn:aws:iam::{account}:role/TritonMme-{target}-smoke-reader" in " ".join(commands)
        env = json.loads(smoke["Configuration"]["EnvironmentVariables"])
        assert [v["name"] for v in env] == ["ENDPOINT_NAME"]


def test_the_plan_step_exports_its_verdict_and_the_approval_is_entered_only_when_it_asks(
    synthesized: PipelineSynth,
) -> None:
    pipeline = _pipeline(synthesized)
    for target, account in (("staging", "222222222222"), ("prod", "333333333333")):
        (plan,) = _stage(pipeline, f"{target}-plan")["Actions"]
        assert plan["Namespace"] == f"plan-{target}"
        spec = _buildspec(synthesized, plan["Configuration"]["ProjectName"])
        assert spec["env"]["exported-variables"] == ["PLAN_VERDICT", "PLAN_APPROVAL", "PLAN_BUILD_URL"]
        assert spec["artifacts"]["base-directory"] == "plan"  # plan.md and plan.json are kept
        commands = spec["phases"]["build"]["commands"]
        assert commands[3] == f"make -C {GATE_DIR} plan-setup"  # the gate's code, not the commit's
        assert f"--role-arn arn:aws:iam::{account}:role/TritonMme-{target}-plan-reader" in commands[4]
        run = next(c for c in commands if PLAN_MODULE in c)
        assert shlex.split(run)[:4] == ["PYTHONSAFEPATH=1", f"{GATE_DIR}/.venv/bin/python", "-m", PLAN_MODULE]
        assert shlex.split(run)[4] == f"TritonMme-{target}"
        assert f"-c mme:stack_name=TritonMme-{target}" in run
        assert commands[-1] == "set -a; . plan/verdict.env; set +a"
        (approve,) = _stage(pipeline, f"{target}-approve")["Actions"]
        assert approve["ActionTypeId"]["Provider"] == "Manual"
        assert approve["Configuration"]["NotificationArn"] == PIPELINE["approval_topic_arn"]
        assert f"#{{plan-{target}.PLAN_VERDICT}}" in approve["Configuration"]["CustomData"]
        assert approve["Configuration"]["ExternalEntityLink"] == f"#{{plan-{target}.PLAN_BUILD_URL}}"
        (condition,) = _stage(pipeline, f"{target}-approve")["BeforeEntry"]["Conditions"]
        (rule,) = condition["Rules"]
        assert condition["Result"] == "SKIP"
        assert rule["RuleTypeId"] == {"Category": "Rule", "Owner": "AWS", "Provider": "VariableCheck", "Version": "1"}
        assert rule["Configuration"] == {"Variable": f"#{{plan-{target}.PLAN_APPROVAL}}", "Value": "true",
                                         "Operator": "EQ"}
    # The staging plan carries the stage's own settings.
    (plan,) = _stage(pipeline, "staging-plan")["Actions"]
    run = _buildspec(synthesized, plan["Configuration"]["ProjectName"])["phases"]["build"]["commands"]
    assert "-c mme:instance_type=ml.g4dn.xlarge -c mme:max_instance_count=1" in " ".join(run)


def test_the_steps_roles_only_assume_the_targets_read_only_roles(synthesized: PipelineSynth) -> None:
    template = synthesized.templates[PIPELINE_STACK]
    for kind in ("plan", "smoke"):
        (role_id,) = [k for k, v in template["Resources"].items() if v["Type"] == "AWS::IAM::Role"
                      and v["Properties"].get("RoleName") == f"TritonMme-pipeline-{kind}"]
        assumes = [s for s in policy_of_role(template, role_id) if "sts:AssumeRole" in as_list(s["Action"])]
        (statement,) = assumes
        targets = [json.dumps(r) for r in as_list(statement["Resource"])]
        assert len(targets) == 2, targets
        for (account, target), resource in zip((("222222222222", "staging"), ("333333333333", "prod")), targets,
                                               strict=True):
            assert f":iam::{account}:role/TritonMme-{target}-{kind}-reader" in resource, resource
        others = [a for s in policy_of_role(template, role_id) for a in as_list(s["Action"])
                  if a.startswith(("sagemaker:", "cloudformation:", "iam:"))]
        assert others == [], others  # its own account: only CodeBuild's logs, reports and the artifacts
    for target in ("staging", "prod"):
        access = synthesized.templates[f"TritonMme-{target}-pipeline-access"]
        roles = {v["Properties"]["RoleName"]: (k, v["Properties"]) for k, v in access["Resources"].items()
                 if v["Type"] == "AWS::IAM::Role"}
        assert set(roles) == {f"TritonMme-{target}-plan-reader", f"TritonMme-{target}-smoke-reader"}
        expected = {
            "plan": {"cloudformation:DescribeStacks", "cloudformation:GetTemplate", "s3:GetObject", "kms:Decrypt"},
            "smoke": {"sagemaker:DescribeEndpoint", "sagemaker:InvokeEndpoint", "sagemaker:DescribeEndpointConfig",
                      "sagemaker:DescribeModel", "s3:GetObject", "s3:ListBucket", "kms:Decrypt"},
        }
        for kind in ("plan", "smoke"):
            logical_id, role = roles[f"TritonMme-{target}-{kind}-reader"]
            (trust,) = role["AssumeRolePolicyDocument"]["Statement"]
            assert json.dumps(trust["Principal"]).count(f":iam::111111111111:role/TritonMme-pipeline-{kind}") == 1
            actions = {a for s in policy_of_role(access, logical_id) for a in as_list(s["Action"])}
            assert actions == expected[kind], actions  # read-only: no Put, Delete, Create or Update
            for statement in policy_of_role(access, logical_id):
                if any(a.startswith("s3:") for a in as_list(statement["Action"])):
                    assert statement["Condition"]["StringEquals"]["aws:ResourceAccount"] == {"Ref": "AWS::AccountId"}


def test_every_codebuild_role_of_the_pipeline_trusts_only_this_accounts_projects(synthesized: PipelineSynth) -> None:
    """CDK Pipelines' synth, self-mutation and asset roles, the hold's check role and the plan and
    smoke roles: each trusts CodeBuild only with aws:SourceAccount and an aws:SourceArn of this
    account's projects. Evaluated: a project of the pipeline's account and region is let in; one
    of another account, another region or another service is not, nor a request without the keys."""
    template = synthesized.templates[PIPELINE_STACK]
    trusting = {logical_id: statement for logical_id, resource in template["Resources"].items()
                if resource["Type"] == "AWS::IAM::Role"
                for statement in resource["Properties"]["AssumeRolePolicyDocument"]["Statement"]
                if statement["Principal"] == {"Service": "codebuild.amazonaws.com"}}
    kinds = {prefix for prefix in ("PipelineBuildSynth", "PipelineUpdatePipelineSelfMutation", "PipelineAssetsFile",
                                   "PlanRole", "SmokeRole", "PipelineChangeCheck") if any(k.startswith(prefix) for k in trusting)}
    assert len(kinds) == 6 and len(trusting) >= 6, sorted(trusting)

    def admitted(request: dict[str, str], statement: dict[str, Any]) -> bool:
        return all(condition_holds(operator, key, values, request)
                   for operator, block in statement.get("Condition", {}).items() for key, values in block.items())

    own = {"aws:SourceAccount": "111111111111",
           "aws:SourceArn": "arn:aws:codebuild:us-east-1:111111111111:project/PipelineBuildSynthCdkBuildProject-abc"}
    others = [
        {**own, "aws:SourceAccount": "999999999999",
         "aws:SourceArn": "arn:aws:codebuild:us-east-1:999999999999:project/theirs"},
        {**own, "aws:SourceArn": "arn:aws:codebuild:eu-west-1:111111111111:project/elsewhere"},
        {**own, "aws:SourceArn": "arn:aws:sagemaker:us-east-1:111111111111:processing-job/x"},
        {},
    ]
    for logical_id, statement in trusting.items():
        assert statement["Action"] == "sts:AssumeRole", logical_id
        assert admitted(own, statement), logical_id
        assert not any(admitted(request, statement) for request in others), (logical_id, statement.get("Condition"))


def test_cdk_nag_passes_on_every_stack_of_the_pipeline(synthesized: PipelineSynth) -> None:
    report = json.loads((synthesized.outdir / "validation-report.json").read_text())
    assert report["pluginReports"] == []


def test_the_endpoint_stack_alone_stays_the_default(synthesized: PipelineSynth) -> None:
    """With a pipeline the app still holds the endpoint stack as before (cdk deploy TritonMme)."""
    assert "TritonMme" in synthesized.templates
    stage = synthesized.templates["TritonMme-staging"]
    (config,) = [r["Properties"] for r in stage["Resources"].values() if r["Type"] == "AWS::SageMaker::EndpointConfig"]
    assert config["ProductionVariants"][0]["InstanceType"] == "ml.g4dn.xlarge"  # the stage's override


@pytest.mark.parametrize(("change", "message"), [
    (lambda p: p["stages"][1].pop("account"), "mme:pipeline.stages[1].account: Field required"),
    (lambda p: p["stages"][1].update(name="staging"), "mme:pipeline.stages: the name 'staging' is given twice"),
    (lambda p: p["source"].update(kind="svn"), "mme:pipeline.source.kind: got 'svn'; Input should be 'codestar' or 'codecommit'"),
    (lambda p: p["source"].update(connection_arn="arn:aws:iam::111111111111:role/x"),
     "mme:pipeline.source.connection_arn: got 'arn:aws:iam::111111111111:role/x'; String should match pattern"),
    (lambda p: p["stages"][0].update(region="mars-1"), "mme:pipeline.stages[0].region: got 'mars-1'"),
    (lambda p: p["stages"][1].update(require_approval="sometimes"),
     "mme:pipeline.stages[1].require_approval: got 'sometimes'; Input should be 'when-needed' or 'always'"),
])
def test_bad_pipeline_settings_are_one_line_naming_the_setting(change: Any, message: str) -> None:
    broken = copy.deepcopy(PIPELINE)
    change(broken)
    with pytest.raises(SettingsError) as caught:
        pipeline_settings(broken)
    text = str(caught.value)
    assert text.startswith(message) and "\n" not in text, text


def test_a_stage_setting_and_a_shared_endpoint_are_refused_at_synth(tmp_path: Path) -> None:
    broken = copy.deepcopy(PIPELINE)
    broken["stages"][0]["settings"] = {"instance_type": "ml.t2.medium"}
    with pytest.raises(SettingsError, match=r"^mme:pipeline\.stages\[0\]\.settings: mme:instance_type"):
        synth_pipeline(tmp_path / "a", broken)
    same = copy.deepcopy(PIPELINE)
    same["stages"][1]["account"] = same["stages"][0]["account"]
    with pytest.raises(SettingsError, match=r"'staging' and 'prod' deploy endpoint .* to the same account 222222222222"):
        synth_pipeline(tmp_path / "b", same)


def test_the_plan_steps_command_runs_and_exports_what_the_condition_reads(
    synthesized: PipelineSynth, endpoint: str, tmp_path: Path
) -> None:
    """The plan action's own command from the synthesized buildspec (the credential lines aside:
    CodeBuild's role switch), run against moto's server: a stage whose stack does not exist yet
    is a first deploy: it creates every role, policy and key of the stack, which plan judges as
    access widened (security changed, exit 4), so the approval is entered."""
    pipeline = _pipeline(synthesized)
    (plan,) = _stage(pipeline, "staging-plan")["Actions"]
    commands = _buildspec(synthesized, plan["Configuration"]["ProjectName"])["phases"]["build"]["commands"]
    run = _gate(tmp_path, next(c for c in commands if PLAN_MODULE in c))
    work = tmp_path / "src"
    work.mkdir()
    (work / "cdk.out").symlink_to(synthesized.outdir)
    _defendant(work)
    env = {**os.environ, "AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
           "AWS_DEFAULT_REGION": "us-east-1", "AWS_REGION": "us-east-1",
           "CODEBUILD_BUILD_URL": "https://console.aws.amazon.com/codesuite/codebuild/builds/plan-staging:1"}
    script = "\n".join(["set -e", run, commands[-1], 'echo "verdict=$PLAN_VERDICT approval=$PLAN_APPROVAL url=$PLAN_BUILD_URL"'])
    done = subprocess.run(["bash", "-c", script], cwd=work, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == (
        "verdict=security-changed approval=true url=https://console.aws.amazon.com/codesuite/codebuild/builds/plan-staging:1")
    assert json.loads((work / "plan" / "plan.json").read_text())["verdict"] == "security-changed"
    assert "first deploy" in (work / "plan" / "plan.md").read_text()


def test_the_plan_step_plans_an_existing_stack_against_its_live_routes(
    synthesized: PipelineSynth, endpoint: str, tmp_path: Path
) -> None:
    """A stage whose stack exists: its bucket from the stack's output, the routes read there, the
    deployed template from CloudFormation; what is exported is the verdict plan.json holds."""
    import boto3

    pipeline = _pipeline(synthesized)
    (plan,) = _stage(pipeline, "prod-plan")["Actions"]
    commands = _buildspec(synthesized, plan["Configuration"]["ProjectName"])["phases"]["build"]["commands"]
    run = _gate(tmp_path, next(c for c in commands if PLAN_MODULE in c))
    clients = {"endpoint_url": endpoint, "region_name": "us-east-1", "aws_access_key_id": "testing",
               "aws_secret_access_key": "testing"}
    deployed = {"Resources": {"Bucket": {"Type": "AWS::S3::Bucket"}},
                "Outputs": {"ModelBucketName": {"Value": {"Ref": "Bucket"}}}}
    boto3.client("cloudformation", **clients).create_stack(StackName="TritonMme-prod", TemplateBody=json.dumps(deployed))
    work = tmp_path / "src"
    work.mkdir()
    (work / "cdk.out").symlink_to(synthesized.outdir)
    # The source the step runs in: the app's cdk.json (plan's settings) and the manifest it names.
    for name in ("cdk.json", "models.yaml"):
        (work / name).symlink_to(ROOT / name)
    _defendant(work)
    env = {**os.environ, "AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
           "AWS_DEFAULT_REGION": "us-east-1", "AWS_REGION": "us-east-1"}
    script = "\n".join(["set -e", run, commands[-1], 'echo "verdict=$PLAN_VERDICT approval=$PLAN_APPROVAL"'])
    done = subprocess.run(["bash", "-c", script], cwd=work, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    report = json.loads((work / "plan" / "plan.json").read_text())
    assert report["stack"] == "TritonMme-prod" and report["compared_with"]["deployed"].startswith("the template of stack")
    approval = "true" if report["exit_code"] == 4 else "false"  # plan's exit 4: a person should look
    assert done.stdout.strip().splitlines()[-1] == f"verdict={report['verdict']} approval={approval}"
    # The deployed stack's one bucket is not in the stage's template: deleting it puts data at
    # risk, so the approval is entered.
    assert report["verdict"] == "data-at-risk" and approval == "true", report["summary"]
    assert "Bucket deleted" in report["summary"]


def test_a_codecommit_source_and_one_stage_without_approval_topic(tmp_path: Path) -> None:
    single = copy.deepcopy(PIPELINE)
    single.pop("approval_topic_arn")
    single["source"] = {"kind": "codecommit", "repository": "triton-models", "branch": "release"}
    single["stages"] = single["stages"][1:]
    synthesized = synth_pipeline(tmp_path / "out", single)
    pipeline = _pipeline(synthesized)
    source = _stage(pipeline, "Source")["Actions"][0]
    assert source["ActionTypeId"]["Provider"] == "CodeCommit"
    assert (source["Configuration"]["RepositoryName"], source["Configuration"]["BranchName"]) == ("triton-models", "release")
    (approve,) = _stage(pipeline, "prod-approve")["Actions"]
    assert "NotificationArn" not in approve["Configuration"]
    assert json.loads((synthesized.outdir / "validation-report.json").read_text())["pluginReports"] == []


def test_a_stage_that_requires_approval_always_says_so_in_its_plan_command(synthesized: PipelineSynth) -> None:
    """docs/pipeline.example.json's prod has ``require_approval: always``; staging the default."""
    pipeline = _pipeline(synthesized)
    for stage, flag in (("staging", False), ("prod", True)):
        (plan,) = _stage(pipeline, f"{stage}-plan")["Actions"]
        commands = _buildspec(synthesized, plan["Configuration"]["ProjectName"])["phases"]["build"]["commands"]
        run = next(c for c in commands if PLAN_MODULE in c)
        assert run.endswith(" --require-approval always") is flag, run


def test_the_approval_condition_asks_a_person_for_a_security_change_that_widens(
    synthesized: PipelineSynth, endpoint: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``PLAN_APPROVAL`` from real plans of the staging stage's synthesized template (the real diff
    engine): a statement added to the execution role's policy widens access (exit 4: asked); its
    reverse narrows only (exit 3: skipped); ``require_approval: always`` asks for both, and for a
    plan with no security change at all."""
    from triton_mme_cdk.model_build.__main__ import main
    from triton_mme_cdk.model_build.aws_clients import make_s3_client
    from triton_mme_cdk.model_build.tools.review.pipeline_plan import needs_approval

    make_s3_client(endpoint_url=endpoint).create_bucket(Bucket="pipeline-security")
    deployed = synthesized.templates["TritonMme-staging"]
    wider = copy.deepcopy(deployed)
    (policy,) = [r for lid, r in wider["Resources"].items() if lid.startswith("ExecutionRoleDefaultPolicy")]
    bucket = next(lid for lid in wider["Resources"] if lid.startswith("ModelBucket2"))
    policy["Properties"]["PolicyDocument"]["Statement"].append({"Action": "s3:PutObject", "Effect": "Allow", "Resource": {
        "Fn::Join": ["", [{"Fn::GetAtt": [bucket, "Arn"]}, "/*"]]}})

    def plan(old: dict[str, Any], new: dict[str, Any], name: str) -> dict[str, Any]:
        (tmp_path / f"{name}-old.json").write_text(json.dumps(old))
        (tmp_path / f"{name}-new.json").write_text(json.dumps(new))
        code = main(["plan", "--format", "json", "--detailed-exitcode", "--bucket", "pipeline-security",
                     "--endpoint-url", endpoint, "--manifest", str(ROOT / "models.yaml"),
                     "--template", str(tmp_path / f"{name}-new.json"),
                     "--deployed-template", str(tmp_path / f"{name}-old.json")])
        report: dict[str, Any] = json.loads(capsys.readouterr().out)
        assert report["exit_code"] == code
        return report

    widened, narrowed, same = plan(deployed, wider, "wider"), plan(wider, deployed, "narrower"), plan(
        deployed, deployed, "same")
    assert (widened["verdict"], widened["exit_code"], needs_approval(widened)) == ("security-changed", 4, True)
    assert (narrowed["verdict"], narrowed["exit_code"], needs_approval(narrowed)) == ("security-changed", 3, False)
    assert (same["verdict"], same["exit_code"], needs_approval(same)) == ("models-only", 3, False)
    assert all(needs_approval(report, "always") for report in (widened, narrowed, same))
    assert needs_approval({"verdict": "a-verdict-of-a-newer-plan", "exit_code": 3}), "an unknown verdict asks"


def test_the_pipelines_clis_are_pinned(synthesized: PipelineSynth) -> None:
    """SelfMutate installs the CDK CLI this repository's package-lock.json locks (the one the synth
    runs), the asset projects the cdk-assets the pipeline's definition names: every ``npm install``
    of every buildspec of the pipeline names an exact version, none ``@latest`` or a major only."""
    from triton_mme_cdk.stacks.pipeline_stack import CDK_ASSETS_VERSION

    locked = json.loads((ROOT / "package-lock.json").read_text())["packages"]["node_modules/aws-cdk"]["version"]
    assert locked == json.loads((ROOT / "package.json").read_text())["devDependencies"]["aws-cdk"]
    installs: dict[str, set[str]] = {}
    template = synthesized.templates[PIPELINE_STACK]
    for resource in template["Resources"].values():
        if resource["Type"] != "AWS::CodeBuild::Project":
            continue
        spec = json.loads(resource["Properties"]["Source"]["BuildSpec"])
        for phase in spec["phases"].values():
            for command in phase["commands"]:
                if command.startswith("npm install"):
                    *_, package = command.split()
                    name, _, version = package.rpartition("@")
                    installs.setdefault(name, set()).add(version)
    assert installs == {"aws-cdk": {locked}, "cdk-assets": {CDK_ASSETS_VERSION}}, installs
    assert all(re.fullmatch(r"\d+\.\d+\.\d+", v) for versions in installs.values() for v in versions)


def test_the_pipeline_passes_the_cdks_own_template_validation(tmp_path: Path) -> None:
    """The suite turns the CDK's built-in validation off (tests/conftest.py); a user's synth has it
    on. The pipeline's buildspecs hold no CloudFormation placeholder outside an ``Fn::Sub`` (the
    hold's check names the bootstrap roles with their ``${AWS::Partition}`` written in JSON
    escapes; with them written as they are, this test fails on cfn-lint's E1029). A new process:
    the CDK's runtime reads ``CDK_VALIDATION`` when it starts."""
    script = ("import sys; from pathlib import Path; from cdk_helpers import synth_pipeline; "
              "synth_pipeline(Path(sys.argv[1]))")
    env = {**os.environ, "CDK_VALIDATION": "true", "PYTHONPATH": str(ROOT / "tests")}
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path / "out")], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    report = json.loads((tmp_path / "out" / "validation-report.json").read_text())
    violations = [v for p in report.get("pluginReports", []) for v in p.get("violations", [])]
    assert done.returncode == 0 and violations == [], (violations, done.stderr[-2000:])
