"""The CDK Provider framework as the model build resource uses it: its wait budget against
CloudFormation's one hour, and its own resources, tidied and explained.

- The budget: the provider's last answer comes after the total timeout plus each poll's own run
  and the final answer (:func:`last_answer_seconds`); a total / interval pair whose last answer
  could come after CloudFormation stopped waiting is refused by the resource's props.
- :func:`tidy_framework`: the cdk-nag acknowledgments on the framework's roles and waiter (it
  exposes no option for them), the obsolete ``DependsOn`` on roles dropped, and the checkov
  findings on the build's and the framework's functions skipped with their reasons (the
  ``*_REASON`` texts, written once).
- :func:`scope_waiter_log_writes`: the waiter's ``logs:CreateLogStream`` and ``logs:PutLogEvents``,
  which the CDK grants on ``*``, on the waiter's own log group instead.
"""

from __future__ import annotations

from typing import Any

import jsii
from aws_cdk import ArnFormat, Duration, IStableAnyProducer, Lazy, Stack
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_stepfunctions as sfn
from aws_cdk import custom_resources as cr

from constructs import IConstruct
from triton_mme_cdk.constructs.cfn_hygiene import drop_referenced_dependencies
from triton_mme_cdk.constructs.nag_acknowledgments import (
    acknowledge,
    acknowledge_wildcard_resource,
    skip_checkov,
)

#: The log actions of the CDK's waiter grant that take a log group or stream ARN (Service
#: Authorization Reference, CloudWatch Logs); the vended-log delivery actions beside them
#: (logs:CreateLogDelivery, logs:PutResourcePolicy, ...) support only '*'.
LOG_ACTIONS_WITH_ARN = ("logs:CreateLogStream", "logs:PutLogEvents")
#: Why the waiter's remaining log actions are on '*' (its cdk-nag acknowledgment; checkov's
#: CKV_AWS_111 no longer fails once the log writes are scoped).
WAITER_VENDED_LOGS_REASON = (
    "Step Functions delivers the waiter's execution logs through the CloudWatch Logs vended-log "
    "delivery APIs (logs:CreateLogDelivery, logs:GetLogDelivery, logs:UpdateLogDelivery, "
    "logs:DeleteLogDelivery, logs:ListLogDeliveries, logs:PutResourcePolicy, "
    "logs:DescribeResourcePolicies, logs:DescribeLogGroups), which support only Resource '*'; "
    "logs:CreateLogStream and logs:PutLogEvents are on the waiter's log group only."
)

#: CloudFormation waits at most this long for a custom resource (ServiceTimeout: 1 to 3600 s).
CLOUDFORMATION_MAX_WAIT = Duration.hours(1)
#: What one attempt of the provider's waiter may take on Lambda (the framework's isComplete and
#: ``is_complete``, a cold start of the build image included): its attempts follow each other by
#: the query interval plus their own run time, so the last one starts later than the total timeout.
WAITER_ATTEMPT_ALLOWANCE_SECONDS = 10
#: The final answer after the last attempt (the framework's onTimeout and its PUT to CloudFormation).
FINAL_ANSWER_ALLOWANCE_SECONDS = 60


def last_answer_seconds(total_seconds: float, interval_seconds: float) -> float:
    """Seconds from CloudFormation's request to the provider's last possible answer: the waiter's
    first attempt, ``total / interval`` retries ``interval`` apart, each attempt's own run, onTimeout."""
    attempts = total_seconds // interval_seconds + 1
    return total_seconds + attempts * WAITER_ATTEMPT_ALLOWANCE_SECONDS + FINAL_ANSWER_ALLOWANCE_SECONDS


def longest_total_seconds(interval_seconds: float, wait_seconds: float) -> int:
    """The longest total timeout, a whole multiple of the interval, whose last answer comes in time."""
    total = int(interval_seconds)
    while last_answer_seconds(total + interval_seconds, interval_seconds) <= wait_seconds:
        total += int(interval_seconds)
    return total


