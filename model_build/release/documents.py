"""JSON documents that carry their schema (the release index, the deployed record): read and checked once.

Why one function: each reader must refuse text that does not parse and a document of another
schema with one message naming where it came from, and the two checks were written out for each
document before.
"""

from __future__ import annotations

import json
from typing import Any


def schema_document(body: Any, *, schema: str | int, where: str, error: type[Exception]) -> dict[str, Any]:
    """``body`` (JSON text, or an already parsed value) as a JSON object whose ``schema`` is
    ``schema``; raises ``error`` naming ``where`` otherwise."""
    if isinstance(body, str | bytes):
        try:
            body = json.loads(body)
        except ValueError as problem:
            raise error(f"{where}: not valid JSON ({problem})") from None
    if not isinstance(body, dict) or body.get("schema") != schema:
        found = body.get("schema") if isinstance(body, dict) else type(body).__name__
        raise error(f"{where}: schema {found!r}; expected {schema!r}")
    return body
