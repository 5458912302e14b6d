"""``doctor``: check the bucket the endpoint serves from, and repair what the store can repair.

It reads the routes document and checks the invariants of
:mod:`model_build.release.invariants` (every routed target in ``served/`` with its digest's bytes,
nothing retained within the window deleted, the routes matching an index that exists), one line
per broken invariant naming the object and the route. ``--repair`` copies back from the store what
it still holds and refuses the rest, saying why; without it nothing is written. Exit codes, as
``plan --detailed-exitcode``: 0 every invariant holds (or all was repaired), 3 broken invariants
the store can repair, 4 broken invariants it cannot (or a repair refused); 1 an error (no routes
document, another stack's routes, a refused read: with the permissions doctor needs), 2 a usage
error. Output: ``--format text|json``.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from triton_mme_cdk.model_build.release.routes import DEFAULT_RETENTION_DAYS


def cmd_doctor(args: argparse.Namespace) -> int:
    from triton_mme_cdk.model_build.aws_clients import make_s3_client
    from triton_mme_cdk.model_build.release.doctor import diagnose

    s3 = make_s3_client(endpoint_url=args.endpoint_url, region=args.region)
    diagnosis = diagnose(s3, args.bucket, args.prefix, stack=args.stack, repair=args.repair,
                         retention_days=args.retention_days, read_bytes=args.read_bytes)
    if args.format == "json":
        sys.stdout.write(json.dumps(diagnosis.as_json(), indent=1, sort_keys=True) + "\n")
    else:
        sys.stdout.write("\n".join(diagnosis.lines()) + "\n")
    return diagnosis.exit_code


def add_doctor_parser(sub: Any, default_prefix: str) -> None:
    doctor = sub.add_parser("doctor", help="check the served bucket's invariants; --repair fixes what the store can",
                            description=(__doc__ or "").split("\n\n")[1].replace("\n", " "))
    doctor.add_argument("--bucket", required=True, help="the model bucket (the stack's ModelBucket output)")
    doctor.add_argument("--prefix", default=default_prefix, help=f"model prefix (default: {default_prefix})")
    doctor.add_argument("--stack", default=None, metavar="STACK",
                        help="the stack whose routes these must be (its name or id; default: any writer)")
    doctor.add_argument("--repair", action="store_true",
                        help="copy back from the store what it still holds; refuse the rest, saying why")
    doctor.add_argument("--retention-days", type=_days, default=DEFAULT_RETENTION_DAYS, metavar="DAYS",
                        help=f"the stack's unrouted_retention_days (default: {DEFAULT_RETENTION_DAYS})")
    doctor.add_argument("--read-bytes", action="store_true",
                        help="read and hash every routed object too (one GET each), not only its S3 checksum")
    doctor.add_argument("--format", choices=("text", "json"), default="text", help="what to print (default: text)")
    doctor.add_argument("--endpoint-url", default=None, help="S3 endpoint (default: AWS)")
    doctor.add_argument("--region", default=None, help="AWS region (default: from the environment)")
    doctor.set_defaults(func=cmd_doctor)


def _days(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"got {text!r}; expected a number of days, 1 to 36500") from None
    if not 1 <= value <= 36500:
        raise argparse.ArgumentTypeError(f"got {text!r}; expected a number of days, 1 to 36500")
    return value
