"""The S3 bucket that holds the model artifacts of every release, and its access-log bucket."""

from __future__ import annotations

import re

from aws_cdk import Duration, RemovalPolicy, Stack, Token
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_s3 as s3

from constructs import Construct
from constructs.cfn_hygiene import drop_referenced_dependencies
from constructs.nag_acknowledgments import acknowledge, acknowledge_wildcard_resource
from constructs.sagemaker_limits import PropsError, check_range

#: A key prefix: path segments of letters, digits, ``_``, ``.``, ``-``; no leading/trailing ``/``.
PREFIX_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]*(/[A-Za-z0-9][A-Za-z0-9_.-]*)*$"
PREFIX_MAX_LENGTH = 256
#: Object tag the model build puts on the objects of a superseded release.
RETIRED_TAG_KEY = "triton-mme:release-state"
RETIRED_TAG_VALUE = "retired"
#: Feature flag: server access logging through a bucket policy (needed without ACLs).
SERVER_ACCESS_LOGS_USE_BUCKET_POLICY = "@aws-cdk/aws-s3:serverAccessLogsUseBucketPolicy"
#: Construct id of the provider CDK adds to the stack for ``auto_delete_objects``.
AUTO_DELETE_PROVIDER_ID = "Custom::S3AutoDeleteObjectsCustomResourceProvider"


def check_prefix(prop: str, prefix: str) -> None:
    """An S3-key-safe prefix such as ``models`` or ``team/models`` (tokens pass)."""
    if Token.is_unresolved(prefix):
        return
    if len(prefix) > PREFIX_MAX_LENGTH or not re.fullmatch(PREFIX_PATTERN, prefix):
        raise PropsError(
            f"{prop}: got {prefix!r}; expected 1 to {PREFIX_MAX_LENGTH} characters of path "
            "segments made of letters, digits, '_', '.' and '-' (each starting with a letter or "
            "digit), separated by '/', without a leading or trailing '/'"
        )


