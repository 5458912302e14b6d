"""The base of every construct's props: one typed, frozen object that validates itself once.

Each inner construct takes one props object (keyword-only ``props=``), a :class:`Props` subclass
defined in the construct's own module; it reads the props while it builds and keeps none of them
(no ``self.props``). The inner constructs are the package's own: of this folder's constructs,
``triton_mme_cdk`` exports only ``TritonMultiModelEndpoint`` (flat keywords,
``constructs/endpoint_settings.py``) and ``TritonMmeClientLayer``; the inner ones may change
without notice. A props class owns, for
each field, its type, its bounds, its default (documented as a behaviour) and its description;
nothing else restates them: the endpoint's keywords and the app's settings
(``constructs/setting_table.py``) derive their types, bounds, defaults and descriptions from these
fields.

Validation happens once, when the props object is built, and is token-aware: a value that is an
unresolved token (``Token.is_unresolved``: known only at deploy time) skips the value checks. A
refused value raises :class:`~constructs.sagemaker_limits.PropsError` with one lowercase line per
problem naming the field, the value given and what is allowed.

- Field checks are pydantic constraints (``Field(ge=...)``, ``Literal``) or validators in the
  field's ``Annotated`` metadata (so that a settings model built from the field runs them too);
  bounds of a ``Duration`` or ``Size`` are :class:`Between` metadata.
- Rules between value fields are :meth:`Props.check`, which names each field through the ``name``
  function it is given: the field itself here, the context key (``mme:...``) in the settings.
  ``check`` reads value fields only (never a resource), so that the settings can run it before
  any construct exists, on ``Props.model_construct(**values)``.
- Rules that involve resources (subnets, keys, alarms...) are ordinary ``model_validator``\\ s.

This module lives in the ``constructs`` namespace package; its name must never collide with a
module of the ``constructs`` library.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, Self, TypeVar

from aws_cdk import Duration, Size, SizeRoundingBehavior, Token
from pydantic import (
    BaseModel,
    ConfigDict,
    GetCoreSchemaHandler,
    ValidationError,
    ValidatorFunctionWrapHandler,
    field_validator,
    model_validator,
)
from pydantic_core import CoreSchema, core_schema

from triton_mme_cdk.constructs.sagemaker_limits import PropsError
from triton_mme_cdk.model_build.validation_messages import problem_line

#: Turns a field's name (``size``, or ``fleet.minimum`` for a field of a nested props value) into
#: the name a message shows.
Namer = Callable[[str], str]


def same_name(field: str) -> str:
    """The :data:`Namer` of a props object: a field is shown by its own name."""
    return field


def is_unresolved(value: object) -> bool:
    """Whether ``value`` is a token (a string or number CloudFormation resolves at deploy time)."""
    return isinstance(value, (str, int, float)) and not isinstance(value, bool) and Token.is_unresolved(value)


def known(*values: object) -> bool:
    """Whether every value is given and resolved, so that a rule between them can be checked."""
    return all(value is not None and not is_unresolved(value) for value in values)


def format_errors(error: ValidationError, prefix: str = "") -> str:
    """One line per problem: ``<prefix><field>: got <value>; <what is allowed>``.

    A rule between fields (an error without a location) already names its fields.
    """
    return "\n".join(
        problem_line(prefix + ".".join(str(part) for part in item["loc"]), item)
        if item["loc"] else item["msg"].removeprefix("Value error, ")
        for item in error.errors()
    )


class Props(BaseModel):
    """Frozen, no unknown field, resources as objects (``IBucket``, ``IRole``...); see the module
    documentation. Build it with keyword arguments; a refused value raises ``PropsError``."""

    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True, allow_inf_nan=False)

    def __init__(self, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as error:
            raise PropsError(format_errors(error)) from None

    # Only reports errors differently: a props value given as a dict inside other props is still
    # validated by pydantic itself, so that its errors keep their location (``fleet.initial``).
    __init__.__pydantic_base_init__ = True  # type: ignore[attr-defined]

    @field_validator("*", mode="wrap")
    @classmethod
    def _tokens_pass(cls, value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        return value if is_unresolved(value) else handler(value)

    @model_validator(mode="after")
    def _rules(self) -> Self:
        self.check(same_name)
        return self

    def check(self, name: Namer) -> None:
        """Rules between value fields (none here): raise ``PropsError`` naming the fields with
        ``name``. Reads value fields only; a value that is a token is not checked."""


# ---------------------------------------------------------------------------------------------
# Bounds of Duration and Size fields
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Unit:
    """A unit of ``Duration`` or ``Size``: how to make one from a number, and read one as a number."""

    symbol: str
    make: Callable[[float], Any]
    read: Callable[[Any], float]
    #: How a caller writes an amount of it (``Duration.seconds``), for messages.
    source: str = ""

    def convert(self, amount: float, into: Unit) -> float:
        """``amount`` of this unit, in ``into``."""
        return into.read(self.make(amount))


MILLISECONDS = Unit("ms", Duration.millis, lambda value: value.to_milliseconds(integral=False), "Duration.millis")
SECONDS = Unit("s", Duration.seconds, lambda value: value.to_seconds(integral=False), "Duration.seconds")
MINUTES = Unit("minutes", Duration.minutes, lambda value: value.to_minutes(integral=False), "Duration.minutes")
DAYS = Unit("days", Duration.days, lambda value: value.to_days(integral=False), "Duration.days")
BYTES = Unit("bytes", Size.bytes, lambda value: value.to_bytes(rounding=SizeRoundingBehavior.NONE), "Size.bytes")
MEBIBYTES = Unit("MiB", Size.mebibytes, lambda value: value.to_mebibytes(rounding=SizeRoundingBehavior.NONE),
                 "Size.mebibytes")
GIBIBYTES = Unit("GiB", Size.gibibytes, lambda value: value.to_gibibytes(rounding=SizeRoundingBehavior.NONE),
                 "Size.gibibytes")


@dataclass(frozen=True)
class Between:
    """``Annotated`` metadata of a ``Duration`` or ``Size`` field: ``low`` to ``high`` ``unit``
    inclusive (``low`` excluded with ``above``). ``None`` and an unresolved amount pass."""

    low: float
    high: float
    unit: Unit
    above: bool = False
    #: Only whole amounts of ``unit`` (the field's value becomes a whole number of it).
    whole: bool = False

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> CoreSchema:
        return core_schema.no_info_after_validator_function(self.check, handler(source))

    def check(self, value: Any) -> Any:
        if value is None:
            return value
        amount = self.unit.read(value)
        if is_unresolved(amount):
            return value
        if not ((self.low < amount) if self.above else (self.low <= amount)) or amount > self.high:
            symbol, low = self.unit.symbol, "more than " if self.above else ""
            raise ValueError(f"got {amount:g} {symbol}; expected {low}{self.low:g} to {self.high:g} {symbol}")
        if self.whole and not float(amount).is_integer():
            raise ValueError(f"got {amount:g} {self.unit.symbol}; expected a whole number of {self.unit.symbol}")
        return value


@dataclass(frozen=True)
class Quantity:
    """``Annotated`` metadata of a ``Duration`` or ``Size`` keyword, before its type's check: a
    plain number is refused with one line that says how to pass it (``Duration.seconds(300)``)."""

    unit: Unit

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> CoreSchema:
        return core_schema.no_info_before_validator_function(self.check, handler(source))

    def check(self, value: Any) -> Any:
        kind = self.unit.source.partition(".")[0]
        if value is None or isinstance(value, Duration if kind == "Duration" else Size):
            return value
        if is_unresolved(value):  # a number known at deploy time is still an amount of a unit
            raise ValueError(f"got a token; expected a {kind}: pass {self.unit.source}(token)")
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        given = repr(value) if isinstance(value, (str, int, float, bool)) else f"a {type(value).__name__}"
        raise ValueError(f"got {given}; expected a {kind}: pass {self.unit.source}({value if number else '...'})")


def unique(value: list[Any]) -> list[Any]:
    """A list field without repeats (``AfterValidator``)."""
    repeated = sorted({str(item) for item in value if value.count(item) > 1})
    if repeated:
        raise ValueError(f"got {value!r}; {', '.join(repeated)} given twice")
    return value


@dataclass(frozen=True)
class _Implements:
    """``Annotated`` metadata of a field typed with a jsii interface (``IBucket``, ``IRole``...):
    jsii interfaces are protocols ``isinstance`` cannot check, so the value's class must have
    every member of the interface."""

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> CoreSchema:
        members = [name for name in dir(source) if not name.startswith("_")]

        def check(value: Any) -> Any:
            # An object jsii hands back may be a dynamic proxy of several interface classes.
            classes = [type(item) for item in getattr(value, "__dict__", {}).get("_delegates") or [value]]
            missing = [name for name in members if not any(hasattr(cls, name) for cls in classes)]
            if missing:
                raise ValueError(
                    f"got {type(value).__name__}; expected {source.__name__} (no {', '.join(missing[:3])})"
                )
            return value

        return core_schema.no_info_plain_validator_function(check)


_T = TypeVar("_T")
#: A field typed with a jsii interface: ``Resource[iam.IRole]``.
Resource = Annotated[_T, _Implements()]
