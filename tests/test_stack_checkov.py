"""The IaC scanner platform teams gate pull requests with (checkov), on the template of every
settings variant the tests synthesize (``VARIANTS``) and of the build construct without a customer
key: no failed check, every skip with its reason in the template, and every skip answering a
finding that checkov reports without it.

checkov runs from its own environment (``.venv-checkov``, ``make setup``), once in all, on two
folders: the templates as synthesized, and the same templates with their ``Metadata.checkov``
removed (one run: checkov's start is about 3 s of its time).
"""

from __future__ import annotations

import json
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aws_cdk as cdk
import pytest
from aws_cdk import Validations
from aws_cdk import aws_kms as kms
from aws_cdk import aws_s3 as s3
from cdk_helpers import ROOT, VARIANTS, VENV_BIN, flatten_join, synth, synth_pipeline

from triton_mme_cdk.constructs.customer_key import LOGS_STATEMENT_SID, logs_key
from triton_mme_cdk.constructs.model_build_resource import ModelBuildResource, ModelBuildResourceProps
from triton_mme_cdk.constructs.nag_acknowledgments import CHECKOV_METADATA_KEY, acknowledge, skip_checkov
from triton_mme_cdk.model_build.manifest import load_manifest

CHECKOV = ROOT / ".venv-checkov" / "bin" / "checkov"
#: The build construct on its own, with a bucket that has no customer key (not a settings variant).
NO_KEY = "no-key"
#: The delivery pipeline's stack and one target's access stack (mme:pipeline, cdk_helpers.PIPELINE).
PIPELINE_TEMPLATES = ("pipeline", "pipeline-access")
#: The page with the scanner tables (its "IaC scanner (checkov)" section).
SECURITY_DOC = ROOT / "docs" / "security.md"


@dataclass
class Scan:
    """checkov's results for each template, by template name: (check id, resource) per result."""

    templates: dict[str, dict[str, Any]]
    passed: dict[str, list[tuple[str, str]]]
    failed: dict[str, list[dict[str, Any]]]
    skipped: dict[str, list[dict[str, Any]]]
    #: What fails once the skips are removed from the templates.
    unexplained: dict[str, list[tuple[str, str]]]


def _no_key_template(outdir: Path) -> str:
    """A stack with only the build construct, publishing to a bucket without a KMS key."""
    app = cdk.App(outdir=str(outdir), analytics_reporting=False)
    stack = cdk.Stack(app, "NoKey")
    manifest_path = ROOT / "models.yaml"
    ModelBuildResource(stack, "ModelBuild", props=ModelBuildResourceProps(
        manifest=load_manifest(manifest_path), manifest_path=manifest_path,
        model_bucket=s3.Bucket.from_bucket_name(stack, "Bucket", "some-team-bucket"),
    ))
    app.synth()
    return (outdir / "NoKey.template.json").read_text(encoding="utf-8")


