"""Typed, validated settings of the Triton multi-model endpoint app.

``app.py`` builds one :class:`MmeSettings` from the CDK context (``cdk.json`` and ``-c`` flags):
every key is ``mme:<name>``, e.g. ``cdk synth -c mme:instance_type=ml.g5.2xlarge``.

Most settings are a construct's props field: :data:`stacks.context_table.SETTINGS` maps each such context key onto its
field (``mme:max_instance_count`` -> ``FleetSize.maximum``) with the conversion of a context value
into the prop's value (seconds -> ``Duration``, ``retain`` -> ``RemovalPolicy.RETAIN``). The
setting's type, bounds, default and description are the field's, converted; none is written
here. The other settings (stack name, environment, which manifest or release, which VPC and topic,
tags) are plain fields of :class:`AppSettings`.

Values given with ``-c`` are strings and are coerced by the setting's type (``"2"`` -> 2,
``"true"`` -> True, ``""`` -> unset for optional settings and empty for lists and objects, a JSON
array or a comma-separated list for a list, a JSON object for ``triton_environment``). An unknown
``mme:`` key, a value of the wrong type or out of range, or an inconsistent combination raises
:class:`SettingsError` with one message that names the setting as ``mme:<name>``, the value given
and what is allowed: the props' own rules between fields run on the settings' values, and their
field names are mapped back to context keys through :data:`SETTINGS`.

No AWS call is made: the app synthesizes without credentials.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Self

from pydantic import (
    AfterValidator,
    Field,
    ValidationError,
    ValidationInfo,
    create_model,
    field_validator,
    model_validator,
)

from triton_mme_cdk.constructs.endpoint_settings import ALARM_TOPIC_ENABLED, CREATE_VPC, EndpointSettingsBase
from triton_mme_cdk.constructs.multi_model_endpoint import RELEASE_ID_PATTERN
from triton_mme_cdk.constructs.props import format_errors
from triton_mme_cdk.constructs.setting_table import SETTINGS
from triton_mme_cdk.constructs.triton_image import load_image_table
from triton_mme_cdk.model_build.validation_messages import clip
from triton_mme_cdk.stacks.context_table import CONTEXT_PREFIX, from_context_value

if TYPE_CHECKING:
    from triton_mme_cdk.stacks.context_fields import ContextFields
else:
    ContextFields = object  # the fields themselves are MmeSettings', made from SETTINGS below

#: Longest context value read (characters, or JSON characters for a non-string from cdk.json).
MAX_CONTEXT_VALUE_CHARS = 8192
#: Longest list of the known settings a refusal shows (the rest are in docs/settings.md).
MAX_LISTING_CHARS = 1200
#: Tag values SageMaker, S3 and the other tagged services accept: letters, digits, spaces and
#: ``_ . : / = + - @`` (the AWS tag value pattern), 1 to 256 characters here, not ``aws:...``.
TAG_VALUE_PATTERN = r"^(?!(?i:aws:))[\w .:/=+\-@]{1,256}$"


class SettingsError(ValueError):
    """Settings that cannot give a working deployment; the message says which and why."""


# ---------------------------------------------------------------------------------------------
# The settings
# ---------------------------------------------------------------------------------------------


def _matching(pattern: str, expected: str) -> Any:
    """``Annotated`` metadata of a string setting that must match ``pattern`` (said in words)."""

    def check(value: str) -> str:
        if not re.fullmatch(pattern, value):
            raise ValueError(f"got {value!r}; expected {expected}")
        return value

    return AfterValidator(check)


ReleaseId = Annotated[str, _matching(RELEASE_ID_PATTERN, "a release id as `python -m model_build publish` prints "
                                                       "it: 'r-' and 16 lowercase hex digits")]
TopicArn = Annotated[str, _matching(r"arn:aws[a-z-]*:sns:[a-z0-9-]+:\d{12}:[A-Za-z0-9_-]{1,256}",
                                    "an SNS topic ARN such as arn:aws:sns:eu-west-1:123456789012:alarms")]
VpcId = Annotated[str, _matching(r"vpc-[0-9a-f]{8}([0-9a-f]{9})?", "a VPC id such as vpc-0123456789abcdef0")]
TagValue = Annotated[str, _matching(TAG_VALUE_PATTERN, "1 to 256 letters, digits, spaces and _ . : / = + - @, "
                                                       "not starting with 'aws:'")]


class AppSettings(EndpointSettingsBase, ContextFields):
    """The app's own settings (stack, environment, manifest or release, existing VPC and topic,
    tags), with the behaviour of each default, on the endpoint's settings of
    :class:`~triton_mme_cdk.constructs.endpoint_settings.EndpointSettingsBase`.

    :class:`MmeSettings` adds one field per row of :data:`SETTINGS`. Immutable; unknown fields
    are refused. Construct it with :meth:`from_context` to read the ``mme:`` keys of a CDK context.
    """

    prefix: ClassVar[str] = CONTEXT_PREFIX

    stack_name: str = Field(
        default="TritonMme", pattern=r"^[A-Za-z][A-Za-z0-9-]*$", max_length=128, description="Name of the CloudFormation stack."
    )
    account: str | None = Field(
        default=None, pattern=r"^\d{12}$", description="AWS account of the stack; unset: environment-agnostic. Never looked up."
    )
    region: str | None = Field(
        default=None,
        pattern=r"^[a-z]{2}(-[a-z]+)+-\d+$",
        description="AWS region of the stack (must be in the image table); unset: environment-agnostic "
        "(the image mapping covers every listed region).",
    )
    manifest_path: str = Field(
        default="models.yaml",
        description="Models manifest, relative to the project root; its models are built and published by "
        "the stack. Empty: no build resource, the endpoint serves release_id.",
    )
    release_id: ReleaseId | None = Field(
        default=None,
        description="Release to serve when manifest_path is empty (r- and 16 hex digits), published out "
        "of band with `python -m model_build publish`. Refused with a manifest.",
    )
    plan_routes_file: str = Field(
        default="",
        description="A copy of the live routes document (the RoutesUrl output): synth then prints the plan "
        "of this change against it (models added, updated, removed; the verdict of the synthesized template "
        "against the deployed record the routes carry). Empty: synth prints the model count and how to run "
        "the plan.",
    )
    alarm_topic_enabled: bool | None = ALARM_TOPIC_ENABLED
    alarm_topic_arn: TopicArn | None = Field(
        default=None,
        description="An existing SNS topic the alarms notify instead of a created one. Its policy (and "
        "key, if encrypted) must let cloudwatch.amazonaws.com publish. Unset: none.",
    )
    vpc_id: VpcId | None = Field(
        default=None,
        description="Place the model in this existing VPC (looked up: needs account and region): its "
        "isolated subnets, else its private ones; it must route S3 itself. Unset: no VPC (the stack "
        "stays environment-agnostic).",
    )
    create_vpc: bool = CREATE_VPC
    tag_project: TagValue = Field(default="triton-mme", description="Value of the Project tag on every taggable resource.")
    tag_environment: TagValue = Field(default="dev", description="Value of the Environment tag on every taggable resource.")
    tag_owner: TagValue = Field(
        default="unassigned", description="Value of the Owner tag on every taggable resource (a team or an address)."
    )

    @field_validator("*", mode="before")
    @classmethod
    def _context_string(cls, value: Any, info: ValidationInfo) -> Any:
        return from_context_value(value, cls.model_fields[info.field_name or ""].annotation)

    # -----------------------------------------------------------------------------------------
    # Combinations
    # -----------------------------------------------------------------------------------------

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        if self.region is not None:
            load_image_table().row(self.fleet_host().image_version).check_region(self.region, f"{CONTEXT_PREFIX}region")
        self._check_release()
        self._check_notifications()
        self._check_network()
        return self

    def has_vpc(self) -> bool:
        return self.create_vpc or self.vpc_id is not None

    def vpc_hint(self) -> str:
        return "set mme:vpc_id or mme:create_vpc true"

    def _check_release(self) -> None:
        if not self.manifest_path and self.release_id is None:
            raise ValueError(
                "mme:release_id: missing with an empty mme:manifest_path; give the release to serve "
                "(published out of band with `python -m model_build publish`), or a manifest to build"
            )
        if self.manifest_path and self.release_id is not None:
            raise ValueError(
                f"mme:release_id: got {self.release_id!r} with mme:manifest_path {self.manifest_path!r}; "
                "the release of a manifest is computed from it: set mme:manifest_path to '' to serve an "
                "existing release"
            )

    def _check_notifications(self) -> None:
        if self.alarm_topic_enabled is False and self.alarm_emails:
            raise ValueError("mme:alarm_emails: given with mme:alarm_topic_enabled false; the addresses subscribe "
                             "to the created topic: leave mme:alarm_topic_enabled unset, or drop the addresses")
        if self.alarm_topic_arn is not None and (self.alarm_topic_enabled is True or self.alarm_emails):
            given = "mme:alarm_emails" if self.alarm_emails else "mme:alarm_topic_enabled true"
            raise ValueError(
                f"mme:alarm_topic_arn: got {self.alarm_topic_arn!r} with {given}; the alarms notify "
                "either an existing topic or a created one: drop one of them"
            )

    def _check_network(self) -> None:
        if self.vpc_id is not None and self.create_vpc:
            raise ValueError(
                f"mme:vpc_id: got {self.vpc_id!r} with mme:create_vpc true; place the model in an "
                "existing VPC or in a created one, not both"
            )
        if self.vpc_id is not None and (self.account is None or self.region is None):
            missing = " and ".join(f"mme:{name}" for name in ("account", "region") if getattr(self, name) is None)
            raise ValueError(
                f"mme:vpc_id: got {self.vpc_id!r} without {missing}; an existing VPC is looked up "
                "(ec2.Vpc.from_lookup) in one account and region: set mme:account and mme:region"
            )
        if self.build_in_vpc and not self.manifest_path:
            raise ValueError(
                "mme:build_in_vpc: got true with an empty mme:manifest_path; there is no build to place in "
                "the VPC (the release is published out of band)"
            )

    # -----------------------------------------------------------------------------------------
    # Construction from the CDK context
    # -----------------------------------------------------------------------------------------

    @classmethod
    def from_context(cls, context: Mapping[str, Any]) -> Self:
        """Read every ``mme:<name>`` key of a CDK context; other keys are ignored.

        A key that looks meant for this app but is not a known setting (``mme:instace_type``,
        ``MME:...``, ``mme.x``) is refused, never ignored: a typo would otherwise deploy the
        default silently. A value longer than :data:`MAX_CONTEXT_VALUE_CHARS` (as given or as
        JSON) is refused before it is parsed.
        """
        values: dict[str, Any] = {}
        known = list(cls.model_fields)
        listing = ", ".join(CONTEXT_PREFIX + field for field in known)
        if len(listing) > MAX_LISTING_CHARS:  # a refusal stays one short line as settings are added
            listing = listing[:listing.rindex(", ", 0, MAX_LISTING_CHARS)] + f", ... ({len(known)} in all: docs/settings.md)"
        for key, value in context.items():
            key = str(key)
            if not key.startswith(CONTEXT_PREFIX):
                if re.match(r"^mme\W", key, re.IGNORECASE) or key.lower().startswith(CONTEXT_PREFIX):
                    raise SettingsError(
                        f"{clip(key)}: looks like a setting of this app but does not start with "
                        f"{CONTEXT_PREFIX!r}; known settings: {listing}"
                    )
                continue
            name = key[len(CONTEXT_PREFIX):]
            size = len(value) if isinstance(value, str) else len(json.dumps(value, default=str))
            if size > MAX_CONTEXT_VALUE_CHARS:
                raise SettingsError(f"{clip(key)}: got a value of {size} characters; at most {MAX_CONTEXT_VALUE_CHARS}")
            if name not in cls.model_fields:
                close = difflib.get_close_matches(name, known, n=1)
                hint = f"did you mean {CONTEXT_PREFIX}{close[0]}? " if close else ""
                raise SettingsError(f"{clip(key)}: unknown setting; {hint}known settings: {listing}")
            values[name] = value
        try:
            return cls.model_validate(values)
        except ValidationError as error:
            raise SettingsError(format_errors(error, CONTEXT_PREFIX)) from None


if TYPE_CHECKING:
    MmeSettings = AppSettings
else:
    #: The settings model: :class:`AppSettings` and one field per row of :data:`SETTINGS`.
    MmeSettings = create_model(
        "MmeSettings",
        __base__=AppSettings,
        __module__=__name__,
        **{key: setting.model_field() for key, setting in SETTINGS.items()},
    )
