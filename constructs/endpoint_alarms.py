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
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, Literal, get_args

from aws_cdk import Duration
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_cloudwatch_actions as cloudwatch_actions
from aws_cdk import aws_sns as sns
from pydantic import AfterValidator, Field

from constructs import Construct
from triton_mme_cdk.constructs.props import Props, Resource, unique
from triton_mme_cdk.constructs.sagemaker_hosting import SageMakerHosting
from triton_mme_cdk.constructs.sagemaker_limits import ALARM_NAME_MAX_LENGTH

#: The alarms, by key (the keys of ``mme:rollback_alarms``), in dashboard order.
AlarmKey = Literal[
    "invocation_5xx_errors",
    "invocation_4xx_rate",
    "model_latency_p99",
    "model_loading_wait_p90",
    "gpu_memory",
    "disk",
    "gpu_saturation",
]
ALARM_KEYS: tuple[str, ...] = get_args(AlarmKey)
#: The alarms a rollout watches by default: the ones a bad release moves at once. Model loading
#: waits are left out on purpose: a new fleet starts with an empty model cache, so every model is
#: loaded again during a deployment; instance-resource alarms watch slower trends.
DEFAULT_ROLLBACK_ALARMS: tuple[AlarmKey, ...] = ("invocation_5xx_errors", "invocation_4xx_rate", "model_latency_p99")
MICROSECONDS_PER_MILLISECOND = 1000
MINUTE = Duration.minutes(1)
FIVE_MINUTES = Duration.minutes(5)

#: A share of requests or of a resource, in percent.
Percent = Annotated[float, Field(gt=0, le=100)]
#: A latency budget in milliseconds (at most an hour).
Milliseconds = Annotated[float, Field(gt=0, le=3_600_000)]


def _name_prefix(prefix: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", prefix) or (
        len(prefix) + 1 + max(len(key) for key in ALARM_KEYS) > ALARM_NAME_MAX_LENGTH
    ):
        raise ValueError(
            f"got {prefix!r}; expected letters, digits, '_', '.' and '-', short enough for alarm names "
            f"of at most {ALARM_NAME_MAX_LENGTH} characters"
        )
    return prefix


def _threshold(default: float, description: str) -> Any:
    """One alarm's threshold field: its default and why (its bounds are its type's)."""
    return Field(default=default, description=description)


class AlarmThresholds(Props):
    """Thresholds of the endpoint alarms, one row per alarm, each with the reason for its default."""

    # fmt: off
    invocation_5xx_errors: Annotated[float, Field(ge=0, le=1e12)] = _threshold(0, "Invocation5XXErrors per minute (Sum) above which a minute is bad; the alarm fires on 3 bad minutes of 5. 0: any 5xx counts (a container or model failure), 3 of 5 ignores a single blip.")
    invocation_4xx_rate_percent: Percent = _threshold(5, "Share of requests answered 4xx (Average of Invocation4XXErrors, 1 per 4xx and 0 otherwise) above which a minute is bad; 5 bad minutes in a row fire. A few 4xx are normal client mistakes, a sustained 5% is not.")
    model_latency_p99_ms: Milliseconds = _threshold(1_000, "Latency budget of ModelLatency p99 in milliseconds (the alarm threshold is this x 1000 microseconds); 5 minutes in a row above it fire.")
    model_loading_wait_p90_ms: Milliseconds = _threshold(10_000, "ModelLoadingWaitTime p90 in milliseconds over 5-minute periods, 3 in a row: models evicted and reloaded (too many for the instances) or slow downloads.")
    gpu_memory_percent: Percent = _threshold(90, "GPUMemoryUtilization of the busiest instance (Maximum, 5-minute periods, 3 in a row); above 90% loads risk out-of-memory (507) and evictions.")
    disk_percent: Percent = _threshold(85, "DiskUtilization of the fullest instance (Maximum, 5-minute periods, 3 in a row); the instance store caches the models.")
    gpu_saturation_percent: Percent = _threshold(90, "Average GPUUtilization at or above which the fleet counts as pinned; the saturation alarm fires when that holds for 15 minutes while the variant runs fleet.maximum instances (Invocations / InvocationsPerInstance): autoscaling can add nothing more.")
    # fmt: on


