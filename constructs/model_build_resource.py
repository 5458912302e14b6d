"""The custom resource that builds a manifest's models and publishes them as one S3 release."""

from __future__ import annotations

from typing import Any

import jsii
from aws_cdk import (
    Annotations,
    Aws,
    CustomResource,
    Duration,
    Fn,
    IgnoreMode,
    RemovalPolicy,
    Stack,
    SymlinkFollowMode,
)
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_ecr_assets as ecr_assets
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from aws_cdk import aws_s3_assets as s3_assets
from aws_cdk import aws_stepfunctions as sfn
from aws_cdk import custom_resources as cr

from constructs import Construct
from triton_mme_cdk.constructs.bucket_guard import BUILD_FOLDERS, PLACED_FOLDERS
from triton_mme_cdk.constructs.cfn_hygiene import drop_referenced_dependencies
from triton_mme_cdk.constructs.customer_key import logs_key
from triton_mme_cdk.constructs.model_bucket import RETIRED_TAG_KEY, ModelBucket
from triton_mme_cdk.constructs.model_build_inputs import runtime_only_exclude, s3_source_keys
from triton_mme_cdk.constructs.model_build_props import ModelBuildResourceProps
from triton_mme_cdk.constructs.model_build_state_machine import (
    ModelBuildStateMachine,
    ModelBuildStateMachineProps,
)
from triton_mme_cdk.constructs.nag_acknowledgments import (
    acknowledge_wildcard_resource,
    skip_checkov,
    wildcard_policy,
)
from triton_mme_cdk.constructs.processing_build import ProcessingBuild, ProcessingBuildProps
from triton_mme_cdk.constructs.provider_framework import (
    CLOUDFORMATION_MAX_WAIT,
    NO_KEY_REASON,
    OUTSIDE_VPC_REASON,
    tidy_framework,
)
from triton_mme_cdk.model_build.manifest import Manifest
from triton_mme_cdk.model_build.manifest.build_engine import place_all
from triton_mme_cdk.model_build.release import Release, build_code_sha256, compute_release, served_prefix
from triton_mme_cdk.model_build.release.identity import JOBS_DIR, PLANS_DIR

RESOURCE_TYPE = "Custom::TritonModelRelease"
ON_EVENT_HANDLER = "triton_mme_cdk.model_build.handler.on_event"
IS_COMPLETE_HANDLER = "triton_mme_cdk.model_build.handler.is_complete"
BUILD_STEP_HANDLER = "triton_mme_cdk.model_build.handler.build_step"
PLACE_STEP_HANDLER = "triton_mme_cdk.model_build.handler.place_step"
#: Days a Processing build job's input and output folder is kept.
JOB_FOLDER_DAYS = 7
#: Why the checkov function checks do not apply to the placing function (the Finish task's).
PLACE_CONCURRENCY_REASON = (
    "Invoked once per build execution, by the build state machine's Finish task; a reserved concurrency "
    "would withhold capacity from the account's other functions at all times and protect nothing."
)
PLACE_INVOCATION_REASON = (
    "Invoked synchronously by the build state machine's Finish task (retried on throttling and service "
    "errors); an error fails the execution, which the custom resource reports; there is no asynchronous "
    "event that a dead-letter queue could keep."
)
#: What Lambda needs to run a function in a VPC (the actions of the AWS managed policy
#: AWSLambdaVPCAccessExecutionRole, which CDK attaches only to roles it creates itself).
LAMBDA_VPC_ACTIONS: tuple[str, ...] = (
    "ec2:AssignPrivateIpAddresses",
    "ec2:CreateNetworkInterface",
    "ec2:DeleteNetworkInterface",
    "ec2:DescribeNetworkInterfaces",
    "ec2:DescribeSubnets",
    "ec2:UnassignPrivateIpAddresses",
)


