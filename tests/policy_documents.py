"""Every policy document of a synthesized template, with CloudFormation's intrinsics resolved to
placeholder values, for linters that read plain IAM JSON (parliament, tests/test_parliament.py).

The documents: ``AWS::IAM::Policy`` and ``AWS::IAM::ManagedPolicy`` (``PolicyDocument``), a role's
inline ``Policies`` and its trust policy (``AssumeRolePolicyDocument``), ``AWS::S3::BucketPolicy``
(``PolicyDocument``), ``AWS::KMS::Key`` (``KeyPolicy``) and ``AWS::EC2::VPCEndpoint``
(``PolicyDocument``).

How intrinsics resolve (:func:`resolve`), so that a placeholder has the shape of the real value and
a linter's ARN checks still apply:

- pseudo parameters: ``AWS::Partition`` ``aws``, ``AWS::Region`` :data:`REGION`,
  ``AWS::AccountId`` :data:`ACCOUNT`, ``AWS::URLSuffix`` ``amazonaws.com``, ``AWS::StackName``
  ``stack``, ``AWS::StackId`` a stack ARN of those; ``AWS::NoValue`` drops the element;
- ``Ref`` and ``Fn::GetAtt`` of a resource of the template: the value the resource type's
  documentation gives for it, built from the logical id lower-cased as the resource's name
  (:data:`PLACEHOLDERS`: a bucket's ``Ref`` is its name, its ``Arn`` ``arn:aws:s3:::<name>``; a
  state machine's ``Ref`` is its ARN; ...);
- a template parameter: ``<parameter name>`` (none reaches a policy today);
- ``Fn::Join``, ``Fn::Sub`` (both forms), ``Fn::Select``, ``Fn::Split``, ``Fn::FindInMap`` (the
  template's ``Mappings``, at :data:`REGION`): evaluated;
- anything else (another intrinsic, a resource type or attribute not in the table, a ``Ref`` to
  nothing): :class:`Unresolved`, naming it. Nothing is guessed.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

#: The placeholder account (the IAM User Guide's example account) and region.
ACCOUNT = "111122223333"
REGION = "us-east-1"
_A, _R = ACCOUNT, REGION
_NO_VALUE = object()


class Unresolved(ValueError):
    """An intrinsic that :func:`resolve` does not evaluate."""


#: (resource type, ``Ref`` or attribute) -> the placeholder, from the resource's name.
PLACEHOLDERS: dict[tuple[str, str], Callable[[str], str]] = {
    ("AWS::S3::Bucket", "Ref"): lambda n: n,
    ("AWS::S3::Bucket", "Arn"): lambda n: f"arn:aws:s3:::{n}",
    ("AWS::KMS::Key", "Ref"): lambda n: "1234abcd-12ab-34cd-56ef-1234567890ab",
    ("AWS::KMS::Key", "Arn"): lambda n: f"arn:aws:kms:{_R}:{_A}:key/1234abcd-12ab-34cd-56ef-1234567890ab",
    ("AWS::Lambda::Function", "Ref"): lambda n: n,
    ("AWS::Lambda::Function", "Arn"): lambda n: f"arn:aws:lambda:{_R}:{_A}:function:{n}",
    ("AWS::IAM::Role", "Ref"): lambda n: n,
    ("AWS::IAM::Role", "Arn"): lambda n: f"arn:aws:iam::{_A}:role/{n}",
    ("AWS::IAM::ManagedPolicy", "Ref"): lambda n: f"arn:aws:iam::{_A}:policy/{n}",
    ("AWS::Logs::LogGroup", "Ref"): lambda n: n,
    ("AWS::Logs::LogGroup", "Arn"): lambda n: f"arn:aws:logs:{_R}:{_A}:log-group:{n}:*",
    ("AWS::StepFunctions::StateMachine", "Ref"): lambda n: f"arn:aws:states:{_R}:{_A}:stateMachine:{n}",
    ("AWS::StepFunctions::StateMachine", "Arn"): lambda n: f"arn:aws:states:{_R}:{_A}:stateMachine:{n}",
    ("AWS::StepFunctions::StateMachine", "Name"): lambda n: n,
    ("AWS::CloudWatch::Alarm", "Ref"): lambda n: n,
    ("AWS::CloudWatch::Alarm", "Arn"): lambda n: f"arn:aws:cloudwatch:{_R}:{_A}:alarm:{n}",
    ("AWS::SNS::Topic", "Ref"): lambda n: f"arn:aws:sns:{_R}:{_A}:{n}",
    ("AWS::SNS::Topic", "TopicArn"): lambda n: f"arn:aws:sns:{_R}:{_A}:{n}",
    ("AWS::SNS::Topic", "TopicName"): lambda n: n,
    ("AWS::SQS::Queue", "Arn"): lambda n: f"arn:aws:sqs:{_R}:{_A}:{n}",
    ("AWS::SageMaker::Endpoint", "Ref"): lambda n: f"arn:aws:sagemaker:{_R}:{_A}:endpoint/{n}",
    ("AWS::SageMaker::Endpoint", "EndpointName"): lambda n: n,
    ("AWS::CodeBuild::Project", "Ref"): lambda n: n,
    ("AWS::CodeBuild::Project", "Arn"): lambda n: f"arn:aws:codebuild:{_R}:{_A}:project/{n}",
    ("AWS::CodePipeline::Pipeline", "Ref"): lambda n: n,
    ("AWS::Events::Rule", "Arn"): lambda n: f"arn:aws:events:{_R}:{_A}:rule/{n}",
    ("AWS::EC2::VPC", "Ref"): lambda n: "vpc-0123456789abcdef0",
    ("AWS::EC2::VPC", "DefaultSecurityGroup"): lambda n: "sg-0fedcba9876543210",
    ("AWS::EC2::SecurityGroup", "GroupId"): lambda n: "sg-0123456789abcdef0",
    ("AWS::EC2::VPCEndpoint", "Ref"): lambda n: "vpce-0123456789abcdef0",
}

_PSEUDO = {
    "AWS::Partition": "aws",
    "AWS::Region": REGION,
    "AWS::AccountId": ACCOUNT,
    "AWS::URLSuffix": "amazonaws.com",
    "AWS::StackName": "stack",
    "AWS::StackId": f"arn:aws:cloudformation:{REGION}:{ACCOUNT}:stack/stack/11111111-2222-3333-4444-555555555555",
}


def _placeholder(template: Mapping[str, Any], logical_id: str, attribute: str) -> str:
    resources = template.get("Resources", {})
    if logical_id not in resources:
        if attribute == "Ref" and logical_id in template.get("Parameters", {}):
            return f"<{logical_id}>"
        raise Unresolved(f"{attribute} of {logical_id!r}: no such resource or parameter")
    type_ = resources[logical_id]["Type"]
    make = PLACEHOLDERS.get((type_, attribute))
    if make is None:
        raise Unresolved(f"{attribute} of {logical_id} ({type_}): not in policy_documents.PLACEHOLDERS")
    return make(logical_id.lower())


def resolve(value: Any, template: Mapping[str, Any]) -> Any:
    """``value`` with every intrinsic evaluated to placeholders (see the module's docstring)."""
    if isinstance(value, list):
        items = [resolve(item, template) for item in value]
        return [item for item in items if item is not _NO_VALUE]
    if not isinstance(value, dict):
        return value
    if len(value) == 1:
        (key, arg), = value.items()
        if key == "Ref":
            if arg == "AWS::NoValue":
                return _NO_VALUE
            return _PSEUDO[arg] if arg in _PSEUDO else _placeholder(template, arg, "Ref")
        if key == "Fn::GetAtt":
            logical_id, attribute = arg if isinstance(arg, list) else arg.split(".", 1)
            return _placeholder(template, logical_id, attribute)
        if key == "Fn::Join":
            delimiter, parts = arg
            return delimiter.join(str(part) for part in resolve(parts, template))
        if key == "Fn::Select":
            index, items = resolve(arg, template)
            return items[int(index)]
        if key == "Fn::Split":
            delimiter, text = resolve(arg, template)
            return text.split(delimiter)
        if key == "Fn::FindInMap":
            name, first, second = resolve(arg, template)
            return template["Mappings"][name][first][second]
        if key == "Fn::Sub":
            return _sub(arg, template)
        if key.startswith("Fn::") or key == "Condition":
            raise Unresolved(f"{key} is not evaluated: {value}")
    resolved = {key: resolve(item, template) for key, item in value.items()}
    return {key: item for key, item in resolved.items() if item is not _NO_VALUE}


def _sub(arg: Any, template: Mapping[str, Any]) -> str:
    text, variables = (arg, {}) if isinstance(arg, str) else (arg[0], resolve(arg[1], template))

    def one(match: re.Match[str]) -> str:
        name = match.group(1)
        if name.startswith("!"):
            return "${" + name[1:] + "}"
        if name in variables:
            return str(variables[name])
        if name in _PSEUDO:
            return _PSEUDO[name]
        if "." in name:
            logical_id, attribute = name.split(".", 1)
            return _placeholder(template, logical_id, attribute)
        return _placeholder(template, name, "Ref")

    return re.sub(r"\$\{([^}]+)\}", one, text)


@dataclass(frozen=True)
class Document:
    """One policy document of a template: where it is, its kind, and its resolved JSON."""

    logical_id: str
    kind: str  # identity, trust, bucket, key, endpoint
    where: str  # the property, e.g. "Policies[0]"
    document: dict[str, Any]


def documents(template: Mapping[str, Any]) -> Iterator[Document]:
    """Every policy document of ``template`` (see the module's docstring), resolved."""
    for logical_id, resource in template.get("Resources", {}).items():
        type_, properties = resource["Type"], resource.get("Properties", {})
        found: list[tuple[str, str, Any]] = []
        if type_ in ("AWS::IAM::Policy", "AWS::IAM::ManagedPolicy"):
            found.append(("identity", "PolicyDocument", properties["PolicyDocument"]))
        elif type_ == "AWS::IAM::Role":
            found.append(("trust", "AssumeRolePolicyDocument", properties["AssumeRolePolicyDocument"]))
            found.extend(("identity", f"Policies[{i}]", policy["PolicyDocument"])
                         for i, policy in enumerate(properties.get("Policies", [])))
        elif type_ == "AWS::S3::BucketPolicy":
            found.append(("bucket", "PolicyDocument", properties["PolicyDocument"]))
        elif type_ == "AWS::KMS::Key":
            found.append(("key", "KeyPolicy", properties["KeyPolicy"]))
        elif type_ == "AWS::EC2::VPCEndpoint" and "PolicyDocument" in properties:
            found.append(("endpoint", "PolicyDocument", properties["PolicyDocument"]))
        for kind, where, document in found:
            yield Document(logical_id, kind, where, resolve(document, template))
