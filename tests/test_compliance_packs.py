"""cdk-nag's compliance packs on the construct (issue 59): AwsSolutions, HIPAA.Security,
NIST.800.53.R5 and PCI.DSS.321 report 0 unacknowledged findings under ``TritonMultiModelEndpoint``
on the default app and the other settings variants of the stack tests (``VARIANTS``), ``examples/platform_app``, a bring-your-own app with a VPC and a topic, a
created VPC in an app without this project's feature flags, the created buckets replicated
(``replica_bucket``), an app whose bucket and key come from
another stack of the app, one whose bucket is imported by name, and on every stack of the delivery
pipeline. Every acknowledgment matches a finding.

Each app is synthesized once, in audit mode (``nag_acknowledgments.AUDIT_CONTEXT_KEY``): the
acknowledgments are recorded, not made. The four packs then run on the synthesized construct tree
(``NagPack.validate_scope``, what the validation plugin runs) and report every finding; the
recorded acknowledgments are made (``make_audited``, ``Validations.of(x).acknowledge``) and the
packs run again: what they report then is unacknowledged. An acknowledgment is stale when no
finding of the first run has its id on its construct or below (cdk-nag's own matching: the id,
exactly, on the resource or an ancestor).
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aws_cdk as cdk
import pytest
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_kms as kms
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_sns as sns
from cdk_helpers import PIPELINE, ROOT, VARIANTS, context, synth
from cdk_nag import AwsSolutionsChecks, HIPAASecurityChecks, NIST80053R5Checks, PCIDSS321Checks

from triton_mme_cdk import ModelSource, PropsError, TritonMultiModelEndpoint
from triton_mme_cdk.constructs.nag_acknowledgments import (
    ACCESS_LOG_ENCRYPTION_REASON,
    AUDIT_CONTEXT_KEY,
    CREATE_ENDPOINT_CONFIG_URL,
    INSTANCE_STORE_KEY_REASON,
    PACK_RULES,
    SERVER_ACCESS_LOGGING_URL,
    acknowledge,
    make_audited,
)

pytestmark = pytest.mark.slow  # twelve real synths, the four packs twice on each

PACKS = (AwsSolutionsChecks, HIPAASecurityChecks, NIST80053R5Checks, PCIDSS321Checks)
EXAMPLE = ROOT / "examples" / "platform_app"
MANIFEST = EXAMPLE / "models.yaml"
AUDIT = {AUDIT_CONTEXT_KEY: True}

Finding = tuple[str, str, str]  # (rule id, construct path, severity)


@dataclass
class Audit:
    """One app, audited: what the packs report before and after the acknowledgments are made."""

    app: cdk.App
    #: Where the construct's findings count: the endpoint construct's path (None: everywhere).
    scopes: tuple[str, ...] | None
    raw: list[Finding]
    remaining: list[Finding]
    acknowledged: list[tuple[str, str, str]]  # (construct path, rule id, reason)

    def ours(self, findings: list[Finding]) -> list[Finding]:
        if self.scopes is None:
            return findings
        return [f for f in findings if any(f[1] == s or f[1].startswith(f"{s}/") for s in self.scopes)]

    def stale(self) -> list[tuple[str, str]]:
        """Acknowledgments no finding of the first run matches (id, on the construct or below)."""
        return [(path, rule_id) for path, rule_id, _ in self.acknowledged
                if not any(rule == rule_id and (where == path or where.startswith(f"{path}/"))
                           for rule, where, _ in self.raw)]


def findings(app: cdk.App) -> list[Finding]:
    found = []
    for pack in PACKS:
        report = pack(app).validate_scope(app)
        found += [(violation.rule_name, str(resource.construct_path), str(violation.severity))
                  for violation in report.violations for resource in violation.violating_resources]
    return found


def audit(app: cdk.App, scopes: tuple[str, ...] | None) -> Audit:
    raw = findings(app)
    made = make_audited(app)
    return Audit(app=app, scopes=scopes, raw=raw, remaining=findings(app),
                 acknowledged=[(node.node.path, rule_id, reason) for node, rule_id, reason in made])


def _app(folder: Path) -> cdk.App:
    return cdk.App(context=AUDIT, outdir=str(folder), analytics_reporting=False)


def _endpoint(scope: cdk.Stack, **options: Any) -> TritonMultiModelEndpoint:
    return TritonMultiModelEndpoint(scope, "Embeddings", models=ModelSource.from_manifest(MANIFEST), **options)


# ---------------------------------------------------------------------------------------------
# The apps (each synthesized once for the module)
# ---------------------------------------------------------------------------------------------


def default_app(folder: Path) -> Audit:
    return audit(synth(folder, nag=False, extra_context=AUDIT).app, None)


def variant(name: str) -> Callable[[Path], Audit]:
    """The app with one of the settings variants of the other stack tests (``VARIANTS``)."""
    def build(folder: Path) -> Audit:
        options = dict(VARIANTS[name])
        context = {**AUDIT, **options.pop("extra_context", {})}
        return audit(synth(folder, nag=False, extra_context=context, **options).app, None)
    return build


def platform_app(folder: Path) -> Audit:
    """examples/platform_app's stack, as its app.py builds it (its own resources are the team's)."""
    spec = importlib.util.spec_from_file_location("platform_app_example", EXAMPLE / "app.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    app = _app(folder)
    module.PlatformStack(app, "PlatformEmbeddings")
    app.synth()
    return audit(app, ("PlatformEmbeddings/Embeddings",))


def own_vpc_and_topic(folder: Path) -> Audit:
    """A team's bucket, key, isolated VPC (the build in it too) and topic."""
    app = _app(folder)
    stack = cdk.Stack(app, "Platform")
    key = kms.Key(stack, "Key", enable_key_rotation=True)
    vpc = ec2.Vpc(stack, "Vpc", max_azs=2, nat_gateways=0, subnet_configuration=[
        ec2.SubnetConfiguration(name="isolated", subnet_type=ec2.SubnetType.PRIVATE_ISOLATED)])
    bucket = s3.Bucket(stack, "Models", encryption=s3.BucketEncryption.KMS, encryption_key=key, enforce_ssl=True,
                       versioned=True)
    _endpoint(stack, bucket=bucket, vpc=vpc, alarm_topic=sns.Topic(stack, "Alarms", master_key=key),
              build_in_vpc=True)
    app.synth()
    return audit(app, ("Platform/Embeddings",))


