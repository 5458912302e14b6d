"""A small evaluator of IAM policies for one request, for the bucket-policy tests: moto enforces
no IAM (tests/iam_grants.py), and no Python library on PyPI evaluates policies (parliament and
policyuniverse lint and parse; cloudsplaining reports).

What it follows, from the IAM User Guide ("Policy evaluation logic", "Condition operators"):

- An explicit ``Deny`` in any policy that applies wins; else an ``Allow`` in the principal's
  identity policies or in the resource policy (same account: either one suffices); else the
  request is implicitly denied.
- A statement applies when its ``Action`` (case-insensitive, ``*``/``?`` wildcards), its
  ``Resource`` (case-sensitive wildcards), its ``Principal`` (resource policies: ``*``, or the
  role's ARN, which names all its sessions) and every condition match.
- Conditions: every operator and every key of a block must hold (AND); the values of one key are
  ORed for a positive operator and ANDed for a negated one (the key matches none). A key absent
  from the request makes a positive operator false and a negated one true; ``...IfExists`` is
  true on an absent key; ``Null: true`` holds when the key is absent, ``Null: false`` when it is
  present. ``ArnEquals`` and ``ArnLike`` (and their negations) are the same operator: each of
  the six ``:``-separated parts is matched on its own, with wildcards (one does not span a ``:``).

- A permissions boundary (:func:`decide_bounded`, "Evaluating effective permissions with
  boundaries"): an identity-policy ``Allow`` counts only where the boundary allows the request
  too; a ``Deny`` in either wins. (A resource policy that names the role's session grants past a
  boundary; these tests give none.)

What it does not model, and refuses where a policy uses it (rather than answer wrongly):
``NotAction``, ``NotResource``, ``NotPrincipal``, an account as ``Principal``,
``ForAnyValue``/``ForAllValues``, and the operators it does not list. Policy variables are not
expanded (a ``${...}`` is compared as written). It never models: SCPs and RCPs, session
policies, the KMS key policy (a PUT with SSE-KMS also needs the key), ACLs (the buckets enforce
bucket-owner ownership), VPC endpoint policies, cross-account requests.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from typing import Any

Request = Mapping[str, str]
Statement = Mapping[str, Any]

#: The operators this evaluator implements (each also with ``IfExists``, except ``Null``).
OPERATORS = frozenset({
    "StringEquals", "StringNotEquals", "StringLike", "StringNotLike",
    "ArnEquals", "ArnNotEquals", "ArnLike", "ArnNotLike", "Bool", "NumericLessThan", "Null",
})
UNMODELLED_ELEMENTS = ("NotAction", "NotResource", "NotPrincipal")


class Unmodelled(ValueError):
    """The policy uses something this evaluator does not model."""


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def _glob(pattern: str, value: str, *, case: bool = True) -> bool:
    regex = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    return re.fullmatch(regex, value, 0 if case else re.IGNORECASE) is not None


def _arn_like(pattern: str, value: str) -> bool:
    parts, values = pattern.split(":", 5), value.split(":", 5)
    return len(parts) == len(values) == 6 and all(_glob(p, v) for p, v in zip(parts, values, strict=True))


def _match(base: str, expected: str, actual: str) -> bool:
    if base == "StringEquals":
        return expected == actual
    if base == "StringLike":
        return _glob(expected, actual)
    if base in ("ArnEquals", "ArnLike"):  # the same: both take wildcards in each part
        return _arn_like(expected, actual)
    if base == "Bool":
        return expected.lower() == actual.lower()
    if base == "NumericLessThan":
        return float(actual) < float(expected)
    raise Unmodelled(base)


_NEGATED = {"StringNotEquals": "StringEquals", "StringNotLike": "StringLike",
            "ArnNotEquals": "ArnEquals", "ArnNotLike": "ArnLike"}


def condition_holds(operator: str, key: str, values: Any, request: Request) -> bool:
    """Whether ``{operator: {key: values}}`` holds for ``request``."""
    if operator.startswith(("ForAnyValue:", "ForAllValues:")):
        raise Unmodelled(operator)
    if_exists = operator.endswith("IfExists")
    name = operator.removesuffix("IfExists")
    if name not in OPERATORS or (if_exists and name == "Null"):
        raise Unmodelled(operator)
    expected = [str(v).lower() if isinstance(v, bool) else str(v) for v in _list(values)]
    present = key in request
    if name == "Null":
        return any((value.lower() == "true") != present for value in expected)
    if not present:
        return if_exists or name in _NEGATED
    actual = request[key]
    if name in _NEGATED:
        return not any(_match(_NEGATED[name], value, actual) for value in expected)
    return any(_match(name, value, actual) for value in expected)


def _principal_matches(principal: Any, principal_arn: str) -> bool:
    if principal == "*":
        return True
    for value in _list(principal.get("AWS", [])) if isinstance(principal, Mapping) else []:
        if value == "*" or value == principal_arn:
            return True
        if re.fullmatch(r"arn:[^:]+:iam::[0-9]{12}:root|[0-9]{12}", str(value)):
            # An account principal delegates to that account's identity policies: not modelled.
            raise Unmodelled(f"Principal {value}")
    return False


def applies(statement: Statement, action: str, resource: str, request: Request, *, resource_policy: bool) -> bool:
    """Whether ``statement`` matches the request (its effect aside)."""
    for element in UNMODELLED_ELEMENTS:
        if element in statement:
            raise Unmodelled(element)
    if resource_policy and not _principal_matches(statement.get("Principal"), request.get("aws:PrincipalArn", "")):
        return False
    if not any(_glob(str(a), action, case=False) for a in _list(statement["Action"])):
        return False
    if not any(_glob(str(r), resource) for r in _list(statement["Resource"])):
        return False
    return all(condition_holds(operator, key, values, request)
               for operator, block in statement.get("Condition", {}).items()
               for key, values in block.items())


def decide(action: str, resource: str, request: Request, *, identity: Iterable[Statement],
           resource_policy: Iterable[Statement] = ()) -> str:
    """``"Deny"`` (explicit), ``"Allow"`` or ``"ImplicitDeny"`` for one request of one principal
    of the bucket's account."""
    found = [(statement["Effect"], applies(statement, action, resource, request, resource_policy=False))
             for statement in identity]
    found += [(statement["Effect"], applies(statement, action, resource, request, resource_policy=True))
              for statement in resource_policy]
    if any(effect == "Deny" and hit for effect, hit in found):
        return "Deny"
    if any(effect == "Allow" and hit for effect, hit in found):
        return "Allow"
    return "ImplicitDeny"


