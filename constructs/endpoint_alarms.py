"""CloudWatch alarms on a Triton multi-model endpoint: errors, latency, model loading, GPU and disk.

Every alarm watches one production variant (dimensions ``EndpointName`` and ``VariantName``) at
the 1-minute resolution SageMaker publishes at. The thresholds come from :class:`AlarmThresholds`;
each default is explained there. ``treat_missing_data`` is chosen per metric family:

- Invocation metrics (``AWS/SageMaker``: errors, ``ModelLatency``, ``ModelLoadingWaitTime``) are
  published only when requests arrive: no data means no traffic, which is neither an error nor a
  slow request, so missing data is ``NOT_BREACHING``. This also keeps these alarms OK (not
  INSUFFICIENT_DATA) before and during a quiet deployment, as SageMaker's rollback monitoring
  needs.
- Instance metrics (``/aws/sagemaker/Endpoints``: GPU memory, disk) are published every minute by
  every instance: a gap means the instances stopped reporting, which should show, so missing data
  is ``MISSING`` (the alarm goes to INSUFFICIENT_DATA instead of pretending all is well).
- The saturation alarm needs traffic to tell the instance count, so it is ``NOT_BREACHING``.

Saturation ("GPU pinned at the top while the fleet is at its maximum") is one metric-math alarm,
not a composite alarm. SageMaker publishes no instance-count metric for an endpoint, but each
request adds ``1/<active instances>`` to ``InvocationsPerInstance`` and 1 to ``Invocations``, so
``Invocations / InvocationsPerInstance`` over a minute is the number of active instances. The
expression ``IF(gpu >= threshold AND instances >= max - 0.5, 1, 0)`` is then one series: both
conditions are evaluated on the same minute, it is a metric alarm (usable anywhere one is: a
rollback list, ``DescribeAlarms`` without ``AlarmTypes``), and there are no sub-alarms that would
notify on their own. The documented GPU multi-model instance types have one GPU each, so the
variant's average ``GPUUtilization`` is 0 to 100.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from aws_cdk import Duration, Token
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_cloudwatch_actions as cloudwatch_actions
from aws_cdk import aws_sns as sns

from constructs import Construct
from constructs.sagemaker_limits import ALARM_NAME_MAX_LENGTH, PropsError, check_range
from constructs.triton_mme_endpoint import TritonMmeEndpoint

#: The alarms, by key (the keys of ``mme:rollback_alarms``), in dashboard order.
ALARM_KEYS: tuple[str, ...] = (
    "invocation_5xx_errors",
    "invocation_4xx_rate",
    "model_latency_p99",
    "model_loading_wait_p90",
    "gpu_memory",
    "disk",
    "gpu_saturation",
)
#: The alarms a rollout watches by default: the ones a bad release moves at once. Model loading
#: waits are left out on purpose: a new fleet starts with an empty model cache, so every model is
#: loaded again during a deployment; instance-resource alarms watch slower trends.
DEFAULT_ROLLBACK_ALARMS: tuple[str, ...] = ("invocation_5xx_errors", "invocation_4xx_rate", "model_latency_p99")
MICROSECONDS_PER_MILLISECOND = 1000


@dataclass(frozen=True)
class AlarmThresholds:
    """Thresholds of the endpoint alarms, each with the reason for its default.

    :param invocation_5xx_errors: 5xx responses per minute above which a minute counts as bad;
        the alarm fires on 3 bad minutes out of 5. Default 0: any 5xx (a container error, a model
        that fails to load, an out-of-memory answer) is worth a look, and 3 of 5 minutes ignores a
        single blip.
    :param invocation_4xx_rate_percent: share of requests answered 4xx (the ``Average`` of
        ``Invocation4XXErrors``, which is 1 per 4xx response and 0 otherwise) above which a minute
        is bad; 5 bad minutes in a row fire. Default 5%: clients asking for a model that is not in
        the release, or sending malformed tensors; a few are normal, a sustained 5% is not.
    :param model_latency_p99_ms: latency budget of ``ModelLatency`` p99 in milliseconds (the
        metric is in microseconds: the threshold is this x 1000); 5 minutes in a row above it
        fire. Default 1000 ms: an interactive budget for embedding and vision models on one GPU.
    :param model_loading_wait_p90_ms: ``ModelLoadingWaitTime`` p90 in milliseconds over 5-minute
        periods, 3 in a row. Default 10000 ms: a cold ONNX model loads in seconds; a p90 wait
        above 10 s means models are evicted and reloaded (too many for the instances' memory) or
        downloads are slow.
    :param gpu_memory_percent: ``GPUMemoryUtilization`` of the busiest instance (``Maximum``) over
        5-minute periods, 3 in a row. Default 90%: above it Triton answers loads with
        out-of-memory (507) and SageMaker starts evicting models.
    :param disk_percent: ``DiskUtilization`` of the fullest instance, 5-minute periods, 3 in a
        row. Default 85%: the instance store caches the downloaded models; near full, downloads
        fail or thrash.
    :param gpu_saturation_percent: average ``GPUUtilization`` at or above which the fleet counts
        as pinned; the alarm fires when that holds while the variant runs its maximum instance
        count for 15 minutes in a row. Default 90% (the GPU scaling target defaults to 60%):
        autoscaling can add nothing more, so raise the maximum or the instance type.
    """

    invocation_5xx_errors: float = 0
    invocation_4xx_rate_percent: float = 5
    model_latency_p99_ms: float = 1000
    model_loading_wait_p90_ms: float = 10_000
    gpu_memory_percent: float = 90
    disk_percent: float = 85
    gpu_saturation_percent: float = 90

    def check(self) -> None:
        """Raise :class:`PropsError` for a threshold out of its range."""
        check_range("invocation_5xx_errors", self.invocation_5xx_errors, 0, 1e12)
        for prop in ("invocation_4xx_rate_percent", "gpu_memory_percent", "disk_percent", "gpu_saturation_percent"):
            value = getattr(self, prop)
            if not 0 < value <= 100:
                raise PropsError(f"{prop}: got {value:g}; expected a percentage above 0 and at most 100")
        for prop in ("model_latency_p99_ms", "model_loading_wait_p90_ms"):
            value = getattr(self, prop)
            if not 0 < value <= 3_600_000:
                raise PropsError(f"{prop}: got {value:g} ms; expected above 0 and at most 3600000 ms")


class EndpointAlarms(Construct):
    """The endpoint's alarms (see the module documentation), optionally notifying an SNS topic.

    Alarm names are ``<name_prefix>-<key with hyphens>`` (for example
    ``triton-mme-invocation-5xx-errors``): readable in notifications and stable across updates.

    :param endpoint: the endpoint; its ``metric_*`` methods give every metric.
    :param max_instance_count: the variant's autoscaling maximum (the saturation alarm compares
        the active instance count with it).
    :param thresholds: Default: :class:`AlarmThresholds` defaults.
    :param topic: SNS topic notified when an alarm goes to ALARM and back to OK. Default: none.
    :param name_prefix: prefix of the alarm names. Default: the endpoint's name.
    """

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        endpoint: TritonMmeEndpoint,
        max_instance_count: int,
        thresholds: AlarmThresholds | None = None,
        topic: sns.ITopic | None = None,
        name_prefix: str | None = None,
    ) -> None:
        super().__init__(scope, id)
        limits = thresholds or AlarmThresholds()
        limits.check()
        check_range("max_instance_count", max_instance_count, 1, 10_000)
        prefix = name_prefix if name_prefix is not None else endpoint.metric_endpoint_name
        if not Token.is_unresolved(prefix) and (
            not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", prefix)
            or len(prefix) + 1 + max(len(key) for key in ALARM_KEYS) > ALARM_NAME_MAX_LENGTH
        ):
            raise PropsError(
                f"name_prefix: got {prefix!r}; expected letters, digits, '_', '.' and '-', short "
                f"enough for alarm names of at most {ALARM_NAME_MAX_LENGTH} characters"
            )
        self._prefix = prefix
        minute = Duration.minutes(1)
        five_minutes = Duration.minutes(5)
        variant = f"{endpoint.metric_endpoint_name}/{endpoint.variant_name}"

        #: The alarms by key (:data:`ALARM_KEYS`).
        self.alarms: dict[str, cloudwatch.Alarm] = {}

        self._add(
            "invocation_5xx_errors",
            endpoint.metric_invocation_5xx_errors(statistic="Sum", period=minute),
            threshold=limits.invocation_5xx_errors,
            evaluation_periods=5,
            datapoints_to_alarm=3,
            missing=cloudwatch.TreatMissingData.NOT_BREACHING,
            description=(
                f"{variant}: more than {limits.invocation_5xx_errors:g} 5xx responses a minute in 3 of "
                "the last 5 minutes. Check the endpoint's container logs (Triton load/inference "
                "errors, out-of-memory 507s)."
            ),
        )
        self._add(
            "invocation_4xx_rate",
            endpoint.metric_invocation_4xx_errors(statistic="Average", period=minute),
            threshold=limits.invocation_4xx_rate_percent / 100,
            evaluation_periods=5,
            datapoints_to_alarm=5,
            missing=cloudwatch.TreatMissingData.NOT_BREACHING,
            description=(
                f"{variant}: more than {limits.invocation_4xx_rate_percent:g}% of requests answered "
                "4xx for 5 minutes (Average of Invocation4XXErrors is the 4xx share). Clients ask "
                "for models not in the served release, or send bad inputs."
            ),
        )
        self._add(
            "model_latency_p99",
            endpoint.metric_model_latency(statistic="p99", period=minute),
            threshold=limits.model_latency_p99_ms * MICROSECONDS_PER_MILLISECOND,
            evaluation_periods=5,
            datapoints_to_alarm=5,
            missing=cloudwatch.TreatMissingData.NOT_BREACHING,
            description=(
                f"{variant}: ModelLatency p99 above the {limits.model_latency_p99_ms:g} ms budget "
                f"({limits.model_latency_p99_ms * MICROSECONDS_PER_MILLISECOND:,.0f} microseconds) for 5 "
                "minutes."
            ),
        )
        self._add(
            "model_loading_wait_p90",
            endpoint.metric_model_loading_wait_time(statistic="p90", period=five_minutes),
            threshold=limits.model_loading_wait_p90_ms * MICROSECONDS_PER_MILLISECOND,
            evaluation_periods=3,
            datapoints_to_alarm=3,
            missing=cloudwatch.TreatMissingData.NOT_BREACHING,
            description=(
                f"{variant}: ModelLoadingWaitTime p90 above {limits.model_loading_wait_p90_ms:g} ms for "
                "15 minutes: models are evicted and reloaded (too many for the instances' memory) "
                "or downloads are slow. Compare ModelCacheHit and LoadedModelCount."
            ),
        )
        self._add(
            "gpu_memory",
            endpoint.metric_gpu_memory_utilization(statistic="Maximum", period=five_minutes),
            threshold=limits.gpu_memory_percent,
            evaluation_periods=3,
            datapoints_to_alarm=3,
            missing=cloudwatch.TreatMissingData.MISSING,
            description=(
                f"{variant}: GPUMemoryUtilization of the busiest instance above "
                f"{limits.gpu_memory_percent:g}% for 15 minutes; loads may fail with out-of-memory "
                "(507) and models get evicted."
            ),
        )
        self._add(
            "disk",
            endpoint.metric_disk_utilization(statistic="Maximum", period=five_minutes),
            threshold=limits.disk_percent,
            evaluation_periods=3,
            datapoints_to_alarm=3,
            missing=cloudwatch.TreatMissingData.MISSING,
            description=(
                f"{variant}: DiskUtilization of the fullest instance above {limits.disk_percent:g}% "
                "for 15 minutes; the model cache on the instance store is nearly full."
            ),
        )
        saturation = cloudwatch.MathExpression(
            expression=(
                f"IF(gpu >= {limits.gpu_saturation_percent:g} AND "
                f"(invocations / perinstance) >= {max_instance_count - 0.5:g}, 1, 0)"
            ),
            using_metrics={
                "gpu": endpoint.metric_gpu_utilization(statistic="Average", period=minute),
                "invocations": endpoint.metric_invocations(statistic="Sum", period=minute),
                "perinstance": endpoint.metric_invocations_per_instance(statistic="Sum", period=minute),
            },
            label="1 when GPU is pinned at maximum capacity",
            period=minute,
        )
        self._add(
            "gpu_saturation",
            saturation,
            threshold=1,
            evaluation_periods=15,
            datapoints_to_alarm=15,
            missing=cloudwatch.TreatMissingData.NOT_BREACHING,
            comparison=cloudwatch.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
            description=(
                f"{variant}: average GPUUtilization at or above {limits.gpu_saturation_percent:g}% "
                f"while the variant runs its maximum of {max_instance_count} instances "
                "(Invocations / InvocationsPerInstance) for 15 minutes: autoscaling cannot add "
                "capacity. Raise the maximum instance count or the instance type."
            ),
        )

        if topic is not None:
            action = cloudwatch_actions.SnsAction(topic)
            for alarm in self.alarms.values():
                alarm.add_alarm_action(action)
                alarm.add_ok_action(action)
        #: The topic the alarms notify, if any.
        self.topic = topic

    def _add(
        self,
        key: str,
        metric: cloudwatch.IMetric,
        *,
        threshold: float,
        evaluation_periods: int,
        datapoints_to_alarm: int,
        missing: cloudwatch.TreatMissingData,
        description: str,
        comparison: cloudwatch.ComparisonOperator = cloudwatch.ComparisonOperator.GREATER_THAN_THRESHOLD,
    ) -> None:
        construct_id = "".join(part.capitalize() for part in key.split("_"))
        self.alarms[key] = cloudwatch.Alarm(
            self,
            construct_id,
            alarm_name=f"{self._prefix}-{key.replace('_', '-')}",
            alarm_description=description,
            metric=metric,
            threshold=threshold,
            evaluation_periods=evaluation_periods,
            datapoints_to_alarm=datapoints_to_alarm,
            comparison_operator=comparison,
            treat_missing_data=missing,
        )

    def select(self, keys: Sequence[str]) -> list[cloudwatch.Alarm]:
        """The alarms of ``keys``, in that order; an unknown key raises :class:`PropsError`."""
        unknown = [key for key in keys if key not in self.alarms]
        if unknown:
            raise PropsError(
                f"rollback_alarms: unknown {', '.join(map(repr, unknown))}; expected some of "
                + ", ".join(ALARM_KEYS)
            )
        return [self.alarms[key] for key in keys]
