"""Blue/green updates of a Triton endpoint, rolled back automatically by CloudWatch alarms.

Why the policy takes the endpoint and the alarms, and is built last. The endpoint's
``DeploymentConfig`` names the rollback alarms (``Ref``: CloudFormation creates them before the
endpoint), while the alarms watch the endpoint's metrics. The metrics depend only on the
endpoint's name as given and its variant's name, so the alarms could be built first and the
policy handed to the endpoint's props; but a construct's place in the construct tree fixes its
logical id and the order of the template's resources, and the alarms come after the endpoint and
its autoscaling there (``Endpoint``, ``Autoscaling``, ``AlarmTopic``, ``Alarms``, ``Dashboard``).
Building them first would reorder the template. So the frozen :class:`RolloutPolicyProps` hold the
traffic routing and the rollback alarms, and :class:`RolloutPolicy` is the one place that writes the
endpoint's ``DeploymentConfig`` and grants its role ``cloudwatch:DescribeAlarms``: neither the
endpoint nor the alarms change each other.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Annotated, Self

from aws_cdk import Duration
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_iam as iam
from aws_cdk import aws_sagemaker as sagemaker
from pydantic import Field, model_validator

from triton_mme_cdk.constructs.props import SECONDS, Between, Namer, Props, Resource, is_unresolved, known
from triton_mme_cdk.constructs.sagemaker_hosting import FleetSize, SageMakerHosting
from triton_mme_cdk.constructs.sagemaker_limits import (
    ALARM_NAME_MAX_LENGTH,
    CANARY_MAX_PERCENT,
    LINEAR_MAX_PERCENT,
    LINEAR_MIN_PERCENT,
    MAX_EXECUTION_TIMEOUT_MAX_SECONDS,
    MAX_EXECUTION_TIMEOUT_MIN_SECONDS,
    ROLLBACK_ALARMS_MAX,
    ROLLBACK_ALARMS_MIN,
    TERMINATION_WAIT_MAX_SECONDS,
    TERMINATION_WAIT_MIN_SECONDS,
    WAIT_INTERVAL_MAX_SECONDS,
    WAIT_INTERVAL_MIN_SECONDS,
    CapacitySizeType,
    PropsError,
    TrafficRoutingType,
)


class RolloutPolicyProps(Props):
    """Props of :class:`RolloutPolicy`."""

    endpoint: SageMakerHosting = Field(description="The endpoint whose updates the policy governs.")
    fleet: FleetSize | None = Field(
        default=None,
        description="The variant's instance counts, which an INSTANCE_COUNT step must fit. Unset: "
        "the endpoint's (its props' fleet).",
    )
    rollback_alarms: Sequence[Resource[cloudwatch.IAlarm]] = Field(
        default=(),
        description="Metric alarms (up to 10) whose ALARM state during an update rolls it back; "
        "composite alarms are refused (SageMaker reads them with DescribeAlarms, which returns metric "
        "alarms only unless asked). Empty: no automatic rollback.",
    )
    traffic: TrafficRoutingType = Field(
        default="ALL_AT_ONCE",
        description="Blue/green traffic shifting of endpoint updates. ALL_AT_ONCE (default) works with "
        "any fleet size, including the default single instance, and still bakes wait_interval under the "
        "rollback alarms before the old fleet goes; CANARY and LINEAR need size.",
    )
    size_type: CapacitySizeType = Field(
        default="CAPACITY_PERCENT",
        description="Unit of size. An INSTANCE_COUNT step must fit every fleet size autoscaling may "
        "have (at most half of fleet.minimum).",
    )
    size: int | None = Field(
        default=None,
        description="CANARY: the canary (at most 50% of the instances); LINEAR: each step (10% to 50%). "
        "Refused with ALL_AT_ONCE.",
    )
    wait_interval: Annotated[Duration, Between(WAIT_INTERVAL_MIN_SECONDS, WAIT_INTERVAL_MAX_SECONDS, SECONDS)] = Field(
        default_factory=lambda: Duration.seconds(600),
        description="WaitIntervalInSeconds (0 to 3600): baking time after each traffic shift while the "
        "rollback alarms are watched. 600 covers the 5-minute windows of the default rollback alarms.",
    )
    termination_wait: Annotated[
        Duration, Between(TERMINATION_WAIT_MIN_SECONDS, TERMINATION_WAIT_MAX_SECONDS, SECONDS)
    ] = Field(
        default_factory=lambda: Duration.seconds(300),
        description="TerminationWaitInSeconds (0 to 3600): how long the old fleet is kept after the "
        "update completes, for a fast manual roll back.",
    )
    maximum_execution_timeout: Annotated[
        Duration | None, Between(MAX_EXECUTION_TIMEOUT_MIN_SECONDS, MAX_EXECUTION_TIMEOUT_MAX_SECONDS, SECONDS)
    ] = Field(
        default=None,
        description="MaximumExecutionTimeoutInSeconds (600 to 28800), longer than all waits together. "
        "Unset: SageMaker's default.",
    )

    @property
    def variant_fleet(self) -> FleetSize:
        """The instance counts a step is checked against: ``fleet`` as given, else the endpoint's."""
        return self.fleet if self.fleet is not None else self.endpoint.fleet

    def check(self, name: Namer) -> None:
        if known(self.traffic) and (self.size is None or known(self.size)):
            self._check_size(name)
            self._check_timeout(name)

    def _check_size(self, name: Namer) -> None:
        """A traffic shift SageMaker accepts for every fleet size from ``fleet.minimum`` to
        ``fleet.maximum`` (autoscaling decides the count at deployment time)."""
        traffic, size, size_name = self.traffic, self.size, name("size")
        shift = f"{name('traffic')} {traffic}"
        if traffic == "ALL_AT_ONCE":
            if size is not None:
                raise PropsError(f"{size_name}: got {size} with {shift}; a size is for CANARY or LINEAR only: leave it unset")
            return
        if size is None:
            step = "canary" if traffic == "CANARY" else "linear step"
            raise PropsError(
                f"{size_name}: missing with {shift}; give the {step} size (with {name('size_type')} "
                "INSTANCE_COUNT or CAPACITY_PERCENT)"
            )
        if size < 1:
            raise PropsError(f"{size_name}: got {size}; expected at least 1")
        if self.size_type == "CAPACITY_PERCENT":
            low, high = (1, CANARY_MAX_PERCENT) if traffic == "CANARY" else (LINEAR_MIN_PERCENT, LINEAR_MAX_PERCENT)
            if not low <= size <= high:
                raise PropsError(
                    f"{size_name}: got {size} percent with {shift}; expected {low} to {high} percent of the "
                    "variant's instances"
                )
            return
        self._check_instance_step(name, f"{size_name}: got {size} instances with {shift}")

    def _check_instance_step(self, name: Namer, given: str) -> None:
        """An INSTANCE_COUNT step: at most half of the smallest fleet; a linear step at least a
        tenth of the largest one."""
        size, fleet = self.size or 0, self.variant_fleet
        most = fleet.minimum // 2
        if size > most:
            raise PropsError(
                f"{given} and {name('fleet.minimum')} {fleet.minimum}; a {self.traffic.lower()} step may be "
                f"at most 50% of the variant's instances, so at most {most} here"
                + (f" (none: use CAPACITY_PERCENT, ALL_AT_ONCE, or {name('fleet.minimum')} >= 2)" if most == 0 else "")
            )
        if self.traffic == "LINEAR" and size * 100 < LINEAR_MIN_PERCENT * fleet.maximum:
            least = -(-LINEAR_MIN_PERCENT * fleet.maximum // 100)
            raise PropsError(
                f"{given} and {name('fleet.maximum')} {fleet.maximum}; a linear step must be at least 10% of "
                f"the variant's instances, so at least {least} here"
            )

    def _check_timeout(self, name: Namer) -> None:
        """The maximum execution time must exceed every wait (the most steps a fleet may need)."""
        if self.maximum_execution_timeout is None:
            return
        timeout = self.maximum_execution_timeout.to_seconds()
        wait, termination = self.wait_interval.to_seconds(), self.termination_wait.to_seconds()
        if not known(timeout, wait, termination):
            return
        steps = 1
        if self.traffic == "LINEAR" and self.size:
            percent = self.size if self.size_type == "CAPACITY_PERCENT" else 100 * self.size / self.variant_fleet.maximum
            steps = math.ceil(100 / percent)
        elif self.traffic == "CANARY":
            steps = 2
        waits = steps * wait + termination
        if timeout <= waits:
            raise PropsError(
                f"{name('maximum_execution_timeout')}: got {timeout:g} with {steps} wait(s) of "
                f"{name('wait_interval')} {wait:g} and {name('termination_wait')} {termination:g}; "
                f"expected more than the {waits:g} s of waiting (and time to start the new fleet)"
            )

    @model_validator(mode="after")
    def _alarms(self) -> Self:
        alarms = list(self.rollback_alarms)
        if alarms and not ROLLBACK_ALARMS_MIN <= len(alarms) <= ROLLBACK_ALARMS_MAX:
            raise PropsError(
                f"rollback_alarms: got {len(alarms)} alarms; expected {ROLLBACK_ALARMS_MIN} to "
                f"{ROLLBACK_ALARMS_MAX} alarms"
            )
        for alarm in alarms:
            if isinstance(alarm, cloudwatch.CompositeAlarm):
                raise PropsError(
                    f"rollback_alarms: {alarm.node.path} is a composite alarm; SageMaker reads rollback "
                    "alarms with DescribeAlarms, which returns metric alarms unless asked for composite "
                    "ones: give metric alarms"
                )
            alarm_name = alarm.alarm_name
            if not is_unresolved(alarm_name) and not 1 <= len(alarm_name) <= ALARM_NAME_MAX_LENGTH:
                raise PropsError(f"rollback_alarms: alarm name {alarm_name!r} has more than 255 characters")
        return self

    def deployment_config(self) -> sagemaker.CfnEndpoint.DeploymentConfigProperty:
        """The endpoint's ``DeploymentConfig``: a blue/green update shifting traffic as asked and,
        with rollback alarms, rolled back when one of them goes to ALARM during the update."""
        timeout = self.maximum_execution_timeout
        step = sagemaker.CfnEndpoint.CapacitySizeProperty(type=self.size_type, value=self.size) if self.size else None
        routing = sagemaker.CfnEndpoint.TrafficRoutingConfigProperty(
            type=self.traffic,
            wait_interval_in_seconds=self.wait_interval.to_seconds(),
            canary_size=step if self.traffic == "CANARY" else None,
            linear_step_size=step if self.traffic == "LINEAR" else None,
        )
        return sagemaker.CfnEndpoint.DeploymentConfigProperty(
            blue_green_update_policy=sagemaker.CfnEndpoint.BlueGreenUpdatePolicyProperty(
                traffic_routing_configuration=routing,
                termination_wait_in_seconds=self.termination_wait.to_seconds(),
                maximum_execution_timeout_in_seconds=timeout.to_seconds() if timeout else None,
            ),
            auto_rollback_configuration=(
                sagemaker.CfnEndpoint.AutoRollbackConfigProperty(
                    alarms=[
                        sagemaker.CfnEndpoint.AlarmProperty(alarm_name=alarm.alarm_name)
                        for alarm in self.rollback_alarms
                    ]
                )
                if self.rollback_alarms
                else None
            ),
        )


class RolloutPolicy:
    """Applies :class:`RolloutPolicyProps` to their endpoint (see the module documentation): sets
    the endpoint's ``DeploymentConfig`` and, with rollback alarms, lets the execution role
    ``cloudwatch:DescribeAlarms`` on them (developer guide, "Auto-rollback configuration and
    monitoring"), before the endpoint is created or updated. Not a construct: it adds no resource.
    """

    def __init__(self, *, props: RolloutPolicyProps) -> None:
        endpoint = props.endpoint
        #: The ``DeploymentConfig`` the endpoint now has.
        self.deployment_config = props.deployment_config()
        endpoint.endpoint.deployment_config = self.deployment_config
        #: The grant of ``cloudwatch:DescribeAlarms`` (None without rollback alarms).
        self.describe_alarms_grant: iam.Grant | None = None
        if props.rollback_alarms:
            self.describe_alarms_grant = iam.Grant.add_to_principal(
                grantee=endpoint.execution_role,
                actions=["cloudwatch:DescribeAlarms"],
                resource_arns=[alarm.alarm_arn for alarm in props.rollback_alarms],
            )
            self.describe_alarms_grant.apply_before(endpoint.endpoint)
