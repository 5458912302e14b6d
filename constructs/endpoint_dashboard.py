"""A CloudWatch dashboard of a Triton multi-model endpoint."""

from __future__ import annotations

import re
from collections.abc import Sequence

from aws_cdk import Duration, Token
from aws_cdk import aws_cloudwatch as cloudwatch

from constructs import Construct
from constructs.sagemaker_limits import PropsError, check_range
from constructs.triton_mme_endpoint import TritonMmeEndpoint

DASHBOARD_NAME_PATTERN = r"^[A-Za-z0-9_-]{1,255}$"
WIDTH = 24


def check_dashboard_name(prop: str, name: str) -> None:
    """A CloudWatch dashboard name: 1 to 255 letters, digits, '-' and '_' (tokens pass)."""
    if Token.is_unresolved(name):
        return
    if not re.fullmatch(DASHBOARD_NAME_PATTERN, name):
        raise PropsError(f"{prop}: got {name!r}; expected 1 to 255 letters, digits, '-' and '_'")


class EndpointDashboard(Construct):
    """One dashboard for the endpoint's variant, every graph from the endpoint's ``metric_*``.

    Rows: requests and errors, latency (p50/p99, microseconds); instances (active instance count
    derived as ``Invocations / InvocationsPerInstance``, with the autoscaling maximum as a line)
    and requests per instance; the multi-model metrics (``LoadedModelCount``, ``ModelCacheHit``,
    ``ModelLoadingWaitTime``, ``ModelDownloadingTime``, ``ModelLoadingTime``,
    ``ModelUnloadingTime``); GPU, GPU memory, CPU, memory and disk use; the alarms' states.

    :param endpoint: the endpoint.
    :param dashboard_name: a stable name (1 to 255 letters, digits, '-', '_'; tokens allowed).
        Dashboards are global to the account, so include the region when the same endpoint name
        is deployed in several regions.
    :param max_instance_count: drawn as a line on the instance graph.
    :param alarms: shown in an alarm-status widget. Default: none (no widget).
    """

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        endpoint: TritonMmeEndpoint,
        dashboard_name: str,
        max_instance_count: int,
        alarms: Sequence[cloudwatch.IAlarm] = (),
    ) -> None:
        super().__init__(scope, id)
        check_dashboard_name("dashboard_name", dashboard_name)
        check_range("max_instance_count", max_instance_count, 1, 10_000)
        e = endpoint
        minute = Duration.minutes(1)

        def labelled(metric: cloudwatch.Metric, label: str) -> cloudwatch.Metric:
            return metric.with_(label=label)

        instances = cloudwatch.MathExpression(
            expression="invocations / perinstance",
            using_metrics={
                "invocations": e.metric_invocations(statistic="Sum", period=minute),
                "perinstance": e.metric_invocations_per_instance(statistic="Sum", period=minute),
            },
            label="Active instances (Invocations / InvocationsPerInstance)",
            period=minute,
        )
        rows: list[list[cloudwatch.IWidget]] = [
            [
                cloudwatch.TextWidget(
                    markdown=(
                        f"# Triton multi-model endpoint `{e.metric_endpoint_name}` / `{e.variant_name}`\n"
                        "Latencies and model times are in **microseconds**; utilization is 0-100% per "
                        "GPU/core (one GPU per instance type)."
                    ),
                    width=WIDTH,
                    height=2,
                )
            ],
            [
                cloudwatch.GraphWidget(
                    title="Requests and errors (per minute)",
                    left=[
                        labelled(e.metric_invocations(), "Invocations"),
                        labelled(e.metric_invocation_4xx_errors(), "4xx"),
                        labelled(e.metric_invocation_5xx_errors(), "5xx"),
                    ],
                    width=12,
                ),
                cloudwatch.GraphWidget(
                    title="Latency (microseconds)",
                    left=[
                        labelled(e.metric_model_latency(statistic="p50"), "ModelLatency p50"),
                        labelled(e.metric_model_latency(statistic="p99"), "ModelLatency p99"),
                        labelled(e.metric_overhead_latency(statistic="p99"), "OverheadLatency p99"),
                    ],
                    width=12,
                ),
            ],
            [
                cloudwatch.GraphWidget(
                    title="Instances (scaling)",
                    left=[instances],
                    left_annotations=[
                        cloudwatch.HorizontalAnnotation(
                            value=max_instance_count, label="Autoscaling maximum"
                        )
                    ],
                    left_y_axis=cloudwatch.YAxisProps(min=0),
                    width=12,
                ),
                cloudwatch.GraphWidget(
                    title="Requests per instance (scaling metric)",
                    left=[labelled(e.metric_invocations_per_instance(), "InvocationsPerInstance")],
                    width=12,
                ),
            ],
            [
                cloudwatch.GraphWidget(
                    title="Loaded models",
                    left=[
                        labelled(e.metric_loaded_model_count(statistic="Average"), "LoadedModelCount per instance"),
                        labelled(e.metric_loaded_model_count(statistic="Sum"), "LoadedModelCount total"),
                    ],
                    width=8,
                ),
                cloudwatch.GraphWidget(
                    title="Model cache hit ratio",
                    left=[labelled(e.metric_model_cache_hit(statistic="Average"), "ModelCacheHit")],
                    left_y_axis=cloudwatch.YAxisProps(min=0, max=1),
                    width=8,
                ),
                cloudwatch.GraphWidget(
                    title="Model loading (microseconds)",
                    left=[
                        labelled(e.metric_model_loading_wait_time(statistic="p90"), "ModelLoadingWaitTime p90"),
                        labelled(e.metric_model_downloading_time(), "ModelDownloadingTime"),
                        labelled(e.metric_model_loading_time(), "ModelLoadingTime"),
                        labelled(e.metric_model_unloading_time(), "ModelUnloadingTime"),
                    ],
                    width=8,
                ),
            ],
            [
                cloudwatch.GraphWidget(
                    title="GPU (%)",
                    left=[
                        labelled(e.metric_gpu_utilization(), "GPUUtilization avg"),
                        labelled(e.metric_gpu_utilization(statistic="Maximum"), "GPUUtilization max"),
                        labelled(e.metric_gpu_memory_utilization(), "GPUMemoryUtilization avg"),
                        labelled(e.metric_gpu_memory_utilization(statistic="Maximum"), "GPUMemoryUtilization max"),
                    ],
                    left_y_axis=cloudwatch.YAxisProps(min=0, max=100),
                    width=8,
                ),
                cloudwatch.GraphWidget(
                    title="CPU and memory (%)",
                    left=[
                        labelled(e.metric_cpu_utilization(), "CPUUtilization avg (100 per core)"),
                        labelled(e.metric_memory_utilization(), "MemoryUtilization avg"),
                        labelled(e.metric_memory_utilization(statistic="Maximum"), "MemoryUtilization max"),
                    ],
                    left_y_axis=cloudwatch.YAxisProps(min=0),
                    width=8,
                ),
                cloudwatch.GraphWidget(
                    title="Disk (%)",
                    left=[
                        labelled(e.metric_disk_utilization(), "DiskUtilization avg"),
                        labelled(e.metric_disk_utilization(statistic="Maximum"), "DiskUtilization max"),
                    ],
                    left_y_axis=cloudwatch.YAxisProps(min=0, max=100),
                    width=8,
                ),
            ],
        ]
        if alarms:
            rows.append([cloudwatch.AlarmStatusWidget(title="Alarms", alarms=list(alarms), width=WIDTH)])
        self.dashboard = cloudwatch.Dashboard(
            self,
            "Resource",
            dashboard_name=dashboard_name,
            default_interval=Duration.hours(3),
            widgets=rows,
        )
        #: The dashboard's name.
        self.dashboard_name: str = dashboard_name
