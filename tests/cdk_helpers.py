"""Shared helpers of the stack tests: build the app in-process or run it as the CLI does.

Each test module builds its stacks once (module-scoped fixtures): a synth takes seconds.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aws_cdk as cdk
import yaml
from aws_cdk.assertions import Template
from cdk_nag import AwsSolutionsChecks

ROOT = Path(__file__).resolve().parents[1]
VENV_BIN = ROOT / ".venv" / "bin"
SNAPSHOTS = Path(__file__).resolve().parent / "snapshots"

if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from app import cdk_json_context, load_models  # noqa: E402
from triton_mme_cdk.stacks.settings import MmeSettings  # noqa: E402
from triton_mme_cdk.stacks.triton_mme_stack import TritonMmeStack  # noqa: E402

_HEX64 = re.compile(r"\b[0-9a-f]{64}\b")
_RELEASE = re.compile(r"\br-[0-9a-f]{16}\b")


@dataclass
class Synth:
    """One synthesized app: the stack, its template (assertions and plain JSON) and outdir."""

    app: cdk.App
    stack: TritonMmeStack
    template: Template
    data: dict[str, Any]
    text: str
    outdir: Path

    def resources(self, type_: str) -> dict[str, dict[str, Any]]:
        return {k: v for k, v in self.data["Resources"].items() if v["Type"] == type_}

    def only(self, type_: str) -> tuple[str, dict[str, Any]]:
        found = self.resources(type_)
        assert len(found) == 1, f"expected one {type_}, found {sorted(found)}"
        return next(iter(found.items()))


def context(**settings: Any) -> dict[str, Any]:
    """``cdk.json`` context plus ``mme:`` settings given as strings, as ``-c`` would give them."""
    merged = cdk_json_context()
    for key, value in settings.items():
        merged[f"mme:{key}"] = value
    return merged


def synth(
    outdir: Path,
    *,
    nag: bool = True,
    manifest_path: Path | str | None = "default",
    extra_context: Mapping[str, Any] | None = None,
    **settings: Any,
) -> Synth:
    """Build the app in-process the way ``app.py`` does (settings from the context) and synth it.

    ``manifest_path`` overrides ``mme:manifest_path`` with an absolute path (None: no manifest).
    ``extra_context`` adds context keys, such as cached lookups (:func:`vpc_lookup_context`).
    """
    if manifest_path is None:
        settings.setdefault("manifest_path", "")
    elif manifest_path != "default":
        settings["manifest_path"] = str(manifest_path)
    ctx = {**context(**settings), **(extra_context or {})}
    app = cdk.App(context=ctx, outdir=str(outdir), analytics_reporting=False)
    parsed = MmeSettings.from_context(ctx)
    manifest, path = load_models(parsed)
    stack = TritonMmeStack(
        app, parsed.stack_name, settings=parsed, manifest=manifest, manifest_path=path,
        env=(cdk.Environment(account=parsed.account, region=parsed.region)
             if parsed.account or parsed.region else None),
    )
    if nag:
        cdk.Validations.of(app).add_plugins(AwsSolutionsChecks(app))
    assembly = app.synth()
    artifact = assembly.get_stack_artifact(stack.artifact_id)
    text = (outdir / artifact.template_file).read_text(encoding="utf-8")
    return Synth(
        app=app,
        stack=stack,
        template=Template.from_json(json.loads(text)),
        data=json.loads(text),
        text=text,
        outdir=outdir,
    )


def mask(text: str) -> str:
    """Mask what changes with the build code or the manifest, not with the infrastructure."""
    return _RELEASE.sub("r-<release>", _HEX64.sub("<sha256>", text))


def snapshot_text(template: str) -> str:
    """The template without what changes between CDK versions or build code revisions."""
    data = json.loads(template)
    data["Resources"].pop("CDKMetadata", None)
    data.get("Conditions", {}).pop("CDKMetadataAvailable", None)
    if data.get("Conditions") == {}:
        del data["Conditions"]
    return mask(json.dumps(data, indent=1)) + "\n"


def statements(data: Mapping[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every IAM policy statement of a template, with the logical id of its policy or role."""
    for logical_id, resource in data["Resources"].items():
        documents = []
        if resource["Type"] == "AWS::IAM::Policy":
            documents.append(resource["Properties"]["PolicyDocument"])
        if resource["Type"] == "AWS::IAM::Role":
            documents.extend(p["PolicyDocument"] for p in resource["Properties"].get("Policies", []))
        for document in documents:
            for statement in document["Statement"]:
                yield logical_id, statement


