"""The stack: composes the constructs and wires their grants. It reads no context itself."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from aws_cdk import CfnOutput, Duration, RemovalPolicy, Size, Stack
from aws_cdk import aws_iam as iam

from constructs import Construct
from constructs.endpoint_autoscaling import EndpointAutoscaling
from constructs.model_bucket import ModelBucket
from constructs.model_build_resource import ModelBuildResource
from constructs.sagemaker_execution_role import SageMakerExecutionRole
from constructs.sagemaker_limits import PropsError, has_instance_storage
from constructs.triton_image import TritonImage
from constructs.triton_mme_endpoint import TritonMmeEndpoint
from model_build.manifest import Manifest
from model_build.release import PACKAGE_DIR
from stacks.settings import MmeSettings

#: The model build's Docker build context (``model_build/`` with its Dockerfile).
DEFAULT_BUILD_CONTEXT = PACKAGE_DIR


class TritonMmeStack(Stack):
    """NVIDIA Triton models on a SageMaker multi-model GPU endpoint, with the build that publishes
    them.

    - ``ModelBucket``: the artifacts bucket (KMS, versioning, access logs, lifecycle).
    - ``ModelBuild`` (when a manifest is given): builds the manifest's models and publishes them
      as an immutable release ``<model_prefix>/<release_id>/``; the SageMaker model points at it
      through ``Fn::GetAtt``, so a new release is in S3 before the endpoint switches to it.
      Without a manifest, the model points at ``settings.release_id``, published out of band.
    - ``ExecutionRole``, ``TritonImage``, ``Endpoint`` and ``Autoscaling``.

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

        bucket = ModelBucket(
            self,
            "ModelBucket",
            noncurrent_version_expiration=Duration.days(settings.noncurrent_version_expiration_days),
            retired_release_expiration=Duration.days(settings.retired_release_expiration_days),
            access_log_expiration=Duration.days(settings.access_log_expiration_days),
            removal_policy=(
                RemovalPolicy.DESTROY
                if settings.bucket_removal_policy == "destroy"
                else RemovalPolicy.RETAIN
            ),
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
                on_delete=settings.artifacts_on_delete,
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

        #: The constructs, for tests and extensions.
        self.model_bucket = bucket
        self.triton_image = image
        self.execution_role = execution_role
        self.endpoint = endpoint