def decide_bounded(action: str, resource: str, request: Request, *, identity: Iterable[Statement],
                   boundary: Iterable[Statement]) -> str:
    """:func:`decide` for a role that carries the permissions boundary ``boundary``: ``"Allow"``
    only where its identity policies and the boundary both allow the request; ``"Deny"`` where
    either denies it explicitly; else ``"ImplicitDeny"``."""
    granted = decide(action, resource, request, identity=identity)
    bounded = decide(action, resource, request, identity=boundary)
    if "Deny" in (granted, bounded):
        return "Deny"
    return "Allow" if granted == bounded == "Allow" else "ImplicitDeny"


# ---------------------------------------------------------------------------------------------
# Template values as the deployed account would hold them
# ---------------------------------------------------------------------------------------------

ACCOUNT = "111122223333"
REGION = "us-east-1"


def arn_of(template: Mapping[str, Any], logical_id: str) -> str:
    """The ARN a resource of ``template`` gets, with its logical id standing for its name."""
    kind = template["Resources"][logical_id]["Type"]
    path = template["Resources"][logical_id].get("Properties", {}).get("Path", "/")
    return {
        "AWS::IAM::Role": f"arn:aws:iam::{ACCOUNT}:role{path}{logical_id}",
        "AWS::S3::Bucket": f"arn:aws:s3:::{logical_id.lower()}",
        "AWS::KMS::Key": f"arn:aws:kms:{REGION}:{ACCOUNT}:key/{logical_id}",
    }.get(kind, f"arn:aws:{kind}:{REGION}:{ACCOUNT}:{logical_id}")


def resolve(template: Mapping[str, Any], value: Any) -> Any:
    """``value`` with ``Fn::GetAtt ... Arn``, ``Ref`` and ``Fn::Join`` replaced by what they give
    (a role's or key's ARN, a bucket's name); anything else left as is."""
    if isinstance(value, list):
        return [resolve(template, v) for v in value]
    if not isinstance(value, dict):
        return value
    resources = template["Resources"]
    if set(value) == {"Fn::GetAtt"} and value["Fn::GetAtt"][1] == "Arn" and value["Fn::GetAtt"][0] in resources:
        return arn_of(template, value["Fn::GetAtt"][0])
    if set(value) == {"Ref"}:
        ref = value["Ref"]
        pseudo = {"AWS::Partition": "aws", "AWS::AccountId": ACCOUNT, "AWS::Region": REGION, "AWS::URLSuffix": "amazonaws.com"}
        if ref in pseudo:
            return pseudo[ref]
        if ref in resources:
            return arn_of(template, ref).rsplit(":", 1)[-1].rsplit("/", 1)[-1]
    if set(value) == {"Fn::Join"}:
        separator, parts = value["Fn::Join"]
        return str(separator).join(str(resolve(template, part)) for part in parts)
    if len(value) == 1 and next(iter(value)).startswith(("Fn::", "Ref")):
        # Another intrinsic (a parameter, a stack id, an import): a value no pattern here matches.
        return "<unresolved " + json.dumps(value, sort_keys=True) + ">"
    return {key: resolve(template, v) for key, v in value.items()}

