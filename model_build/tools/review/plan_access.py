"""Which properties of which resource types say who can do what, and how ``plan`` compares each.

:data:`ACCESS_PROPERTIES` is the table: per resource type, each property that carries access and
the rule it is compared by. A type in the table is **known**: only the properties it lists are
judged (a type listed with none carries no access). Each rule says which way access goes
(``widens``, ``narrows``, ``unknown``; unknown is what a rule cannot classify, treated as
widening):

- ``policy``: a policy document, identity, trust or resource policy alike (a role's trust, a
  key, bucket, topic, queue, repository, log or secret policy), grant by grant
  (:mod:`.plan_security`); ``endpoint-policy``: the same, where no policy means full access (a
  VPC endpoint); ``grant``: a resource that is one grant spelled as properties
  (``AWS::Lambda::Permission``: principal, action, function, and its source conditions);
- ``attached`` (roles, users, groups, managed policies, security groups, layers): one added
  widens, one removed narrows; ``boundary``: removed widens, set narrows;
- ``role``: the identity a resource acts as (a function's ``Role``, a state machine's
  ``RoleArn``, a project's ``ServiceRole``): set on a resource created widens (one more thing
  acts with that role's rights), removed with its resource narrows, switched is unknown (the
  two roles' rights are not compared here: their own policies are);
- ``code``: where a function's code comes from (the image's repository, the bucket, inline code)
  and which of it runs (``ImageConfig``, ``Handler``): a change is unknown. A new version of the
  same asset (a new image tag or digest, a new key in the same bucket) is the commit's own code,
  read as code in the review, and no finding;
- ``environment``: each variable (or setting) added, removed or changed is unknown (an
  ``HF_ENDPOINT`` sends every hub download elsewhere); ``definition``: what a resource does with
  its role (a state machine's definition, a buildspec, a pipeline's stages), changed: unknown,
  naming the paths that change;
- ``network``: a ``VpcConfig`` removed widens (outbound traffic no longer passes the VPC's
  security groups and endpoint policies), a security group added widens, removed narrows, any
  other change is unknown; ``isolation``: network isolation turned off widens, on narrows;
- ``key``: a customer key removed widens (an AWS owned key: readable without access to a key
  policy), set narrows, switched is unknown;
- ``url-auth``: a function URL with ``AuthType: NONE`` widens (anyone with the URL invokes the
  function, unsigned), turned back to ``AWS_IAM`` or removed narrows;
- ``scope`` (what a policy is on: its bucket, topics, queues, role) and ``target`` (what a
  resource invokes or writes to: a custom resource's ``ServiceToken``): a list entry added
  widens, removed narrows, any other change is unknown (set with the resource: no finding, its
  statements say what changes).

A resource created or removed is judged by its grants and its role (``policy``, ``grant``,
``attached``, ``role``, ``url-auth``; a security group or VPC endpoint created without what limits
it); its code, environment, definition, network and key are no finding of their own then.

A resource type **not** in the table, that carries a role, a policy or a principal (a property
named so, a policy document, a reference to an IAM resource, an IAM role ARN, a custom resource's
handler), is ``unknown`` in each such property that changes, never "other". Any ``AWS::IAM::*``
type the table does not list: every property, unknown.

This module is pure: no CDK, no diff engine (``plan_verdict`` calls :func:`security_changes` per
resource the engine says changed).
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Callable, Mapping
from typing import Any

from triton_mme_cdk.model_build.tools.review.plan_security import (
    MISSING,
    NARROWS,
    UNKNOWN,
    WIDENS,
    SecurityChange,
    attachments,
    encryption,
    inline_policies,
    is_literal_policy,
    permission_document,
    policy_changes,
    public_access,
    render,
    rule_resource_changes,
    sg_rules,
    shown,
)

POLICY, ENDPOINT_POLICY, GRANT, INLINE_POLICIES = "policy", "endpoint-policy", "grant", "inline-policies"
ATTACHED, BOUNDARY, ROLE, CODE, ENVIRONMENT = "attached", "boundary", "role", "code", "environment"
DEFINITION, NETWORK, ISOLATION, KEY, URL_AUTH = "definition", "network", "isolation", "key", "url-auth"
SCOPE, TARGET, PUBLIC_ACCESS, BUCKET_ENCRYPTION, ACL = "scope", "target", "public-access", "bucket-encryption", "acl"
SG_RULES, SG_RULE, OPAQUE = "security-group-rules", "security-group-rule", "opaque"
#: The resource as a whole (a grant or a rule that is its own resource).
WHOLE = "*"

_LAMBDA_FUNCTION = {"Role": ROLE, "VpcConfig": NETWORK, "Environment": ENVIRONMENT, "Layers": ATTACHED,
                    "Code": CODE, "ImageConfig": CODE, "Handler": CODE, "KmsKeyArn": KEY}
_IAM_POLICY = {"PolicyDocument": POLICY, "Roles": ATTACHED, "Users": ATTACHED, "Groups": ATTACHED}
#: Per resource type, the properties that carry access (a dotted path for a nested one) and their rule.
ACCESS_PROPERTIES: dict[str, dict[str, str]] = {
    # Identity
    "AWS::IAM::Role": {"AssumeRolePolicyDocument": POLICY, "Policies": INLINE_POLICIES, "ManagedPolicyArns": ATTACHED,
                       "PermissionsBoundary": BOUNDARY},
    "AWS::IAM::Policy": _IAM_POLICY,
    "AWS::IAM::ManagedPolicy": _IAM_POLICY,
    "AWS::IAM::RolePolicy": {"PolicyDocument": POLICY, "RoleName": SCOPE},
    # Resource policies and grants
    "AWS::KMS::Key": {"KeyPolicy": POLICY},
    "AWS::S3::BucketPolicy": {"PolicyDocument": POLICY, "Bucket": SCOPE},
    "AWS::S3::AccessPoint": {"Policy": POLICY, "Bucket": SCOPE, "PublicAccessBlockConfiguration": PUBLIC_ACCESS,
                             "VpcConfiguration": NETWORK},
    "AWS::SNS::TopicPolicy": {"PolicyDocument": POLICY, "Topics": SCOPE},
    "AWS::SQS::QueuePolicy": {"PolicyDocument": POLICY, "Queues": SCOPE},
    "AWS::ECR::Repository": {"RepositoryPolicyText": POLICY, "EncryptionConfiguration": KEY},
    "AWS::ECR::RegistryPolicy": {"PolicyText": POLICY},
    "AWS::Logs::ResourcePolicy": {"PolicyDocument": POLICY},
    "AWS::SecretsManager::ResourcePolicy": {"ResourcePolicy": POLICY, "SecretId": SCOPE},
    "AWS::EC2::VPCEndpoint": {"PolicyDocument": ENDPOINT_POLICY},
    "AWS::Lambda::Permission": {WHOLE: GRANT},
    "AWS::Lambda::LayerVersionPermission": {WHOLE: GRANT},
    "AWS::Lambda::Url": {"AuthType": URL_AUTH, "TargetFunctionArn": SCOPE},
    # What runs, as whom, where
    "AWS::Lambda::Function": _LAMBDA_FUNCTION,
    "AWS::StepFunctions::StateMachine": {"RoleArn": ROLE, "DefinitionString": DEFINITION, "Definition": DEFINITION,
                                         "DefinitionS3Location": DEFINITION, "DefinitionSubstitutions": DEFINITION,
                                         "EncryptionConfiguration": KEY},
    "AWS::CodeBuild::Project": {"ServiceRole": ROLE, "Source.BuildSpec": DEFINITION, "Environment": ENVIRONMENT,
                                "VpcConfig": NETWORK, "EncryptionKey": KEY},
    "AWS::CodePipeline::Pipeline": {"RoleArn": ROLE, "Stages": DEFINITION},
    "AWS::Events::Rule": {"RoleArn": ROLE, "Targets": DEFINITION},
    "AWS::SageMaker::Model": {"ExecutionRoleArn": ROLE, "VpcConfig": NETWORK, "EnableNetworkIsolation": ISOLATION},
    "AWS::SageMaker::EndpointConfig": {"KmsKeyId": KEY, "DataCaptureConfig": ENVIRONMENT},
    "AWS::ApplicationAutoScaling::ScalableTarget": {"RoleARN": ROLE},
    "AWS::EC2::FlowLog": {"DeliverLogsPermissionArn": ROLE, "LogDestination": TARGET},
    "Custom::TritonModelRelease": {"ServiceToken": TARGET, "BuildStateMachineArn": TARGET, "ModelBucket": TARGET},
    "Custom::AWS": {"ServiceToken": TARGET, "Create": DEFINITION, "Update": DEFINITION, "Delete": DEFINITION},
    "Custom::VpcRestrictDefaultSG": {"ServiceToken": TARGET},
    # Data, keys, network
    "AWS::S3::Bucket": {"PublicAccessBlockConfiguration": PUBLIC_ACCESS, "BucketEncryption": BUCKET_ENCRYPTION,
                        "AccessControl": ACL, "ReplicationConfiguration": ENVIRONMENT},
    "AWS::Logs::LogGroup": {"KmsKeyId": KEY},
    "AWS::SNS::Topic": {"KmsMasterKeyId": KEY},
    "AWS::SNS::Subscription": {"Endpoint": TARGET, "SubscriptionRoleArn": ROLE},
    "AWS::SQS::Queue": {"KmsMasterKeyId": KEY},
    "AWS::SecretsManager::Secret": {"KmsKeyId": KEY},
    "AWS::EC2::SecurityGroup": {"SecurityGroupIngress": SG_RULES, "SecurityGroupEgress": SG_RULES},
    "AWS::EC2::SecurityGroupIngress": {WHOLE: SG_RULE},
    "AWS::EC2::SecurityGroupEgress": {WHOLE: SG_RULE},
    # Known, and carrying no access.
    **{name: {} for name in (
        "AWS::CDK::Metadata", "AWS::CloudWatch::Alarm", "AWS::CloudWatch::Dashboard", "AWS::SageMaker::Endpoint",
        "AWS::ApplicationAutoScaling::ScalingPolicy", "AWS::EC2::VPC", "AWS::EC2::Subnet", "AWS::EC2::RouteTable",
        "AWS::EC2::Route", "AWS::EC2::SubnetRouteTableAssociation", "AWS::EC2::InternetGateway",
        "AWS::EC2::VPCGatewayAttachment", "AWS::EC2::NatGateway", "AWS::EC2::EIP")},
}
#: The properties of a grant resource: its principal, action and resource, and each property that
#: is a condition of the grant (operator, condition key).
GRANTS: dict[str, tuple[str, str, str, dict[str, tuple[str, str]]]] = {
    "AWS::Lambda::Permission": ("Principal", "Action", "FunctionName", {
        "SourceArn": ("ArnLike", "aws:SourceArn"), "SourceAccount": ("StringEquals", "aws:SourceAccount"),
        "PrincipalOrgID": ("StringEquals", "aws:PrincipalOrgID"),
        "FunctionUrlAuthType": ("StringEquals", "lambda:FunctionUrlAuthType"),
        "EventSourceToken": ("StringEquals", "lambda:EventSourceToken")}),
    "AWS::Lambda::LayerVersionPermission": ("Principal", "Action", "LayerVersionArn", {
        "OrganizationId": ("StringEquals", "aws:PrincipalOrgID")}),
}
#: Words in a property's name that say it carries access (a type the table does not know).
ACCESS_WORDS = ("role", "policy", "principal", "permission")
_ROLE_ARN = re.compile(r"arn:.*:iam::.*:role/")


def only_security(resource_type: str, properties: list[str]) -> bool:
    """Whether every changed top-level property of a resource is one the table judges whole."""
    table = ACCESS_PROPERTIES.get(resource_type)
    if table is None:
        return resource_type.startswith("AWS::IAM::")
    return WHOLE in table or set(properties) <= set(table)


def security_changes(resource_type: str, old: Mapping[str, Any] | None, new: Mapping[str, Any] | None,
                     resources: Mapping[str, Any] | None = None) -> list[SecurityChange]:
    """What a change of a resource (its properties; None: absent) does to who can do what.
    ``resources``: the templates' resources, to tell a reference to an IAM resource."""
    if resource_type == "AWS::S3::Bucket" and new is None:
        return []  # a bucket deleted is data at risk, not access granted
    old_props, new_props = dict(old or {}), dict(new or {})
    table = ACCESS_PROPERTIES.get(resource_type)
    if table is None:
        if resource_type.startswith("AWS::IAM::"):
            table = {name: OPAQUE for name in sorted(set(old_props) | set(new_props))}
        else:
            return _unknown_type(resource_type, old_props, new_props, resources or {})
    created, existed = old is None, new is not None
    if WHOLE in table:
        return _whole(resource_type, table[WHOLE], old_props if old is not None else None,
                      new_props if new is not None else None)
    found: list[SecurityChange] = []
    for path, rule in table.items():
        before, after = _at(old_props, path), _at(new_props, path)
        if before is after or (before is not MISSING and after is not MISSING and before == after):
            continue
        found += RULES[rule](path, before, after, created, existed)
    if created and existed:
        if resource_type == "AWS::EC2::SecurityGroup" and "SecurityGroupEgress" not in new_props:
            found.append(SecurityChange("SecurityGroupEgress", "unset: CloudFormation allows all outbound traffic",
                                        WIDENS))
        if resource_type == "AWS::EC2::VPCEndpoint" and "PolicyDocument" not in new_props:
            found.append(SecurityChange("PolicyDocument", "unset: the endpoint allows full access", WIDENS))
    return found


