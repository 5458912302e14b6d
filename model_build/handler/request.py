"""What every handler reads first: the request, checked once with messages naming the property, and
the manifest asset it names (read under the same limits as on a laptop, its hash checked against
the template's), through the handlers' S3 client (:func:`s3_client`). A failure becomes
:class:`HandlerError`, a short reason CloudFormation shows (:func:`short_error`, :func:`shown`).
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping
from typing import Any

from triton_mme_cdk.model_build.errors import ManifestError, ModelBuildError
from triton_mme_cdk.model_build.manifest import MAX_MANIFEST_BYTES, Manifest, load_manifest_bytes
from triton_mme_cdk.model_build.release import Release, routes_key, served_prefix
from triton_mme_cdk.model_build.release.deployed import DeployedRecordError, parse_record

LOG = logging.getLogger("triton_mme_cdk.model_build.handler")
LOG.setLevel(logging.INFO)
RELEASE_ID = re.compile(r"^r-[0-9a-f]{16}$")
SHA256 = re.compile(r"^[0-9a-f]{64}$")
PREFIX = re.compile(r"^[A-Za-z0-9!_.*'()/-]{1,512}$")
ON_DELETE = ("retain", "destroy")
#: The fewest days an object taken off the routes is kept before this function deletes it, whatever
#: the event's RetentionDays says: a rollback within a day finds its objects, and an event that
#: says "0" cannot have the objects just unrouted deleted at once.
MIN_RETENTION_DAYS = 1.0


class HandlerError(Exception):
    """What the Lambda raises: its message becomes CloudFormation's status reason."""


#: The request types CloudFormation sends to a custom resource.
REQUEST_TYPES = ("Create", "Update", "Delete")
#: Longest property value echoed in a reason (a hostile event must not fill CloudFormation's 4 KB).
_SHOWN = 80


def shown(value: Any) -> str:
    """``value`` as a reason echoes it: its ``repr``, cut to :data:`_SHOWN` characters."""
    text = repr(value)
    return text if len(text) <= _SHOWN else text[: _SHOWN - 3] + "..."


def request_type(event: Any) -> str:
    """The event's ``RequestType``, or a :class:`HandlerError` naming what was wrong.

    Checked first in every entry point, so a malformed event fails the resource at once with a
    reason CloudFormation shows, instead of a ``KeyError`` or a build that never starts."""
    if not isinstance(event, Mapping):
        raise HandlerError(f"event: got {type(event).__name__}; expected a CloudFormation request object")
    value = event.get("RequestType")
    if value not in REQUEST_TYPES:
        raise HandlerError(f"event RequestType: got {shown(value)}; expected one of {', '.join(REQUEST_TYPES)}")
    return str(value)


class Request:
    """The custom resource's properties, checked once with messages naming the property."""

    def __init__(self, event: dict[str, Any]) -> None:
        self.event = event
        self.request_type: str = request_type(event)
        props = event.get("ResourceProperties", {})
        if not isinstance(props, dict):
            raise HandlerError(f"event ResourceProperties: got {type(props).__name__}; expected an object")
        self.props: dict[str, Any] = props

        def required(name: str) -> str:
            value = props.get(name)
            if not isinstance(value, str) or not value:
                raise HandlerError(f"property {name}: got {shown(value)}; expected a non-empty string")
            return value

        def optional(name: str, default: str) -> str:
            value = props.get(name, default)
            if not isinstance(value, str):
                raise HandlerError(f"property {name}: got {shown(value)}; expected a string")
            return value

        self.model_bucket = required("ModelBucket")
        self.model_prefix = optional("ModelPrefix", "models").strip("/")
        if self.model_prefix and not PREFIX.match(self.model_prefix):
            raise HandlerError(f"property ModelPrefix: got {shown(self.model_prefix)}; expected S3-safe characters")
        self.release_id = required("ReleaseId")
        if not RELEASE_ID.match(self.release_id):
            raise HandlerError(f"property ReleaseId: got {shown(self.release_id)}; expected r- and 16 hex digits")
        self.manifest_bucket = required("ManifestBucket")
        self.manifest_key = required("ManifestKey")
        self.manifest_sha256 = required("ManifestSha256")
        if not SHA256.match(self.manifest_sha256):
            raise HandlerError(f"property ManifestSha256: got {shown(self.manifest_sha256)}; expected 64 hex digits")
        self.code_sha256 = optional("CodeSha256", "")
        self.on_delete = optional("OnDelete", "retain")
        if self.on_delete not in ON_DELETE:
            raise HandlerError(f"property OnDelete: got {shown(self.on_delete)}; expected one of {', '.join(ON_DELETE)}")
        self.retired_tag_key = optional("RetiredTagKey", "triton-mme:release-state")
        retention = optional("RetentionDays", "7")
        try:
            self.retention_days = float(retention)
            if not 0 <= self.retention_days <= 36500:
                raise ValueError
        except ValueError:
            raise HandlerError(f"property RetentionDays: got {shown(retention)}; expected a number of days, 0 to 36500") from None
        if self.retention_days < MIN_RETENTION_DAYS:
            LOG.info("property RetentionDays %s: below the function's floor; %g day(s) are kept",
                     shown(retention), MIN_RETENTION_DAYS)
            self.retention_days = MIN_RETENTION_DAYS
        deployed = optional("Deployed", "")
        #: The stack's deployed record (what ``plan`` compares with), or None when the stack gives none.
        self.deployed: dict[str, Any] | None = None
        if deployed:
            try:
                self.deployed = parse_record(deployed, where="property Deployed")
            except DeployedRecordError as error:
                raise HandlerError(str(error)) from None
        self.stack_id = str(event.get("StackId") or "")

    @property
    def release(self) -> Release:
        return Release(self.release_id, self.manifest_sha256, self.code_sha256)

    @property
    def release_prefix(self) -> str:
        return self.release.prefix(self.model_prefix)

    @property
    def physical_id(self) -> str:
        """The fixed served prefix: the same for every release of this bucket and prefix."""
        return f"s3://{self.model_bucket}/{served_prefix(self.model_prefix)}/"

    def data(self, model_count: int) -> dict[str, str]:
        """The response attributes: a handful of short strings, whatever the number of models.
        No SageMaker resource reads them (the endpoint's ModelDataUrl comes from the settings)."""
        return {
            "ModelDataUrl": self.physical_id,
            "RoutesKey": routes_key(self.model_prefix),
            "IndexKey": self.release.index_key(self.model_prefix),
            "ModelCount": str(model_count),
            "ReleaseId": self.release_id,
        }

    def activate(self, s3: Any) -> Any:
        """Route this request's release (its index exists)."""
        from triton_mme_cdk.model_build.release.serving import activate_release

        report = activate_release(
            s3, self.model_bucket, self.model_prefix, self.release_id, stack=self.stack_id, deployed=self.deployed,
            retention_days=self.retention_days,
        )
        LOG.info("routed %s (was %s): %d routes, %d verified, %d copied back, %d unrouted now, %d deleted "
                 "after the retention window, routes written: %s", report.release_id, report.previous_release,
                 report.routed, report.verified, report.copied, len(report.unrouted_now), len(report.deleted),
                 report.wrote)
        return report


