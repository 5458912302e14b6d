"""Replication of the created model bucket and its access-log bucket to a bucket of the team's
(``replica_bucket``; the compliance packs' ``S3BucketReplicationEnabled``, issue 59).

S3 replicates each new object version, delete marker included, with a role S3 assumes. The role
is this module's: CDK's own (``Bucket(replication_rules=...)`` without a role) is named
``CDKReplicationRole`` unless the app sets ``@aws-cdk/aws-s3:setUniqueReplicationRoleName``, a
name two stacks of one account cannot both have. Its grants are CDK's
(``Bucket.grant_replication_permission``): read the source's replication configuration and object
versions, decrypt with the source key, replicate into the destination and encrypt with its key.
The destination (versioned, in the region of the team's choice) and its key policy are the team's.
"""

from __future__ import annotations

from typing import Any

from aws_cdk import Aws
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_s3 as s3

from constructs import Construct
from triton_mme_cdk.constructs.nag_acknowledgments import (
    ACCESS_LOG_REPLICATION_REASON,
    MODEL_REPLICATION_REASON,
    acknowledge_in_packs,
    acknowledge_wildcard_action,
    acknowledge_wildcard_resource,
)

#: The ``replica_bucket`` keyword (``ModelBucketProps.replica``).
REPLICA_DESCRIPTION = (
    "A versioned bucket of yours (another region, its key as encryption_key of the IBucket) that the created "
    "bucket and its access-log bucket replicate every object version to (the compliance packs' "
    "S3BucketReplicationEnabled). Unset: no replication. Refused with bucket (yours replicates as you set it)."
)


def replicate_or_acknowledge(role: iam.Role | None, replica: s3.IBucket | None, *, bucket: s3.Bucket,
                             key: kms.IKey, access_logs: s3.Bucket) -> None:
    """With a replica: the replication grants of the model bucket and its access-log bucket on
    ``role``; without: each bucket's ``S3BucketReplicationEnabled`` acknowledged with its reason."""
    if role is None or replica is None:
        acknowledge_in_packs(bucket, "S3BucketReplicationEnabled", MODEL_REPLICATION_REASON)
        acknowledge_in_packs(access_logs, "S3BucketReplicationEnabled", ACCESS_LOG_REPLICATION_REASON)
        return
    grant_replication(role, access_logs, replica, None)
    grant_replication(role, bucket, replica, key)


def replication_role(scope: Construct, id: str) -> iam.Role:
    """The role S3 assumes to replicate this account's buckets (``aws:SourceAccount``)."""
    return iam.Role(scope, id, description="S3 replicates the Triton model bucket and its access logs with this role",
                    assumed_by=iam.ServicePrincipal("s3.amazonaws.com", conditions={
                        "StringEquals": {"aws:SourceAccount": Aws.ACCOUNT_ID}}))


def replication_rules(destination: s3.IBucket, *, encrypted: bool) -> list[s3.ReplicationRule]:
    """One rule: every object and delete marker of the bucket into ``destination`` (encrypted with
    the destination's key where it has one; ``encrypted``: the source's objects are SSE-KMS)."""
    return [s3.ReplicationRule(
        destination=destination, priority=0, filter=s3.Filter(prefix=""), delete_marker_replication=True,
        kms_key=destination.encryption_key, sse_kms_encrypted_objects=True if encrypted else None)]


def replication_options(role: iam.Role | None, replica: s3.IBucket | None, *, encrypted: bool) -> dict[str, Any]:
    """The ``s3.Bucket`` options that replicate it into ``replica`` with ``role`` (none without both)."""
    if role is None or replica is None:
        return {}
    return {"replication_role": role, "replication_rules": replication_rules(replica, encrypted=encrypted)}


def grant_replication(role: iam.Role, bucket: s3.Bucket, destination: s3.IBucket, source_key: kms.IKey | None) -> None:
    """CDK's replication grants of ``bucket`` into ``destination`` on ``role``, their wildcards
    acknowledged (each with its reason)."""
    bucket.grant_replication_permission(role, source_decryption_key=source_key, destinations=[
        s3.GrantReplicationPermissionDestinationProps(bucket=destination, encryption_key=destination.encryption_key)])
    acknowledge_wildcard_resource(role, bucket.arn_for_objects("*"), (
        "S3 replication reads each new object version of this bucket (GetObjectVersionForReplication, its "
        "ACL and tags): every key of the bucket is replicated, named when it is written."))
    acknowledge_wildcard_resource(role, destination.arn_for_objects("*"), (
        "S3 replication writes each replica under the source object's key into the team's replica bucket "
        "(ReplicateObject, ReplicateDelete, ReplicateTags): the keys are the source's, named when written."))
    if source_key is not None or destination.encryption_key is not None:
        for action in ("kms:ReEncrypt*", "kms:GenerateDataKey*"):
            acknowledge_wildcard_action(role, action, (
                "CDK's replication grant on the replica bucket's key (Key.grantEncrypt): ReEncrypt* and "
                "GenerateDataKey* on that key only, for the replicas S3 writes with it."))
