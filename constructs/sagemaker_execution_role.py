"""The IAM role SageMaker assumes to host the Triton multi-model endpoint."""

from __future__ import annotations

import jsii
from aws_cdk import ArnFormat, Stack
from aws_cdk import aws_iam as iam

from constructs import Construct
from constructs.nag_acknowledgments import acknowledge_wildcard_resource
from constructs.sagemaker_limits import INSTANCE_NAMESPACE, check_name


@jsii.implements(iam.IGrantable)
class SageMakerExecutionRole(Construct):
    """A role assumed by ``sagemaker.amazonaws.com`` that may only write the endpoint's telemetry.

    On its own it can write the endpoint's logs (log group ``/aws/sagemaker/Endpoints/<endpoint>``
    and its streams) and publish metrics in the namespace ``/aws/sagemaker/Endpoints``
    (``cloudwatch:PutMetricData`` conditioned on ``cloudwatch:namespace``). Everything else is
    granted to it: read the model prefix (``ModelBucket.grant_read``), pull the Triton image
    (``TritonImage.grant_pull``). It has no AWS managed policy and no wildcard action.

    :param endpoint_name: name of the endpoint whose logs the role writes.
    """

    def __init__(self, scope: Construct, id: str, *, endpoint_name: str) -> None:
        super().__init__(scope, id)
        check_name("endpoint_name", endpoint_name)
        self.role = iam.Role(
            self,
            "Resource",
            assumed_by=iam.ServicePrincipal("sagemaker.amazonaws.com"),
            description=f"Hosts the Triton multi-model endpoint {endpoint_name}",
        )
        stack = Stack.of(self)
        log_group = stack.format_arn(
            service="logs",
            resource="log-group",
            resource_name=f"/aws/sagemaker/Endpoints/{endpoint_name}",
            arn_format=ArnFormat.COLON_RESOURCE_NAME,
        )
        log_group_children = f"{log_group}:*"
        log_streams = f"{log_group}:log-stream:*"
        self.role.add_to_principal_policy(
            iam.PolicyStatement(
                sid="EndpointLogGroup",
                actions=["logs:CreateLogGroup", "logs:CreateLogStream", "logs:DescribeLogStreams"],
                resources=[log_group, log_group_children],
            )
        )
        self.role.add_to_principal_policy(
            iam.PolicyStatement(
                sid="EndpointLogEvents",
                actions=["logs:PutLogEvents"],
                resources=[log_streams],
            )
        )
        self.role.add_to_principal_policy(
            iam.PolicyStatement(
                sid="EndpointMetrics",
                actions=["cloudwatch:PutMetricData"],
                resources=["*"],
                conditions={"StringEquals": {"cloudwatch:namespace": INSTANCE_NAMESPACE}},
            )
        )
        for resource, reason in (
            (
                log_group_children,
                "Log streams of the endpoint's own log group; their names are chosen by "
                "SageMaker per instance.",
            ),
            (
                log_streams,
                "Log events go to streams of the endpoint's own log group; their names are "
                "chosen by SageMaker per instance.",
            ),
            (
                "*",
                "cloudwatch:PutMetricData supports no resource-level permissions; the statement "
                f"is conditioned on cloudwatch:namespace = {INSTANCE_NAMESPACE}.",
            ),
        ):
            acknowledge_wildcard_resource(self.role, resource, reason)

        #: ARN of the role.
        self.role_arn: str = self.role.role_arn
        #: Name of the role.
        self.role_name: str = self.role.role_name

    @property
    def grant_principal(self) -> iam.IPrincipal:
        """The role: grants go to its default policy."""
        return self.role
