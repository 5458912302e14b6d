"""The CloudWatch metrics of one production variant of a SageMaker endpoint.

SageMaker publishes them at a 1-minute resolution with the dimensions ``EndpointName`` and
``VariantName`` (no per-model dimension on a multi-model endpoint): invocation metrics in
``AWS/SageMaker``, instance metrics in ``/aws/sagemaker/Endpoints``. Every ``metric_*`` method is
named after the service's metric and takes the same keyword arguments, :class:`MetricOptions`
(statistic, period, unit, label...), which override the metric's defaults; they are declared once
each as a :class:`VariantMetric` row, not written out per method.

The ``EndpointName`` dimension is the endpoint's name *as given* (a string, not a reference to the
endpoint resource), so metrics, and the alarms and dashboards built on them, do not depend on the
endpoint resource.
"""

from __future__ import annotations

import functools
from typing import Any, Protocol, TypedDict, Unpack, overload

from aws_cdk import Duration
from aws_cdk import aws_cloudwatch as cloudwatch

from triton_mme_cdk.constructs.sagemaker_limits import INSTANCE_NAMESPACE, INVOCATION_NAMESPACE

#: SageMaker's resolution: the default period of every metric.
RESOLUTION = Duration.minutes(1)


class MetricOptions(TypedDict, total=False):
    """What a ``metric_*`` method takes (the options of ``cloudwatch.MetricOptions`` that apply)."""

    statistic: str
    period: Duration
    unit: cloudwatch.Unit
    label: str
    color: str
    account: str
    region: str


class MetricMethod(Protocol):
    """A bound ``metric_*`` method."""

    def __call__(self, **options: Unpack[MetricOptions]) -> cloudwatch.Metric: ...


class VariantMetric:
    """A ``metric_*`` method: the metric ``name`` of ``namespace``, ``statistic`` by default."""

    def __init__(self, name: str, doc: str, *, namespace: str = INVOCATION_NAMESPACE, statistic: str = "Average"):
        self.name = name
        self.namespace = namespace
        self.statistic = statistic
        self.__doc__ = f"{doc} (``{name}``). Default: ``{statistic}`` over 1 minute."

    @overload
    def __get__(self, owner: None, owner_type: type) -> VariantMetric: ...
    @overload
    def __get__(self, owner: EndpointMetrics, owner_type: type) -> MetricMethod: ...
    def __get__(self, owner: EndpointMetrics | None, owner_type: type) -> VariantMetric | MetricMethod:
        if owner is None:
            return self
        return functools.partial(owner.metric, self.name, namespace=self.namespace, statistic=self.statistic)


class EndpointMetrics:
    """The ``metric*`` methods of one variant, for a class that has ``metric_endpoint_name`` (the
    endpoint's name as given) and ``variant_name``."""

    metric_endpoint_name: str
    variant_name: str

    def metric(
        self, metric_name: str, *, namespace: str = INVOCATION_NAMESPACE, **options: Unpack[MetricOptions]
    ) -> cloudwatch.Metric:
        """Any metric of this variant. Default: namespace ``AWS/SageMaker``, ``Average`` over 1
        minute (the resolution SageMaker publishes at)."""
        given: dict[str, Any] = {"statistic": "Average", "period": RESOLUTION, **options}
        return cloudwatch.Metric(
            namespace=namespace,
            metric_name=metric_name,
            dimensions_map={"EndpointName": self.metric_endpoint_name, "VariantName": self.variant_name},
            **given,
        )

    # AWS/SageMaker (invocation metrics)
    metric_invocations = VariantMetric("Invocations", "Requests sent to the variant", statistic="Sum")
    metric_invocations_per_instance = VariantMetric("InvocationsPerInstance", "Requests per instance", statistic="Sum")
    metric_invocation_4xx_errors = VariantMetric("Invocation4XXErrors", "Requests answered 4xx", statistic="Sum")
    metric_invocation_5xx_errors = VariantMetric("Invocation5XXErrors", "Requests answered 5xx", statistic="Sum")
    metric_model_latency = VariantMetric("ModelLatency", "Time the container took to answer, in microseconds")
    metric_overhead_latency = VariantMetric("OverheadLatency", "SageMaker's own overhead per request, in microseconds")
    metric_model_loading_wait_time = VariantMetric(
        "ModelLoadingWaitTime", "Time a request waited for its model to be downloaded and loaded, in microseconds"
    )
    metric_model_unloading_time = VariantMetric("ModelUnloadingTime", "Time to unload a model, in microseconds")
    metric_model_downloading_time = VariantMetric("ModelDownloadingTime", "Time to download a model from S3, in microseconds")
    metric_model_loading_time = VariantMetric("ModelLoadingTime", "Time to load a model into Triton, in microseconds")
    metric_model_cache_hit = VariantMetric("ModelCacheHit", "Requests whose model was loaded already; Average is the hit ratio")
    # /aws/sagemaker/Endpoints (instance metrics)
    metric_loaded_model_count = VariantMetric("LoadedModelCount", "Models loaded in the containers", namespace=INSTANCE_NAMESPACE)
    metric_cpu_utilization = VariantMetric("CPUUtilization", "CPU use, 0 to 100 x cores", namespace=INSTANCE_NAMESPACE)
    metric_memory_utilization = VariantMetric("MemoryUtilization", "Memory use in percent", namespace=INSTANCE_NAMESPACE)
    metric_disk_utilization = VariantMetric("DiskUtilization", "Disk use in percent", namespace=INSTANCE_NAMESPACE)
    metric_gpu_utilization = VariantMetric("GPUUtilization", "GPU use, 0 to 100 x GPUs", namespace=INSTANCE_NAMESPACE)
    metric_gpu_memory_utilization = VariantMetric(
        "GPUMemoryUtilization", "GPU memory use, 0 to 100 x GPUs", namespace=INSTANCE_NAMESPACE
    )
