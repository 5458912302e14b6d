"""Integ test: the default app (``app.py``'s stack, with ``cdk.json``'s settings and ``models.yaml``)
and a team's caller in another stack; deployed, a model answers by its logical name.

``make integ`` checks the committed snapshot without deploying; ``make integ-deploy`` deploys it in
your account and runs the assertion (docs/testing.md, "Integ tests").
"""

from __future__ import annotations

import json

import aws_cdk as cdk
from aws_cdk.integ_tests_alpha import IntegTest
from callers import ROOT, CallerStack, expect_answer

from triton_mme_cdk.model_build.manifest import load_manifest
from triton_mme_cdk.stacks.settings import MmeSettings
from triton_mme_cdk.stacks.triton_mme_stack import TritonMmeStack

context = json.loads((ROOT / "cdk.json").read_text())["context"]
settings = MmeSettings.from_context(context)
manifest_path = ROOT / str(settings.manifest_path)

app = cdk.App(context=context)  # cdk.json's feature flags, as the app has them
endpoint = TritonMmeStack(app, settings.stack_name, settings=settings, manifest=load_manifest(manifest_path),
                          manifest_path=manifest_path)
caller = CallerStack(app, "DefaultAppCaller", endpoint=endpoint.endpoint_construct)
integ = IntegTest(app, "DefaultApp", test_cases=[endpoint, caller])
expect_answer(integ, caller)
app.synth()
