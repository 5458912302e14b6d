"""A CloudWatch dashboard of a Triton multi-model endpoint."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Annotated

from aws_cdk import Aws, Duration
from aws_cdk import aws_cloudwatch as cloudwatch
from pydantic import AfterValidator, Field

from constructs import Construct
from constructs.endpoint_metrics import RESOLUTION
from constructs.props import Props, Resource
from constructs.triton_mme_endpoint import TritonMmeEndpoint

DASHBOARD_NAME_PATTERN = r"^[A-Za-z0-9_-]{1,255}$"
WIDTH = 24


def _dashboard_name(name: str) -> str:
    if not re.fullmatch(DASHBOARD_NAME_PATTERN, name):
        raise ValueError(f"got {name!r}; expected 1 to 255 letters, digits, '-' and '_'")
    return name


class EndpointDashboardProps(Props):
    """Props of :class:`EndpointDashboard`."""

    endpoint: TritonMmeEndpoint = Field(description="The endpoint; its fleet.maximum is drawn on the instance graph.")
    dashboard_name: Annotated[str, AfterValidator(_dashboard_name)] | None = Field(
        default=None,
        description="Name of the CloudWatch dashboard (letters, digits, '-', '_'). Unset: "
        "<endpoint_name>-<region>: stable, and unique per region (dashboards are global).",
    )
    alarms: Sequence[Resource[cloudwatch.IAlarm]] = Field(
        default=(), description="Alarms shown in an alarm-status widget. Empty: no widget."
    )


def _graph(
    title: str,
    width: int,
    metrics: Sequence[cloudwatch.IMetric],
    y: tuple[float | None, float | None] | None = None,
    annotations: Sequence[cloudwatch.HorizontalAnnotation] | None = None,
) -> cloudwatch.GraphWidget:
    """A graph of ``metrics`` on the left axis, from ``y[0]`` to ``y[1]`` when given."""
    return cloudwatch.GraphWidget(
        title=title,
        left=list(metrics),
        left_annotations=list(annotations) if annotations else None,
        left_y_axis=cloudwatch.YAxisProps(min=y[0], max=y[1]) if y else None,
        width=width,
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
        #: The props the dashboard was built from.
        self.props = props
        endpoint = props.endpoint
        #: The dashboard's name.
        self.dashboard_name: str = props.dashboard_name or f"{endpoint.metric_endpoint_name}-{Aws.REGION}"
        rows = [self._title(), self._traffic(), self._instances(), self._models(), self._resources()]
        if props.alarms:
            rows.append([cloudwatch.AlarmStatusWidget(title="Alarms", alarms=list(props.alarms), width=WIDTH)])
        self.dashboard = cloudwatch.Dashboard(
            self, "Resource", dashboard_name=self.dashboard_name, default_interval=Duration.hours(3), widgets=rows
        )

    def _title(self) -> list[cloudwatch.IWidget]:
        e = self.props.endpoint
        return [cloudwatch.TextWidget(
            markdown=(
                f"# Triton multi-model endpoint `{e.metric_endpoint_name}` / `{e.variant_name}`\n"
                "Latencies and model times are in **microseconds**; utilization is 0-100% per GPU/core "
                "(one GPU per instance type)."
            ),
            width=WIDTH,
            height=2,
        )]

    def _traffic(self) -> list[cloudwatch.IWidget]:
        e = self.props.endpoint
        return [
            _graph("Requests and errors (per minute)", 12, [
                e.metric_invocations(label="Invocations"),
                e.metric_invocation_4xx_errors(label="4xx"),
                e.metric_invocation_5xx_errors(label="5xx"),
            ]),
            _graph("Latency (microseconds)", 12, [
                e.metric_model_latency(statistic="p50", label="ModelLatency p50"),
                e.metric_model_latency(statistic="p99", label="ModelLatency p99"),
                e.metric_overhead_latency(statistic="p99", label="OverheadLatency p99"),
            ]),
        ]

    def _instances(self) -> list[cloudwatch.IWidget]:
        e = self.props.endpoint
        instances = cloudwatch.MathExpression(
            expression="invocations / perinstance",
            using_metrics={
                "invocations": e.metric_invocations(),
                "perinstance": e.metric_invocations_per_instance(),
            },
            label="Active instances (Invocations / InvocationsPerInstance)",
            period=RESOLUTION,
        )
        maximum = cloudwatch.HorizontalAnnotation(value=e.fleet.maximum, label="Autoscaling maximum")
        return [
            _graph("Instances (scaling)", 12, [instances], (0, None), [maximum]),
            _graph("Requests per instance (scaling metric)", 12,
                   [e.metric_invocations_per_instance(label="InvocationsPerInstance")]),
        ]

    def _models(self) -> list[cloudwatch.IWidget]:
        e = self.props.endpoint
        return [
            _graph("Loaded models", 8, [
                e.metric_loaded_model_count(label="LoadedModelCount per instance"),
                e.metric_loaded_model_count(statistic="Sum", label="LoadedModelCount total"),
            ]),
            _graph("Model cache hit ratio", 8, [e.metric_model_cache_hit(label="ModelCacheHit")], (0, 1)),
            _graph("Model loading (microseconds)", 8, [
                e.metric_model_loading_wait_time(statistic="p90", label="ModelLoadingWaitTime p90"),
                e.metric_model_downloading_time(label="ModelDownloadingTime"),
                e.metric_model_loading_time(label="ModelLoadingTime"),
                e.metric_model_unloading_time(label="ModelUnloadingTime"),
            ]),
        ]

    def _resources(self) -> list[cloudwatch.IWidget]:
        e = self.props.endpoint
        return [
            _graph("GPU (%)", 8, [
                e.metric_gpu_utilization(label="GPUUtilization avg"),
                e.metric_gpu_utilization(statistic="Maximum", label="GPUUtilization max"),
                e.metric_gpu_memory_utilization(label="GPUMemoryUtilization avg"),
                e.metric_gpu_memory_utilization(statistic="Maximum", label="GPUMemoryUtilization max"),
            ], (0, 100)),
            _graph("CPU and memory (%)", 8, [
                e.metric_cpu_utilization(label="CPUUtilization avg (100 per core)"),
                e.metric_memory_utilization(label="MemoryUtilization avg"),
                e.metric_memory_utilization(statistic="Maximum", label="MemoryUtilization max"),
            ], (0, None)),
            _graph("Disk (%)", 8, [
                e.metric_disk_utilization(label="DiskUtilization avg"),
                e.metric_disk_utilization(statistic="Maximum", label="DiskUtilization max"),
            ], (0, 100)),
        ]