class ModelBucket(Construct):
    """A private, KMS-encrypted, versioned bucket for model artifacts, with access logging.

    - All public access is blocked and requests without TLS (or below TLS 1.2) are denied.
    - Objects are encrypted with a customer-managed KMS key (yearly rotation on), with S3 bucket
      keys to keep the KMS request count low.
    - Versioning is on; noncurrent versions expire after ``noncurrent_version_expiration``;
      objects tagged ``triton-mme:release-state=retired`` (a superseded release) expire after
      ``retired_release_expiration``; incomplete multipart uploads are aborted after 7 days.
    - Server access logs go to a second bucket (SSE-S3, as S3 server access logging requires;
      TLS enforced; public access blocked), whose objects expire after ``access_log_expiration``.

    Grants (``grant_read``, ``grant_write``, ``grant_tag``, ``grant_delete``) are scoped to a key
    prefix and include the matching KMS permissions on the bucket key.

    :param noncurrent_version_expiration: how long an overwritten or deleted object version is
        kept. Default: 30 days.
    :param retired_release_expiration: how long the objects of a retired release are kept after
        the build tags them. Default: 30 days.
    :param access_log_expiration: how long server access log objects are kept. Default: 365 days.
    :param removal_policy: ``RETAIN`` (default) keeps both buckets and the key when the stack is
        deleted. ``DESTROY`` deletes them, emptying the buckets first (this adds CDK's
        auto-delete-objects custom resource); the key then enters its 7-day deletion window.
    """

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        noncurrent_version_expiration: Duration | None = None,
        retired_release_expiration: Duration | None = None,
        access_log_expiration: Duration | None = None,
        removal_policy: RemovalPolicy = RemovalPolicy.RETAIN,
    ) -> None:
        super().__init__(scope, id)
        # Grant S3 log delivery through the log bucket's policy, not an ACL: both buckets enforce
        # bucket-owner object ownership, which disables ACLs.
        self.node.set_context(SERVER_ACCESS_LOGS_USE_BUCKET_POLICY, True)
        noncurrent = noncurrent_version_expiration or Duration.days(30)
        retired = retired_release_expiration or Duration.days(30)
        logs_expiration = access_log_expiration or Duration.days(365)
        for prop, value in (
            ("noncurrent_version_expiration", noncurrent),
            ("retired_release_expiration", retired),
            ("access_log_expiration", logs_expiration),
        ):
            if not Token.is_unresolved(value.to_days()):
                check_range(prop, value.to_days(), 1, 36500, "days")
        destroy = removal_policy == RemovalPolicy.DESTROY

        self.key = kms.Key(
            self,
            "Key",
            description="Encrypts the model artifacts of the Triton multi-model endpoint",
            enable_key_rotation=True,
            removal_policy=removal_policy,
            pending_window=Duration.days(7) if destroy else None,
        )

        self.access_log_bucket = s3.Bucket(
            self,
            "AccessLogs",
            # S3 server access logging can only deliver to a bucket with SSE-S3.
            encryption=s3.BucketEncryption.S3_MANAGED,
            block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
            object_ownership=s3.ObjectOwnership.BUCKET_OWNER_ENFORCED,
            enforce_ssl=True,
            minimum_tls_version=1.2,
            lifecycle_rules=[
                s3.LifecycleRule(id="ExpireAccessLogs", expiration=logs_expiration),
            ],
            removal_policy=removal_policy,
            auto_delete_objects=destroy,
        )
        acknowledge(
            self.access_log_bucket,
            "AwsSolutions-S1",
            "This bucket is the destination of the model bucket's server access logs; logging "
            "its own accesses would need a third bucket and recurse.",
        )

        self.bucket = s3.Bucket(
            self,
            "Resource",
            encryption=s3.BucketEncryption.KMS,
            encryption_key=self.key,
            bucket_key_enabled=True,
            block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
            object_ownership=s3.ObjectOwnership.BUCKET_OWNER_ENFORCED,
            enforce_ssl=True,
            minimum_tls_version=1.2,
            versioned=True,
            server_access_logs_bucket=self.access_log_bucket,
            server_access_logs_prefix="model-bucket/",
            lifecycle_rules=[
                s3.LifecycleRule(
                    id="ExpireNoncurrentVersions",
                    noncurrent_version_expiration=noncurrent,
                    abort_incomplete_multipart_upload_after=Duration.days(7),
                    expired_object_delete_marker=True,
                ),
                s3.LifecycleRule(
                    id="ExpireRetiredReleases",
                    tag_filters={RETIRED_TAG_KEY: RETIRED_TAG_VALUE},
                    expiration=retired,
                ),
            ],
            removal_policy=removal_policy,
            auto_delete_objects=destroy,
        )

        if destroy:
            self._tidy_auto_delete_provider()

        #: Name of the model bucket.
        self.bucket_name: str = self.bucket.bucket_name
        #: ARN of the model bucket.
        self.bucket_arn: str = self.bucket.bucket_arn

    def _tidy_auto_delete_provider(self) -> None:
        """The auto-delete-objects provider (one per stack) depends on its role both explicitly
        and through ``Fn::GetAtt``; keep the ``GetAtt`` only (cfn-lint W3005)."""
        provider = Stack.of(self).node.try_find_child(AUTO_DELETE_PROVIDER_ID)
        if provider is None:
            return
        handler = provider.node.try_find_child("Handler")
        role = provider.node.try_find_child("Role")
        if handler is not None and role is not None:
            drop_referenced_dependencies(handler, [role])

    # -----------------------------------------------------------------------------------------
    # Grants
    # -----------------------------------------------------------------------------------------

    def s3_url(self, key_prefix: str) -> str:
        """``s3://<bucket>/<key_prefix>`` (the prefix is used as given)."""
        return f"s3://{self.bucket_name}/{key_prefix}"

    def grant_read(self, grantee: iam.IGrantable, prefix: str) -> iam.Grant:
        """Let ``grantee`` list and read the objects under ``prefix/`` and decrypt them.

        ``s3:GetObject`` on ``<bucket>/<prefix>/*``, ``s3:ListBucket`` on the bucket with the
        condition ``s3:prefix`` in (``<prefix>``, ``<prefix>/*``), ``kms:Decrypt`` on the key.
        """
        check_prefix("prefix", prefix)
        objects = self._objects_grant(grantee, prefix, ["s3:GetObject"], "read")
        listing = iam.Grant.add_to_principal(
            grantee=grantee,
            actions=["s3:ListBucket"],
            resource_arns=[self.bucket_arn],
            conditions={"StringLike": {"s3:prefix": [prefix, f"{prefix}/*"]}},
        )
        decrypt = iam.Grant.add_to_principal(
            grantee=grantee, actions=["kms:Decrypt"], resource_arns=[self.key.key_arn]
        )
        return objects.combine(listing).combine(decrypt)

    def grant_write(self, grantee: iam.IGrantable, prefix: str) -> iam.Grant:
        """Let ``grantee`` write objects under ``prefix/`` (encrypting them with the bucket key).

        ``s3:PutObject`` and ``s3:AbortMultipartUpload`` on ``<bucket>/<prefix>/*``;
        ``kms:GenerateDataKey``, ``kms:Encrypt`` and ``kms:Decrypt`` (multipart uploads read
        back the data key) on the key.
        """
        check_prefix("prefix", prefix)
        objects = self._objects_grant(
            grantee, prefix, ["s3:PutObject", "s3:AbortMultipartUpload"], "write"
        )
        encrypt = iam.Grant.add_to_principal(
            grantee=grantee,
            actions=["kms:Decrypt", "kms:Encrypt", "kms:GenerateDataKey"],
            resource_arns=[self.key.key_arn],
        )
        return objects.combine(encrypt)

    def grant_tag(self, grantee: iam.IGrantable, prefix: str) -> iam.Grant:
        """Let ``grantee`` read and set the tags of objects under ``prefix/``.

        The build tags a superseded release ``triton-mme:release-state=retired`` so that the
        lifecycle rule expires it.
        """
        check_prefix("prefix", prefix)
        return self._objects_grant(
            grantee, prefix, ["s3:GetObjectTagging", "s3:PutObjectTagging"], "tag"
        )

    def grant_delete(self, grantee: iam.IGrantable, prefix: str) -> iam.Grant:
        """Let ``grantee`` delete the objects under ``prefix/`` with all their versions.

        ``s3:DeleteObject`` and ``s3:DeleteObjectVersion`` on ``<bucket>/<prefix>/*``,
        ``s3:ListBucketVersions`` conditioned on ``s3:prefix`` and ``s3:GetBucketVersioning`` on
        the bucket (deleting by key alone would only add delete markers to a versioned bucket).
        """
        check_prefix("prefix", prefix)
        objects = self._objects_grant(
            grantee, prefix, ["s3:DeleteObject", "s3:DeleteObjectVersion"], "delete"
        )
        versions = iam.Grant.add_to_principal(
            grantee=grantee,
            actions=["s3:ListBucketVersions"],
            resource_arns=[self.bucket_arn],
            conditions={"StringLike": {"s3:prefix": [prefix, f"{prefix}/*"]}},
        )
        versioning = iam.Grant.add_to_principal(
            grantee=grantee, actions=["s3:GetBucketVersioning"], resource_arns=[self.bucket_arn]
        )
        return objects.combine(versions).combine(versioning)

    def _objects_grant(
        self, grantee: iam.IGrantable, prefix: str, actions: list[str], verb: str
    ) -> iam.Grant:
        resource = self.bucket.arn_for_objects(f"{prefix}/*")
        grant = iam.Grant.add_to_principal(grantee=grantee, actions=actions, resource_arns=[resource])
        principal = grantee.grant_principal
        if isinstance(principal, Construct):
            acknowledge_wildcard_resource(
                principal,
                resource,
                f"Object-level {verb} access is scoped to the key prefix '{prefix}/' of the model "
                "bucket; the object names under it (one per release and model) are not known "
                "at synth.",
            )
        return grant