def s3_client() -> Any:
    """The handlers' S3 client (``MODEL_BUILD_S3_ENDPOINT_URL`` points it elsewhere, for local runs)."""
    from triton_mme_cdk.model_build.aws_clients import make_s3_client

    return make_s3_client(endpoint_url=os.environ.get("MODEL_BUILD_S3_ENDPOINT_URL"))


def load_manifest(s3: Any, request: Request) -> Manifest:
    """The manifest asset, read under the same limits as on a laptop; a missing or unreadable
    object fails at once with the S3 error code (a deleted asset must not wait out the timeout)."""
    from botocore.exceptions import BotoCoreError, ClientError

    where = f"s3://{request.manifest_bucket}/{request.manifest_key}"
    try:
        response = s3.get_object(Bucket=request.manifest_bucket, Key=request.manifest_key)
        size = int(response.get("ContentLength") or 0)
        if size > MAX_MANIFEST_BYTES:
            response["Body"].close()
            raise ManifestError(
                f"manifest {where!r}: is {size} bytes; at most {MAX_MANIFEST_BYTES} (MAX_MANIFEST_BYTES) are read"
            )
        body = response["Body"].read(MAX_MANIFEST_BYTES + 1)
    except ClientError as error:
        code = error.response.get("Error", {}).get("Code", "?")
        hint = "; the asset was deleted or is not readable: deploy again to upload it" if code in (
            "NoSuchKey", "NoSuchBucket", "AccessDenied", "404", "403") else ""
        raise ManifestError(f"manifest object {where}: cannot be read ({code}){hint}") from None
    except BotoCoreError as error:
        raise ManifestError(f"manifest object {where}: cannot be read ({error})") from None
    manifest = load_manifest_bytes(body, origin=where)
    if manifest.content_sha256() != request.manifest_sha256:
        raise ManifestError(
            f"manifest: content sha256 {manifest.content_sha256()[:16]}... does not match property "
            f"ManifestSha256 {request.manifest_sha256[:16]}...; the asset and the template disagree"
        )
    return manifest


def short_error(error: BaseException) -> HandlerError:
    """``error`` as the one short line CloudFormation shows: a build error's short reason, a
    handler error on one line, anything else (a bug, an AWS failure) its type and message, logged
    with its traceback. At most 400 characters."""
    if isinstance(error, ModelBuildError):
        return HandlerError(error.short_reason())
    if isinstance(error, HandlerError):
        return HandlerError(" ".join(str(error).split())[:400])
    # Anything else is a bug or an AWS failure: CloudFormation gets one short line at once
    # (the traceback goes to the log), never a resource left waiting for the timeout.
    LOG.error("unexpected failure", exc_info=error)
    return HandlerError(f"{type(error).__name__}: {' '.join(str(error).split())}"[:400])
