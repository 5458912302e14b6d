"""The cdk-nag findings of the delivery pipeline's stack, each acknowledged with its reason.

CDK Pipelines writes the pipeline's roles and their policies itself: read and write of its own
artifact bucket and key, CodeBuild's log streams and report groups of each project, assuming the
CDK bootstrap roles. Their wildcards are CDK's grants of those resources, not choices of this
app. :func:`acknowledge_pipeline_grants` walks every policy of the stack once it is built and
acknowledges each wildcard it knows, by its exact finding id; a wildcard it does not know raises,
so a new grant is read by a person before it is acknowledged.

:func:`acknowledge_pipeline_compliance` does the same for the compliance packs (issue 59): each
inline policy of the stack and its stages (``IAMNoInlinePolicy``), each CodeBuild project whose
source is CodePipeline's artifact (``CodeBuildProjectSourceRepoUrl``; another source raises), and
the artifact store's two buckets.
"""

from __future__ import annotations

import re
from typing import Any

from aws_cdk import Stack
from aws_cdk import aws_codebuild as codebuild
from aws_cdk import aws_iam as iam
from aws_cdk import aws_s3 as s3

from constructs import IConstruct
from triton_mme_cdk.constructs.multi_model_endpoint import TritonMultiModelEndpoint
from triton_mme_cdk.constructs.nag_acknowledgments import (
    ACCESS_LOG_ENCRYPTION_REASON,
    acknowledge,
    acknowledge_in_packs,
    acknowledge_inline_policies,
    acknowledge_wildcard_action,
    flatten_reference,
    skip_checkov,
)

#: Wildcard actions CDK's bucket and key grants write, by prefix of the action.
ACTION_REASONS: dict[str, str] = {
    "s3:": "CDK's grant of the pipeline's own artifact bucket (Bucket.grantRead/grantReadWrite): these "
           "object and bucket actions apply to that bucket and its objects only.",
    "kms:": "CDK's grant of the artifact bucket's KMS key (Key.grantEncryptDecrypt): this key only.",
}
#: Wildcard resources, by a pattern of their flattened form.
RESOURCE_REASONS: tuple[tuple[str, str], ...] = (
    (r"^<Artifacts[A-Za-z0-9]*\.Arn>/\*$",
     "The objects of the pipeline's own artifact bucket: their keys are chosen per execution."),
    (r"^arn:[^:]+:logs:[^:]+:[0-9]+:log-group:/aws/codebuild/<[A-Za-z0-9]+>:\*$",
     "The log streams of this CodeBuild project's own log group (CodeBuild names a stream per build)."),
    (r"^arn:[^:]+:logs:[^:]+:[0-9]+:log-group:/aws/codebuild/\*$",
     "CDK Pipelines' asset-publishing projects, one per asset, named at synth: their log groups."),
    (r"^arn:[^:]+:codebuild:[^:]+:[0-9]+:report-group/<[A-Za-z0-9]+>-\*$",
     "Test report groups of this CodeBuild project (CDK's default grant; named after the project)."),
    (r"^arn:[^:]+:codebuild:[^:]+:[0-9]+:report-group/\*$",
     "Report groups of CDK Pipelines' asset-publishing projects, one per asset, named at synth."),
    (r"^arn:\*:iam::[0-9]+:role/\*$",
     "Assumes the CDK bootstrap roles only (conditioned on their aws-cdk:bootstrap-role tag) to publish "
     "assets and read the stack's state, the CDK Pipelines way."),
    (r"^arn:<AWS::Partition>:cloudformation:<AWS::Region>:<AWS::AccountId>:stack/[A-Za-z0-9-]+/\*$",
     "The pipeline stack's own template (the self-mutation hold reads it): a stack ARN ends with its id, "
     "known only once it exists; the name is fixed."),
    (r"^\*$", "The actions of this statement support no resource-level permissions."),
)


#: Why CDK Pipelines' asset-publishing roles may start builds on any project (checkov CKV_AWS_111).
START_BUILDS = ("CDK Pipelines' asset-publishing role starts, stops and reads the builds of the publishing projects "
                "it creates (one per asset, named at synth); CDK writes this grant with Resource '*'.")


