"""Who can do what, before and after: how ``plan`` compares a policy document, grant by grant.

Which properties of which resource types say who can do what is :mod:`.plan_access`'s table; this
module is the grammar it compares most of them with. Each change says whether access **widens**,
**narrows** or is **unknown** (what cannot be classified; a gate treats it as widening: never the
safe answer):

- a policy document (an identity policy, a trust policy or a resource policy; a JSON string is
  read as JSON) is compared grant by grant (effect, principal, action, resource, condition;
  ``Ref``/``Fn::GetAtt``/``Fn::Join`` rendered as ``${Id.Attr}`` text). An Allow added that no
  old Allow already covers (``*`` and ``?`` matched as IAM matches them; a principal ``*`` covers
  every principal; an unconditioned grant covers a conditioned one) widens, an Allow removed that
  no new Allow still covers narrows; a Deny is the reverse. A condition removed from an Allow
  widens, one added narrows; a condition changed, and any ``NotAction`` / ``NotResource`` /
  ``NotPrincipal`` statement that changes, is unknown. A document that is not literal JSON (an
  ``Fn::If``) is unknown;
- attachments (``Roles``, ``ManagedPolicyArns``...): one added widens, one removed narrows;
- a public-access flag turned off (or unset) widens, on narrows; bucket encryption removed, or
  ``aws:kms`` turned into ``AES256`` (no key access needed any more), widens; the reverse narrows;
  any other encryption change is unknown;
- a security-group rule added widens, removed narrows (a wider CIDR is both: one rule removed,
  one added, so it widens).

A resource added is compared with nothing (every grant it carries is added), one removed the
reverse. This module is pure: no CDK, no diff engine.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

WIDENS, NARROWS, UNKNOWN = "widens", "narrows", "unknown"
#: Properties of a security-group rule resource that are not the rule.
RULE_OWNER = ("GroupId", "GroupName", "Description")
PUBLIC_ACCESS_FLAGS = ("BlockPublicAcls", "BlockPublicPolicy", "IgnorePublicAcls", "RestrictPublicBuckets")
#: A property absent on one side (a resource created, removed, or the property set or unset).
MISSING: Any = object()


@dataclass(frozen=True)
class SecurityChange:
    """One change of who can do what: the property, what changed, and which way access goes."""

    path: str  # "PolicyDocument", "Policies[0]", "PublicAccessBlockConfiguration.BlockPublicPolicy"
    text: str  # "added Allow s3:PutObject on ${ModelBucket.Arn}/*"
    access: str  # widens | narrows | unknown

    def line(self) -> str:
        return f"{self.path} {self.text} ({self.access})"

    def as_json(self) -> dict[str, str]:
        return {"property": self.path, "change": self.text, "access": self.access}


def overall_access(changes: list[SecurityChange] | tuple[SecurityChange, ...]) -> str:
    """widens if any change widens, else unknown if any is unknown, else narrows ("" for none)."""
    found = {change.access for change in changes}
    return next((access for access in (WIDENS, UNKNOWN, NARROWS) if access in found), "")


# ---------------------------------------------------------------------------------------------
# Policy documents, grant by grant
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Grant:
    effect: str
    principal: str  # "" in an identity policy; "Service:sagemaker.amazonaws.com"; "*"
    action: str
    resource: str  # "" where the statement names none (a trust policy)
    condition: str  # canonical JSON, "" for none
    opaque: bool  # a NotAction / NotResource / NotPrincipal statement: never classified

    def key(self) -> tuple[str, str, str, str, bool]:
        return self.effect, self.principal, self.action, self.resource, self.opaque


def render(value: Any) -> str:
    """A template value as a reviewer reads it: ``${Bucket.Arn}/models/*`` for the intrinsics."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and len(value) == 1:
        (function, args), = value.items()
        if function == "Ref" and isinstance(args, str):
            return "${" + args + "}"
        if function == "Fn::GetAtt":
            parts = args if isinstance(args, list) else str(args).split(".", 1)
            return "${" + ".".join(str(part) for part in parts) + "}"
        if function == "Fn::Join" and isinstance(args, list) and len(args) == 2 and isinstance(args[1], list):
            return str(args[0]).join(render(part) for part in args[1])
        if function == "Fn::Sub":
            return render(args[0] if isinstance(args, list) and args else args)
    return json.dumps(value, sort_keys=True)


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def is_literal_policy(document: Any) -> bool:
    """Whether ``document`` is a policy document this module can read (literal JSON)."""
    return _grants(document) is not None


def _grants(document: Any) -> set[_Grant] | None:
    """Every (effect, principal, action, resource, condition) a document states; None when it is
    not a literal policy document (this module cannot read it). A JSON string is read as JSON
    (a log or repository policy's text)."""
    if isinstance(document, str):
        try:
            document = json.loads(document)
        except ValueError:
            return None
    if document is None:
        return set()
    if (not isinstance(document, dict) or set(document) - {"Version", "Id", "Statement"}
            or not isinstance(document.get("Statement", []), (list, dict))):
        return None  # an Fn::If, a Ref, an imported value: not literal
    grants: set[_Grant] = set()
    for statement in _as_list(document.get("Statement", [])):
        if not isinstance(statement, dict) or statement.get("Effect") not in ("Allow", "Deny"):
            return None
        opaque = any(key in statement for key in ("NotAction", "NotResource", "NotPrincipal"))
        condition = json.dumps(statement["Condition"], sort_keys=True) if statement.get("Condition") else ""
        principals = _principals(statement)
        actions = [render(a) for a in _as_list(statement.get("Action", []))] or [
            "NotAction " + render(statement.get("NotAction"))]
        resources = [render(r) for r in _as_list(statement["Resource"])] if "Resource" in statement else (
            ["NotResource " + render(statement["NotResource"])] if "NotResource" in statement else [""])
        grants |= {_Grant(statement["Effect"], principal, action, resource, condition, opaque)
                   for principal in principals for action in actions for resource in resources}
    return grants


def _principals(statement: Mapping[str, Any]) -> list[str]:
    if "NotPrincipal" in statement:
        return ["NotPrincipal " + render(statement["NotPrincipal"])]
    principal = statement.get("Principal")
    if principal is None:
        return [""]
    if principal == "*" or principal == {"AWS": "*"}:
        return ["*"]
    if isinstance(principal, dict):
        return [f"{kind}:{render(item)}" for kind, value in sorted(principal.items()) for item in _as_list(value)]
    return [render(principal)]


def _glob(pattern: str, text: str, *, fold: bool = False) -> bool:
    if fold:
        pattern, text = pattern.lower(), text.lower()
    regex = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    return re.fullmatch(regex, text, re.DOTALL) is not None


def _covers(wide: _Grant, narrow: _Grant) -> bool:
    """Whether ``wide`` grants (or denies) at least everything ``narrow`` does."""
    if wide == narrow:
        return True
    if wide.opaque or narrow.opaque or wide.effect != narrow.effect:
        return False
    return ((wide.principal == narrow.principal or wide.principal == "*")
            and _glob(wide.action, narrow.action, fold=True) and _glob(wide.resource, narrow.resource)
            and wide.condition in ("", narrow.condition))


def policy_changes(path: str, before: Any, after: Any) -> list[SecurityChange]:
    old, new = _grants(before), _grants(after)
    if old is None or new is None:
        return [SecurityChange(path, f"changed, not a literal policy document ({shown(before)} -> {shown(after)})",
                               UNKNOWN)]
    found: list[tuple[str, _Grant, str]] = []  # (what happened, grant, access)
    added, removed = new - old, old - new
    # A twin: the same grant with another condition, on the other side (the condition changed).
    for grant in sorted(added, key=_order):
        if any(_covers(other, grant) for other in old):
            continue  # already granted (or denied): no change of access
        twin = next((other for other in removed if other.key() == grant.key()), None)
        if grant.opaque:
            found.append(("added", grant, UNKNOWN))
        elif twin is not None and grant.condition and twin.condition:
            found.append(("changed the condition of", grant, UNKNOWN))
        else:
            verb = "removed the condition of" if twin is not None else "added"
            found.append((verb, grant, WIDENS if grant.effect == "Allow" else NARROWS))
    for grant in sorted(removed, key=_order):
        if any(_covers(other, grant) for other in new):
            continue  # still granted (or denied) by a grant at least as wide
        twin = next((other for other in added if other.key() == grant.key()), None)
        if twin is not None and not grant.opaque:
            if grant.condition:
                continue  # reported above: a condition changed
            found.append(("added a condition to", grant, NARROWS if grant.effect == "Allow" else WIDENS))
        else:
            found.append(("removed", grant, UNKNOWN if grant.opaque else
                          NARROWS if grant.effect == "Allow" else WIDENS))
    return _grouped(path, found)


def _order(grant: _Grant) -> tuple[str, ...]:
    return grant.effect, grant.principal, grant.resource, grant.action, grant.condition


def _grouped(path: str, found: list[tuple[str, _Grant, str]]) -> list[SecurityChange]:
    """One change per (what happened, effect, principal, condition, access) and set of actions,
    naming its resources: ``added Allow s3:GetObject, s3:PutObject on A, B``."""
    by_resource: dict[tuple[str, str, str, str, str, str], list[str]] = {}
    for verb, grant, access in found:
        key = (verb, grant.effect, grant.principal, grant.condition, access, grant.resource)
        by_resource.setdefault(key, []).append(grant.action)
    by_actions: dict[tuple[Any, ...], list[str]] = {}
    for (verb, effect, principal, condition, access, resource), actions in by_resource.items():
        by_actions.setdefault((verb, effect, principal, condition, access, tuple(sorted(actions))), []).append(resource)
    changes = []
    for (verb, effect, principal, condition, access, actions), resources in by_actions.items():
        text = f"{verb} {effect} {', '.join(actions)}"
        named = [resource for resource in resources if resource]
        if named:
            text += " on " + ", ".join(sorted(named))
        if principal:
            text += f" for {principal}"
        if condition:
            text += f" when {_condition(json.loads(condition))}"
        changes.append(SecurityChange(path, text, access))
    return changes


def _condition(condition: Any) -> str:
    """``StringEquals aws:SourceAccount=${AWS::AccountId}`` for a statement's condition block."""
    if not isinstance(condition, dict):
        return shown(condition)
    parts = [f"{operator} {key}={'|'.join(render(item) for item in _as_list(value))}"
             for operator, tests in sorted(condition.items()) if isinstance(tests, dict)
             for key, value in sorted(tests.items())]
    text = ", ".join(parts) or shown(condition)
    return text if len(text) <= 160 else text[:157] + "..."


def inline_policies(before: Any, after: Any) -> list[SecurityChange]:
    """A role's inline ``Policies``, matched by ``PolicyName``: ``Policies[i]`` is the index in the
    new list (the old one for a policy removed)."""
    old, new = ([] if side is MISSING else side for side in (before, after))
    if not isinstance(old, list) or not isinstance(new, list) or not all(
            isinstance(item, dict) for item in [*old, *new]):
        return [SecurityChange("Policies", f"changed, not a literal list ({shown(before)} -> {shown(after)})",
                               UNKNOWN)]
    old_named = {render(item.get("PolicyName")): (index, item) for index, item in enumerate(old)}
    new_named = {render(item.get("PolicyName")): (index, item) for index, item in enumerate(new)}
    found: list[SecurityChange] = []
    for name in sorted(set(old_named) | set(new_named)):
        index, _ = new_named.get(name) or old_named[name]
        found += policy_changes(f"Policies[{index}]", (old_named.get(name) or (0, {}))[1].get("PolicyDocument"),
                         (new_named.get(name) or (0, {}))[1].get("PolicyDocument"))
    return found


def attachments(name: str, before: Any, after: Any) -> list[SecurityChange]:
    old = {render(item) for item in _as_list([] if before is MISSING else before)}
    new = {render(item) for item in _as_list([] if after is MISSING else after)}
    found = [SecurityChange(name, f"added {item}", WIDENS) for item in sorted(new - old)]
    return found + [SecurityChange(name, f"removed {item}", NARROWS) for item in sorted(old - new)]


def public_access(before: Any, after: Any, *, created: bool) -> list[SecurityChange]:
    old = {} if before is MISSING else before
    new = {} if after is MISSING else after
    if not isinstance(old, dict) or not isinstance(new, dict):
        return [SecurityChange("PublicAccessBlockConfiguration", f"{shown(before)} -> {shown(after)}", UNKNOWN)]
    found = []
    for flag in PUBLIC_ACCESS_FLAGS:
        was, now = old.get(flag, MISSING), new.get(flag, MISSING)
        if was == now or (created and now is True):
            continue  # a new bucket that blocks public access changes nobody's access
        # A new bucket that does not block, or a flag turned off, widens.
        access = WIDENS if created or was is True else NARROWS if now is True else UNKNOWN
        found.append(SecurityChange(f"PublicAccessBlockConfiguration.{flag}", f"{shown(was)} -> {shown(now)}",
                                    access))
    return found


def _algorithms(value: Any) -> set[str] | None:
    if value is MISSING:
        return set()
    try:
        return {str(rule["ServerSideEncryptionByDefault"]["SSEAlgorithm"])
                for rule in value["ServerSideEncryptionConfiguration"]}
    except (KeyError, TypeError):
        return None


def encryption(before: Any, after: Any) -> list[SecurityChange]:
    old, new = _algorithms(before), _algorithms(after)
    text = f"{shown(before)} -> {shown(after)}"
    if after is MISSING:
        return [SecurityChange("BucketEncryption", "removed: objects are encrypted with S3's own keys (SSE-S3), "
                               "readable without access to a KMS key", WIDENS)]
    if before is MISSING or old is None or new is None:
        access = NARROWS if before is MISSING and new and new <= {"aws:kms", "aws:kms:dsse"} else UNKNOWN
        return [SecurityChange("BucketEncryption", text, access)]
    kms = {"aws:kms", "aws:kms:dsse"}
    if old & kms and not new & kms:
        return [SecurityChange("BucketEncryption", f"{sorted(old)} -> {sorted(new)}: a KMS key is no longer needed to "
                               "read", WIDENS)]
    if new & kms and not old & kms:
        return [SecurityChange("BucketEncryption", f"{sorted(old)} -> {sorted(new)}", NARROWS)]
    return [SecurityChange("BucketEncryption", text, UNKNOWN)]


def sg_rules(name: str, before: Any, after: Any) -> list[SecurityChange]:
    """Security-group rules compared whole: one added widens, one removed narrows."""
    if not isinstance(before, list) or not isinstance(after, list):
        return [SecurityChange(name, f"{shown(before)} -> {shown(after)}", UNKNOWN)]
    old = {json.dumps(rule, sort_keys=True) for rule in before}
    new = {json.dumps(rule, sort_keys=True) for rule in after}
    found = [SecurityChange(name, f"added {_rule(rule)}", WIDENS) for rule in sorted(new - old)]
    return found + [SecurityChange(name, f"removed {_rule(rule)}", NARROWS) for rule in sorted(old - new)]


def rule_resource_changes(old: Mapping[str, Any] | None, new: Mapping[str, Any] | None) -> list[SecurityChange]:
    """A rule that is a resource of its own (``AWS::EC2::SecurityGroupIngress``): added or removed whole."""
    rules = [[{k: v for k, v in side.items() if k not in RULE_OWNER}] if side is not None else [] for side in (old, new)]
    return sg_rules("rule", rules[0], rules[1])


def permission_document(props: Mapping[str, Any] | None, principal_key: str, action_key: str, resource_key: str,
                        conditions: Mapping[str, tuple[str, str]]) -> dict[str, Any] | None:
    """A grant spelled as a resource's properties (``AWS::Lambda::Permission``) as the statement it
    adds to the resource's policy: its principal, action and resource, and each property in
    ``conditions`` (name -> operator, condition key) as a condition. None for no resource."""
    if props is None:
        return None
    principal = render(props.get(principal_key, "*"))
    kind = "Service" if principal.endswith(".amazonaws.com") else "AWS"
    statement: dict[str, Any] = {"Effect": "Allow", "Action": props.get(action_key, "?"),
                                 "Resource": props.get(resource_key, "?"),
                                 "Principal": "*" if principal == "*" else {kind: props.get(principal_key)}}
    condition: dict[str, dict[str, Any]] = {}
    for key, (operator, name) in conditions.items():
        if key in props:
            condition.setdefault(operator, {})[name] = props[key]
    if condition:
        statement["Condition"] = condition
    return {"Version": "2012-10-17", "Statement": [statement]}


def _rule(text: str) -> str:
    rule = json.loads(text)
    if not isinstance(rule, dict):
        return shown(rule)
    peer = next((render(rule[key]) for key in ("CidrIp", "CidrIpv6", "SourceSecurityGroupId", "DestinationSecurityGroupId",
                                                "SourcePrefixListId", "DestinationPrefixListId") if key in rule), "?")
    ports = (f"{rule.get('FromPort')}" if rule.get("FromPort") == rule.get("ToPort")
             else f"{rule.get('FromPort')}-{rule.get('ToPort')}")
    return f"{rule.get('IpProtocol', '?')} {ports} {peer}"


def shown(value: Any) -> str:
    if value is MISSING:
        return "(unset)"
    text = render(value)
    return text if len(text) <= 100 else text[:97] + "..."