#: Why checkov's findings on the build's functions do not apply (see :func:`explain_scanner_findings`).
NO_KEY_REASON = (
    "No customer key: the model bucket has no KMS key whose policy this app manages, so {what} keeps "
    "the service's default encryption at rest (AWS-owned or AWS-managed keys); give the construct a "
    "bucket encrypted with a key of this app to encrypt {what} with that key."
)
HANDLER_CONCURRENCY_REASON = (
    "Called only by the CDK provider framework's functions, once per stack operation (on_event) or "
    "once per query interval (is_complete), so one or two run at once; a reserved concurrency would "
    "withhold that capacity from the account's other functions at all times and protect nothing."
)
BUILD_CONCURRENCY_REASON = (
    "Its concurrency is bounded by its only caller, the build state machine's Distributed Map "
    "(MaxConcurrency, mme:build_max_concurrency); builds run only during a deployment, so reserving "
    "that many would withhold them from the account's other functions at all times, and fail the "
    "deployment where the account's quota leaves fewer than 100 unreserved."
)
HANDLER_INVOCATION_REASON = (
    "Invoked synchronously (RequestResponse) by the CDK provider framework, which fails the custom "
    "resource with the error returned; there is no asynchronous event that a dead-letter queue could keep."
)
BUILD_INVOCATION_REASON = (
    "Invoked synchronously by the build state machine's tasks (retried on throttling and service "
    "errors); an error fails the execution, which the custom resource reports with the model's name; "
    "there is no asynchronous event that a dead-letter queue could keep."
)
OUTSIDE_VPC_REASON = (
    "Outside a VPC unless the vpc prop (mme:build_in_vpc) is given: it serves no network endpoint "
    "and calls only AWS APIs (S3, Step Functions, CloudFormation) and, for huggingface sources, the "
    "Hugging Face hub, over TLS with signed requests."
)
FRAMEWORK_CONCURRENCY_REASON = (
    "CDK provider framework function: runs once per stack operation (onEvent, onTimeout) or once "
    "per query interval (isComplete), never for a client; a reserved concurrency would withhold "
    "capacity from the account's other functions at all times and protect nothing."
)
FRAMEWORK_ASYNC_REASON = (
    "CDK provider framework entry point: CloudFormation invokes it asynchronously with a pre-signed "
    "response URL and waits for the answer; if it fails past Lambda's two retries, CloudFormation "
    "fails the resource at its service timeout (one hour) and rolls the stack back, visibly in the "
    "stack events, and the deployment is retried as a whole: no work or data is lost."
)
FRAMEWORK_SYNC_REASON = (
    "CDK provider framework function invoked synchronously by the provider's waiter state machine, "
    "which calls onTimeout when the build does not finish; there is no asynchronous event that a "
    "dead-letter queue could keep."
)
FRAMEWORK_VPC_REASON = (
    "CDK provider framework function: it calls only the Lambda API (to invoke the build's handlers) "
    "and CloudFormation's pre-signed S3 response URL, over TLS with signed requests, and serves no "
    "network endpoint; it is kept out of any VPC (only the handlers follow the vpc prop) because a "
    "VPC this app creates has no Lambda endpoint to call through."
)


def tidy_framework(
    framework_provider: cr.Provider,
    *,
    role: iam.Role,
    framework_roles: tuple[iam.Role, iam.Role],
    handlers: tuple[lambda_.Function, lambda_.Function],
    build_function: lambda_.Function,
    in_vpc: bool,
    encryption_key: kms.IKey | None,
) -> None:
    """Acknowledge the cdk-nag findings on resources the CDK Provider framework creates (it
    exposes no option for them), drop the obsolete ``DependsOn`` on roles (cfn-lint W3005) and
    explain the scanner findings that do not apply (:func:`explain_scanner_findings`).

    ``role``: the handlers' role; ``framework_roles``: the framework's onEvent role and its
    isComplete/onTimeout role; ``handlers``: the on_event and is_complete functions it invokes."""
    on_event_framework_role, complete_framework_role = framework_roles
    on_event_function, is_complete_function = handlers
    provider = framework_provider.node
    waiter = provider.find_child("waiter-state-machine")
    framework = {
        name: provider.find_child(f"framework-{name}") for name in ("onEvent", "isComplete", "onTimeout")
    }
    invoke_versions = (
        "The CDK provider framework may invoke any version of the function it calls "
        "(lambda:InvokeFunction on '<function ARN>:*'); the grant names that function only."
    )
    for framework_role in (on_event_framework_role, complete_framework_role):
        for function in (on_event_function, is_complete_function):
            acknowledge_wildcard_resource(framework_role, f"{function.function_arn}:*", invoke_versions)
    for name in ("isComplete", "onTimeout"):
        framework_function = framework[name]
        assert isinstance(framework_function, lambda_.Function)
        acknowledge_wildcard_resource(waiter, f"{framework_function.function_arn}:*", invoke_versions)
    scope_waiter_log_writes(waiter)
    confine_waiter_trust(waiter)
    acknowledge_wildcard_resource(
        waiter, "*", WAITER_VENDED_LOGS_REASON, resource_type="AWS::IAM::Policy",
    )
    acknowledge(
        waiter,
        "AwsSolutions-SF2",
        "The provider framework's waiter state machine only polls the is_complete handler; "
        "CDK exposes no tracing option for it, and its executions are logged at level ALL.",
    )

    for function in (on_event_function, is_complete_function, build_function):
        drop_referenced_dependencies(function, [role.node.default_child])
    drop_referenced_dependencies(framework["onEvent"], [on_event_framework_role.node.default_child])
    for name in ("isComplete", "onTimeout"):
        drop_referenced_dependencies(
            framework[name], [complete_framework_role.node.default_child]
        )
    waiter_role = waiter.node.find_child("Role")
    drop_referenced_dependencies(waiter, [waiter_role.node.default_child])
    explain_scanner_findings(framework, functions=(*handlers, build_function), build_function=build_function,
                             in_vpc=in_vpc, encryption_key=encryption_key)


