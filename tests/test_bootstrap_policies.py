"""``make bootstrap``'s first step (``bootstrap/policies.py``) against moto's IAM on loopback.

moto's server (the same one ``model_build/tools/local_s3.py`` starts) keeps IAM's policies and
versions; what IAM itself enforces on a version (a document's size, its grammar) is not modelled.
"""

from __future__ import annotations

import importlib.util
import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from cdk_helpers import ROOT

from triton_mme_cdk.model_build.tools.local_s3 import local_s3

_SPEC = importlib.util.spec_from_file_location("bootstrap_policies", ROOT / "bootstrap" / "policies.py")
assert _SPEC is not None and _SPEC.loader is not None
policies: Any = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(policies)
ACCOUNT = "123456789012"  # moto's account


@pytest.fixture
def session(monkeypatch: pytest.MonkeyPatch) -> Iterator[boto3.Session]:
    with local_s3() as url:
        # moto keeps its backends in this process across servers: start from none.
        urllib.request.urlopen(urllib.request.Request(f"{url}/moto-api/reset", method="POST"), timeout=10).close()
        for key, value in {"AWS_ENDPOINT_URL": url, "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
                           "AWS_DEFAULT_REGION": "us-east-1"}.items():
            monkeypatch.setenv(key, value)
        yield boto3.Session()


def _default_document(iam: Any, arn: str) -> Any:
    version = iam.get_policy(PolicyArn=arn)["Policy"]["DefaultVersionId"]
    document = iam.get_policy_version(PolicyArn=arn, VersionId=version)["PolicyVersion"]["Document"]
    return document if isinstance(document, dict) else json.loads(document)


def test_a_target_gets_the_boundary_and_its_execution_policy_and_a_change_a_new_default(
    session: boto3.Session, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert policies.main(["--account", ACCOUNT], session=session) == 0
    iam = session.client("iam")
    boundary = f"arn:aws:iam::{ACCOUNT}:policy/triton-mme-boundary"
    on_disk = json.loads((ROOT / "bootstrap" / "permissions-boundary.json").read_text())
    assert _default_document(iam, boundary) == on_disk
    assert "triton-mme-cfn-exec" in capsys.readouterr().out
    # Unchanged: no new version. Changed: a new default, the oldest other version deleted at five.
    assert policies.main(["--account", ACCOUNT], session=session) == 0
    assert len(iam.list_policy_versions(PolicyArn=boundary)["Versions"]) == 1
    for round_ in range(6):
        changed = {**on_disk, "Statement": on_disk["Statement"][: round_ + 1]}
        policies.put_policy(iam, ACCOUNT, "triton-mme-boundary", changed)
        assert _default_document(iam, boundary) == changed
    assert len(iam.list_policy_versions(PolicyArn=boundary)["Versions"]) == policies.MAX_VERSIONS


def test_the_pipelines_account_gets_its_own_execution_policy(session: boto3.Session) -> None:
    assert policies.main(["--account", ACCOUNT, "--pipeline"], session=session) == 0
    names = {p["PolicyName"] for p in session.client("iam").list_policies(Scope="Local")["Policies"]}
    assert names == {"triton-mme-boundary", "triton-mme-pipeline-cfn-exec"}


def test_credentials_of_another_account_are_refused_before_any_write(
    session: boto3.Session, capsys: pytest.CaptureFixture[str]
) -> None:
    assert policies.main(["--account", "210987654321"], session=session) == 1
    assert capsys.readouterr().err.strip() == ("error: --account: got 210987654321; the credentials are of "
                                               f"account {ACCOUNT}")
    assert session.client("iam").list_policies(Scope="Local")["Policies"] == []


def test_the_qualifier_is_written_once_and_another_one_is_refused(tmp_path: Path) -> None:
    cdk_json = tmp_path / "cdk.json"
    cdk_json.write_text(json.dumps({"app": "python3 app.py", "context": {"a": 1}}))
    assert policies.main(["--set-qualifier", str(cdk_json)]) == 0
    data = json.loads(cdk_json.read_text())
    assert data["context"] == {"a": 1, "@aws-cdk/core:bootstrapQualifier": "tritonmme"}
    assert policies.set_qualifier(cdk_json) is False
    data["context"]["@aws-cdk/core:bootstrapQualifier"] = "hnb659fds"
    cdk_json.write_text(json.dumps(data))
    assert policies.main(["--set-qualifier", str(cdk_json)]) == 1
    assert json.loads(cdk_json.read_text())["context"]["@aws-cdk/core:bootstrapQualifier"] == "hnb659fds"
