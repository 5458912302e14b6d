"""parliament (duo-labs' IAM policy linter) on every policy document the tests synthesize: every
finding is acknowledged, with its reason, in :data:`ACKNOWLEDGED` (and in docs/security.md,
"Policy linter (parliament)"); every acknowledgment still answers a finding.

The templates: every settings variant (``cdk_helpers.VARIANTS``) and every stack of the example
pipeline (``cdk_helpers.PIPELINE``: the pipeline, its access stacks and its stage stacks). The
documents and how CloudFormation's intrinsics become placeholder ARNs: tests/policy_documents.py.
parliament runs once, in the scanner environment (tests/parliament_run.py says why).

What parliament judges: identity policies (its checks are written for them). On trust, bucket,
key and endpoint policies it checks actions, ARNs, condition keys and operators and principals'
shape, but reads each as an identity policy: a trust policy's missing ``Resource`` is a finding
(acknowledged below), and it does not judge who the principal is (a bucket policy's or key
policy's grant to ``*`` with conditions looks like any other statement to it). Who may do what
under the bucket policy is tested with tests/policy_eval.py (tests/test_bucket_guard.py).
"""

from __future__ import annotations

import json
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from cdk_helpers import ROOT, VARIANTS, synth, synth_pipeline
from policy_documents import PLACEHOLDERS, Document, Unresolved, documents, resolve

SCANNER_PYTHON = ROOT / ".venv-checkov" / "bin" / "python"
RUNNER = Path(__file__).resolve().parent / "parliament_run.py"
SECURITY_DOC = ROOT / "docs" / "security.md"
#: A deliberately wide policy, analysed with the templates': its findings must not be acknowledged.
PROBE = "probe|Probe|identity|PolicyDocument"
PROBE_DOCUMENT = {"Version": "2012-10-17", "Statement": [
    {"Effect": "Allow", "Action": ["s3:PutObject", "iam:PassRole"], "Resource": "*"}]}


@dataclass(frozen=True)
class Ack:
    """An acknowledged parliament finding: its issue, the kinds of document and logical ids it may
    come from, a pattern its detail matches, and why it stands."""

    key: str
    issue: str
    kinds: frozenset[str]
    logical_ids: str  # a regular expression, matched in full
    detail: str  # a regular expression, searched
    reason: str

    def matches(self, finding: Finding) -> bool:
        return (finding.issue == self.issue and finding.kind in self.kinds
                and re.fullmatch(self.logical_ids, finding.logical_id) is not None
                and re.search(self.detail, finding.detail) is not None)


def _kinds(*names: str) -> frozenset[str]:
    return frozenset(names)


