"""SageMaker Processing for moto's States Language interpreter: the ``createProcessingJob.sync``
task runs the job's container entry point on this machine, on the inputs the job would get,
and writes its outputs where the job would.

moto 5.2's interpreter has no SageMaker integration (``sagemaker`` is among its unsupported
services, which allow ``.waitForTaskToken`` only), so :func:`processing_jobs` installs one for
``createProcessingJob.sync``. What is real and what is not:

- **Real:** the request the state machine sends (checked against botocore's
  ``CreateProcessingJob`` input shape, and the name against the API's pattern and uniqueness);
  SageMaker's part of the data's path, done the way the job gets it: each ``S3Input`` prefix
  downloaded from S3 under its ``LocalPath`` (``/opt/ml`` is re-rooted to a folder here), the
  entry point run as the job runs it (``python -m model_build.handler.processing_job``, a
  subprocess, no network of its own), the output folder uploaded to ``S3Output.S3Uri`` at the
  end of a successful job (``EndOfJob``), ``/opt/ml/output/message`` read back as
  ``ExitMessage``.
- **Chosen here, not confirmed for SageMaker** (research notes: the exact texts are not
  documented): a job that fails ends the task with ``States.TaskFailed`` and the job's
  description as the cause (what Step Functions does for its other ``.sync`` jobs); a job
  without capacity fails with ``FailureReason`` ``CapacityError: ...``; a job past
  ``MaxRuntimeInSeconds`` is stopped with ``FailureReason`` ``MaxRuntimeExceeded: ...``. The
  build's ``job_failed`` step reads any of these the same way.
- ``MaxRuntimeInSeconds`` is scaled by ``time_scale`` (as :mod:`asl_moto` scales retry waits).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
JOB_NAME = re.compile(r"^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}$")
CAPACITY_REASON = ("CapacityError: Unable to provision requested ML compute capacity. Please retry using a "
                   "different ML instance type.")


@dataclass
class LocalProcessing:
    """The jobs the state machine ran, and what the next ones meet."""

    s3: Any
    workdir: Path
    time_scale: float = 1.0
    #: The next this many jobs get no instance.
    no_capacity: int = 0
    jobs: list[dict[str, Any]] = field(default_factory=list)
    #: Every S3 call SageMaker's side made for the jobs (with the job's role): ``(operation, params)``.
    s3_calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        def record(params: dict[str, Any], model: Any, **_: Any) -> None:
            self.s3_calls.append((model.name, dict(params)))

        self.s3.meta.events.register("provide-client-params.s3.*", record)

    def run(self, params: dict[str, Any]) -> dict[str, Any]:
        """Run one job to its end; its description (``ProcessingJobStatus`` Completed or not)."""
        import boto3
        from botocore.validate import validate_parameters

        shape = boto3.client("sagemaker", region_name="us-east-1").meta.service_model.operation_model(
            "CreateProcessingJob").input_shape
        validate_parameters(params, shape)  # raises ParamValidationError on a malformed request
        name = params["ProcessingJobName"]
        assert JOB_NAME.match(name), name
        with self.lock:
            assert name not in {job["ProcessingJobName"] for job in self.jobs}, f"job name {name} reused"
            described: dict[str, Any] = {"ProcessingJobName": name, "ProcessingJobArn":
                                         f"arn:aws:sagemaker:us-east-1:123456789012:processing-job/{name.lower()}",
                                         "Request": params}
            self.jobs.append(described)
            out_of_capacity = self.no_capacity > 0
            self.no_capacity -= int(out_of_capacity)
        if out_of_capacity:
            described.update(ProcessingJobStatus="Failed", FailureReason=CAPACITY_REASON)
            return described
        root = self.workdir / name
        for item in params.get("ProcessingInputs", []):
            self._download(item["S3Input"]["S3Uri"], _local(root, item["S3Input"]["LocalPath"]))
        limit = params["StoppingCondition"]["MaxRuntimeInSeconds"] * self.time_scale
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}  # the job has no credentials
        env.update(params.get("Environment", {}), MODEL_BUILD_PROCESSING_ROOT=str(root), PYTHONPATH=str(ROOT))
        command = [sys.executable, *params["AppSpecification"]["ContainerEntrypoint"][1:]]
        try:
            finished = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=limit)
        except subprocess.TimeoutExpired:
            described.update(ProcessingJobStatus="Stopped",
                             FailureReason=f"MaxRuntimeExceeded: the job ran past MaxRuntimeInSeconds "
                                           f"({params['StoppingCondition']['MaxRuntimeInSeconds']} s)")
            return described
        described["Log"] = finished.stderr[-4000:]
        if finished.returncode != 0:
            message = root / "output" / "message"
            described.update(ProcessingJobStatus="Failed",
                             FailureReason="AlgorithmError: See job logs for more information",
                             ExitMessage=message.read_text()[:1024] if message.is_file() else "")
            return described
        for output in params["ProcessingOutputConfig"]["Outputs"]:
            self._upload(_local(root, output["S3Output"]["LocalPath"]), output["S3Output"]["S3Uri"])
        described.update(ProcessingJobStatus="Completed")
        return described

    def _download(self, uri: str, folder: Path) -> None:
        bucket, _, prefix = uri[len("s3://"):].partition("/")
        for page in self.s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            for item in page.get("Contents", []):
                target = folder / item["Key"][len(prefix):]
                target.parent.mkdir(parents=True, exist_ok=True)
                self.s3.download_file(bucket, item["Key"], str(target))

    def _upload(self, folder: Path, uri: str) -> None:
        bucket, _, prefix = uri[len("s3://"):].partition("/")
        prefix = prefix if prefix.endswith("/") else prefix + "/"
        for path in sorted(p for p in folder.rglob("*") if p.is_file()):
            self.s3.upload_file(str(path), bucket, prefix + path.relative_to(folder).as_posix())


def _local(root: Path, container_path: str) -> Path:
    return root / Path(container_path).relative_to("/opt/ml")


@contextmanager
def processing_jobs(s3: Any, workdir: Path, *, time_scale: float = 1.0) -> Iterator[LocalProcessing]:
    """Install ``createProcessingJob.sync`` in moto's interpreter for the block."""
    from moto.stepfunctions.parser.api import HistoryEventType, TaskFailedEventDetails
    from moto.stepfunctions.parser.asl.component.common.error_name.failure_event import (
        FailureEvent,
        FailureEventException,
    )
    from moto.stepfunctions.parser.asl.component.common.error_name.states_error_name import StatesErrorName
    from moto.stepfunctions.parser.asl.component.common.error_name.states_error_name_type import (
        StatesErrorNameType,
    )
    from moto.stepfunctions.parser.asl.component.state.exec.state_task import state_task_factory
    from moto.stepfunctions.parser.asl.component.state.exec.state_task.service.state_task_service import (
        StateTaskService,
    )
    from moto.stepfunctions.parser.asl.eval.event.event_detail import EventDetails
    from moto.stepfunctions.parser.asl.utils.encoding import to_json_str

    local = LocalProcessing(s3, workdir, time_scale=time_scale)

    class ProcessingJobTask(StateTaskService):
        def _validate_service_integration_is_supported(self) -> None:
            if (self.resource.api_action, self.resource.condition) != ("createProcessingJob", "sync"):
                raise ValueError(f"not emulated: {self.resource.resource_arn}")

        def _eval_service_task(self, env: Any, resource_runtime_part: Any, normalised_parameters: dict,
                               state_credentials: Any) -> None:
            described = local.run(normalised_parameters)
            public = {k: v for k, v in described.items() if k not in ("Request", "Log")}
            if described["ProcessingJobStatus"] == "Completed":
                env.stack.append(public)
                return
            make: Any = EventDetails  # a TypedDict of every kind of detail; one is given
            details = make(taskFailedEventDetails=TaskFailedEventDetails(
                resource=self._get_sfn_resource(), resourceType=self._get_sfn_resource_type(),
                error=StatesErrorNameType.StatesTaskFailed.to_name(), cause=to_json_str(public)))
            raise FailureEventException(FailureEvent(
                env=env, error_name=StatesErrorName(typ=StatesErrorNameType.StatesTaskFailed),
                event_type=HistoryEventType.TaskFailed, event_details=details))

    original = state_task_factory.state_task_service_for

    def service_for(service_name: str) -> Any:
        return ProcessingJobTask() if service_name == "sagemaker" else original(service_name)

    state_task_factory.state_task_service_for = service_for
    try:
        yield local
    finally:
        state_task_factory.state_task_service_for = original


def job_request(job: dict[str, Any]) -> dict[str, Any]:
    """The request a job was created with (for the tests to read)."""
    return json.loads(json.dumps(job["Request"]))
