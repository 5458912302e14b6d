"""moto's Amazon States Language interpreter, with AWS's behaviour where it differs in what we use.

moto (5.2) executes state machines with the interpreter it took from LocalStack
(``moto/stepfunctions/parser``): an implementation of the States Language written independently
of this project, which runs the synthesized definitions as they are (Task states on a Lambda
ARN, Retry with backoff and full jitter, Catch, a Distributed Map with an S3 ``ItemReader`` and
an ``ItemSelector`` over ``$$.Map.Item.Value``, ``MaxConcurrency``, ``ToleratedFailureCount``).
Six of its behaviours differ from AWS's in what the stack relies on; :func:`aws_semantics`
changes exactly those, each for a documented reason (and two changes are for speed only):

1. **Lambda API errors of a Task on a function ARN.** AWS reports an Invoke API error as
   ``Lambda.<exception>`` (e.g. ``Lambda.TooManyRequestsException``: Step Functions developer
   guide, "Handle Lambda service exceptions"), which is what the stack's Retry lists. moto names
   it so for ``arn:aws:states:::lambda:invoke`` tasks but ``Exception`` for a task on the function
   ARN (what CDK writes with ``payload_response_only``); here both get AWS's name.
2. **The Distributed Map's result size.** Without a ``ResultWriter`` a Distributed Map collects
   its child executions' outputs into one array, and AWS fails the state with
   ``States.DataLimitExceeded`` when that array exceeds 256 KiB, whatever ``ResultPath`` or
   ``OutputPath`` say (aws/aws-cdk#24799; the ResultWriter page: export "if your output payload
   size exceeds 256 KiB"). moto checks a state's size only after ``ResultPath`` has discarded it.
3. **A failed child does not fail the Distributed Map.** moto 5.2 records the failure and lets
   the Map succeed ("TODO: add support for failure toleration fields" in its ``MapRunRecord``),
   so the next state runs. AWS fails the Map Run with ``States.ExceedToleratedFailureThreshold``
   once more items fail than ``ToleratedFailureCount`` / ``ToleratedFailurePercentage`` allow
   (both 0 by default: any failure). Here the Map fails so once its children have ended; AWS
   stops starting children at the threshold, so a test may see more units run than AWS would
   (never fewer). A definition setting both thresholds is refused: its rule is not modelled.
4. **An execution started without a name.** AWS names it with a UUID (StartExecution's
   ``name`` is optional); moto 5.2 keeps ``None`` and takes a second unnamed start for a
   duplicate of the first (``ExecutionAlreadyExists``): the provider framework starts its waiter
   without a name, so a stack's second request failed. Here an unnamed start gets a UUID.
5. **Retry waits take real time.** moto sleeps each retry's interval. Here each wait is recorded
   (:class:`Waits`: what the definition asked for) and slept ``time_scale`` times as long, so a
   schedule of minutes runs in seconds; the counts, the order and the outcomes stay the
   interpreter's.
6. **One client per service.** The interpreter builds a boto3 client for every Lambda task and
   every item read (about 10 ms each, most of a Distributed Map's time over thousands of items);
   here one client per service and region serves the block. Speed only: the calls are the same.
8. **A function error without an ``errorType`` is ``Lambda.Unknown``.** A runtime that died (out
   of memory, killed) answers the invoke with ``FunctionError: Unhandled`` and a payload naming
   no ``errorType``; Step Functions reports such unhandled errors as ``Lambda.Unknown`` ("Handle
   Lambda service exceptions", https://docs.aws.amazon.com/step-functions/latest/dg/bp-lambda-serviceexception.html:
   "Unhandled errors in Lambda are reported as Lambda.Unknown in the error output. These include
   out-of-memory errors and function timeouts"). moto names it ``Exception``. A payload with an
   ``errorType`` keeps it as its error name, in both (``Sandbox.Timedout`` for a timeout, as
   Lambda's current runtimes report it; ``tests/local_lambda.py``).
7. **One parse per JSONPath.** The interpreter parses a path each time it reads one
   (``json_path.extract_json`` calls ``jsonpath_ng.ext.parse``, and ``ResultPath`` calls
   ``jsonpath_ng.parse``: each builds a new PLY lexer and parser, about 40% of a Distributed
   Map's CPU over thousands of items). Here each distinct path is parsed once for the block; a
   parsed path is not changed by ``find`` or ``update_or_create``. Speed only.
"""

