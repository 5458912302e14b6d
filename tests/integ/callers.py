"""What each integ test of this folder asserts once deployed: a model of the endpoint answers by its
logical name, called from another stack.

Each test puts, beside its endpoint stacks, a caller stack as a platform team's application would
be: it imports the endpoint by its attributes (``TritonMultiModelEndpoint.from_endpoint_attributes``,
cross-stack references), grants itself invoke with ``connect_client``, and calls through the
client of ``TritonMmeClientLayer``, with the code of ``examples/platform_app/client_function``.
The assertion invokes that function with a raw-text request and expects the model's answer under
its logical name (the routes resolve it to its content-named ``TargetModel``), retrying while the
model loads.

This module is not a test (integ-runner runs files named ``integ_*.py``); it is imported by them,
with the folder on ``sys.path`` as ``python integ_<name>.py`` puts it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import aws_cdk as cdk
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from aws_cdk.integ_tests_alpha import ExpectedResult, IntegTest, Match

from constructs import Construct

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # app.py and the manifest of the checkout

from triton_mme_cdk import TritonMmeClientLayer, TritonMultiModelEndpoint  # noqa: E402
from triton_mme_cdk.constructs.endpoint_import import ITritonMultiModelEndpoint  # noqa: E402

CLIENT_CODE = ROOT / "examples" / "platform_app" / "client_function"
CLIENT_RUNTIME = lambda_.Runtime.PYTHON_3_14
#: The default manifest's raw-text MiniLM: a request that is plain JSON (a BYTES input of strings).
MODEL = "minilm-l6-text"
REQUEST = {"model": MODEL, "inputs": {"TEXT": [["a model answers by its logical name"], ["and a second text"]]}}
#: How long the assertion keeps calling while the model loads (a cold load answers 507 or times out).
ASSERTION_TIMEOUT = cdk.Duration.minutes(10)


class CallerStack(cdk.Stack):
    """A team's application in a stack of its own: the endpoint imported by its attributes, one
    function that calls a model by its logical name."""

    def __init__(self, scope: Construct, id: str, *, endpoint: TritonMultiModelEndpoint, **kwargs: object) -> None:
        super().__init__(scope, id, **kwargs)  # type: ignore[arg-type]
        imported: ITritonMultiModelEndpoint = TritonMultiModelEndpoint.from_endpoint_attributes(
            self, "Endpoint", endpoint_name=endpoint.endpoint_name, bucket=endpoint.bucket,
            model_prefix=endpoint.settings.model_prefix, encryption_key=endpoint.encryption_key)
        logs_group = logs.LogGroup(self, "CallerLogs", retention=logs.RetentionDays.ONE_WEEK,
                                   removal_policy=cdk.RemovalPolicy.DESTROY)
        self.function = lambda_.Function(
            self, "Caller", runtime=CLIENT_RUNTIME, handler="index.handler",
            code=lambda_.Code.from_asset(str(CLIENT_CODE), exclude=["__pycache__", "*.pyc"]),
            layers=[TritonMmeClientLayer(self, "ClientLayer", runtime=CLIENT_RUNTIME)], log_group=logs_group,
            timeout=cdk.Duration.seconds(60))
        imported.connect_client(self.function)


def expect_answer(integ: IntegTest, caller: CallerStack, *, model: str = MODEL) -> None:
    """The deployed assertion: the caller's answer names ``model`` and holds its outputs (an error
    answer is ``{"error": ..., "kind": ...}`` and matches neither)."""
    call = integ.assertions.invoke_function(function_name=caller.function.function_name,
                                            payload=json.dumps(dict(REQUEST, model=model)))
    call.expect(ExpectedResult.object_like({"Payload": Match.serialized_json(Match.object_like({
        "model": model, "outputs": Match.object_like({"sentence_embedding": Match.array_with([])})}))}))
    call.wait_for_assertions(total_timeout=ASSERTION_TIMEOUT, interval=cdk.Duration.seconds(30))
