"""A CloudWatch dashboard of a Triton multi-model endpoint."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated

from aws_cdk import Aws, Duration
from aws_cdk import aws_cloudwatch as cloudwatch
from pydantic import AfterValidator, Field

from constructs import Construct
from triton_mme_cdk.constructs.endpoint_metrics import RESOLUTION, MetricOptions
from triton_mme_cdk.constructs.props import Props, Resource
from triton_mme_cdk.constructs.sagemaker_hosting import SageMakerHosting

DASHBOARD_NAME_PATTERN = r"^[A-Za-z0-9_-]{1,255}$"
WIDTH = 24


def _dashboard_name(name: str) -> str:
    if not re.fullmatch(DASHBOARD_NAME_PATTERN, name):
        raise ValueError(f"got {name!r}; expected 1 to 255 letters, digits, '-' and '_'")
    return name


#: A CloudWatch dashboard name, as the props field checks it.
DashboardName = Annotated[str, AfterValidator(_dashboard_name)]


class EndpointDashboardProps(Props):
    """Props of :class:`EndpointDashboard`."""

    endpoint: SageMakerHosting = Field(description="The endpoint; its fleet.maximum is drawn on the instance graph.")
    dashboard_name: Annotated[str, AfterValidator(_dashboard_name)] | None = Field(
        default=None,
        description="Name of the CloudWatch dashboard (letters, digits, '-', '_'). Unset: "
        "<endpoint_name>-<region>: stable, and unique per region (dashboards are global).",
    )
    alarms: Sequence[Resource[cloudwatch.IAlarm]] = Field(
        default=(), description="Alarms shown in an alarm-status widget. Empty: no widget."
    )


@dataclass(frozen=True)
class _Graph:
    """A graph of the endpoint's metrics: ``(metric_* method, statistic or None for its default,
    label)`` each, on a left axis from ``y[0]`` to ``y[1]`` when given."""

    title: str
    width: int
    metrics: tuple[tuple[str, str | None, str], ...]
    y: tuple[float | None, float | None] | None = None


#: The rows of graphs below the title and above the alarms (the instance row is drawn apart).
_TRAFFIC = (
    _Graph("Requests and errors (per minute)", 12, (
        ("metric_invocations", None, "Invocations"),
        ("metric_invocation_4xx_errors", None, "4xx"),
        ("metric_invocation_5xx_errors", None, "5xx"),
    )),
    _Graph("Latency (microseconds)", 12, (
        ("metric_model_latency", "p50", "ModelLatency p50"),
        ("metric_model_latency", "p99", "ModelLatency p99"),
        ("metric_overhead_latency", "p99", "OverheadLatency p99"),
    )),
)
_MODELS = (
    _Graph("Loaded models", 8, (
        ("metric_loaded_model_count", None, "LoadedModelCount per instance"),
        ("metric_loaded_model_count", "Sum", "LoadedModelCount total"),
    )),
    _Graph("Model cache hit ratio", 8, (("metric_model_cache_hit", None, "ModelCacheHit"),), (0, 1)),
    _Graph("Model loading (microseconds)", 8, (
        ("metric_model_loading_wait_time", "p90", "ModelLoadingWaitTime p90"),
        ("metric_model_downloading_time", None, "ModelDownloadingTime"),
        ("metric_model_loading_time", None, "ModelLoadingTime"),
        ("metric_model_unloading_time", None, "ModelUnloadingTime"),
    )),
)
_RESOURCES = (
    _Graph("GPU (%)", 8, (
        ("metric_gpu_utilization", None, "GPUUtilization avg"),
        ("metric_gpu_utilization", "Maximum", "GPUUtilization max"),
        ("metric_gpu_memory_utilization", None, "GPUMemoryUtilization avg"),
        ("metric_gpu_memory_utilization", "Maximum", "GPUMemoryUtilization max"),
    ), (0, 100)),
    _Graph("CPU and memory (%)", 8, (
        ("metric_cpu_utilization", None, "CPUUtilization avg (100 per core)"),
        ("metric_memory_utilization", None, "MemoryUtilization avg"),
        ("metric_memory_utilization", "Maximum", "MemoryUtilization max"),
    ), (0, None)),
    _Graph("Disk (%)", 8, (
        ("metric_disk_utilization", None, "DiskUtilization avg"),
        ("metric_disk_utilization", "Maximum", "DiskUtilization max"),
    ), (0, 100)),
)


class EndpointDashboard(Construct):
    """One dashboard for the endpoint's variant, every graph from the endpoint's ``metric_*``.

    Rows: requests and errors, latency (p50/p99, microseconds); instances (active instance count
    derived as ``Invocations / InvocationsPerInstance``, with the autoscaling maximum as a line)
    and requests per instance; the multi-model metrics (``LoadedModelCount``, ``ModelCacheHit``,
    ``ModelLoadingWaitTime``, ``ModelDownloadingTime``, ``ModelLoadingTime``,
    ``ModelUnloadingTime``); GPU, GPU memory, CPU, memory and disk use; the alarms' states.
    """

    def __init__(self, scope: Construct, id: str, *, props: EndpointDashboardProps) -> None:
        super().__init__(scope, id)
        #: The endpoint the dashboard graphs.
        self.endpoint: SageMakerHosting = props.endpoint
        endpoint = props.endpoint
        #: The dashboard's name.
        self.dashboard_name: str = props.dashboard_name or f"{endpoint.metric_endpoint_name}-{Aws.REGION}"
        title = cloudwatch.TextWidget(
            markdown=(
                f"# Triton multi-model endpoint `{endpoint.metric_endpoint_name}` / `{endpoint.variant_name}`\n"
                "Latencies and model times are in **microseconds**; utilization is 0-100% per GPU/core "
                "(one GPU per instance type)."
            ),
            width=WIDTH,
            height=2,
        )
        rows: list[list[cloudwatch.IWidget]] = [
            [title], self._graphs(_TRAFFIC), self._instances(), self._graphs(_MODELS), self._graphs(_RESOURCES)
        ]
        if props.alarms:
            rows.append([cloudwatch.AlarmStatusWidget(title="Alarms", alarms=list(props.alarms), width=WIDTH)])
        self.dashboard = cloudwatch.Dashboard(
            self, "Resource", dashboard_name=self.dashboard_name, default_interval=Duration.hours(3), widgets=rows
        )

    def _graphs(self, graphs: tuple[_Graph, ...]) -> list[cloudwatch.IWidget]:
        return [self._graph(graph) for graph in graphs]

    def _graph(self, graph: _Graph, annotations: list[cloudwatch.HorizontalAnnotation] | None = None) -> cloudwatch.IWidget:
        endpoint = self.endpoint
        metrics: list[cloudwatch.IMetric] = []
        for method, statistic, label in graph.metrics:
            options: MetricOptions = {"label": label} if statistic is None else {"label": label, "statistic": statistic}
            metrics.append(getattr(endpoint, method)(**options))
        return cloudwatch.GraphWidget(
            title=graph.title,
            left=metrics,
            left_annotations=annotations,
            left_y_axis=cloudwatch.YAxisProps(min=graph.y[0], max=graph.y[1]) if graph.y else None,
            width=graph.width,
        )

    def _instances(self) -> list[cloudwatch.IWidget]:
        """The active instance count (``Invocations / InvocationsPerInstance``) under the autoscaling
        maximum, and the scaling metric."""
        endpoint = self.endpoint
        instances = cloudwatch.MathExpression(
            expression="invocations / perinstance",
            using_metrics={
                "invocations": endpoint.metric_invocations(),
                "perinstance": endpoint.metric_invocations_per_instance(),
            },
            label="Active instances (Invocations / InvocationsPerInstance)",
            period=RESOLUTION,
        )
        maximum = cloudwatch.HorizontalAnnotation(value=endpoint.fleet.maximum, label="Autoscaling maximum")
        return [
            cloudwatch.GraphWidget(
                title="Instances (scaling)", left=[instances], left_annotations=[maximum],
                left_y_axis=cloudwatch.YAxisProps(min=0), width=12,
            ),
            self._graph(_Graph("Requests per instance (scaling metric)", 12,
                               (("metric_invocations_per_instance", None, "InvocationsPerInstance"),))),
        ]
