"""Malformed CloudFormation events and a broken manifest asset: the custom resource's Lambda
entry points (``on_event``, ``is_complete``) fail at once with one short reason that
CloudFormation shows, never a ``KeyError`` traceback or a resource left waiting for the Provider's
timeout, and write nothing to the model bucket (moto's real S3 server on loopback).

Each event runs in a subprocess under a memory limit; the runner prints what the Lambda's
failure would give CloudFormation (``error: <reason>``) and exits 1.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hostile_helpers import assert_refused, run_bounded

from triton_mme_cdk.model_build.aws_clients import make_s3_client
from triton_mme_cdk.model_build.manifest import MAX_MANIFEST_BYTES
from triton_mme_cdk.model_build.tools.local_s3 import local_s3

ASSETS = "hostile-assets"
MODELS = "hostile-models"
RUNNER = """
import json, sys
from triton_mme_cdk.model_build import handler
try:
    result = getattr(handler, sys.argv[1])(json.loads(sys.argv[2]))
except handler.HandlerError as error:
    print(f"error: {error}", file=sys.stderr)
    sys.exit(1)
print(json.dumps(result))
"""


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    with local_s3() as endpoint:
        s3 = make_s3_client(endpoint_url=endpoint)
        for bucket in (ASSETS, MODELS):
            s3.create_bucket(Bucket=bucket)
        s3.put_object(Bucket=ASSETS, Key="laughs.yaml",
                      Body=b"a: &a [1, 1]\nb: [*a, *a]\nversion: 1\nmodels: []\n")
        s3.put_object(Bucket=ASSETS, Key="huge.yaml", Body=b"#" * (MAX_MANIFEST_BYTES + 1))
        yield endpoint


def _props(**changes: Any) -> dict[str, Any]:
    props: dict[str, Any] = {
        "ServiceToken": "arn:aws:lambda:us-east-1:123456789012:function:provider",
        "ManifestBucket": ASSETS,
        "ManifestKey": "deleted.yaml",
        "ManifestSha256": "0" * 64,
        "ModelBucket": MODELS,
        "ModelPrefix": "models",
        "ReleaseId": "r-0123456789abcdef",
        "OnDelete": "retain",
    }
    props.update(changes)
    return {k: v for k, v in props.items() if v is not None}


def _event(request_type: Any = "Create", **props: Any) -> dict[str, Any]:
    return {"RequestType": request_type, "RequestId": "r1", "StackId": "arn:aws:cloudformation:us-east-1:1:stack/s/x",
            "LogicalResourceId": "ModelBuildResource", "ResourceProperties": _props(**props)}


#: name -> (event, fragments of the reason)
CORPUS: dict[str, tuple[Any, tuple[str, ...]]] = {
    "not-an-object": ([1, 2], ("event: got list",)),
    "no-request-type": ({"ResourceProperties": _props()}, ("RequestType: got None", "Create, Update, Delete")),
    "unknown-request-type": (_event("Upsert"), ("RequestType: got 'Upsert'", "Create, Update, Delete")),
    "properties-not-an-object": ({"RequestType": "Create", "ResourceProperties": "ModelBucket=x"},
                                 ("ResourceProperties: got str",)),
    "missing-bucket": (_event(ModelBucket=None), ("property ModelBucket: got None",)),
    "bad-release-id": (_event(ReleaseId="latest"), ("property ReleaseId: got 'latest'",)),
    "bad-sha": (_event(ManifestSha256="x" * 5000), ("property ManifestSha256", "64 hex digits")),
    "prefix-not-a-string": (_event(ModelPrefix=5), ("property ModelPrefix: got 5",)),
    "manifest-deleted": (_event(), (f"s3://{ASSETS}/deleted.yaml", "NoSuchKey", "deploy again")),
    "manifest-bucket-gone": (_event(ManifestBucket="no-such-assets"), ("no-such-assets", "NoSuchBucket")),
    "manifest-alias-bomb": (_event(ManifestKey="laughs.yaml"), (f"s3://{ASSETS}/laughs.yaml", "anchor")),
    "manifest-too-big": (_event(ManifestKey="huge.yaml"), ("huge.yaml", f"at most {MAX_MANIFEST_BYTES}")),
}

#: The corpus entry whose runs are plain fresh subprocesses (``run_bounded(fresh=True)``); the
#: others are forked from the zygote (tests/hostile_helpers.py says what that shares).
FRESH = min(CORPUS)


@pytest.mark.parametrize("entry", ["on_event", "is_complete"])
@pytest.mark.parametrize("name", sorted(CORPUS))
def test_custom_resource_fails_fast(name: str, entry: str, s3_endpoint: str, tmp_path: Path) -> None:
    event, fragments = CORPUS[name]
    outcome = run_bounded(["-c", RUNNER, entry, json.dumps(event)],
                          env={"MODEL_BUILD_S3_ENDPOINT_URL": s3_endpoint, "AWS_DEFAULT_REGION": "us-east-1",
                               "TMPDIR": str(tmp_path)},
                          fresh=name == FRESH and entry == "on_event")
    line = assert_refused(outcome, *fragments)
    assert len(line) <= 420, "CloudFormation shows a short reason"
    assert make_s3_client(endpoint_url=s3_endpoint).list_objects_v2(Bucket=MODELS).get("KeyCount", 0) == 0
    assert not any(tmp_path.iterdir()), "nothing is built for a refused request"


def test_delete_with_malformed_properties_still_succeeds(s3_endpoint: str) -> None:
    """A Delete must never fail on properties a failed Create left behind (or CloudFormation
    could not remove the stack); an unknown request type is still refused."""
    event = {"RequestType": "Delete", "PhysicalResourceId": "none", "ResourceProperties": {"ModelBucket": 5}}
    for entry in ("on_event", "is_complete"):
        outcome = run_bounded(["-c", RUNNER, entry, json.dumps(event)],
                              env={"MODEL_BUILD_S3_ENDPOINT_URL": s3_endpoint, "AWS_DEFAULT_REGION": "us-east-1"})
        assert outcome.returncode == 0, outcome.stderr
        assert "Traceback" not in outcome.stderr
