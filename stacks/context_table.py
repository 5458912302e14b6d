"""How the app's context gives the endpoint's settings: each setting of
:mod:`triton_mme_cdk.constructs.setting_table` is the context key ``mme:<name>``
(:func:`context_name` names a props field by it), a context value given with ``-c`` (a
string) or in ``cdk.json`` reads as the setting's type (:func:`from_context_value`), and the
context's plain numbers and strings become the construct's keywords (:func:`construct_keywords`:
``Duration``, ``Size``, roles), in that one direction.

:class:`triton_mme_cdk.stacks.settings.MmeSettings` is derived from the settings' table.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any, get_origin

from aws_cdk import aws_iam as iam

from constructs import Construct
from triton_mme_cdk.constructs.props import Props
from triton_mme_cdk.constructs.setting_table import KEYWORDS, SETTINGS, keyword_value, members, setting_name

CONTEXT_PREFIX = "mme:"
#: The context keys of the endpoint's settings (the two that are no props field, and the table's).
ENDPOINT_KEYS: tuple[str, ...] = ("create_vpc", "alarm_topic_enabled", *SETTINGS)
#: The context key of each construct keyword (for naming a refused keyword as the app's user gave it).
CONTEXT_KEYS: dict[str, str] = {KEYWORDS.get(key, key): key for key in ENDPOINT_KEYS}


def construct_keywords(scope: Construct, values: Iterable[tuple[str, Any]]) -> dict[str, Any]:
    """The construct's keywords of context settings (``(key, value)``, already checked): a number
    of seconds, days, MiB... becomes its ``Duration`` or ``Size``; each publisher ARN the imported
    role or user (``iam.Role.from_role_arn``, ``iam.User.from_user_arn``, in ``scope``)."""
    keywords: dict[str, Any] = {}
    for key, value in values:
        if key == "model_publishers":
            value = [iam.User.from_user_arn(scope, f"ModelPublisher{index}", arn) if re.search(r":user/", arn)
                     else iam.Role.from_role_arn(scope, f"ModelPublisher{index}", arn, mutable=False)
                     for index, arn in enumerate(value)]
        keywords[KEYWORDS.get(key, key)] = keyword_value(key, value)
    return keywords


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
