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

The compliance packs (issue 59): cdk-nag's ``HIPAA.Security``, ``NIST.800.53.R5`` and
``PCI.DSS.321`` share rule names, and a rule may be in some of them only (:data:`PACK_RULES`).
:func:`acknowledge_in_packs` acknowledges one rule on one resource in each pack that has it. A
checkov skip whose check is the same as a pack rule (:data:`CHECKOV_PACK_RULES`: reserved
concurrency, dead-letter queue, VPC placement, log group encryption) acknowledges that rule too,
with the same reason, on the resource cdk-nag checks (its L1 class).

With the context key :data:`AUDIT_CONTEXT_KEY` true (the tests), an acknowledgment is recorded
on its construct (metadata :data:`AUDIT_METADATA_KEY`) instead of made: the packs then report
every finding, and :func:`make_audited` makes the recorded acknowledgments afterwards, so that
a test can check each of them against a finding (tests/test_compliance_packs.py).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, cast

import jsii
from aws_cdk import (
    Acknowledgment,
    CfnResource,
    DefaultTokenResolver,
    IFragmentConcatenator,
    IPostProcessor,
    IResolvable,
    IResolveContext,
    Reference,
    Stack,
    StringConcat,
    Tokenization,
    Validations,
)
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs

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

    stack = Stack.of(scope)
    foreign = _ForeignReferences(stack, StringConcat())
    Tokenization.resolve(value, scope=stack, resolver=foreign)
    if not foreign.seen:
        return visit(stack.resolve(value))
    # A reference to another stack of the app: in the template it is the Fn::ImportValue of the
    # producer's export (CDK's strong cross-stack reference), which cdk-nag flattens to its name.
    return visit(Tokenization.resolve(value, scope=stack, resolver=_ForeignReferences(stack, _JoinConcat(),
                                                                                       substitute=True)))


#: The CDK's context key of the cross-stack reference strength (strong unless set).
CROSS_STACK_STRENGTH_KEY = "@aws-cdk/core:defaultCrossStackReferences"


class _ForeignReferences(DefaultTokenResolver):
    """Resolves tokens as the stack does; notes each reference to another stack's resource and,
    with ``substitute``, resolves it to the ``Fn::ImportValue`` CDK will write for it (the same
    export: ``Stack.export_value`` is what CDK's own cross-stack resolution calls)."""

    def __init__(self, consumer: Stack, concat: IFragmentConcatenator, *, substitute: bool = False) -> None:
        super().__init__(concat)
        self.consumer, self.substitute, self.seen = consumer, substitute, False

    def resolve_token(self, t: IResolvable, context: IResolveContext, post_processor: IPostProcessor) -> Any:
        if isinstance(t, Reference):
            producer = Stack.of(t.target)
            strength = self.consumer.node.try_get_context(CROSS_STACK_STRENGTH_KEY)
            if (producer is not self.consumer and producer.node.root is self.consumer.node.root
                    and producer.nested_stack_parent is None and self.consumer.nested_stack_parent is None
                    and strength in (None, "strong")
                    and producer.resolve(producer.account) == self.consumer.resolve(self.consumer.account)
                    and producer.resolve(producer.region) == self.consumer.resolve(self.consumer.region)):
                self.seen = True
                if self.substitute:
                    return self.consumer.resolve(producer.export_value(t))
        return super().resolve_token(t, context, post_processor)


@jsii.implements(IFragmentConcatenator)
class _JoinConcat:
    """Joins resolved fragments as CloudFormation does (``Fn::Join`` around anything not a string)."""

    def join(self, left: Any, right: Any) -> Any:
        if left is None or right is None:
            return right if left is None else left
        if isinstance(left, str) and isinstance(right, str):
            return left + right
        return {"Fn::Join": ["", [left, right]]}


#: The template metadata key checkov reads its inline suppressions from.
CHECKOV_METADATA_KEY = "checkov"