def _at(props: Mapping[str, Any], path: str) -> Any:
    value: Any = props
    for part in path.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return MISSING
        value = value[part]
    return value


# ---------------------------------------------------------------------------------------------
# The rules: (property path, before, after, created, existed) -> changes
# ---------------------------------------------------------------------------------------------

Rule = Callable[[str, Any, Any, bool, bool], list[SecurityChange]]


def _optional(value: Any) -> Any:
    return None if value is MISSING else value


def _policy(path: str, before: Any, after: Any, created: bool, existed: bool) -> list[SecurityChange]:
    return policy_changes(path, _optional(before), _optional(after))


def _endpoint_policy(path: str, before: Any, after: Any, created: bool, existed: bool) -> list[SecurityChange]:
    if after is MISSING and existed:
        return [SecurityChange(path, "removed: the endpoint allows full access", WIDENS)]
    if before is MISSING and not created:
        return [SecurityChange(path, "set (the endpoint allowed full access)",
                               NARROWS if is_literal_policy(after) else UNKNOWN)]
    return _policy(path, before, after, created, existed)


def _inline(path: str, before: Any, after: Any, created: bool, existed: bool) -> list[SecurityChange]:
    return inline_policies(before, after)


def _attached(path: str, before: Any, after: Any, created: bool, existed: bool) -> list[SecurityChange]:
    return attachments(path, before, after)