def _checkov(folder: Path) -> list[dict[str, Any]]:
    result = subprocess.run(
        [str(CHECKOV), "--directory", str(folder), "--framework", "cloudformation", "--output", "json",
         "--skip-download"],
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode in (0, 1), result.stderr[-2000:]
    report = json.loads(result.stdout)
    reports = report if isinstance(report, list) else [report]
    assert [r["check_type"] for r in reports] == ["cloudformation"], result.stdout[:500]
    assert reports[0]["summary"]["parsing_errors"] == 0
    return [check for kind in ("passed_checks", "failed_checks", "skipped_checks")
            for check in reports[0]["results"].get(kind, [])]


def _by_template(checks: list[dict[str, Any]], result: str, folder: Path) -> dict[str, list[dict[str, Any]]]:
    found: dict[str, list[dict[str, Any]]] = {}
    for check in checks:
        if check["check_result"]["result"] == result and Path(check["file_abs_path"]).parent == folder:
            name = Path(check["file_abs_path"]).name.removesuffix(".template.json")
            found.setdefault(name, []).append(check)
    return found


@pytest.fixture(scope="module")
def scan(tmp_path_factory: pytest.TempPathFactory) -> Scan:
    if not CHECKOV.exists():
        pytest.fail(f"{CHECKOV} is missing: `make setup` installs it from requirements-checkov.txt")
    folder = tmp_path_factory.mktemp("checkov")
    scanned = folder / "scanned"  # the two folders checkov reads, apart from the synth outputs
    as_synthesized, without_skips = scanned / "templates", scanned / "without-skips"
    as_synthesized.mkdir(parents=True)
    without_skips.mkdir()
    texts = {name: synth(folder / name, nag=True, **settings).text for name, settings in VARIANTS.items()}
    texts[NO_KEY] = _no_key_template(folder / NO_KEY)
    pipeline = synth_pipeline(folder / "pipeline")
    texts["pipeline"] = json.dumps(pipeline.templates["TritonMmePipeline"], indent=1)
    texts["pipeline-access"] = json.dumps(pipeline.templates["TritonMme-staging-pipeline-access"], indent=1)
    templates = {}
    for name, text in texts.items():
        (as_synthesized / f"{name}.template.json").write_text(text)
        templates[name] = json.loads(text)
        bare = json.loads(text)
        for resource in bare["Resources"].values():
            resource.get("Metadata", {}).pop(CHECKOV_METADATA_KEY, None)
        (without_skips / f"{name}.template.json").write_text(json.dumps(bare, indent=1))
    checks = _checkov(scanned)
    seen = {Path(check["file_abs_path"]).parent for check in checks}
    assert seen == {as_synthesized, without_skips}, seen
    bare = _by_template(checks, "FAILED", without_skips)
    return Scan(
        templates=templates,
        passed={k: [(c["check_id"], c["resource"]) for c in v]
                for k, v in _by_template(checks, "PASSED", as_synthesized).items()},
        failed=_by_template(checks, "FAILED", as_synthesized),
        skipped=_by_template(checks, "SKIPPED", as_synthesized),
        unexplained={k: [(c["check_id"], c["resource"]) for c in v] for k, v in bare.items()},
    )


@pytest.mark.parametrize("name", [*VARIANTS, NO_KEY, *PIPELINE_TEMPLATES])
def test_no_failed_check_without_a_recorded_reason(scan: Scan, name: str) -> None:
    failed = [f"{c['check_id']} {c['resource']}: {c['check_name']}" for c in scan.failed.get(name, [])]
    assert failed == [], (
        f"checkov fails on the {name} template; fix each finding, or skip it on that resource with "
        "the reason (constructs/nag_acknowledgments.py: skip_checkov, or acknowledge(..., checkov=...) "
        "next to the matching cdk-nag acknowledgment):\n" + "\n".join(failed)
    )
    assert scan.passed.get(name), f"checkov passed nothing on the {name} template: did it read it?"


def test_every_skip_has_a_reason_a_reviewer_can_read(scan: Scan) -> None:
    for name, skipped in scan.skipped.items():
        for check in skipped:
            reason = check["check_result"].get("suppress_comment") or ""
            assert len(reason) > 60, f"{name}: {check['check_id']} on {check['resource']}: {reason!r}"


def test_every_skip_answers_a_finding(scan: Scan) -> None:
    """Without the recorded skips, checkov fails exactly the skipped checks: none is stale, and
    every other finding is fixed."""
    for name in [*VARIANTS, NO_KEY, *PIPELINE_TEMPLATES]:
        skipped = sorted((c["check_id"], c["resource"]) for c in scan.skipped.get(name, []))
        assert sorted(scan.unexplained.get(name, [])) == skipped, name


def test_the_docs_table_is_the_scan(scan: Scan) -> None:
    """docs/security.md's scanner table gives each variant's counts and names every skipped check."""
    text = SECURITY_DOC.read_text(encoding="utf-8")
    section = text[text.index("\n## IaC scanner (checkov)\n"):]
    end = section.find("\n## ", 1)
    section = section if end == -1 else section[:end]
    for name in [*VARIANTS, *PIPELINE_TEMPLATES]:
        passed, skipped = len(scan.passed.get(name, [])), len(scan.skipped.get(name, []))
        row = re.search(rf"^\| {re.escape(name)} \| (\d+) \| \d+ \| (\d+) \| 0 \|$", section, re.M)
        assert row is not None, f"{SECURITY_DOC.name}: no row for the {name} template"
        assert (int(row[1]), int(row[2])) == (passed, skipped), f"{SECURITY_DOC.name}: {name} has {passed} passed, {skipped} skipped"
    default = (len(scan.passed["default"]), len(scan.skipped["default"]))
    assert f"{default[0]} passed, 0 failed, {default[1]} skipped" in section
    for name, skipped_checks in scan.skipped.items():
        for check_id in {c["check_id"] for c in skipped_checks}:
            assert f"`{check_id}`" in section, f"{check_id} (skipped in {name}) is not in the scanner tables of {SECURITY_DOC.name}"


def test_log_groups_and_lambda_environments_use_the_stack_key(scan: Scan) -> None:
    for name in VARIANTS:
        resources = scan.templates[name]["Resources"]
        keys = {k for k, r in resources.items() if r["Type"] == "AWS::KMS::Key"
                and r["Properties"]["Description"].startswith("Encrypts the model artifacts")}
        (key,) = keys
        for logical_id, resource in resources.items():
            props = resource.get("Properties", {})
            if resource["Type"] == "AWS::Logs::LogGroup":
                assert props.get("KmsKeyId") == {"Fn::GetAtt": [key, "Arn"]}, (name, logical_id)
            if resource["Type"] == "AWS::Lambda::Function" and "Environment" in props:
                assert props.get("KmsKeyArn") == {"Fn::GetAtt": [key, "Arn"]}, (name, logical_id)
        statements = resources[key]["Properties"]["KeyPolicy"]["Statement"]
        logs_statements = [s for s in statements if s.get("Sid") == LOGS_STATEMENT_SID]
        if not any(r["Type"] == "AWS::Logs::LogGroup" for r in resources.values()):
            # No log group (a published release served, no VPC created): CloudWatch Logs gets nothing.
            assert logs_statements == [], name
            continue
        (logs,) = logs_statements
        condition = json.dumps(logs["Condition"]["ArnLike"]["kms:EncryptionContext:aws:logs:arn"])
        assert ":logs:" in condition and condition.count(":log-group:*") == 1, condition
        # logs.<region>.<URL suffix> (amazonaws.com, amazonaws.com.cn in China).
        assert re.fullmatch(r"logs\.(<ref>|[a-z0-9-]+)\.<ref>", flatten_join(logs["Principal"]["Service"])), logs


def test_without_a_customer_key_the_choice_is_recorded(scan: Scan) -> None:
    """The build construct given a bucket without a key keeps the services' default encryption,
    and says so on each log group and framework function."""
    resources = scan.templates[NO_KEY]["Resources"]
    log_groups = {k: r for k, r in resources.items() if r["Type"] == "AWS::Logs::LogGroup"}
    assert len(log_groups) == 7  # on_event, is_complete, build, place, provider, waiter, build state machine
    for logical_id, resource in log_groups.items():
        assert "KmsKeyId" not in resource["Properties"], logical_id
        (skip,) = resource["Metadata"][CHECKOV_METADATA_KEY]["skip"]
        assert skip["id"] == "CKV_AWS_158" and skip["comment"].startswith("No customer key"), logical_id
    assert not [k for k, r in resources.items() if r["Type"] == "AWS::KMS::Key"]


def test_one_reason_serves_cdk_nag_and_checkov(tmp_path: Path) -> None:
    """acknowledge(..., checkov=...) writes the cdk-nag acknowledgment and the checkov skip with
    the same reason; skip_checkov keeps one reason per check and resource."""
    app = cdk.App(outdir=str(tmp_path))
    stack = cdk.Stack(app, "Acks")
    bucket = s3.Bucket(stack, "Logs")
    reason = "This bucket receives another bucket's server access logs; logging its own would recurse."
    acknowledge(bucket, "AwsSolutions-S1", reason, checkov=["CKV_AWS_18"])
    skip_checkov(bucket, ["CKV_AWS_18"], reason)  # the same reason again: no second entry
    with pytest.raises(ValueError, match="CKV_AWS_18 is already skipped for another reason"):
        skip_checkov(bucket, ["CKV_AWS_18"], "another reason")
    with pytest.raises(ValueError, match="no AWS::IAM::Policy resource"):
        skip_checkov(bucket, ["CKV_AWS_111"], reason, resource_type="AWS::IAM::Policy")
    template = app.synth().get_stack_artifact("Acks").template
    (logical_id,) = [k for k, r in template["Resources"].items() if r["Type"] == "AWS::S3::Bucket"]
    assert template["Resources"][logical_id]["Metadata"][CHECKOV_METADATA_KEY] == {
        "skip": [{"id": "CKV_AWS_18", "comment": reason}]
    }
    acknowledged = {
        re.sub(r"^annotation::", "", rule, flags=re.I): text
        for entry in bucket.node.metadata if entry.type == Validations.ACKNOWLEDGED_RULES_METADATA_KEY
        for rule, text in dict(entry.data).items()
    }
    assert acknowledged == {"AwsSolutions-S1": reason}


def test_an_imported_key_is_not_used_for_logs() -> None:
    """A key whose policy this app does not manage cannot be given to CloudWatch Logs."""
    stack = cdk.Stack(cdk.App(), "Keys")
    imported = kms.Key.from_key_arn(stack, "Imported", "arn:aws:kms:eu-west-1:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab")
    assert logs_key(imported) is None
    assert logs_key(None) is None
    owned = kms.Key(stack, "Owned")
    assert logs_key(owned) is owned and logs_key(owned) is owned  # one statement, however often asked
    statements = stack.resolve(owned.node.default_child.key_policy)["Statement"]  # type: ignore[union-attr]
    assert [s.get("Sid") for s in statements].count(LOGS_STATEMENT_SID) == 1


def test_cfn_lint_is_clean_without_a_customer_key(scan: Scan, tmp_path: Path) -> None:
    path = tmp_path / "no-key.template.json"
    path.write_text(json.dumps(scan.templates[NO_KEY]))
    result = subprocess.run([str(VENV_BIN / "cfn-lint"), str(path)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and not result.stdout.strip(), result.stdout + result.stderr
