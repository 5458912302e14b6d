"""Acknowledge cdk-nag findings next to the construct that causes them.

cdk-nag 3.x matches an acknowledgment by its exact id. A finding on a wildcard resource has the
form ``AwsSolutions-IAM5[Resource::<flattened ARN>]`` where the ARN is flattened the way cdk-nag
does it (``{"Fn::GetAtt": ["X", "Arn"]}`` -> ``<X.Arn>``, ``{"Ref": "X"}`` -> ``<X>``, ``Fn::Join``
joined). :func:`acknowledge_wildcard_resource` computes that id from the same token the policy
uses, so the acknowledgment stays exact (never a blanket ``AwsSolutions-IAM5``) and follows
logical-id changes.

The same acknowledgment also answers the IaC scanner checkov where it reports the same thing:
``checkov=`` names its check ids, and the reason is written once more, on the CloudFormation
resource, the way checkov reads it (``Metadata.checkov.skip``: ``[{"id": ..., "comment": ...}]``).
A finding only checkov reports (no cdk-nag rule says the same) is skipped with
:func:`skip_checkov`. Either way the reason lives in one place, next to the construct.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, cast

from aws_cdk import Acknowledgment, CfnResource, Stack, Validations
from aws_cdk import aws_iam as iam

from constructs import Construct, IConstruct


def flatten_reference(scope: IConstruct, value: Any) -> str:
    """The string cdk-nag prints for a (possibly tokenized) policy resource."""

    def visit(node: Any) -> str:
        if node is None:
            return ""
        if isinstance(node, str):
            return node.replace("${", "<").replace("}", ">")
        if isinstance(node, dict):
            if "Fn::Join" in node:
                delimiter, items = node["Fn::Join"]
                return delimiter.join(visit(item) for item in items)
            if "Fn::Sub" in node:
                return visit(node["Fn::Sub"])
            if "Fn::GetAtt" in node:
                resource, attribute = node["Fn::GetAtt"]
                return f"<{visit(resource)}.{visit(attribute)}>"
            if "Fn::ImportValue" in node:
                return visit(node["Fn::ImportValue"])
            if "Ref" in node:
                return f"<{visit(node['Ref'])}>"
        return json.dumps(node, separators=(",", ":"))

    return visit(Stack.of(scope).resolve(value))


#: The template metadata key checkov reads its inline suppressions from.
CHECKOV_METADATA_KEY = "checkov"


def _cfn_resources(scope: IConstruct, resource_type: str | None) -> list[CfnResource]:
    """The CloudFormation resources a skip on ``scope`` applies to: ``scope`` itself when it is
    one; else those of ``resource_type`` under it; else its default child."""
    if CfnResource.is_cfn_resource(scope):
        candidates: list[IConstruct] = [scope]
    elif resource_type is not None:
        candidates = scope.node.find_all()
    else:
        default = scope.node.default_child
        candidates = [default] if default is not None else []
    found = [
        cast(CfnResource, candidate) for candidate in candidates
        if CfnResource.is_cfn_resource(candidate)
        and resource_type in (None, cast(CfnResource, candidate).cfn_resource_type)
    ]
    if not found:
        raise ValueError(f"{scope.node.path}: no {resource_type or 'CloudFormation'} resource to record a checkov skip on")
    return found


def skip_checkov(scope: IConstruct, check_ids: Sequence[str], reason: str, *, resource_type: str | None = None) -> None:
    """Record that checkov's ``check_ids`` do not apply to the CloudFormation resource of
    ``scope`` (or to each of its resources of ``resource_type``), with ``reason``, in the
    resource's ``Metadata.checkov.skip`` (where checkov reads it). One reason per check and
    resource: recording another reason for the same check is a mistake and raises."""
    for resource in _cfn_resources(scope, resource_type):
        metadata = resource.get_metadata(CHECKOV_METADATA_KEY) or {}
        skips = list(metadata.get("skip", []))
        for check_id in check_ids:
            recorded = next((skip for skip in skips if skip["id"] == check_id), None)
            if recorded is None:
                skips.append({"id": check_id, "comment": reason})
            elif recorded["comment"] != reason:
                raise ValueError(f"{resource.node.path}: {check_id} is already skipped for another reason")
        resource.add_metadata(CHECKOV_METADATA_KEY, {**metadata, "skip": skips})


def skip_cdk_provider_checks(scope: IConstruct, provider_id: str, purpose: str, calls: str) -> None:
    """Skip checkov's reserved-concurrency, dead-letter-queue and VPC checks on the function of
    the CDK-internal custom resource provider ``provider_id`` of ``scope``'s stack (one per stack,
    a plain ``CfnResource``: CDK exposes none of these options for it). ``purpose``: what it does;
    ``calls``: the APIs it calls."""
    provider = Stack.of(scope).node.try_find_child(provider_id)
    handler = provider.node.try_find_child("Handler") if provider is not None else None
    if handler is None:
        return
    skip_checkov(handler, ["CKV_AWS_115"], (
        f"CDK's built-in provider that {purpose}: it runs only when CloudFormation creates, updates or "
        "deletes its custom resources; a reserved concurrency would withhold capacity from the "
        "account's other functions at all times and protect nothing."
    ))
    skip_checkov(handler, ["CKV_AWS_116"], (
        f"CDK's built-in provider that {purpose}: CloudFormation invokes it asynchronously with a "
        "pre-signed response URL and waits for the answer; a failure past Lambda's retries fails that "
        "resource and rolls the stack back, visibly in the stack events, and the retried deployment "
        "redoes the work: there is nothing for a dead-letter queue to keep."
    ))
    skip_checkov(handler, ["CKV_AWS_117"], (
        f"CDK's built-in provider that {purpose}: it calls only {calls} and CloudFormation's pre-signed "
        "S3 response URL, over TLS with signed requests, and serves no network endpoint."
    ))


def acknowledge(
    scope: IConstruct,
    rule_id: str,
    reason: str,
    *,
    checkov: Sequence[str] = (),
    resource_type: str | None = None,
) -> None:
    """Acknowledge one rule (or one finding of a rule) on ``scope`` and its children; with
    ``checkov``, skip those checkov checks for the same reason (see :func:`skip_checkov`)."""
    Validations.of(scope).acknowledge(Acknowledgment(id=rule_id, reason=reason))
    if checkov:
        skip_checkov(scope, checkov, reason, resource_type=resource_type)


def acknowledge_wildcard_resource(
    scope: IConstruct,
    resource: Any,
    reason: str,
    *,
    checkov: Sequence[str] = (),
    resource_type: str | None = None,
) -> None:
    """Acknowledge the ``AwsSolutions-IAM5`` finding for one wildcard resource of a policy (and
    the ``checkov`` checks that report the same wildcard)."""
    acknowledge(
        scope,
        f"AwsSolutions-IAM5[Resource::{flatten_reference(scope, resource)}]",
        reason,
        checkov=checkov,
        resource_type=resource_type,
    )


def acknowledge_wildcard_action(scope: IConstruct, action: str, reason: str) -> None:
    """Acknowledge the ``AwsSolutions-IAM5`` finding for one wildcard action of a policy."""
    acknowledge(scope, f"AwsSolutions-IAM5[Action::{action}]", reason)


def wildcard_policy(
    scope: Construct, id: str, role: iam.IRole, actions: Sequence[str], reason: str, *, checkov: Sequence[str] = ()
) -> iam.Policy:
    """A policy of ``role`` allowing ``actions`` on ``*`` (actions without resource-level
    permissions, such as the EC2 network-interface ones), with its finding acknowledged (and the
    ``checkov`` checks that report the same wildcard skipped on the policy)."""
    policy = iam.Policy(scope, id, roles=[role], statements=[iam.PolicyStatement(actions=list(actions), resources=["*"])])
    acknowledge_wildcard_resource(policy, "*", reason, checkov=checkov)
    return policy
