"""The customer-managed KMS keys of the stack: yearly rotation, a short deletion window when destroyed;
and the key policy statement that lets CloudWatch Logs encrypt log groups with such a key."""

from __future__ import annotations

from typing import cast

from aws_cdk import ArnFormat, Duration, RemovalPolicy, Stack
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms

from constructs import Construct

#: Days a destroyed key waits before deletion (the shortest KMS allows).
DESTROYED_KEY_WINDOW = Duration.days(7)
#: What CloudWatch Logs does with the key of an encrypted log group (CloudWatch Logs user guide,
#: "Encrypt log data in CloudWatch Logs using AWS KMS", step 2: the key policy).
LOGS_KEY_ACTIONS = ("kms:Encrypt*", "kms:Decrypt*", "kms:ReEncrypt*", "kms:GenerateDataKey*", "kms:Describe*")
LOGS_STATEMENT_SID = "AllowCloudWatchLogsOfThisAccountAndRegion"
#: Child construct that marks a key whose policy already has the CloudWatch Logs statement.
_LOGS_ALLOWED = "CloudWatchLogsAllowed"


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


def logs_key(key: kms.IKey | None) -> kms.IKey | None:
    """``key``, made usable for encrypting CloudWatch Logs log groups; None when there is no key
    or its policy is not managed by this app (an imported key), so it cannot be.

    The key policy gets one statement (once per key): the CloudWatch Logs service principal of
    the stack's region (``logs.<region>.<url suffix>``) may use the key only with the encryption
    context of a log group of the stack's account and region
    (``kms:EncryptionContext:aws:logs:arn`` like ``arn:<partition>:logs:<region>:<account>:log-group:*``).
    A log group's ARN cannot be named exactly: the group references the key, so the key cannot
    reference the group. Reading the logs still takes ``logs:GetLogEvents`` on the group.
    """
    if key is None:
        return None
    if key.node.try_find_child(_LOGS_ALLOWED) is not None:
        return key
    stack = Stack.of(key)
    log_groups = stack.format_arn(
        service="logs", resource="log-group", resource_name="*", arn_format=ArnFormat.COLON_RESOURCE_NAME
    )
    added = key.add_to_resource_policy(
        iam.PolicyStatement(
            sid=LOGS_STATEMENT_SID,
            principals=[iam.ServicePrincipal(f"logs.{stack.region}.{stack.url_suffix}")],
            actions=list(LOGS_KEY_ACTIONS),
            resources=["*"],
            conditions={"ArnLike": {"kms:EncryptionContext:aws:logs:arn": log_groups}},
        )
    )
    if not added.statement_added:
        return None
    Construct(cast(Construct, key), _LOGS_ALLOWED)
    return key