def as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def policy_of_role(data: Mapping[str, Any], role_logical_id: str) -> list[dict[str, Any]]:
    """The statements of every ``AWS::IAM::Policy`` attached to a role."""
    found = []
    for resource in data["Resources"].values():
        if resource["Type"] != "AWS::IAM::Policy":
            continue
        roles = resource["Properties"].get("Roles", [])
        if {"Ref": role_logical_id} in roles:
            found.extend(resource["Properties"]["PolicyDocument"]["Statement"])
    return found


def write_manifest(path: Path, count: int) -> Path:
    """A valid manifest of ``count`` synthetic models (no download, no local file)."""
    models = [
        {
            "name": f"model-{index:04d}",
            "source": {
                "kind": "synthetic",
                "architecture": "resnet",
                "seed": index,
                "config": {"embedding_size": 8, "hidden_sizes": [8, 16], "depths": [1, 1]},
            },
            "task": "image-classification",
            "format": "onnx",
            "max_batch_size": 8,
            "image": {"image_size": 32, "channels": 3},
        }
        for index in range(count)
    ]
    path.write_text(yaml.safe_dump({"version": 1, "models": models}, sort_keys=False), encoding="utf-8")
    return path


def subprocess_env(**extra: str) -> dict[str, str]:
    """The environment of a CDK app or CLI run: the venv's Node 24 first, no AWS lookups, the
    CDK's built-in template validation as the test process has it (off: tests/conftest.py; pass
    ``CDK_VALIDATION="true"`` for a run with it)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CDK_", "AWS_"))}
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"
    env["AWS_EC2_METADATA_DISABLED"] = "true"
    env["CDK_DISABLE_VERSION_CHECK"] = "1"
    env["CDK_VALIDATION"] = os.environ.get("CDK_VALIDATION", "false")
    env.update(extra)
    return env


def run_app(outdir: Path, settings: Mapping[str, Any] | None = None, **extra_env: str) -> subprocess.CompletedProcess[str]:
    """``python app.py`` with ``-c``-style context, passed the way the CDK CLI passes it."""
    ctx = {f"mme:{k}": v for k, v in (settings or {}).items()}
    env = subprocess_env(CDK_OUTDIR=str(outdir), CDK_CONTEXT_JSON=json.dumps(ctx), **extra_env)
    return subprocess.run(
        [sys.executable, "app.py"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )


# ---------------------------------------------------------------------------------------------
# Operations helpers: cached VPC lookups, tags, dashboard bodies
# ---------------------------------------------------------------------------------------------


def vpc_lookup_context(
    account: str, region: str, vpc_id: str, *, isolated: bool = True, private: bool = True
) -> dict[str, Any]:
    """A cached ``ec2.Vpc.from_lookup`` answer (what the CDK CLI writes to cdk.context.json), so
    that a lookup synthesizes real-looking ids without AWS credentials. Two AZs; a public group
    always, isolated and private (with egress) groups on request."""
    zones = (f"{region}a", f"{region}b")

    def group(name: str, type_: str, index: int) -> dict[str, Any]:
        return {
            "name": name,
            "type": type_,
            "subnets": [
                {
                    "subnetId": f"subnet-{index:02d}{z:015x}",
                    "cidr": f"10.20.{index * 16 + z * 8}.0/21",
                    "availabilityZone": zone,
                    "routeTableId": f"rtb-{index:02d}{z:015x}",
                }
                for z, zone in enumerate(zones)
            ],
        }

    groups = [group("Public", "Public", 1)]
    if private:
        groups.append(group("Private", "Private", 2))
    if isolated:
        groups.append(group("Isolated", "Isolated", 3))
    key = (
        f"vpc-provider:account={account}:filter.vpc-id={vpc_id}:region={region}"
        ":returnAsymmetricSubnets=true"
    )
    return {
        key: {
            "vpcId": vpc_id,
            "vpcCidrBlock": "10.20.0.0/16",
            "ownerAccountId": account,
            "availabilityZones": [],
            "subnetGroups": groups,
        }
    }


def taggable_types(data: Mapping[str, Any]) -> set[str]:
    """The resource types of a template whose CloudFormation schema has a ``Tags`` property
    (from the schemas cfn-lint ships), custom resources excepted."""
    from cfnlint.schema.manager import PROVIDER_SCHEMA_MANAGER

    found = set()
    for resource in data["Resources"].values():
        type_ = resource["Type"]
        if type_.startswith("Custom::") or type_ == "AWS::CDK::Metadata":
            continue
        schema = PROVIDER_SCHEMA_MANAGER.get_resource_schema("us-east-1", type_).schema
        if "Tags" in schema.get("properties", {}):
            found.add(type_)
    return found


def tag_map(tags: Any) -> dict[str, Any]:
    """A resource's ``Tags`` as a dict (list of Key/Value, or a plain map)."""
    if isinstance(tags, list):
        return {tag["Key"]: tag["Value"] for tag in tags}
    return dict(tags or {})