def created_vpc(folder: Path) -> Audit:
    """``create_vpc`` and ``build_in_vpc`` in an app without this project's cdk.json (no
    ``@aws-cdk/aws-ec2:restrictDefaultSecurityGroup`` flag)."""
    app = _app(folder)
    stack = cdk.Stack(app, "Isolated")
    _endpoint(stack, create_vpc=True, build_in_vpc=True)
    app.synth()
    return audit(app, ("Isolated/Embeddings", "Isolated/AWS679f53fac002430cb0da5b7982bd2287"))


def replicated(folder: Path) -> Audit:
    """The created buckets replicated into a team's bucket of another region (``replica_bucket``)."""
    app = _app(folder)
    stack = cdk.Stack(app, "Replicated", env=cdk.Environment(account="123456789012", region="eu-west-1"))
    key = kms.Key.from_key_arn(stack, "ReplicaKey",
                               "arn:aws:kms:eu-central-1:123456789012:key/0a1b2c3d-1111-2222-3333-444455556666")
    _endpoint(stack, replica_bucket=s3.Bucket.from_bucket_attributes(
        stack, "Replica", bucket_arn="arn:aws:s3:::team-model-replica", encryption_key=key))
    app.synth()
    return audit(app, ("Replicated/Embeddings",))


def cross_stack(folder: Path) -> Audit:
    """The bucket and key of the team's data stack, imported by attributes into the serving stack
    (CDK writes Fn::ImportValue of the data stack's exports)."""
    app = _app(folder)
    data = cdk.Stack(app, "TeamData")
    key = kms.Key(data, "Key", enable_key_rotation=True)
    bucket = s3.Bucket(data, "Models", encryption=s3.BucketEncryption.KMS, encryption_key=key, enforce_ssl=True,
                       versioned=True)
    serving = cdk.Stack(app, "Serving")
    shared_key = kms.Key.from_key_arn(serving, "SharedKey", key.key_arn)
    _endpoint(serving, bucket=s3.Bucket.from_bucket_attributes(serving, "Shared", bucket_arn=bucket.bucket_arn,
                                                               encryption_key=shared_key))
    app.synth()
    return audit(app, ("Serving/Embeddings",))


def imported_by_name(folder: Path) -> Audit:
    """A bucket and key from outside the app, by name and ARN."""
    app = _app(folder)
    serving = cdk.Stack(app, "Serving")
    key = kms.Key.from_key_arn(serving, "Key",
                               "arn:aws:kms:eu-west-1:123456789012:key/0a1b2c3d-1111-2222-3333-444455556666")
    _endpoint(serving, bucket=s3.Bucket.from_bucket_attributes(serving, "Shared", bucket_name="team-models",
                                                               encryption_key=key))
    app.synth()
    return audit(app, ("Serving/Embeddings",))


