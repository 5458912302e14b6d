"""Who may change what the fleet serves: the deny statements of the model bucket's policy.

A tarball under ``served/`` carries code Triton runs (a raw-text model's ``model.py`` and its
native wheel), and the routes say which tarball each name serves: write access to them is code
execution on the GPU fleet. IAM allows by the union of a principal's own policies, so any role of
the account with ``s3:PutObject`` on ``*`` could write them; only a bucket-policy deny holds for
every principal. Two kinds of statement:

- **Writers** (:func:`writer_denies`): the write and delete actions on the folders of one model
  prefix that decide what is served are denied to every principal whose ``aws:PrincipalArn`` is
  not one of the named writers of that folder:

  - ``served/``, ``_routes/``, ``_releases/``: the stack's placing role (the Finish task,
    ``on_event``, ``is_complete``), the bucket's auto-delete role (only with
    ``bucket_removal_policy: destroy``) and the ``model_publishers`` of the setting;
  - ``_builds/``, ``_plans/``: those and the build role (the code that parses model sources);
  - ``_jobs/`` (the Processing jobs' inputs and outputs): the placing, build, Processing and
    auto-delete roles.

  A role's sessions carry the role's ARN in ``aws:PrincipalArn`` (IAM User Guide, global
  condition keys), so naming a role names all its sessions. A request without the key
  (anonymous) is denied: a negated operator is true where the key is absent.
- **Encryption** (:func:`encryption_denies`): a ``PutObject`` (which is also the action of a copy
  and of a multipart upload) that asks for another encryption than SSE-KMS with the stack's key is
  denied: SSE-S3 or DSSE in ``x-amz-server-side-encryption``, ``aws:kms`` without the key's ARN in
  ``x-amz-server-side-encryption-aws-kms-key-id`` (S3 would use the ``aws/s3`` key), any other
  key, or a customer-provided key (SSE-C). A request without any encryption header passes: S3
  encrypts it with the bucket's default, the stack's key (the build's own uploads and copies send
  none). The condition keys hold the request's headers, so each statement first checks that its
  header is present (``Null: false``): without that check a negated operator on an absent key
  is true and every header-less PUT would be denied.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from aws_cdk import aws_iam as iam
from aws_cdk import aws_s3 as s3

from triton_mme_cdk.constructs.props import is_unresolved
from triton_mme_cdk.model_build.release.identity import (
    BUILDS_DIR,
    JOBS_DIR,
    PLANS_DIR,
    RELEASES_DIR,
    ROUTES_KEY_NAME,
    SERVED_DIR,
)

#: The folders of a model prefix whose objects are what the fleet serves: only the placing step writes them.
PLACED_FOLDERS: tuple[str, ...] = (SERVED_DIR, ROUTES_KEY_NAME.partition("/")[0], RELEASES_DIR)
#: The folders the build step writes too: the store of built models (placed only after the placing
#: step has gated each tarball again) and the plans.
BUILD_FOLDERS: tuple[str, ...] = (BUILDS_DIR, PLANS_DIR)
#: The folders of a model prefix whose objects decide what the fleet serves.
SERVING_FOLDERS: tuple[str, ...] = (*PLACED_FOLDERS, *BUILD_FOLDERS)
#: Every action that writes, deletes or retags an object (a ``retired`` tag expires it) or
#: changes who may read it.
WRITE_ACTIONS: tuple[str, ...] = (
    "s3:PutObject",
    "s3:PutObjectAcl",
    "s3:PutObjectVersionAcl",
    "s3:PutObjectTagging",
    "s3:PutObjectVersionTagging",
    "s3:DeleteObjectTagging",
    "s3:DeleteObjectVersionTagging",
    "s3:DeleteObject",
    "s3:DeleteObjectVersion",
    "s3:PutObjectRetention",
    "s3:PutObjectLegalHold",
    "s3:AbortMultipartUpload",
    "s3:ReplicateObject",
    "s3:ReplicateDelete",
    "s3:ReplicateTags",
)
ENCRYPTION_KEY = "s3:x-amz-server-side-encryption"
KMS_KEY_ID_KEY = "s3:x-amz-server-side-encryption-aws-kms-key-id"
CUSTOMER_KEY_KEY = "s3:x-amz-server-side-encryption-customer-algorithm"
PRINCIPAL_ARN_KEY = "aws:PrincipalArn"
#: An IAM role or user ARN, as ``model_publishers`` takes it (no wildcard: each writer by name).
PUBLISHER_PATTERN = r"arn:aws(-cn|-us-gov|-iso|-iso-b)?:iam::[0-9]{12}:(role|user)(/[\w+=,.@-]+)*/[\w+=,.@-]+"


def publisher_arn(arn: str) -> str:
    """``arn`` if it is an IAM role or user ARN (or a token), else ``ValueError`` naming it."""
    if not is_unresolved(arn) and not re.fullmatch(PUBLISHER_PATTERN, arn):
        raise ValueError(
            f"got {arn!r}; expected the ARN of an IAM role or user, such as "
            "'arn:aws:iam::123456789012:role/model-publisher' (with its path, if it has one; no wildcard, and "
            "not an 'arn:aws:sts::...:assumed-role/...' session: name the role, which names all its sessions)"
        )
    return arn


def _sid(prefix: str, what: str) -> str:
    """A statement id unique per model prefix on one bucket (letters and digits only)."""
    if is_unresolved(prefix):
        return what
    return what + "".join(part.capitalize() for part in re.split(r"[^A-Za-z0-9]+", prefix) if part)


def _folder(prefix: str, folder: str) -> str:
    return f"{prefix}/{folder}/*" if prefix else f"{folder}/*"


def writer_denies(bucket: s3.IBucket, prefix: str, *, writers: Sequence[str], build_writers: Sequence[str] = (),
                  job_writers: Sequence[str]) -> list[iam.PolicyStatement]:
    """Deny :data:`WRITE_ACTIONS` on the placed folders of ``prefix`` to every principal but
    ``writers`` (role or user ARNs), on the build folders to every principal but ``writers`` and
    ``build_writers``, and on ``_jobs/`` to every principal but ``job_writers``."""
    statements = []
    for sid, folders, allowed in (("OnlyNamedWritersChangeServing", PLACED_FOLDERS, writers),
                                  ("OnlyBuildWritesBuilds", BUILD_FOLDERS, [*writers, *build_writers]),
                                  ("OnlyBuildWritesJobs", (JOBS_DIR,), job_writers)):
        # No writer at all: deny everyone (an ArnNotLike without a value would be refused).
        condition = {"ArnNotLike": {PRINCIPAL_ARN_KEY: list(dict.fromkeys(allowed))}} if allowed else {}
        statements.append(iam.PolicyStatement(
            sid=_sid(prefix, sid), effect=iam.Effect.DENY, principals=[iam.AnyPrincipal()],
            actions=list(WRITE_ACTIONS), resources=[bucket.arn_for_objects(_folder(prefix, f)) for f in folders],
            conditions=condition or None,
        ))
    return statements


def encryption_denies(bucket: s3.IBucket, objects: str, key_arn: str, sid_prefix: str = "") -> list[iam.PolicyStatement]:
    """Deny a ``PutObject`` on ``objects`` (a key pattern) that asks for other encryption than
    SSE-KMS with ``key_arn``; a request without encryption headers gets the bucket's default."""
    resource = [bucket.arn_for_objects(objects)]
    rules = (
        ("DenyPutNotSseKms", {"Null": {ENCRYPTION_KEY: "false"}, "StringNotEquals": {ENCRYPTION_KEY: "aws:kms"}}),
        ("DenyPutOtherKmsKey", {"Null": {ENCRYPTION_KEY: "false"}, "StringNotEquals": {KMS_KEY_ID_KEY: key_arn}}),
        ("DenyPutKmsKeyIdOtherKey", {"Null": {KMS_KEY_ID_KEY: "false"}, "StringNotEquals": {KMS_KEY_ID_KEY: key_arn}}),
        ("DenyPutCustomerKey", {"Null": {CUSTOMER_KEY_KEY: "false"}}),
    )
    return [
        iam.PolicyStatement(sid=_sid(sid_prefix, sid), effect=iam.Effect.DENY, principals=[iam.AnyPrincipal()],
                            actions=["s3:PutObject"], resources=resource, conditions=conditions)
        for sid, conditions in rules
    ]