def untagged(data: Mapping[str, Any], expected: Mapping[str, str]) -> list[str]:
    """Logical ids of taggable resources that miss one of ``expected`` (key -> value)."""
    types = taggable_types(data)
    missing = []
    for logical_id, resource in data["Resources"].items():
        if resource["Type"] not in types:
            continue
        tags = tag_map(resource.get("Properties", {}).get("Tags"))
        if any(tags.get(key) != value for key, value in expected.items()):
            missing.append(f"{logical_id} ({resource['Type']})")
    return missing


def flatten_join(value: Any) -> str:
    """A ``Fn::Join`` of strings and references as one string (references as ``<ref>``)."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and "Fn::Join" in value:
        delimiter, parts = value["Fn::Join"]
        return delimiter.join(flatten_join(part) for part in parts)
    return "<ref>"


# ---------------------------------------------------------------------------------------------
# The settings variants the tests synthesize (one fixture each; the IaC scanner test scans them all)
# ---------------------------------------------------------------------------------------------

#: Account, region and VPC of the variants with an explicit environment.
ACCOUNT, REGION, VPC_ID = "123456789012", "eu-west-1", "vpc-0123456789abcdef0"
#: An existing topic the ``existing`` variant notifies.
TOPIC_ARN = f"arn:aws:sns:{REGION}:{ACCOUNT}:platform-alarms"
#: The release the ``published`` variant serves.
RELEASE = "r-0123456789abcdef"

#: Keyword arguments of :func:`synth` per variant (besides the output folder and ``nag``).
VARIANTS: dict[str, dict[str, Any]] = {
    # The defaults: models.yaml, cdk.json.
    "default": {},
    # An EBS-backed instance type, destroy policies, build and container settings, an environment.
    "ebs": dict(
        instance_type="ml.p3.2xlarge",
        volume_size_gb="100",
        bucket_removal_policy="destroy",
        artifacts_on_delete="destroy",
        triton_log_verbose="true",
        triton_environment='{"SAGEMAKER_TRITON_THREAD_COUNT": "16", "SAGEMAKER_TRITON_PING_MODE": "ready"}',
        model_cache="Disabled",
        model_data_download_timeout_seconds="900",
        container_startup_health_check_timeout_seconds="1200",
        min_instance_count="2",
        initial_instance_count="2",
        max_instance_count="6",
        gpu_utilization_target="80",
        invocations_per_instance_target="150",
        build_total_timeout_minutes="30",
        build_query_interval_seconds="30",
        build_memory_mb="4096",
        build_timeout_minutes="10",
        # The p3's V100 (7.0) runs the images up to 24.09 (gpu_hosts.py); the AMI is pinned too.
        triton_image_version="24.09",
        inference_ami_version="al2-ami-sagemaker-inference-gpu-2",
        account=ACCOUNT,
        region=REGION,
    ),
    # No build: serve a release published out of band.
    "published": dict(manifest_path=None, release_id=RELEASE),
    # A created isolated VPC with the build inside it, a created topic with e-mails, canary rollouts.
    "isolated": dict(
        create_vpc="true",
        vpc_cidr="10.42.0.0/16",
        build_in_vpc="true",
        alarm_emails="ops@example.com,ml-oncall@example.com",
        rollout_traffic="CANARY",
        rollout_size="20",
        rollout_wait_seconds="900",
        rollout_termination_wait_seconds="0",
        tag_project="search",
        tag_environment="prod",
        tag_owner="ml-platform@example.com",
    ),
    # An existing VPC (a cached lookup), an existing topic, linear rollouts, no network isolation.
    "existing": dict(
        extra_context=vpc_lookup_context(ACCOUNT, REGION, VPC_ID),
        account=ACCOUNT,
        region=REGION,
        vpc_id=VPC_ID,
        build_in_vpc="true",
        alarm_topic_arn=TOPIC_ARN,
        network_isolation="false",
        min_instance_count="4",
        initial_instance_count="4",
        max_instance_count="8",
        rollout_traffic="LINEAR",
        rollout_size_type="INSTANCE_COUNT",
        rollout_size="2",
        rollout_max_execution_timeout_seconds="7200",
        rollback_alarms='["invocation_5xx_errors", "model_loading_wait_p90"]',
        alarm_latency_p99_ms="250",
    ),
}


# ---------------------------------------------------------------------------------------------
# The delivery pipeline (mme:pipeline)
# ---------------------------------------------------------------------------------------------

#: The example pipeline of docs/pipelines.md (and of make lint): two stages in two accounts, from a
#: CodeStar connection, notifying a topic.
PIPELINE: dict[str, Any] = json.loads((ROOT / "docs" / "pipeline.example.json").read_text(encoding="utf-8"))


@dataclass
class PipelineSynth:
    """The synthesized app with a pipeline: each stack's template by stack name."""

    app: cdk.App
    outdir: Path
    templates: dict[str, dict[str, Any]]


