"""The customer-managed KMS keys of the stack: yearly rotation, a short deletion window when destroyed."""

from __future__ import annotations

from aws_cdk import Duration, RemovalPolicy
from aws_cdk import aws_kms as kms

from constructs import Construct

#: Days a destroyed key waits before deletion (the shortest KMS allows).
DESTROYED_KEY_WINDOW = Duration.days(7)


def customer_key(scope: Construct, id: str, *, description: str, removal_policy: RemovalPolicy) -> kms.Key:
    """A customer-managed key with rotation on; with ``RemovalPolicy.DESTROY`` it enters its 7-day
    deletion window when the stack is deleted."""
    return kms.Key(
        scope,
        id,
        description=description,
        enable_key_rotation=True,
        removal_policy=removal_policy,
        pending_window=DESTROYED_KEY_WINDOW if removal_policy == RemovalPolicy.DESTROY else None,
    )