#: Every parliament finding the templates may have, with its reason. docs/security.md lists them.
ACKNOWLEDGED: tuple[Ack, ...] = (
    Ack("trust-no-resource", "MALFORMED", _kinds("trust"), r".+", r"neither Resource nor NotResource",
        "A role's trust policy has no Resource (the role is the resource); parliament reads every "
        "document as an identity policy."),
    Ack("tls-version-number", "MISMATCHED_TYPE", _kinds("bucket"), r".+",
        r"s3:TlsVersion requires a value of type Numeric but given \['1\.2'\]",
        "The CDK's enforce_ssl deny below TLS 1.2 (NumericLessThan s3:TlsVersion 1.2, S3's own example); "
        "parliament's Numeric pattern takes integers only."),
    Ack("tls-version-actions", "UNKNOWN_CONDITION_FOR_ACTION", _kinds("bucket"), r".+",
        r"Unknown condition s3:TlsVersion for action s3:(InitiateReplication|PutAccessPointPublicAccessBlock)$",
        "The TLS deny is on s3:*; two of the actions s3:* expands to do not carry s3:TlsVersion, so the deny "
        "does not apply to them. The policy grants neither."),
    Ack("key-policy-this-key", "RESOURCE_STAR", _kinds("key"), r".+", r".",
        "In a key policy Resource '*' means this key (AWS KMS developer guide, key policy elements)."),
    Ack("key-policy-admin", "PERMISSIONS_MANAGEMENT_ACTIONS", _kinds("key"), r".+", r"kms:",
        "The account statement (kms:* for the account root) that delegates the key to IAM policies, which "
        "the CDK writes in every key policy; without it no IAM policy can grant the key."),
    Ack("logs-encryption-context-arn", "MISMATCHED_TYPE", _kinds("key"), r".+",
        r"ArnLike requires a value of type Arn but given String",
        "CloudWatch Logs' documented key policy statement conditions ArnLike on "
        "kms:EncryptionContext:aws:logs:arn; parliament types encryption-context keys as String."),
    Ack("logs-describe-context", "UNKNOWN_CONDITION_FOR_ACTION", _kinds("key"), r".+",
        r"Unknown condition kms:EncryptionContext:aws:logs:arn for action kms:Describe",
        "kms:Describe* in CloudWatch Logs' documented statement: the describe actions carry no encryption "
        "context, so the conditioned Allow grants Logs none of them (narrower, not wider)."),
    Ack("kms-key-id-arn", "MISMATCHED_TYPE_BUT_USABLE", _kinds("bucket"), r"ModelBucketPolicy.+",
        r"StringNotEquals requires a value of type String but given Arn",
        "The bucket guard's deny of a PUT not encrypted with the stack's key compares "
        "s3:x-amz-server-side-encryption-aws-kms-key-id (a String key whose value is the key's ARN) "
        "with the key's ARN."),
    Ack("wildcard-expansion", "RESOURCE_MISMATCH", _kinds("identity", "bucket"), r".+", r'"action": "s3:',
        "A wildcard action (s3:List*, s3:GetObject*, s3:* in a deny) that parliament expands to actions "
        "which take other resource types (access points, access grants, jobs): they grant nothing on "
        "the bucket the statement names. Checked: no action named here is written in the document."),
    Ack("distributed-map-executions", "RESOURCE_MISMATCH", _kinds("identity"),
        r"ModelBuild(BuildStateMachineDistributedMapPolicy|StartBuilds).+", r'"states:DescribeExecution"',
        "The Distributed Map's child executions (execution:<state machine>/<map run>:<id>, Step Functions' "
        "Distributed Map IAM example); parliament only knows the express-execution format for them."),
    Ack("codeconnections-arn", "RESOURCE_MISMATCH", _kinds("identity"), r"PipelineSource.+",
        r'"codestar-connections:UseConnection"',
        "The connection ARN is arn:aws:codeconnections:... (CodeStar Connections was renamed CodeConnections; "
        "codestar-connections:UseConnection accepts both); parliament only knows the old format."),
    Ack("ecr-token", "CREDENTIALS_EXPOSURE", _kinds("identity"),
        r"(ExecutionRole|ModelBuildProcessingRole)DefaultPolicy.+", r'^\{"actions": \["ecr:getauthorizationtoken"\]\}$',
        "ecr:GetAuthorizationToken to pull the Triton and build images; it has no resource-level "
        "permissions, and the token grants only what the role's ECR statements allow."),
    Ack("pipeline-assume", "CREDENTIALS_EXPOSURE", _kinds("identity"),
        r"(Pipeline\w*|PlanRole|SmokeRole)DefaultPolicy.+", r'^\{"actions": \["sts:assumerole"\]\}$',
        "CDK Pipelines' and the plan/smoke steps' roles assume named roles only (the action roles, the "
        "targets' bootstrap and read-only roles)."),
    Ack("volume-grant", "PERMISSIONS_MANAGEMENT_ACTIONS", _kinds("identity"),
        r"(ExecutionRole|ModelBuildProcessingRole)DefaultPolicy.+", r'^\{"actions": \["kms:creategrant"\]\}$',
        "SageMaker encrypts the instance's volume with the stack key through a grant: kms:CreateGrant on "
        "that key only, conditioned on kms:GrantIsForAWSResource."),
    Ack("vpc-eni-permission", "PERMISSIONS_MANAGEMENT_ACTIONS", _kinds("identity"), r"\w*VpcAccess.+",
        r"ec2:createnetworkinterfacepermission",
        "SageMaker's documented VPC permissions for an endpoint or Processing job in the customer's VPC."),
    Ack("vpc-eni-star", "RESOURCE_STAR", _kinds("identity"), r"\w*VpcAccess.+", r'"ec2:',
        "The network interfaces SageMaker and Lambda create in the VPC have no ARN before they exist; "
        "AWS's VPC access permissions for both services are on '*'."),
    Ack("state-machine-pass-role", "PERMISSIONS_MANAGEMENT_ACTIONS", _kinds("identity"),
        r"ModelBuildBuildStateMachineRoleDefaultPolicy.+", r"iam:passrole",
        "The build state machine passes the Processing role, by ARN, to SageMaker only "
        "(iam:PassedToService = sagemaker.amazonaws.com); and logs:PutResourcePolicy below."),
    Ack("vended-logs", "PERMISSIONS_MANAGEMENT_ACTIONS", _kinds("identity"),
        r"ModelBuild(BuildStateMachineRole|ProviderwaiterstatemachineRole)DefaultPolicy.+", r"logs:putresourcepolicy",
        "Step Functions' logging to CloudWatch Logs (vended log delivery: logs:CreateLogDelivery, "
        "logs:PutResourcePolicy, ...), which supports only Resource '*' (Step Functions developer guide)."),
    Ack("auto-delete-bucket-policy", "PERMISSIONS_MANAGEMENT_ACTIONS", _kinds("bucket"), r".+Policy.+",
        r's3:putbucketpolicy',
        "With removal policy destroy, the CDK's auto-delete-objects provider role may put the bucket policy "
        "(it denies new writes before it empties the bucket)."),
    Ack("auto-delete-escalation", "RESOURCE_POLICY_PRIVILEGE_ESCALATION", _kinds("bucket"), r".+Policy.+",
        r"does allow s3:PutBucketPolicy",
        "The same auto-delete-objects provider role: it reads and deletes, and may put the bucket policy; "
        "only with removal policy destroy."),
    Ack("source-action-acl", "PERMISSIONS_MANAGEMENT_ACTIONS", _kinds("identity"), r"PipelineSource.+",
        r"s3:putobjectacl",
        "The CDK's CodeStar connection source action writes the source artifact with its ACL actions on the "
        "pipeline's artifact bucket, which has ACLs disabled (bucket owner enforced)."),
    Ack("pipeline-codebuild-star", "RESOURCE_STAR", _kinds("identity"), r"PipelineAssets\w+DefaultPolicy.+",
        r'"codebuild:BatchGetBuilds", "codebuild:StartBuild", "codebuild:StopBuild"',
        "CDK Pipelines' asset-publishing roles, written by the CDK with '*' (checkov CKV_AWS_111 skip, same reason)."),
    Ack("self-mutation-list", "RESOURCE_STAR", _kinds("identity"), r"PipelineUpdatePipelineSelfMutationRole.+",
        r'^\["s3:ListBucket"\]$',
        "CDK Pipelines' self-mutation role lists buckets to find the bootstrap bucket; written by the CDK."),
)