def synth_pipeline(outdir: Path, pipeline: Mapping[str, Any] | None = None, *,
                   extra_context: Mapping[str, Any] | None = None, **settings: Any) -> PipelineSynth:
    """The app as ``app.py`` composes it with ``mme:pipeline`` (with cdk-nag's checks, as app.py has);
    ``extra_context`` adds context keys (the CDK's permissions boundary setting)."""
    from app import build_app

    ctx = {**context(**settings), **(extra_context or {}), "mme:pipeline": dict(pipeline or PIPELINE)}
    app = cdk.App(context=ctx, outdir=str(outdir), analytics_reporting=False)
    build_app(app)
    app.synth()
    templates: dict[str, dict[str, Any]] = {}
    for folder in [outdir, *sorted(outdir.glob("assembly-*"))]:
        manifest = json.loads((folder / "manifest.json").read_text(encoding="utf-8"))
        for artifact_id, artifact in manifest.get("artifacts", {}).items():
            properties = artifact.get("properties", {})
            if artifact.get("type") == "aws:cloudformation:stack":
                path = folder / properties["templateFile"]
                templates[properties.get("stackName") or artifact_id] = json.loads(path.read_text(encoding="utf-8"))
    return PipelineSynth(app=app, outdir=outdir, templates=templates)
