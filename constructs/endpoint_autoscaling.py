"""Application Auto Scaling of a SageMaker endpoint variant on invocations and GPU use."""

from __future__ import annotations

from aws_cdk import Duration, Stack, Token
from aws_cdk import aws_applicationautoscaling as appscaling
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_iam as iam

from constructs import Construct
from constructs.sagemaker_limits import PropsError, check_range
from constructs.triton_mme_endpoint import TritonMmeEndpoint

SCALABLE_DIMENSION = "sagemaker:variant:DesiredInstanceCount"
#: Application Auto Scaling creates this service-linked role on first use.
SERVICE_LINKED_ROLE = (
    "aws-service-role/sagemaker.application-autoscaling.amazonaws.com/"
    "AWSServiceRoleForApplicationAutoScaling_SageMakerEndpoint"
)


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

    :param endpoint: the endpoint whose variant scales.
    :param min_capacity: fewest instances (at least 1). Default: 1.
    :param max_capacity: most instances (at least ``min_capacity``). Default: 4.
    :param invocations_per_instance_target: target requests per instance per minute.
        Default: 70.
    :param invocations_scale_in_cooldown: Default: 600 s.
    :param invocations_scale_out_cooldown: Default: 300 s.
    :param gpu_utilization_target: target average GPU use in percent (0 < target <= 100).
        Default: 60.
    :param gpu_scale_in_cooldown: Default: 600 s.
    :param gpu_scale_out_cooldown: Default: 200 s.
    """

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        endpoint: TritonMmeEndpoint,
        min_capacity: int = 1,
        max_capacity: int = 4,
        invocations_per_instance_target: float = 70,
        invocations_scale_in_cooldown: Duration | None = None,
        invocations_scale_out_cooldown: Duration | None = None,
        gpu_utilization_target: float = 60,
        gpu_scale_in_cooldown: Duration | None = None,
        gpu_scale_out_cooldown: Duration | None = None,
    ) -> None:
        super().__init__(scope, id)
        check_range("min_capacity", min_capacity, 1, 10_000)
        check_range("max_capacity", max_capacity, 1, 10_000)
        if not Token.is_unresolved(min_capacity) and not Token.is_unresolved(max_capacity) and (
            min_capacity > max_capacity
        ):
            raise PropsError(
                f"min_capacity: got {min_capacity} with max_capacity {max_capacity}; expected "
                "min_capacity <= max_capacity"
            )
        if not Token.is_unresolved(invocations_per_instance_target) and invocations_per_instance_target <= 0:
            raise PropsError(
                f"invocations_per_instance_target: got {invocations_per_instance_target}; "
                "expected a number above 0"
            )
        if not Token.is_unresolved(gpu_utilization_target) and not 0 < gpu_utilization_target <= 100:
            raise PropsError(
                f"gpu_utilization_target: got {gpu_utilization_target}; expected a percentage "
                "above 0 and at most 100"
            )

        role = iam.Role.from_role_arn(
            self,
            "ServiceLinkedRole",
            Stack.of(self).format_arn(
                service="iam", region="", resource="role", resource_name=SERVICE_LINKED_ROLE
            ),
            mutable=False,
        )
        self.scalable_target = appscaling.ScalableTarget(
            self,
            "Resource",
            service_namespace=appscaling.ServiceNamespace.SAGEMAKER,
            scalable_dimension=SCALABLE_DIMENSION,
            resource_id=f"endpoint/{endpoint.endpoint_name}/variant/{endpoint.variant_name}",
            min_capacity=min_capacity,
            max_capacity=max_capacity,
            role=role,
        )
        self.invocations_policy = self.scalable_target.scale_to_track_metric(
            "InvocationsPerInstance",
            target_value=invocations_per_instance_target,
            predefined_metric=appscaling.PredefinedMetric.SAGEMAKER_VARIANT_INVOCATIONS_PER_INSTANCE,
            scale_in_cooldown=invocations_scale_in_cooldown or Duration.seconds(600),
            scale_out_cooldown=invocations_scale_out_cooldown or Duration.seconds(300),
        )
        self.gpu_policy = self.scalable_target.scale_to_track_metric(
            "GpuUtilization",
            target_value=gpu_utilization_target,
            custom_metric=endpoint.metric_gpu_utilization(
                statistic="Average", unit=cloudwatch.Unit.PERCENT
            ),
            scale_in_cooldown=gpu_scale_in_cooldown or Duration.seconds(600),
            scale_out_cooldown=gpu_scale_out_cooldown or Duration.seconds(200),
        )
