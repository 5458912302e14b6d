"""The SageMaker hosting resources of one multi-model endpoint (:class:`SageMakerHosting`): the
Model in ``MultiModel`` mode on the Triton image, the EndpointConfig on one GPU instance type, and
the Endpoint. The public construct that composes it with the bucket, the build and the alarms is
``TritonMultiModelEndpoint`` (``multi_model_endpoint.py``)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Annotated, Self

from aws_cdk import Annotations, Duration
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_sagemaker as sagemaker
from pydantic import AfterValidator, Field, model_validator

from constructs import Construct
from triton_mme_cdk.constructs.endpoint_metrics import EndpointMetrics
from triton_mme_cdk.constructs.nag_acknowledgments import (
    INSTANCE_STORE_KEY_REASON,
    acknowledge_in_packs,
    skip_checkov,
    wildcard_policy,
)
from triton_mme_cdk.constructs.props import SECONDS, Between, Namer, Props, Resource, is_unresolved, known
from triton_mme_cdk.constructs.sagemaker_limits import (
    ENVIRONMENT_KEY_PATTERN,
    ENVIRONMENT_MAX_ENTRIES,
    ENVIRONMENT_VALUE_MAX_LENGTH,
    LOG_VERBOSE_KEY,
    MODEL_DATA_URL_MAX_LENGTH,
    SHM_DEFAULT_BYTE_SIZE_KEY,
    SHM_GROWTH_BYTE_SIZE_KEY,
    TIMEOUT_MAX_SECONDS,
    TIMEOUT_MIN_SECONDS,
    TRITON_ENUM_VALUES,
    TRITON_EXTRA_KEYS,
    TRITON_SINGLE_MODEL_KEYS,
    TRITON_TYPED_KEYS,
    VOLUME_SIZE_MAX_GB,
    VOLUME_SIZE_MIN_GB,
    InferenceAmiVersion,
    InstanceType,
    ModelCacheSetting,
    PropsError,
    SageMakerName,
    has_instance_storage,
)
from triton_mme_cdk.constructs.triton_image import FleetHost, TritonImage, load_image_table, resolve_host
from triton_mme_cdk.model_build.text_ensemble.shm import (
    SHM_DEFAULT_BYTE_SIZE,
    SHM_GROWTH_BYTE_SIZE,
    SHM_MAX_BYTE_SIZE,
)

#: What SageMaker needs to attach the model's network interfaces to a VPC (developer guide, "Give
#: SageMaker hosted endpoints access to resources in your Amazon VPC"). None of these actions
#: supports resource-level permissions that SageMaker's calls would match, hence ``*``.
SAGEMAKER_VPC_ACTIONS: tuple[str, ...] = (
    "ec2:CreateNetworkInterface",
    "ec2:CreateNetworkInterfacePermission",
    "ec2:DeleteNetworkInterface",
    "ec2:DeleteNetworkInterfacePermission",
    "ec2:DescribeDhcpOptions",
    "ec2:DescribeNetworkInterfaces",
    "ec2:DescribeSecurityGroups",
    "ec2:DescribeSubnets",
    "ec2:DescribeVpcEndpoints",
    "ec2:DescribeVpcs",
)
#: How the host check names this construct's props (its settings' names are the default).
_PROP_NAMES = {"triton_image_version": "image"}
#: VpcConfig: at most 16 subnets (SageMaker wants them in two AZs at least) and 1 to 5 security groups.
VPC_SUBNETS_MAX = 16
VPC_SECURITY_GROUPS_MAX = 5
#: Instance counts: the variant starts with at most 1,000; Application Auto Scaling's capacities.
INITIAL_INSTANCES_MAX = 1000
INSTANCES_MAX = 10_000


def _environment(environment: dict[str, str]) -> dict[str, str]:
    """Extra container environment: documented ``SAGEMAKER_TRITON_*`` keys only, sorted.

    Keys with their own prop (shared memory sizes, verbose logging) and single-model keys are
    refused; values are strings of at most 1024 characters.
    """
    for key, value in environment.items():
        if key in TRITON_TYPED_KEYS:
            raise ValueError(
                f"key {key!r} has its own setting (shared memory sizes and verbose logging are typed "
                "props); set it there"
            )
        if key in TRITON_SINGLE_MODEL_KEYS:
            raise ValueError(
                f"key {key!r} is for single-model endpoints; a multi-model endpoint loads the model "
                "named by each request's TargetModel"
            )
        if key not in TRITON_EXTRA_KEYS or not re.fullmatch(ENVIRONMENT_KEY_PATTERN, key):
            raise ValueError(f"unknown key {key!r}; allowed: " + ", ".join(sorted(TRITON_EXTRA_KEYS)))
        if is_unresolved(value):
            continue
        if len(value) > ENVIRONMENT_VALUE_MAX_LENGTH:
            raise ValueError(
                f"value of {key!r} has {len(value)} characters; at most {ENVIRONMENT_VALUE_MAX_LENGTH} allowed"
            )
        allowed = TRITON_ENUM_VALUES.get(key)
        if allowed and value not in allowed:
            raise ValueError(f"{key} got {value!r}; expected one of " + ", ".join(allowed))
    if len(environment) + len(TRITON_TYPED_KEYS) > ENVIRONMENT_MAX_ENTRIES:
        raise ValueError(
            f"{len(environment)} entries; at most {ENVIRONMENT_MAX_ENTRIES - len(TRITON_TYPED_KEYS)} "
            "besides the typed ones"
        )
    return dict(sorted(environment.items()))


def _model_data_url(url: str) -> str:
    if not url.startswith("s3://") or not url.endswith("/") or len(url) > MODEL_DATA_URL_MAX_LENGTH:
        raise ValueError(
            f"got {url!r}; a multi-model endpoint needs an S3 prefix 's3://<bucket>/<prefix>/' of at "
            f"most {MODEL_DATA_URL_MAX_LENGTH} characters"
        )
    return url


#: ``ModelDataDownloadTimeoutInSeconds`` and ``ContainerStartupHealthCheckTimeoutInSeconds``.
ContainerTimeout = Annotated[Duration, Between(TIMEOUT_MIN_SECONDS, TIMEOUT_MAX_SECONDS, SECONDS)]
#: A shared-memory size of the python backend, in bytes.
ByteSize = Annotated[int, Field(ge=1, le=SHM_MAX_BYTE_SIZE)]


class FleetSize(Props):
    """How many instances the variant runs: created with ``initial``, kept by autoscaling between
    ``minimum`` and ``maximum`` (``minimum <= initial <= maximum``).

    One value, given to the endpoint, its autoscaling, its rollout policy, alarms and dashboard, so
    that every one of them sees the same numbers.
    """

    minimum: int = Field(default=1, ge=1, le=INSTANCES_MAX, description="Fewest instances autoscaling scales in to.")
    initial: int = Field(
        default=1,
        ge=1,
        le=INITIAL_INSTANCES_MAX,
        description="Instances the endpoint is created with; min <= initial <= max. Later updates "
        "keep the count autoscaling set.",
    )
    maximum: int = Field(default=4, ge=1, le=INSTANCES_MAX, description="Most instances autoscaling scales out to.")

    def check(self, name: Namer) -> None:
        if known(self.minimum, self.initial, self.maximum) and not self.minimum <= self.initial <= self.maximum:
            raise PropsError(
                f"{name('minimum')}, {name('initial')}, {name('maximum')}: got {self.minimum}, "
                f"{self.initial}, {self.maximum}; expected min <= initial <= max"
            )


class SageMakerHostingProps(Props):
    """Props of :class:`SageMakerHosting`."""

    image: TritonImage = Field(description="The Triton image (its image_uri resolves in the deployment region).")
    execution_role: Resource[iam.IRole] = Field(
        description="The role SageMaker assumes; it must read model_data_url and pull the image. The "
        "model is created after the role's policy."
    )
    model_data_url: Annotated[str, AfterValidator(_model_data_url)] = Field(
        description="The S3 prefix of the models (s3://bucket/prefix/); a request's TargetModel is a "
        "key relative to it."
    )
    endpoint_name: SageMakerName = Field(
        default="triton-mme",
        description="Fixed name of the SageMaker endpoint (at most 63 letters, digits and hyphens). "
        "The model and the endpoint config get names generated by CloudFormation, so that a change "
        "can replace them while the endpoint keeps its name.",
    )
    instance_type: InstanceType = Field(
        default="ml.g5.xlarge",
        description="Instance type of the endpoint's variant: one of the GPU types documented for "
        "multi-model endpoints (ml.g4dn.* and ml.g5.* xlarge to 16xlarge, ml.p2.xlarge, ml.p3.2xlarge).",
    )
    inference_ami_version: InferenceAmiVersion | None = Field(
        default=None,
        description="ProductionVariant.InferenceAmiVersion: the host image, whose NVIDIA driver must run the "
        "Triton image's CUDA. Unset: the newest AMI whose driver runs it on the instance type's GPU "
        "(model_build/gpu_hosts.py); a pair known not to work is refused, one nothing confirms is a "
        "synth warning. A change replaces the endpoint config (a blue/green of the fleet).",
    )
    fleet: FleetSize = Field(
        default_factory=lambda: FleetSize(), description="Instance counts; the variant starts with fleet.initial."
    )
    variant_name: SageMakerName = Field(default="AllTraffic", description="Name of the production variant.")
    model_cache_setting: ModelCacheSetting = Field(
        default="Enabled",
        description="MultiModelConfig.ModelCacheSetting: Enabled keeps loaded models on the instance; "
        "Disabled suits many models each invoked rarely.",
    )
    shm_default_byte_size: ByteSize = Field(
        default=SHM_DEFAULT_BYTE_SIZE,
        description="SAGEMAKER_TRITON_SHM_DEFAULT_BYTE_SIZE: initial shared memory of each "
        "python-backend model (no effect on pure ONNX models).",
    )
    shm_growth_byte_size: ByteSize = Field(
        default=SHM_GROWTH_BYTE_SIZE, description="SAGEMAKER_TRITON_SHM_GROWTH_BYTE_SIZE: growth step of that "
        "shared memory."
    )
    log_verbose: bool = Field(
        default=False,
        description="SAGEMAKER_TRITON_LOG_VERBOSE. Off by default: the container's own default "
        "(verbose) is noisy and costly in production.",
    )
    environment: Annotated[dict[str, str], AfterValidator(_environment)] = Field(
        default_factory=dict,
        description="Extra container variables, from the documented SAGEMAKER_TRITON_* list only. SHM "
        "and LOG_VERBOSE keys go through their own props; SAGEMAKER_TRITON_DEFAULT_MODEL_NAME is "
        "refused (single-model only); values at most 1024 characters.",
    )
    model_data_download_timeout: ContainerTimeout = Field(
        default_factory=lambda: Duration.seconds(600),
        description="ModelDataDownloadTimeoutInSeconds of the variant (60 to 3600 s).",
    )
    container_startup_health_check_timeout: ContainerTimeout = Field(
        default_factory=lambda: Duration.seconds(600),
        description="ContainerStartupHealthCheckTimeoutInSeconds of the variant (60 to 3600 s).",
    )
    volume_size_gb: int | None = Field(
        default=None,
        ge=VOLUME_SIZE_MIN_GB,
        le=VOLUME_SIZE_MAX_GB,
        description="ML storage volume in GB (1 to 512), for the EBS-backed ml.p2/ml.p3 types only "
        "(whose volume is then also encrypted with the bucket key); refused on instance-store "
        "g4dn/g5. Unset: SageMaker's default.",
    )
    volume_kms_key: Resource[kms.IKey] | None = Field(
        default=None,
        description="Key that encrypts the ML storage volume; EBS-backed types (p2, p3) only, an "
        "instance store is encrypted by the hardware. Unset: none.",
    )
    retain_all_variant_properties: bool = Field(
        default=True,
        description="When the endpoint is updated to a new config, keep the variant's instance count "
        "(set by autoscaling) instead of resetting it to fleet.initial.",
    )
    enable_network_isolation: bool = Field(
        default=True,
        description="EnableNetworkIsolation of the model: the Triton container can make no network "
        "call and gets no AWS credentials; SageMaker still downloads the models from S3 itself and "
        "hands Triton local files, so multi-model endpoints work with it.",
    )
    subnets: Sequence[Resource[ec2.ISubnet]] | None = Field(
        default=None,
        description="Place the model's network interfaces in these subnets (VpcConfig; 2 to 16, in at "
        "least two Availability Zones), with security_groups; the execution role then gets the EC2 "
        "network-interface actions SageMaker needs. Unset: no VPC.",
    )
    security_groups: Sequence[Resource[ec2.ISecurityGroup]] | None = Field(
        default=None, description="Security groups of those interfaces (1 to 5)."
    )

    def check(self, name: Namer) -> None:
        if known(self.volume_size_gb, self.instance_type) and has_instance_storage(self.instance_type):
            raise PropsError(
                f"{name('volume_size_gb')}: got {self.volume_size_gb} with {name('instance_type')} "
                f"{self.instance_type}; g4dn and g5 instances serve from their local instance store, "
                f"which has a fixed size: leave {name('volume_size_gb')} unset (only ml.p2.xlarge and "
                "ml.p3.2xlarge accept it)"
            )

    @model_validator(mode="after")
    def _volume_key(self) -> Self:
        if self.volume_kms_key is not None and known(self.instance_type) and has_instance_storage(self.instance_type):
            raise PropsError(
                f"volume_kms_key: given with instance_type {self.instance_type}; the instance store of "
                "g4dn and g5 instances is encrypted by the hardware and CreateEndpointConfig refuses a "
                "KmsKeyId for it (only p2/p3 accept one)"
            )
        return self

    @model_validator(mode="after")
    def _network(self) -> Self:
        subnets, groups = self.subnets, self.security_groups
        if bool(subnets) != bool(groups):
            raise PropsError(
                "subnets, security_groups: give both (the model's VpcConfig needs subnets and security "
                "groups) or neither"
            )
        if not subnets or not groups:
            return self
        for prop, count, low, high in (
            ("subnets", len(subnets), 2, VPC_SUBNETS_MAX),
            ("security_groups", len(groups), 1, VPC_SECURITY_GROUPS_MAX),
        ):
            if not low <= count <= high:
                raise PropsError(f"{prop}: got {count}; expected {low} to {high}")
        zones = [subnet.availability_zone for subnet in subnets]
        resolved = [zone for zone in zones if zone and not is_unresolved(zone)]
        if len(resolved) == len(zones) and len(set(resolved)) < 2:
            raise PropsError(
                f"subnets: all in {resolved[0]}; SageMaker needs subnets in at least two Availability "
                "Zones, even for one instance"
            )
        return self


class SageMakerHosting(EndpointMetrics, Construct):
    """A Triton multi-model endpoint: ``AWS::SageMaker::Model`` (``Mode: MultiModel``), its
    ``EndpointConfig`` (one production variant) and the ``Endpoint``.

    Names: only the endpoint has a fixed name. The model and the endpoint config get names
    generated by CloudFormation, because both are immutable in SageMaker: any change to them
    (image, environment, model data, instance type...) replaces them, and a replacement needs a
    new name. The endpoint keeps its name and is updated in place to the new config.

    Its ``metric_*`` methods (:class:`~constructs.endpoint_metrics.EndpointMetrics`) use the
    endpoint's name as given, so alarms on them can exist before the endpoint: a
    :class:`~constructs.rollout_policy.RolloutPolicy` makes the endpoint's ``DeploymentConfig``
    name them.
    """

    def __init__(self, scope: Construct, id: str, *, props: SageMakerHostingProps) -> None:
        super().__init__(scope, id)
        #: The container environment, sorted by key.
        self.environment: dict[str, str] = dict(
            sorted(
                {
                    SHM_DEFAULT_BYTE_SIZE_KEY: str(props.shm_default_byte_size),
                    SHM_GROWTH_BYTE_SIZE_KEY: str(props.shm_growth_byte_size),
                    LOG_VERBOSE_KEY: "true" if props.log_verbose else "false",
                    **props.environment,
                }.items()
            )
        )
        #: The Triton image and inference AMI of the fleet, checked together.
        self.host: FleetHost = resolve_host(
            load_image_table().versions, version=props.image.version, instance_type=props.instance_type,
            ami=props.inference_ami_version, name=lambda setting: _PROP_NAMES.get(setting, setting),
        )
        if self.host.verdict is None or self.host.verdict.status != "runs":
            why = self.host.verdict.reason if self.host.verdict else (
                f"Triton {self.host.image_version} is not in the CUDA table (model_build/gpu_hosts.py)")
            Annotations.of(self).add_warning_v2(
                "triton-mme:inference-ami-unverified",
                f"inference_ami_version {self.host.inference_ami_version} with Triton {self.host.image_version} on "
                f"{props.instance_type} is not confirmed to work: {why}. Check the endpoint's logs for "
                "'CUDA driver version is insufficient' after the first deploy.",
            )
        #: The inference AMI of the variant (given, or chosen for the image's CUDA).
        self.inference_ami_version: str = self.host.inference_ami_version
        self.model = self._model(props)
        #: The policy that lets SageMaker attach the model to the VPC (None without a VPC).
        self.vpc_access_policy = self._vpc_access(props)
        self.endpoint_config = self._endpoint_config(props)
        self.endpoint = sagemaker.CfnEndpoint(
            self,
            "Resource",
            endpoint_name=props.endpoint_name,
            endpoint_config_name=self.endpoint_config.attr_endpoint_config_name,
            retain_all_variant_properties=props.retain_all_variant_properties,
        )

        #: The endpoint's name (a reference to the endpoint resource).
        self.endpoint_name: str = self.endpoint.attr_endpoint_name
        #: The endpoint's name as given, for metric dimensions.
        self.metric_endpoint_name: str = props.endpoint_name
        #: The endpoint's ARN.
        self.endpoint_arn: str = self.endpoint.attr_endpoint_arn
        #: The production variant's name.
        self.variant_name: str = props.variant_name
        #: The instance type of the variant.
        self.instance_type: str = props.instance_type
        #: The variant's instance counts.
        self.fleet: FleetSize = props.fleet
        #: The role SageMaker assumes for the endpoint.
        self.execution_role: iam.IRole = props.execution_role
        #: Whether the model's container is network-isolated.
        self.network_isolation: bool = props.enable_network_isolation
        #: Name of the SageMaker model (generated by CloudFormation).
        self.model_name: str = self.model.attr_model_name
        #: Name of the endpoint config (generated by CloudFormation).
        self.endpoint_config_name: str = self.endpoint_config.attr_endpoint_config_name

    def _model(self, props: SageMakerHostingProps) -> sagemaker.CfnModel:
        subnets, groups = props.subnets, props.security_groups
        model = sagemaker.CfnModel(
            self,
            "Model",
            execution_role_arn=props.execution_role.role_arn,
            primary_container=sagemaker.CfnModel.ContainerDefinitionProperty(
                image=props.image.image_uri,
                mode="MultiModel",
                model_data_url=props.model_data_url,
                environment=self.environment,
                multi_model_config=sagemaker.CfnModel.MultiModelConfigProperty(
                    model_cache_setting=props.model_cache_setting
                ),
            ),
            enable_network_isolation=props.enable_network_isolation,
            vpc_config=(
                sagemaker.CfnModel.VpcConfigProperty(
                    subnets=[subnet.subnet_id for subnet in subnets],
                    security_group_ids=[group.security_group_id for group in groups],
                )
                if subnets and groups
                else None
            ),
        )
        if not props.enable_network_isolation:
            where = (
                "its network interfaces are in the given subnets, behind their security groups"
                if subnets and groups
                else "it is not placed in a VPC"
            )
            skip_checkov(
                model,
                ["CKV_AWS_370"],
                "Network isolation turned off on purpose (enable_network_isolation=false, "
                "mme:network_isolation): the deployer lets the Triton container make network calls "
                f"and get the execution role's credentials; {where}.",
            )
        return model

    def _vpc_access(self, props: SageMakerHostingProps) -> iam.Policy | None:
        if not props.subnets:
            return None
        policy = wildcard_policy(
            self,
            "VpcAccess",
            props.execution_role,
            SAGEMAKER_VPC_ACTIONS,
            "SageMaker creates and deletes the network interfaces of a model placed in a VPC; the EC2 "
            "describe actions have no resource-level permissions and the interfaces do not exist "
            "before SageMaker creates them (developer guide, host-vpc).",
            checkov=["CKV_AWS_109", "CKV_AWS_111"],
        )
        # SageMaker checks the permissions when it creates the model.
        self.model.node.add_dependency(policy)
        return policy

    def _endpoint_config(self, props: SageMakerHostingProps) -> sagemaker.CfnEndpointConfig:
        key = props.volume_kms_key
        config = sagemaker.CfnEndpointConfig(
            self,
            "EndpointConfig",
            production_variants=[
                sagemaker.CfnEndpointConfig.ProductionVariantProperty(
                    variant_name=props.variant_name,
                    model_name=self.model.attr_model_name,
                    instance_type=props.instance_type,
                    initial_instance_count=props.fleet.initial,
                    initial_variant_weight=1,
                    inference_ami_version=self.inference_ami_version,
                    volume_size_in_gb=props.volume_size_gb,
                    model_data_download_timeout_in_seconds=props.model_data_download_timeout.to_seconds(),
                    container_startup_health_check_timeout_in_seconds=(
                        props.container_startup_health_check_timeout.to_seconds()
                    ),
                )
            ],
            kms_key_id=key.key_arn if key else None,
        )
        if key is None and known(props.instance_type) and has_instance_storage(props.instance_type):
            acknowledge_in_packs(config, "SageMakerEndpointConfigurationKMSKeyConfigured", INSTANCE_STORE_KEY_REASON)
        if key is not None:
            # SageMaker creates a grant on the key for the instance's EBS volume.
            iam.Grant.add_to_principal(
                grantee=props.execution_role,
                actions=["kms:CreateGrant"],
                resource_arns=[key.key_arn],
                conditions={"Bool": {"kms:GrantIsForAWSResource": "true"}},
            )
        return config

    def grant_invoke(self, grantee: iam.IGrantable) -> iam.Grant:
        """Let ``grantee`` invoke the endpoint (``sagemaker:InvokeEndpoint`` on its ARN)."""
        return iam.Grant.add_to_principal(
            grantee=grantee, actions=["sagemaker:InvokeEndpoint"], resource_arns=[self.endpoint_arn]
        )
