"""Integ test: two endpoints in one stack, each with its own manifest, bucket prefix, instance type
and fleet, and a caller of each in another stack; deployed, a model of each answers by its logical
name, through its own endpoint's routes.

Deploy it in your account with ``make integ-deploy INTEG=integ_two_endpoints.py`` (docs/testing.md,
"Integ tests").
"""

from __future__ import annotations

import aws_cdk as cdk
from aws_cdk.integ_tests_alpha import IntegTest
from callers import ROOT, CallerStack, expect_answer

from triton_mme_cdk import ModelSource, TritonMultiModelEndpoint

app = cdk.App()
stack = cdk.Stack(app, "TwoEndpoints")
models = ModelSource.from_manifest(ROOT / "models.yaml")
text = TritonMultiModelEndpoint(stack, "Text", models=models, endpoint_name="integ-text", model_prefix="text", instance_type="ml.g4dn.xlarge",
                                min_instance_count=1, max_instance_count=1, artifacts_on_delete="destroy")
more = TritonMultiModelEndpoint(stack, "More", models=models, endpoint_name="integ-more", model_prefix="more", instance_type="ml.g5.xlarge",
                                min_instance_count=1, max_instance_count=1, artifacts_on_delete="destroy")
callers = [CallerStack(app, "TwoEndpointsTextCaller", endpoint=text),
           CallerStack(app, "TwoEndpointsMoreCaller", endpoint=more)]
integ = IntegTest(app, "TwoEndpointsInOneStack", test_cases=[stack, *callers])
for caller in callers:
    expect_answer(integ, caller)
app.synth()
