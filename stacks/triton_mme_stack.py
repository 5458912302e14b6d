"""The stack: composes the constructs and wires their grants. It reads no settings from the context
itself (only CDK's lookup cache, through ``ec2.Vpc.from_lookup``, for an existing VPC)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from aws_cdk import Aws, CfnMapping, CfnOutput, Duration, Fn, RemovalPolicy, Size, Stack
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_iam as iam
from aws_cdk import aws_sns as sns

from constructs import Construct
from constructs.alarm_topic import AlarmTopic
from constructs.cost_tags import apply_cost_tags
from constructs.endpoint_alarms import AlarmThresholds, EndpointAlarms
from constructs.endpoint_autoscaling import EndpointAutoscaling
from constructs.endpoint_dashboard import EndpointDashboard
from constructs.endpoint_network import EndpointNetwork
from constructs.model_bucket import ModelBucket
from constructs.model_build_resource import ModelBuildResource, internet_sources
from constructs.sagemaker_execution_role import SageMakerExecutionRole
from constructs.sagemaker_limits import PropsError, has_instance_storage
from constructs.triton_image import TritonImage
from constructs.triton_mme_endpoint import TritonMmeEndpoint
from model_build.manifest import Manifest
from model_build.release import PACKAGE_DIR
from model_build.text_ensemble.shm import shm_problem
from stacks.settings import MmeSettings

#: The model build's Docker build context (``model_build/`` with its Dockerfile).
DEFAULT_BUILD_CONTEXT = PACKAGE_DIR
#: Console domain by partition, for the dashboard URL.
CONSOLE_DOMAINS = {"aws": "console.aws.amazon.com", "aws-cn": "console.amazonaws.cn"}


class TritonMmeStack(Stack):
    """NVIDIA Triton models on a SageMaker multi-model GPU endpoint, with the build that publishes
    them.

    - ``ModelBucket``: the artifacts bucket (KMS, versioning, access logs, lifecycle).
    - ``ModelBuild`` (when a manifest is given): builds the manifest's models and publishes them
      as an immutable release ``<model_prefix>/<release_id>/``; the SageMaker model points at it
      through ``Fn::GetAtt``, so a new release is in S3 before the endpoint switches to it.
      Without a manifest, the model points at ``settings.release_id``, published out of band.
    - ``ExecutionRole``, ``TritonImage``, ``Endpoint`` and ``Autoscaling``.
    - ``Network`` (when a VPC is asked for): the model's subnets and security group (and the
      build's), in an existing VPC or a created isolated one.
    - ``Alarms`` (and ``AlarmTopic`` when notifications are asked for), ``Dashboard``, and the
      endpoint's blue/green ``DeploymentConfig`` rolling back on the chosen alarms.
    - Cost-allocation tags (Project, Environment, Owner) on every taggable resource.

    :param settings: the validated settings.
    :param manifest: the models manifest, or None to serve ``settings.release_id``.
    :param manifest_path: the manifest's file (required with ``manifest``).
    :param build_context: Docker build context of the build image. Default: ``model_build/``.
    """

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        settings: MmeSettings,
        manifest: Manifest | None,
        manifest_path: Path | None,
        build_context: Path | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(scope, id, **kwargs)
        prefix = settings.model_prefix
        removal_policy = (
            RemovalPolicy.DESTROY if settings.bucket_removal_policy == "destroy" else RemovalPolicy.RETAIN
        )

        network: EndpointNetwork | None = None
        if settings.vpc_id is not None or settings.create_vpc:
            network = EndpointNetwork(
                self,
                "Network",
                vpc=(
                    ec2.Vpc.from_lookup(self, "ExistingVpc", vpc_id=settings.vpc_id)
                    if settings.vpc_id is not None
                    else None
                ),
                cidr=settings.vpc_cidr,
                interface_endpoints=settings.vpc_interface_endpoints,
                build_access=settings.build_in_vpc,
                removal_policy=removal_policy,
            )

        bucket = ModelBucket(
            self,
            "ModelBucket",
            noncurrent_version_expiration=Duration.days(settings.noncurrent_version_expiration_days),
            retired_release_expiration=Duration.days(settings.retired_release_expiration_days),
            access_log_expiration=Duration.days(settings.access_log_expiration_days),
            removal_policy=removal_policy,
        )
        image = TritonImage(self, "TritonImage", version=settings.triton_image_version)
        execution_role = SageMakerExecutionRole(
            self, "ExecutionRole", endpoint_name=settings.endpoint_name
        )
        role_grants: list[iam.Grant] = [
            bucket.grant_read(execution_role, prefix),
            image.grant_pull(execution_role),
        ]

        if manifest is not None:
            if manifest_path is None:
                raise PropsError("manifest_path: missing; the manifest file is uploaded as an asset")
            # Raw-text targets: the tokenizer's largest request must fit the python backend's pool.
            shm = shm_problem(manifest, settings.shm_default_byte_size)
            if shm is not None:
                raise PropsError(shm)
            build_network = network if settings.build_in_vpc else None
            if build_network is not None and not build_network.build_has_internet:
                online = internet_sources(manifest)
                if online:
                    raise PropsError(
                        "mme:build_in_vpc: got true, but the build subnets have no route to the "
                        f"internet and the manifest downloads {', '.join(online)} from the "
                        "Hugging Face hub; use an existing VPC with a NAT gateway (mme:vpc_id), "
                        "publish those models out of band, or leave the build out of the VPC"
                    )
            build = ModelBuildResource(
                self,
                "ModelBuild",
                manifest=manifest,
                manifest_path=manifest_path,
                model_bucket=bucket.bucket,
                model_prefix=prefix,
                build_context=build_context or DEFAULT_BUILD_CONTEXT,
                memory_size=settings.build_memory_mb,
                ephemeral_storage_size=Size.mebibytes(settings.build_ephemeral_storage_mb),
                timeout=Duration.minutes(settings.build_timeout_minutes),
                total_timeout=Duration.minutes(settings.build_total_timeout_minutes),
                query_interval=Duration.seconds(settings.build_query_interval_seconds),
                max_concurrency=settings.build_max_concurrency,
                on_delete=settings.artifacts_on_delete,
                vpc=build_network.vpc if build_network else None,
                vpc_subnets=build_network.build_subnets if build_network else None,
                security_groups=(
                    [build_network.build_security_group]
                    if build_network and build_network.build_security_group
                    else None
                ),
            )
            bucket.grant_read(build, prefix)
            bucket.grant_write(build, prefix)
            bucket.grant_tag(build, prefix)
            if settings.artifacts_on_delete == "destroy":
                bucket.grant_delete(build, prefix)
            model_data_url = build.model_data_url
            release_id = build.release_id
        else:
            if settings.release_id is None:
                raise PropsError(
                    "release_id: missing without a manifest; give the release to serve"
                )
            release_id = settings.release_id
            model_data_url = bucket.s3_url(f"{prefix}/{release_id}/")

        instance_store = has_instance_storage(settings.instance_type)
        endpoint = TritonMmeEndpoint(
            self,
            "Endpoint",
            image=image,
            execution_role=execution_role.role,
            model_data_url=model_data_url,
            endpoint_name=settings.endpoint_name,
            instance_type=settings.instance_type,
            initial_instance_count=settings.initial_instance_count,
            model_cache_setting=settings.model_cache,
            shm_default_byte_size=settings.shm_default_byte_size,
            shm_growth_byte_size=settings.shm_growth_byte_size,
            log_verbose=settings.triton_log_verbose,
            environment=settings.triton_environment,
            model_data_download_timeout=Duration.seconds(settings.model_data_download_timeout_seconds),
            container_startup_health_check_timeout=Duration.seconds(
                settings.container_startup_health_check_timeout_seconds
            ),
            volume_size_gb=settings.volume_size_gb,
            # EBS-backed types (p2/p3) take a KMS key for the volume; instance stores refuse one.
            volume_kms_key=None if instance_store else bucket.key,
            enable_network_isolation=settings.network_isolation,
            subnets=network.model_subnets if network else None,
            security_groups=[network.model_security_group] if network else None,
        )
        # SageMaker checks the role's access when it creates the model and the endpoint.
        for grant in role_grants:
            grant.apply_before(endpoint)

        EndpointAutoscaling(
            self,
            "Autoscaling",
            endpoint=endpoint,
            min_capacity=settings.min_instance_count,
            max_capacity=settings.max_instance_count,
            invocations_per_instance_target=settings.invocations_per_instance_target,
            invocations_scale_in_cooldown=Duration.seconds(settings.invocations_scale_in_cooldown_seconds),
            invocations_scale_out_cooldown=Duration.seconds(
                settings.invocations_scale_out_cooldown_seconds
            ),
            gpu_utilization_target=settings.gpu_utilization_target,
            gpu_scale_in_cooldown=Duration.seconds(settings.gpu_scale_in_cooldown_seconds),
            gpu_scale_out_cooldown=Duration.seconds(settings.gpu_scale_out_cooldown_seconds),
        )

        # -- Operations: notifications, alarms, dashboard, safe rollouts -----------------------
        topic: sns.ITopic | None = None
        alarm_topic: AlarmTopic | None = None
        if settings.alarm_topic_arn is not None:
            topic = sns.Topic.from_topic_arn(self, "ExistingAlarmTopic", settings.alarm_topic_arn)
        elif settings.alarm_topic_enabled or settings.alarm_emails:
            alarm_topic = AlarmTopic(
                self, "AlarmTopic", emails=settings.alarm_emails, removal_policy=removal_policy
            )
            topic = alarm_topic.topic
        alarms = EndpointAlarms(
            self,
            "Alarms",
            endpoint=endpoint,
            max_instance_count=settings.max_instance_count,
            thresholds=AlarmThresholds(
                invocation_5xx_errors=settings.alarm_5xx_errors_threshold,
                invocation_4xx_rate_percent=settings.alarm_4xx_rate_percent,
                model_latency_p99_ms=settings.alarm_latency_p99_ms,
                model_loading_wait_p90_ms=settings.alarm_model_loading_wait_p90_ms,
                gpu_memory_percent=settings.alarm_gpu_memory_percent,
                disk_percent=settings.alarm_disk_percent,
                gpu_saturation_percent=settings.alarm_gpu_saturation_percent,
            ),
            topic=topic,
        )
        dashboard_name = settings.dashboard_name or f"{settings.endpoint_name}-{Aws.REGION}"
        dashboard = EndpointDashboard(
            self,
            "Dashboard",
            endpoint=endpoint,
            dashboard_name=dashboard_name,
            max_instance_count=settings.max_instance_count,
            alarms=list(alarms.alarms.values()),
        )
        endpoint.configure_deployment(
            traffic=settings.rollout_traffic,
            size_type=settings.rollout_size_type if settings.rollout_traffic != "ALL_AT_ONCE" else None,
            size=settings.rollout_size,
            wait_interval=Duration.seconds(settings.rollout_wait_seconds),
            termination_wait=Duration.seconds(settings.rollout_termination_wait_seconds),
            maximum_execution_timeout=(
                Duration.seconds(settings.rollout_max_execution_timeout_seconds)
                if settings.rollout_max_execution_timeout_seconds is not None
                else None
            ),
            rollback_alarms=alarms.select(settings.rollback_alarms),
            min_instances=settings.min_instance_count,
            max_instances=settings.max_instance_count,
        )

        apply_cost_tags(
            self,
            {
                "Project": settings.tag_project,
                "Environment": settings.tag_environment,
                "Owner": settings.tag_owner,
            },
        )

        CfnOutput(
            self,
            "EndpointName",
            value=endpoint.endpoint_name,
            description="SageMaker endpoint to invoke, with TargetModel=<model>.tar.gz",
        )
        CfnOutput(self, "EndpointArn", value=endpoint.endpoint_arn, description="ARN of the endpoint")
        CfnOutput(
            self,
            "ModelBucketName",
            value=bucket.bucket_name,
            description="S3 bucket of the model artifacts (KMS-encrypted, versioned)",
        )
        CfnOutput(
            self,
            "ModelDataUrl",
            value=model_data_url,
            description="S3 prefix of the release the endpoint serves (the model's ModelDataUrl)",
        )
        CfnOutput(
            self,
            "ReleaseId",
            value=release_id,
            description="Release served by the endpoint (derived from the manifest and build code)",
        )
        CfnOutput(
            self,
            "ExecutionRoleArn",
            value=execution_role.role_arn,
            description="Role SageMaker assumes to host the endpoint (reads the model prefix only)",
        )
        CfnOutput(
            self,
            "DashboardName",
            value=dashboard.dashboard_name,
            description="CloudWatch dashboard of the endpoint (requests, latency, instances, models, GPU)",
        )
        consoles = CfnMapping(self, "ConsoleDomains", mapping={
            partition: {"Domain": domain} for partition, domain in CONSOLE_DOMAINS.items()
        })
        CfnOutput(
            self,
            "DashboardUrl",
            value=Fn.join("", [
                "https://", consoles.find_in_map(Aws.PARTITION, "Domain"),
                "/cloudwatch/home?region=", Aws.REGION, "#dashboards:name=", dashboard.dashboard_name,
            ]),
            description="Console link to the endpoint's CloudWatch dashboard",
        )
        if alarm_topic is not None:
            CfnOutput(
                self,
                "AlarmTopicArn",
                value=alarm_topic.topic_arn,
                description="SNS topic the endpoint's alarms notify (KMS-encrypted, TLS only); "
                "subscribe to it",
            )
        if network is not None:
            CfnOutput(
                self, "VpcId", value=network.vpc.vpc_id, description="VPC of the endpoint's model"
            )
            CfnOutput(
                self,
                "ModelSecurityGroupId",
                value=network.model_security_group.security_group_id,
                description="Security group of the model's network interfaces (no inbound rule)",
            )

        #: The constructs, for tests and extensions.
        self.model_bucket = bucket
        self.triton_image = image
        self.execution_role = execution_role
        self.endpoint = endpoint
        self.network = network
        self.alarms = alarms
        self.alarm_topic = alarm_topic
        self.dashboard = dashboard