def as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def _reason(resource: str) -> str | None:
    return next((reason for pattern, reason in RESOURCE_REASONS if re.match(pattern, resource)), None)


def acknowledge_pipeline_grants(stack: Stack) -> list[str]:
    """Acknowledge every wildcard of every policy in ``stack``; returns the finding ids."""
    found: list[str] = []
    for node in stack.node.find_all():
        if not isinstance(node, iam.CfnPolicy) or Stack.of(node) is not stack:
            continue  # the stages' stacks acknowledge their own
        document: Any = stack.resolve(node.policy_document)
        for statement in document.get("Statement", []):
            actions = statement.get("Action", [])
            for action in [actions] if isinstance(actions, str) else actions:
                if "*" in action:
                    reason = next((r for prefix, r in ACTION_REASONS.items() if action.startswith(prefix)), None)
                    if reason is None:
                        raise ValueError(f"{node.node.path}: wildcard action {action} has no recorded reason")
                    acknowledge_wildcard_action(node, action, reason)
                    found.append(f"Action::{action}")
            resources = statement.get("Resource", [])
            for resource in [resources] if not isinstance(resources, list) else resources:
                flat = flatten_reference(node, resource)
                if "*" not in flat:
                    continue
                reason = _reason(flat)
                if reason is None:
                    raise ValueError(f"{node.node.path}: wildcard resource {flat} has no recorded reason")
                _acknowledge_resource(node, flat, reason)
                found.append(f"Resource::{flat}")
                if flat == "*" and any(str(a).startswith("codebuild:StartBuild") for a in as_list(actions)):
                    skip_checkov(node, ["CKV_AWS_111"], START_BUILDS)
    return found


def _acknowledge_resource(scope: IConstruct, flat: str, reason: str) -> None:
    acknowledge(scope, f"AwsSolutions-IAM5[Resource::{flat}]", reason)


#: Why a CodeBuild project of the pipeline has no source credentials (CodeBuildProjectSourceRepoUrl).
CODEPIPELINE_SOURCE_REASON = (
    "The project's source is the CodePipeline artifact of its action (Source.Type CODEPIPELINE), not a GitHub or "
    "Bitbucket URL: the project holds no repository credentials at all; the repository is read once, by the "
    "pipeline's source action through its CodeConnections connection (or CodeCommit)."
)
#: Why the pipeline's artifact store is not replicated (S3BucketReplicationEnabled).
ARTIFACTS_REPLICATION_REASON = (
    "The artifact store holds what each pipeline execution makes again from the source repository (the cloud "
    "assembly, the plans); the repository is the record. It is versioned and keeps noncurrent versions 30 days."
)
ARTIFACT_LOGS_REPLICATION_REASON = (
    "The artifact store's server access logs stay in the pipeline's region, versioned and kept 365 days; S3 "
    "delivers server access logs on a best-effort basis. A copy in another region is the team's choice of a "
    "destination, which this app does not make."
)


def acknowledge_pipeline_compliance(stack: Stack, artifacts: s3.IBucket, access_logs: s3.IBucket) -> None:
    """Acknowledge the compliance packs' findings of the pipeline's stack and of its stages' stacks
    that are no endpoint's (the endpoint construct acknowledges its own)."""
    acknowledge_inline_policies(stack, skip=[node for node in stack.node.find_all()
                                             if isinstance(node, TritonMultiModelEndpoint)])
    for node in stack.node.find_all():
        if isinstance(node, codebuild.CfnProject):
            source: Any = stack.resolve(node.source)
            if source.get("type") != "CODEPIPELINE":
                raise ValueError(f"{node.node.path}: source {source.get('type')} has no recorded reason")
            acknowledge_in_packs(node, "CodeBuildProjectSourceRepoUrl", CODEPIPELINE_SOURCE_REASON)
    acknowledge_in_packs(artifacts, "S3BucketReplicationEnabled", ARTIFACTS_REPLICATION_REASON)
    acknowledge_in_packs(access_logs, "S3BucketReplicationEnabled", ARTIFACT_LOGS_REPLICATION_REASON)
    acknowledge_in_packs(access_logs, "S3DefaultEncryptionKMS", ACCESS_LOG_ENCRYPTION_REASON)