class EndpointAlarmsProps(Props):
    """Props of :class:`EndpointAlarms`."""

    endpoint: SageMakerHosting = Field(
        description="The endpoint: its metric_* methods give every metric; the saturation alarm "
        "compares the active instance count with its fleet.maximum."
    )
    thresholds: AlarmThresholds = Field(default_factory=lambda: AlarmThresholds(), description="The thresholds.")
    topic: Resource[sns.ITopic] | None = Field(
        default=None, description="SNS topic notified when an alarm goes to ALARM and back to OK. Unset: none."
    )
    name_prefix: Annotated[str, AfterValidator(_name_prefix)] | None = Field(
        default=None, description="Prefix of the alarm names. Unset: the endpoint's name."
    )
    rollback_alarms: Annotated[list[AlarmKey], AfterValidator(unique)] = Field(
        default_factory=lambda: list(DEFAULT_ROLLBACK_ALARMS),
        description="Alarms (by key) whose ALARM state rolls an update back: invocation_5xx_errors, "
        "invocation_4xx_rate, model_latency_p99, model_loading_wait_p90, gpu_memory, disk, "
        "gpu_saturation. The default leaves model loading out (a new fleet reloads every model). "
        "Empty: no automatic rollback.",
    )


@dataclass(frozen=True)
class _Alarm:
    """How one alarm is built from its threshold setting (``setting``, a field of
    :class:`AlarmThresholds`): the endpoint's ``metric`` method with ``statistic`` over ``period``
    (``None``: the saturation expression), the threshold made of the setting, ``(evaluation
    periods, datapoints to alarm)`` and missing data."""

    setting: str
    metric: str | None
    statistic: str
    period: Duration
    threshold: Callable[[float], float]
    periods: tuple[int, int]
    missing: cloudwatch.TreatMissingData
    comparison: cloudwatch.ComparisonOperator = cloudwatch.ComparisonOperator.GREATER_THAN_THRESHOLD


def _microseconds(milliseconds: float) -> float:
    return milliseconds * MICROSECONDS_PER_MILLISECOND


def _share(percent: float) -> float:
    return percent / 100


def _saturation(endpoint: SageMakerHosting, percent: float) -> cloudwatch.IMetric:
    """1 in a minute when the GPU is at ``percent`` or more while the variant runs its maximum
    number of instances (see the module documentation)."""
    most = endpoint.fleet.maximum
    return cloudwatch.MathExpression(
        expression=f"IF(gpu >= {percent:g} AND (invocations / perinstance) >= {most - 0.5:g}, 1, 0)",
        using_metrics={
            "gpu": endpoint.metric_gpu_utilization(period=MINUTE),
            "invocations": endpoint.metric_invocations(period=MINUTE),
            "perinstance": endpoint.metric_invocations_per_instance(period=MINUTE),
        },
        label="1 when GPU is pinned at maximum capacity",
        period=MINUTE,
    )