def _boundary(path: str, before: Any, after: Any, created: bool, existed: bool) -> list[SecurityChange]:
    access = WIDENS if after is MISSING else NARROWS if before is MISSING else UNKNOWN
    return [SecurityChange(path, f"{shown(before)} -> {shown(after)}", access)]


def _role(path: str, before: Any, after: Any, created: bool, existed: bool) -> list[SecurityChange]:
    if before is MISSING:
        return [SecurityChange(path, (f"{shown(after)}: a new resource that acts with its rights" if created else
                                      f"(unset) -> {shown(after)}: acts with its rights"), WIDENS)]
    if after is MISSING:
        return [SecurityChange(path, f"{shown(before)} -> (unset)" + ("" if existed else " (removed)"), NARROWS)]
    return [SecurityChange(path, f"{shown(before)} -> {shown(after)}: acts with another role's rights", UNKNOWN)]


def _code(path: str, before: Any, after: Any, created: bool, existed: bool) -> list[SecurityChange]:
    if created or not existed:
        return []
    old, new = _code_source(path, before), _code_source(path, after)
    if old == new:
        return []  # a new version of the same asset
    return [SecurityChange(path, f"{_brief(old)} -> {_brief(new)}: other code runs with the role", UNKNOWN)]


def _code_source(path: str, value: Any) -> str:
    """Where the code comes from: ``Code`` without the asset's version (an image's tag or digest,
    a key or object version in the bucket); any other property whole."""
    if value is MISSING:
        return "(unset)"
    if path != "Code" or not isinstance(value, Mapping):
        return render(value)
    source = {key: render(item) for key, item in value.items() if key not in ("S3Key", "S3ObjectVersion")}
    if "ImageUri" in source:
        uri = source["ImageUri"].split("@", 1)[0]
        head, _, tail = uri.rpartition("/")
        source["ImageUri"] = (head + "/" if head else "") + tail.split(":", 1)[0]
    return ", ".join(f"{key} {item}" for key, item in sorted(source.items()))


