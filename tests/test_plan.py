"""``python -m model_build plan``: the pull-request view, template against template.

Each verdict from real synthesized templates and the real CDK diff engine: a model change (models
only), an instance-type change and a construct-code change of the Model's environment (fleet
replaced, the property named), a first deploy (fleet created; its roles and keys are security
changed, exit 4), each category of security change (IAM policies, a role's trust, inline and
managed policies, the key policy, the bucket policy, public access and encryption, security
groups, VPC endpoint policies: widens exit 4, narrows exit 3, unclassifiable exit 4, and every
finding listed whichever verdict leads), routes published by the CLI
(fleet unknown, exit 4), a bucket replacement and a removed log group (data at risk), the stack's
template read from CloudFormation (moto on loopback); the JSON
against its schema; the markdown's size at 3,000 models; bad input as one line, never a verdict.
Without ``--template`` plan runs the app's ``cdk.json`` command as ``cdk synth`` does (the bigger
instance type's template is that synth's): an app that refuses its input is its one error line.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from cdk_helpers import subprocess_env, synth

from triton_mme_cdk.model_build.__main__ import main
from triton_mme_cdk.model_build.manifest import load_manifest
from triton_mme_cdk.model_build.release import compute_release, entry_sha256, model_code_sha256
from triton_mme_cdk.model_build.release.deployed import (
    FLEET_TYPES,
    DeployedRecordError,
    check_embedded,
    record_from_template,
)
from triton_mme_cdk.model_build.release.routes import ModelPlan, Planned, Route, Routes, Updated
from triton_mme_cdk.model_build.tools.app_context import AppConfig, parse_overrides
from triton_mme_cdk.model_build.tools.review.plan_cli import synthesized_template
from triton_mme_cdk.model_build.tools.review.plan_report import GITHUB_COMMENT_LIMIT, PlanReport, marker
from triton_mme_cdk.model_build.tools.review.plan_verdict import Finding, Verdict

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = json.loads((ROOT / "model_build" / "tools" / "review" / "plan.schema.json").read_text())
STACK_ARN = "arn:aws:cloudformation:eu-west-1:123456789012:stack/TritonMme/0a1b2c3d"
pytestmark = pytest.mark.slow  # real synths and the diff engine on Node.js
#: The default template's logical ids a security change edits.
BUCKET, KEY = "ModelBucket220C70D9", "ModelBucketKey30C95F77"
EXECUTION_ROLE, EXECUTION_POLICY = "ExecutionRoleFAA49FA6", "ExecutionRoleDefaultPolicyDE3B85B1"
WHOLE_BUCKET = {"Fn::Join": ["", [{"Fn::GetAtt": [BUCKET, "Arn"]}, "/*"]]}


def _write(path: Path, data: Any) -> str:
    path.write_text(json.dumps(data), encoding="utf-8")
    return str(path)


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("plan")


@pytest.fixture(scope="module")
def default(work: Path) -> dict[str, Any]:
    return synth(work / "default", nag=False).data


@pytest.fixture(scope="module")
def bigger() -> dict[str, Any]:
    """The template ``plan`` synthesizes itself: the checkout's app run as ``cdk synth`` runs it
    (cdk.json's command in a process, the -c settings in CDK_CONTEXT_JSON, a cloud assembly in a
    temporary CDK_OUTDIR), its one endpoint stack taken from the assembly."""
    name, template = synthesized_template(AppConfig.find(ROOT, parse_overrides(["mme:instance_type=ml.g5.2xlarge"])))
    assert name == "TritonMme"
    return template


@pytest.fixture(scope="module")
def new_default_variable(work: Path) -> Iterator[dict[str, Any]]:
    """A change in construct code, not in any setting: the endpoint gains a default container
    variable (here by renaming the log-verbosity key, as an upgrade of the construct would)."""
    import triton_mme_cdk.constructs.sagemaker_hosting as endpoint_module

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(endpoint_module, "LOG_VERBOSE_KEY", "SAGEMAKER_TRITON_LOG_INFO")
        yield synth(work / "code", nag=False).data


def _routes(*, deployed: dict[str, Any] | None, stack: str = STACK_ARN, drop: str = "", stale: str = "",
            code_sha256: str = "") -> Routes:
    """Live routes of the default manifest, as a deploy (with its record) or the CLI wrote them."""
    manifest = load_manifest(ROOT / "models.yaml")
    release = compute_release(manifest, base_dir=ROOT)
    routes = {}
    for spec in manifest.models:
        for target in spec.target_names():
            if target == drop:
                continue
            digest = "0" * 64 if target == stale else entry_sha256(spec, ROOT)
            routes[target] = Route(target, f"{target}-000000000000.tar.gz", "a" * 64, 1234, release.model_keys[spec.name],
                                   spec.name, digest)
    return Routes(release.release_id, "s3://b/models/served/", "k", routes, stack=stack,
                  model_code_sha256=code_sha256 or model_code_sha256(), deployed=deployed)


def _plan(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, Any], str]:
    """The plan in process: its exit code, its JSON (validated against the schema) and stderr."""
    code = main(["plan", "--format", "json", "--detailed-exitcode", *args])
    captured = capsys.readouterr()
    if code == 1:
        return code, {}, captured.err
    report = json.loads(captured.out)
    jsonschema.validate(report, SCHEMA, cls=jsonschema.Draft202012Validator)
    assert report["exit_code"] == code
    return code, report, captured.err


def test_the_template_carries_its_own_record(default: dict[str, Any]) -> None:
    """The record the deploy writes is the synthesized template's own fleet and data resources (and
    what they reference); a property the record does not see is refused at synth."""
    check_embedded(default)
    record = record_from_template(default)
    types = {resource["Type"] for resource in record["resources"].values()}
    assert set(FLEET_TYPES) <= types and {"AWS::S3::Bucket", "AWS::KMS::Key", "AWS::IAM::Role"} <= types
    assert list(record["mappings"]) == [lid for lid in default["Mappings"] if lid.startswith("TritonImage")]
    tampered = copy.deepcopy(default)
    model = next(r for r in tampered["Resources"].values() if r["Type"] == "AWS::SageMaker::Model")
    model["Properties"]["PrimaryContainer"]["Environment"]["EXTRA"] = "1"
    with pytest.raises(DeployedRecordError, match=r"EndpointModel.* differs from the template"):
        check_embedded(tampered)


def test_a_model_change_is_models_only(default: dict[str, Any], work: Path, capsys: pytest.CaptureFixture[str]) -> None:
    template = _write(work / "t-default.json", default)
    same = _write(work / "r-same.json", json.loads(_routes(deployed=record_from_template(default)).body()))
    code, report, _ = _plan(capsys, "--routes-file", same, "--template", template)
    assert (code, report["verdict"], report["fleet"]["verdict"], report["data"]["verdict"]) == (
        0, "no-change", "unchanged", "safe")
    changed = _routes(deployed=record_from_template(default), drop="minilm-l6-text", stale="resnet-synthetic-ts")
    code, report, _ = _plan(capsys, "--routes-file", _write(work / "r-models.json", json.loads(changed.body())),
                            "--template", template)
    assert (code, report["verdict"], report["fleet"]["verdict"]) == (3, "models-only", "unchanged")
    assert [item["name"] for item in report["models"]["added"]] == ["minilm-l6-text"]
    (updated,) = report["models"]["updated"]
    assert updated["name"] == "resnet-synthetic-ts" and updated["reason"] == "manifest entry changed"
    assert updated["old"] == {"target": "resnet-synthetic-ts-000000000000.tar.gz", "sha256": "a" * 64, "size": 1234}
    # Where each added or updated model builds, with the template's build settings (issue 36).
    # (The estimate's numbers follow the measured ratios: they come from the same placement.)
    from triton_mme_cdk.model_build.manifest.build_engine import (
        EngineSettings,
        estimate,
        place,
        source_weight_bytes,
    )

    minilm = next(spec for spec in load_manifest(ROOT / "models.yaml").models if spec.name == "minilm-l6-text")
    settings = EngineSettings(lambda_memory_mb=6144)
    expected = place(minilm, estimate(minilm, *source_weight_bytes(minilm, ROOT)), settings).describe(settings)
    assert expected.startswith("builds on: lambda 6 GB; estimated peak ") and "GiB of weights" in expected
    assert report["models"]["builds_on"] == {
        "minilm-l6-text": expected,
        "resnet-synthetic-ts": "builds on: lambda 6 GB; estimate unknown (a synthetic model is sized only once built)",
    }
    # The capacity line (issue 50): the live set (5 routed) and the manifest's 6 at the template's fleet.
    assert report["capacity"]["fleet"] == "1 x ml.g5.xlarge"
    assert (report["capacity"]["before"]["models"], report["capacity"]["after"]["models"]) == (5, 6)
    assert report["capacity"]["after"]["warm_share"] == 1.0
    code = main(["plan", "--routes-file", str(work / "r-models.json"), "--template", template])
    text = capsys.readouterr().out
    assert "+ minilm-l6-text  (added); builds on: lambda 6 GB; estimated peak" in text
    assert "capacity at 1 x ml.g5.xlarge (Zipf s=1 over 6 models, 10 req/s in total; footprints ESTIMATED from the " \
           "manifest): resident 5/5 models, 100.0% warm -> resident 6/6 models, 100.0% warm" in text


def test_an_instance_type_change_replaces_the_fleet_and_names_the_property(
        default: dict[str, Any], bigger: dict[str, Any], work: Path, capsys: pytest.CaptureFixture[str]) -> None:
    routes = _write(work / "r-record.json", json.loads(_routes(deployed=record_from_template(default)).body()))
    code, report, _ = _plan(capsys, "--routes-file", routes, "--template", _write(work / "t-bigger.json", bigger))
    assert (code, report["verdict"]) == (4, "fleet-replaced")
    assert ("fleet replaced because EndpointConfig ProductionVariants[0].InstanceType: ml.g5.xlarge -> "
            "ml.g5.2xlarge") in report["summary"]
    assert "blue/green" in report["fleet"]["text"] and "1 x ml.g5.2xlarge" in report["fleet"]["rollout"]
    # The same verdict from the deployed template instead of the record.
    code, report, _ = _plan(capsys, "--routes-file", routes, "--template", str(work / "t-bigger.json"),
                            "--deployed-template", _write(work / "t-deployed.json", default))
    assert (code, report["verdict"], report["other"]["compared"]) == (4, "fleet-replaced", True)


def test_an_inference_ami_change_replaces_the_fleet_and_names_the_property(
        work: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The host's driver is a fleet property: a new AMI is a new endpoint config, a blue/green."""
    older = synth(work / "ami-old", nag=False, inference_ami_version="al2-ami-sagemaker-inference-gpu-3-1",
                  triton_image_version="25.04").data
    newer = synth(work / "ami-new", nag=False, triton_image_version="25.04").data  # the default AMI
    routes = _write(work / "r-ami.json", json.loads(_routes(deployed=record_from_template(older)).body()))
    code, report, _ = _plan(capsys, "--routes-file", routes, "--template", _write(work / "t-ami.json", newer))
    assert (code, report["verdict"]) == (4, "fleet-replaced")
    config = next(f for f in report["fleet"]["findings"] if f["resource"] == "EndpointConfig")
    assert config["impact"] == "WILL_REPLACE"
    assert ("ProductionVariants[0].InferenceAmiVersion: al2-ami-sagemaker-inference-gpu-3-1 -> "
            "al2-ami-sagemaker-inference-gpu-2") in config["reasons"]