@jsii.implements(IStableAnyProducer)
class _ScopedWaiterPolicy:
    """The waiter role's policy document as the CDK renders it, with :data:`LOG_ACTIONS_WITH_ARN`
    moved from the '*' statement to one statement on the waiter's log group."""

    def __init__(self, policy: iam.Policy, log_group_arn: str) -> None:
        self._policy, self._log_group_arn = policy, log_group_arn

    def produce(self) -> Any:
        document = self._policy.document.to_json()
        statements = []
        for statement in document["Statement"]:
            actions = statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
            moved = [a for a in actions if a in LOG_ACTIONS_WITH_ARN]
            if statement.get("Resource") != "*" or not moved:
                statements.append(statement)
                continue
            statements.append({**statement, "Action": sorted(a for a in actions if a not in LOG_ACTIONS_WITH_ARN)})
            statements.append({"Action": moved, "Effect": "Allow", "Resource": self._log_group_arn})
        return {**document, "Statement": statements}


def scope_waiter_log_writes(waiter: IConstruct) -> str:
    """Scope the waiter role's ``logs:CreateLogStream`` and ``logs:PutLogEvents`` (granted by the
    CDK on '*', beside the vended-log delivery actions) to the waiter's log group (its ARN ends in
    ``:*``, which covers its streams); return that ARN. The document is rendered at synth, so a
    statement the CDK adds later is kept."""
    state_machine = waiter.node.find_child("Resource")
    assert isinstance(state_machine, sfn.CfnStateMachine)
    logging = state_machine.logging_configuration
    assert isinstance(logging, sfn.CfnStateMachine.LoggingConfigurationProperty)
    destinations = logging.destinations
    assert isinstance(destinations, list) and destinations
    destination = destinations[0]
    assert isinstance(destination, sfn.CfnStateMachine.LogDestinationProperty)
    group = destination.cloud_watch_logs_log_group
    assert isinstance(group, sfn.CfnStateMachine.CloudWatchLogsLogGroupProperty) and group.log_group_arn
    policy = waiter.node.find_child("Role").node.find_child("DefaultPolicy")
    assert isinstance(policy, iam.Policy)
    cfn_policy = policy.node.default_child
    assert isinstance(cfn_policy, iam.CfnPolicy)
    cfn_policy.policy_document = Lazy.any(_ScopedWaiterPolicy(policy, group.log_group_arn))
    return group.log_group_arn


def confine_waiter_trust(waiter: IConstruct) -> None:
    """Only Step Functions acting for a state machine of this account and region may assume the
    waiter's role: the trust conditions of Step Functions' guide ("Create an IAM role for your state
    machine", confused deputy prevention:
    https://docs.aws.amazon.com/step-functions/latest/dg/procedure-create-iam-role.html). The CDK
    creates the role with one statement and no option for its conditions."""
    role = waiter.node.find_child("Role")
    assert isinstance(role, iam.Role) and role.assume_role_policy is not None
    stack = Stack.of(waiter)
    (statement,) = stack.resolve(role.assume_role_policy)["Statement"]
    assert statement["Principal"] == {"Service": "states.amazonaws.com"} and "Condition" not in statement, statement
    cfn_role = role.node.default_child
    assert isinstance(cfn_role, iam.CfnRole)
    cfn_role.add_property_override("AssumeRolePolicyDocument.Statement.0.Condition", {
        "StringEquals": {"aws:SourceAccount": stack.account},
        "ArnLike": {"aws:SourceArn": stack.format_arn(service="states", resource="stateMachine", resource_name="*",
                                                      arn_format=ArnFormat.COLON_RESOURCE_NAME)},
    })


def explain_scanner_findings(
    framework: dict[str, IConstruct],
    *,
    functions: tuple[lambda_.Function, ...],
    build_function: lambda_.Function,
    in_vpc: bool,
    encryption_key: kms.IKey | None,
) -> None:
    """Skip, with the reason, the IaC scanner's (checkov's) function checks that do not apply:
    reserved concurrency, dead-letter queue, VPC placement, and (without a key) environment
    encryption, on the build's ``functions`` and the ``framework``'s. The functions' log groups and
    environments are otherwise encrypted with the model bucket's key (``ModelBuildResource._log_group``)."""
    for function in functions:
        build = function is build_function
        skip_checkov(function, ["CKV_AWS_115"], BUILD_CONCURRENCY_REASON if build else HANDLER_CONCURRENCY_REASON)
        skip_checkov(function, ["CKV_AWS_116"], BUILD_INVOCATION_REASON if build else HANDLER_INVOCATION_REASON)
        if not in_vpc:
            skip_checkov(function, ["CKV_AWS_117"], OUTSIDE_VPC_REASON)
    for name, framework_function in framework.items():
        invoked = FRAMEWORK_ASYNC_REASON if name == "onEvent" else FRAMEWORK_SYNC_REASON
        skip_checkov(framework_function, ["CKV_AWS_115"], FRAMEWORK_CONCURRENCY_REASON)
        skip_checkov(framework_function, ["CKV_AWS_116"], invoked)
        skip_checkov(framework_function, ["CKV_AWS_117"], FRAMEWORK_VPC_REASON)
        if encryption_key is None:
            environment = NO_KEY_REASON.format(what="its environment (function ARNs, no secret)")
            skip_checkov(framework_function, ["CKV_AWS_173"], environment)