def _environment(path: str, before: Any, after: Any, created: bool, existed: bool) -> list[SecurityChange]:
    if created or not existed:
        return []
    old, new = _leaves(_optional(before)), _leaves(_optional(after))
    return [SecurityChange(f"{path}{leaf}", f"{_brief(old.get(leaf, '(unset)'))} -> {_brief(new.get(leaf, '(unset)'))}",
                           UNKNOWN) for leaf in sorted(set(old) | set(new)) if old.get(leaf) != new.get(leaf)]


def _definition(path: str, before: Any, after: Any, created: bool, existed: bool) -> list[SecurityChange]:
    if created or not existed:
        return []
    old, new = _parsed(before), _parsed(after)
    if isinstance(old, str) or isinstance(new, str):
        lines = [line for line in difflib.unified_diff(str(old).splitlines(), str(new).splitlines(), lineterm="", n=0)
                 if line[:1] in "+-" and not line.startswith(("+++", "---"))]
        changed = [f"{'added' if line[0] == '+' else 'removed'} line {_brief(line[1:].strip())}" for line in lines]
    else:
        left, right = _leaves(old), _leaves(new)
        changed = [f"{leaf.lstrip('.')}: {_brief(left.get(leaf, '(unset)'), 60)} -> {_brief(right.get(leaf, '(unset)'), 60)}"
                   for leaf in sorted(set(left) | set(right)) if left.get(leaf) != right.get(leaf)]
    if not changed:
        return []  # the same definition written another way (spacing, key order)
    shown_ = changed[:3] + ([f"and {len(changed) - 3} more"] if len(changed) > 3 else [])
    return [SecurityChange(path, "changed: " + "; ".join(shown_), UNKNOWN)]


