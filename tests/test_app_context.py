"""What the tools read of the CDK app without importing it (``model_build/tools/app_context.py``):
``cdk.json``'s context and the stack's defaults, the local tritonserver's shared-memory sizes, the
endpoint stack picked from a cloud assembly, and where the CDK diff engine is found.

The defaults the tools fall back on are the stack's own: held here to the settings and props the
app synthesizes with (the SHM sizes have one definition, which the construct imports)."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from triton_mme_cdk.model_build.errors import ModelBuildError
from triton_mme_cdk.model_build.text_ensemble.shm import (
    SHM_DEFAULT_BYTE_SIZE,
    SHM_GROWTH_BYTE_SIZE,
    SHM_MAX_BYTE_SIZE,
)
from triton_mme_cdk.model_build.tools import app_context
from triton_mme_cdk.model_build.tools.app_context import (
    AppConfig,
    StackTemplate,
    pick_stack,
    template_model_prefix,
)
from triton_mme_cdk.model_build.tools.local_endpoint.triton_server import stack_shm_settings
from triton_mme_cdk.model_build.tools.review import plan_verdict

ROOT = Path(__file__).resolve().parents[1]


def _cdk_json(folder: Path, context: dict[str, Any], app: str = "python3 app.py") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "cdk.json").write_text(json.dumps({"app": app, "context": context}), encoding="utf-8")
    return folder


def test_the_tools_defaults_are_the_stacks() -> None:
    """Where neither cdk.json nor -c gives a setting, the tools assume what the stack does."""
    from triton_mme_cdk.constructs.sagemaker_hosting import SageMakerHostingProps
    from triton_mme_cdk.stacks.settings import MmeSettings

    settings = MmeSettings.from_context({})
    assert (settings.stack_name, settings.model_prefix, settings.manifest_path) == (
        app_context.DEFAULT_STACK_NAME, app_context.DEFAULT_MODEL_PREFIX, app_context.DEFAULT_MANIFEST_PATH)
    assert (settings.shm_default_byte_size, settings.shm_growth_byte_size) == (SHM_DEFAULT_BYTE_SIZE,
                                                                                SHM_GROWTH_BYTE_SIZE)
    fields = SageMakerHostingProps.model_fields
    assert fields["shm_default_byte_size"].default is SHM_DEFAULT_BYTE_SIZE  # one definition, imported
    assert fields["shm_growth_byte_size"].default is SHM_GROWTH_BYTE_SIZE


def test_the_diff_engines_pin_is_the_package_jsons() -> None:
    """The version the missing-engine line installs is the one ``npm ci`` installs in the checkout."""
    package = json.loads((ROOT / "package.json").read_text())
    lock = json.loads((ROOT / "package-lock.json").read_text())
    name = plan_verdict.DIFF_ENGINE
    assert package["devDependencies"][name] == plan_verdict.DIFF_ENGINE_VERSION
    assert lock["packages"][f"node_modules/{name}"]["version"] == plan_verdict.DIFF_ENGINE_VERSION


def test_the_local_server_takes_the_apps_shm_sizes_else_the_defaults(tmp_path: Path) -> None:
    assert stack_shm_settings(tmp_path) == (SHM_DEFAULT_BYTE_SIZE, SHM_GROWTH_BYTE_SIZE)  # no cdk.json
    assert stack_shm_settings(_cdk_json(tmp_path / "none", {})) == (SHM_DEFAULT_BYTE_SIZE, SHM_GROWTH_BYTE_SIZE)
    app = _cdk_json(tmp_path / "set", {"mme:shm_default_byte_size": 33554432, "mme:shm_growth_byte_size": "2097152"})
    assert stack_shm_settings(app) == (33554432, 2097152)
    # cdk.context.json is read over cdk.json, as the CDK CLI reads it.
    (app / "cdk.context.json").write_text(json.dumps({"mme:shm_growth_byte_size": 4096}))
    assert stack_shm_settings(app) == (33554432, 4096)
    # This checkout's own cdk.json: the stack's sizes (the default app sets none).
    assert stack_shm_settings(ROOT) == (SHM_DEFAULT_BYTE_SIZE, SHM_GROWTH_BYTE_SIZE)


@pytest.mark.parametrize(("value", "shown"), [
    ("abc", "'abc'"), (0, "0"), (True, "true"), (1.5, "1.5"), (-1, "-1"), (2**63, str(2**63)), ("", "''"),
    ([1], "[1]"),
])
def test_a_refused_shm_size_is_one_line_naming_the_key_and_the_file(tmp_path: Path, value: Any, shown: str) -> None:
    app = _cdk_json(tmp_path, {"mme:shm_growth_byte_size": value})
    with pytest.raises(ModelBuildError) as caught:
        stack_shm_settings(app)
    assert str(caught.value) == (f"{app / 'cdk.json'}: mme:shm_growth_byte_size: got {shown}; expected a whole "
                                 f"number of bytes from 1 to {SHM_MAX_BYTE_SIZE}")


def test_a_cdk_json_that_is_not_json_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "cdk.json").write_text('{"app": "python3 app.py", ', encoding="utf-8")
    with pytest.raises(ModelBuildError, match=r"cdk\.json: not valid JSON in UTF-8") as caught:
        stack_shm_settings(tmp_path)
    assert "\n" not in str(caught.value)
    _cdk_json(tmp_path, [])  # type: ignore[arg-type]
    with pytest.raises(ModelBuildError, match=r"cdk\.json: 'context' must be a JSON object"):
        AppConfig.find(tmp_path)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_the_endpoint_command_refuses_a_bad_shm_size_before_it_starts(tmp_path: Path) -> None:
    """``endpoint`` in an app's folder whose cdk.json sets a size the stack would refuse: one line,
    exit 1, before any S3 call (the endpoint URL has nothing listening) or server start."""
    app = _cdk_json(tmp_path, {"mme:shm_default_byte_size": "16MB"})
    done = subprocess.run(
        [sys.executable, "-m", "triton_mme_cdk.model_build", "endpoint", "--bucket", "b", "--endpoint-url",
         f"http://127.0.0.1:{_free_port()}", "--port", str(_free_port())],
        cwd=app, env={"PATH": str(Path(sys.executable).parent), "PYTHONPATH": str(ROOT), "HOME": str(tmp_path)},
        capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    (line,) = (done.stdout + done.stderr).strip().splitlines()
    assert line == (f"error: {app / 'cdk.json'}: mme:shm_default_byte_size: got '16MB'; expected a whole number of "
                    f"bytes from 1 to {SHM_MAX_BYTE_SIZE}")


def _stack(name: str, *types: str, prefix: str = "models") -> StackTemplate:
    resources: dict[str, Any] = {f"R{i}": {"Type": t} for i, t in enumerate(types)}
    for resource in resources.values():
        if resource["Type"] == app_context.RELEASE_RESOURCE_TYPE:
            resource["Properties"] = {"ModelPrefix": prefix}
    return StackTemplate(name, {"Resources": resources})


def test_plan_picks_the_one_endpoint_stack_or_asks_which() -> None:
    endpoint, pipeline = _stack("TritonMme", "AWS::SageMaker::Endpoint"), _stack("TritonMmePipeline", "AWS::S3::Bucket")
    assert pick_stack([endpoint, pipeline], None, None) is endpoint
    assert pick_stack([pipeline, endpoint], None, "SomethingElse") is endpoint  # one: --stack-name is not needed
    assert pick_stack([endpoint, pipeline], "TritonMmePipeline", None) is pipeline  # mme:stack_name names it
    small, big = _stack("Small", "AWS::SageMaker::Endpoint"), _stack("Big", "AWS::SageMaker::Endpoint")
    assert pick_stack([small, big], None, "Big") is big
    cases = [
        (([small, big], None, None), "synth: the app synthesizes 2 endpoint stacks (Small, Big); name one with "
                                     "-c mme:stack_name=NAME or --stack-name NAME"),
        (([small, big], "Nope", None), "mme:stack_name: got 'Nope'; the app synthesizes no stack of that name (its "
                                       "stacks: Small, Big)"),
        (([pipeline], None, None), "synth: the app synthesizes no stack with a SageMaker endpoint (its stacks: "
                                   "TritonMmePipeline)"),
    ]
    for args, message in cases:
        with pytest.raises(ModelBuildError) as caught:
            pick_stack(*args)
        assert str(caught.value) == message


def test_the_model_prefix_is_the_templates_build_resources() -> None:
    release = app_context.RELEASE_RESOURCE_TYPE
    assert template_model_prefix(_stack("S", release, prefix="team/models").template) == "team/models"
    assert template_model_prefix(_stack("S", "AWS::SageMaker::Endpoint").template) is None  # served out of band
    two = _stack("S", release, release).template
    two["Resources"]["R1"]["Properties"]["ModelPrefix"] = "other"
    with pytest.raises(ModelBuildError, match=r"^plan: the template publishes under 2 model prefixes \(models, "
                                              r"other\); give --prefix PREFIX$"):
        template_model_prefix(two)


def test_the_diff_engine_is_found_in_the_apps_node_modules_wherever_the_package_is(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Installed from a wheel (no checkout above the package): the engine comes from the app's
    folder's node_modules, and ``cfn_diff.js`` runs from the package's folder. Missing, the line
    gives the command that installs the pinned version there."""
    monkeypatch.setattr(plan_verdict, "checkout_root", lambda: None)
    package = tmp_path / "site-packages" / "tools"
    package.mkdir(parents=True)
    monkeypatch.setattr(plan_verdict, "DIFF_SCRIPT", Path(shutil.copy2(plan_verdict.DIFF_SCRIPT, package)))
    app = tmp_path / "app"
    app.mkdir()
    with pytest.raises(plan_verdict.PlanInputError) as caught:
        plan_verdict.start_engine(app)
    assert str(caught.value) == (
        f"plan: the CDK diff engine (@aws-cdk/cloudformation-diff) is not installed in {app / 'node_modules'}; "
        f"install it: npm install --no-save --prefix {app} @aws-cdk/cloudformation-diff@"
        f"{plan_verdict.DIFF_ENGINE_VERSION}")
    (app / "node_modules").symlink_to(ROOT / "node_modules")  # what that command installs
    old = {"Resources": {"B": {"Type": "AWS::S3::Bucket", "Properties": {"BucketName": "a"}}}}
    new = {"Resources": {"B": {"Type": "AWS::S3::Bucket", "Properties": {"BucketName": "b"}}}}
    resources = plan_verdict.engine_diff(old, new, plan_verdict.start_engine(app))
    assert resources["B"]["impact"] == "WILL_REPLACE"