@jsii.implements(iam.IGrantable)
class ModelBuildResource(Construct):
    """Builds the models of a manifest, places them in the fixed served prefix under immutable
    content-named keys (``<model_prefix>/served/<model>-<sha12>.tar.gz``) and routes the release
    (``<model_prefix>/_routes/routes.json``).

    A ``Custom::TritonModelRelease`` resource served by container-image Lambda functions
    (``model_build.handler.on_event`` and ``model_build.handler.is_complete``, all from the
    image built from ``build_context``'s Dockerfile) through the CDK Provider framework's
    asynchronous pattern: ``on_event`` starts the build state machine
    (:class:`ModelBuildStateMachine`: plan, a Distributed Map that builds each model whose key is
    not stored in its own run of a third function, ``build_step``, then the release assembled by
    server-side copies in a fourth, ``place_step``), then the Provider's waiter calls ``is_complete`` every
    ``query_interval`` until the release index exists, the execution fails (the failing model is
    named) or ``total_timeout`` passes. A build therefore neither hangs nor fails silently, and
    only a single model must fit one Lambda run.

    The manifest is passed as an S3 asset (its size does not grow the template). The release id
    and each model's key are derived from the manifest and the build runtime
    (``model_build.release``): an unchanged manifest gives the same properties (no update), a
    changed one a new release id (an update that builds the changed models only, places them under
    new names and switches the routes; the physical id, the served prefix, stays the same).

    Two roles, so that the code that parses model sources cannot change what the fleet serves:

    - :attr:`build_role` (the ``build_step`` function: the plan, each model's build, a Processing
      job's store and failure steps) reads the manifest asset, the manifest's ``s3`` sources and
      the model prefix, and writes only ``_builds/``, ``_plans/`` and ``_jobs/`` (granted by the
      stack; the bucket policy denies it ``served/``, ``_routes/`` and ``_releases/``).
    - :attr:`role` (``on_event``, ``is_complete`` and ``place_step``, the state machine's Finish
      task) places and routes: it reads ``_builds/``, checks each tarball it places (its own
      SHA-256 of the bytes, the pre-publish gate again, then a copy whose S3 checksum must be
      that digest), writes ``served/``, ``_releases/`` and ``_routes/``, tags and deletes; it also
      describes this stack (to tell a stack deletion from an update's cleanup), reads its template
      and resources and the handlers' own tags (each event is checked against the template:
      ``model_build.handler.stack_check``), and starts and describes executions of its own state
      machine only.

    Both read the manifest asset and its ``s3`` sources and write their own logs.
    """

    def __init__(self, scope: Construct, id: str, *, props: ModelBuildResourceProps) -> None:
        super().__init__(scope, id)
        self._plan_release(props)
        #: Docker-ignore patterns of the build image's context (one walk of the runtime, shared by the handlers).
        self._image_exclude = runtime_only_exclude(props.build_context)
        self.manifest_asset = s3_assets.Asset(self, "Manifest", path=str(props.manifest_path))
        #: The model bucket's key, which encrypts the log groups and the framework functions'
        #: environment (None when the bucket has no key whose policy this app manages).
        self.encryption_key = logs_key(props.model_bucket.encryption_key)
        self._functions(props)
        self._engines(props)
        self.provider = self._provider(props)
        #: The handlers read their own tags (the stack CloudFormation created them in).
        self.check_requests_policy = iam.Policy(self, "CheckRequests", roles=[self.role], statements=[
            iam.PolicyStatement(actions=["lambda:ListTags"], resources=[
                self.on_event_function.function_arn, self.is_complete_function.function_arn]),
        ])
        self.resource = self._custom_resource(props)
        self._attributes()
        tidy_framework(
            self.provider, role=self.role, framework_roles=(self._on_event_framework_role, self._complete_framework_role),
            handlers=(self.on_event_function, self.is_complete_function), build_function=self.build_function,
            in_vpc=props.vpc is not None, encryption_key=self.encryption_key,
        )
        self._tidy_own_functions(props)

    def _plan_release(self, props: ModelBuildResourceProps) -> None:
        """What this deploy publishes and where each model builds, known at synth."""
        #: The release the manifest publishes (computed at synth from the manifest and the build
        #: code that goes into the image).
        self.release: Release = compute_release(
            props.manifest,
            base_dir=props.manifest_path.parent,
            code_sha256=build_code_sha256(props.build_context),
            package_dir=props.build_context,
        )
        #: Where each model builds (the Lambda or a Processing job), from the estimate; a model
        #: pinned to the Lambda whose estimate does not fit is refused here, before any deploy.
        self.placements = place_all(props.manifest.models, props.manifest_path.parent, props.engine_settings())
        on_processing = [p.model for p in self.placements if p.engine == "processing"]
        if on_processing:
            Annotations.of(self).add_info(
                f"models built on SageMaker Processing ({props.processing_instance_type} unless the entry says): "
                f"{', '.join(on_processing[:10])}{' ...' if len(on_processing) > 10 else ''}")

    def _functions(self, props: ModelBuildResourceProps) -> None:
        """The four functions on the build image, their two roles, and their VPC access."""
        #: Places and routes: on_event, is_complete and the state machine's Finish task.
        self.role = self._role(props, "Role", "Places and routes the models of the Triton multi-model endpoint")
        #: Parses the model sources: the state machine's plan, per-model build and job steps.
        self.build_role = self._role(props, "BuildRole", "Builds the models of the Triton multi-model endpoint into _builds/")
        #: The policy that lets Lambda attach the functions to the VPC (None without a VPC), on both roles.
        self.vpc_access_policy: iam.Policy | None = None if props.vpc is None else wildcard_policy(
            self,
            "VpcAccess",
            self.role,
            LAMBDA_VPC_ACTIONS,
            "Lambda creates, describes and deletes the network interfaces of a function in a VPC; "
            "these EC2 actions have no resource-level permissions that Lambda's calls match.",
            checkov=["CKV_AWS_111"],
        )
        if self.vpc_access_policy is not None:
            self.vpc_access_policy.attach_to_role(self.build_role)
        self.on_event_function = self._handler(
            props, "OnEvent", ON_EVENT_HANDLER, "Model release: validates a request and starts the build"
        )
        self.is_complete_function = self._handler(
            props, "IsComplete", IS_COMPLETE_HANDLER, "Model release: polls the build execution until the release index exists"
        )
        #: Builds one model per invocation (and plans the release) for the state machine.
        self.build_function = self._handler(
            props, "Build", BUILD_STEP_HANDLER, "Model release: plans a release or builds one model into the store",
            role=self.build_role,
        )
        #: The state machine's Finish task: gates each stored tarball again and places the release.
        self.place_function = self._handler(
            props, "Place", PLACE_STEP_HANDLER, "Model release: checks the stored builds and places the release"
        )

    def _tidy_own_functions(self, props: ModelBuildResourceProps) -> None:
        """What :func:`tidy_framework` does for the handlers, for the functions it does not know."""
        drop_referenced_dependencies(self.build_function, [self.build_role.node.default_child])
        drop_referenced_dependencies(self.place_function, [self.role.node.default_child])
        skip_checkov(self.place_function, ["CKV_AWS_115"], PLACE_CONCURRENCY_REASON)
        skip_checkov(self.place_function, ["CKV_AWS_116"], PLACE_INVOCATION_REASON)
        if props.vpc is None:
            skip_checkov(self.place_function, ["CKV_AWS_117"], OUTSIDE_VPC_REASON)

    def _engines(self, props: ModelBuildResourceProps) -> None:
        """Where models build: the build function, or a Processing job for the big ones, driven by
        the build state machine, which only the custom resource's functions may start."""
        #: Builds the models too big for the Lambda: a SageMaker Processing job on the same image.
        self.processing = ProcessingBuild(self, "Processing", props=ProcessingBuildProps(
            image=ecr_assets.DockerImageAsset(self, "BuildImage", **self._image_options(props)),
            encryption_key=props.model_bucket.encryption_key, max_runtime=props.job_max_runtime,
            network_isolation=props.processing_network_isolation, subnets=props.processing_subnets,
            security_groups=props.processing_security_groups,
        ))
        self._grant_source_reads(self.processing.role, props.manifest)
        #: Plan, build each model (a Distributed Map of build_function runs or Processing jobs),
        #: finish the release.
        self.build_state_machine = ModelBuildStateMachine(self, "BuildStateMachine", props=ModelBuildStateMachineProps(
            build_function=self.build_function, place_function=self.place_function, model_bucket=props.model_bucket, max_concurrency=props.max_concurrency,
            timeout=props.total_timeout, log_retention=props.log_retention, processing=self.processing,
        ))
        self.start_builds_policy = self._start_builds_policy()

    def _attributes(self) -> None:
        #: ``s3://<bucket>/<prefix>/served/`` (``Fn::GetAtt``; the same for every release: the
        #: endpoint takes its ModelDataUrl from the settings, not from here).
        self.model_data_url: str = self.resource.get_att_string("ModelDataUrl")
        #: Key of the routes document.
        self.routes_key: str = self.resource.get_att_string("RoutesKey")
        #: Key of the release index.
        self.index_key: str = self.resource.get_att_string("IndexKey")
        #: Number of published target models.
        self.model_count: str = self.resource.get_att_string("ModelCount")
        #: The release id (known at synth).
        self.release_id: str = self.release.release_id

    def grant_on(self, bucket: ModelBucket, prefix: str, *, destroy: bool) -> None:
        """The build's roles on the model bucket under ``prefix``, each on its folders only (a
        Processing job on ``_jobs/``, kept :data:`JOB_FOLDER_DAYS`; the build role the store, the
        plans and the jobs' inputs; the placing role what the fleet serves); ``destroy``: the
        placing role deletes everything under ``prefix`` (``artifacts_on_delete``)."""

        def under(folder: str) -> str:
            return f"{prefix}/{folder}" if prefix else folder

        # A Processing job reads its input and writes its unit under <prefix>/_jobs/ only.
        jobs = under(JOBS_DIR)
        # The job's volume is encrypted with the key through a grant: no key policy deny for its role.
        bucket.grant_read(self.processing.role, jobs, deny_direct_key_use=False)
        bucket.grant_write(self.processing.role, jobs, deny_direct_key_use=False)
        # A job's folder matters while its build runs (and for a look after a failure): a week.
        bucket.expire("ExpireBuildJobFolders", jobs, Duration.days(JOB_FOLDER_DAYS))
        # The build role parses the model sources: it writes the store, the plans and the jobs' inputs only.
        bucket.grant_read(self.build_role, prefix)
        for folder in (*BUILD_FOLDERS, JOBS_DIR):
            bucket.grant_write(self.build_role, under(folder))
        # The placing role places and routes: served/, the release indexes and the routes (and the
        # failure record of a model it refuses to place, under _plans/).
        bucket.grant_read(self, prefix)
        for folder in (*PLACED_FOLDERS, PLANS_DIR):
            bucket.grant_write(self, under(folder))
        bucket.grant_tag(self, prefix)
        # Unrouted served objects are deleted after the retention window; destroy removes more.
        bucket.grant_delete(self, prefix if destroy else served_prefix(prefix))

    def _role(self, props: ModelBuildResourceProps, id: str, description: str) -> iam.Role:
        """A role of the functions: it reads the manifest asset and the manifest's ``s3`` sources;
        the placing role (``Role``) also describes this stack (to tell a stack deletion from an
        update's cleanup)."""
        role = iam.Role(self, id, assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"), description=description)
        manifest = Stack.of(self).format_arn(
            service="s3",
            region="",
            account="",
            resource=self.manifest_asset.s3_bucket_name,
            resource_name=self.manifest_asset.s3_object_key,
        )
        role.add_to_principal_policy(iam.PolicyStatement(sid="ReadManifest", actions=["s3:GetObject"], resources=[manifest]))
        if id == "Role":
            role.add_to_principal_policy(
                iam.PolicyStatement(
                    sid="TellDeletionFromCleanup", actions=["cloudformation:DescribeStacks"], resources=[Aws.STACK_ID]
                )
            )
            # The handlers check each event against this stack's template before they act on it.
            role.add_to_principal_policy(
                iam.PolicyStatement(
                    sid="CheckRequestsAgainstTheTemplate",
                    actions=["cloudformation:GetTemplate", "cloudformation:DescribeStackResource"],
                    resources=[Aws.STACK_ID],
                )
            )
        self._grant_source_reads(role, props.manifest)
        return role

    def _start_builds_policy(self) -> iam.Policy:
        """Start and describe executions of the build state machine only. Its own policy, not the
        role's default one: the build function (same role) must not wait for the state machine that
        invokes it (a dependency cycle otherwise)."""
        machine = self.build_state_machine.state_machine
        executions = self._execution_arn(machine, ":*")
        policy = iam.Policy(
            self,
            "StartBuilds",
            roles=[self.role],
            statements=[
                iam.PolicyStatement(actions=["states:StartExecution"], resources=[machine.state_machine_arn]),
                iam.PolicyStatement(actions=["states:DescribeExecution"], resources=[executions]),
            ],
        )
        acknowledge_wildcard_resource(
            policy,
            executions,
            "is_complete reads the status of the build executions of this one state machine; "
            "an execution is named per request.",
        )
        map_policy = machine.node.find_child("DistributedMapPolicy")
        for suffix in (":*", "/*:*"):
            acknowledge_wildcard_resource(
                map_policy,
                self._execution_arn(machine, suffix),
                "The Distributed Map starts, describes and stops its own child executions (CDK's "
                "grant, scoped to this state machine's executions and map runs).",
            )
        return policy

    def _provider(self, props: ModelBuildResourceProps) -> cr.Provider:
        """The Provider framework's asynchronous pattern: ``on_event``, then ``is_complete`` every
        ``query_interval`` until done or ``total_timeout``."""
        provider_logs = self._log_group(props, "ProviderLogs")
        waiter_logs = self._log_group(props, "WaiterLogs")
        self._on_event_framework_role = self._framework_role("FrameworkOnEventRole", provider_logs)
        self._complete_framework_role = self._framework_role("FrameworkCompleteRole", provider_logs)
        return cr.Provider(
            self,
            "Provider",
            on_event_handler=self.on_event_function,
            is_complete_handler=self.is_complete_function,
            query_interval=props.query_interval,
            total_timeout=props.total_timeout,
            log_group=provider_logs,
            framework_on_event_role=self._on_event_framework_role,
            framework_complete_and_timeout_role=self._complete_framework_role,
            provider_function_env_encryption=self.encryption_key,
            disable_waiter_state_machine_logging=False,
            waiter_state_machine_log_options=cr.LogOptions(
                destination=waiter_logs, level=sfn.LogLevel.ALL, include_execution_data=False
            ),
        )

    def _custom_resource(self, props: ModelBuildResourceProps) -> CustomResource:
        resource = CustomResource(
            self,
            "Resource",
            service_token=self.provider.service_token,
            resource_type=RESOURCE_TYPE,
            service_timeout=CLOUDFORMATION_MAX_WAIT,
            removal_policy=RemovalPolicy.DESTROY,
            properties={
                "ManifestBucket": self.manifest_asset.s3_bucket_name,
                "ManifestKey": self.manifest_asset.s3_object_key,
                "ManifestSha256": self.release.manifest_sha256,
                "ModelBucket": props.model_bucket.bucket_name,
                "ModelPrefix": props.model_prefix,
                "ReleaseId": self.release.release_id,
                "CodeSha256": self.release.code_sha256,
                "BuildStateMachineArn": self.build_state_machine.state_machine.state_machine_arn,
                "OnDelete": props.on_delete,
                "RetiredTagKey": RETIRED_TAG_KEY,
                "RetentionDays": str(props.unrouted_retention_days),
                "Deployed": props.deployed_record,
                # Where models build: the plan step places each model with these (the template
                # does not grow with the manifest).
                "BuildEngine": props.engine_settings().properties(),
            },
        )
        resource.node.add_dependency(self.start_builds_policy, self.check_requests_policy)
        return resource

    @property
    def grant_principal(self) -> iam.IPrincipal:
        """The placing role (on_event, is_complete, the Finish task); the builder's is :attr:`build_role`."""
        return self.role

    @staticmethod
    def _execution_arn(machine: sfn.StateMachine, suffix: str) -> str:
        """``arn:...:execution:<state machine name><suffix>``, written as CDK writes it."""
        stack = Stack.of(machine)
        return Fn.join("", [
            "arn:", stack.partition, ":states:", stack.region, ":", stack.account, ":execution:",
            Fn.select(6, Fn.split(":", machine.state_machine_arn)), suffix,
        ])

    def _image_options(self, props: ModelBuildResourceProps) -> dict[str, Any]:
        """The build image's asset options: every user of the image gives the same, so CDK builds
        and publishes one image (one asset hash) for the functions and the Processing jobs."""
        # follow_symlinks: the context's image/triton_mme_client is a link to client/ in a checkout
        # (a folder in an installed wheel); the staged context holds its files either way.
        return {"directory": str(props.build_context), "exclude": self._image_exclude,
                "ignore_mode": IgnoreMode.DOCKER, "platform": ecr_assets.Platform.LINUX_AMD64,
                "follow_symlinks": SymlinkFollowMode.ALWAYS}

    def _image_code(self, props: ModelBuildResourceProps, handler: str) -> lambda_.DockerImageCode:
        """The build image (one asset: same directory and build options) with ``handler``."""
        options = self._image_options(props)
        return lambda_.DockerImageCode.from_image_asset(options.pop("directory"), cmd=[handler], **options)

    def _handler(self, props: ModelBuildResourceProps, id: str, handler: str, description: str, *,
                 role: iam.Role | None = None) -> lambda_.DockerImageFunction:
        """One of the functions: the build image with ``handler``, its own log group, ``role``
        (the placing role unless given)."""
        role = role or self.role
        log_group = self._log_group(props, f"{id}Logs")
        log_group.grant_write(role)
        function = lambda_.DockerImageFunction(
            self,
            id,
            code=self._image_code(props, handler),
            description=description,
            architecture=lambda_.Architecture.X86_64,
            memory_size=props.memory_size,
            ephemeral_storage_size=props.ephemeral_storage_size,
            timeout=props.timeout,
            role=role,
            log_group=log_group,
            vpc=props.vpc,
            vpc_subnets=ec2.SubnetSelection(subnets=list(props.vpc_subnets or [])) if props.vpc else None,
            security_groups=list(props.security_groups or []) or None,
        )
        if self.vpc_access_policy is not None:
            # Lambda checks the network-interface permissions when it creates the function.
            function.node.add_dependency(self.vpc_access_policy)
        return function

    def _log_group(self, props: ModelBuildResourceProps, id: str) -> logs.LogGroup:
        """A log group with the props' retention, encrypted with the model bucket's key when there is one."""
        log_group = logs.LogGroup(self, id, retention=props.log_retention, encryption_key=self.encryption_key)
        if self.encryption_key is None:
            skip_checkov(log_group, ["CKV_AWS_158"], NO_KEY_REASON.format(what="this log group"))
        return log_group

    def _framework_role(self, id: str, log_group: logs.ILogGroup) -> iam.Role:
        role = iam.Role(
            self,
            id,
            assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"),
            description="CDK provider framework of the model release custom resource",
        )
        log_group.grant_write(role)
        return role

    def _grant_source_reads(self, role: iam.Role, manifest: Manifest) -> None:
        """Read access to the manifest's sources on S3 (``s3`` folders, ``onnx`` files), only in
        a bucket of the account the source names (``source.owner``), else of this stack's account
        (``s3:ResourceAccount``): a bucket of the same name re-created elsewhere is not read."""
        owners = manifest.source_owners()
        for bucket, keys in s3_source_keys(manifest).items():
            bucket_arn = Stack.of(self).format_arn(
                service="s3", region="", account="", resource=bucket
            )
            owner = {"s3:ResourceAccount": owners.get(bucket) or Stack.of(self).account}
            objects = [f"{bucket_arn}/{key}" for key in keys]
            role.add_to_principal_policy(iam.PolicyStatement(
                actions=["s3:GetObject"], resources=objects, conditions={"StringEquals": owner}))
            folders = [key for key in keys if key.endswith("*")]
            if folders:
                role.add_to_principal_policy(
                    iam.PolicyStatement(
                        actions=["s3:ListBucket"],
                        resources=[bucket_arn],
                        conditions={"StringLike": {"s3:prefix": folders}, "StringEquals": owner},
                    )
                )
            for resource in (o for o in objects if o.endswith("*")):
                acknowledge_wildcard_resource(
                    role,
                    resource,
                    "The build reads the files of a model source given as an S3 folder in the "
                    "manifest; access is scoped to that folder.",
                )
