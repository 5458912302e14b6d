"""Create or update this project's IAM policies in one account: the first step of ``make bootstrap``.

The permissions boundary (``triton-mme-boundary``) and the account's execution policy
(``triton-mme-cfn-exec``, or ``triton-mme-pipeline-cfn-exec`` with ``--pipeline``) from this
folder's JSON files. A policy that exists gets the file as a new default version where its
default differs (the oldest other version is deleted first when IAM's five are taken). Run with
the account's administrator credentials (boto3's usual chain); the credentials' account must be
``--account``. ``--set-qualifier`` writes the project's bootstrap qualifier into ``cdk.json``'s
context, with which the app puts the boundary on every role (app.py, docs/pipelines.md).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any
from urllib.parse import unquote

HERE = Path(__file__).resolve().parent
BOUNDARY = "triton-mme-boundary"
#: The policies of a target account, and of the pipeline's account (its own execution policy).
POLICIES = {False: {BOUNDARY: "permissions-boundary.json", "triton-mme-cfn-exec": "execution-policy.json"},
            True: {BOUNDARY: "permissions-boundary.json",
                   "triton-mme-pipeline-cfn-exec": "pipeline-execution-policy.json"}}
QUALIFIER = "tritonmme"
QUALIFIER_KEY = "@aws-cdk/core:bootstrapQualifier"
#: IAM keeps at most five versions of a managed policy.
MAX_VERSIONS = 5


class BootstrapError(Exception):
    """A refused input or state, said in one line."""


def _document(version: dict[str, Any]) -> Any:
    document = version["Document"]
    return json.loads(unquote(document)) if isinstance(document, str) else document


def put_policy(iam: Any, account: str, name: str, document: dict[str, Any]) -> str:
    """Create ``name`` with ``document``, or make ``document`` its default version; its ARN."""
    arn = f"arn:aws:iam::{account}:policy/{name}"
    try:
        policy = iam.get_policy(PolicyArn=arn)["Policy"]
    except iam.exceptions.NoSuchEntityException:
        iam.create_policy(PolicyName=name, PolicyDocument=json.dumps(document),
                          Description="triton-mme-cdk bootstrap/ (docs/pipelines.md)")
        return arn
    default = iam.get_policy_version(PolicyArn=arn, VersionId=policy["DefaultVersionId"])["PolicyVersion"]
    if _document(default) == document:
        return arn
    versions = iam.list_policy_versions(PolicyArn=arn)["Versions"]
    if len(versions) >= MAX_VERSIONS:
        oldest = min((v for v in versions if not v["IsDefaultVersion"]), key=lambda v: v["CreateDate"])
        iam.delete_policy_version(PolicyArn=arn, VersionId=oldest["VersionId"])
    iam.create_policy_version(PolicyArn=arn, PolicyDocument=json.dumps(document), SetAsDefault=True)
    return arn


def put_policies(session: Any, account: str, *, pipeline: bool) -> dict[str, str]:
    """Every policy the account needs, created or updated: name -> ARN."""
    found = session.client("sts").get_caller_identity()["Account"]
    if found != account:
        raise BootstrapError(f"--account: got {account}; the credentials are of account {found}")
    iam = session.client("iam")
    return {name: put_policy(iam, account, name, json.loads((HERE / file).read_text(encoding="utf-8")))
            for name, file in POLICIES[pipeline].items()}


def set_qualifier(cdk_json: Path) -> bool:
    """Name the project's qualifier in ``cdk_json``'s context; False where it already did."""
    data = json.loads(cdk_json.read_text(encoding="utf-8"))
    context = data.setdefault("context", {})
    given = context.get(QUALIFIER_KEY)
    if given == QUALIFIER:
        return False
    if given is not None:
        raise BootstrapError(f"{cdk_json}: {QUALIFIER_KEY} is {given!r}; this project's bootstrap is {QUALIFIER!r}")
    context[QUALIFIER_KEY] = QUALIFIER
    cdk_json.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    return True


def main(argv: list[str] | None = None, session: Any = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--account", help="the 12-digit account to create the policies in")
    parser.add_argument("--pipeline", action="store_true", help="the pipeline's account (its own execution policy)")
    parser.add_argument("--set-qualifier", type=Path, metavar="CDK_JSON", help="name the qualifier in this cdk.json")
    args = parser.parse_args(argv)
    try:
        if args.account is not None:
            if not (len(args.account) == 12 and args.account.isdigit()):
                raise BootstrapError(f"--account: got {args.account!r}; expected 12 digits")
            if session is None:
                import boto3

                session = boto3.Session()
            for name, arn in put_policies(session, args.account, pipeline=args.pipeline).items():
                print(f"{name}: {arn}")
        if args.set_qualifier is not None and set_qualifier(args.set_qualifier):
            print(f"{args.set_qualifier}: {QUALIFIER_KEY} = {QUALIFIER} (commit it: the app then puts "
                  f"{BOUNDARY} on every role)")
    except BootstrapError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