def _parsed(value: Any) -> Any:
    """A definition as data: a JSON text (a state machine's definition, a buildspec) parsed."""
    if value is MISSING:
        return {}
    text = render(value) if isinstance(value, (str, dict)) and (
        isinstance(value, str) or set(value) <= {"Fn::Join", "Fn::Sub"}) else None
    if text is None:
        return value
    try:
        return json.loads(text)
    except ValueError:
        return text


def _leaves(value: Any, prefix: str = "") -> dict[str, str]:
    """Each leaf of ``value`` by its path (``.Variables.HF_ENDPOINT``; a list of named items by name:
    ``.EnvironmentVariables[HF_TOKEN]``), rendered."""
    if value is None:
        return {}
    if isinstance(value, Mapping) and not (len(value) == 1 and next(iter(value)) in ("Ref", "Fn::GetAtt", "Fn::Join",
                                                                                   "Fn::Sub")):
        return {path: text for key, item in value.items() for path, text in _leaves(item, f"{prefix}.{key}").items()}
    if isinstance(value, list):
        named = all(isinstance(item, Mapping) and isinstance(item.get("Name"), str) for item in value) and value
        return {path: text for index, item in enumerate(value) for path, text in
                _leaves(item, f"{prefix}[{item['Name'] if named else index}]").items()}
    return {prefix: render(value)}


