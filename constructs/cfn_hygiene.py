"""Small template fixes for what CDK L2 constructs render, so that cfn-lint has nothing to say.

``lambda.Function`` and the Provider framework's state machine depend explicitly on their role
(``DependsOn`` the role and its default policy) although their ``Role`` property already
references it with ``Fn::GetAtt``; cfn-lint reports the role entry as an obsolete ``DependsOn``
(W3005). :func:`drop_referenced_dependencies` renders ``DependsOn`` without the given resources,
computed at synthesis from the dependencies CDK resolved, so a dependency CDK adds later is kept.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import jsii
from aws_cdk import CfnResource, IResolveContext, IStableAnyProducer, Lazy, Stack

from constructs import IConstruct


def _cfn_paths(constructs: Iterable[IConstruct | None]) -> set[str]:
    paths: set[str] = set()
    for construct in constructs:
        if construct is None:
            continue
        for child in construct.node.find_all():
            if isinstance(child, CfnResource):
                paths.add(child.node.path)
    return paths


@jsii.implements(IStableAnyProducer)
class _DependsOn:
    def __init__(self, resource: CfnResource, dropped: set[str]) -> None:
        self._resource = resource
        self._dropped = dropped

    def produce(self, context: IResolveContext | None = None) -> list[str] | None:
        """The logical ids to depend on, sorted; None (no ``DependsOn``) when none is left."""
        stack = Stack.of(self._resource)
        kept = {
            stack.resolve(stack.get_logical_id(dependency))
            for dependency in self._resource.obtain_dependencies()
            if isinstance(dependency, CfnResource) and dependency.node.path not in self._dropped
        }
        return sorted(kept) or None


def drop_referenced_dependencies(resource: Any, referenced: Iterable[IConstruct | None]) -> None:
    """Render ``resource``'s ``DependsOn`` without the CloudFormation resources of ``referenced``
    (which its properties already reference, so the order is unchanged)."""
    cfn = resource if isinstance(resource, CfnResource) else resource.node.default_child
    if not isinstance(cfn, CfnResource):
        raise TypeError(f"{resource.node.path}: no CloudFormation resource to fix")
    dropped = _cfn_paths(referenced)
    cfn.add_override("DependsOn", Lazy.any(_DependsOn(cfn, dropped)))


def drop_provider_role_dependency(scope: IConstruct, provider_id: str) -> None:
    """The CDK-internal custom resource provider ``provider_id`` of ``scope``'s stack (one per
    stack) depends on its role both explicitly and through ``Fn::GetAtt``; keep the ``GetAtt``
    only (cfn-lint W3005)."""
    provider = Stack.of(scope).node.try_find_child(provider_id)
    if provider is None:
        return
    handler = provider.node.try_find_child("Handler")
    role = provider.node.try_find_child("Role")
    if handler is not None and role is not None:
        drop_referenced_dependencies(handler, [role])