@dataclass(frozen=True)
class Finding:
    template: str
    logical_id: str
    kind: str
    where: str
    issue: str
    detail: str


def _templates(folder: Path) -> dict[str, dict[str, Any]]:
    found = {name: synth(folder / name, nag=False, **settings).data for name, settings in VARIANTS.items()}
    pipeline = synth_pipeline(folder / "pipeline")
    found.update({f"pipeline:{name}": template for name, template in pipeline.templates.items()})
    return found


def _parliament(items: list[dict[str, Any]]) -> list[dict[str, str]]:
    if not SCANNER_PYTHON.exists():
        pytest.fail(f"{SCANNER_PYTHON} is missing: `make setup` installs parliament there (requirements-checkov.txt)")
    result = subprocess.run([str(SCANNER_PYTHON), str(RUNNER)], input=json.dumps(items),
                            capture_output=True, text=True, timeout=600)
    if result.returncode == 3:  # parliament_run.NOT_INSTALLED
        pytest.fail(result.stderr.strip())
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout)


@pytest.fixture(scope="module")
def analysed(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, list[Document]], list[Finding]]:
    templates = _templates(tmp_path_factory.mktemp("parliament"))
    docs = {name: list(documents(template)) for name, template in templates.items()}
    items = [{"id": f"{name}|{d.logical_id}|{d.kind}|{d.where}", "document": d.document}
             for name, found in docs.items() for d in found]
    items.append({"id": PROBE, "document": PROBE_DOCUMENT})
    findings = []
    for raw in _parliament(items):
        template, logical_id, kind, where = raw["id"].split("|")
        findings.append(Finding(template, logical_id, kind, where, raw["issue"], raw["detail"]))
    return docs, findings


def _actions_written(document: dict[str, Any]) -> set[str]:
    statements = document["Statement"]
    written: set[str] = set()
    for statement in statements if isinstance(statements, list) else [statements]:
        for key in ("Action", "NotAction"):
            value = statement.get(key, [])
            written.update(a.lower() for a in (value if isinstance(value, list) else [value]))
    return written


def _acknowledgment(finding: Finding, docs: dict[str, list[Document]]) -> Ack | None:
    for ack in ACKNOWLEDGED:
        if not ack.matches(finding):
            continue
        if ack.key == "wildcard-expansion":
            # Only actions the document does not name: they come from a wildcard's expansion.
            document = next(d for d in docs[finding.template]
                            if (d.logical_id, d.kind, d.where) == (finding.logical_id, finding.kind, finding.where))
            named = {item["action"].lower() for item in json.loads(finding.detail)}
            if named & _actions_written(document.document):
                continue
        return ack
    return None