def _network(path: str, before: Any, after: Any, created: bool, existed: bool) -> list[SecurityChange]:
    if created or not existed:
        return []
    if after is MISSING:
        return [SecurityChange(path, "removed: runs outside the VPC (outbound traffic no longer passes its security "
                               "groups and endpoint policies)", WIDENS)]
    if before is MISSING or not isinstance(before, Mapping) or not isinstance(after, Mapping):
        return [SecurityChange(path, f"{shown(before)} -> {shown(after)}", UNKNOWN)]
    found: list[SecurityChange] = []
    for key in sorted(set(before) | set(after)):
        was, now = before.get(key, MISSING), after.get(key, MISSING)
        if was == now:
            continue
        if key == "SecurityGroupIds":
            found += attachments(f"{path}.{key}", was, now)
        else:
            found.append(SecurityChange(f"{path}.{key}", f"{shown(was)} -> {shown(now)}", UNKNOWN))
    return found


def _isolation(path: str, before: Any, after: Any, created: bool, existed: bool) -> list[SecurityChange]:
    if created or not existed:
        return []
    access = WIDENS if before is True else NARROWS if after is True else UNKNOWN
    return [SecurityChange(path, f"{shown(before)} -> {shown(after)}", access)]


def _key(path: str, before: Any, after: Any, created: bool, existed: bool) -> list[SecurityChange]:
    if created or not existed:
        return []
    if after is MISSING:
        return [SecurityChange(path, f"{shown(before)} -> (unset): an AWS owned key, readable without access to a key "
                               "policy", WIDENS)]
    return [SecurityChange(path, f"{shown(before)} -> {shown(after)}", NARROWS if before is MISSING else UNKNOWN)]


def _url_auth(path: str, before: Any, after: Any, created: bool, existed: bool) -> list[SecurityChange]:
    if after == "NONE":
        return [SecurityChange(path, f"{shown(before)} -> NONE: anyone with the URL invokes the function, unsigned",
                               WIDENS)]
    if before == "NONE":
        return [SecurityChange(path, f"NONE -> {shown(after)}" + ("" if existed else " (removed)"), NARROWS)]
    if created or not existed:
        return []
    return [SecurityChange(path, f"{shown(before)} -> {shown(after)}", UNKNOWN)]


def _scope(path: str, before: Any, after: Any, created: bool, existed: bool) -> list[SecurityChange]:
    if created or not existed or (before is MISSING and after is MISSING):
        return []  # set with its resource: the statements say what changes
    if isinstance(_optional(before) or [], list) and isinstance(_optional(after) or [], list):
        return attachments(path, before, after)
    return [SecurityChange(path, f"{shown(before)} -> {shown(after)}", UNKNOWN)]


def _public(path: str, before: Any, after: Any, created: bool, existed: bool) -> list[SecurityChange]:
    return [SecurityChange(change.path.replace("PublicAccessBlockConfiguration", path, 1), change.text, change.access)
            for change in public_access(before, after, created=created)]


def _bucket_encryption(path: str, before: Any, after: Any, created: bool, existed: bool) -> list[SecurityChange]:
    return [] if created else encryption(before, after)  # a new bucket: S3 encrypts by default


def _acl(path: str, before: Any, after: Any, created: bool, existed: bool) -> list[SecurityChange]:
    if after == "Private" and created:
        return []
    access = NARROWS if after == "Private" else WIDENS if before in (MISSING, "Private") else UNKNOWN
    return [SecurityChange(path, f"{shown(before)} -> {shown(after)}", access)]


def _sg_rules(path: str, before: Any, after: Any, created: bool, existed: bool) -> list[SecurityChange]:
    if path == "SecurityGroupEgress" and after is MISSING and existed:
        return [SecurityChange(path, "removed: CloudFormation then allows all outbound traffic", WIDENS)]
    return sg_rules(path, [] if before is MISSING else before, [] if after is MISSING else after)


