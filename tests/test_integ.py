"""The integ tests of ``tests/integ/`` (``integ_*.py``, ``aws_cdk.integ_tests_alpha.IntegTest``), in
the CDK's convention: each file is an app that ``python <file>`` synthesizes, as integ-runner runs
it, and its committed snapshot (``<file>.snapshot/``) holds each stack's template and the test's
``integ.json``.

Here each app is synthesized for real and compared with its snapshot, asset hashes and release ids
masked as in the stack snapshot (``cdk_helpers.snapshot_text``). integ-runner itself cannot read
these assemblies yet: its latest release, 2.197.10, reads cloud assembly schema 53, and
aws-cdk-lib 2.275.0 writes 55 (docs/testing.md, "Integ tests"). Rewrite the snapshots with
``UPDATE_SNAPSHOTS=1``. Deploying them (``make integ-deploy``) needs an AWS account: not run here.

What each test must hold beyond its snapshot: a caller stack per endpoint, importing it by its
attributes (cross-stack references) with the invoke grant; and an assertion per caller that its
model answers by its logical name, waited for, so that a deploy fails when it never does.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from cdk_helpers import ROOT, snapshot_text, subprocess_env

INTEG = ROOT / "tests" / "integ"
FILES = sorted(path.name for path in INTEG.glob("integ_*.py"))
#: Each integ file and the callers it holds (the caller stack's name).
CALLERS = {
    "integ_default_app.py": ["DefaultAppCaller"],
    "integ_bring_your_own.py": ["BringYourOwnCaller"],
    "integ_two_endpoints.py": ["TwoEndpointsTextCaller", "TwoEndpointsMoreCaller"],
}


def test_the_three_integ_tests_are_there() -> None:
    assert sorted(CALLERS) == FILES


@pytest.fixture(scope="module", params=FILES)
def synthesized(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    """One integ file synthesized as integ-runner runs it: ``python <file>`` in its folder."""
    name = request.param
    outdir = tmp_path_factory.mktemp(name.removesuffix(".py"))
    result = subprocess.run([sys.executable, name], cwd=INTEG, env=subprocess_env(CDK_OUTDIR=str(outdir)),
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return name, outdir


#: The time of the synth that each assertion carries, so that CloudFormation runs it at every deploy.
_SALT = re.compile(r'"salt": "\d+"')


def snapshot_files(outdir: Path) -> dict[str, str]:
    """What the snapshot keeps of a synthesized integ app: each template, masked (the assertions'
    salt too), and integ.json."""
    files = {path.name: _SALT.sub('"salt": "<synth time>"', snapshot_text(path.read_text()))
             for path in sorted(outdir.glob("*.template.json"))}
    files["integ.json"] = (outdir / "integ.json").read_text()
    return files


def test_each_integ_test_matches_its_committed_snapshot(synthesized: tuple[str, Path]) -> None:
    name, outdir = synthesized
    current = snapshot_files(outdir)
    snapshot = INTEG / f"{name}.snapshot"
    if os.environ.get("UPDATE_SNAPSHOTS") == "1":
        snapshot.mkdir(exist_ok=True)
        for old in snapshot.iterdir():
            old.unlink()
        for file, text in current.items():
            (snapshot / file).write_text(text)
    assert snapshot.is_dir(), f"no snapshot of {name} yet: run with UPDATE_SNAPSHOTS=1 to write {snapshot}"
    committed = {path.name: path.read_text() for path in sorted(snapshot.iterdir())}
    assert sorted(committed) == sorted(current), f"{name}: the snapshot holds other stacks"
    changed = [file for file in current if current[file] != committed[file]]
    assert not changed, f"{name}: {', '.join(changed)} changed; review the diff and rewrite with UPDATE_SNAPSHOTS=1"


def _resources(template: dict[str, Any], kind: str) -> dict[str, dict[str, Any]]:
    return {lid: r for lid, r in template["Resources"].items() if r["Type"] == kind}


def referenced_stack(value: Any) -> str | None:
    """The stack a cross-stack reference inside ``value`` reads: an export (``Fn::ImportValue``) or,
    under cdk.json's feature flags, a stack output (``Fn::GetStackOutput``)."""
    if isinstance(value, dict):
        if "Fn::ImportValue" in value:
            return str(value["Fn::ImportValue"]).split(":")[0]
        if "Fn::GetStackOutput" in value:
            return str(value["Fn::GetStackOutput"]["StackName"])
        value = list(value.values())
    if isinstance(value, list):
        return next((found for item in value if (found := referenced_stack(item))), None)
    return None


def test_each_caller_imports_its_endpoint_and_is_asserted_to_get_an_answer(synthesized: tuple[str, Path]) -> None:
    name, outdir = synthesized
    (test_case,) = json.loads((outdir / "integ.json").read_text())["testCases"].values()
    assert set(CALLERS[name]) <= set(test_case["stacks"])
    (assert_file,) = outdir.glob("*DeployAssert*.template.json")
    assertions = _resources(json.loads(assert_file.read_text()), "Custom::DeployAssert@SdkCallLambdainvoke")
    assert len(assertions) == len(CALLERS[name])
    asserted = set()
    for assertion in assertions.values():
        props = assertion["Properties"]
        # Waited for (a state machine retries until the model answers or the time is up), so a
        # deploy fails when it never does.
        assert "stateMachineArn" in props
        expected = json.loads(props["expected"])["$ObjectLike"]["Payload"]["$SerializedJson"]["$ObjectLike"]
        assert expected["model"] == "minilm-l6-text" and "sentence_embedding" in expected["outputs"]["$ObjectLike"]
        asserted.add(referenced_stack(props["parameters"]["FunctionName"]))
    assert asserted == set(CALLERS[name])
    for caller in CALLERS[name]:
        template = json.loads((outdir / f"{caller}.template.json").read_text())
        (policy,) = _resources(template, "AWS::IAM::Policy").values()
        statements = policy["Properties"]["PolicyDocument"]["Statement"]
        invoke = next(s for s in statements if s["Action"] == "sagemaker:InvokeEndpoint")
        # The endpoint's name comes from the endpoint's stack, by a cross-stack reference.
        assert referenced_stack(invoke["Resource"]) in test_case["stacks"]
        assert any(s["Action"] == "s3:GetObject" and "_routes/routes.json" in json.dumps(s["Resource"])
                   for s in statements)
