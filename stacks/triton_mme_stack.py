"""The stack: composes the constructs from their props and wires their grants. It reads no settings
from the context itself (only CDK's lookup cache, through ``ec2.Vpc.from_lookup``, for an existing
VPC)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from aws_cdk import Annotations, Aws, CfnMapping, CfnOutput, Duration, Fn, Stack
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_sns as sns

from constructs import Construct
from triton_mme_cdk.constructs.alarm_topic import AlarmTopic, AlarmTopicProps
from triton_mme_cdk.constructs.cost_tags import apply_cost_tags
from triton_mme_cdk.constructs.deployed_record import deployed_record
from triton_mme_cdk.constructs.endpoint_alarms import EndpointAlarms, EndpointAlarmsProps
from triton_mme_cdk.constructs.endpoint_autoscaling import EndpointAutoscaling, EndpointAutoscalingProps
from triton_mme_cdk.constructs.endpoint_dashboard import EndpointDashboard, EndpointDashboardProps
from triton_mme_cdk.constructs.endpoint_network import EndpointNetwork, EndpointNetworkProps
from triton_mme_cdk.constructs.model_bucket import ModelBucket, ModelBucketProps
from triton_mme_cdk.constructs.model_build_inputs import internet_sources
from triton_mme_cdk.constructs.model_build_resource import ModelBuildResource, ModelBuildResourceProps
from triton_mme_cdk.constructs.rollout_policy import RolloutPolicy, RolloutPolicyProps
from triton_mme_cdk.constructs.sagemaker_execution_role import (
    SageMakerExecutionRole,
    SageMakerExecutionRoleProps,
)
from triton_mme_cdk.constructs.sagemaker_limits import PropsError, has_instance_storage
from triton_mme_cdk.constructs.triton_image import TritonImage, TritonImageProps
from triton_mme_cdk.constructs.triton_mme_endpoint import TritonMmeEndpoint, TritonMmeEndpointProps
from triton_mme_cdk.model_build.manifest import Manifest
from triton_mme_cdk.model_build.package.tensorrt_plans import tensorrt_plan_problem, tensorrt_plan_unchecked
from triton_mme_cdk.model_build.release import PACKAGE_DIR, routes_key, served_prefix
from triton_mme_cdk.model_build.release.identity import JOBS_DIR
from triton_mme_cdk.model_build.text_ensemble.container import namespacing_problem
from triton_mme_cdk.model_build.text_ensemble.serving_wheel import serving_python_problem
from triton_mme_cdk.model_build.text_ensemble.shm import shm_problem
from triton_mme_cdk.stacks.settings import MmeSettings

#: Days a Processing build job's input and output folder is kept.
JOB_FOLDER_DAYS = 7
#: The model build's Docker build context (``model_build/`` with its Dockerfile).
DEFAULT_BUILD_CONTEXT = PACKAGE_DIR
#: Console domain by partition, for the dashboard URL.
CONSOLE_DOMAINS = {"aws": "console.aws.amazon.com", "aws-cn": "console.amazonaws.cn"}


class TritonMmeStack(Stack):
    """NVIDIA Triton models on a SageMaker multi-model GPU endpoint, with the build that publishes
    them.

    - ``ModelBucket``: the artifacts bucket (KMS, versioning, access logs, lifecycle).
    - ``ModelBuild`` (when a manifest is given): builds the manifest's models, places each under
      an immutable content-named key in the fixed served prefix ``<model_prefix>/served/`` and
      routes the release (``<model_prefix>/_routes/routes.json``). The SageMaker Model's
      ``ModelDataUrl`` is that fixed prefix, from the settings: no SageMaker or autoscaling
      resource reads anything that changes with the model set, so adding, changing or removing a
      model never replaces the fleet. The endpoint depends on the build only so that it waits for
      the first one at creation. Without a manifest, the routes are published out of band.
    - ``ExecutionRole``, ``TritonImage``, ``Endpoint`` and ``Autoscaling``.
    - ``Network`` (when a VPC is asked for): the model's subnets and security group (and the
      build's), in an existing VPC or a created isolated one.
    - ``Alarms`` (and ``AlarmTopic`` when notifications are asked for), ``Dashboard``, and the
      endpoint's blue/green ``DeploymentConfig`` rolling back on the chosen alarms (a
      ``RolloutPolicy`` built from the endpoint and the alarms).
    - Cost-allocation tags (Project, Environment, Owner) on every taggable resource.

    Each construct gets its props from ``settings.values(<props class>)`` plus the resources the
    stack wires in; the constructs are created in this order, which fixes the template's.

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
        self._settings = settings
        #: The settings, the manifest and its file the stack was built from (for the synth's plan line).
        self.settings = settings
        self.manifest = manifest
        self.manifest_path = manifest_path
        #: The constructs, for tests and extensions.
        self.model_bucket = ModelBucket(self, "ModelBucket", props=ModelBucketProps(**settings.values(ModelBucketProps)))
        self.network = self._network()
        self.triton_image = TritonImage(self, "TritonImage", props=TritonImageProps(
            **settings.values(TritonImageProps), instance_type=settings.instance_type,
            inference_ami_version=settings.inference_ami_version,
        ))
        note = settings.fleet_host().note
        if note:  # an older image than the newest, for the fleet's GPU: synth says which and why
            Annotations.of(self.triton_image).add_info(note)
        self.execution_role = SageMakerExecutionRole(
            self, "ExecutionRole", props=SageMakerExecutionRoleProps(endpoint_name=settings.endpoint_name)
        )
        served = served_prefix(settings.model_prefix)
        role_grants = [
            self.model_bucket.grant_read(self.execution_role, served),
            self.triton_image.grant_pull(self.execution_role),
        ]
        #: The endpoint's fixed ``ModelDataUrl`` (the served prefix) and the routes document's URL.
        self.model_data_url = self.model_bucket.s3_url(f"{served}/")
        self.routes_url = self.model_bucket.s3_url(routes_key(settings.model_prefix))
        build: ModelBuildResource | None = None
        if manifest is not None:
            build = self._build(manifest, manifest_path, build_context or DEFAULT_BUILD_CONTEXT)
            release_id = build.release_id
        else:
            release_id = self._release_id()
        self.endpoint = self._endpoint(self.model_data_url)
        if build is not None:
            # The first build finishes before the endpoint is created; later releases only change
            # the routes (a dependency orders the resources, it passes no value).
            self.endpoint.node.add_dependency(build)
        # SageMaker checks the role's access when it creates the model and the endpoint.
        for grant in role_grants:
            grant.apply_before(self.endpoint)
        EndpointAutoscaling(
            self,
            "Autoscaling",
            props=EndpointAutoscalingProps(**settings.values(EndpointAutoscalingProps), endpoint=self.endpoint),
        )
        self._operations()
        apply_cost_tags(
            self, {"Project": settings.tag_project, "Environment": settings.tag_environment, "Owner": settings.tag_owner}
        )
        self._outputs(self.model_data_url, release_id)

    # -----------------------------------------------------------------------------------------
    # Network, release, endpoint
    # -----------------------------------------------------------------------------------------

    def _network(self) -> EndpointNetwork | None:
        settings = self._settings
        if settings.vpc_id is None and not settings.create_vpc:
            return None
        vpc = ec2.Vpc.from_lookup(self, "ExistingVpc", vpc_id=settings.vpc_id) if settings.vpc_id is not None else None
        # The created VPC's flow logs are encrypted with the stack's customer key (the bucket's).
        return EndpointNetwork(self, "Network", props=EndpointNetworkProps(
            **settings.values(EndpointNetworkProps), vpc=vpc, log_key=self.model_bucket.key
        ))

    def _release_id(self) -> str:
        if self._settings.release_id is None:
            raise PropsError("release_id: missing without a manifest; give the release to serve")
        return self._settings.release_id

    def _build(self, manifest: Manifest, manifest_path: Path | None, build_context: Path) -> ModelBuildResource:
        settings = self._settings
        if manifest_path is None:
            raise PropsError("manifest_path: missing; the manifest file is uploaded as an asset")
        # Raw-text targets: the tokenizer's largest request must fit the python backend's pool,
        # the ensembles' shared member names need Triton's model namespacing, and the tarball's
        # tokenizers wheel must load on the image's Python.
        image_version = self.triton_image.version
        has_text = any(spec.inputs == "text" for spec in manifest.models)
        for problem in (shm_problem(manifest, settings.shm_default_byte_size),
                        namespacing_problem(manifest, settings.triton_environment),
                        serving_python_problem(image_version) if has_text else None,
                        # Prebuilt TensorRT plans: one for the fleet's GPU, built with the image's TensorRT.
                        tensorrt_plan_problem(manifest, instance_type=settings.instance_type,
                                              image_version=image_version)):
            if problem is not None:
                raise PropsError(problem)
        unchecked = tensorrt_plan_unchecked(manifest, image_version=image_version)
        if unchecked is not None:
            Annotations.of(self).add_warning_v2("triton-mme:tensorrt-plan-unchecked", unchecked)
        network = self.network if settings.build_in_vpc else None
        online = internet_sources(manifest)
        if network is not None and not network.build_has_internet and online:
            raise PropsError(
                "mme:build_in_vpc: got true, but the build subnets have no route to the internet and the "
                f"manifest downloads {', '.join(online)} from the Hugging Face hub; use "
                "an existing VPC with a NAT gateway (mme:vpc_id), publish those models out of band, or "
                "leave the build out of the VPC"
            )
        in_vpc: dict[str, Any] = {}
        if network is not None and network.build_security_group is not None:
            in_vpc = {"vpc": network.vpc, "vpc_subnets": network.build_subnets,
                      "security_groups": [network.build_security_group]}
        # A Processing build job gets the endpoint's network: its isolation, subnets and group.
        endpoint_network: dict[str, Any] = {
            "processing_network_isolation": settings.values(TritonMmeEndpointProps)["enable_network_isolation"]}
        if self.network is not None:
            endpoint_network.update(processing_subnets=self.network.model_subnets,
                                    processing_security_groups=[self.network.model_security_group])
        build = ModelBuildResource(self, "ModelBuild", props=ModelBuildResourceProps(
            **settings.values(ModelBuildResourceProps), manifest=manifest, manifest_path=manifest_path,
            deployed_record=deployed_record(self, {self.triton_image.mapping: self.triton_image.mapping_values}),
            model_bucket=self.model_bucket.bucket, build_context=build_context, **in_vpc, **endpoint_network,
        ))
        prefix = settings.model_prefix
        # A Processing job reads its input and writes its unit under <prefix>/_jobs/ only.
        jobs = f"{prefix}/{JOBS_DIR}" if prefix else JOBS_DIR
        self.model_bucket.grant_read(build.processing.role, jobs)
        self.model_bucket.grant_write(build.processing.role, jobs)
        # A job's folder matters while its build runs (and for a look after a failure): a week.
        self.model_bucket.expire("ExpireBuildJobFolders", jobs, Duration.days(JOB_FOLDER_DAYS))
        self.model_bucket.grant_read(build, prefix)
        self.model_bucket.grant_write(build, prefix)
        self.model_bucket.grant_tag(build, prefix)
        # Unrouted served objects are deleted after the retention window; destroy removes more.
        self.model_bucket.grant_delete(build, prefix if settings.artifacts_on_delete == "destroy" else served_prefix(prefix))
        return build

    def _endpoint(self, model_data_url: str) -> TritonMmeEndpoint:
        network, values = self.network, self._settings.values(TritonMmeEndpointProps)
        return TritonMmeEndpoint(self, "Endpoint", props=TritonMmeEndpointProps(
            **values,
            image=self.triton_image,
            execution_role=self.execution_role.role,
            model_data_url=model_data_url,
            # EBS-backed types (p2/p3) take a KMS key for the volume; instance stores refuse one.
            volume_kms_key=None if has_instance_storage(values["instance_type"]) else self.model_bucket.key,
            subnets=network.model_subnets if network else None,
            security_groups=[network.model_security_group] if network else None,
        ))

    # -----------------------------------------------------------------------------------------
    # Operations: notifications, alarms, dashboard, safe rollouts
    # -----------------------------------------------------------------------------------------

    def _operations(self) -> None:
        settings = self._settings
        topic = self._alarm_topic()
        self.alarms = EndpointAlarms(
            self, "Alarms", props=EndpointAlarmsProps(**settings.values(EndpointAlarmsProps), endpoint=self.endpoint,
                                                      topic=topic)
        )
        self.dashboard = EndpointDashboard(self, "Dashboard", props=EndpointDashboardProps(
            **settings.values(EndpointDashboardProps), endpoint=self.endpoint, alarms=list(self.alarms.alarms.values())
        ))
        self.rollout = RolloutPolicy(props=RolloutPolicyProps(
            **settings.values(RolloutPolicyProps), endpoint=self.endpoint, rollback_alarms=self.alarms.rollback_alarms
        ))

    def _alarm_topic(self) -> sns.ITopic | None:
        settings = self._settings
        #: The created alarm topic (None when an existing one, or none, is notified).
        self.alarm_topic: AlarmTopic | None = None
        if settings.alarm_topic_arn is not None:
            return sns.Topic.from_topic_arn(self, "ExistingAlarmTopic", settings.alarm_topic_arn)
        if settings.alarm_topic_enabled or settings.alarm_emails:
            self.alarm_topic = AlarmTopic(self, "AlarmTopic", props=AlarmTopicProps(**settings.values(AlarmTopicProps)))
            return self.alarm_topic.topic
        return None

    # -----------------------------------------------------------------------------------------
    # Outputs
    # -----------------------------------------------------------------------------------------

    def _outputs(self, model_data_url: str, release_id: str) -> None:
        outputs: list[tuple[str, str, str]] = [
            ("EndpointName", self.endpoint.endpoint_name, "SageMaker endpoint to invoke, with TargetModel=<model>.tar.gz"),
            ("EndpointArn", self.endpoint.endpoint_arn, "ARN of the endpoint"),
            ("ModelBucketName", self.model_bucket.bucket_name,
             "S3 bucket of the model artifacts (KMS-encrypted, versioned)"),
            ("ModelDataUrl", model_data_url,
             "S3 prefix the endpoint serves (the model's ModelDataUrl; fixed for the life of the stack)"),
            ("RoutesUrl", self.routes_url,
             "Routes document: each logical model name to its current TargetModel, with the release id"),
            ("ReleaseId", release_id, "Release routed by this deploy (derived from the manifest and build code)"),
            ("ExecutionRoleArn", self.execution_role.role_arn,
             "Role SageMaker assumes to host the endpoint (reads the model prefix only)"),
            ("DashboardName", self.dashboard.dashboard_name,
             "CloudWatch dashboard of the endpoint (requests, latency, instances, models, GPU)"),
            ("DashboardUrl", self._dashboard_url(), "Console link to the endpoint's CloudWatch dashboard"),
        ]
        if self.alarm_topic is not None:
            outputs.append(("AlarmTopicArn", self.alarm_topic.topic_arn,
                            "SNS topic the endpoint's alarms notify (KMS-encrypted, TLS only); subscribe to it"))
        if self.network is not None:
            outputs.append(("VpcId", self.network.vpc.vpc_id, "VPC of the endpoint's model"))
            outputs.append(("ModelSecurityGroupId", self.network.model_security_group.security_group_id,
                            "Security group of the model's network interfaces (no inbound rule)"))
        for output_id, value, description in outputs:
            CfnOutput(self, output_id, value=value, description=description)

    def _dashboard_url(self) -> str:
        consoles = CfnMapping(self, "ConsoleDomains", mapping={
            partition: {"Domain": domain} for partition, domain in CONSOLE_DOMAINS.items()
        })
        return Fn.join("", [
            "https://", consoles.find_in_map(Aws.PARTITION, "Domain"),
            "/cloudwatch/home?region=", Aws.REGION, "#dashboards:name=", self.dashboard.dashboard_name,
        ])