def _opaque(path: str, before: Any, after: Any, created: bool, existed: bool) -> list[SecurityChange]:
    return [SecurityChange(path, f"{shown(before)} -> {shown(after)}", UNKNOWN)]


RULES: dict[str, Rule] = {
    POLICY: _policy, ENDPOINT_POLICY: _endpoint_policy, INLINE_POLICIES: _inline, ATTACHED: _attached,
    BOUNDARY: _boundary, ROLE: _role, CODE: _code, ENVIRONMENT: _environment, DEFINITION: _definition,
    NETWORK: _network, ISOLATION: _isolation, KEY: _key, URL_AUTH: _url_auth, SCOPE: _scope, TARGET: _scope,
    PUBLIC_ACCESS: _public, BUCKET_ENCRYPTION: _bucket_encryption, ACL: _acl, SG_RULES: _sg_rules, OPAQUE: _opaque,
}


# ---------------------------------------------------------------------------------------------
# Resources that are one grant or one rule
# ---------------------------------------------------------------------------------------------


def _whole(resource_type: str, rule: str, old: Mapping[str, Any] | None,
           new: Mapping[str, Any] | None) -> list[SecurityChange]:
    if rule == SG_RULE:
        return rule_resource_changes(old, new)
    principal, action, resource, conditions = GRANTS[resource_type]
    changed = [name for name in (principal, action, resource, *conditions)
               if (old or {}).get(name, MISSING) != (new or {}).get(name, MISSING)]
    return policy_changes(", ".join(changed), *(permission_document(side, *GRANTS[resource_type]) for side in (old, new)))


# ---------------------------------------------------------------------------------------------
# Types the table does not know
# ---------------------------------------------------------------------------------------------


def _unknown_type(resource_type: str, old: Mapping[str, Any], new: Mapping[str, Any],
                  resources: Mapping[str, Any]) -> list[SecurityChange]:
    found: list[SecurityChange] = []
    for name in sorted(set(old) | set(new)):
        before, after = old.get(name, MISSING), new.get(name, MISSING)
        if before == after:
            continue
        what = carries_access(name, _optional(after), resources) or carries_access(name, _optional(before), resources)
        if what:
            found.append(SecurityChange(name, f"{shown(before)} -> {shown(after)}: {resource_type} is a type this plan "
                                        f"does not judge, and this property carries {what}", UNKNOWN))
    return found


def carries_access(name: str, value: Any, resources: Mapping[str, Any]) -> str:
    """What in a property says it carries access ("" for nothing): a name with a word of
    :data:`ACCESS_WORDS`, a custom resource's handler, a policy document, a reference to an IAM
    resource of the template, an IAM role ARN."""
    lowered = name.lower()
    word = next((word for word in ACCESS_WORDS if word in lowered), None)
    if word is not None:
        return f"a {word} ({name})"
    if name == "ServiceToken":
        return "the function that handles it (ServiceToken)"
    if isinstance(value, Mapping):
        if len(value) == 1 and next(iter(value)) in ("Ref", "Fn::GetAtt"):
            target = value.get("Ref") or value.get("Fn::GetAtt")
            lid = str(target[0] if isinstance(target, list) else str(target).split(".")[0])
            kind = str((resources.get(lid) or {}).get("Type", ""))
            return f"a reference to {kind} {lid}" if kind.startswith("AWS::IAM::") else ""
        if "Statement" in value:
            return "a policy document"
        return next(filter(None, (carries_access(str(key), item, resources) for key, item in value.items())), "")
    if isinstance(value, list):
        return next(filter(None, (carries_access(name, item, resources) for item in value)), "")
    if isinstance(value, str) and _ROLE_ARN.search(value):
        return "an IAM role ARN"
    return ""


def _brief(text: str, limit: int = 140) -> str:
    """``text`` cut in the middle to ``limit`` characters: an ARN's or image's both ends show."""
    return text if len(text) <= limit else text[: limit // 3] + "…" + text[-(limit - limit // 3 - 1):]
