"""The scoped CloudFormation execution policies and the permissions boundary of ``bootstrap/``
(docs/pipelines.md, "Bootstrapping the accounts"), checked against every synthesized template.

What a resource needs is read from CloudFormation's resource-provider schemas, which cfn-lint
bundles (``cfnlint/data/schemas/resources/*.json``: ``typeName`` and
``handlers.{create,update,delete}.permissions``). For every resource of every template (each
settings variant of ``VARIANTS``, the example pipeline's stacks and its CodeCommit variant, all
synthesized with the boundary setting on), each handler permission must be allowed by the
policy of the account it is deployed to: ``execution-policy.json`` for the endpoint and access
stacks, ``pipeline-execution-policy.json`` for the pipeline's stack. A handler permission may be
left out only where ``NOT_NEEDED`` names the property that makes the handler call it and every
resource of that type lacks it (checked here).

What the check does not model: resource ARNs and conditions of Allow statements (an action is
covered when an Allow statement names it; where a statement is conditioned on the boundary, the
test checks every role carries that boundary); SCPs; and calls a handler makes that its schema
does not list (the schemas are AWS's own record; ``BEYOND_HANDLERS`` adds those we know of, with
their source).
"""

from __future__ import annotations

import copy
import fnmatch
import json
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest
from cdk_helpers import PIPELINE, ROOT, VARIANTS, as_list, synth, synth_pipeline
from policy_eval import decide_bounded

SCHEMAS = ROOT / ".venv" / "lib" / "python3.11" / "site-packages" / "cfnlint" / "data" / "schemas" / "resources"
BOOTSTRAP = ROOT / "bootstrap"
BOUNDARY_NAME = "triton-mme-boundary"
BOUNDARY_CONTEXT = {"@aws-cdk/core:permissionsBoundary": {"name": BOUNDARY_NAME}}
PIPELINE_STACK = "TritonMmePipeline"
#: IAM's quota for a customer managed policy: 6,144 characters, whitespace not counted
#: (docs.aws.amazon.com/IAM/latest/UserGuide/reference_iam-quotas.html).
MANAGED_POLICY_CHARS = 6144

#: Handler permissions a handler calls only for a property these templates never set: type ->
#: (action patterns, the property, why). The test checks no resource of the type has it.
NOT_NEEDED: dict[str, list[tuple[tuple[str, ...], str, str]]] = {
    "AWS::IAM::Policy": [(("iam:*UserPolicy", "iam:*GroupPolicy"), "Users", "attached to roles only"),
                         (("iam:*UserPolicy", "iam:*GroupPolicy"), "Groups", "attached to roles only")],
    "AWS::IAM::Role": [(("iam:DeleteRolePermissionsBoundary",), "!PermissionsBoundary",
                        "called when a template removes a role's boundary; every role carries it, and the "
                        "policy denies it")],
    "AWS::S3::Bucket": [(("s3tables:*", "s3:*BucketMetadata*"), "MetadataTableConfiguration", "no S3 metadata tables"),
                        (("s3tables:*", "s3:*BucketMetadata*"), "MetadataConfiguration", "no S3 metadata tables")],
    "AWS::EC2::VPCEndpoint": [(("vpc-lattice:*",), "ServiceNetworkArn", "no VPC Lattice service network"),
                              (("vpce:AllowMultiRegion",), "ServiceRegion", "endpoints of the stack's own region")],
    "AWS::Lambda::Function": [(("elasticfilesystem:*", "s3files:*"), "FileSystemConfigs", "no file system mounted"),
                              (("lambda:PassCapacityProvider",), "CapacityProviderConfig", "no capacity provider")],
    "AWS::Logs::LogGroup": [(("s3:REST.PUT.OBJECT",), "", "not an IAM action (an S3 access-log operation name)")],
}
#: Types whose schema lists no handlers (not registry types): what CloudFormation calls, from
#: the service's API reference.
WITHOUT_HANDLERS: dict[str, tuple[str, ...]] = {
    "AWS::CodeBuild::Project": ("codebuild:CreateProject", "codebuild:UpdateProject", "codebuild:DeleteProject",
                                "codebuild:BatchGetProjects", "iam:PassRole"),
}
#: What a deploy needs besides the handlers, with where it is documented.
BEYOND_HANDLERS: dict[str, tuple[str, str]] = {
    # The CDK's BootstrapVersion parameter: an SSM parameter type CloudFormation resolves with the
    # execution role (CloudFormation user guide, "SSM parameter types").
    "ssm:GetParameters": ("*", "the BootstrapVersion parameter"),
    # A Lambda function from a container image: the creator pulls it (Lambda developer guide,
    # "Amazon ECR permissions"); only the endpoint stack's build functions are images.
    "ecr:BatchGetImage": ("AWS::Lambda::Function", "a function from a container image"),
    "ecr:GetDownloadUrlForLayer": ("AWS::Lambda::Function", "a function from a container image"),
}
#: Custom resources: CloudFormation invokes the provider's function with the execution role.
CUSTOM_RESOURCE_ACTIONS = ("lambda:InvokeFunction",)
#: Types that need no permission at all.
FREE_TYPES = ("AWS::CDK::Metadata",)


