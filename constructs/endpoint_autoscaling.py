"""Application Auto Scaling of a SageMaker endpoint variant on invocations and GPU use."""

from __future__ import annotations

from typing import Annotated, Any

from aws_cdk import Duration, Stack
from aws_cdk import aws_applicationautoscaling as appscaling
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_iam as iam
from pydantic import Field

from constructs import Construct
from triton_mme_cdk.constructs.props import SECONDS, Between, Props
from triton_mme_cdk.constructs.sagemaker_hosting import SageMakerHosting

SCALABLE_DIMENSION = "sagemaker:variant:DesiredInstanceCount"
#: Application Auto Scaling creates this service-linked role on first use.
SERVICE_LINKED_ROLE = (
    "aws-service-role/sagemaker.application-autoscaling.amazonaws.com/"
    "AWSServiceRoleForApplicationAutoScaling_SageMakerEndpoint"
)
#: A target-tracking cooldown: at most a day.
Cooldown = Annotated[Duration, Between(0, 86400, SECONDS)]


def _cooldown(seconds: int, direction: str, policy: str) -> Any:
    """The scale-in or scale-out cooldown field of one policy (each policy has both)."""
    return Field(default_factory=lambda: Duration.seconds(seconds),
                 description=f"Scale-{direction} cooldown of the {policy} policy.")


class EndpointAutoscalingProps(Props):
    """Props of :class:`EndpointAutoscaling`."""

    endpoint: SageMakerHosting = Field(
        description="The endpoint whose variant scales, between its fleet.minimum and fleet.maximum."
    )
    # Each policy: its target, then its scale-in and scale-out cooldowns.
    # fmt: off
    invocations_per_instance_target: float = Field(default=70, gt=0, description="Target of the SageMakerVariantInvocationsPerInstance tracking policy (requests per instance per minute).")
    invocations_scale_in_cooldown: Cooldown = _cooldown(600, "in", "invocations")
    invocations_scale_out_cooldown: Cooldown = _cooldown(300, "out", "invocations")
    gpu_utilization_target: float = Field(default=60, gt=0, le=100, description="Target average GPUUtilization in percent (0 < target <= 100) of the GPU tracking policy. The variant scales in only when both policies agree.")
    gpu_scale_in_cooldown: Cooldown = _cooldown(600, "in", "GPU")
    gpu_scale_out_cooldown: Cooldown = _cooldown(200, "out", "GPU")
    # fmt: on


class EndpointAutoscaling(Construct):
    """A scalable target on the variant's instance count and two target-tracking policies.

    - ``InvocationsPerInstance``: the predefined metric
      ``SageMakerVariantInvocationsPerInstance`` (requests per instance per minute).
    - ``GpuUtilization``: the customized metric ``GPUUtilization`` (namespace
      ``/aws/sagemaker/Endpoints``, dimensions EndpointName and VariantName, ``Average``, unit
      ``Percent``).

    Each policy scales out as soon as its metric is above target; the variant scales in only
    when both policies agree. The target uses Application Auto Scaling's service-linked role for
    SageMaker endpoints. Its resource id references the endpoint (``Fn::GetAtt``), so it is
    registered after the endpoint exists and deregistered before the endpoint is deleted.
    """

    def __init__(self, scope: Construct, id: str, *, props: EndpointAutoscalingProps) -> None:
        super().__init__(scope, id)
        endpoint = props.endpoint
        role = iam.Role.from_role_arn(
            self,
            "ServiceLinkedRole",
            Stack.of(self).format_arn(service="iam", region="", resource="role", resource_name=SERVICE_LINKED_ROLE),
            mutable=False,
        )
        self.scalable_target = appscaling.ScalableTarget(
            self,
            "Resource",
            service_namespace=appscaling.ServiceNamespace.SAGEMAKER,
            scalable_dimension=SCALABLE_DIMENSION,
            resource_id=f"endpoint/{endpoint.endpoint_name}/variant/{endpoint.variant_name}",
            min_capacity=endpoint.fleet.minimum,
            max_capacity=endpoint.fleet.maximum,
            role=role,
        )
        self.invocations_policy = self.scalable_target.scale_to_track_metric(
            "InvocationsPerInstance",
            target_value=props.invocations_per_instance_target,
            predefined_metric=appscaling.PredefinedMetric.SAGEMAKER_VARIANT_INVOCATIONS_PER_INSTANCE,
            scale_in_cooldown=props.invocations_scale_in_cooldown,
            scale_out_cooldown=props.invocations_scale_out_cooldown,
        )
        self.gpu_policy = self.scalable_target.scale_to_track_metric(
            "GpuUtilization",
            target_value=props.gpu_utilization_target,
            custom_metric=endpoint.metric_gpu_utilization(unit=cloudwatch.Unit.PERCENT),
            scale_in_cooldown=props.gpu_scale_in_cooldown,
            scale_out_cooldown=props.gpu_scale_out_cooldown,
        )
