"""How the app's context gives the endpoint's settings: each setting of
:mod:`triton_mme_cdk.constructs.endpoint_settings` is the context key ``mme:<name>``
(:func:`context_name` names a props field by it), and a context value given with ``-c`` (a
string) or in ``cdk.json`` reads as the setting's type (:func:`from_context_value`).

:class:`triton_mme_cdk.stacks.settings.MmeSettings` is derived from the settings' table.
"""

from __future__ import annotations

import json
from typing import Any, get_origin

from triton_mme_cdk.constructs.endpoint_settings import members, setting_name
from triton_mme_cdk.constructs.props import Props

CONTEXT_PREFIX = "mme:"


def context_name(props: type[Props], path: str) -> str:
    """The name a message shows for a field of ``props``: ``mme:<setting>`` when a setting gives
    it, the path otherwise."""
    return setting_name(props, path, CONTEXT_PREFIX)


# ---------------------------------------------------------------------------------------------
# Context values given as strings
# ---------------------------------------------------------------------------------------------


def _context_list(text: str) -> list[Any]:
    if not text:
        return []
    if text.startswith("["):
        try:
            return list(json.loads(text))
        except json.JSONDecodeError as error:
            raise ValueError(f"got {text!r}; expected a JSON array ({error.msg})") from None
    return [item.strip() for item in text.split(",") if item.strip()]


def _context_object(value: Any) -> Any:
    if isinstance(value, str):
        text = value.strip()
        try:
            value = json.loads(text) if text else {}
        except json.JSONDecodeError as error:
            raise ValueError(f"got {text!r}; expected a JSON object ({error.msg})") from None
    if not isinstance(value, dict):
        return value
    texts = {True: "true", False: "false"}
    return {
        key: texts[item] if isinstance(item, bool) else str(item) if isinstance(item, (int, float)) else item
        for key, item in value.items()
    }


def from_context_value(value: Any, annotation: Any) -> Any:
    """A context value as the setting's type reads it: ``-c`` gives strings (and ``cdk.json``
    JSON values): ``""``/``none``/``null`` unset an optional setting; a list is a JSON array or
    comma-separated; an object is JSON, its scalar values as strings."""
    kinds = {get_origin(member) or member for member in members(annotation)}
    if dict in kinds:
        return _context_object(value)
    if not isinstance(value, str):
        return value
    if type(None) in kinds and value.strip().lower() in {"", "none", "null"}:
        return None
    return _context_list(value.strip()) if list in kinds else value
