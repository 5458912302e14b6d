"""``triton-mme doctor``: the invariants of :mod:`model_build.release.invariants` checked on a live
bucket, each broken one reported in one line naming the object and the route, and, with
``repair``, fixed where the store can fix it.

What it repairs: a routed (or retained) object deleted or overwritten is copied back from its
stored build (``<prefix>/_builds/<key>/model.tar.gz``) when that still holds the digest's bytes; a
routes document whose routes differ from its release's index is written again from the index (the
activation of that release, :func:`model_build.release.serving.activate_release`). What it refuses,
saying why: an object whose stored build is gone or holds other bytes (build and deploy the model
again), a routes document whose index is gone (deploy a release again). Without ``repair`` it
only reads.

Bad input is one line naming what was read and what was expected (:class:`DoctorError`): no routes
document (not this project's bucket or prefix), the routes of another stack or of another served
prefix, a refused read (with the permissions it needs, :func:`permissions`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from triton_mme_cdk.model_build.errors import ModelBuildError
from triton_mme_cdk.model_build.release.identity import routes_key, served_prefix
from triton_mme_cdk.model_build.release.invariants import (
    BucketCheck,
    Expected,
    Violation,
    check_bucket,
    copy_from_store,
)
from triton_mme_cdk.model_build.release.routes import DEFAULT_RETENTION_DAYS, Routes, RoutesError
from triton_mme_cdk.model_build.release.transfer import error_code

#: Exit codes, as ``plan --detailed-exitcode`` gives them: 0 nothing wrong (or all of it repaired),
#: 3 broken invariants the store can repair (run with ``--repair``), 4 broken invariants it cannot
#: repair (or a repair that failed); 1 an error (bad input, a refused read), 2 a usage error.
EXIT_HOLDS, EXIT_REPAIRABLE, EXIT_BROKEN = 0, 3, 4
_DENIED = {"AccessDenied", "403", "Forbidden", "AllAccessDisabled", "InvalidAccessKeyId", "SignatureDoesNotMatch",
           "ExpiredToken", "KMS.AccessDeniedException"}


class DoctorError(ModelBuildError):
    """What ``doctor`` was given cannot be checked: one line naming what it read and what it expected."""

    step = "doctor"


def permissions(bucket: str, prefix: str, *, repair: bool) -> list[str]:
    """The IAM permissions ``doctor`` needs on ``s3://bucket/prefix``: reading everything it checks
    (a role ``grant_invoke`` does not give: that one reads the routes document alone), and with
    ``repair`` the writes of the copy back and of the routes document."""
    base = f"arn:aws:s3:::{bucket}/{prefix.strip('/')}" if prefix.strip("/") else f"arn:aws:s3:::{bucket}"
    needed = [f"s3:ListBucket on arn:aws:s3:::{bucket} (prefix {prefix.strip('/') or '(all)'}/)",
              f"s3:GetObject on {base}/*",
              "kms:Decrypt on the bucket's KMS key, where it has one"]
    if repair:
        needed += [f"s3:PutObject on {base}/served/* and {base}/_routes/*",
                   f"s3:DeleteObject on {base}/served/* (an overwritten object is replaced)",
                   "kms:GenerateDataKey on the bucket's KMS key, where it has one"]
    return needed


@dataclass
class Diagnosis:
    """What ``doctor`` found, and with ``repair`` what it fixed and what it refused."""

    check: BucketCheck
    repair: bool
    repaired: list[Violation] = field(default_factory=list)
    refused: list[tuple[Violation, str]] = field(default_factory=list)
    #: Violations left after the repairs (a second check).
    left: list[Violation] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        if self.repair:
            return EXIT_BROKEN if self.refused or self.left else EXIT_HOLDS
        if not self.check.violations:
            return EXIT_HOLDS
        return EXIT_BROKEN if any(not v.repair for v in self.check.violations) else EXIT_REPAIRABLE

    def lines(self) -> list[str]:
        check, bucket = self.check, self.check.bucket
        routes = check.routes
        assert routes is not None
        found = [f"doctor s3://{bucket}/{check.prefix}/: release {routes.release_id}, {len(routes.routes)} routes, "
                 f"{len(routes.unrouted)} unrouted kept, {check.checked} objects checked: "
                 f"{len(check.violations)} broken invariant(s)"]
        for violation in check.violations:
            then = (f"; repair: {violation.repair}" if violation.repair
                    else f"; not repairable from the store: {violation.refused}")
            found.append(violation.line(bucket) + ("" if self.repair else then))
        found += [f"repaired: {v.line(bucket)}: {v.repair}" for v in self.repaired]
        found += [f"refused: {v.line(bucket)}: {why}" for v, why in self.refused]
        found += [f"still broken: {v.line(bucket)}" for v in self.left if v not in {r for r, _ in self.refused}]
        if check.violations and not self.repair:
            found.append("run again with --repair to fix what the store can fix" if any(
                v.repair for v in check.violations) else "nothing here can be repaired from the store")
        return found

    def as_json(self) -> dict[str, Any]:
        check, bucket = self.check, self.check.bucket
        routes = check.routes
        return {
            "bucket": bucket, "prefix": check.prefix, "routes": f"s3://{bucket}/{routes_key(check.prefix)}",
            "release_id": routes.release_id if routes else None, "routes_count": len(routes.routes) if routes else 0,
            "checked": check.checked, "violations": [v.as_json(bucket) for v in check.violations],
            "repaired": [v.as_json(bucket) for v in self.repaired],
            "refused": [dict(v.as_json(bucket), refused=why) for v, why in self.refused],
            "left": [v.as_json(bucket) for v in self.left], "exit_code": self.exit_code,
        }


def diagnose(s3: Any, bucket: str, prefix: str, *, stack: str | None = None, repair: bool = False,
             retention_days: float = DEFAULT_RETENTION_DAYS, read_bytes: bool = False,
             clock: Callable[[], float] = time.time) -> Diagnosis:
    """Check ``s3://bucket/prefix`` (``stack``: the stack whose routes these must be, its id or
    name; None accepts any writer) and, with ``repair``, fix what the store can. Raises
    :class:`DoctorError` on bad input or a refused read; never writes without ``repair``."""
    prefix = prefix.strip("/")
    where = f"s3://{bucket}/{routes_key(prefix)}"
    try:
        routes = _routes(s3, bucket, prefix, stack, where, repair)
        check = check_bucket(s3, bucket, prefix, routes=routes, retention_days=retention_days, clock=clock,
                             read_bytes=read_bytes)
        diagnosis = Diagnosis(check, repair)
        if repair and check.violations:
            _repair(s3, diagnosis, retention_days)
            diagnosis.left = check_bucket(s3, bucket, prefix, retention_days=retention_days, clock=clock,
                                          read_bytes=read_bytes).violations
        return diagnosis
    except ClientError as error:
        raise _refused(error, bucket, prefix, repair) from None
    except BotoCoreError as error:
        raise DoctorError(f"s3://{bucket}/{prefix}/: cannot be read ({error_code(error)}); expected S3 to answer "
                          "(credentials, region, --endpoint-url)") from None


def _routes(s3: Any, bucket: str, prefix: str, stack: str | None, where: str, repair: bool) -> Routes:
    from triton_mme_cdk.model_build.release.index import read_routes

    try:
        routes = read_routes(s3, bucket, prefix)
    except RoutesError as error:
        if any(code in str(error) for code in _DENIED):
            raise _denied(f"reading {where}", bucket, prefix, repair=repair) from None
        raise DoctorError(f"{error}; expected the routes document a triton-mme stack or publish writes") from None
    if routes is None:
        raise DoctorError(f"{where}: no routes document; expected the one a triton-mme stack (or publish) writes "
                          "there: is this the stack's model bucket and prefix? (its outputs name the routes URL)")
    if stack and routes.stack != stack and routes.stack.split("/")[1:2] != [stack]:
        writer = f"stack {routes.stack}" if routes.stack else "the CLI (no stack)"
        raise DoctorError(f"{where}: written by {writer}; expected stack {stack}'s routes: another stack's routes, "
                          "nothing checked")
    expected_url = f"s3://{bucket}/{served_prefix(prefix)}/"
    if routes.model_data_url != expected_url:
        raise DoctorError(f"{where}: serves {routes.model_data_url}; expected {expected_url} (the routes of another "
                          "bucket or prefix, copied here?): nothing checked")
    return routes


def _repair(s3: Any, diagnosis: Diagnosis, retention_days: float) -> None:
    from triton_mme_cdk.model_build.errors import PublishError
    from triton_mme_cdk.model_build.release.serving import activate_release

    check = diagnosis.check
    routes = check.routes
    assert routes is not None
    reroute = False
    for violation in check.violations:
        if not violation.repair:
            diagnosis.refused.append((violation, violation.refused))
            continue
        if violation.invariant == "release-index":
            reroute = True
            continue
        obj = _expected(routes, violation)
        try:
            copy_from_store(s3, check.bucket, check.prefix, obj)
        except PublishError as error:
            diagnosis.refused.append((violation, str(error)))
            continue
        diagnosis.repaired.append(violation)
    if reroute:
        try:
            activate_release(s3, check.bucket, check.prefix, routes.release_id, stack=routes.stack,
                             retention_days=retention_days)
        except ModelBuildError as error:
            diagnosis.refused += [(v, str(error)) for v in check.violations if v.invariant == "release-index"]
            return
        diagnosis.repaired += [v for v in check.violations if v.invariant == "release-index"]


def _expected(routes: Routes, violation: Violation) -> Expected:
    name = violation.key.rsplit("/", 1)[1]
    for route in routes.routes.values():
        if route.target_model == name:
            return Expected(violation.key, route.logical_name, route.sha256, route.size, route.model_key)
    item = routes.unrouted[name]
    return Expected(violation.key, item.logical_name, item.sha256, item.size, item.model_key)


def _refused(error: ClientError, bucket: str, prefix: str, repair: bool) -> DoctorError:
    code = error_code(error)
    operation = getattr(error, "operation_name", "") or "a request"
    if code in _DENIED:
        return _denied(f"{operation} under s3://{bucket}/{prefix}/", bucket, prefix, repair=repair, code=code)
    if code in {"NoSuchBucket"}:
        return DoctorError(f"s3://{bucket}/: no such bucket; expected the stack's model bucket")
    return DoctorError(f"{operation} under s3://{bucket}/{prefix}/ failed ({code}); nothing was changed"
                       if not repair else f"{operation} under s3://{bucket}/{prefix}/ failed ({code})")


def _denied(what: str, bucket: str, prefix: str, *, repair: bool, code: str = "AccessDenied") -> DoctorError:
    return DoctorError(f"{what}: {code}; doctor needs {'; '.join(permissions(bucket, prefix, repair=repair))}")
