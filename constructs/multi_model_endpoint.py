"""``TritonMultiModelEndpoint``: NVIDIA Triton models on one SageMaker multi-model GPU endpoint, with
the build that publishes them, as one construct for your own stack.

It composes the project's building blocks: the model bucket (yours or created), the execution role,
the Triton image, the build custom resource (with a manifest), the endpoint with its autoscaling,
the network (in your VPC or a created one), the alarms (to your topic or a created one), the
dashboard and the blue/green rollout policy. Everything that belongs to one endpoint is a keyword:
the resources as interfaces (``IBucket``, ``IKey``, ``IVpc``, ``ITopic``) and every setting of
docs/settings.md (a time a ``Duration``, a size a ``Size``, without the unit in the name). Each
child's props are given field by field: which setting reaches which child reads here.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Unpack

from aws_cdk import Annotations, Aws, CfnMapping, Fn, Stack
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_sns as sns

from constructs import Construct
from triton_mme_cdk.constructs.alarm_topic import AlarmTopic, AlarmTopicProps
from triton_mme_cdk.constructs.deployed_record import deployed_record
from triton_mme_cdk.constructs.endpoint_alarms import AlarmThresholds, EndpointAlarms, EndpointAlarmsProps
from triton_mme_cdk.constructs.endpoint_autoscaling import EndpointAutoscaling, EndpointAutoscalingProps
from triton_mme_cdk.constructs.endpoint_dashboard import EndpointDashboard, EndpointDashboardProps
from triton_mme_cdk.constructs.endpoint_import import (
    DEFAULT_VARIANT_NAME,
    EndpointAttributes,
    ImportedTritonMultiModelEndpoint,
    ITritonMultiModelEndpoint,
)
from triton_mme_cdk.constructs.endpoint_keywords import EndpointKeywords
from triton_mme_cdk.constructs.endpoint_network import EndpointNetwork, EndpointNetworkProps
from triton_mme_cdk.constructs.endpoint_settings import EndpointSettings, check_resources, endpoint_settings
from triton_mme_cdk.constructs.fleet_fit import annotate_fit, synth_fit
from triton_mme_cdk.constructs.model_bucket import ModelBucket, ModelBucketProps
from triton_mme_cdk.constructs.model_build_inputs import internet_sources, s3_source_keys
from triton_mme_cdk.constructs.model_build_resource import ModelBuildResource, ModelBuildResourceProps
from triton_mme_cdk.constructs.nag_acknowledgments import acknowledge_inline_policies
from triton_mme_cdk.constructs.props import BYTES, DAYS, GIBIBYTES, MEBIBYTES, MILLISECONDS
from triton_mme_cdk.constructs.rollout_policy import RolloutPolicy, RolloutPolicyProps
from triton_mme_cdk.constructs.sagemaker_execution_role import (
    SageMakerExecutionRole,
    SageMakerExecutionRoleProps,
)
from triton_mme_cdk.constructs.sagemaker_hosting import FleetSize, SageMakerHosting, SageMakerHostingProps
from triton_mme_cdk.constructs.sagemaker_limits import PropsError, has_instance_storage
from triton_mme_cdk.constructs.setting_table import REMOVAL_POLICY, principal_arns, whole
from triton_mme_cdk.constructs.triton_image import TritonImage, TritonImageProps
from triton_mme_cdk.model_build.artifact import tensorrt_engines
from triton_mme_cdk.model_build.errors import ManifestError
from triton_mme_cdk.model_build.manifest import Manifest, load_manifest
from triton_mme_cdk.model_build.release import PACKAGE_DIR, routes_key, served_prefix
from triton_mme_cdk.model_build.text_ensemble.container import namespacing_problem
from triton_mme_cdk.model_build.text_ensemble.serving_wheel import serving_python_problem
from triton_mme_cdk.model_build.text_ensemble.shm import shm_problem

#: A release id as ``triton-mme publish`` prints it (the construct's and the app's settings check).
RELEASE_ID_PATTERN = r"r-[0-9a-f]{16}"
#: The model build's Docker build context (``model_build/`` with its Dockerfile).
DEFAULT_BUILD_CONTEXT = PACKAGE_DIR
#: What the stack's roles do on the model bucket (the bucket's grants), allowed through a created
#: VPC's S3 gateway endpoint (tests/test_stack_least_privilege.py keeps the two the same).
MODEL_BUCKET_ENDPOINT_ACTIONS = (
    "s3:AbortMultipartUpload", "s3:DeleteObject", "s3:DeleteObjectVersion", "s3:GetBucketVersioning",
    "s3:GetObject", "s3:GetObjectTagging", "s3:ListBucket", "s3:ListBucketVersions", "s3:PutObject",
    "s3:PutObjectTagging",
)
#: Console domain by partition, for the dashboard URL.
CONSOLE_DOMAINS = {"aws": "console.aws.amazon.com", "aws-cn": "console.amazonaws.cn"}


@dataclass(frozen=True)
class ModelSource:
    """What an endpoint serves: a manifest built and published at deploy, or a release published
    out of band. Make one with :meth:`from_manifest` or :meth:`from_release`."""

    manifest: Manifest | None
    manifest_path: Path | None
    release_id: str | None
    #: A local copy of the release's index (``_index.json``), read at synth for the fit check.
    release_index: Path | None = None

    @classmethod
    def from_manifest(cls, path: str | Path) -> ModelSource:
        """Build the models of the manifest at ``path`` when the stack deploys, and serve them.

        The manifest is read and checked now (at synth): a missing file or a bad entry raises one
        error line. Its local model sources are paths relative to its folder."""
        manifest_path = Path(path)
        if not manifest_path.is_file():
            raise PropsError(f"models: ModelSource.from_manifest got {str(path)!r}; no such file (a models "
                             "manifest, docs/manifest.md)")
        try:
            manifest = load_manifest(manifest_path)
        except ManifestError as error:
            raise PropsError(f"models: {error}") from None
        return cls(manifest=manifest, manifest_path=manifest_path.resolve(), release_id=None)

    @classmethod
    def from_release(cls, release_id: str, index: str | Path | None = None) -> ModelSource:
        """Serve a release published out of band (``triton-mme publish`` prints its id): no build
        resource; the routes of that release must be in the bucket under the model prefix.
        ``index``: a local copy of its ``_index.json``, against whose footprints synth checks that
        the models fit the fleet (without it, synth warns that their fit is unknown)."""
        if not isinstance(release_id, str) or not re.fullmatch(RELEASE_ID_PATTERN, release_id):
            raise PropsError(f"models: ModelSource.from_release got {release_id!r}; expected a release id as "
                             "`triton-mme publish` prints it: 'r-' and 16 lowercase hex digits")
        return cls(manifest=None, manifest_path=None, release_id=release_id,
                   release_index=Path(index) if index is not None else None)


class TritonMultiModelEndpoint(ITritonMultiModelEndpoint, Construct):
    """NVIDIA Triton models on a SageMaker multi-model GPU endpoint, with the build that publishes them.

    - ``bucket``: the artifacts bucket. Yours (an ``IBucket``, with ``encryption_key`` unless it
      carries its key), or created: KMS, versioned, access-logged, TLS only. Its policy denies
      writes to what the fleet serves to every principal but the build and ``model_publishers``,
      and a PUT with other encryption than the key (docs/security.md, "Who can change what the
      fleet serves"); on a bucket of another stack, synth warns with the statements instead.
      ``replica_bucket`` (yours, versioned): the created buckets replicate into it.
    - With ``ModelSource.from_manifest``, a build custom resource builds the manifest's models at
      deploy, places each under an immutable content-named key in the fixed served prefix
      ``<model_prefix>/served/`` and routes the release (``<model_prefix>/_routes/routes.json``).
      The SageMaker Model's ``ModelDataUrl`` is that fixed prefix: nothing of SageMaker or its
      autoscaling reads what changes with the model set, so a model change never replaces the
      fleet. The endpoint waits for the first build only.
    - The execution role (reads the served prefix only), the Triton image (chosen for the fleet's
      GPU where ``triton_image_version`` is unset), the endpoint and its autoscaling on
      ``InvocationsPerInstance`` and ``GPUUtilization``.
    - ``vpc`` (yours, with ``vpc_subnets`` and ``security_groups`` optional), or ``create_vpc``: the
      model's network interfaces in private or isolated subnets. Unset: no VPC.
    - Alarms, to ``alarm_topic`` (yours) or else a created topic (unless ``alarm_topic_enabled``
      is false), with ``alarm_emails`` subscribed; a dashboard; the blue/green
      ``DeploymentConfig`` rolling back on the chosen alarms.
    - Every other keyword is a setting of docs/settings.md by its name without ``mme:``
      (``instance_type``, ``min_instance_count``, ``max_instance_count``, ``endpoint_name``,
      ``model_prefix``...), with the same default and check, a time a ``Duration`` and a size a ``Size``
      (``rollout_wait``, ``build_memory``): a refused value raises one ``PropsError`` line naming it.

    Clients: :meth:`grant_invoke` and :meth:`connect_client` (``ITritonMultiModelEndpoint``); a
    client stack elsewhere gets the same from :meth:`from_endpoint_attributes`.

    Two endpoints in one stack need their own ``endpoint_name`` (and, on one bucket, their own
    ``model_prefix``). Construct ids are stable: the stack of this project creates it with the id
    ``Default``, which keeps the logical ids of the stack it replaces.
    """

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        models: ModelSource,
        bucket: s3.IBucket | None = None,
        encryption_key: kms.IKey | None = None,
        replica_bucket: s3.IBucket | None = None,
        vpc: ec2.IVpc | None = None,
        vpc_subnets: ec2.SubnetSelection | None = None,
        security_groups: Sequence[ec2.ISecurityGroup] | None = None,
        alarm_topic: sns.ITopic | None = None,
        build_context: Path | None = None,
        **settings: Unpack[EndpointKeywords],
    ) -> None:
        if not isinstance(models, ModelSource):
            raise PropsError(f"models: got {type(models).__name__}; expected ModelSource.from_manifest(path) "
                             "or ModelSource.from_release(release_id)")
        options = endpoint_settings(settings, has_vpc=vpc is not None or bool(settings.get("create_vpc")))
        check_resources(options, vpc=vpc, vpc_subnets=vpc_subnets, security_groups=security_groups,
                        alarm_topic=alarm_topic, from_release=models.manifest is None)
        _check_free(scope, id, options, bucket)
        # Will the models fit this endpoint's fleet (GPU memory, disk): a refusal stops here.
        fit, fit_unknown = synth_fit(manifest=models.manifest, manifest_path=models.manifest_path,
                                     release_id=models.release_id, release_index=models.release_index, settings=options)
        super().__init__(scope, id)
        annotate_fit(self, fit, fit_unknown)
        #: The validated settings (``EndpointSettings``).
        self.settings = options
        #: What the endpoint serves.
        self.models = models
        #: The artifacts bucket and its key (``ModelBucket``: yours, or created), with its grants.
        self.model_bucket = ModelBucket(self, "ModelBucket", props=ModelBucketProps(
            noncurrent_version_expiration=options.noncurrent_version_expiration,
            retired_release_expiration=options.retired_release_expiration,
            access_log_expiration=options.access_log_expiration, publishers=principal_arns(options.model_publishers),
            removal_policy=REMOVAL_POLICY.values[options.bucket_removal_policy],
            bucket=bucket, encryption_key=encryption_key, replica=replica_bucket))
        #: The model's subnets and security groups (``EndpointNetwork``; None without a VPC).
        self.network = self._network(vpc, vpc_subnets, security_groups)
        role_grants = self._image_and_role(options)
        self._locations(options)
        #: The build custom resource (``ModelBuildResource``; None with ``ModelSource.from_release``).
        self.build: ModelBuildResource | None = None
        if models.manifest is not None and models.manifest_path is not None:
            self.build = self._build(models.manifest, models.manifest_path, build_context or DEFAULT_BUILD_CONTEXT)
            #: The release this deploy routes (from the manifest and the build code).
            self.release_id: str = self.build.release_id
        else:
            self.release_id = str(models.release_id)
        self._guard_bucket()
        self._allow_through_s3_gateway()
        self._serve(role_grants)
        #: The scalable target and its two tracking policies (``InvocationsPerInstance``, ``GPUUtilization``).
        self.autoscaling = EndpointAutoscaling(self, "Autoscaling", props=EndpointAutoscalingProps(
            endpoint=self.endpoint, invocations_per_instance_target=options.invocations_per_instance_target,
            invocations_scale_in_cooldown=options.invocations_scale_in_cooldown,
            invocations_scale_out_cooldown=options.invocations_scale_out_cooldown,
            gpu_utilization_target=options.gpu_utilization_target, gpu_scale_in_cooldown=options.gpu_scale_in_cooldown,
            gpu_scale_out_cooldown=options.gpu_scale_out_cooldown))
        self._operations(alarm_topic)
        # Each inline policy of the construct, by itself (the compliance packs' IAMNoInlinePolicy).
        acknowledge_inline_policies(self)

    @staticmethod
    def from_endpoint_attributes(scope: Construct, id: str, *, endpoint_name: str, bucket: s3.IBucket,
                                 model_prefix: str, encryption_key: kms.IKey | None = None,
                                 variant_name: str = DEFAULT_VARIANT_NAME) -> ITritonMultiModelEndpoint:
        """An endpoint deployed elsewhere (another stack or app), for its clients: ``grant_invoke``,
        ``connect_client``, ``routes_url`` and the ``metric_*`` methods. ``encryption_key``: the
        bucket's key (unset: the key the bucket carries; one of the two is required). Creates no
        resource; a refused value raises one ``PropsError`` line naming the keyword."""
        return ImportedTritonMultiModelEndpoint(scope, id, attributes=EndpointAttributes(
            endpoint_name=endpoint_name, bucket=bucket, model_prefix=model_prefix, encryption_key=encryption_key,
            variant_name=variant_name))

    # -----------------------------------------------------------------------------------------
    # What it exposes
    # -----------------------------------------------------------------------------------------

    @property
    def endpoint_name(self) -> str:
        """The endpoint's name (invoke it with ``TargetModel=<name>-<hash>.tar.gz``, the routes say which)."""
        return self.endpoint.endpoint_name

    @property
    def endpoint_arn(self) -> str:
        """The endpoint's ARN."""
        return self.endpoint.endpoint_arn

    @property
    def bucket(self) -> s3.IBucket:
        """The artifacts bucket (yours, or the created one)."""
        return self.model_bucket.bucket

    @property
    def encryption_key(self) -> kms.IKey:
        """The KMS key of the artifacts."""
        return self.model_bucket.key

    @property
    def dashboard_url(self) -> str:
        """The console link to the endpoint's CloudWatch dashboard (its console domain from the
        ``ConsoleDomains`` mapping by partition, which the construct always adds)."""
        return Fn.join("", [
            "https://", self._console_domains.find_in_map(Aws.PARTITION, "Domain"),
            "/cloudwatch/home?region=", Aws.REGION, "#dashboards:name=", self.dashboard.dashboard_name,
        ])

    # -----------------------------------------------------------------------------------------
    # Network, build, endpoint
    # -----------------------------------------------------------------------------------------

    def _image_and_role(self, options: EndpointSettings) -> list[iam.Grant]:
        """The Triton image and the role SageMaker hosts the endpoint with, and the role's grants
        (applied before the endpoint, which SageMaker checks them for)."""
        #: The Triton image and its region mapping (``TritonImage``).
        self.triton_image = TritonImage(self, "TritonImage", props=TritonImageProps(
            version=options.triton_image_version, instance_type=options.instance_type,
            inference_ami_version=options.inference_ami_version,
        ))
        note = options.fleet_host().note
        if note:  # an older image than the newest, for the fleet's GPU: synth says which and why
            Annotations.of(self.triton_image).add_info(note)
        #: The role SageMaker assumes to host the endpoint (reads the served prefix only).
        self.execution_role = SageMakerExecutionRole(
            self, "ExecutionRole", props=SageMakerExecutionRoleProps(endpoint_name=options.endpoint_name)
        )
        return [
            # SageMaker also encrypts the instance's volume with the key (a grant): no key policy deny.
            self.model_bucket.grant_read(self.execution_role, served_prefix(options.model_prefix),
                                         deny_direct_key_use=False),
            self.triton_image.grant_pull(self.execution_role),
        ]

    def _locations(self, options: EndpointSettings) -> None:
        """Where the fleet reads its models and clients the routes (no resource)."""
        #: The endpoint's fixed ``ModelDataUrl``: ``s3://<bucket>/<model_prefix>/served/``.
        self.model_data_url = self.model_bucket.s3_url(f"{served_prefix(options.model_prefix)}/")
        #: The bucket of the routes document (the artifacts bucket's name).
        self.routes_bucket_name = self.model_bucket.bucket_name
        #: The routes document's key: ``<model_prefix>/_routes/routes.json``.
        self.routes_key = routes_key(options.model_prefix)
        #: The routes document: each logical model name to its current ``TargetModel`` and signature
        #: (``TritonMmeClient``'s ``routes_url``).
        self.routes_url = self.model_bucket.s3_url(self.routes_key)

    def _serve(self, role_grants: list[iam.Grant]) -> None:
        """The Model, EndpointConfig and Endpoint, after the first build and the role's grants."""
        #: The SageMaker Model, EndpointConfig and Endpoint (``SageMakerHosting``).
        self.endpoint = self._endpoint()
        #: The endpoint's name as the ``metric_*`` dimensions name it (as given: alarms on them can
        #: exist before the endpoint).
        self.metric_endpoint_name = self.endpoint.metric_endpoint_name
        #: The endpoint's one production variant.
        self.variant_name = self.endpoint.variant_name
        if self.build is not None:
            # The first build finishes before the endpoint is created; later releases only change
            # the routes (a dependency orders the resources, it passes no value).
            self.endpoint.node.add_dependency(self.build)
        # SageMaker checks the role's access when it creates the model and the endpoint.
        for grant in role_grants:
            grant.apply_before(self.endpoint)

    def _network(self, vpc: ec2.IVpc | None, subnets: ec2.SubnetSelection | None,
                 security_groups: Sequence[ec2.ISecurityGroup] | None) -> EndpointNetwork | None:
        if vpc is None and not self.settings.create_vpc:
            return None
        # The created VPC's flow logs are encrypted with the bucket's key.
        options = self.settings
        return EndpointNetwork(self, "Network", props=EndpointNetworkProps(
            cidr=options.vpc_cidr, interface_endpoints=options.vpc_interface_endpoints,
            build_access=options.build_in_vpc, removal_policy=REMOVAL_POLICY.values[options.bucket_removal_policy],
            vpc=vpc, log_key=self.model_bucket.key, subnets=subnets,
            security_groups=list(security_groups) if security_groups is not None else None,
        ))

    def _build(self, manifest: Manifest, manifest_path: Path, build_context: Path) -> ModelBuildResource:
        options = self.settings
        # Raw-text targets: the tokenizer's largest request must fit the python backend's pool,
        # the ensembles' shared member names need Triton's model namespacing, and the tarball's
        # tokenizers wheel must load on the image's Python.
        image_version = self.triton_image.version
        has_text = any(spec.inputs == "text" for spec in manifest.models)
        shm_bytes = whole(BYTES.read(options.shm_default_size))
        for problem in (shm_problem(manifest, shm_bytes, options.name("shm_default_byte_size")),
                        namespacing_problem(manifest, options.triton_environment),
                        serving_python_problem(image_version) if has_text else None,
                        # Prebuilt TensorRT plans: one for the fleet's GPU, built with the image's TensorRT.
                        tensorrt_engines.tensorrt_plan_problem(manifest, instance_type=options.instance_type,
                                                               image_version=image_version)):
            if problem is not None:
                raise PropsError(problem)
        unchecked = tensorrt_engines.tensorrt_plan_unchecked(manifest, image_version=image_version)
        if unchecked is not None:
            Annotations.of(self).add_warning_v2("triton-mme:tensorrt-plan-unchecked", unchecked)
        network = self.network if options.build_in_vpc else None
        online = internet_sources(manifest)
        if network is not None and not network.build_has_internet and online:
            raise PropsError(
                f"{options.name('build_in_vpc')}: got true, but the build subnets have no route to the internet "
                f"and the manifest downloads {', '.join(online)} from the Hugging Face hub; use a VPC with a NAT "
                "gateway, publish those models out of band, or leave the build out of the VPC"
            )
        # The build's handlers in the VPC (build_in_vpc); a Processing build job in the endpoint's network.
        placed = network if network is not None and network.build_security_group is not None else None
        models = self.network
        build = ModelBuildResource(self, "ModelBuild", props=ModelBuildResourceProps(
            model_prefix=options.model_prefix, memory_size=whole(MEBIBYTES.read(options.build_memory)),
            ephemeral_storage_size=options.build_ephemeral_storage, timeout=options.build_timeout,
            total_timeout=options.build_total_timeout, query_interval=options.build_query_interval,
            max_concurrency=options.build_max_concurrency, runs_on=options.build_runs_on,
            processing_instance_type=options.build_processing_instance_type,
            processing_volume_gb=whole(GIBIBYTES.read(options.build_processing_volume)),
            processing_max_runtime=options.build_processing_max_runtime, on_delete=options.artifacts_on_delete,
            unrouted_retention_days=whole(DAYS.read(options.unrouted_retention)),
            manifest=manifest, manifest_path=manifest_path,
            deployed_record=deployed_record(self, {self.triton_image.mapping: self.triton_image.mapping_values}),
            model_bucket=self.model_bucket.encrypted_bucket, build_context=build_context,
            vpc=placed.vpc if placed else None, vpc_subnets=placed.build_subnets if placed else None,
            security_groups=[placed.build_security_group] if placed and placed.build_security_group else None,
            processing_network_isolation=options.network_isolation,
            processing_subnets=models.model_subnets if models else None,
            processing_security_groups=models.model_security_groups if models else None))
        # The build's roles on the model bucket (each its folders), and the jobs' folders kept a week.
        build.grant_on(self.model_bucket, options.model_prefix, destroy=options.artifacts_on_delete == "destroy")
        return build

    def _allow_through_s3_gateway(self) -> None:
        """A created VPC's S3 gateway endpoint reaches the model bucket, the build's manifest asset
        and the manifest's S3 sources (besides ECR's layer bucket, which the network allows)."""
        if self.network is None:
            return
        bucket = self.model_bucket.bucket
        self.network.allow_s3(MODEL_BUCKET_ENDPOINT_ACTIONS, [bucket.bucket_arn, bucket.arn_for_objects("*")])
        if self.build is None or self.models.manifest is None:
            return
        # Whole buckets, not the manifest's keys: a models-only change leaves the policy as it is
        # (the roles' IAM policies name the objects).
        self.network.allow_s3(["s3:GetObject"], [self.build.manifest_asset.bucket.arn_for_objects("*")])
        stack = Stack.of(self)
        sources = [stack.format_arn(service="s3", region="", account="", resource=name)
                   for name in sorted(s3_source_keys(self.models.manifest))]
        self.network.allow_s3(["s3:GetObject", "s3:ListBucket"], [*sources, *(f"{arn}/*" for arn in sources)])

    def _guard_bucket(self) -> None:
        """Only the build (and the named publishers) write what the fleet serves."""
        build = self.build
        self.model_bucket.guard(self.settings.model_prefix, place_roles=[build.role] if build else [],
                                build_roles=[build.build_role] if build else [],
                                job_roles=[build.processing.role] if build else [])
        if build is None and not self.settings.model_publishers:
            Annotations.of(self).add_warning_v2(
                "triton-mme:no-publishers",
                f"{self.settings.name('model_publishers')}: empty with a release published out of band; the bucket "
                "policy lets no one write the served folders, so the next `publish` is denied: name the role "
                "that publishes")

    def _endpoint(self) -> SageMakerHosting:
        network, options = self.network, self.settings
        return SageMakerHosting(self, "Endpoint", props=SageMakerHostingProps(
            endpoint_name=options.endpoint_name, instance_type=options.instance_type,
            inference_ami_version=options.inference_ami_version, fleet=self._fleet(),
            shm_default_byte_size=whole(BYTES.read(options.shm_default_size)),
            shm_growth_byte_size=whole(BYTES.read(options.shm_growth_size)), log_verbose=options.triton_log_verbose,
            environment=options.triton_environment, model_cache_setting=options.model_cache,
            model_data_download_timeout=options.model_data_download_timeout,
            container_startup_health_check_timeout=options.container_startup_health_check_timeout,
            volume_size_gb=None if options.volume_size is None else whole(GIBIBYTES.read(options.volume_size)),
            enable_network_isolation=options.network_isolation,
            image=self.triton_image,
            execution_role=self.execution_role.role,
            model_data_url=self.model_data_url,
            # EBS-backed types (p2/p3) take a KMS key for the volume; instance stores refuse one.
            volume_kms_key=None if has_instance_storage(options.instance_type) else self.model_bucket.key,
            subnets=network.model_subnets if network else None,
            security_groups=network.model_security_groups if network else None,
        ))

    def _fleet(self) -> FleetSize:
        options = self.settings
        return FleetSize(initial=options.initial_instance_count, minimum=options.min_instance_count,
                         maximum=options.max_instance_count)

    # -----------------------------------------------------------------------------------------
    # Operations: notifications, alarms, dashboard, safe rollouts
    # -----------------------------------------------------------------------------------------

    def _operations(self, alarm_topic: sns.ITopic | None) -> None:
        options = self.settings
        #: The created alarm topic (None when yours, or none, is notified).
        self.alarm_topic: AlarmTopic | None = None
        topic = alarm_topic
        if topic is None and options.alarm_topic_enabled is not False:
            self.alarm_topic = AlarmTopic(self, "AlarmTopic", props=AlarmTopicProps(
                emails=options.alarm_emails, removal_policy=REMOVAL_POLICY.values[options.bucket_removal_policy]))
            topic = self.alarm_topic.topic
        if topic is None:
            Annotations.of(self).add_warning_v2("triton-mme:alarms-without-action", (
                "alarm_topic_enabled: false without alarm_topic; the endpoint's alarms notify nothing, and the "
                "HIPAA.Security and NIST.800.53.R5 packs' CloudWatchAlarmAction reports each of them: give "
                "alarm_topic, or leave alarm_topic_enabled unset for a created topic"))
        #: The topic the alarms notify (yours, the created one, or None).
        self.notified_topic: sns.ITopic | None = topic
        #: The endpoint's alarms (``EndpointAlarms``: ``alarms`` by key, ``rollback_alarms``).
        self.alarms = EndpointAlarms(self, "Alarms", props=EndpointAlarmsProps(
            endpoint=self.endpoint, topic=topic, rollback_alarms=options.rollback_alarms, thresholds=AlarmThresholds(
                invocation_5xx_errors=options.alarm_5xx_errors_threshold,
                invocation_4xx_rate_percent=options.alarm_4xx_rate_percent,
                model_latency_p99_ms=whole(MILLISECONDS.read(options.alarm_latency_p99)),
                model_loading_wait_p90_ms=whole(MILLISECONDS.read(options.alarm_model_loading_wait_p90)),
                gpu_memory_percent=options.alarm_gpu_memory_percent, disk_percent=options.alarm_disk_percent,
                gpu_saturation_percent=options.alarm_gpu_saturation_percent)))
        #: The endpoint's CloudWatch dashboard.
        self.dashboard = EndpointDashboard(self, "Dashboard", props=EndpointDashboardProps(
            dashboard_name=options.dashboard_name, endpoint=self.endpoint, alarms=list(self.alarms.alarms.values())))
        #: The blue/green ``DeploymentConfig`` rolling back on ``rollback_alarms``.
        self.rollout = RolloutPolicy(props=RolloutPolicyProps(
            traffic=options.rollout_traffic, size_type=options.rollout_size_type, size=options.rollout_size,
            wait_interval=options.rollout_wait, termination_wait=options.rollout_termination_wait,
            maximum_execution_timeout=options.rollout_max_execution_timeout, fleet=self._fleet(),
            endpoint=self.endpoint, rollback_alarms=self.alarms.rollback_alarms))
        # The console domain of ``dashboard_url``, made here so that reading an attribute adds nothing.
        self._console_domains = CfnMapping(self, "ConsoleDomains", mapping={
            partition: {"Domain": domain} for partition, domain in CONSOLE_DOMAINS.items()
        })


def _check_free(scope: Construct, id: str, options: EndpointSettings, bucket: s3.IBucket | None) -> None:
    """Two endpoints of one stack may not share a name (the second would replace the first), nor
    a bucket and a model prefix (one routes document would serve both)."""
    path = f"{scope.node.path}/{id}"
    for other in Stack.of(scope).node.find_all():
        if not isinstance(other, TritonMultiModelEndpoint):
            continue
        if other.settings.endpoint_name == options.endpoint_name:
            raise PropsError(f"endpoint_name: got {options.endpoint_name!r} for {path}, but {other.node.path} in the "
                             "same stack has it; give each endpoint its own endpoint_name")
        if bucket is not None and other.model_bucket.bucket is bucket and \
                other.settings.model_prefix == options.model_prefix:
            raise PropsError(f"model_prefix: got {options.model_prefix!r} for {path}, but {other.node.path} serves "
                             "from the same bucket under it; give each endpoint its own model_prefix")