# -----------------------------------------------------------------------------------------------
# IAM action matching
# -----------------------------------------------------------------------------------------------

def matches(pattern: str, action: str) -> bool:
    """IAM's action match: case-insensitive, ``*`` any run of characters, ``?`` one. An action that
    is itself a pattern (``s3:GetObject*`` in a role's policy) is covered when the pattern matches
    its text, its ``*`` included."""
    return fnmatch.fnmatchcase(action.lower(), pattern.lower().replace("[", "[[]"))


def allows(document: dict[str, Any], action: str) -> bool:
    """An Allow statement names it (Action, not NotAction) and no unconditioned Deny names it."""
    allowed = denied = False
    for statement in document["Statement"]:
        named = any(matches(p, action) for p in as_list(statement.get("Action", [])))
        if statement["Effect"] == "Allow" and named:
            allowed = True
        if statement["Effect"] == "Deny" and named and "Condition" not in statement:
            denied = True
    return allowed and not denied


def load(name: str) -> dict[str, Any]:
    return dict(json.loads((BOOTSTRAP / name).read_text(encoding="utf-8")))


def schemas() -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = {}
    for path in SCHEMAS.glob("*.json"):
        schema = json.loads(path.read_text(encoding="utf-8"))
        found[schema["typeName"]] = schema
    assert len(found) > 1000, f"cfn-lint's resource schemas are missing from {SCHEMAS}"
    return found


def _not_needed(type_: str, action: str, resources: list[dict[str, Any]]) -> str | None:
    for patterns, prop, reason in NOT_NEEDED.get(type_, []):
        if not any(matches(p, action) for p in patterns):
            continue
        if prop.startswith("!"):  # needed only where a resource lacks the property
            if all(prop[1:] in r.get("Properties", {}) for r in resources):
                return reason
        elif not prop or all(prop not in r.get("Properties", {}) for r in resources):
            return reason
    return None


def needed(templates: Iterable[dict[str, Any]], types: dict[str, dict[str, Any]]) -> dict[str, set[str]]:
    """Every action a deploy of these templates needs -> the resource types that need it."""
    by_type: dict[str, list[dict[str, Any]]] = {}
    for template in templates:
        for resource in template["Resources"].values():
            by_type.setdefault(resource["Type"], []).append(resource)
    found: dict[str, set[str]] = {}
    for type_, resources in by_type.items():
        if type_ in FREE_TYPES:
            continue
        if type_.startswith("Custom::") or type_ == "AWS::CloudFormation::CustomResource":
            actions: set[str] = set(CUSTOM_RESOURCE_ACTIONS)
        elif type_ in WITHOUT_HANDLERS:
            actions = set(WITHOUT_HANDLERS[type_])
        else:
            assert type_ in types, f"{type_}: no resource schema in cfn-lint and no entry in WITHOUT_HANDLERS"
            handlers = types[type_].get("handlers", {})
            assert handlers, f"{type_}: its schema lists no handlers; add it to WITHOUT_HANDLERS with its source"
            actions = {a for h in ("create", "update", "delete") for a in handlers.get(h, {}).get("permissions", [])}
            actions = {a for a in actions if _not_needed(type_, a, resources) is None}
        for action in actions:
            found.setdefault(action, set()).add(type_)
    for action, (type_, _why) in BEYOND_HANDLERS.items():
        if type_ == "*" or type_ in by_type:
            found.setdefault(action, set()).add(type_)
    return found