from __future__ import annotations

import functools
import json
import threading
import time as real_time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

#: Step Functions' limit on a state's input, output or result, as UTF-8 bytes of its JSON.
STATE_PAYLOAD_LIMIT = 256 * 1024


@dataclass
class Waits:
    """The retry waits the interpreter asked for, in seconds, in the order it asked."""

    requested: list[float] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def total(self) -> float:
        with self.lock:
            return sum(self.requested)


class _ScaledTime:
    """Stands for the ``time`` module inside moto's retrier: records, then sleeps scaled."""

    def __init__(self, waits: Waits, scale: float) -> None:
        self.waits = waits
        self.scale = scale

    def sleep(self, seconds: float) -> None:
        with self.waits.lock:
            self.waits.requested.append(float(seconds))
        real_time.sleep(float(seconds) * self.scale)

    def __getattr__(self, name: str) -> Any:
        return getattr(real_time, name)


def _error_type(payload: str) -> str | None:
    try:
        parsed = json.loads(payload)
    except ValueError:
        return None
    return str(parsed["errorType"]) if isinstance(parsed, dict) and parsed.get("errorType") else None


def payload_bytes(value: Any) -> int:
    """The size Step Functions counts: the value's JSON as UTF-8 (compact, as it is stored)."""
    from moto.stepfunctions.parser.asl.utils.encoding import to_json_str

    return len((value if isinstance(value, str) else to_json_str(value)).encode("utf-8"))