#: cdk-nag's compliance packs (their rule ids are ``<pack>-<rule>``).
HIPAA, NIST, PCI = "HIPAA.Security", "NIST.800.53.R5", "PCI.DSS.321"
#: The packs that have each rule this project acknowledges (cdk-nag 3.0.2's ``lib/packs``).
PACK_RULES: dict[str, tuple[str, ...]] = {
    "IAMNoInlinePolicy": (HIPAA, NIST, PCI),
    "LambdaConcurrency": (HIPAA, NIST),
    "LambdaDLQ": (HIPAA, NIST),
    "LambdaInsideVPC": (HIPAA, NIST, PCI),
    "CloudWatchLogGroupEncrypted": (HIPAA, NIST, PCI),
    "CloudWatchAlarmAction": (HIPAA, NIST),
    "S3BucketReplicationEnabled": (HIPAA, NIST, PCI),
    "S3DefaultEncryptionKMS": (HIPAA, NIST, PCI),
    "SageMakerEndpointConfigurationKMSKeyConfigured": (HIPAA, NIST, PCI),
    "CodeBuildProjectSourceRepoUrl": (HIPAA, PCI),
}
#: checkov checks that say what a pack rule says, and the L1 class the rule checks: a skip of the
#: check on such a resource acknowledges the rule with the same reason.
CHECKOV_PACK_RULES: dict[str, tuple[str, type]] = {
    "CKV_AWS_115": ("LambdaConcurrency", lambda_.CfnFunction),
    "CKV_AWS_116": ("LambdaDLQ", lambda_.CfnFunction),
    "CKV_AWS_117": ("LambdaInsideVPC", lambda_.CfnFunction),
    "CKV_AWS_158": ("CloudWatchLogGroupEncrypted", logs.CfnLogGroup),
}
#: The sources the reasons below cite (checked: docs/security.md, "Compliance packs").
CREATE_ENDPOINT_CONFIG_URL = "https://docs.aws.amazon.com/sagemaker/latest/APIReference/API_CreateEndpointConfig.html"
SERVER_ACCESS_LOGGING_URL = "https://docs.aws.amazon.com/AmazonS3/latest/userguide/enable-server-access-logging.html"
#: Why an endpoint config on an instance type with local NVMe storage has no KmsKeyId.
INSTANCE_STORE_KEY_REASON = (
    "The fleet's instance type has local NVMe instance storage (ml.g4dn, ml.g5), which the instance's hardware "
    "module encrypts; the SageMaker API reference of CreateEndpointConfig, KmsKeyId: 'You can't request a "
    "KmsKeyId when using an instance type with local storage' and the call fails if one is given "
    f"({CREATE_ENDPOINT_CONFIG_URL}). EBS-backed types (ml.p2, ml.p3) get the bucket's key."
)
#: Why a bucket that receives server access logs is encrypted with SSE-S3 (S3DefaultEncryptionKMS).
ACCESS_LOG_ENCRYPTION_REASON = (
    "This bucket receives S3 server access logs; the S3 user guide, Enabling Amazon S3 server access logging: "
    "default bucket encryption on the destination bucket only with SSE-S3 (AES-256), default SSE-KMS is not "
    f"supported ({SERVER_ACCESS_LOGGING_URL}). Its objects are encrypted at rest with SSE-S3."
)
#: Why the model bucket has no replication rule (S3BucketReplicationEnabled).
MODEL_REPLICATION_REASON = (
    "What this bucket holds is derived: the build makes every served object, release index and route from the "
    "manifest's sources at deploy, and a redeploy into another region rebuilds them; the bucket is versioned "
    "(noncurrent_version_expiration_days). A replica in a second region needs a destination bucket, the "
    "team's to choose: give it as replica_bucket and this bucket replicates into it."
)
#: Why the access-log bucket has no replication rule (S3BucketReplicationEnabled).
ACCESS_LOG_REPLICATION_REASON = (
    "The model bucket's server access logs stay in the stack's region, versioned for "
    "noncurrent_version_expiration_days and kept for access_log_expiration_days; S3 server access logs are "
    "delivered on a best-effort basis and are not the audit record of the data (CloudTrail data events are). "
    "A second copy in another region needs a destination bucket, the team's to choose: give it as replica_bucket."
)
#: With this context key true, acknowledgments are recorded, not made (see the module docs).
AUDIT_CONTEXT_KEY = "triton-mme:nag-audit"
#: The construct metadata type of a recorded acknowledgment (``{"id": ..., "reason": ...}``).
AUDIT_METADATA_KEY = "triton-mme:acknowledgment"
#: Why an inline policy of the construct is not a customer managed one (IAMNoInlinePolicy).
INLINE_POLICY_REASON = (
    "This policy is attached to one role of this stack and to no other identity, is created, changed and "
    "deleted with that role, and names this stack's resources (the CDK writes a role's grants this way). A "
    "customer managed policy would be a separate object that other users, groups and roles could be "
    "attached to. Every statement is read by the policy linter parliament (tests/test_parliament.py)."
)


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
            else:
                continue
            rule, checked = CHECKOV_PACK_RULES.get(check_id, ("", type(None)))
            if isinstance(resource, checked):
                acknowledge_in_packs(resource, rule, reason)
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
    if scope.node.try_get_context(AUDIT_CONTEXT_KEY) is True:
        scope.node.add_metadata(AUDIT_METADATA_KEY, {"id": rule_id, "reason": reason})
    else:
        Validations.of(scope).acknowledge(Acknowledgment(id=rule_id, reason=reason))
    if checkov:
        skip_checkov(scope, checkov, reason, resource_type=resource_type)


def acknowledge_in_packs(scope: IConstruct, rule: str, reason: str) -> None:
    """Acknowledge the compliance rule ``rule`` (``LambdaDLQ``) on ``scope`` in each pack of
    :data:`PACK_RULES` that has it."""
    for pack in PACK_RULES[rule]:
        acknowledge(scope, f"{pack}-{rule}", reason)


def acknowledge_inline_policies(scope: IConstruct, reason: str = INLINE_POLICY_REASON, *,
                                skip: Sequence[IConstruct] = ()) -> list[str]:
    """Acknowledge ``IAMNoInlinePolicy`` on each ``AWS::IAM::Policy`` under ``scope`` but those
    under ``skip`` (each by itself; a policy added later is not covered, and the packs report it).
    Returns their paths."""
    skipped = tuple(f"{node.node.path}/" for node in skip)
    policies = [node for node in scope.node.find_all()
                if isinstance(node, iam.CfnPolicy) and not node.node.path.startswith(skipped)]
    for policy in policies:
        acknowledge_in_packs(policy, "IAMNoInlinePolicy", reason)
    return [policy.node.path for policy in policies]


def audited(root: IConstruct) -> list[tuple[IConstruct, str, str]]:
    """The acknowledgments recorded under ``root`` in audit mode: (construct, rule id, reason)."""
    return [(node, entry.data["id"], entry.data["reason"]) for node in root.node.find_all()
            for entry in node.node.metadata if entry.type == AUDIT_METADATA_KEY]


def make_audited(root: IConstruct) -> list[tuple[IConstruct, str, str]]:
    """Make the acknowledgments recorded under ``root`` (after the packs reported every finding)."""
    recorded = audited(root)
    for node, rule_id, reason in recorded:
        Validations.of(node).acknowledge(Acknowledgment(id=rule_id, reason=reason))
    return recorded


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