def test_a_construct_code_change_of_the_environment_replaces_the_fleet(
        default: dict[str, Any], new_default_variable: dict[str, Any], work: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """No setting changed, so a list of settings would say "unchanged": the template says otherwise."""
    routes = _write(work / "r-code.json", json.loads(_routes(deployed=record_from_template(default)).body()))
    code, report, _ = _plan(capsys, "--routes-file", routes, "--template",
                            _write(work / "t-code.json", new_default_variable))
    assert (code, report["verdict"]) == (4, "fleet-replaced")
    model = next(f for f in report["fleet"]["findings"] if f["resource"] == "Model")
    assert model["impact"] == "WILL_REPLACE"
    assert "PrimaryContainer.Environment.SAGEMAKER_TRITON_LOG_INFO: (unset) -> false" in model["reasons"]
    assert "PrimaryContainer.Environment.SAGEMAKER_TRITON_LOG_VERBOSE: false -> (unset)" in model["reasons"]
    config = next(f for f in report["fleet"]["findings"] if f["resource"] == "EndpointConfig")
    assert config["impact"] == "WILL_REPLACE" and config["reasons"] == ["it refers to Model, which is replaced"]


def test_a_first_deploy_creates_the_fleet(endpoint: str, default: dict[str, Any], work: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    from triton_mme_cdk.model_build.aws_clients import make_s3_client

    make_s3_client(endpoint_url=endpoint).create_bucket(Bucket="plan-first")
    code, report, _ = _plan(capsys, "--bucket", "plan-first", "--endpoint-url", endpoint, "--template",
                            _write(work / "t-first.json", default))
    # Every role, policy and key it creates is access granted: security changed leads (exit 4),
    # as `cdk deploy --require-approval broadening` asks on a first deploy; the fleet is created.
    assert (code, report["verdict"], report["live_release"], report["data"]["verdict"]) == (
        4, "security-changed", None, "safe")
    assert (report["fleet"]["verdict"], report["security"]["verdict"]) == ("created", "widens")
    assert report["models"]["counts"]["added"] == 6
    assert {f["type"] for f in report["fleet"]["findings"]} == set(FLEET_TYPES)
    role = next(f for f in report["security"]["findings"] if f["logical_id"] == EXECUTION_ROLE)
    assert {"property": "AssumeRolePolicyDocument", "access": "widens",
            "change": "added Allow sts:AssumeRole for Service:sagemaker.amazonaws.com" + EXECUTION_TRUST_CONDITION,
            } in role["changes"]


def test_routes_the_cli_published_give_an_unknown_fleet(default: dict[str, Any], work: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """Routes with no record (``python -m model_build publish``): unknown, exit 4, with a template
    that changed nothing and an instance type that changed (the old plan said "unchanged", exit 0)."""
    routes = _write(work / "r-cli.json", json.loads(_routes(deployed=None, stack="").body()))
    template = _write(work / "t-cli.json", default)
    code, report, _ = _plan(capsys, "--routes-file", routes, "--template", template)
    assert (code, report["verdict"], report["data"]["verdict"]) == (4, "fleet-unknown", "unknown")
    assert "carry no record of the deployed fleet" in report["fleet"]["unknown_reason"]
    assert "--deployed-template" in report["fleet"]["unknown_reason"]
    # Given the deployed template, it is known again.
    code, report, _ = _plan(capsys, "--routes-file", routes, "--template", template, "--deployed-template", template)
    assert (code, report["verdict"]) == (0, "no-change")
    # Routes an earlier version wrote (its settings, not the template) are unknown too.
    legacy = json.loads(_routes(deployed=None).body())
    legacy["fleet"] = {"instance_type": "ml.g5.xlarge"}
    code, report, _ = _plan(capsys, "--routes-file", _write(work / "r-legacy.json", legacy), "--template", template)
    assert (code, report["verdict"]) == (4, "fleet-unknown")
    assert "settings an earlier version recorded" in report["fleet"]["unknown_reason"]


def test_a_bucket_replacement_or_a_removed_log_group_puts_data_at_risk(
        default: dict[str, Any], work: Path, capsys: pytest.CaptureFixture[str]) -> None:
    deployed = copy.deepcopy(default)
    bucket_id = next(lid for lid, r in deployed["Resources"].items()
                     if r["Type"] == "AWS::S3::Bucket" and lid.startswith("ModelBucket2"))
    deployed["Resources"][bucket_id]["Properties"]["BucketName"] = "models-of-another-name"
    template = _write(work / "t-data.json", default)
    routes = _write(work / "r-data.json", json.loads(_routes(deployed=record_from_template(deployed)).body()))
    code, report, _ = _plan(capsys, "--routes-file", routes, "--template", template)
    assert (code, report["verdict"], report["data"]["verdict"]) == (4, "data-at-risk", "at-risk")
    finding = next(f for f in report["data"]["findings"] if f["logical_id"] == bucket_id)
    assert finding["impact"] == "WILL_REPLACE"
    assert finding["reasons"] == ["BucketName: models-of-another-name -> (unset)"]
    # A log group the new template no longer has (retained: orphaned) is at risk too.
    newer = copy.deepcopy(default)
    log_group = next(lid for lid, r in newer["Resources"].items() if r["Type"] == "AWS::Logs::LogGroup")
    del newer["Resources"][log_group]
    code, report, _ = _plan(capsys, "--routes-file", routes, "--template",
                            _write(work / "t-nolog.json", newer), "--deployed-template", _write(work / "t-d.json", default))
    assert (code, report["verdict"]) == (4, "data-at-risk")
    assert [(f["logical_id"], f["impact"]) for f in report["data"]["findings"]] == [(log_group, "WILL_ORPHAN")]


def test_bad_input_is_one_line_and_never_a_verdict(default: dict[str, Any], work: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    template = _write(work / "t-bad.json", default)
    body = _routes(deployed=record_from_template(default)).body()
    other = json.loads(body)
    other["stack"] = "arn:aws:cloudformation:eu-west-1:123456789012:stack/SomeoneElse/1"
    unknown_schema = {**json.loads(body), "schema": "triton-mme/routes/9"}
    truncated = work / "r-truncated.json"
    truncated.write_bytes(body[:200])
    broken_template = work / "t-broken.json"
    broken_template.write_text("{\"Resources\": ", encoding="utf-8")
    routes = _write(work / "r-ok.json", json.loads(body))
    cases = [
        (["--routes-file", _write(work / "r-other.json", other), "--template", template],
         "written by stack 'SomeoneElse', not 'TritonMme'"),
        (["--routes-file", _write(work / "r-schema.json", unknown_schema), "--template", template],
         "schema 'triton-mme/routes/9'; expected 'triton-mme/routes/1'"),
        (["--routes-file", str(truncated), "--template", template], "truncated"),
        (["--routes-file", routes, "--template", template, "--deployed-template", str(broken_template)],
         f"--deployed-template {broken_template}: not a CloudFormation template in JSON"),
        (["--routes-file", str(work / "nope.json"), "--template", template], "--routes-file: got"),
    ]
    for args, expected in cases:
        code, _, err = _plan(capsys, *args)
        assert code == 1 and expected in err, (args, err)
        assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err


def test_an_app_that_refuses_its_settings_is_its_one_error_line(work: Path, capsys: pytest.CaptureFixture[str],
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Without --template, plan runs the app's cdk.json command; an app that exits 1 with its
    ``error:`` line (a refused setting) is that line, and plan exits 1 with no verdict."""
    routes = _write(work / "r-refused.json", json.loads(_routes(deployed=None).body()))
    code, _, err = _plan(capsys, "--routes-file", routes, "-c", "mme:instance_type=ml.t2.medium")
    assert code == 1 and "Traceback" not in err
    (line,) = err.strip().splitlines()
    assert line.startswith("error: synth: mme:instance_type: got 'ml.t2.medium'; a GPU multi-model endpoint runs on "
                           "one of ml.g4dn.xlarge"), line
    # Another app's command that fails its own way (a traceback, no error line): its last line.
    failing = work / "failing-app"
    failing.mkdir()
    (failing / "cdk.json").write_text(json.dumps({"app": f"{sys.executable} -c 'import no_such_module'"}))
    monkeypatch.chdir(failing)
    code, _, err = _plan(capsys, "--routes-file", routes, "--manifest", str(ROOT / "models.yaml"))
    assert (code, err.strip()) == (1, "error: synth: ModuleNotFoundError: No module named 'no_such_module'")
    # No cdk.json here: no app to synthesize, nothing started.
    monkeypatch.chdir(work)
    code, _, err = _plan(capsys, "--routes-file", routes, "--manifest", str(ROOT / "models.yaml"))
    assert (code, err.strip()) == (1, f"error: plan: no cdk.json in {work}, so no app to synthesize; run plan in "
                                      "the app's folder, or give --template FILE (the template cdk synth wrote)")


def test_an_app_that_is_a_cloud_assembly_is_read_as_it_is(default: dict[str, Any], work: Path,
                                                          capsys: pytest.CaptureFixture[str],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """``"app"`` naming a cloud assembly folder (as ``cdk --app cdk.out`` takes one): plan reads its
    endpoint stack, with nothing synthesized (here the assembly the ``default`` fixture wrote)."""
    folder = work / "assembly-app"
    folder.mkdir()
    (folder / "cdk.json").write_text(json.dumps({"app": str(work / "default")}))
    monkeypatch.chdir(folder)
    routes = _write(work / "r-assembly.json", json.loads(_routes(deployed=record_from_template(default)).body()))
    code, report, _ = _plan(capsys, "--routes-file", routes, "--manifest", str(ROOT / "models.yaml"))
    assert (code, report["verdict"], report["stack"]) == (0, "no-change", "TritonMme")


def test_online_without_credentials_is_one_line(default: dict[str, Any], work: Path) -> None:
    routes = _write(work / "r-online.json", json.loads(_routes(deployed=None).body()))
    env = subprocess_env(AWS_SHARED_CREDENTIALS_FILE=str(work / "none"), AWS_CONFIG_FILE=str(work / "none"))
    result = subprocess.run(
        [sys.executable, "-m", "model_build", "plan", "--routes-file", routes, "--stack-name", "TritonMme",
         "--region", "eu-west-1", "--template", _write(work / "t-online.json", default), "--detailed-exitcode"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "--stack-name TritonMme: no AWS credentials found" in result.stderr
    assert "Traceback" not in result.stderr and "verdict" not in result.stdout


@pytest.mark.parametrize("name_length", [12, 64])
def test_the_markdown_fits_one_github_comment_at_3000_models(name_length: int) -> None:
    """3,000 models, every list full: the comment stays under GitHub's limit, the summary and the
    counts first, each list cut to the same length with a count of what it leaves out."""
    def name(i: int) -> str:
        return f"model-{i:05d}-" + "x" * (name_length - 12)

    def route(i: int) -> Route:
        return Route(name(i), f"{name(i)}-0123456789ab.tar.gz", "f" * 64, 10**9, "k" * 64, name(i), "e" * 64)

    models = ModelPlan(
        added=[Planned(name(i), "e" * 64) for i in range(0, 750)],
        updated=[Updated(route(i), "d" * 64, "manifest entry changed") for i in range(750, 1500)],
        removed=[route(i) for i in range(1500, 2250)],
        unchanged=[route(i) for i in range(2250, 3000)],
        live_release="r-0123456789abcdef",
    )
    finding = Finding("fleet-replaced", "EndpointConfig", "EndpointConfig1234", "AWS::SageMaker::EndpointConfig",
                      "WILL_REPLACE", ("ProductionVariants[0].InstanceType: ml.g5.xlarge -> ml.g5.2xlarge",))
    verdict = Verdict(fleet="replaced", data="safe", compared_with="the deployed record in the live routes",
                      findings=[finding], rollout="a blue/green rollout of every instance")
    report = PlanReport(stack="TritonMme", models=models, verdict=verdict, routes_where="s3://b/models/_routes/routes.json")
    text = report.markdown()
    assert len(text) <= GITHUB_COMMENT_LIMIT and text.splitlines()[0] == marker("TritonMme")
    head = text[:2000]
    assert "fleet replaced because EndpointConfig ProductionVariants[0].InstanceType" in head
    assert "| 3000 | 750 | 750 | 750 | 750 |" in head
    cut = [line for line in text.splitlines() if "more (the JSON plan lists every one)" in line]
    assert len(cut) == 4, "each of the four model lists is cut"
    kept = {int(line.split("and ")[1].split(" more")[0]) for line in cut}
    assert len(kept) == 1 and 0 < kept.pop() < 750, "the same number kept in every list"
    # Small plans are shown whole.
    small = PlanReport(stack="TritonMme", models=ModelPlan(added=[Planned("a", "e" * 64)]), verdict=verdict,
                       routes_where="file").markdown()
    assert "more (the JSON plan" not in small and "- `a`" in small
    jsonschema.validate(report.as_json(), SCHEMA, cls=jsonschema.Draft202012Validator)


def test_online_reads_the_stacks_template_from_cloudformation(
        endpoint: str, default: dict[str, Any], work: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``--stack-name``: the deployed template is the stack's, read with GetTemplate (moto's
    CloudFormation on loopback); a stack that does not exist, with no routes, is a first deploy."""
    import boto3

    from triton_mme_cdk.model_build.aws_clients import make_s3_client

    for name, value in (("AWS_ACCESS_KEY_ID", "test"), ("AWS_SECRET_ACCESS_KEY", "test"),
                        ("AWS_ENDPOINT_URL_CLOUDFORMATION", endpoint)):
        monkeypatch.setenv(name, value)
    bucket_id = next(lid for lid, r in default["Resources"].items()
                     if r["Type"] == "AWS::S3::Bucket" and lid.startswith("ModelBucket2"))
    # moto's CloudFormation creates plain buckets, not SageMaker resources: the stack deployed here
    # holds the model bucket, under another name.
    deployed = {"Resources": {bucket_id: {"Type": "AWS::S3::Bucket", "Properties": {"BucketName": "models-online"}}}}
    cloudformation = boto3.client("cloudformation", region_name="eu-west-1", endpoint_url=endpoint)
    cloudformation.create_stack(StackName="TritonMme", TemplateBody=json.dumps(deployed))
    make_s3_client(endpoint_url=endpoint).create_bucket(Bucket="plan-online")
    template = _write(work / "t-online-new.json", default)
    code, report, _ = _plan(capsys, "--bucket", "plan-online", "--endpoint-url", endpoint, "--stack-name", "TritonMme",
                            "--region", "eu-west-1", "--template", template)
    assert (code, report["verdict"]) == (4, "data-at-risk")
    assert report["compared_with"]["deployed"] == "the template of stack TritonMme" and report["other"]["compared"]
    assert [(f["logical_id"], f["impact"]) for f in report["data"]["findings"]] == [(bucket_id, "WILL_REPLACE")]
    code, report, _ = _plan(capsys, "--bucket", "plan-online", "--endpoint-url", endpoint, "--stack-name", "Absent",
                            "--region", "eu-west-1", "--template", template)
    assert (code, report["verdict"], report["fleet"]["verdict"]) == (4, "security-changed", "created")


# ---------------------------------------------------------------------------------------------
# Security changes (issue 49): who can do what, on the synthesized template edited as a code
# change would edit it, judged by the real diff engine against the synthesized one.
# ---------------------------------------------------------------------------------------------

def _security_plan(capsys: pytest.CaptureFixture[str], work: Path, name: str, deployed: dict[str, Any],
                   new: dict[str, Any], routes: dict[str, Any] | None = None) -> tuple[int, dict[str, Any]]:
    """plan of ``new`` over the deployed template ``deployed`` (the live routes: the default's)."""
    routes_file = _write(work / f"r-{name}.json", routes or json.loads(
        _routes(deployed=record_from_template(deployed)).body()))
    code, report, err = _plan(capsys, "--routes-file", routes_file, "--template", _write(work / f"t-{name}-new.json", new),
                              "--deployed-template", _write(work / f"t-{name}-old.json", deployed))
    assert code in (0, 3, 4), err
    return code, report


def _edited(template: dict[str, Any], edit: Any) -> dict[str, Any]:
    changed = copy.deepcopy(template)
    edit(changed["Resources"])
    return changed


def _security_findings(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {finding["logical_id"]: finding for finding in report["security"]["findings"]}


def _widen_then_narrow(capsys: pytest.CaptureFixture[str], work: Path, name: str, deployed: dict[str, Any],
                       wider: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The change that widens (exit 4) and its reverse (exit 3, narrows only): both reports."""
    code, widened = _security_plan(capsys, work, name, deployed, wider)
    assert (code, widened["verdict"], widened["security"]["verdict"]) == (4, "security-changed", "widens"), (
        widened["summary"])
    code, narrowed = _security_plan(capsys, work, name + "-back", wider, deployed)
    assert (code, narrowed["verdict"], narrowed["security"]["verdict"]) == (3, "security-changed", "narrows"), (
        narrowed["summary"])
    return widened, narrowed


def test_an_iam_policy_statement_added_is_a_security_change_that_widens(
        default: dict[str, Any], work: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The issue's own case: one statement, ``s3:PutObject`` on the whole model bucket, added to
    the execution role's policy (today's plan said "no-change", exit 0)."""
    def put_object(resources: dict[str, Any]) -> None:
        resources[EXECUTION_POLICY]["Properties"]["PolicyDocument"]["Statement"].append(
            {"Action": "s3:PutObject", "Effect": "Allow", "Resource": WHOLE_BUCKET})

    widened, narrowed = _widen_then_narrow(capsys, work, "iam-put", default, _edited(default, put_object))
    finding = _security_findings(widened)[EXECUTION_POLICY]
    assert finding["resource"] == f"Policy {EXECUTION_POLICY} (on {EXECUTION_ROLE})"
    assert finding["access"] == "widens" and finding["kind"] == "security-changed"
    assert finding["changes"] == [{"property": "PolicyDocument", "access": "widens",
                                   "change": f"added Allow s3:PutObject on ${{{BUCKET}.Arn}}/*"}]
    # The summary names the resource and the property (the detail and the JSON give the change).
    assert widened["summary"].endswith(f"; access widens in Policy {EXECUTION_POLICY} (PolicyDocument)")
    assert widened["fleet"]["verdict"] == "unchanged" and widened["data"]["verdict"] == "safe"
    assert not widened["other"]["findings"], "the policy is a security finding, not also an 'other' one"
    assert _security_findings(narrowed)[EXECUTION_POLICY]["changes"] == [{
        "property": "PolicyDocument", "access": "narrows", "change": f"removed Allow s3:PutObject on ${{{BUCKET}.Arn}}/*"}]


def test_iam_wildcards_conditions_and_what_cannot_be_classified(
        default: dict[str, Any], work: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """More actions (``s3:GetObject`` -> ``s3:*``) and a condition removed widen; a policy that is
    not literal JSON (``Fn::If``) is unknown, and exits 4 like a widening."""
    def wider(resources: dict[str, Any]) -> None:
        for statement in resources[EXECUTION_POLICY]["Properties"]["PolicyDocument"]["Statement"]:
            if statement["Action"] == "s3:GetObject":
                statement["Action"] = "s3:*"
            if statement["Action"] == "s3:ListBucket":
                del statement["Condition"]

    widened, narrowed = _widen_then_narrow(capsys, work, "iam-wild", default, _edited(default, wider))
    changes = {c["change"].split(" on ")[0]: c["access"] for c in _security_findings(widened)[EXECUTION_POLICY]["changes"]}
    assert changes == {"added Allow s3:*": "widens", "removed the condition of Allow s3:ListBucket": "widens"}
    changes = {c["change"].split(" on ")[0]: c["access"] for c in _security_findings(narrowed)[EXECUTION_POLICY]["changes"]}
    assert changes == {"removed Allow s3:*": "narrows", "added a condition to Allow s3:ListBucket": "narrows"}

    def opaque(resources: dict[str, Any]) -> None:
        document = resources[EXECUTION_POLICY]["Properties"]["PolicyDocument"]
        resources[EXECUTION_POLICY]["Properties"]["PolicyDocument"] = {
            "Fn::If": ["SomeCondition", document, {"Ref": "AWS::NoValue"}]}

    code, report = _security_plan(capsys, work, "iam-if", default, _edited(default, opaque))
    assert (code, report["verdict"], report["security"]["verdict"]) == (4, "security-changed", "unknown")
    (change,) = _security_findings(report)[EXECUTION_POLICY]["changes"]
    assert change["access"] == "unknown" and change["change"].startswith("changed, not a literal policy document")


#: The execution role's trust conditions as a security finding names them (SageMaker's confused
#: deputy keys, tests/test_stack_least_privilege.py).
EXECUTION_TRUST_CONDITION = (" when ArnLike aws:SourceArn=arn:${AWS::Partition}:sagemaker:${AWS::Region}:${AWS::AccountId}:*,"
                             " StringEquals aws:SourceAccount=${AWS::AccountId}")


def test_a_roles_trust_inline_policies_and_managed_policies(
        default: dict[str, Any], work: Path, capsys: pytest.CaptureFixture[str]) -> None:
    def wider(resources: dict[str, Any]) -> None:
        role = resources[EXECUTION_ROLE]["Properties"]
        role["AssumeRolePolicyDocument"]["Statement"][0]["Principal"]["Service"] = [
            "sagemaker.amazonaws.com", "lambda.amazonaws.com"]
        role["Policies"] = [{"PolicyName": "extra", "PolicyDocument": {"Version": "2012-10-17", "Statement": [
            {"Action": "s3:PutObject", "Effect": "Allow", "Resource": WHOLE_BUCKET}]}}]
        role["ManagedPolicyArns"] = ["arn:aws:iam::aws:policy/AdministratorAccess"]

    widened, narrowed = _widen_then_narrow(capsys, work, "role", default, _edited(default, wider))
    finding = _security_findings(widened)[EXECUTION_ROLE]
    assert finding["resource"] == f"Role {EXECUTION_ROLE}"
    assert {(c["property"], c["change"], c["access"]) for c in finding["changes"]} == {
        ("AssumeRolePolicyDocument", "added Allow sts:AssumeRole for Service:lambda.amazonaws.com"
         + EXECUTION_TRUST_CONDITION, "widens"),
        ("Policies[0]", f"added Allow s3:PutObject on ${{{BUCKET}.Arn}}/*", "widens"),
        ("ManagedPolicyArns", "added arn:aws:iam::aws:policy/AdministratorAccess", "widens"),
    }
    assert {c["access"] for c in _security_findings(narrowed)[EXECUTION_ROLE]["changes"]} == {"narrows"}


def test_the_key_policy(default: dict[str, Any], work: Path, capsys: pytest.CaptureFixture[str]) -> None:
    def wider(resources: dict[str, Any]) -> None:
        resources[KEY]["Properties"]["KeyPolicy"]["Statement"].append(
            {"Action": "kms:Decrypt", "Effect": "Allow", "Principal": {"AWS": "arn:aws:iam::999999999999:root"},
             "Resource": "*"})

    widened, narrowed = _widen_then_narrow(capsys, work, "kms", default, _edited(default, wider))
    (change,) = _security_findings(widened)[KEY]["changes"]
    assert change == {"property": "KeyPolicy", "access": "widens",
                      "change": "added Allow kms:Decrypt on * for AWS:arn:aws:iam::999999999999:root"}
    assert widened["data"]["verdict"] == "safe", "a key policy change keeps the key"
    assert _security_findings(narrowed)[KEY]["access"] == "narrows"


def test_the_bucket_policy_public_access_and_encryption(
        default: dict[str, Any], work: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A Deny removed from the bucket policy widens (the reverse of an Allow); a public-access flag
    turned off widens, and so does encryption with the stack's key turned into SSE-S3."""
    policy = next(lid for lid in default["Resources"] if lid.startswith("ModelBucketPolicy"))

    def wider(resources: dict[str, Any]) -> None:
        statements = resources[policy]["Properties"]["PolicyDocument"]["Statement"]
        statements[:] = [s for s in statements if "aws:SecureTransport" not in json.dumps(s)]
        bucket = resources[BUCKET]["Properties"]
        bucket["PublicAccessBlockConfiguration"]["RestrictPublicBuckets"] = False
        bucket["BucketEncryption"] = {"ServerSideEncryptionConfiguration": [
            {"ServerSideEncryptionByDefault": {"SSEAlgorithm": "AES256"}}]}

    widened, narrowed = _widen_then_narrow(capsys, work, "s3", default, _edited(default, wider))
    findings = _security_findings(widened)
    (change,) = findings[policy]["changes"]
    assert change["access"] == "widens" and change["change"].startswith(
        f"removed Deny s3:* on ${{{BUCKET}.Arn}}, ${{{BUCKET}.Arn}}/* for * when Bool aws:SecureTransport=false")
    assert {(c["property"], c["access"]) for c in findings[BUCKET]["changes"]} == {
        ("PublicAccessBlockConfiguration.RestrictPublicBuckets", "widens"), ("BucketEncryption", "widens")}
    assert "a KMS key is no longer needed to read" in json.dumps(findings[BUCKET]["changes"])
    assert {c["access"] for f in narrowed["security"]["findings"] for c in f["changes"]} == {"narrows"}


def _network(resources: dict[str, Any]) -> None:
    """A security group and a VPC endpoint with its policy, as a stack with a VPC has them."""
    resources["ModelGroup1234"] = {"Type": "AWS::EC2::SecurityGroup", "Properties": {
        "GroupDescription": "models", "VpcId": "vpc-0123456789abcdef0",
        "SecurityGroupEgress": [{"CidrIp": "10.0.0.0/16", "IpProtocol": "tcp", "FromPort": 443, "ToPort": 443}]}}
    resources["S3Endpoint1234"] = {"Type": "AWS::EC2::VPCEndpoint", "Properties": {
        "ServiceName": "com.amazonaws.us-east-1.s3", "VpcId": "vpc-0123456789abcdef0", "PolicyDocument": {
            "Version": "2012-10-17", "Statement": [{"Action": "s3:GetObject", "Effect": "Allow", "Principal": "*",
                                                     "Resource": WHOLE_BUCKET}]}}}


def test_security_groups_and_vpc_endpoint_policies(
        default: dict[str, Any], work: Path, capsys: pytest.CaptureFixture[str]) -> None:
    deployed = _edited(default, _network)

    def wider(resources: dict[str, Any]) -> None:
        resources["ModelGroup1234"]["Properties"]["SecurityGroupIngress"] = [
            {"CidrIp": "0.0.0.0/0", "IpProtocol": "tcp", "FromPort": 443, "ToPort": 443}]
        resources["ModelGroupIngress1234"] = {"Type": "AWS::EC2::SecurityGroupIngress", "Properties": {
            "GroupId": {"Ref": "ModelGroup1234"}, "CidrIp": "10.1.0.0/16", "IpProtocol": "tcp", "FromPort": 22,
            "ToPort": 22}}
        del resources["S3Endpoint1234"]["Properties"]["PolicyDocument"]
        # Created without what limits them: all outbound traffic, a full-access endpoint.
        resources["OpenGroup1234"] = {"Type": "AWS::EC2::SecurityGroup", "Properties": {
            "GroupDescription": "open", "VpcId": "vpc-0123456789abcdef0"}}
        resources["DynamoEndpoint1234"] = {"Type": "AWS::EC2::VPCEndpoint", "Properties": {
            "ServiceName": "com.amazonaws.us-east-1.dynamodb", "VpcId": "vpc-0123456789abcdef0"}}

    widened, narrowed = _widen_then_narrow(capsys, work, "net", deployed, _edited(deployed, wider))
    findings = _security_findings(widened)
    assert [(c["change"], c["access"]) for c in findings["OpenGroup1234"]["changes"]] == [
        ("unset: CloudFormation allows all outbound traffic", "widens")]
    assert [(c["change"], c["access"]) for c in findings["DynamoEndpoint1234"]["changes"]] == [
        ("unset: the endpoint allows full access", "widens")]
    assert [(c["property"], c["change"], c["access"]) for c in findings["ModelGroup1234"]["changes"]] == [
        ("SecurityGroupIngress", "added tcp 443 0.0.0.0/0", "widens")]
    assert [(c["change"], c["access"]) for c in findings["ModelGroupIngress1234"]["changes"]] == [
        ("added tcp 22 10.1.0.0/16", "widens")]
    assert [(c["change"], c["access"]) for c in findings["S3Endpoint1234"]["changes"]] == [
        ("removed: the endpoint allows full access", "widens")]
    findings = _security_findings(narrowed)
    assert [(c["change"], c["access"]) for c in findings["S3Endpoint1234"]["changes"]] == [
        ("set (the endpoint allowed full access)", "narrows")]
    assert findings["ModelGroupIngress1234"]["impact"] == "WILL_DESTROY"


def test_every_finding_is_listed_whichever_verdict_leads(
        default: dict[str, Any], bigger: dict[str, Any], work: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Precedence: data at risk, then the fleet replaced or unknown, then security changed, then
    models only. A widening under a fleet replacement is still listed (and shown first in the
    markdown); a narrowing with a model change leads as security-changed, exit 3."""
    def put_object(resources: dict[str, Any]) -> None:
        resources[EXECUTION_POLICY]["Properties"]["PolicyDocument"]["Statement"].append(
            {"Action": "s3:PutObject", "Effect": "Allow", "Resource": WHOLE_BUCKET})

    code, report = _security_plan(capsys, work, "lead-fleet", default, _edited(bigger, put_object))
    assert (code, report["verdict"], report["security"]["verdict"]) == (4, "fleet-replaced", "widens")
    assert EXECUTION_POLICY in _security_findings(report)
    markdown = (work / "lead-fleet.md")
    main(["plan", "--routes-file", str(work / "r-lead-fleet.json"), "--template", str(work / "t-lead-fleet-new.json"),
          "--deployed-template", str(work / "t-lead-fleet-old.json"), "--markdown-file", str(markdown)])
    capsys.readouterr()
    lines = markdown.read_text().splitlines()
    assert "fleet replaced" in lines[1] and lines[3].startswith("**Security:** access widens")
    assert lines[5].startswith(f"- **widens**: Policy {EXECUTION_POLICY}")
    assert lines.index(lines[5]) < next(i for i, line in enumerate(lines) if line.startswith("**Fleet:**"))
    models = json.loads(_routes(deployed=record_from_template(default), drop="minilm-l6-text").body())
    code, report = _security_plan(capsys, work, "lead-narrow", _edited(default, put_object), default, routes=models)
    assert (code, report["verdict"], report["security"]["verdict"]) == (3, "security-changed", "narrows")
    assert report["models"]["counts"]["added"] == 1


def _document(*statements: dict[str, Any]) -> dict[str, Any]:
    return {"Version": "2012-10-17", "Statement": list(statements)}


_READ = {"Effect": "Allow", "Action": "s3:GetObject", "Resource": "arn:aws:s3:::b/*",
         "Condition": {"StringEquals": {"aws:PrincipalAccount": "111111111111"}}}
_TRUST = {"Effect": "Allow", "Action": "sts:AssumeRole", "Principal": {"AWS": "arn:aws:iam::111111111111:root"}}


@pytest.mark.parametrize(("resource_type", "old", "new", "expected"), [
    ("AWS::IAM::Policy", {"PolicyDocument": _document(_READ)},
     {"PolicyDocument": _document({**_READ, "Condition": {"StringEquals": {"aws:PrincipalAccount": "222222222222"}}})},
     [("PolicyDocument", "changed the condition of Allow s3:GetObject on arn:aws:s3:::b/* when StringEquals "
       "aws:PrincipalAccount=222222222222", "unknown")]),
    ("AWS::IAM::Policy", {"PolicyDocument": _document(_READ)},
     {"PolicyDocument": _document(_READ, {"Effect": "Allow", "NotAction": "iam:*", "Resource": "*"})},
     [("PolicyDocument", "added Allow NotAction iam:* on *", "unknown")]),
    ("AWS::IAM::Role", {"AssumeRolePolicyDocument": _document(_TRUST)},
     {"AssumeRolePolicyDocument": _document({**_TRUST, "Principal": "*"})},
     [("AssumeRolePolicyDocument", "added Allow sts:AssumeRole for *", "widens")]),
    ("AWS::IAM::Role", {"PermissionsBoundary": "arn:aws:iam::111111111111:policy/boundary"}, {},
     [("PermissionsBoundary", "arn:aws:iam::111111111111:policy/boundary -> (unset)", "widens")]),
    ("AWS::IAM::User", None, {"UserName": "someone"}, [("UserName", "(unset) -> someone", "unknown")]),
    ("AWS::EC2::SecurityGroupIngress",
     {"GroupId": "sg-1", "CidrIp": "10.0.0.0/8", "IpProtocol": "tcp", "FromPort": 80, "ToPort": 81},
     {"GroupId": "sg-1", "CidrIp": "0.0.0.0/0", "IpProtocol": "tcp", "FromPort": 80, "ToPort": 81},
     [("rule", "added tcp 80-81 0.0.0.0/0", "widens"), ("rule", "removed tcp 80-81 10.0.0.0/8", "narrows")]),
    ("AWS::S3::Bucket", {"PublicAccessBlockConfiguration": {"BlockPublicAcls": True}}, None, []),
])
def test_the_security_classifier_on_its_own(resource_type: str, old: dict[str, Any] | None,
                                            new: dict[str, Any] | None, expected: list[tuple[str, str, str]]) -> None:
    """The cases no synthesized template here carries: a condition changed and a NotAction
    statement (unknown), a trust opened to every principal, a boundary removed, an IAM type
    without its own rule (unknown), a wider CIDR (a rule removed and one added: widens overall),
    a bucket deleted (data at risk, not access granted)."""
    from triton_mme_cdk.model_build.tools.review.plan_access import security_changes
    from triton_mme_cdk.model_build.tools.review.plan_security import overall_access

    changes = security_changes(resource_type, old, new)
    assert [(c.path, c.text, c.access) for c in changes] == expected
    assert overall_access(changes) == ("widens" if any(a == "widens" for *_, a in expected) else
                                       "unknown" if expected else "")


def test_the_plan_names_a_served_object_that_is_missing_or_holds_other_bytes(
        endpoint: str, default: dict[str, Any], work: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """With ``--bucket`` the plan also checks what is served now (issue 58): each routed object in
    ``served/`` with its route's size and digest. One deleted and one overwritten are named, each in
    one line with the object and the route; the verdict and digest are the change's, the same as
    from a copy of the routes, which says it could not check them."""
    import base64
    import hashlib

    from triton_mme_cdk.model_build.aws_clients import make_s3_client
    from triton_mme_cdk.model_build.release import routes_key

    s3, bucket = make_s3_client(endpoint_url=endpoint), "plan-served"
    s3.create_bucket(Bucket=bucket)
    live = _routes(deployed=record_from_template(default))
    served_routes = dict(live.routes)
    for name, route in live.routes.items():  # each target served with its own bytes
        body = f"the build of {name}".encode()
        digest = hashlib.sha256(body).hexdigest()
        target = f"{name}-{digest[:12]}.tar.gz"
        served_routes[name] = Route(name, target, digest, len(body), route.model_key, route.logical_name,
                                    route.entry_sha256)
        s3.put_object(Bucket=bucket, Key=f"models/served/{target}", Body=body, Metadata={"sha256": digest},
                      ChecksumAlgorithm="SHA256",
                      ChecksumSHA256=base64.b64encode(hashlib.sha256(body).digest()).decode())
    live = dataclasses.replace(live, routes=served_routes)
    s3.put_object(Bucket=bucket, Key=routes_key("models"), Body=live.body())
    template = _write(work / "t-served.json", default)
    code, report, _ = _plan(capsys, "--bucket", bucket, "--endpoint-url", endpoint, "--template", template)
    assert report["served"]["problems"] == [] and "every one holds its route's bytes" in report["served"]["note"]
    healthy_digest = report["digest"]
    first, last = sorted(live.routes)[0], sorted(live.routes)[-1]  # the check's order: by route
    deleted, overwritten = live.routes[first], live.routes[last]
    s3.delete_object(Bucket=bucket, Key=f"models/served/{deleted.target_model}")
    s3.put_object(Bucket=bucket, Key=f"models/served/{overwritten.target_model}", Body=b"other bytes",
                  Metadata={"sha256": overwritten.sha256})
    code, report, _ = _plan(capsys, "--bucket", bucket, "--endpoint-url", endpoint, "--template", template)
    problems = report["served"]["problems"]
    assert [line.split(": ")[0] for line in problems] == ["routed-object", "routed-object"], problems
    assert f"s3://{bucket}/models/served/{deleted.target_model} (route {first!r}): missing" in problems[0]
    assert f"models/served/{overwritten.target_model} (route {last!r}): holds other bytes" in problems[1]
    assert "2 broken" in report["served"]["note"] and "doctor --bucket plan-served --prefix models --repair" in \
        report["served"]["note"]
    assert report["digest"] == healthy_digest  # the state now is not the change
    main(["plan", "--bucket", bucket, "--endpoint-url", endpoint, "--template", template])
    text = capsys.readouterr().out
    assert f"  ! served now: routed-object: s3://{bucket}/models/served/{deleted.target_model}" in text
    # A copy of the routes: no AWS call, so nothing is known of what is served.
    copy_path = _write(work / "r-served.json", json.loads(live.body()))
    code_copy, from_copy, _ = _plan(capsys, "--routes-file", copy_path, "--template", template)
    assert (code_copy, from_copy["digest"]) == (code, healthy_digest)
    assert from_copy["served"] == {"note": "not checked: --routes-file makes no AWS call (triton-mme doctor checks it)",
                                   "problems": []}
