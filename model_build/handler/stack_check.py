"""A custom-resource event checked against CloudFormation before ``on_event`` or ``is_complete``
acts on it (a confused deputy otherwise: anyone who may invoke the function could send an old
``ReleaseId`` and re-route the fleet, or ``RetentionDays "0"`` and have it delete at once).

:func:`check_event`:

1. the function's own stack: the ``aws:cloudformation:stack-id`` tag CloudFormation puts on the
   functions it creates (``lambda:ListTags`` on the function the context names; a tag of the
   ``aws:`` prefix cannot be set or removed by anyone else). No context ARN, or a function without
   that tag (not created by a stack: a local run), is not checked, and the log says so;
2. the event's ``StackId`` is that stack;
3. the stack is in an operation that sends this request type (``DescribeStacks``): a Create or an
   Update only while the stack is created, updated or rolled back, a Delete only while in progress;
4. the event's ``LogicalResourceId`` is a ``Custom::TritonModelRelease`` of the stack's template
   (``GetTemplate``), and every property the template gives is the event's: literals as
   CloudFormation sends them (strings), ``Ref`` of a resource by ``DescribeStackResource``, of a
   parameter by the stack's parameters, ``Fn::Sub`` of pseudo parameters. A value of another
   intrinsic (``Fn::GetAtt``: the service token) is not compared, and the log names it; a property
   the template does not give is refused; ``ServiceTimeout`` (CloudFormation's own) only when the
   event carries it. While a rollback runs, CloudFormation's documentation
   does not say which of the two templates ``GetTemplate`` returns: the request passes when its
   properties or its ``OldResourceProperties`` are the template's.

A refusal is a :class:`HandlerError` of one line naming the property and both values (for
``ReleaseId``: both releases); nothing has been read, routed or deleted then. A CloudFormation or
Lambda call that fails refuses the request too: what cannot be checked is not taken as checked.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from typing import Any

from triton_mme_cdk.model_build.handler.request import LOG, HandlerError, shown

RESOURCE_TYPE = "Custom::TritonModelRelease"
STACK_TAG = "aws:cloudformation:stack-id"
#: Stack states in which CloudFormation sends each request type to a custom resource.
SENT_IN: dict[str, frozenset[str]] = {
    "Create": frozenset({"CREATE_IN_PROGRESS", "UPDATE_IN_PROGRESS", "IMPORT_IN_PROGRESS"}),
    "Update": frozenset({"UPDATE_IN_PROGRESS", "UPDATE_ROLLBACK_IN_PROGRESS"}),
    "Delete": frozenset({"DELETE_IN_PROGRESS", "ROLLBACK_IN_PROGRESS", "UPDATE_COMPLETE_CLEANUP_IN_PROGRESS",
                         "UPDATE_ROLLBACK_IN_PROGRESS", "UPDATE_ROLLBACK_COMPLETE_CLEANUP_IN_PROGRESS",
                         "IMPORT_ROLLBACK_IN_PROGRESS"}),
}
ROLLING_BACK = frozenset({"UPDATE_ROLLBACK_IN_PROGRESS", "ROLLBACK_IN_PROGRESS", "IMPORT_ROLLBACK_IN_PROGRESS"})
#: The properties compared first, so that a refusal names the release when it differs.
FIRST = ("ReleaseId", "RetentionDays", "OnDelete", "ModelBucket", "ModelPrefix")
#: CloudFormation's own properties of a custom resource, which its request need not carry:
#: compared only when the event has them.
RESERVED = ("ServiceTimeout",)
_SUB = re.compile(r"\$\{([^}]+)\}")


class _Unknown:
    """A template value this check cannot resolve (an intrinsic other than those it knows)."""

    def __init__(self, what: str) -> None:
        self.what = what


def _client(service: str, variable: str) -> Any:
    import boto3

    return boto3.client(service, endpoint_url=os.environ.get(variable))  # the variable: local runs only


def function_arn(context: Any) -> str | None:
    """The function the context names, without a version or alias qualifier."""
    arn = getattr(context, "invoked_function_arn", None)
    if not isinstance(arn, str) or not arn.startswith("arn:"):
        return None
    return ":".join(arn.split(":")[:7])


def check_event(event: Mapping[str, Any], context: Any) -> str:
    """Refuse an event CloudFormation did not send for this function's stack (module docstring).
    Returns what was checked, for the log."""
    from botocore.exceptions import BotoCoreError, ClientError

    kind = str(event.get("RequestType"))
    arn = function_arn(context)
    if arn is None:
        LOG.warning("event not checked against CloudFormation: the context names no function (a local run)")
        return "not checked: no function"
    try:
        tags = _client("lambda", "MODEL_BUILD_LAMBDA_ENDPOINT_URL").list_tags(Resource=arn).get("Tags") or {}
    except (ClientError, BotoCoreError) as error:
        raise HandlerError(f"the function's tags cannot be read ({_code(error)}); the request is not checked "
                           "against CloudFormation, so it is refused") from None
    stack = tags.get(STACK_TAG)
    if not stack:
        LOG.warning("event not checked against CloudFormation: function %s has no %s tag (not created by a stack)",
                    arn, STACK_TAG)
        return "not checked: no stack"
    if event.get("StackId") != stack:
        raise HandlerError(f"event StackId: got {shown(event.get('StackId'))}; this function belongs to stack "
                           f"{stack}: refused, nothing is routed or deleted")
    cloudformation = _client("cloudformation", "MODEL_BUILD_CLOUDFORMATION_ENDPOINT_URL")
    try:
        (described,) = cloudformation.describe_stacks(StackName=stack)["Stacks"]
        body = cloudformation.get_template(StackName=stack, TemplateStage="Original")["TemplateBody"]
    except (ClientError, BotoCoreError) as error:
        raise HandlerError(f"stack {stack}: cannot be described ({_code(error)}); the request is not checked, so it "
                           "is refused") from None
    status = str(described.get("StackStatus"))
    if status not in SENT_IN.get(kind, frozenset()):
        raise HandlerError(f"stack {stack} is {status}: CloudFormation sends a {kind} only while it is "
                           f"{', '.join(sorted(SENT_IN.get(kind, ())))}; refused, nothing is routed or deleted")
    logical_id = str(event.get("LogicalResourceId"))
    template = json.loads(body) if isinstance(body, str) else body
    resource = (template.get("Resources") or {}).get(logical_id) if isinstance(template, Mapping) else None
    if not isinstance(resource, Mapping) or resource.get("Type") != RESOURCE_TYPE:
        raise HandlerError(f"event LogicalResourceId: got {shown(logical_id)}; stack {stack} has no {RESOURCE_TYPE} "
                           "of that name: refused, nothing is routed or deleted")
    resolver = _Resolver(cloudformation, stack, described)
    expected = {key: resolver.resolve(value) for key, value in (resource.get("Properties") or {}).items()}
    problem = _difference(expected, event.get("ResourceProperties"), stack, logical_id)
    if (problem and status in ROLLING_BACK and "OldResourceProperties" in event
            and _difference(expected, event.get("OldResourceProperties"), stack, logical_id) is None):
        LOG.info("a rollback of stack %s: the event's OldResourceProperties are its template's", stack)
        problem = None
    if problem:
        raise HandlerError(problem)
    unknown = sorted(key for key, value in expected.items() if isinstance(value, _Unknown))
    LOG.info("event checked against stack %s (%s, %s); not compared (intrinsics): %s", stack, status, logical_id,
             ", ".join(unknown) or "none")
    return f"checked: {stack} {status}"


def _difference(expected: Mapping[str, Any], given: Any, stack: str, logical_id: str) -> str | None:
    """The first property where ``given`` (the event's) is not the template's, as the refusal's line."""
    if not isinstance(given, Mapping):
        return f"event ResourceProperties: got {type(given).__name__}; expected the template's properties"
    keys = [k for k in FIRST if k in expected or k in given]
    keys += sorted((set(expected) | set(given)) - set(FIRST))
    for key in keys:
        value = expected.get(key)
        if isinstance(value, _Unknown):
            continue
        if key not in expected:
            return (f"property {key}: got {shown(given[key])}; stack {stack}'s template gives {logical_id} no {key}: "
                    "refused, nothing is routed or deleted")
        if key in RESERVED and key not in given:
            continue
        if _canonical(given.get(key)) != value:
            if key == "ReleaseId":
                return (f"property ReleaseId: the event names release {shown(given.get(key))}, stack {stack}'s "
                        f"template names release {value!r} for {logical_id}: refused, nothing is routed or deleted")
            return (f"property {key}: got {shown(given.get(key))}; stack {stack}'s template gives "
                    f"{shown(value)} for {logical_id}: refused, nothing is routed or deleted")
    return None


def _canonical(value: Any) -> Any:
    """A value as CloudFormation passes it to a custom resource: every scalar a string."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return json.dumps(value)
    if isinstance(value, list):
        return [_canonical(item) for item in value]
    if isinstance(value, dict):
        return {str(key): _canonical(item) for key, item in value.items()}
    return value


class _Resolver:
    """Template values resolved as CloudFormation resolved them for this stack, where knowable."""

    def __init__(self, cloudformation: Any, stack: str, described: Mapping[str, Any]) -> None:
        self.cloudformation, self.stack = cloudformation, stack
        _, partition, _, region, account, _ = stack.split(":", 5)
        self.pseudo = {"AWS::AccountId": account, "AWS::Region": region, "AWS::Partition": partition,
                       "AWS::StackId": stack, "AWS::StackName": str(described.get("StackName", ""))}
        self.parameters = {str(p.get("ParameterKey")): str(p.get("ResolvedValue") or p.get("ParameterValue"))
                           for p in described.get("Parameters") or []}

    def resolve(self, value: Any) -> Any:
        if isinstance(value, list):
            items = [self.resolve(item) for item in value]
            unknown = next((item for item in items if isinstance(item, _Unknown)), None)
            return unknown or items
        if not isinstance(value, dict):
            return _canonical(value)
        if len(value) == 1:
            ((key, argument),) = value.items()
            if key == "Ref":
                return self._ref(str(argument))
            if key == "Fn::Sub" and isinstance(argument, str):
                names = _SUB.findall(argument)
                if all(name in self.pseudo for name in names):
                    return _SUB.sub(lambda match: self.pseudo[match.group(1)], argument)
                return _Unknown("Fn::Sub")
            if key.startswith("Fn::"):
                return _Unknown(key)
        resolved = {str(k): self.resolve(v) for k, v in value.items()}
        unknown = next((item for item in resolved.values() if isinstance(item, _Unknown)), None)
        return unknown or resolved

    def _ref(self, name: str) -> Any:
        if name in self.pseudo:
            return self.pseudo[name]
        if name in self.parameters:
            return self.parameters[name]
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            detail = self.cloudformation.describe_stack_resource(StackName=self.stack, LogicalResourceId=name)
        except (ClientError, BotoCoreError) as error:
            raise HandlerError(f"stack {self.stack}: resource {name} cannot be described ({_code(error)}); the "
                               "request is not checked, so it is refused") from None
        return str(detail["StackResourceDetail"].get("PhysicalResourceId", ""))


def _code(error: BaseException) -> str:
    response = getattr(error, "response", None)
    if isinstance(response, Mapping):
        return str(response.get("Error", {}).get("Code", type(error).__name__))
    return type(error).__name__