@contextmanager
def aws_semantics(time_scale: float = 1.0) -> Iterator[Waits]:
    """Apply the changes of the module docstring for the duration of the block."""
    from botocore.exceptions import ClientError
    from moto.stepfunctions.parser.api import ExecutionFailedEventDetails, HistoryEventType
    from moto.stepfunctions.parser.asl.component.common.error_name.custom_error_name import CustomErrorName
    from moto.stepfunctions.parser.asl.component.common.error_name.failure_event import (
        FailureEvent,
        FailureEventException,
    )
    from moto.stepfunctions.parser.asl.component.common.error_name.states_error_name import StatesErrorName
    from moto.stepfunctions.parser.asl.component.common.error_name.states_error_name_type import (
        StatesErrorNameType,
    )
    from moto.stepfunctions.parser.asl.component.common.path import result_path
    from moto.stepfunctions.parser.asl.component.common.retry import retrier_decl
    from moto.stepfunctions.parser.asl.component.state.exec.state_map.item_reader.eval import (
        resource_eval_s3 as item_reader_s3,
    )
    from moto.stepfunctions.parser.asl.component.state.exec.state_map.iteration import (
        distributed_iteration_component as distributed,
    )
    from moto.stepfunctions.parser.asl.component.state.exec.state_task import lambda_eval_utils
    from moto.stepfunctions.parser.asl.component.state.exec.state_task.state_task_lambda import (
        StateTaskLambda,
    )
    from moto.stepfunctions.parser.asl.eval.event.event_detail import EventDetails
    from moto.stepfunctions.parser.asl.utils import json_path
    from moto.stepfunctions.parser.models import StepFunctionsParserBackend

    waits = Waits()
    original_start = StepFunctionsParserBackend.start_execution

    def start_execution(self: Any, state_machine_arn: str, name: Any = None, *args: Any, **kwargs: Any) -> Any:
        return original_start(self, state_machine_arn, name or str(uuid.uuid4()), *args, **kwargs)
    original_from_error = StateTaskLambda._from_error
    original_map_run = distributed.DistributedIterationComponent._map_run
    original_time = retrier_decl.time
    original_clients = lambda_eval_utils.boto_client_for, item_reader_s3.boto_client_for
    original_parses = json_path.parse, result_path.parse
    clients: dict[tuple[str, str], Any] = {}
    clients_lock = threading.Lock()

    def client_for(region: str, service: str, state_credentials: Any = None) -> Any:
        with clients_lock:
            if (region, service) not in clients:
                clients[(region, service)] = original_clients[0](region, service, state_credentials)
            return clients[(region, service)]

    def from_error(self: Any, env: Any, ex: Exception) -> Any:
        event = original_from_error(self, env, ex)
        if isinstance(ex, lambda_eval_utils.LambdaFunctionErrorException) and not _error_type(ex.payload):
            unknown: Any = event.event_details
            unknown["lambdaFunctionFailedEventDetails"]["error"] = "Lambda.Unknown"
            return FailureEvent(env=env, error_name=CustomErrorName("Lambda.Unknown"),
                                event_type=event.event_type, event_details=event.event_details)
        if isinstance(ex, ClientError):
            code = ex.response["Error"]["Code"]
            details: Any = event.event_details
            details["lambdaFunctionFailedEventDetails"]["error"] = f"Lambda.{code}"
            return FailureEvent(env=env, error_name=CustomErrorName(f"Lambda.{code}"),
                                event_type=event.event_type, event_details=event.event_details)
        return event

    def details_of(failed: Any) -> Any:
        make: Any = EventDetails  # a TypedDict of every kind of detail; one is given
        return make(executionFailedEventDetails=failed)

    def fail(env: Any, error: Any, cause: str) -> FailureEventException:
        return FailureEventException(FailureEvent(
            env=env, error_name=StatesErrorName(typ=error), event_type=HistoryEventType.ExecutionFailed,
            event_details=details_of(ExecutionFailedEventDetails(error=error.to_name(), cause=cause)),
        ))

    def map_run(self: Any, env: Any, eval_input: Any) -> None:
        original_map_run(self, env, eval_input)
        record = eval_input.map_run_record
        count, percentage = record.tolerated_failure_count, record.tolerated_failure_percentage
        if count and percentage:
            raise NotImplementedError("a Map with both ToleratedFailureCount and ToleratedFailurePercentage")
        failed, total = record.item_counter.failed.get(), record.item_counter.total.get()
        if failed > count and (not total or 100.0 * failed / total > percentage):
            raise fail(env, StatesErrorNameType.StatesExceedToleratedFailureThreshold,
                       f"The specified tolerated failure threshold was exceeded ({failed} of {total} items failed)")
        outputs = env.stack[-1]
        size = payload_bytes(outputs)
        if size > STATE_PAYLOAD_LIMIT:
            raise fail(env, StatesErrorNameType.StatesStatesDataLimitExceeded,
                       f"The state/task '{eval_input.state_name}' returned a result with a size exceeding "
                       f"the maximum number of bytes service limit ({size} bytes of child outputs).")

    StepFunctionsParserBackend.start_execution = start_execution  # type: ignore[method-assign]
    StateTaskLambda._from_error = from_error  # type: ignore[method-assign]
    distributed.DistributedIterationComponent._map_run = map_run  # type: ignore[method-assign]
    retrier_decl.time = _ScaledTime(waits, time_scale)  # type: ignore[assignment]
    lambda_eval_utils.boto_client_for = client_for
    item_reader_s3.boto_client_for = client_for
    json_path.parse, result_path.parse = (functools.lru_cache(maxsize=4096)(parse) for parse in original_parses)
    try:
        yield waits
    finally:
        StepFunctionsParserBackend.start_execution = original_start  # type: ignore[method-assign]
        StateTaskLambda._from_error = original_from_error  # type: ignore[method-assign]
        distributed.DistributedIterationComponent._map_run = original_map_run  # type: ignore[method-assign]
        retrier_decl.time = original_time
        lambda_eval_utils.boto_client_for, item_reader_s3.boto_client_for = original_clients
        json_path.parse, result_path.parse = original_parses


def wait_for(states: Any, execution_arn: str, timeout_s: float = 120.0) -> dict[str, Any]:
    """``DescribeExecution`` once the execution has ended (or fail after ``timeout_s``)."""
    deadline = real_time.monotonic() + timeout_s
    while True:
        described = states.describe_execution(executionArn=execution_arn)
        if described["status"] != "RUNNING":
            return dict(described)
        if real_time.monotonic() > deadline:
            raise TimeoutError(f"execution {execution_arn} still running after {timeout_s} s")
        real_time.sleep(0.05)
