"""The S3 bucket that holds the model artifacts of every release, and its access-log bucket."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Annotated, Self

import jsii
from aws_cdk import Annotations, Duration, IStableListProducer, Lazy, RemovalPolicy, Stack, Token
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_s3 as s3
from pydantic import AfterValidator, Field, model_validator

from constructs import Construct
from triton_mme_cdk.constructs.bucket_guard import encryption_denies, publisher_arn, writer_denies
from triton_mme_cdk.constructs.bucket_replication import (
    REPLICA_DESCRIPTION,
    replicate_or_acknowledge,
    replication_options,
    replication_role,
)
from triton_mme_cdk.constructs.cfn_hygiene import drop_provider_role_dependency
from triton_mme_cdk.constructs.customer_key import customer_key
from triton_mme_cdk.constructs.nag_acknowledgments import (
    ACCESS_LOG_ENCRYPTION_REASON,
    acknowledge_in_packs,
    acknowledge_wildcard_resource,
    skip_cdk_provider_checks,
    skip_checkov,
)
from triton_mme_cdk.constructs.props import DAYS, Between, Props, Resource, is_unresolved
from triton_mme_cdk.constructs.sagemaker_limits import PropsError

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


#: The key policy statement that keeps the bucket's roles to using its key through S3.
DENY_OUTSIDE_S3_SID = "DenyUseOutsideS3"
#: The key's data actions that statement denies outside S3.
KEY_DATA_ACTIONS = ("kms:Decrypt", "kms:Encrypt", "kms:GenerateDataKey*", "kms:ReEncrypt*")


@jsii.implements(IStableListProducer)
class _Listed:
    """A list read at synth (the roles a later grant adds are included)."""

    def __init__(self, items: list[str]) -> None:
        self._items = items

    def produce(self) -> list[str]:
        return list(self._items)


def s3_via_service(scope: Construct) -> str:
    """The ``kms:ViaService`` value of S3's requests to KMS in the region of ``scope``'s stack:
    ``s3.<region>.<url suffix>`` (what every grant of the bucket's key is conditioned on)."""
    stack = Stack.of(scope)
    return f"s3.{stack.region}.{stack.url_suffix}"


def _key_prefix(prefix: str) -> str:
    if len(prefix) > PREFIX_MAX_LENGTH or not re.fullmatch(PREFIX_PATTERN, prefix):
        raise ValueError(
            f"got {prefix!r}; expected an S3 key prefix such as 'models' or 'team/models': 1 to "
            f"{PREFIX_MAX_LENGTH} characters in segments of letters, digits, '_', '.' and '-' (each "
            "starting with a letter or digit) separated by '/', without a leading or trailing '/'"
        )
    return prefix


#: An S3-key-safe prefix such as ``models`` or ``team/models`` (a props field type).
KeyPrefix = Annotated[str, AfterValidator(_key_prefix)]
#: How long S3 keeps an object before a lifecycle rule expires it.
Expiration = Annotated[Duration, Between(1, 36500, DAYS)]
#: An IAM role or user ARN allowed to write what the fleet serves (a props field type).
PublisherArn = Annotated[str, AfterValidator(publisher_arn)]
#: Most publishers one bucket policy names (each is one value of one condition).
PUBLISHERS_MAX = 20


#: Who the publishers are and what the bucket policy lets them do (the end of the description of
#: ``ModelBucketProps.publishers`` and of the construct's ``model_publishers``).
PUBLISHERS_SCOPE = (
    "who runs `publish` out of band for release_id. The bucket policy denies every other principal "
    "writes and deletes under the model prefix's served/, _routes/, _builds/, _releases/ and _plans/. "
    "Empty: only the build writes them (with release_id and no build, no one).")


class ModelBucketProps(Props):
    """Props of :class:`ModelBucket`."""

    noncurrent_version_expiration: Expiration = Field(
        default_factory=lambda: Duration.days(30),
        description="Days an overwritten or deleted object version is kept (model bucket and access logs).",
    )
    retired_release_expiration: Expiration = Field(
        default_factory=lambda: Duration.days(30),
        description="Days the objects of a superseded release (tagged triton-mme:release-state=retired) are kept.",
    )
    access_log_expiration: Expiration = Field(
        default_factory=lambda: Duration.days(365), description="Days the model bucket's server access logs are kept."
    )
    removal_policy: RemovalPolicy = Field(
        default=RemovalPolicy.RETAIN,
        description="RETAIN: the buckets and the KMS key stay when the stack is deleted; DESTROY: they "
        "are emptied and deleted (adds CDK's auto-delete-objects custom resource).",
    )
    bucket: Resource[s3.IBucket] | None = Field(
        default=None,
        description="An existing bucket for the artifacts (yours: its versioning, logging, policy and "
        "lifecycle stay yours; the expiry rules are added where the bucket is defined in this app, "
        "else synth warns with them). Needs encryption_key unless it carries its own key. Unset: "
        "a bucket, its KMS key and an access-log bucket are created.",
    )
    encryption_key: Resource[kms.IKey] | None = Field(
        default=None,
        description="The KMS key that encrypts the artifacts: the key of an existing bucket, or the key a "
        "created bucket uses instead of a created one. Grants of read and write include its use. Unset: "
        "the bucket's own key, or a created key (yearly rotation).",
    )

    replica: Resource[s3.IBucket] | None = Field(default=None, description=REPLICA_DESCRIPTION)
    publishers: list[PublisherArn] = Field(
        default_factory=list,
        max_length=PUBLISHERS_MAX,
        description="IAM role or user ARNs that may write what the fleet serves besides the stack's build: "
        + PUBLISHERS_SCOPE,
    )

    @model_validator(mode="after")
    def _bucket_and_key(self) -> Self:
        if self.bucket is not None and self.replica is not None:
            raise ValueError("replica_bucket: given with bucket; only a created bucket is replicated here (set "
                             "your bucket's replication rules where you define it)")
        if self.bucket is not None and self.encryption_key is None and self.bucket.encryption_key is None:
            name = self.bucket.bucket_name
            shown = "a bucket" if Token.is_unresolved(name) else f"bucket {name!r}"
            raise ValueError(
                f"encryption_key: missing with {shown}; the endpoint's role and the build decrypt and "
                "encrypt the artifacts with the bucket's KMS key: pass it as encryption_key (kms.IKey), or "
                "a bucket that carries it (s3.Bucket.from_bucket_attributes(..., encryption_key=key))"
            )
        return self


class ModelBucket(Construct):
    """A private, KMS-encrypted, versioned bucket for model artifacts, with access logging.

    - All public access is blocked and requests without TLS (or below TLS 1.2) are denied.
    - Objects are encrypted with a customer-managed KMS key (yearly rotation on), with S3 bucket
      keys to keep the KMS request count low.
    - Versioning is on; noncurrent versions expire after ``noncurrent_version_expiration``;
      objects tagged ``triton-mme:release-state=retired`` (a superseded release) expire after
      ``retired_release_expiration``; incomplete multipart uploads are aborted after 7 days.
    - Server access logs go to a second bucket (SSE-S3, as S3 server access logging requires;
      TLS enforced; public access blocked; versioned), whose objects expire after
      ``access_log_expiration`` (a deleted or overwritten log object after
      ``noncurrent_version_expiration``).
    - ``RemovalPolicy.DESTROY`` deletes both buckets, emptying them first (CDK's
      auto-delete-objects custom resource), and the key enters its 7-day deletion window.

    With ``bucket`` given (yours), nothing of the above is created: its encryption, versioning,
    logging and policy stay yours; only the rule that expires a superseded release's objects is
    added, where the bucket is defined in this app (else synth warns with the rule). With
    ``encryption_key`` given, that key replaces the created one.

    Grants (``grant_read``, ``grant_write``, ``grant_tag``, ``grant_delete``) are scoped to a key
    prefix and include the matching KMS permissions on the bucket key, only through S3
    (``kms:ViaService`` = ``s3.<region>.<url suffix>``). On a key created here, the key policy
    also denies those roles any use of the key that does not come through S3
    (:meth:`grant_read`'s ``deny_direct_key_use``). :meth:`guard` adds the
    policy's denies: who may write what the fleet serves, and which encryption a PUT may ask for.
    """

    def __init__(self, scope: Construct, id: str, *, props: ModelBucketProps | None = None) -> None:
        super().__init__(scope, id)
        props = props or ModelBucketProps()
        # Grant S3 log delivery through the log bucket's policy, not an ACL: both buckets enforce
        # bucket-owner object ownership, which disables ACLs.
        self.node.set_context(SERVER_ACCESS_LOGS_USE_BUCKET_POLICY, True)
        #: The roles and users besides the build that may write what the fleet serves (their ARNs).
        self.publishers: list[str] = list(props.publishers)
        #: The ARNs of the roles the key policy keeps to using the key through S3.
        self._key_roles: list[str] = []
        #: Whether the bucket (with its key and its access-log bucket) was created here.
        self.created = props.bucket is None
        #: The bucket's access-log bucket (None for a bucket brought in).
        self.access_log_bucket: s3.Bucket | None = None
        if props.bucket is not None:
            self.key: kms.IKey = props.encryption_key or props.bucket.encryption_key  # type: ignore[assignment]
            self.bucket: s3.IBucket = props.bucket
            self._lifecycle_on_existing(props)
        else:
            self.key = props.encryption_key or customer_key(
                self,
                "Key",
                description="Encrypts the model artifacts of the Triton multi-model endpoint and its stack's log groups",
                removal_policy=props.removal_policy,
            )
            self.bucket = self._create(props)
        #: The bucket as the build's grants and resources read it: with its key.
        self.encrypted_bucket: s3.IBucket = (
            self.bucket if self.bucket.encryption_key is not None
            else s3.Bucket.from_bucket_attributes(self, "WithKey", bucket_arn=self.bucket.bucket_arn,
                                                  encryption_key=self.key))
        #: Name of the model bucket.
        self.bucket_name: str = self.bucket.bucket_name
        #: ARN of the model bucket.
        self.bucket_arn: str = self.bucket.bucket_arn

    def _create(self, props: ModelBucketProps) -> s3.Bucket:
        role = replication_role(self, "ReplicationRole") if props.replica is not None else None
        self.access_log_bucket = self._bucket(
            props, "AccessLogs",
            **replication_options(role, props.replica, encrypted=False),
            # S3 server access logging can only deliver to a bucket with SSE-S3.
            encryption=s3.BucketEncryption.S3_MANAGED,
            # A deleted or overwritten log object stays recoverable for noncurrent_version_expiration.
            versioned=True,
            lifecycle_rules=[
                s3.LifecycleRule(
                    id="ExpireAccessLogs",
                    expiration=props.access_log_expiration,
                    noncurrent_version_expiration=props.noncurrent_version_expiration,
                    abort_incomplete_multipart_upload_after=Duration.days(7),
                )
            ],
        )
        # cdk-nag's AwsSolutions-S1 passes a bucket that is another bucket's log destination; checkov does not.
        skip_checkov(
            self.access_log_bucket,
            ["CKV_AWS_18"],
            "This bucket is the destination of the model bucket's server access logs; logging "
            "its own accesses would need a third bucket and recurse.",
        )
        acknowledge_in_packs(self.access_log_bucket, "S3DefaultEncryptionKMS", ACCESS_LOG_ENCRYPTION_REASON)
        bucket = self._bucket(
            props, "Resource",
            **replication_options(role, props.replica, encrypted=True),
            encryption=s3.BucketEncryption.KMS,
            encryption_key=self.key,
            bucket_key_enabled=True,
            versioned=True,
            server_access_logs_bucket=self.access_log_bucket,
            server_access_logs_prefix="model-bucket/",
            lifecycle_rules=self._lifecycle_rules(props),
        )
        replicate_or_acknowledge(role, props.replica, bucket=bucket, key=self.key, access_logs=self.access_log_bucket)
        if props.removal_policy == RemovalPolicy.DESTROY:
            drop_provider_role_dependency(self, AUTO_DELETE_PROVIDER_ID)
            skip_cdk_provider_checks(
                self,
                AUTO_DELETE_PROVIDER_ID,
                "empties a bucket before CloudFormation deletes it",
                "the S3 API (list and delete the object versions of the buckets it is given)",
            )
        return bucket

    def _bucket(self, props: ModelBucketProps, id: str, **options: object) -> s3.Bucket:
        """A private, TLS-only bucket that follows the removal policy."""
        removal_policy = props.removal_policy
        return s3.Bucket(
            self,
            id,
            block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
            object_ownership=s3.ObjectOwnership.BUCKET_OWNER_ENFORCED,
            enforce_ssl=True,
            minimum_tls_version=1.2,
            removal_policy=removal_policy,
            auto_delete_objects=removal_policy == RemovalPolicy.DESTROY,
            **options,  # type: ignore[arg-type]
        )

    def _lifecycle_rules(self, props: ModelBucketProps) -> list[s3.LifecycleRule]:
        return [
            s3.LifecycleRule(
                id="ExpireNoncurrentVersions",
                noncurrent_version_expiration=props.noncurrent_version_expiration,
                abort_incomplete_multipart_upload_after=Duration.days(7),
                expired_object_delete_marker=True,
            ),
            s3.LifecycleRule(
                id="ExpireRetiredReleases",
                tag_filters={RETIRED_TAG_KEY: RETIRED_TAG_VALUE},
                expiration=props.retired_release_expiration,
            ),
        ]

    def expire(self, id: str, prefix: str, expiration: Duration) -> None:
        """Expire the objects under ``prefix/`` ``expiration`` after they are written (a lifecycle
        rule): for working folders nothing serves from, such as the build jobs' ``_jobs/``."""
        self._add_lifecycle_rule(s3.LifecycleRule(id=id, prefix=f"{prefix}/", expiration=expiration))

    def guard(self, prefix: str, *, place_roles: Sequence[iam.IRole] = (), build_roles: Sequence[iam.IRole] = (),
              job_roles: Sequence[iam.IRole] = ()) -> None:
        """Only ``place_roles``, the bucket's auto-delete role and :attr:`publishers`
        may write and delete what the fleet serves under ``prefix/`` (``served/``, ``_routes/``,
        ``_releases/``); ``build_roles`` besides them the store and the plans (``_builds/``,
        ``_plans/``); ``place_roles``, ``build_roles``, ``job_roles`` and the auto-delete role the
        jobs' ``_jobs/``. A PUT asks for SSE-KMS with the bucket's key or for nothing (the bucket's
        default): deny statements in the bucket policy (``constructs/bucket_guard.py``).

        On a bucket defined outside this stack, synth warns with the statements to add there."""
        placers = [role.role_arn for role in place_roles]
        auto_delete: list[str] = []
        provider = Stack.of(self.bucket).node.try_find_child(AUTO_DELETE_PROVIDER_ID)
        if provider is not None and hasattr(provider, "role_arn"):
            # CDK's auto-delete empties the buckets it is given when they are deleted.
            auto_delete.append(provider.role_arn)
        builders = [role.role_arn for role in build_roles]
        statements = writer_denies(
            self.bucket, prefix, writers=[*placers, *auto_delete, *self.publishers],
            build_writers=builders,
            job_writers=[*placers, *builders, *(role.role_arn for role in job_roles), *auto_delete])
        # A created bucket is all the stack's; a bucket brought in is yours beyond the prefix.
        statements += encryption_denies(self.bucket, "*" if self.created else f"{prefix}/*", self.key.key_arn,
                                        "" if self.created else prefix)
        here = isinstance(self.bucket, s3.Bucket) and Stack.of(self.bucket) is Stack.of(self)
        if here:
            for statement in statements:
                self.bucket.add_to_resource_policy(statement)
            return
        shown = json.dumps([Stack.of(self).resolve(each.to_statement_json()) for each in statements], sort_keys=True)
        Annotations.of(self).add_warning_v2(
            "triton-mme:bucket-policy-guard",
            "bucket: defined outside this stack, so its policy is yours: add these statements to it, or any "
            "principal of the account with s3:PutObject on it can change what the fleet serves (and run "
            f"code on it): {shown}")

    def _lifecycle_on_existing(self, props: ModelBucketProps) -> None:
        # A superseded release's objects expire; the bucket's versions and uploads stay the owner's.
        for rule in self._lifecycle_rules(props):
            if rule.id == "ExpireRetiredReleases":
                self._add_lifecycle_rule(rule)

    def _add_lifecycle_rule(self, rule: s3.LifecycleRule) -> None:
        """Add ``rule`` to the bucket where this app defines it; on a bucket defined elsewhere,
        a synth warning names the rule to add there."""
        if isinstance(self.bucket, s3.Bucket):
            self.bucket.add_lifecycle_rule(**{
                name: getattr(rule, name) for name in (
                    "id", "prefix", "expiration", "noncurrent_version_expiration", "tag_filters",
                    "abort_incomplete_multipart_upload_after", "expired_object_delete_marker")
                if getattr(rule, name) is not None})
            return
        what = ", ".join(f"{name}={getattr(rule, name)!r}" for name in (
            "prefix", "tag_filters", "expiration", "noncurrent_version_expiration", "expired_object_delete_marker")
            if getattr(rule, name) is not None)
        Annotations.of(self).add_warning_v2(
            f"triton-mme:lifecycle-{rule.id}",
            f"bucket: defined outside this app, so its lifecycle rules are yours: add {rule.id} ({what}) "
            "there, or these objects are kept forever")

    # -----------------------------------------------------------------------------------------
    # Grants
    # -----------------------------------------------------------------------------------------

    def s3_url(self, key_prefix: str) -> str:
        """``s3://<bucket>/<key_prefix>`` (the prefix is used as given)."""
        return f"s3://{self.bucket_name}/{key_prefix}"

    def grant_read(self, grantee: iam.IGrantable, prefix: str, *, deny_direct_key_use: bool = True) -> iam.Grant:
        """Let ``grantee`` list and read the objects under ``prefix/`` and decrypt them.

        ``s3:GetObject`` on ``<bucket>/<prefix>/*``, ``s3:ListBucket`` on the bucket with the
        condition ``s3:prefix`` in (``<prefix>``, ``<prefix>/*``), ``kms:Decrypt`` on the key
        through S3 only (``kms:ViaService``). With ``deny_direct_key_use`` (and a key created
        here), the key policy denies the grantee's role the key's data actions other than
        through S3 (:meth:`_deny_direct_key_use`); pass False for a role that a service also
        uses the key for otherwise (an instance volume SageMaker encrypts through a grant).
        """
        objects = self._objects_grant(grantee, prefix, ["s3:GetObject"], "read")
        listing = self._listing_grant(grantee, prefix, "s3:ListBucket")
        decrypt = self._key_grant(grantee, ["kms:Decrypt"], deny_direct_key_use)
        return objects.combine(listing).combine(decrypt)

    def grant_write(self, grantee: iam.IGrantable, prefix: str, *, deny_direct_key_use: bool = True) -> iam.Grant:
        """Let ``grantee`` write objects under ``prefix/`` (encrypting them with the bucket key).

        ``s3:PutObject`` and ``s3:AbortMultipartUpload`` on ``<bucket>/<prefix>/*``;
        ``kms:GenerateDataKey``, ``kms:Encrypt`` and ``kms:Decrypt`` (multipart uploads read
        back the data key) on the key, through S3 only; ``deny_direct_key_use`` as in
        :meth:`grant_read`.
        """
        objects = self._objects_grant(grantee, prefix, ["s3:PutObject", "s3:AbortMultipartUpload"], "write")
        encrypt = self._key_grant(grantee, ["kms:Decrypt", "kms:Encrypt", "kms:GenerateDataKey"], deny_direct_key_use)
        return objects.combine(encrypt)

    @property
    def s3_via_service(self) -> str:
        """The ``kms:ViaService`` value of S3's requests to KMS in the stack's region."""
        return s3_via_service(self)

    def _key_grant(self, grantee: iam.IGrantable, actions: list[str], deny_direct: bool) -> iam.Grant:
        grant = iam.Grant.add_to_principal(
            grantee=grantee, actions=actions, resource_arns=[self.key.key_arn],
            conditions={"StringEquals": {"kms:ViaService": self.s3_via_service}},
        )
        if deny_direct:
            self._deny_direct_key_use(grantee)
        return grant

    def _deny_direct_key_use(self, grantee: iam.IGrantable) -> None:
        """On a key created here, one key policy statement (``DenyUseOutsideS3``) denies the roles
        given here the key's data actions (``kms:Decrypt``, ``kms:Encrypt``,
        ``kms:GenerateDataKey*``, ``kms:ReEncrypt*``) unless the request comes through S3. The
        roles are named by ``aws:PrincipalArn`` (a condition keeps the ARN: a role recreated under
        the same name stays denied, where a ``Principal`` would turn into the old role's id)."""
        role = grantee.grant_principal
        if not isinstance(self.key, kms.Key) or not isinstance(role, iam.Role):
            return
        if not self._key_roles:
            self.key.add_to_resource_policy(iam.PolicyStatement(
                sid=DENY_OUTSIDE_S3_SID,
                effect=iam.Effect.DENY,
                principals=[iam.AnyPrincipal()],
                actions=list(KEY_DATA_ACTIONS),
                resources=["*"],
                conditions={
                    "ArnEquals": {"aws:PrincipalArn": Lazy.list(_Listed(self._key_roles))},
                    "StringNotEquals": {"kms:ViaService": self.s3_via_service},
                },
            ))
        if role.role_arn not in self._key_roles:
            self._key_roles.append(role.role_arn)

    def grant_tag(self, grantee: iam.IGrantable, prefix: str) -> iam.Grant:
        """Let ``grantee`` read and set the tags of objects under ``prefix/``.

        The build tags a superseded release ``triton-mme:release-state=retired`` so that the
        lifecycle rule expires it.
        """
        return self._objects_grant(grantee, prefix, ["s3:GetObjectTagging", "s3:PutObjectTagging"], "tag")

    def grant_delete(self, grantee: iam.IGrantable, prefix: str) -> iam.Grant:
        """Let ``grantee`` delete the objects under ``prefix/`` with all their versions.

        ``s3:DeleteObject`` and ``s3:DeleteObjectVersion`` on ``<bucket>/<prefix>/*``,
        ``s3:ListBucketVersions`` conditioned on ``s3:prefix`` and ``s3:GetBucketVersioning`` on
        the bucket (deleting by key alone would only add delete markers to a versioned bucket).
        """
        objects = self._objects_grant(grantee, prefix, ["s3:DeleteObject", "s3:DeleteObjectVersion"], "delete")
        versions = self._listing_grant(grantee, prefix, "s3:ListBucketVersions")
        versioning = iam.Grant.add_to_principal(
            grantee=grantee, actions=["s3:GetBucketVersioning"], resource_arns=[self.bucket_arn]
        )
        return objects.combine(versions).combine(versioning)

    def _listing_grant(self, grantee: iam.IGrantable, prefix: str, action: str) -> iam.Grant:
        return iam.Grant.add_to_principal(
            grantee=grantee,
            actions=[action],
            resource_arns=[self.bucket_arn],
            conditions={"StringLike": {"s3:prefix": [prefix, f"{prefix}/*"]}},
        )

    def _objects_grant(self, grantee: iam.IGrantable, prefix: str, actions: list[str], verb: str) -> iam.Grant:
        if not is_unresolved(prefix):
            # A grant may name one of the build's own folders under the prefix (``<prefix>/_jobs``).
            head, _, last = prefix.rpartition("/")
            base, internal = (head, last) if last.startswith("_") else (prefix, "")
            try:
                if base or not internal:
                    _key_prefix(base)
                if internal and not re.fullmatch(r"_[a-z]+", internal):
                    raise ValueError(f"got {prefix!r}; a build folder is '_' and lowercase letters")
            except ValueError as error:
                raise PropsError(f"prefix: {error}") from None
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
