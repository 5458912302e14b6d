"""Cost-allocation tags on every taggable resource of a scope."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jsii
from aws_cdk import Aspects, CfnResource, IAspect, TagManager, Tags

from constructs import IConstruct

#: The tag keys, in this order (activate them as cost allocation tags in the Billing console).
COST_TAG_KEYS: tuple[str, ...] = ("Project", "Environment", "Owner")

#: CloudFormation types that take a ``Tags`` list but that CDK creates as plain ``CfnResource``s
#: (no tag manager), so ``Tags.of`` does not reach them: the Lambda function and role of
#: CDK-internal custom resource providers (``Custom::S3AutoDeleteObjects``,
#: ``Custom::VpcRestrictDefaultSG``...).
_PLAIN_TAGGABLE_TYPES: frozenset[str] = frozenset({"AWS::IAM::Role", "AWS::Lambda::Function"})


@jsii.implements(IAspect)
class _TagPlainResources:
    """Add ``Tags`` to the plain ``CfnResource``s of :data:`_PLAIN_TAGGABLE_TYPES`."""

    def __init__(self, tags: Mapping[str, str]) -> None:
        self._tags = dict(tags)

    def visit(self, node: IConstruct) -> None:
        if not isinstance(node, CfnResource) or TagManager.is_taggable(node):
            return
        if node.cfn_resource_type not in _PLAIN_TAGGABLE_TYPES:
            return
        tags: list[dict[str, Any]] = [{"Key": key, "Value": value} for key, value in self._tags.items()]
        node.add_property_override("Tags", tags)


def apply_cost_tags(scope: IConstruct, tags: Mapping[str, str]) -> None:
    """Tag every taggable resource under ``scope`` with ``tags`` (``Tags.of``), including the
    plain resources of CDK's own custom resource providers."""
    for key, value in tags.items():
        Tags.of(scope).add(key, value)
    Aspects.of(scope).add(_TagPlainResources(tags))