def test_every_policy_is_analysed(analysed: tuple[dict[str, list[Document]], list[Finding]]) -> None:
    docs, _ = analysed
    assert set(docs) >= {*VARIANTS, "pipeline:TritonMmePipeline", "pipeline:TritonMme-staging-pipeline-access"}
    kinds = {d.kind for found in docs.values() for d in found}
    assert kinds >= {"identity", "trust", "bucket", "key", "endpoint"}, kinds
    for name, found in docs.items():
        assert found, f"{name}: no policy document"


def test_the_probe_is_not_acknowledged(analysed: tuple[dict[str, list[Document]], list[Finding]]) -> None:
    """The check can fail: a wide policy gets findings that no acknowledgment covers."""
    docs, findings = analysed
    probe = [f for f in findings if f.template == "probe"]
    assert {f.issue for f in probe} >= {"RESOURCE_STAR"}, probe
    docs = {**docs, "probe": [Document("Probe", "identity", "PolicyDocument", PROBE_DOCUMENT)]}
    assert all(_acknowledgment(f, docs) is None for f in probe), probe


def test_every_finding_is_acknowledged(analysed: tuple[dict[str, list[Document]], list[Finding]]) -> None:
    docs, findings = analysed
    open_ = sorted({f"{f.template} {f.logical_id} ({f.kind} {f.where}): {f.issue} {f.detail[:400]}"
                    for f in findings if f.template != "probe" and _acknowledgment(f, docs) is None})
    assert not open_, "parliament findings without an acknowledgment:\n" + "\n".join(open_)


def test_every_acknowledgment_answers_a_finding(analysed: tuple[dict[str, list[Document]], list[Finding]]) -> None:
    docs, findings = analysed
    used = {ack.key for f in findings if f.template != "probe" and (ack := _acknowledgment(f, docs)) is not None}
    assert [a.key for a in ACKNOWLEDGED if a.key not in used] == []


def test_acknowledgments_are_documented() -> None:
    text = SECURITY_DOC.read_text(encoding="utf-8")
    section = text.split("## Policy linter (parliament)", 1)[-1].split("\n## ", 1)[0]
    assert section != text, f"{SECURITY_DOC.name} has no 'Policy linter (parliament)' section"
    keys = [ack.key for ack in ACKNOWLEDGED]
    assert len(keys) == len(set(keys))
    for ack in ACKNOWLEDGED:
        row = next((line for line in section.splitlines() if line.startswith(f"| `{ack.key}` |")), None)
        assert row is not None, f"{SECURITY_DOC.name}: no row for {ack.key}"
        assert f"`{ack.issue}`" in row and ack.reason in row, f"{SECURITY_DOC.name}: the row of {ack.key} differs:\n{row}"


def test_intrinsics_resolve_to_placeholders() -> None:
    template = {
        "Resources": {"Bucket": {"Type": "AWS::S3::Bucket"}, "Machine": {"Type": "AWS::StepFunctions::StateMachine"},
                      "Thing": {"Type": "AWS::Some::Thing"}},
        "Mappings": {"Image": {"us-east-1": {"Account": "763104351884"}}},
        "Parameters": {"Stage": {"Type": "String"}},
    }
    value = {
        "a": {"Fn::Join": ["", [{"Fn::GetAtt": ["Bucket", "Arn"]}, "/models/*"]]},
        "b": {"Fn::Sub": "arn:${AWS::Partition}:s3:::${Bucket}/${Stage}"},
        "c": {"Fn::Select": [6, {"Fn::Split": [":", {"Ref": "Machine"}]}]},
        "d": {"Fn::FindInMap": ["Image", {"Ref": "AWS::Region"}, "Account"]},
        "e": [{"Ref": "AWS::NoValue"}, {"Ref": "AWS::AccountId"}],
        "f": {"Fn::Sub": ["${X}-${!Literal}", {"X": {"Ref": "AWS::URLSuffix"}}]},
    }
    assert resolve(value, template) == {
        "a": "arn:aws:s3:::bucket/models/*",
        "b": "arn:aws:s3:::bucket/<Stage>",
        "c": "machine",
        "d": "763104351884",
        "e": ["111122223333"],
        "f": "amazonaws.com-${Literal}",
    }
    for unknown in ({"Ref": "Missing"}, {"Fn::GetAtt": ["Thing", "Arn"]}, {"Fn::If": ["C", "a", "b"]},
                    {"Fn::GetAtt": ["Bucket", "WebsiteURL"]}):
        with pytest.raises(Unresolved):
            resolve(unknown, template)
    assert ("AWS::S3::Bucket", "WebsiteURL") not in PLACEHOLDERS
