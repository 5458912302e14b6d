"""The reference of the public names (``docs/reference.md``), generated from their docstrings and
signatures, and the typed keywords of an endpoint's settings (``constructs/endpoint_keywords.py``,
the ``TypedDict`` that types ``TritonMultiModelEndpoint(**settings)``): ``make reference``
(``python -m triton_mme_cdk.reference --write .``) writes both.

Every name of ``triton_mme_cdk.__all__``: classes with their constructor, public properties and
methods; the settings every endpoint takes as keywords, with their types, defaults and
descriptions (the fields of :class:`~triton_mme_cdk.constructs.endpoint_settings.EndpointSettings`).
``tests/test_package.py`` holds the committed files to what this writes.
"""

from __future__ import annotations

import functools
import inspect
import re
import sys
from typing import Any

import triton_mme_cdk
from triton_mme_cdk.constructs.endpoint_metrics import VariantMetric

HEADER = """# Reference of `triton_mme_cdk`

Generated from the docstrings by `make reference` (`python -m triton_mme_cdk.reference`); do not
edit by hand. How to use it in your own CDK app: [README](../README.md#use-it-in-your-own-cdk-app);
what every setting does: [settings.md](settings.md).
"""


def _doc(obj: Any) -> str:
    text = inspect.getdoc(obj) or ""
    # Sphinx roles read as code in markdown: :class:`~a.b.C` -> `C`, :func:`x` -> `x`.
    return re.sub(r":[a-z]+:`~?([^`]+)`", lambda m: f"`{m.group(1).rsplit('.', 1)[-1]}`", text).replace("``", "`")


def _signature(obj: Any) -> str:
    try:
        text = str(inspect.signature(obj))
    except (TypeError, ValueError):
        return "(...)"
    # Annotations are strings (postponed evaluation): show them as written.
    return re.sub(r"(: |-> )'([^']*)'", r"\1\2", text)


def _members(cls: type) -> list[tuple[str, Any]]:
    """Public properties and methods ``cls`` itself defines or a project base gives it."""
    found = []
    for name, member in inspect.getmembers(cls):
        if name.startswith("_"):
            continue
        owner = next((base for base in cls.__mro__ if name in base.__dict__), None)
        if owner is None or not owner.__module__.startswith(triton_mme_cdk.__name__):
            continue
        raw = owner.__dict__[name]
        if isinstance(raw, (property, functools.cached_property, classmethod, staticmethod, VariantMetric)) \
                or inspect.isfunction(raw) \
                or callable(member):
            found.append((name, raw))
    return found


def _attributes(cls: type) -> list[tuple[str, str]]:
    """``(name, doc)`` of the public attributes the class's code documents with ``#:`` comments
    above ``self.<name> = ...`` (Sphinx's convention), in the order they are set."""
    try:
        source = inspect.getsource(cls)
    except (OSError, TypeError):
        return []
    found: dict[str, str] = {}
    comment: list[str] = []
    for line in source.splitlines():
        stripped = line.strip()
        if stripped.startswith("#:"):
            comment.append(stripped[2:].strip())
            continue
        match = re.match(r"(?:self\.\w+ = )?self\.([a-z]\w*)\s*(?::[^=]+)?=", stripped)
        if match and comment and match.group(1) not in found:
            found[match.group(1)] = " ".join(comment)
        comment = []
    return list(found.items())


def _metric(name: str, metric: VariantMetric) -> list[str]:
    return [f"### `{name}(**options) -> cloudwatch.Metric`", "",
            f"`{metric.namespace}`: {_doc(metric)}", ""]


def _class(name: str, cls: type) -> list[str]:
    lines = [f"## `{name}`", "", f"`{cls.__module__}.{cls.__qualname__}`", "", _doc(cls), ""]
    if "__init__" in cls.__dict__:
        lines += ["```python", f"{name}{_signature(cls.__dict__['__init__']).replace('(self, ', '(', 1)}", "```", ""]
    for attribute, doc in _attributes(cls):
        lines += [f"### `{attribute}`", "", re.sub(r":[a-z]+:`~?([^`]+)`", lambda m: f"`{m.group(1)}`", doc)
                  .replace("``", "`"), ""]
    for member_name, raw in _members(cls):
        if isinstance(raw, VariantMetric):
            lines += _metric(member_name, raw)
            continue
        kind = "property" if isinstance(raw, property) or hasattr(raw, "attrname") else "method"
        target = raw.__func__ if isinstance(raw, (classmethod, staticmethod)) else raw
        target = getattr(target, "func", target)  # functools.cached_property
        heading = f"`{member_name}`" if kind == "property" else f"`{member_name}{_signature(target)}`"
        doc = _doc(target) or _doc(getattr(raw, "__doc__", None))
        lines += [f"### {heading}", "", doc or "(no description)", ""]
    return lines


def _default(info: Any) -> str:
    """A keyword's default as code (``Duration.seconds(600)``, ``'ml.g5.xlarge'``), or ``unset``."""
    from triton_mme_cdk.constructs.props import Quantity
    from triton_mme_cdk.constructs.setting_table import whole

    default = info.get_default(call_default_factory=True)
    if default is None:
        return "unset"
    unit = next((item.unit for item in info.metadata if isinstance(item, Quantity)), None)
    return repr(default) if unit is None else f"{unit.source}({whole(unit.read(default))})"


