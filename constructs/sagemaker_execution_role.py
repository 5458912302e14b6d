"""The IAM role SageMaker assumes to host the Triton multi-model endpoint."""

from __future__ import annotations

from typing import Any

import jsii
from aws_cdk import ArnFormat, Stack
from aws_cdk import aws_iam as iam
from pydantic import Field

from constructs import Construct
from triton_mme_cdk.constructs.nag_acknowledgments import acknowledge_wildcard_resource
from triton_mme_cdk.constructs.props import Props
from triton_mme_cdk.constructs.sagemaker_limits import INSTANCE_NAMESPACE, SageMakerName


class SageMakerExecutionRoleProps(Props):
    """Props of :class:`SageMakerExecutionRole`."""

    endpoint_name: SageMakerName = Field(description="Name of the endpoint whose logs the role writes.")


@jsii.implements(iam.IGrantable)
class SageMakerExecutionRole(Construct):
    """A role assumed by ``sagemaker.amazonaws.com`` that may only write the endpoint's telemetry.

    On its own it can write the endpoint's logs (log group ``/aws/sagemaker/Endpoints/<endpoint>``
    and its streams) and publish metrics in the namespace ``/aws/sagemaker/Endpoints``
    (``cloudwatch:PutMetricData`` conditioned on ``cloudwatch:namespace``). Everything else is
    granted to it: read the model prefix (``ModelBucket.grant_read``), pull the Triton image
    (``TritonImage.grant_pull``). It has no AWS managed policy and no wildcard action.
    """

    def __init__(self, scope: Construct, id: str, *, props: SageMakerExecutionRoleProps) -> None:
        super().__init__(scope, id)
        stack = Stack.of(self)
        self.role = iam.Role(
            self,
            "Resource",
            # Only SageMaker acting for this account's inference resources may assume it: the condition
            # SageMaker's guide gives for real-time inference ("Cross-service confused deputy prevention",
            # https://docs.aws.amazon.com/sagemaker/latest/dg/security-confused-deputy-prevention.html,
            # SageMaker AI Inference: aws:SourceArn arn:<partition>:sagemaker:<region>:<account>:*, not a
            # model's or an endpoint's ARN), with aws:SourceAccount of the same account.
            assumed_by=iam.ServicePrincipal("sagemaker.amazonaws.com", conditions={
                "StringEquals": {"aws:SourceAccount": stack.account},
                "ArnLike": {"aws:SourceArn": stack.format_arn(service="sagemaker", resource="*")},
            }),
            description=f"Hosts the Triton multi-model endpoint {props.endpoint_name}",
        )
        log_group = stack.format_arn(
            service="logs",
            resource="log-group",
            resource_name=f"/aws/sagemaker/Endpoints/{props.endpoint_name}",
            arn_format=ArnFormat.COLON_RESOURCE_NAME,
        )
        self._allow("EndpointLogGroup", ["logs:CreateLogGroup", "logs:CreateLogStream", "logs:DescribeLogStreams"],
                    [log_group, f"{log_group}:*"])
        self._allow("EndpointLogEvents", ["logs:PutLogEvents"], [f"{log_group}:log-stream:*"])
        self._allow("EndpointMetrics", ["cloudwatch:PutMetricData"], ["*"],
                    {"StringEquals": {"cloudwatch:namespace": INSTANCE_NAMESPACE}})
        for resource, reason in (
            (
                f"{log_group}:*",
                "Log streams of the endpoint's own log group; their names are chosen by "
                "SageMaker per instance.",
            ),
            (
                f"{log_group}:log-stream:*",
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

    def _allow(self, sid: str, actions: list[str], resources: list[str], conditions: dict[str, Any] | None = None) -> None:
        self.role.add_to_principal_policy(
            iam.PolicyStatement(sid=sid, actions=actions, resources=resources, conditions=conditions)
        )

    @property
    def grant_principal(self) -> iam.IPrincipal:
        """The role: grants go to its default policy."""
        return self.role