def pipeline(folder: Path) -> Audit:
    """The app with mme:pipeline, as app.py builds it: app.py adds AwsSolutionsChecks as the
    validation plugin, which fails this synth (the acknowledgments are only recorded yet)."""
    from app import build_app

    app = cdk.App(context={**context(), **AUDIT, "mme:pipeline": dict(PIPELINE)}, outdir=str(folder),
                  analytics_reporting=False)
    build_app(app)
    with pytest.raises(RuntimeError, match="ValidationFailed"):
        app.synth()
    return audit(app, None)


APPS: dict[str, Callable[[Path], Audit]] = {
    "default": default_app, **{name: variant(name) for name in VARIANTS if name != "default"},
    "platform_app": platform_app, "own_vpc_and_topic": own_vpc_and_topic,
    "created_vpc": created_vpc, "replicated": replicated, "cross_stack": cross_stack, "imported_by_name": imported_by_name, "pipeline": pipeline,
}
_AUDITS: dict[str, Audit] = {}


@pytest.fixture(scope="module", params=list(APPS))
def audited(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Audit:
    name = request.param
    if name not in _AUDITS:
        _AUDITS[name] = APPS[name](tmp_path_factory.mktemp(name))
    return _AUDITS[name]


# ---------------------------------------------------------------------------------------------
# The four packs on each app
# ---------------------------------------------------------------------------------------------


def test_the_four_packs_report_nothing_unacknowledged(audited: Audit) -> None:
    assert audited.ours(audited.raw), "the packs found nothing to acknowledge: they did not run"
    assert audited.ours(audited.remaining) == []


def test_every_acknowledgment_matches_a_finding(audited: Audit) -> None:
    assert audited.acknowledged
    assert audited.stale() == []


def test_acknowledgments_are_exact_and_give_a_reason(audited: Audit) -> None:
    """One rule of one pack, or one finding of it, on one construct: never a pack's blanket
    ``AwsSolutions-IAM5``; each with its reason."""
    for path, rule_id, reason in audited.acknowledged:
        assert rule_id not in ("AwsSolutions-IAM5", "AwsSolutions-IAM4"), path
        pack, _, rule = rule_id.partition("-")
        if pack != "AwsSolutions":
            assert pack in PACK_RULES[rule.split("[")[0]], (path, rule_id)
        assert len(reason) > 60, (path, rule_id, reason)


def test_no_warning_level_finding_remains_either(audited: Audit) -> None:
    """cdk-nag fails a synth on a warning too (a report's success is no violation at all)."""
    assert [f for f in audited.ours(audited.remaining) if f[2] == "warning"] == []


# ---------------------------------------------------------------------------------------------
# What the acknowledgments say and what was fixed
# ---------------------------------------------------------------------------------------------


def _only(name: str, tmp_path_factory: pytest.TempPathFactory) -> Audit:
    if name not in _AUDITS:
        _AUDITS[name] = APPS[name](tmp_path_factory.mktemp(name))
    return _AUDITS[name]


def test_the_cross_stack_import_is_acknowledged_by_its_import_name(tmp_path_factory: pytest.TempPathFactory) -> None:
    """The 12 AwsSolutions-IAM5 findings of the import are acknowledged by the flattened
    Fn::ImportValue cdk-nag prints (they were keyed on the producer's GetAtt before)."""
    found = _only("cross_stack", tmp_path_factory)
    imports = {rule for rule, _, _ in found.raw if rule.startswith("AwsSolutions-IAM5[Resource::TeamData:Exports")}
    assert len(imports) >= 6, imports
    assert not [f for f in found.ours(found.remaining) if f[0].startswith("AwsSolutions-")]
    # The log groups: the key is not this app's to give CloudWatch Logs a statement in.
    log_groups = {path for rule, path, _ in found.raw if rule == "NIST.800.53.R5-CloudWatchLogGroupEncrypted"}
    assert len(log_groups) == 7, log_groups


def test_reasons_that_cite_a_source_name_it(tmp_path_factory: pytest.TempPathFactory) -> None:
    found = _only("default", tmp_path_factory)
    reasons = {(rule_id, reason) for _, rule_id, reason in found.acknowledged}
    assert ("NIST.800.53.R5-SageMakerEndpointConfigurationKMSKeyConfigured", INSTANCE_STORE_KEY_REASON) in reasons
    assert ("PCI.DSS.321-S3DefaultEncryptionKMS", ACCESS_LOG_ENCRYPTION_REASON) in reasons
    assert CREATE_ENDPOINT_CONFIG_URL in INSTANCE_STORE_KEY_REASON
    assert SERVER_ACCESS_LOGGING_URL in ACCESS_LOG_ENCRYPTION_REASON


def test_fixed_in_the_construct_not_acknowledged(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Alarm actions (a created topic by default) and the created VPC's closed default security
    group are fixes: no pack reports them and nothing acknowledges them."""
    for name in ("default", "created_vpc", "pipeline"):
        found = _only(name, tmp_path_factory)
        rules = {rule.split("-", 1)[-1] for rule, _, _ in found.ours(found.raw)} | {
            rule_id.split("-", 1)[-1] for _, rule_id, _ in found.acknowledged}
        assert not rules & {"CloudWatchAlarmAction", "VPCDefaultSecurityGroupClosed"}, (name, rules)


def test_a_stale_acknowledgment_is_reported(tmp_path: Path) -> None:
    """The check above can fail: an acknowledgment of a rule that reports nothing on its
    construct is stale."""
    app = _app(tmp_path)
    stack = cdk.Stack(app, "Stale")
    endpoint = _endpoint(stack)
    acknowledge(endpoint.bucket, "HIPAA.Security-LambdaDLQ", "A bucket has no dead-letter queue to configure; "
                "this acknowledgment matches no finding and must be reported.")
    found = audit(app, ("Stale/Embeddings",))
    assert found.stale() == [(endpoint.bucket.node.path, "HIPAA.Security-LambdaDLQ")]


# ---------------------------------------------------------------------------------------------
# A setting that turns off what a pack needs: one synth warning, and the packs report it
# ---------------------------------------------------------------------------------------------


def test_no_alarm_topic_synthesizes_with_one_warning_naming_the_rule(tmp_path: Path) -> None:
    app = _app(tmp_path)
    stack = cdk.Stack(app, "Quiet")
    endpoint = _endpoint(stack, alarm_topic_enabled=False)
    warnings = [entry.data for node in endpoint.node.find_all() for entry in node.node.metadata
                if entry.type == "aws:cdk:warning" and "CloudWatchAlarmAction" in str(entry.data)]
    assert len(warnings) == 1, warnings
    assert "alarm_topic_enabled: false" in str(warnings[0])
    app.synth()  # it synthesizes
    found = audit(app, ("Quiet/Embeddings",))
    reported = {rule for rule, _, _ in found.ours(found.remaining)}
    assert reported == {"HIPAA.Security-CloudWatchAlarmAction", "NIST.800.53.R5-CloudWatchAlarmAction"}


def test_emails_with_no_topic_are_one_line_naming_both_keywords(tmp_path: Path) -> None:
    stack = cdk.Stack(_app(tmp_path), "Emails")
    with pytest.raises(PropsError) as caught:
        _endpoint(stack, alarm_topic_enabled=False, alarm_emails=["ops@example.com"])
    text = str(caught.value)
    assert text.startswith("alarm_emails: given with alarm_topic_enabled false;") and "\n" not in text


def test_replica_bucket_replicates_both_buckets_and_nothing_is_acknowledged_for_it(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    found = _only("replicated", tmp_path_factory)
    stack = found.app.node.find_child("Replicated")
    template = json.loads((Path(found.app.outdir) / "Replicated.template.json").read_text())
    buckets = [r["Properties"] for r in template["Resources"].values() if r["Type"] == "AWS::S3::Bucket"]
    assert len(buckets) == 2
    for bucket in buckets:
        (rule,) = bucket["ReplicationConfiguration"]["Rules"]
        assert rule["Destination"]["Bucket"] == "arn:aws:s3:::team-model-replica"
        assert rule["DeleteMarkerReplication"] == {"Status": "Enabled"} and rule["Status"] == "Enabled"
    assert not [rule for _, rule, _ in found.acknowledged if "S3BucketReplicationEnabled" in rule]
    assert not [rule for rule, _, _ in found.ours(found.raw) if "S3BucketReplicationEnabled" in rule]
    roles = [r["Properties"] for r in template["Resources"].values() if r["Type"] == "AWS::IAM::Role"
             and r["Properties"]["AssumeRolePolicyDocument"]["Statement"][0]["Principal"] == {"Service": "s3.amazonaws.com"}]
    (role,) = roles
    assert "RoleName" not in role  # CDK's own role would be CDKReplicationRole in every stack
    assert stack is not None


def test_replica_bucket_with_your_bucket_is_one_line(tmp_path: Path) -> None:
    stack = cdk.Stack(_app(tmp_path), "Both")
    key = kms.Key(stack, "Key")
    with pytest.raises(PropsError) as caught:
        _endpoint(stack, bucket=s3.Bucket(stack, "Mine", encryption_key=key), encryption_key=key,
                  replica_bucket=s3.Bucket(stack, "Replica"))
    text = str(caught.value)
    assert text.startswith("replica_bucket: given with bucket;") and "\n" not in text