def _settings() -> list[str]:
    from triton_mme_cdk.constructs.endpoint_settings import EndpointSettings
    from triton_mme_cdk.constructs.setting_table import KEYWORDS

    keys = {keyword: key for key, keyword in KEYWORDS.items()}
    lines = ["## The settings of an endpoint", "",
             "Keywords of `TritonMultiModelEndpoint` and the `mme:` keys of the app's context that give them",
             "(a time or a size: a number of the key's unit, which the app converts), with the type, default and",
             "description of the props field each sets.", "",
             "| keyword | `mme:` key | type | default | description |", "|---|---|---|---|---|"]
    for field_name, info in EndpointSettings.model_fields.items():
        shown = _default(info)
        shown = shown if shown == "unset" else f"`{shown}`"
        description = (info.description or "").replace("|", "\\|")
        escaped = _type_name(info.annotation).replace("|", "\\|")  # a union's bar would end the table cell
        lines.append(f"| `{field_name}` | `{keys.get(field_name, field_name)}` | `{escaped}` | {shown} | {description} |")
    return [*lines, ""]


def _type_name(annotation: Any) -> str:
    """An annotation as Python source (``Annotated`` metadata dropped)."""
    import types
    import typing

    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _type_name(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_type_name(arg) for arg in typing.get_args(annotation))
    if origin is typing.Literal:
        return "Literal[" + ", ".join(repr(arg) for arg in typing.get_args(annotation)) + "]"
    if origin in (list, dict):
        return f"{origin.__name__}[" + ", ".join(_type_name(arg) for arg in typing.get_args(annotation)) + "]"
    return "None" if annotation is type(None) else str(getattr(annotation, "__name__", annotation))


KEYWORDS_HEADER = '''"""The keywords of ``TritonMultiModelEndpoint(**settings)``: one per setting, typed (generated
by ``make reference`` from ``EndpointSettings``; do not edit by hand).

Each keyword is the ``mme:`` setting of the same name in docs/settings.md, with its type, unit and
default; a value is checked by the same rules (one ``PropsError`` line naming the keyword).
"""

from __future__ import annotations

from typing import Literal, TypedDict

from aws_cdk import Duration, Size
from aws_cdk.aws_iam import IGrantable


class EndpointKeywords(TypedDict, total=False):
    """The settings of one endpoint, each optional (its default applies when left out)."""

'''


def keywords_source() -> str:
    """The source of ``constructs/endpoint_keywords.py``."""
    import textwrap

    from triton_mme_cdk.constructs.endpoint_settings import EndpointSettings

    lines = [KEYWORDS_HEADER.rstrip("\n")]
    for field_name, info in EndpointSettings.model_fields.items():
        text = f"{info.description or ''} Default: {_default(info)}."
        lines += [""] + ["    #: " + line for line in textwrap.wrap(text, 100)]
        lines.append(f"    {field_name}: {_type_name(info.annotation)}")
    return "\n".join(lines) + "\n"


CONTEXT_FIELDS_HEADER = '''"""The app's ``mme:`` settings as the type checker reads them (generated by ``make reference``
from ``stacks.settings.MmeSettings``; do not edit by hand)."""

# MmeSettings adds one field per mme: key to AppSettings when its module loads; these read-only
# attributes give the type checker each field's type, so that every read of a setting in stacks/
# is checked. They are the context's plain numbers and strings: the construct's types (Duration,
# Size, roles) come from stacks.context_table.construct_keywords.

from __future__ import annotations

from typing import TYPE_CHECKING, Literal


class ContextFields:
    """One read-only attribute per ``mme:`` key (the type checker's view of ``MmeSettings``)."""

    if TYPE_CHECKING:'''


def context_fields_source() -> str:
    """The source of ``stacks/context_fields.py``."""
    from triton_mme_cdk.stacks.settings import AppSettings, MmeSettings

    own = set(AppSettings.model_fields)
    lines = [CONTEXT_FIELDS_HEADER.rstrip("\n")]
    for field_name, info in MmeSettings.model_fields.items():
        if field_name in own:
            continue
        lines += ["        @property", f"        def {field_name}(self) -> {_type_name(info.annotation)}: ..."]
    return "\n".join(lines) + "\n"


def render() -> str:
    lines = [HEADER]
    for name in triton_mme_cdk.__all__:
        value = getattr(triton_mme_cdk, name)
        if inspect.isclass(value) and name != "EndpointSettings":
            lines += _class(name, value)
    lines += _settings()
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str]) -> int:
    """Print the reference page; with ``--write ROOT``, write the three generated files under ROOT."""
    from pathlib import Path

    if argv[:1] == ["--write"] and len(argv) == 2:
        root = Path(argv[1])
        (root / "docs" / "reference.md").write_text(render(), encoding="utf-8")
        (root / "constructs" / "endpoint_keywords.py").write_text(keywords_source(), encoding="utf-8")
        (root / "stacks" / "context_fields.py").write_text(context_fields_source(), encoding="utf-8")
        return 0
    if argv:
        print("usage: python -m triton_mme_cdk.reference [--write ROOT]", file=sys.stderr)
        return 2
    sys.stdout.write(render())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
