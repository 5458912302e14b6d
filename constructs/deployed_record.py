"""The deployed record (:mod:`model_build.release.deployed`) of one endpoint, computed while its stack
synthesizes: the recorded resources under the endpoint's construct, and what they reference.

Why a lazy value: the record is what the template will say about the fleet and the data, and that
is only known once every construct, aspect and tag has been applied. The value is produced when
CloudFormation's template is rendered: each recorded resource's properties are resolved and rendered
as ``CfnResource`` renders them, so the record equals the template's own resources (a test checks
this on every settings variant). It is a plain JSON string in the template: CloudFormation resolves
nothing in it, and it changes exactly when a recorded resource does.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jsii
from aws_cdk import CfnMapping, CfnResource, IStableStringProducer, Lazy, Stack

from constructs import Construct
from triton_mme_cdk.model_build.release.deployed import RECORD_TYPES, make_record, record_json, references

#: ``CfnDeletionPolicy`` members as the template writes them.
_POLICIES = {"DELETE": "Delete", "RETAIN": "Retain", "SNAPSHOT": "Snapshot",
             "RETAIN_EXCEPT_ON_CREATE": "RetainExceptOnCreate"}


@jsii.implements(IStableStringProducer)
class _RecordProducer:
    def __init__(self, scope: Construct, mappings: Mapping[CfnMapping, Mapping[str, Any]]) -> None:
        self._scope = scope
        self._mappings = mappings

    def produce(self) -> str:
        stack = Stack.of(self._scope)
        by_id: dict[str, CfnResource] = {}
        for node in stack.node.find_all():
            if isinstance(node, CfnResource) and Stack.of(node) is stack:
                by_id[stack.resolve(node.logical_id)] = node
        todo = [stack.resolve(node.logical_id) for node in self._scope.node.find_all()
                if isinstance(node, CfnResource) and Stack.of(node) is stack and node.cfn_resource_type in RECORD_TYPES]
        rendered: dict[str, dict[str, Any]] = {}
        while todo:
            lid = todo.pop()
            if lid in rendered or lid not in by_id:
                continue
            rendered[lid] = _rendered(stack, by_id[lid])
            todo.extend(references(rendered[lid].get("Properties") or {}))
        mappings = {stack.resolve(mapping.logical_id): dict(content) for mapping, content in self._mappings.items()}
        return record_json(make_record(rendered, mappings))


def _rendered(stack: Stack, node: CfnResource) -> dict[str, Any]:
    """``node`` as the template holds it: type, rendered properties, deletion policies."""
    properties = stack.resolve(node._render_properties(stack.resolve(node._cfn_properties)))
    resource: dict[str, Any] = {"Type": node.cfn_resource_type}
    if properties:
        resource["Properties"] = properties
    options = node.cfn_options
    for attribute, policy in (("DeletionPolicy", options.deletion_policy),
                              ("UpdateReplacePolicy", options.update_replace_policy)):
        if policy is not None:
            resource[attribute] = _POLICIES[policy.name if hasattr(policy, "name") else str(policy)]
    return resource


def deployed_record(scope: Construct, mappings: Mapping[CfnMapping, Mapping[str, Any]]) -> str:
    """A token for the deployed record of the resources under ``scope`` (JSON text): an endpoint's
    construct, or a whole stack. ``mappings``: the content of every mapping a recorded resource
    reads (the synth fails naming one that is missing)."""
    return Lazy.string(_RecordProducer(scope, mappings))
