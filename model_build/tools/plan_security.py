"""Who can do what, before and after: the security changes of ``plan`` (verdict ``security-changed``).

A change to one of these resources' properties alters who can do what, and is a finding of its
own, whatever else the change does to the resource (a replaced key is data at risk *and* a key
policy change):

- IAM: a role's trust (``AssumeRolePolicyDocument``), its inline ``Policies``, its
  ``ManagedPolicyArns`` and ``PermissionsBoundary``; a policy's document and the roles, users and
  groups it is attached to (``AWS::IAM::Policy``, ``ManagedPolicy``, ``RolePolicy``); any other
  ``AWS::IAM::*`` resource, every property;
- KMS: a key's ``KeyPolicy`` (CloudFormation has no grant resource: a CDK ``grant*`` on a key is
  a statement of the key policy or of the grantee's policy, both compared here);
- S3: the ``BucketPolicy``, a bucket's ``PublicAccessBlockConfiguration``, ``BucketEncryption`` and
  canned ``AccessControl``;
- EC2: a security group's ingress and egress rules (inline, and the ``SecurityGroupIngress`` /
  ``SecurityGroupEgress`` resources), a VPC endpoint's ``PolicyDocument``.

Each change says whether access **widens**, **narrows** or is **unknown** (what this module
cannot classify; a gate treats it as widening: never the safe answer):

- a policy document is compared grant by grant (effect, principal, action, resource, condition;
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
  one added, so it widens); the egress list removed widens (CloudFormation then allows all
  outbound);
- a VPC endpoint's policy removed widens (the endpoint then allows full access).

A resource added is compared with nothing (every grant it carries is added), one removed the
reverse. This module is pure: no CDK, no diff engine (``plan_verdict`` calls it per resource the
engine says changed).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

WIDENS, NARROWS, UNKNOWN = "widens", "narrows", "unknown"
#: The properties that say who can do what, per resource type. ``ALL``: every property.
ALL = ("*",)
SECURITY_PROPERTIES: dict[str, tuple[str, ...]] = {
    "AWS::IAM::Role": ("AssumeRolePolicyDocument", "Policies", "ManagedPolicyArns", "PermissionsBoundary"),
    "AWS::IAM::Policy": ("PolicyDocument", "Roles", "Users", "Groups"),
    "AWS::IAM::ManagedPolicy": ("PolicyDocument", "Roles", "Users", "Groups"),
    "AWS::IAM::RolePolicy": ("PolicyDocument", "RoleName"),
    "AWS::KMS::Key": ("KeyPolicy",),
    "AWS::S3::BucketPolicy": ("PolicyDocument", "Bucket"),
    "AWS::S3::Bucket": ("PublicAccessBlockConfiguration", "BucketEncryption", "AccessControl"),
    "AWS::EC2::SecurityGroup": ("SecurityGroupIngress", "SecurityGroupEgress"),
    "AWS::EC2::SecurityGroupIngress": ALL,
    "AWS::EC2::SecurityGroupEgress": ALL,
    "AWS::EC2::VPCEndpoint": ("PolicyDocument",),
}
POLICY_DOCUMENTS = {("AWS::IAM::Role", "AssumeRolePolicyDocument"), ("AWS::IAM::Policy", "PolicyDocument"),
                    ("AWS::IAM::ManagedPolicy", "PolicyDocument"), ("AWS::IAM::RolePolicy", "PolicyDocument"),
                    ("AWS::KMS::Key", "KeyPolicy"), ("AWS::S3::BucketPolicy", "PolicyDocument"),
                    ("AWS::EC2::VPCEndpoint", "PolicyDocument")}
ATTACHMENTS = ("Roles", "Users", "Groups", "ManagedPolicyArns")
PUBLIC_ACCESS_FLAGS = ("BlockPublicAcls", "BlockPublicPolicy", "IgnorePublicAcls", "RestrictPublicBuckets")
#: Properties of a security-group rule resource that are not the rule.
RULE_OWNER = ("GroupId", "GroupName", "Description")
_MISSING: Any = object()


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


def is_security_type(resource_type: str) -> bool:
    return resource_type in SECURITY_PROPERTIES or resource_type.startswith("AWS::IAM::")


def only_security(resource_type: str, properties: list[str]) -> bool:
    """Whether every changed top-level property of a resource is one this module judges."""
    wanted = SECURITY_PROPERTIES.get(resource_type, ALL)
    return wanted == ALL or set(properties) <= set(wanted)


def overall_access(changes: list[SecurityChange] | tuple[SecurityChange, ...]) -> str:
    """widens if any change widens, else unknown if any is unknown, else narrows ("" for none)."""
    found = {change.access for change in changes}
    return next((access for access in (WIDENS, UNKNOWN, NARROWS) if access in found), "")


def security_changes(resource_type: str, old: Mapping[str, Any] | None,
                     new: Mapping[str, Any] | None) -> list[SecurityChange]:
    """What a change of a resource (its properties; None: absent) does to who can do what."""
    if not is_security_type(resource_type) or (resource_type == "AWS::S3::Bucket" and new is None):
        return []  # a bucket deleted is data at risk, not access granted
    old_props, new_props = dict(old or {}), dict(new or {})
    if resource_type in ("AWS::EC2::SecurityGroupIngress", "AWS::EC2::SecurityGroupEgress"):
        rule = {side: ([{k: v for k, v in props.items() if k not in RULE_OWNER}] if present is not None else [])
                for side, props, present in (("old", old_props, old), ("new", new_props, new))}
        return _rules("rule", rule["old"], rule["new"])
    wanted = SECURITY_PROPERTIES.get(resource_type, ALL)
    names = sorted(set(old_props) | set(new_props)) if wanted == ALL else list(wanted)
    found: list[SecurityChange] = []
    for name in names:
        before, after = old_props.get(name, _MISSING), new_props.get(name, _MISSING)
        if before == after:
            continue
        found += _property(resource_type, name, before, after, created=old is None, existed=new is not None)
    if resource_type == "AWS::EC2::SecurityGroup" and old is None and new is not None and (
            "SecurityGroupEgress" not in new_props):
        found.append(SecurityChange("SecurityGroupEgress", "unset: CloudFormation allows all outbound traffic", WIDENS))
    if resource_type == "AWS::EC2::VPCEndpoint" and old is None and new is not None and "PolicyDocument" not in new_props:
        found.append(SecurityChange("PolicyDocument", "unset: the endpoint allows full access", WIDENS))
    return found


def _property(resource_type: str, name: str, before: Any, after: Any, *, created: bool,
              existed: bool) -> list[SecurityChange]:
    if (resource_type, name) in POLICY_DOCUMENTS:
        if resource_type == "AWS::EC2::VPCEndpoint":
            if after is _MISSING and existed:
                return [SecurityChange(name, "removed: the endpoint allows full access", WIDENS)]
            if before is _MISSING and not created:
                return [SecurityChange(name, "set (the endpoint allowed full access)",
                                       NARROWS if _grants(after) is not None else UNKNOWN)]
        return _policy(name, None if before is _MISSING else before, None if after is _MISSING else after)
    if resource_type == "AWS::IAM::Role" and name == "Policies":
        return _inline_policies(before, after)
    if name in ATTACHMENTS:
        return _attachments(name, before, after)
    if name == "PermissionsBoundary":
        access = WIDENS if after is _MISSING else NARROWS if before is _MISSING else UNKNOWN
        return [SecurityChange(name, f"{_shown(before)} -> {_shown(after)}", access)]
    if name == "PublicAccessBlockConfiguration":
        return _public_access(before, after, created=created)
    if name == "BucketEncryption":
        return [] if created else _encryption(before, after)  # a new bucket: S3 encrypts by default
    if name == "AccessControl":
        if after == "Private" and created:
            return []
        access = NARROWS if after == "Private" else WIDENS if before in (_MISSING, "Private") else UNKNOWN
        return [SecurityChange(name, f"{_shown(before)} -> {_shown(after)}", access)]
    if name in ("SecurityGroupIngress", "SecurityGroupEgress"):
        if name == "SecurityGroupEgress" and after is _MISSING and existed:
            return [SecurityChange(name, "removed: CloudFormation then allows all outbound traffic", WIDENS)]
        return _rules(name, [] if before is _MISSING else before, [] if after is _MISSING else after)
    if name in ("Bucket", "RoleName") and (before is _MISSING or after is _MISSING):
        return []  # the policy's own creation or removal: its statements say what changes
    return [SecurityChange(name, f"{_shown(before)} -> {_shown(after)}", UNKNOWN)]


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


def _grants(document: Any) -> set[_Grant] | None:
    """Every (effect, principal, action, resource, condition) a document states; None when it is
    not a literal policy document (this module cannot read it)."""
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


def _policy(path: str, before: Any, after: Any) -> list[SecurityChange]:
    old, new = _grants(before), _grants(after)
    if old is None or new is None:
        return [SecurityChange(path, f"changed, not a literal policy document ({_shown(before)} -> {_shown(after)})",
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
        return _shown(condition)
    parts = [f"{operator} {key}={'|'.join(render(item) for item in _as_list(value))}"
             for operator, tests in sorted(condition.items()) if isinstance(tests, dict)
             for key, value in sorted(tests.items())]
    text = ", ".join(parts) or _shown(condition)
    return text if len(text) <= 160 else text[:157] + "..."


def _inline_policies(before: Any, after: Any) -> list[SecurityChange]:
    """A role's inline ``Policies``, matched by ``PolicyName``: ``Policies[i]`` is the index in the
    new list (the old one for a policy removed)."""
    old, new = ([] if side is _MISSING else side for side in (before, after))
    if not isinstance(old, list) or not isinstance(new, list) or not all(
            isinstance(item, dict) for item in [*old, *new]):
        return [SecurityChange("Policies", f"changed, not a literal list ({_shown(before)} -> {_shown(after)})",
                               UNKNOWN)]
    old_named = {render(item.get("PolicyName")): (index, item) for index, item in enumerate(old)}
    new_named = {render(item.get("PolicyName")): (index, item) for index, item in enumerate(new)}
    found: list[SecurityChange] = []
    for name in sorted(set(old_named) | set(new_named)):
        index, _ = new_named.get(name) or old_named[name]
        found += _policy(f"Policies[{index}]", (old_named.get(name) or (0, {}))[1].get("PolicyDocument"),
                         (new_named.get(name) or (0, {}))[1].get("PolicyDocument"))
    return found


def _attachments(name: str, before: Any, after: Any) -> list[SecurityChange]:
    old = {render(item) for item in _as_list([] if before is _MISSING else before)}
    new = {render(item) for item in _as_list([] if after is _MISSING else after)}
    found = [SecurityChange(name, f"added {item}", WIDENS) for item in sorted(new - old)]
    return found + [SecurityChange(name, f"removed {item}", NARROWS) for item in sorted(old - new)]


def _public_access(before: Any, after: Any, *, created: bool) -> list[SecurityChange]:
    old = {} if before is _MISSING else before
    new = {} if after is _MISSING else after
    if not isinstance(old, dict) or not isinstance(new, dict):
        return [SecurityChange("PublicAccessBlockConfiguration", f"{_shown(before)} -> {_shown(after)}", UNKNOWN)]
    found = []
    for flag in PUBLIC_ACCESS_FLAGS:
        was, now = old.get(flag, _MISSING), new.get(flag, _MISSING)
        if was == now or (created and now is True):
            continue  # a new bucket that blocks public access changes nobody's access
        # A new bucket that does not block, or a flag turned off, widens.
        access = WIDENS if created or was is True else NARROWS if now is True else UNKNOWN
        found.append(SecurityChange(f"PublicAccessBlockConfiguration.{flag}", f"{_shown(was)} -> {_shown(now)}",
                                    access))
    return found


def _algorithms(value: Any) -> set[str] | None:
    if value is _MISSING:
        return set()
    try:
        return {str(rule["ServerSideEncryptionByDefault"]["SSEAlgorithm"])
                for rule in value["ServerSideEncryptionConfiguration"]}
    except (KeyError, TypeError):
        return None


def _encryption(before: Any, after: Any) -> list[SecurityChange]:
    old, new = _algorithms(before), _algorithms(after)
    text = f"{_shown(before)} -> {_shown(after)}"
    if after is _MISSING:
        return [SecurityChange("BucketEncryption", "removed: objects are encrypted with S3's own keys (SSE-S3), "
                               "readable without access to a KMS key", WIDENS)]
    if before is _MISSING or old is None or new is None:
        access = NARROWS if before is _MISSING and new and new <= {"aws:kms", "aws:kms:dsse"} else UNKNOWN
        return [SecurityChange("BucketEncryption", text, access)]
    kms = {"aws:kms", "aws:kms:dsse"}
    if old & kms and not new & kms:
        return [SecurityChange("BucketEncryption", f"{sorted(old)} -> {sorted(new)}: a KMS key is no longer needed to "
                               "read", WIDENS)]
    if new & kms and not old & kms:
        return [SecurityChange("BucketEncryption", f"{sorted(old)} -> {sorted(new)}", NARROWS)]
    return [SecurityChange("BucketEncryption", text, UNKNOWN)]


def _rules(name: str, before: Any, after: Any) -> list[SecurityChange]:
    """Security-group rules compared whole: one added widens, one removed narrows."""
    if not isinstance(before, list) or not isinstance(after, list):
        return [SecurityChange(name, f"{_shown(before)} -> {_shown(after)}", UNKNOWN)]
    old = {json.dumps(rule, sort_keys=True) for rule in before}
    new = {json.dumps(rule, sort_keys=True) for rule in after}
    found = [SecurityChange(name, f"added {_rule(rule)}", WIDENS) for rule in sorted(new - old)]
    return found + [SecurityChange(name, f"removed {_rule(rule)}", NARROWS) for rule in sorted(old - new)]


def _rule(text: str) -> str:
    rule = json.loads(text)
    if not isinstance(rule, dict):
        return _shown(rule)
    peer = next((render(rule[key]) for key in ("CidrIp", "CidrIpv6", "SourceSecurityGroupId", "DestinationSecurityGroupId",
                                                "SourcePrefixListId", "DestinationPrefixListId") if key in rule), "?")
    ports = (f"{rule.get('FromPort')}" if rule.get("FromPort") == rule.get("ToPort")
             else f"{rule.get('FromPort')}-{rule.get('ToPort')}")
    return f"{rule.get('IpProtocol', '?')} {ports} {peer}"


def _shown(value: Any) -> str:
    if value is _MISSING:
        return "(unset)"
    text = render(value)
    return text if len(text) <= 100 else text[:97] + "..."
