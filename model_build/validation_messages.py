"""One wording for a refused value, for every pydantic model of the project: the manifest, the
construct props and the app's settings all say ``<field>: got <value>; <what is allowed>``.

Standard library only (the CDK app imports it at synth). Where a field is named differs by
caller (a manifest path names the model, a prop path names the construct), so callers give the
field; the rest of the line is written here.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

#: How much of a value a message echoes: a hostile value must not become a megabyte-long error.
ECHO_LIMIT = 100


def clip(text: str, limit: int = ECHO_LIMIT) -> str:
    """``text`` as echoed in a message: at most about ``limit`` characters, the length said."""
    return text if len(text) <= limit else text[: limit - 3] + f"... ({len(text)} characters)"


def shown(value: Any) -> str:
    """A value as a message echoes it: JSON for scalars (quotes show a string), repr otherwise."""
    return clip(json.dumps(value) if isinstance(value, (str, int, float, bool)) else repr(value))


def problem_line(field: str, item: Mapping[str, Any]) -> str:
    """One pydantic error (an ``error.errors()`` item) about ``field`` as one line.

    A ``value_error`` (a check of ours) keeps its own words, which already say what is allowed."""
    message = str(item["msg"]).removeprefix("Value error, ")
    if item["type"] == "missing":
        return f"{field}: missing; this field is required"
    if item["type"] == "extra_forbidden":
        return f"{field}: unknown key; remove it or check its spelling"
    if item["type"] == "value_error":
        return f"{field}: {clip(message, 600)}"
    return f"{field}: got {shown(item.get('input'))}; {message[0].lower() + message[1:]}"
