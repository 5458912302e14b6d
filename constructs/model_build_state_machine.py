"""The state machine that builds a release's models in parallel: plan -> Distributed Map -> finish.

Why a Distributed Map: a model build takes seconds to minutes and must fit one Lambda run; a
release of hundreds of distinct models built one after another does not fit CloudFormation's
hour. Here every model that needs building gets its own invocation of the build function, at
most ``max_concurrency`` at a time, and the list of models travels as data (a JSON array the
plan step writes under the model prefix, read by the Map's ``ItemReader``), so the template
does not grow with the manifest.

- ``Plan`` writes ``<prefix>/_plans/<release>.json``: the models whose key is not stored yet.
- ``BuildModels`` (Distributed Map, ``ToleratedFailureCount`` 0) runs ``build_item`` for each;
  one failure fails the Map and the execution (the build function records the model's name
  and reason where the custom resource reads them). Each child execution's output is discarded
  (``OutputPath: null``, so ``{}``): without a ``ResultWriter`` the Map collects every child's
  output into one array, which Step Functions limits to 256 KiB whatever the Map's own
  ``ResultPath`` says; at about 100 bytes a result, some 2,600 models would fail the Map after
  every one of them was built (``tests/test_deploy_path_asl.py``). ``{}`` takes 3 bytes: the
  limit is then past 80,000 models, more than a 2 MiB manifest can name.
- In each item, after its build, ``PlaceModel`` (``PlaceJobModel`` after a Processing job) checks
  the stored tarball again under the placing role and copies it under its served names.
- ``Finish`` assembles the release from the store (server-side copies, skipped for what the items
  placed) and writes its index.

``Plan`` and the Map's tasks invoke the build function (``model_build.handler.build_step``,
the build role: it parses the model sources and writes only ``_builds/``, ``_plans/`` and
``_jobs/``); each item's ``PlaceModel`` (after its build) and ``Finish`` invoke the placing
function (``model_build.handler.place_step``, the placing role: it gates each stored tarball
again before it writes ``served/``; ``Finish`` writes the release's index under ``_releases/``). Every task retries on Lambda throttling and transient service errors with
jittered backoff; the state machine's role may invoke those two functions only.

A function that ran past its timeout (``Sandbox.Timedout``) or whose runtime died
(``Lambda.Unknown``: out of memory, a signal; Step Functions reports every unhandled Lambda error
so, a timeout included: "Handle Lambda service exceptions",
https://docs.aws.amazon.com/step-functions/latest/dg/bp-lambda-serviceexception.html) is not a
model's error. Every task but ``BuildModel`` runs S3 calls and a gate, whose time does not grow
with the model: it is retried once on either. ``BuildModel`` is retried once on a kill only (a
recycled execution environment may succeed; a build's time is its model's, so a timeout would
recur); after that, its catch (caught once retries are spent: "Handling errors in Step Functions
workflows", https://docs.aws.amazon.com/step-functions/latest/dg/concepts-error-handling.html)
runs ``OutgrewLambda``: the build function moves the item to SageMaker Processing (the model
outgrew the Lambda) where the model may build there and the execution's budget left allows a job,
else it fails the item naming the model and the limit it hit (the timeout's seconds or the
memory's MB; ``model_build.handler.outgrown``). ``States.Timeout`` is not among them: no task sets
its own ``TimeoutSeconds``, and the execution's own timeout cannot be caught.
"""

from __future__ import annotations

from typing import Annotated

from aws_cdk import Aws, Duration, Fn
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_stepfunctions as sfn
from aws_cdk import aws_stepfunctions_tasks as tasks
from pydantic import Field

from constructs import Construct
from triton_mme_cdk.constructs.cfn_hygiene import drop_referenced_dependencies
from triton_mme_cdk.constructs.customer_key import logs_key
from triton_mme_cdk.constructs.nag_acknowledgments import acknowledge_wildcard_resource, skip_checkov
from triton_mme_cdk.constructs.processing_build import ProcessingBuild
from triton_mme_cdk.constructs.props import Props, Resource

#: Lambda errors worth retrying: throttling and the service's own transient failures. A build
#: error (the model's fault) is not retried: it would fail the same way again.
TRANSIENT_LAMBDA_ERRORS = (
    "Lambda.TooManyRequestsException",
    "Lambda.ServiceException",
    "Lambda.AWSLambdaException",
    "Lambda.SdkClientException",
    "Lambda.ClientExecutionTimeoutException",
)
#: A function past its timeout (Lambda's current runtimes' errorType) and a runtime that died
#: (Step Functions' name for an unhandled Lambda error: out of memory, a signal, a timeout).
LAMBDA_TIMED_OUT = "Sandbox.Timedout"
LAMBDA_KILLED = "Lambda.Unknown"
#: Retry schedule on those errors: 2, 4, 8, 16, 32, 64 s (full jitter), about two minutes.
RETRY_ATTEMPTS = 6
RETRY_INTERVAL = Duration.seconds(2)
#: A Distributed Map runs at most 10,000 child executions at once.
MAX_CONCURRENCY_LIMIT = 10_000
#: What ``job_failed`` raises for a job that got no instance (its class name is the error name).
NO_CAPACITY_ERROR = "ProcessingCapacityError"
#: A job without capacity runs again after 1, 2, 4 minutes (full jitter).
CAPACITY_RETRY_INTERVAL = Duration.minutes(1)
CAPACITY_RETRY_ATTEMPTS = 3
#: Most models built at once (the Distributed Map's ``MaxConcurrency``).
MaxConcurrency = Annotated[int, Field(ge=1, le=MAX_CONCURRENCY_LIMIT)]


