"""The security line a reviewer reads first: what widens named, what narrows counted, bounded.

However many resources a change touches (an upgrade touches dozens), the line names the resources
whose access widens, then those whose change cannot be classified, each with the properties it
touches, as many as fit the limit, and counts the rest; what narrows is only counted. The plan's
detail lists every change on a line of its own (``Verdict.security_lines``), the JSON every one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from triton_mme_cdk.model_build.tools.review.plan_security import NARROWS, UNKNOWN, WIDENS, SecurityChange

#: The order security changes are listed in: what widens, what cannot be classified, what narrows.
ACCESS_ORDER = (WIDENS, UNKNOWN, NARROWS)
_WORDS = ((WIDENS, "access widens in"), (UNKNOWN, "unclassified (treated as widening) in"))


def security_headline(findings: Sequence[Any], limit: int) -> str:
    """The line for ``findings`` (each with ``resource_type``, ``logical_id`` and ``changes``), at
    most ``limit`` characters where the names allow (a part always counts its resources, named or
    not). A resource is named by its type and logical id, with the properties whose change is
    counted in that part: ``Function ModelBuild4E9D271E (Role)``."""
    by = {access: [(finding, [c for c in finding.changes if c.access == access]) for finding in findings]
          for access in ACCESS_ORDER}
    by = {access: [(finding, changes) for finding, changes in pairs if changes] for access, pairs in by.items()}
    parts = [(words, [f"{finding.resource_type.split('::')[-1]} {finding.logical_id} ({properties(changes)})"
                      for finding, changes in by[access]])
             for access, words in _WORDS if by[access]]
    count, where = sum(len(changes) for _, changes in by[NARROWS]), len(by[NARROWS])
    narrowing = f"{count} change{'s' if count != 1 else ''} in {where} resource{'s' if where != 1 else ''}"
    if not parts:
        return f"access narrows only: {narrowing}"
    return _bounded(parts, f"narrows: {narrowing}" if count else "", limit)


def properties(changes: Sequence[SecurityChange]) -> str:
    """The top-level properties the changes touch: ``Role``, ``PolicyDocument, Roles``."""
    names = list(dict.fromkeys(change.path.split(".")[0].split("[")[0] for change in changes))
    return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")


def _bounded(parts: list[tuple[str, list[str]]], tail: str, limit: int) -> str:
    """``words a, b and 3 more resources; words c; tail``, naming as many as keep it within
    ``limit`` characters, one of each part in turn."""
    shown = [0] * len(parts)

    def text() -> str:
        pieces = []
        for (words, names), count in zip(parts, shown, strict=True):
            rest = len(names) - count
            more = f"{rest} {'more ' if count else ''}resource{'s' if rest != 1 else ''}" if rest else ""
            pieces.append(f"{words} " + " and ".join(filter(None, [", ".join(names[:count]), more])))
        return "; ".join(pieces + ([tail] if tail else []))

    grew = True
    while grew:  # one more name of each part in turn, while the line fits
        grew = False
        for index, (_, names) in enumerate(parts):
            if shown[index] < len(names):
                shown[index] += 1
                if len(text()) <= limit:
                    grew = True
                else:
                    shown[index] -= 1
    return text()
