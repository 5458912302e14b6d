"""Acknowledge cdk-nag findings next to the construct that causes them.

cdk-nag 3.x matches an acknowledgment by its exact id. A finding on a wildcard resource has the
form ``AwsSolutions-IAM5[Resource::<flattened ARN>]`` where the ARN is flattened the way cdk-nag
does it (``{"Fn::GetAtt": ["X", "Arn"]}`` -> ``<X.Arn>``, ``{"Ref": "X"}`` -> ``<X>``, ``Fn::Join``
joined). :func:`acknowledge_wildcard_resource` computes that id from the same token the policy
uses, so the acknowledgment stays exact (never a blanket ``AwsSolutions-IAM5``) and follows
logical-id changes.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from aws_cdk import Acknowledgment, Stack, Validations
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


def acknowledge(scope: IConstruct, rule_id: str, reason: str) -> None:
    """Acknowledge one rule (or one finding of a rule) on ``scope`` and its children."""
    Validations.of(scope).acknowledge(Acknowledgment(id=rule_id, reason=reason))


def acknowledge_wildcard_resource(scope: IConstruct, resource: Any, reason: str) -> None:
    """Acknowledge the ``AwsSolutions-IAM5`` finding for one wildcard resource of a policy."""
    acknowledge(scope, f"AwsSolutions-IAM5[Resource::{flatten_reference(scope, resource)}]", reason)


def acknowledge_wildcard_action(scope: IConstruct, action: str, reason: str) -> None:
    """Acknowledge the ``AwsSolutions-IAM5`` finding for one wildcard action of a policy."""
    acknowledge(scope, f"AwsSolutions-IAM5[Action::{action}]", reason)


def wildcard_policy(scope: Construct, id: str, role: iam.IRole, actions: Sequence[str], reason: str) -> iam.Policy:
    """A policy of ``role`` allowing ``actions`` on ``*`` (actions without resource-level
    permissions, such as the EC2 network-interface ones), with its finding acknowledged."""
    policy = iam.Policy(scope, id, roles=[role], statements=[iam.PolicyStatement(actions=list(actions), resources=["*"])])
    acknowledge_wildcard_resource(policy, "*", reason)
    return policy