_SAME, _ONE = float, (lambda _: 1)
_NO_TRAFFIC_IS_FINE, _SILENCE_SHOWS = cloudwatch.TreatMissingData.NOT_BREACHING, cloudwatch.TreatMissingData.MISSING
_AT_LEAST = cloudwatch.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD
# fmt: off
_ALARMS: dict[AlarmKey, _Alarm] = {
    "invocation_5xx_errors": _Alarm("invocation_5xx_errors", "metric_invocation_5xx_errors", "Sum", MINUTE, _SAME, (5, 3), _NO_TRAFFIC_IS_FINE),
    "invocation_4xx_rate": _Alarm("invocation_4xx_rate_percent", "metric_invocation_4xx_errors", "Average", MINUTE, _share, (5, 5), _NO_TRAFFIC_IS_FINE),
    "model_latency_p99": _Alarm("model_latency_p99_ms", "metric_model_latency", "p99", MINUTE, _microseconds, (5, 5), _NO_TRAFFIC_IS_FINE),
    "model_loading_wait_p90": _Alarm("model_loading_wait_p90_ms", "metric_model_loading_wait_time", "p90", FIVE_MINUTES, _microseconds, (3, 3), _NO_TRAFFIC_IS_FINE),
    "gpu_memory": _Alarm("gpu_memory_percent", "metric_gpu_memory_utilization", "Maximum", FIVE_MINUTES, _SAME, (3, 3), _SILENCE_SHOWS),
    "disk": _Alarm("disk_percent", "metric_disk_utilization", "Maximum", FIVE_MINUTES, _SAME, (3, 3), _SILENCE_SHOWS),
    # A series of 1 and 0 (see _saturation): it alarms at 1.
    "gpu_saturation": _Alarm("gpu_saturation_percent", None, "Average", MINUTE, _ONE, (15, 15), _NO_TRAFFIC_IS_FINE, _AT_LEAST),
}
#: Each alarm's description, formatted with ``variant``, ``value`` (its threshold setting),
#: ``micro`` (``value`` milliseconds in microseconds) and ``max`` (the fleet's maximum).
_DESCRIPTIONS: dict[AlarmKey, str] = {
    "invocation_5xx_errors": "{variant}: more than {value:g} 5xx responses a minute in 3 of the last 5 minutes. Check the endpoint's container logs (Triton load/inference errors, out-of-memory 507s).",
    "invocation_4xx_rate": "{variant}: more than {value:g}% of requests answered 4xx for 5 minutes (Average of Invocation4XXErrors is the 4xx share). Clients ask for models not in the served release, or send bad inputs.",
    "model_latency_p99": "{variant}: ModelLatency p99 above the {value:g} ms budget ({micro:,.0f} microseconds) for 5 minutes.",
    "model_loading_wait_p90": "{variant}: ModelLoadingWaitTime p90 above {value:g} ms for 15 minutes: models are evicted and reloaded (too many for the instances' memory) or downloads are slow. Compare ModelCacheHit and LoadedModelCount.",
    "gpu_memory": "{variant}: GPUMemoryUtilization of the busiest instance above {value:g}% for 15 minutes; loads may fail with out-of-memory (507) and models get evicted.",
    "disk": "{variant}: DiskUtilization of the fullest instance above {value:g}% for 15 minutes; the model cache on the instance store is nearly full.",
    "gpu_saturation": "{variant}: average GPUUtilization at or above {value:g}% while the variant runs its maximum of {max} instances (Invocations / InvocationsPerInstance) for 15 minutes: autoscaling cannot add capacity. Raise the maximum instance count or the instance type.",
}
# fmt: on


class EndpointAlarms(Construct):
    """The endpoint's alarms (see the module documentation), optionally notifying an SNS topic.

    Alarm names are ``<name_prefix>-<key with hyphens>`` (for example
    ``triton-mme-invocation-5xx-errors``): readable in notifications and stable across updates.
    """

    def __init__(self, scope: Construct, id: str, *, props: EndpointAlarmsProps) -> None:
        super().__init__(scope, id)
        endpoint = props.endpoint
        self._prefix = props.name_prefix if props.name_prefix is not None else endpoint.metric_endpoint_name
        self._variant = f"{endpoint.metric_endpoint_name}/{endpoint.variant_name}"
        #: The alarms by key (:data:`ALARM_KEYS`).
        self.alarms: dict[str, cloudwatch.Alarm] = {}
        for key, alarm in _ALARMS.items():
            value = getattr(props.thresholds, alarm.setting)
            metric = (
                _saturation(endpoint, value)
                if alarm.metric is None
                else getattr(endpoint, alarm.metric)(statistic=alarm.statistic, period=alarm.period)
            )
            description = _DESCRIPTIONS[key].format(
                variant=self._variant, value=value, micro=_microseconds(value), max=endpoint.fleet.maximum
            )
            self._add(key, alarm, metric, alarm.threshold(value), description)
        #: The alarms whose ALARM state rolls an update back (``props.rollback_alarms``), in that order.
        self.rollback_alarms: list[cloudwatch.Alarm] = [self.alarms[key] for key in props.rollback_alarms]
        if props.topic is not None:
            action = cloudwatch_actions.SnsAction(props.topic)
            for each in self.alarms.values():
                each.add_alarm_action(action)
                each.add_ok_action(action)
        #: The topic the alarms notify, if any.
        self.topic = props.topic

    def _add(self, key: str, alarm: _Alarm, metric: cloudwatch.IMetric, threshold: float, description: str) -> None:
        construct_id = "".join(part.capitalize() for part in key.split("_"))
        self.alarms[key] = cloudwatch.Alarm(
            self,
            construct_id,
            alarm_name=f"{self._prefix}-{key.replace('_', '-')}",
            alarm_description=description,
            metric=metric,
            threshold=threshold,
            evaluation_periods=alarm.periods[0],
            datapoints_to_alarm=alarm.periods[1],
            comparison_operator=alarm.comparison,
            treat_missing_data=alarm.missing,
        )