class ModelBuildStateMachineProps(Props):
    """Props of :class:`ModelBuildStateMachine`."""

    build_function: Resource[lambda_.IFunction] = Field(
        description="The function Plan and the Map's tasks invoke (build_step of the build image)."
    )
    place_function: Resource[lambda_.IFunction] | None = Field(
        default=None,
        description="The function Finish invokes (place_step of the build image, under the placing role). "
        "None: the build function.",
    )
    model_bucket: Resource[s3.IBucket] = Field(
        description="Bucket of the releases, where the plan (the Map's item source) lives, under "
        "<prefix>/_plans/. Its KMS key, when this app manages its policy, also encrypts the execution log."
    )
    max_concurrency: MaxConcurrency = Field(description="Most models built at once (the Map's MaxConcurrency).")
    timeout: Duration = Field(description="The execution's timeout (the custom resource's total timeout).")
    log_retention: logs.RetentionDays = Field(
        default=logs.RetentionDays.ONE_MONTH, description="Retention of the execution log."
    )
    processing: Resource[ProcessingBuild] | None = Field(
        default=None,
        description="Builds the Map items the plan placed on SageMaker Processing. None: every item "
        "builds on the Lambda.",
    )


class ModelBuildStateMachine(Construct):
    """Plan, build every model that needs it in parallel (Distributed Map), finish the release."""

    def __init__(self, scope: Construct, id: str, *, props: ModelBuildStateMachineProps) -> None:
        super().__init__(scope, id)
        self._function = props.build_function
        model_bucket = props.model_bucket
        plan = self._invoke("Plan", {"Step": "plan", "Request.$": "$.Request"}, result_path="$.Plan")
        build_models = sfn.DistributedMap(
            self,
            "BuildModels",
            comment="One build_item invocation per model whose key is not stored yet",
            item_reader=sfn.S3JsonItemReader(bucket=model_bucket, key=sfn.JsonPath.string_at("$.Plan.Key")),
            item_selector={
                "Step": "build",
                "Request.$": "$.Request",
                "Model.$": "$$.Map.Item.Value.Model",
                "Key.$": "$$.Map.Item.Value.Key",
                "Engine.$": "$$.Map.Item.Value.Engine",
                "Job.$": "$$.Map.Item.Value.Job",
                # The parent's start: a child execution's $$.Execution is its own.
                "Started.$": "$$.Execution.StartTime",
            },
            max_concurrency=props.max_concurrency,
            tolerated_failure_count=0,
            result_path=sfn.JsonPath.DISCARD,
        )
        build_models.item_processor(self._item_processor(props))
        finish = self._invoke("Finish", {"Step": "finish", "Request.$": "$.Request"},
                              function=props.place_function or props.build_function)

        key = logs_key(model_bucket.encryption_key)
        self.log_group = logs.LogGroup(self, "Logs", retention=props.log_retention, encryption_key=key)
        if key is None:
            skip_checkov(
                self.log_group,
                ["CKV_AWS_158"],
                "No customer key: the model bucket has no KMS key whose policy this app manages, so the "
                "execution log keeps CloudWatch Logs' default encryption at rest (AWS-owned keys).",
            )
        self.state_machine = sfn.StateMachine(
            self,
            "Resource",
            definition_body=sfn.DefinitionBody.from_chainable(plan.next(build_models).next(finish)),
            timeout=props.timeout,
            tracing_enabled=True,
            logs=sfn.LogOptions(destination=self.log_group, level=sfn.LogLevel.ALL, include_execution_data=False),
            comment="Builds the models of a Triton release in parallel, then writes the release",
        )
        # The Map reads its item source, the plan: CDK's S3JsonItemReader grants s3:GetObject on
        # the bucket's objects (its key is only known at run time); the bucket's key decrypts it.
        if model_bucket.encryption_key is not None:
            model_bucket.encryption_key.grant_decrypt(self.state_machine)
        self._acknowledge(model_bucket, props)
        if props.processing is not None:
            props.processing.grant_run(self.state_machine)
        # cfn-lint W3005: the machine's GetAtt of its role already orders them.
        role = self.state_machine.role.node.default_child
        drop_referenced_dependencies(self.state_machine, [role])

    def _item_processor(self, props: ModelBuildStateMachineProps) -> sfn.IChainable:
        """One Map item: the Lambda builds it, or (``Engine`` processing) a Processing job builds it
        and the Lambda stores its unit. A failed job's reason is recorded (``job_failed``); a job
        without capacity is retried with backoff, the whole branch again under a new job name."""
        item = {"Request.$": "$.Request", "Model.$": "$.Model", "Key.$": "$.Key"}
        place_function = props.place_function or self._function
        # After its build, the item's tarball is checked again and placed under the placing role.
        build = self._invoke("BuildModel", None, result_path=sfn.JsonPath.DISCARD, retry_timeouts=False)
        on_lambda = build.next(self._invoke(
            "PlaceModel", {"Step": "place", **item}, function=place_function, output_path=sfn.JsonPath.DISCARD))
        processing = props.processing
        # Past its timeout or killed (once retried): moved to Processing, or failed naming the limit.
        outgrown = self._invoke("OutgrewLambda", {
            "Step": "outgrew_lambda", **item, "Error.$": "$.LambdaError.Error", "Cause.$": "$.LambdaError.Cause",
            "Started.$": "$.Started", "BudgetSeconds": int(props.timeout.to_seconds()),
            "Processing": processing is not None}, result_path="$.Job")
        build.add_catch(outgrown, errors=[LAMBDA_TIMED_OUT, LAMBDA_KILLED], result_path="$.LambdaError")
        if processing is None:
            return on_lambda
        job = processing.task(self, "RunBuildJob")
        job.add_catch(self._invoke("JobFailed", {"Step": "job_failed", **item, "Error.$": "$.JobError.Error",
                                                 "Cause.$": "$.JobError.Cause"}),
                      errors=["States.ALL"], result_path="$.JobError")
        store = self._invoke("StoreBuild", {"Step": "store_job", **item, "Job.$": "$.Job"},
                             result_path=sfn.JsonPath.DISCARD)
        place = self._invoke("PlaceJobModel", {"Step": "place", **item}, function=place_function)
        on_processing = sfn.Parallel(self, "BuildOnProcessing", output_path=sfn.JsonPath.DISCARD,
                                     comment="A Processing job builds the model; the Lambda stores its unit; the "
                                     "placing function checks and places it")
        on_processing.branch(job.next(store).next(place))
        on_processing.add_retry(errors=[NO_CAPACITY_ERROR], interval=CAPACITY_RETRY_INTERVAL,
                                max_attempts=CAPACITY_RETRY_ATTEMPTS, backoff_rate=2, jitter_strategy=sfn.JitterType.FULL)
        outgrown.next(on_processing)
        return sfn.Choice(self, "WhereItBuilds").when(
            sfn.Condition.string_equals("$.Engine", "processing"), on_processing).otherwise(on_lambda)

    def _invoke(
        self, id: str, payload: dict[str, object] | None, *, result_path: str | None = None,
        output_path: str | None = None, function: lambda_.IFunction | None = None, retry_timeouts: bool = True,
    ) -> tasks.LambdaInvoke:
        task = tasks.LambdaInvoke(
            self,
            id,
            lambda_function=function or self._function,
            payload=sfn.TaskInput.from_object(payload) if payload is not None else None,
            payload_response_only=True,
            retry_on_service_exceptions=False,
            result_path=result_path,
            output_path=output_path,
        )
        task.add_retry(
            errors=list(TRANSIENT_LAMBDA_ERRORS),
            interval=RETRY_INTERVAL,
            max_attempts=RETRY_ATTEMPTS,
            backoff_rate=2,
            jitter_strategy=sfn.JitterType.FULL,
        )
        # Once more after a kill (and a timeout, but for a build's): see the module docstring.
        task.add_retry(errors=[LAMBDA_TIMED_OUT, LAMBDA_KILLED] if retry_timeouts else [LAMBDA_KILLED],
                       interval=Duration.seconds(1), max_attempts=1)
        return task

    def _acknowledge(self, model_bucket: s3.IBucket, props: ModelBuildStateMachineProps) -> None:
        policy = self.state_machine.role.node.find_child("DefaultPolicy")
        for function in dict.fromkeys((self._function, props.place_function or self._function)):
            acknowledge_wildcard_resource(
                policy,
                f"{function.function_arn}:*",
                "Step Functions may invoke any version of the build and placing functions "
                "(lambda:InvokeFunction on '<function ARN>:*'); each grant names one function only.",
            )
        acknowledge_wildcard_resource(
            policy,
            # CDK's S3JsonItemReader writes the partition as a token, whatever the stack's env.
            Fn.join("", ["arn:", Aws.PARTITION, ":s3:::", model_bucket.bucket_name, "/*"]),
            "The Distributed Map reads its item source, the plan the build writes under "
            "<prefix>/_plans/<release>.json; its key is chosen at run time, so CDK's "
            "S3JsonItemReader grants s3:GetObject (read only) on the bucket's objects.",
        )
        acknowledge_wildcard_resource(
            policy,
            "*",
            "Step Functions delivers execution logs and X-Ray traces through APIs "
            "(logs:CreateLogDelivery..., xray:PutTraceSegments...) that support no "
            "resource-level permissions.",
        )
