"""The props of :class:`constructs.model_build_resource.ModelBuildResource`: the manifest, the
build Lambda's size and budget, where a model builds (the Lambda or a SageMaker Processing job)
and the network, each checked before anything is created."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Literal, Self

from aws_cdk import Duration, Size
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_logs as logs
from aws_cdk import aws_s3 as s3
from pydantic import AfterValidator, Field, model_validator

from triton_mme_cdk.constructs.model_bucket import KeyPrefix
from triton_mme_cdk.constructs.model_build_inputs import refuse_local_sources
from triton_mme_cdk.constructs.model_build_state_machine import MaxConcurrency
from triton_mme_cdk.constructs.props import MEBIBYTES, SECONDS, Between, Namer, Props, Resource, known
from triton_mme_cdk.constructs.provider_framework import (
    CLOUDFORMATION_MAX_WAIT,
    FINAL_ANSWER_ALLOWANCE_SECONDS,
    WAITER_ATTEMPT_ALLOWANCE_SECONDS,
    last_answer_seconds,
    longest_total_seconds,
)
from triton_mme_cdk.constructs.sagemaker_limits import PropsError
from triton_mme_cdk.model_build.manifest import Manifest
from triton_mme_cdk.model_build.manifest.build_engine import EngineSettings
from triton_mme_cdk.model_build.manifest.fields import MAX_PROCESSING_VOLUME_GB, PROCESSING_INSTANCE_TYPE
from triton_mme_cdk.model_build.release import PACKAGE_DIR

#: The default build budget: its last answer (50 polls a minute apart) reaches CloudFormation
#: before its one-hour wait ends (tests/test_custom_resource_protocol.py).
DEFAULT_TOTAL_TIMEOUT = Duration.minutes(50)


def _manifest_file(path: Path) -> Path:
    if not path.is_file():
        raise ValueError(f"got {str(path)!r}; no such file")
    return path


def _build_context(path: Path) -> Path:
    if not (path / "Dockerfile").is_file():
        raise ValueError(
            f"got {str(path)!r}; it has no Dockerfile (the build image of the model build handlers is built from it)"
        )
    return path


class ModelBuildResourceProps(Props):
    """Props of :class:`ModelBuildResource`."""

    manifest: Manifest = Field(
        description="The validated manifest. Sources on the local disk (kind local, or onnx with a local "
        "path) are refused: the Lambda cannot read them."
    )
    manifest_path: Annotated[Path, AfterValidator(_manifest_file)] = Field(
        description="The manifest file (uploaded as an asset; its folder is the base of relative paths)."
    )
    model_bucket: Resource[s3.IBucket] = Field(
        description="Bucket the release is published to. Its KMS key, when this app manages its policy, also "
        "encrypts the build's log groups and the provider functions' environment variables."
    )
    model_prefix: KeyPrefix = Field(
        default="models",
        description="S3 key prefix of every release (<prefix>/<release_id>/<model>.tar.gz); the "
        "execution role reads only this prefix.",
    )
    build_context: Annotated[Path, AfterValidator(_build_context)] = Field(
        default=PACKAGE_DIR, description="Folder with the Dockerfile of the build image (model_build/)."
    )
    memory_size: int = Field(default=6144, ge=128, le=10240, description="Memory of the build Lambda functions (MiB).")
    ephemeral_storage_size: Annotated[Size, Between(512, 10240, MEBIBYTES)] = Field(
        default_factory=lambda: Size.mebibytes(10240), description="/tmp storage of the build Lambda functions (MiB)."
    )
    timeout: Annotated[Duration, Between(1, 900, SECONDS)] = Field(
        default_factory=lambda: Duration.minutes(15),
        description="Timeout of one run of a build Lambda function; the build continues over several runs.",
    )
    total_timeout: Annotated[Duration, Between(1, CLOUDFORMATION_MAX_WAIT.to_seconds(), SECONDS)] = Field(
        default_factory=lambda: DEFAULT_TOTAL_TIMEOUT,
        description="Provider total timeout: how long is_complete is polled (total / query interval calls) "
        "before the resource fails. CloudFormation waits at most one hour for a custom resource, and "
        "the provider's last answer comes after the total timeout plus each poll's own run (allowed "
        f"{WAITER_ATTEMPT_ALLOWANCE_SECONDS} s) and the final answer ({FINAL_ANSWER_ALLOWANCE_SECONDS} s): "
        "at most 50 minutes with a 60 s interval, less with a shorter one.",
    )
    query_interval: Annotated[Duration, Between(5, CLOUDFORMATION_MAX_WAIT.to_seconds(), SECONDS)] = Field(
        default_factory=lambda: Duration.seconds(60),
        description="Time between is_complete calls; the total timeout must be a multiple of it.",
    )
    max_concurrency: MaxConcurrency = Field(
        default=50,
        description="Most models built at once: the MaxConcurrency of the build state machine's "
        "Distributed Map (one Lambda run per model; mind the account's Lambda concurrency).",
    )
    runs_on: Literal["auto", "lambda", "processing"] = Field(
        default="auto",
        description="Where a model builds unless its manifest entry says (build.runs_on): auto builds on "
        "the Lambda when the model's estimated peak memory and time fit it with margins "
        "(model_build/manifest/build_engine.py) and on a SageMaker Processing job otherwise; lambda or "
        "processing always there (lambda refuses at synth a model whose estimate does not fit).",
    )
    processing_instance_type: str = Field(
        default="ml.m5.4xlarge", pattern=PROCESSING_INSTANCE_TYPE,
        description="Instance type of a Processing build job (64 GiB on ml.m5.4xlarge) unless the entry "
        "says (build.instance_type). Mind the account's per-type Processing quota.",
    )
    processing_volume_gb: int = Field(
        default=100, ge=1, le=MAX_PROCESSING_VOLUME_GB,
        description="EBS volume of a Processing build job in GB (sources, export and tarball), encrypted with "
        "the model bucket's key, unless the entry says (build.volume_gb).",
    )
    processing_max_runtime: Annotated[Duration | None, Between(60, CLOUDFORMATION_MAX_WAIT.to_seconds(), SECONDS)] = Field(
        default=None,
        description="MaxRuntimeInSeconds of a Processing build job (SageMaker stops it then, and the build "
        "fails naming the model); at most the total timeout, which every build shares. None: the total timeout.",
    )
    processing_network_isolation: bool = Field(
        default=True,
        description="Network isolation of a Processing build job: the endpoint's (the job needs no network: "
        "SageMaker moves its inputs and outputs).",
    )
    processing_subnets: Sequence[Resource[ec2.ISubnet]] | None = Field(
        default=None, description="Subnets of a Processing build job: the endpoint's. None: not in a VPC."
    )
    processing_security_groups: Sequence[Resource[ec2.ISecurityGroup]] | None = Field(
        default=None, description="Security groups of a Processing build job (with processing_subnets): the endpoint's."
    )
    on_delete: Literal["retain", "destroy"] = Field(
        default="retain",
        description="What the build does with the served release's objects when the stack is deleted "
        "(retain or destroy). A release superseded by an update is tagged retired either way.",
    )
    unrouted_retention_days: int = Field(
        default=7,
        ge=1,
        le=36500,
        description="Days a served model object is kept after no route uses it (a model removed from "
        "the manifest, or the old build of an updated one), so that a rollback routes to it again "
        "without an upload; then the build deletes it at its next run. At least 1: the build function "
        "keeps a day whatever its event says.",
    )
    deployed_record: str = Field(
        default="",
        description="The stack's deployed record (constructs.deployed_record: the fleet's and the data's "
        "resources as the template renders them, a JSON string or a token for one), written into the "
        "routes at each deploy so that `python -m model_build plan` compares template with template. "
        "Empty: none is written, and plan reports the fleet as unknown.",
    )
    log_retention: logs.RetentionDays = Field(
        default=logs.RetentionDays.ONE_MONTH, description="Retention of the handler, provider and waiter logs."
    )
    vpc: Resource[ec2.IVpc] | None = Field(
        default=None,
        description="Run the handlers in this VPC, in vpc_subnets with security_groups; the role gets the "
        "EC2 network-interface actions Lambda needs. The subnets must reach S3 and CloudFormation (VPC "
        "endpoints or a NAT gateway); huggingface sources need the internet. Unset: not in a VPC.",
    )
    vpc_subnets: Sequence[Resource[ec2.ISubnet]] | None = Field(default=None, description="Subnets of the handlers (of vpc).")
    security_groups: Sequence[Resource[ec2.ISecurityGroup]] | None = Field(
        default=None, description="Security groups of the handlers (of vpc)."
    )

    def check(self, name: Namer) -> None:
        total, every = self.total_timeout, self.query_interval
        seconds = total.to_seconds(), every.to_seconds()
        if known(*seconds) and (seconds[0] < seconds[1] or seconds[0] % seconds[1]):
            raise PropsError(
                f"{name('total_timeout')}: got {total.to_human_string()} with {name('query_interval')} "
                f"{every.to_human_string()}; the total timeout must be a whole multiple of the query interval"
            )
        runtime = self.job_max_runtime.to_seconds()
        if self.processing_max_runtime is not None and known(runtime, seconds[0]) and runtime > seconds[0]:
            raise PropsError(
                f"{name('processing_max_runtime')}: got {self.job_max_runtime.to_human_string()} with "
                f"{name('total_timeout')} {total.to_human_string()}; a Processing build job must end within "
                "the total timeout"
            )
        wait = CLOUDFORMATION_MAX_WAIT.to_seconds()
        if known(*seconds) and last_answer_seconds(*seconds) > wait:
            longest = longest_total_seconds(seconds[1], wait)
            raise PropsError(
                f"{name('total_timeout')}: got {total.to_human_string()} with {name('query_interval')} "
                f"{every.to_human_string()}; the provider's last answer would come "
                f"{last_answer_seconds(*seconds):.0f} s after CloudFormation's request, past its {wait:.0f} s wait "
                f"(each of the {seconds[0] // seconds[1]:.0f} polls takes up to {WAITER_ATTEMPT_ALLOWANCE_SECONDS} s "
                f"besides the interval): at most {longest} s ({longest / 60:g} minutes) with this interval"
            )

    @property
    def job_max_runtime(self) -> Duration:
        """A Processing build job's MaxRuntime: the setting, or the total timeout."""
        return self.processing_max_runtime or self.total_timeout

    def engine_settings(self) -> EngineSettings:
        """Where models build by default, for the estimate (synth) and the plan step (deploy)."""
        return EngineSettings(
            runs_on=self.runs_on, lambda_memory_mb=self.memory_size, lambda_timeout_s=int(self.timeout.to_seconds()),
            instance_type=self.processing_instance_type, volume_gb=self.processing_volume_gb,
            max_runtime_s=int(self.job_max_runtime.to_seconds()),
        )

    @model_validator(mode="after")
    def _vpc_and_sources(self) -> Self:
        if not (bool(self.vpc) == bool(self.vpc_subnets) == bool(self.security_groups)):
            raise PropsError(
                "vpc, vpc_subnets, security_groups: give all three (a function in a VPC needs subnets and "
                "security groups of it) or none"
            )
        refuse_local_sources(self.manifest)
        return self
