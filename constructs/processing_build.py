"""The SageMaker Processing side of the model build: the job's role and the state that runs it.

A model too big for one Lambda run (model_build/manifest/build_engine.py decides) builds in a Processing
job inside the same Distributed Map: the build Lambda's own image (the same Docker asset, so
the same code and the same key), its entry point overridden to
``python3 -m model_build.handler.processing_job``. The job reads and writes only through its
ProcessingInputs and ProcessingOutputs under ``<prefix>/_jobs/`` (and the model's S3 source),
so it runs with the endpoint's network settings: network isolation and, in a VPC, the model's
subnets and security group. Its volume and output are encrypted with the model bucket's key.

Step Functions waits for the job with the optimized ``createProcessingJob.sync`` integration
(aws-cdk-lib has no task class for it: a ``CustomState``, whose permissions are granted here
by :meth:`ProcessingBuild.grant_run`, as the Step Functions and SageMaker guides list them).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any

from aws_cdk import ArnFormat, Aws, Duration, Stack
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_ecr_assets as ecr_assets
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_stepfunctions as sfn
from pydantic import Field

from constructs import Construct
from triton_mme_cdk.constructs.nag_acknowledgments import acknowledge_wildcard_resource, wildcard_policy
from triton_mme_cdk.constructs.props import SECONDS, Between, Props, Resource
from triton_mme_cdk.constructs.sagemaker_hosting import SAGEMAKER_VPC_ACTIONS
from triton_mme_cdk.model_build.handler.processing import CONTAINER_OUTPUT

#: The job's entry point in the build image (the Lambda's is the runtime interface client).
ENTRY_POINT = ("python3", "-m", "triton_mme_cdk.model_build.handler.processing_job")
#: Every build job's name starts so (``mb-<key hex>-<uuid>``): the grants are scoped to it.
JOB_NAME_PREFIX = "mb-"
#: The EventBridge rule Step Functions manages to learn that a Processing job ended (.sync).
SYNC_RULE = "StepFunctionsGetEventsForSageMakerProcessingJobsRule"
LOG_GROUP = "/aws/sagemaker/ProcessingJobs"
#: ``ProcessingStoppingCondition.MaxRuntimeInSeconds`` is 1 to 777,600 (9 days; SageMaker API reference).
MAX_RUNTIME_SECONDS = 777_600
#: CreateProcessingJob errors worth retrying at once: the account's per-type instance limit and
#: throttling (a job that started without capacity fails later; ``job_failed`` classifies it).
TRANSIENT_API_ERRORS = ("SageMaker.ResourceLimitExceededException", "SageMaker.ThrottlingException")


class ProcessingBuildProps(Props):
    """Props of :class:`ProcessingBuild`."""

    image: Resource[ecr_assets.DockerImageAsset] = Field(
        description="The build image: the same asset as the build Lambda's (one image, one code)."
    )
    encryption_key: Resource[kms.IKey] | None = Field(
        default=None, description="Encrypts the job's volume and output (the model bucket's key). None: "
        "SageMaker's default encryption."
    )
    max_runtime: Annotated[Duration, Between(1, MAX_RUNTIME_SECONDS, SECONDS)] = Field(
        description="The job's MaxRuntimeInSeconds (the API takes 1 s to 9 days)."
    )
    network_isolation: bool = Field(default=True, description="The endpoint's network isolation.")
    subnets: Sequence[Resource[ec2.ISubnet]] | None = Field(
        default=None, description="The endpoint's subnets; None: not in a VPC."
    )
    security_groups: Sequence[Resource[ec2.ISecurityGroup]] | None = Field(
        default=None, description="The endpoint's security groups (with subnets)."
    )


class ProcessingBuild(Construct):
    """The role a Processing build job runs with and the Step Functions state that runs one."""

    def __init__(self, scope: Construct, id: str, *, props: ProcessingBuildProps) -> None:
        super().__init__(scope, id)
        #: The job's role: pulls the image, writes its logs, reads and writes ``<prefix>/_jobs/``
        #: and reads the S3 sources (both granted by the stack and the build resource).
        stack = Stack.of(self)
        # Only SageMaker running this account's Processing jobs may assume it (SageMaker's guide,
        # "Cross-service confused deputy prevention", SageMaker Processing Jobs:
        # https://docs.aws.amazon.com/sagemaker/latest/dg/security-confused-deputy-prevention.html).
        jobs = stack.format_arn(service="sagemaker", resource="processing-job", resource_name="*")
        self.role = iam.Role(self, "Role", assumed_by=iam.ServicePrincipal("sagemaker.amazonaws.com", conditions={
                                 "StringEquals": {"aws:SourceAccount": stack.account},
                                 "ArnLike": {"aws:SourceArn": jobs}}),
                             description="Runs the Processing jobs that build models too big for the build Lambda")
        props.image.repository.grant_pull(self.role)
        log_group = stack.format_arn(service="logs", resource="log-group", resource_name=LOG_GROUP,
                                     arn_format=ArnFormat.COLON_RESOURCE_NAME)
        self.role.add_to_principal_policy(iam.PolicyStatement(
            sid="JobLogs", actions=["logs:CreateLogGroup", "logs:CreateLogStream", "logs:DescribeLogStreams",
                                    "logs:PutLogEvents"], resources=[log_group, f"{log_group}:*"]))
        self.role.add_to_principal_policy(iam.PolicyStatement(
            sid="JobMetrics", actions=["cloudwatch:PutMetricData"], resources=["*"],
            conditions={"StringEquals": {"cloudwatch:namespace": LOG_GROUP}}))
        acknowledge_wildcard_resource(self.role, f"{log_group}:*", "Log streams of SageMaker's Processing log "
                                      "group; SageMaker names a stream per job and instance.")
        acknowledge_wildcard_resource(self.role, "*", "cloudwatch:PutMetricData supports no resource-level "
                                      f"permissions; the statement is conditioned on cloudwatch:namespace = {LOG_GROUP}.")
        if props.encryption_key is not None:
            # SageMaker encrypts the job's EBS volume with the key through a grant.
            self.role.add_to_principal_policy(iam.PolicyStatement(
                sid="VolumeKey", actions=["kms:CreateGrant"], resources=[props.encryption_key.key_arn],
                conditions={"Bool": {"kms:GrantIsForAWSResource": "true"}}))
        if props.subnets:
            wildcard_policy(self, "VpcAccess", self.role, SAGEMAKER_VPC_ACTIONS,
                            "SageMaker creates, describes and deletes the network interfaces of a Processing job "
                            "in a VPC; these EC2 actions have no resource-level permissions.",
                            checkov=["CKV_AWS_109", "CKV_AWS_111"])
        #: ARN of the job's role.
        self.role_arn: str = self.role.role_arn
        self._job = self._job_parameters(props)

    @staticmethod
    def _job_parameters(props: ProcessingBuildProps) -> dict[str, Any]:
        """The parameters of every job the task starts but its name and role: the image, the
        instance, volume, inputs and output of ``$.Job``, its key, runtime and network."""
        cluster: dict[str, Any] = {"InstanceCount": 1, "InstanceType.$": "$.Job.InstanceType",
                                   "VolumeSizeInGB.$": "$.Job.VolumeGb"}
        outputs: dict[str, Any] = {"Outputs": [{"OutputName": "unit", "S3Output": {
            "S3Uri.$": "$.Job.Output", "LocalPath": CONTAINER_OUTPUT, "S3UploadMode": "EndOfJob"}}]}
        if props.encryption_key is not None:
            cluster["VolumeKmsKeyId"] = props.encryption_key.key_arn
            outputs["KmsKeyId"] = props.encryption_key.key_arn
        network: dict[str, Any] = {"EnableNetworkIsolation": props.network_isolation,
                                   "EnableInterContainerTrafficEncryption": True}
        if props.subnets:
            network["VpcConfig"] = {"Subnets": [subnet.subnet_id for subnet in props.subnets],
                                    "SecurityGroupIds": [group.security_group_id for group in props.security_groups or ()]}
        return {
            "AppSpecification": {"ImageUri": props.image.image_uri, "ContainerEntrypoint": list(ENTRY_POINT)},
            "ProcessingResources": {"ClusterConfig": cluster},
            "ProcessingInputs.$": "$.Job.Inputs",
            "ProcessingOutputConfig": outputs,
            "StoppingCondition": {"MaxRuntimeInSeconds": int(props.max_runtime.to_seconds())},
            "NetworkConfig": network,
            "Environment": {"PYTHONUNBUFFERED": "1"},
        }

    def task(self, scope: Construct, id: str) -> sfn.CustomState:
        """The state that runs one Map item's job and waits for it (``createProcessingJob.sync``).
        Its input is the item: ``$.Job`` carries the name prefix, instance, volume, inputs and
        output the plan step chose; the job's name is recorded at ``$.JobResult``."""
        state = sfn.CustomState(scope, id, state_json={
            "Type": "Task",
            "Resource": f"arn:{Aws.PARTITION}:states:::sagemaker:createProcessingJob.sync",
            "Parameters": {
                # A new name per attempt (names are unique per account and Region).
                "ProcessingJobName.$": "States.Format('{}-{}', $.Job.NamePrefix, States.UUID())",
                "RoleArn": self.role.role_arn,
                **self._job,
            },
            "ResultSelector": {"ProcessingJobName.$": "$.ProcessingJobName"},
            "ResultPath": "$.JobResult",
        })
        state.add_retry(errors=list(TRANSIENT_API_ERRORS), interval=Duration.seconds(10), max_attempts=4,
                        backoff_rate=2, jitter_strategy=sfn.JitterType.FULL)
        return state

    def grant_run(self, grantee: iam.IGrantable) -> iam.Grant:
        """Let ``grantee`` (the state machine) start, describe and stop build jobs, pass the job's
        role to SageMaker only, and manage the EventBridge rule of ``.sync``."""
        stack = Stack.of(self)
        jobs = stack.format_arn(service="sagemaker", resource="processing-job", resource_name=f"{JOB_NAME_PREFIX}*")
        rule = stack.format_arn(service="events", resource="rule", resource_name=SYNC_RULE)
        run = iam.Grant.add_to_principal(grantee=grantee, resource_arns=[jobs], actions=[
            "sagemaker:CreateProcessingJob", "sagemaker:DescribeProcessingJob", "sagemaker:StopProcessingJob"])
        events = iam.Grant.add_to_principal(grantee=grantee, resource_arns=[rule], actions=[
            "events:PutTargets", "events:PutRule", "events:DescribeRule"])
        passes = iam.Grant.add_to_principal(grantee=grantee, resource_arns=[self.role.role_arn], actions=["iam:PassRole"],
                                            conditions={"StringEquals": {"iam:PassedToService": "sagemaker.amazonaws.com"}})
        principal = grantee.grant_principal
        if isinstance(principal, Construct):
            acknowledge_wildcard_resource(principal, jobs, "Build jobs are named per attempt "
                                          f"({JOB_NAME_PREFIX}<model key>-<uuid>); the grant is scoped to that prefix.")
        return run.combine(events).combine(passes)
