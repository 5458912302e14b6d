"""What an S3 call needs from IAM, and what a synthesized template grants a role: moto checks no
IAM, so the tests record each S3 call and check it against the role's grants in the template."""

from __future__ import annotations

import re
from collections.abc import Mapping
from fnmatch import fnmatch
from typing import Any
from urllib.parse import unquote

from cdk_helpers import as_list, policy_of_role

Grant = tuple[str, re.Pattern[str], list[str] | None]

_HEX64 = re.compile(r"[0-9a-f]{64}")


def render(value: Any, model_bucket: str) -> str:
    """A template ARN as a glob: the model bucket is ``MODEL``, the CDK asset bucket ``ASSET``,
    the partition ``aws``, anything else ``*``."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and "Fn::Join" in value:
        sep, parts = value["Fn::Join"]
        return str(sep).join(render(part, model_bucket) for part in parts)
    if value == {"Fn::GetAtt": [model_bucket, "Arn"]}:
        return "arn:aws:s3:::MODEL"
    if value == {"Ref": "AWS::Partition"}:
        return "aws"
    if isinstance(value, dict) and "assets" in str(value.get("Fn::Sub", "")):
        return "ASSET"
    return "*"


def glob(pattern: str) -> re.Pattern[str]:
    parts = _HEX64.split(pattern)  # an asset's content hash stands for any content hash
    return re.compile("[0-9a-f]{64}".join(re.escape(p).replace(r"\*", ".*") for p in parts) + r"\Z")



def role_s3_grants(template: dict[str, Any], role_prefix: str) -> list[Grant]:
    """``(action, resource pattern, s3:prefix condition)`` of every S3 action the one role whose
    logical id starts with ``role_prefix`` is allowed."""
    roles = [k for k, v in template["Resources"].items() if v["Type"] == "AWS::IAM::Role" and k.startswith(role_prefix)]
    assert len(roles) == 1, roles
    model_bucket = next(k for k, v in template["Resources"].items()
                        if v["Type"] == "AWS::S3::Bucket" and k.startswith("ModelBucket"))
    grants = []
    for statement in policy_of_role(template, roles[0]):
        assert statement["Effect"] == "Allow"
        prefixes = statement.get("Condition", {}).get("StringLike", {}).get("s3:prefix")
        for action in as_list(statement["Action"]):
            if action.startswith("s3:"):
                for resource in as_list(statement["Resource"]):
                    grants.append((action, glob(render(resource, model_bucket)), prefixes))
    return grants


def granted(grants: list[Grant], action: str, resource: str, prefix: str | None) -> bool:
    return any(name == action and pattern.match(resource)
               and (prefix is None or conditions is None or any(fnmatch(prefix, c) for c in conditions))
               for name, pattern, conditions in grants)


def s3_actions(operation: str, params: Mapping[str, Any], arn: Any) -> list[tuple[str, str, str | None]]:
    """The IAM actions an S3 API call needs (AWS's S3 action mapping): ``(action, resource, prefix)``."""
    bucket, key = params.get("Bucket", ""), params.get("Key", "")
    obj = f"{arn(bucket)}/{key}"
    if operation in ("GetObject", "HeadObject"):
        return [("s3:GetObject", obj, None)]
    if operation in ("PutObject", "CreateMultipartUpload", "UploadPart", "CompleteMultipartUpload"):
        return [("s3:PutObject", obj, None)]
    if operation in ("AbortMultipartUpload", "GetObjectTagging", "PutObjectTagging", "DeleteObject"):
        return [(f"s3:{operation}", obj, None)]
    if operation in ("CopyObject", "UploadPartCopy"):
        source = params["CopySource"]
        if isinstance(source, str):
            src_bucket, _, src_key = unquote(source).lstrip("/").partition("/")
        else:
            src_bucket, src_key = source["Bucket"], source["Key"]
        src = f"{arn(src_bucket)}/{src_key}"
        # The tags travel with a copy unless replaced: reading and writing them is checked too.
        return [("s3:GetObject", src, None), ("s3:GetObjectTagging", src, None),
                ("s3:PutObject", obj, None), ("s3:PutObjectTagging", obj, None)]
    if operation in ("ListObjectsV2", "ListObjects"):
        return [("s3:ListBucket", arn(bucket), str(params.get("Prefix", "")))]
    if operation == "DeleteObjects":
        return [("s3:DeleteObject", f"{arn(bucket)}/{item['Key']}", None) for item in params["Delete"]["Objects"]]
    raise AssertionError(f"S3 operation {operation} is not mapped to IAM actions: add it to s3_actions")




def record_s3_calls(monkeypatch: Any) -> list[tuple[str, dict[str, Any]]]:
    """Every S3 call the handlers' clients (``make_s3_client``) make from now on, as
    ``(operation, params)``, recorded by a botocore hook before each call."""
    import triton_mme_cdk.model_build.aws_clients as aws_clients_module

    calls: list[tuple[str, dict[str, Any]]] = []
    real_make = aws_clients_module.make_s3_client

    def recording_client(**kwargs: Any) -> Any:
        client = real_make(**kwargs)
        client.meta.events.register("provide-client-params.s3.*",
                                    lambda params, model, **_: calls.append((model.name, dict(params))))
        return client

    monkeypatch.setattr(aws_clients_module, "make_s3_client", recording_client)
    return calls