def role_actions(template: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(role or policy logical id, action) of every Allow the template grants its roles; the
    AWS managed policy CDK attaches is expanded (its document, as AWS publishes it)."""
    managed = {"AWSLambdaBasicExecutionRole": ("logs:CreateLogGroup", "logs:CreateLogStream", "logs:PutLogEvents")}
    for logical_id, resource in template["Resources"].items():
        properties = resource.get("Properties", {})
        documents = []
        if resource["Type"] == "AWS::IAM::Policy":
            documents.append(properties["PolicyDocument"])
        if resource["Type"] == "AWS::IAM::Role":
            documents.extend(p["PolicyDocument"] for p in properties.get("Policies", []))
            for arn in properties.get("ManagedPolicyArns", []):
                name = json.dumps(arn).rsplit("/", 1)[-1].rstrip('"]}')
                assert name in managed, f"{logical_id}: managed policy {arn} is not known to this test"
                yield from ((logical_id, a) for a in managed[name])
        for document in documents:
            for statement in document["Statement"]:
                if statement["Effect"] == "Allow":
                    yield from ((logical_id, a) for a in as_list(statement["Action"]))


# -----------------------------------------------------------------------------------------------
# The templates, as an app with the boundary setting synthesizes them
# -----------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def templates(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    folder = tmp_path_factory.mktemp("execution-policy")
    found: dict[str, dict[str, Any]] = {}
    for name, settings in VARIANTS.items():
        settings = dict(settings)
        extra = {**settings.pop("extra_context", {}), **BOUNDARY_CONTEXT}
        found[name] = synth(folder / name, nag=False, extra_context=extra, **settings).data
    codecommit = copy.deepcopy(PIPELINE)
    codecommit["source"] = {"kind": "codecommit", "repository": "triton-models", "branch": "release"}
    for label, pipeline in (("pipeline", PIPELINE), ("pipeline-codecommit", codecommit)):
        synthesized = synth_pipeline(folder / label, pipeline, extra_context=BOUNDARY_CONTEXT)
        for stack, template in synthesized.templates.items():
            found[f"{label}:{stack}"] = template
    return found


def _pipeline_stacks(templates: dict[str, dict[str, Any]]) -> list[str]:
    return [name for name in templates if name.endswith(f":{PIPELINE_STACK}")]


def _by_policy(templates: dict[str, dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    pipelines = _pipeline_stacks(templates)
    return {"execution-policy.json": [t for n, t in templates.items() if n not in pipelines],
            "pipeline-execution-policy.json": [templates[n] for n in pipelines]}


def test_with_the_setting_every_role_of_every_stack_carries_the_boundary(templates: dict[str, dict[str, Any]]) -> None:
    assert {"default", "isolated", "pipeline:TritonMmePipeline", "pipeline:TritonMme-prod-pipeline-access",
            "pipeline-codecommit:TritonMmePipeline"} <= set(templates)
    roles = 0
    for name, template in templates.items():
        for logical_id, resource in template["Resources"].items():
            if resource["Type"] == "AWS::IAM::Role":
                roles += 1
                boundary = json.dumps(resource["Properties"].get("PermissionsBoundary"))
                assert f":policy/{BOUNDARY_NAME}" in boundary, f"{name} {logical_id}: {boundary}"
    assert roles > 40


def test_without_the_setting_no_role_carries_one(tmp_path: Path) -> None:
    data = synth(tmp_path / "plain", nag=False, **VARIANTS["published"]).data
    roles = [r for r in data["Resources"].values() if r["Type"] == "AWS::IAM::Role"]
    assert roles and all("PermissionsBoundary" not in r["Properties"] for r in roles)


@pytest.mark.parametrize("policy", ["execution-policy.json", "pipeline-execution-policy.json"])
def test_the_execution_policy_allows_every_action_the_templates_need(
    templates: dict[str, dict[str, Any]], policy: str
) -> None:
    document = load(policy)
    need = needed(_by_policy(templates)[policy], schemas())
    missing = sorted(f"{action} ({', '.join(sorted(types))})" for action, types in need.items()
                     if not allows(document, action))
    assert missing == [], f"{policy} lacks: {missing}"


@pytest.mark.parametrize("policy", ["execution-policy.json", "pipeline-execution-policy.json"])
def test_every_action_the_execution_policy_names_is_needed(templates: dict[str, dict[str, Any]], policy: str) -> None:
    """Not broader than the templates: each pattern of an Allow matches an action they need."""
    document = load(policy)
    need = needed(_by_policy(templates)[policy], schemas())
    unused = [p for s in document["Statement"] if s["Effect"] == "Allow" for p in as_list(s["Action"])
              if not any(matches(p, action) for action in need)]
    assert unused == [], f"{policy} allows what no template needs: {unused}"


@pytest.mark.parametrize("policy", ["execution-policy.json", "pipeline-execution-policy.json"])
def test_the_execution_policy_cannot_leave_the_boundary(policy: str) -> None:
    document = load(policy)
    text = re.sub(r"\s", "", (BOOTSTRAP / policy).read_text(encoding="utf-8"))
    assert len(text) <= MANAGED_POLICY_CHARS, f"{policy}: {len(text)} characters, over IAM's {MANAGED_POLICY_CHARS}"
    boundary = f"arn:aws:iam::${{aws:PrincipalAccount}}:policy/{BOUNDARY_NAME}"
    for statement in document["Statement"]:
        actions = as_list(statement["Action"])
        assert "NotAction" not in statement and "NotResource" not in statement
        assert all(a != "*" and not a.endswith(":*") for a in actions), actions  # no service-wide grant
        if statement["Effect"] != "Allow":
            continue
        iam_actions = [a for a in actions if a.lower().startswith("iam:")]
        writes = [a for a in iam_actions if re.match(r"iam:(CreateRole|PutRole|AttachRole|DetachRole|DeleteRolePolicy)", a)]
        if writes:  # a role is created, or its policies changed, only with the boundary on it
            assert statement["Condition"] == {"ArnEquals": {"iam:PermissionsBoundary": boundary}}, statement
        if iam_actions:
            resources = as_list(statement["Resource"])
            assert all(re.match(r"^arn:aws:iam::\*:role/(TritonMme\*|aws-service-role/\*)$", r) for r in resources), resources
        if "iam:PassRole" in actions:
            services = statement["Condition"]["StringEquals"]["iam:PassedToService"]
            assert services and all(s.endswith(".amazonaws.com") for s in services)
    for action in ("iam:DeleteRolePermissionsBoundary", "iam:CreatePolicyVersion", "iam:SetDefaultPolicyVersion",
                   "iam:CreateUser", "iam:CreateAccessKey", "iam:UpdateAssumeRolePolicy"):
        statements = [s for s in document["Statement"] if any(matches(p, action) for p in as_list(s["Action"]))]
        if action == "iam:UpdateAssumeRolePolicy":  # the stack's own roles only
            assert all(s["Resource"] == "arn:aws:iam::*:role/TritonMme*" for s in statements), statements
        else:
            assert not allows(document, action), f"{policy} allows {action}"


def test_what_a_handler_calls_only_for_a_property_no_template_sets(templates: dict[str, dict[str, Any]]) -> None:
    """``NOT_NEEDED`` holds for these templates: the property is absent from every resource of its
    type (or, for the boundary, present on every role), and the entry matches some handler permission."""
    types = schemas()
    by_type: dict[str, list[dict[str, Any]]] = {}
    for template in templates.values():
        for resource in template["Resources"].values():
            by_type.setdefault(resource["Type"], []).append(resource)
    for type_, entries in NOT_NEEDED.items():
        handlers = types[type_]["handlers"]
        permissions = {a for h in ("create", "update", "delete") for a in handlers.get(h, {}).get("permissions", [])}
        for patterns, prop, reason in entries:
            assert any(matches(p, a) for p in patterns for a in permissions), (type_, patterns)
            for resource in by_type.get(type_, []):
                if prop.startswith("!"):
                    assert prop[1:] in resource["Properties"], (type_, prop, reason)
                elif prop:
                    assert prop not in resource["Properties"], (type_, prop, reason)


def test_the_boundary_allows_what_every_role_is_granted_and_no_iam_but_pass_role(
    templates: dict[str, dict[str, Any]]
) -> None:
    boundary = load("permissions-boundary.json")
    text = re.sub(r"\s", "", (BOOTSTRAP / "permissions-boundary.json").read_text(encoding="utf-8"))
    assert len(text) <= MANAGED_POLICY_CHARS
    missing = sorted({f"{action} ({name} {logical_id})" for name, template in templates.items()
                      for logical_id, action in role_actions(template) if not allows(boundary, action)})
    assert missing == [], missing
    granted = {action for template in templates.values() for _, action in role_actions(template)}
    for statement in boundary["Statement"]:
        actions = as_list(statement["Action"])
        assert all(a != "*" and not a.endswith(":*") for a in actions), actions
        if statement["Effect"] == "Allow":
            assert [a for a in actions if a.lower().startswith("iam:")] in ([], ["iam:PassRole"]), actions
            unused = [p for p in actions if not any(matches(p, a) for a in granted)]
            assert unused == [], f"the boundary allows what no role is granted: {unused}"
    for action in ("iam:CreateRole", "iam:PutRolePolicy", "iam:AttachRolePolicy", "iam:UpdateAssumeRolePolicy",
                   "iam:DeleteRolePermissionsBoundary", "kms:PutKeyPolicy", "s3:PutBucketPolicy",
                   "organizations:LeaveOrganization"):
        assert not allows(boundary, action), action


# -----------------------------------------------------------------------------------------------
# The boundary's resources: evaluated with tests/policy_eval.py
# -----------------------------------------------------------------------------------------------

#: The accounts of the templates this module synthesizes: the example pipeline's and its stages'
#: (docs/pipeline.example.json), and one for the environment-agnostic variants.
PIPELINE_ACCOUNT = PIPELINE["account"]
STAGE_ACCOUNTS = {stage["name"]: stage["account"] for stage in PIPELINE["stages"]}
AGNOSTIC_ACCOUNT = "111122223333"
REGION = "us-east-1"
#: What the boundary confines to named resources (the rest of it is on ``*``).
CONFINED = ("iam:PassRole", "sagemaker:CreateProcessingJob", "sagemaker:DescribeProcessingJob",
            "sagemaker:StopProcessingJob", "codebuild:StartBuild", "codebuild:StopBuild", "codebuild:BatchGetBuilds",
            "lambda:InvokeFunction", "lambda:ListTags", "sts:AssumeRole", "s3:PutObject", "s3:DeleteObject",
            "s3:AbortMultipartUpload")
#: A grant whose resource is a pattern: the requests it stands for (the pattern -> a resource a
#: deploy of these templates asks for), each checked against the boundary. A pattern not here fails.
PATTERN_REQUESTS = {
    # The build's state machine names each job mb-<key> (constructs/processing_build.py).
    ":processing-job/mb-*": ":processing-job/mb-0123456789ab",
    # CDK Pipelines' asset roles start their own projects (the grant is CDK's, on *).
    "*": "",
    # The self-mutation role assumes the targets' bootstrap roles (tag-conditioned grant).
    ":role/*": ":role/cdk-hnb659fds-deploy-role-{account}-us-east-1",
}


def _account_of(name: str) -> str:
    if not name.startswith("pipeline"):
        return str(VARIANTS[name].get("account", AGNOSTIC_ACCOUNT))
    stack = name.split(":", 1)[1]
    return next((account for stage, account in STAGE_ACCOUNTS.items() if stack.startswith(f"TritonMme-{stage}")),
                PIPELINE_ACCOUNT)


def generated_arn(template: dict[str, Any], stack: str, logical_id: str, account: str) -> str:
    """The ARN CloudFormation gives a resource of ``template`` named by it (``<stack>-<logical id>-<suffix>``
    for roles, functions and buckets, ``<logical id>-<suffix>`` for CodeBuild projects), or by its name."""
    resource = template["Resources"][logical_id]
    properties = resource.get("Properties", {})
    kind = resource["Type"]
    if kind == "AWS::IAM::Role":
        name = properties.get("RoleName") or f"{stack}-{logical_id}"[:50] + "-A1B2C3D4E5F6"
        return f"arn:aws:iam::{account}:role{properties.get('Path', '/')}{name}"
    if kind == "AWS::Lambda::Function":
        name = properties.get("FunctionName") or f"{stack}-{logical_id}"[:50] + "-A1B2C3D4E5F6"
        return f"arn:aws:lambda:{REGION}:{account}:function:{name}"
    if kind == "AWS::CodeBuild::Project":
        return f"arn:aws:codebuild:{REGION}:{account}:project/{logical_id[:30]}-A1B2C3D4E5F6"
    if kind == "AWS::S3::Bucket":
        return f"arn:aws:s3:::{stack.lower()}-{logical_id.lower()}"[:56] + "-a1b2c3d4e5f6"
    return f"arn:aws:{kind}:{REGION}:{account}:{logical_id}"


def resolve_arn(value: Any, template: dict[str, Any], stack: str, account: str) -> str:
    """A grant's ``Resource`` as the deployed account holds it (``Ref``, ``Fn::GetAtt``, ``Fn::Join``,
    ``Fn::Sub`` of pseudo parameters); anything else is named unresolved, which no pattern matches."""
    pseudo = {"AWS::Partition": "aws", "AWS::AccountId": account, "AWS::Region": REGION,
              "AWS::URLSuffix": "amazonaws.com"}
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and set(value) == {"Fn::GetAtt"} and value["Fn::GetAtt"][1] == "Arn":
        return generated_arn(template, stack, value["Fn::GetAtt"][0], account)
    if isinstance(value, dict) and set(value) == {"Ref"} and value["Ref"] in pseudo:
        return pseudo[value["Ref"]]
    if isinstance(value, dict) and set(value) == {"Fn::Join"}:
        separator, parts = value["Fn::Join"]
        return str(separator).join(resolve_arn(part, template, stack, account) for part in parts)
    if isinstance(value, dict) and set(value) == {"Fn::Sub"} and isinstance(value["Fn::Sub"], str):
        return re.sub(r"\$\{(AWS::[A-Za-z]+)\}", lambda m: pseudo[m.group(1)], value["Fn::Sub"])
    return "<unresolved " + json.dumps(value, sort_keys=True) + ">"


def confined_grants(templates: dict[str, dict[str, Any]]) -> Iterator[tuple[str, str, str, str, dict[str, str]]]:
    """(template, grant, action, resource, request) of every grant of a confined action, each
    pattern resource replaced by the request it stands for."""
    for name, template in templates.items():
        stack = name.split(":", 1)[-1] if name.startswith("pipeline") else "TritonMme"
        account = _account_of(name)
        for logical_id, resource in template["Resources"].items():
            properties = resource.get("Properties", {})
            documents = ([properties["PolicyDocument"]] if resource["Type"] == "AWS::IAM::Policy" else
                         [p["PolicyDocument"] for p in properties.get("Policies", [])]
                         if resource["Type"] == "AWS::IAM::Role" else [])
            for statement in (s for d in documents for s in d["Statement"] if s["Effect"] == "Allow"):
                request = {"aws:PrincipalAccount": account}
                request.update(statement.get("Condition", {}).get("StringEquals", {}))
                for action in as_list(statement["Action"]):
                    if not any(matches(action, confined) for confined in CONFINED):
                        continue
                    for value in as_list(statement["Resource"]):
                        arn = resolve_arn(value, template, stack, account)
                        for pattern, example in PATTERN_REQUESTS.items():
                            if arn.endswith(pattern) and (pattern != "*" or arn == "*"):
                                # A role of the grant's own account; "arn:*:" is the partition, aws.
                                owner = arn.split(":")[4] if arn.count(":") >= 5 else account
                                arn = arn[: len(arn) - len(pattern)] + example.format(account=owner)
                                arn = re.sub(r"^arn:\*:", "arn:aws:", arn)
                                break
                        if arn == "":  # CDK's StartBuild on *: each project of the template's account
                            for project in (k for k, r in template["Resources"].items()
                                            if r["Type"] == "AWS::CodeBuild::Project"):
                                yield name, logical_id, action, generated_arn(template, stack, project, account), request
                            continue
                        yield name, logical_id, action, arn, request


def test_every_confined_grant_of_every_template_is_inside_the_boundary(templates: dict[str, dict[str, Any]]) -> None:
    """What the roles are granted of what the boundary confines, each resource as the account holds
    it: allowed, so a deploy with the boundary on does what it did without."""
    boundary = load("permissions-boundary.json")["Statement"]
    found = list(confined_grants(templates))
    assert len(found) > 100, len(found)
    assert {action for *_, action, _, _ in found} >= {"iam:PassRole", "sagemaker:CreateProcessingJob",
                                                      "codebuild:StartBuild", "lambda:InvokeFunction", "sts:AssumeRole"}
    outside = sorted({f"{name} {grant}: {action} {arn}" for name, grant, action, arn, request in found
                      if decide_bounded(action, arn, request, identity=[{"Effect": "Allow", "Action": action,
                                                                          "Resource": "*"}],
                                         boundary=boundary) != "Allow"})
    assert outside == [], outside


def _widened_role() -> list[dict[str, Any]]:
    """A stack role whose own policy was widened to every resource (what a template change could give it)."""
    return [{"Effect": "Allow", "Action": list(CONFINED), "Resource": "*"}]


ACCOUNT = AGNOSTIC_ACCOUNT
#: (action, resource, request extras, allowed): requests of a stack role whose policy allows all of
#: them; the boundary decides.
BOUNDARY_REQUESTS = [
    ("iam:PassRole", f"arn:aws:iam::{ACCOUNT}:role/Admin", {"iam:PassedToService": "sagemaker.amazonaws.com"}, False),
    ("sagemaker:CreateProcessingJob", f"arn:aws:sagemaker:us-east-1:{ACCOUNT}:processing-job/takeover", {}, False),
    ("iam:PassRole", f"arn:aws:iam::{ACCOUNT}:role/TritonMme-ModelBuildProcessingRole-A1B2",
     {"iam:PassedToService": "sagemaker.amazonaws.com"}, True),
    ("sagemaker:CreateProcessingJob", f"arn:aws:sagemaker:us-east-1:{ACCOUNT}:processing-job/mb-0123456789ab", {}, True),
    # The stack's own role, to another service (a function switched to it), or of another account.
    ("iam:PassRole", f"arn:aws:iam::{ACCOUNT}:role/TritonMme-ModelBuildPlaceRole-A1B2",
     {"iam:PassedToService": "lambda.amazonaws.com"}, False),
    ("lambda:InvokeFunction", f"arn:aws:lambda:us-east-1:{ACCOUNT}:function:payroll", {}, False),
    ("lambda:InvokeFunction", f"arn:aws:lambda:us-east-1:{ACCOUNT}:function:TritonMme-ModelBuild4E9D-A1B2", {}, True),
    ("codebuild:StartBuild", f"arn:aws:codebuild:us-east-1:{ACCOUNT}:project/AnotherTeamsBuild", {}, False),
    ("codebuild:StartBuild", f"arn:aws:codebuild:us-east-1:{ACCOUNT}:project/PipelineAssetsFileAsset1-A1B2", {}, True),
    ("sts:AssumeRole", f"arn:aws:iam::{ACCOUNT}:role/OrganizationAccountAccessRole", {}, False),
    ("sts:AssumeRole", "arn:aws:iam::222222222222:role/cdk-hnb659fds-deploy-role-222222222222-us-east-1", {}, True),
    ("s3:PutObject", "arn:aws:s3:::another-teams-bucket/x", {}, False),
    ("s3:PutObject", "arn:aws:s3:::tritonmme-modelbucket220c70d9-a1b2c3/models/served/x", {}, True),
]


@pytest.mark.parametrize(("action", "resource", "extra", "allowed"), BOUNDARY_REQUESTS,
                         ids=[f"{a}:{r.rsplit(':', 1)[-1]}" for a, r, _, _ in BOUNDARY_REQUESTS])
def test_the_boundary_confines_a_widened_role_to_the_stacks_own_resources(
    action: str, resource: str, extra: dict[str, str], allowed: bool
) -> None:
    """PassRole plus CreateProcessingJob on another role (a job that runs as any role of the
    account) is denied by the boundary, whatever the role's own policy says; so are the other
    confined actions on what is not the stack's. The same requests pass a boundary that allows
    the same actions on ``*`` (the previous one): the resources are what deny them."""
    request = {"aws:PrincipalAccount": ACCOUNT, **extra}
    boundary = load("permissions-boundary.json")["Statement"]
    decision = decide_bounded(action, resource, request, identity=_widened_role(), boundary=boundary)
    assert decision == ("Allow" if allowed else "ImplicitDeny"), (action, resource, decision)
    on_any = [{"Effect": "Allow", "Action": [a for s in boundary for a in as_list(s["Action"])], "Resource": "*"}]
    assert decide_bounded(action, resource, request, identity=_widened_role(), boundary=on_any) == "Allow"


@pytest.mark.parametrize("policy", ["execution-policy.json", "pipeline-execution-policy.json"])
def test_the_execution_policy_sets_only_the_stacks_buckets_policies(
    templates: dict[str, dict[str, Any]], policy: str
) -> None:
    """``s3:PutBucket*`` (a bucket's policy, its public access block, its encryption) and the other
    bucket writes on the stacks' own buckets only: CloudFormation names a bucket
    ``<stack, lower case>-<logical id>-<suffix>``, and no template names one itself."""
    statements = load(policy)["Statement"]
    for name, template in templates.items():
        stack = name.split(":", 1)[-1] if name.startswith("pipeline") else "TritonMme"
        for logical_id, resource in template["Resources"].items():
            if resource["Type"] == "AWS::S3::Bucket":
                assert "BucketName" not in resource.get("Properties", {}), (name, logical_id)
                bucket = generated_arn(template, stack, logical_id, AGNOSTIC_ACCOUNT)
                for action in ("s3:PutBucketPolicy", "s3:CreateBucket", "s3:PutBucketPublicAccessBlock"):
                    assert decide_bounded(action, bucket, {}, identity=statements, boundary=statements) == "Allow"
    for action in ("s3:PutBucketPolicy", "s3:PutBucketAcl", "s3:DeleteBucket", "s3:PutBucketPublicAccessBlock",
                   "s3:DeleteObject", "s3:PutEncryptionConfiguration"):
        assert decide_bounded(action, "arn:aws:s3:::another-teams-bucket", {}, identity=statements,
                              boundary=statements) == "ImplicitDeny", action


def test_an_app_for_the_projects_bootstrap_puts_the_boundary_on_every_role(tmp_path: Path) -> None:
    """``make bootstrap`` bootstraps with the qualifier ``tritonmme`` and the project's policies; an
    app with that qualifier gets the boundary on every role, and its template can deploy only where
    that bootstrap ran (its ``BootstrapVersion`` parameter reads that bootstrap's own record)."""
    import aws_cdk as cdk
    from cdk_helpers import context

    from app import BOUNDARY_NAME, PROJECT_QUALIFIER, QUALIFIER_KEY, build_app

    def endpoint_app(outdir: Path, qualifier: str) -> dict[str, Any]:
        app = cdk.App(context={**context(), QUALIFIER_KEY: qualifier}, outdir=str(outdir), analytics_reporting=False)
        stack = build_app(app)
        return dict(app.synth().get_stack_by_name(stack.stack_name).template)

    assert BOUNDARY_CONTEXT["@aws-cdk/core:permissionsBoundary"]["name"] == BOUNDARY_NAME
    qualifier = {QUALIFIER_KEY: PROJECT_QUALIFIER}
    for label, data in (("endpoint", endpoint_app(tmp_path / "endpoint", PROJECT_QUALIFIER)),
                        *synth_pipeline(tmp_path / "pipeline", PIPELINE, extra_context=qualifier).templates.items()):
        roles = {k: r for k, r in data["Resources"].items() if r["Type"] == "AWS::IAM::Role"}
        assert roles, label
        for logical_id, role in roles.items():
            assert f":policy/{BOUNDARY_NAME}" in json.dumps(role["Properties"].get("PermissionsBoundary")), \
                (label, logical_id)
        assert data["Parameters"]["BootstrapVersion"]["Default"] == f"/cdk-bootstrap/{PROJECT_QUALIFIER}/version"
    other = endpoint_app(tmp_path / "other", "someother")
    assert all("PermissionsBoundary" not in r["Properties"] for r in other["Resources"].values()
               if r["Type"] == "AWS::IAM::Role")
