"""Each rule of our pre-publish gate, confirmed on the real ``tritonserver``.

``model_build.artifact.gate.check_repository`` (the gate the build runs on every tarball it writes: layout,
version folder, ``check_config``, the config against the graph, ensemble rules) refuses a tarball
before anything is published, because on a SageMaker MME a bad config is only found at the first
invocation. Here every case of a corpus is given to both: our gate must refuse it, and the real
server's load (``POST /models``, the SageMaker MME route) must refuse it too; each case names a
reason keyword that must appear in our error and another in the server's answer (a refusal for
another reason fails the test). The few rules that are stricter than Triton on purpose (a typo Triton would silently
ignore) are listed apart, and the test shows that the server does load them: docs/build.md says so.

Rules of Triton's core (batching, dims, names, layout) are the server's own. Rules of the ONNX
Runtime backend's ``parameters`` and accelerators are applied, on this CPU machine, by our
python-based stand-in for that backend (``model_build/tools/local_endpoint/triton_backends/onnxruntime``), which
mirrors ``onnxruntime_backend/src/onnxruntime.cc``: for those the server's word is only as good as
that mirror, and a GPU endpoint remains the final judge.
"""

from __future__ import annotations

import json
import shutil
import tarfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from triton_helpers import requires_triton  # tests/ is on sys.path

from triton_mme_cdk.model_build.artifact.gate import check_repository
from triton_mme_cdk.model_build.errors import ModelBuildError
from triton_mme_cdk.model_build.manifest import parse_manifest
from triton_mme_cdk.model_build.pipeline import BuildOptions, build_model
from triton_mme_cdk.model_build.tools.local_endpoint.triton_server import TritonServer, triton_server

pytestmark = [pytest.mark.slow, requires_triton]

SPEC = {
    "name": "rules",
    "source": {"kind": "synthetic", "architecture": "resnet", "seed": 5,
               "config": {"embedding_size": 8, "hidden_sizes": [8, 8, 16, 16], "depths": [1, 1, 1, 1],
                          "layer_type": "basic", "num_labels": 4}},
    "task": "image-classification", "max_batch_size": 4, "image": {"image_size": 32},
    "dynamic_batching": {"preferred_batch_size": [2, 4]}, "instance_group": {"kind": "KIND_CPU", "count": 1},
}

Edit = Callable[[Path], None]


def _config_edit(old: str, new: str) -> Edit:
    def edit(model_dir: Path) -> None:
        path = model_dir / "config.pbtxt"
        text = path.read_text()
        assert old in text, f"{old!r} not in the config"
        path.write_text(text.replace(old, new, 1))

    return edit


def _append(text: str) -> Edit:
    def edit(model_dir: Path) -> None:
        path = model_dir / "config.pbtxt"
        path.write_text(path.read_text() + text)

    return edit


def _remove_version(model_dir: Path) -> None:
    shutil.rmtree(model_dir / "1")


def _second_model(model_dir: Path) -> None:
    shutil.copytree(model_dir, model_dir.parent / "other")


#: Refused by our gate and by the real server.
REFUSED_BY_BOTH: dict[str, Edit] = {
    "preferred batch size above max_batch_size": _config_edit("preferred_batch_size: 4", "preferred_batch_size: 8"),
    "negative max_batch_size": _config_edit("max_batch_size: 4", "max_batch_size: -1"),
    "a dimension of 0": _config_edit("dims: 32", "dims: 0"),
    "execution_mode other than 0/1": _append('parameters { key: "execution_mode" value { string_value: "2" } }\n'),
    "unknown tensorrt accelerator key": _append(
        'optimization { execution_accelerators { gpu_execution_accelerator { name: "tensorrt" '
        'parameters { key: "precision" value: "FP16" } } } }\n'),
    "cpu accelerator other than openvino": _append(
        'optimization { execution_accelerators { cpu_execution_accelerator { name: "cuda" } } }\n'),
    "enable_mem_arena not a boolean": _append('parameters { key: "enable_mem_arena" value { string_value: "yes" } }\n'),
    "no version directory": _remove_version,
    "dims that are not the graph's": _config_edit("dims: 32", "dims: 16"),
    "a data type that is not the graph's": _config_edit("data_type: TYPE_FP32", "data_type: TYPE_FP16"),
    "an input the graph does not have": _config_edit('name: "pixel_values"', 'name: "pixels"'),
    # The same tensor twice (a copy-paste), nothing else wrong: the onnxruntime backend's
    # ValidateInputs compares the config's input count with the graph's (src/onnxruntime.cc).
    "two inputs with one name": _append('input { name: "pixel_values" data_type: TYPE_FP32 dims: [3, 32, 32] }\n'),
}
#: Refused by our gate on purpose; Triton loads them (and silently does something else).
STRICTER_THAN_TRITON: dict[str, Edit] = {
    "unknown parameters key (a typo)": _append('parameters { key: "intra_op_threads" value { string_value: "2" } }\n'),
    "graph optimization level other than -1/1/2": _append("optimization { graph { level: 5 } }\n"),
    "two model directories without an ensemble": _second_model,
}
STRICT_REASONS: dict[str, str] = {
    "unknown parameters key (a typo)": "parameters key: got 'intra_op_threads'; unknown key",
    "graph optimization level other than -1/1/2": "optimization.graph.level: got 5",
    "two model directories without an ensemble": "several folders need exactly one ensemble",
}


#: For each case: a keyword our gate's error must contain, and one the server's refusal must contain.
REASONS: dict[str, tuple[str, str]] = {
    "preferred batch size above max_batch_size": ("dynamic_batching.preferred_batch_size: got 8",
                                                  "preferred size must be <= max batch size"),
    "negative max_batch_size": ("max_batch_size: got -1", "'max_batch_size' must be non-negative"),
    "a dimension of 0": ("dims: got [3, 0, 32]", "dimension must be integer >= 1"),
    "execution_mode other than 0/1": ("parameters['execution_mode']: got '2'", "unsupported execution mode '2'"),
    "unknown tensorrt accelerator key": ("key: got 'precision'", "unknown parameter 'precision'"),
    "cpu accelerator other than openvino": ("cpu_execution_accelerator[0].name: got 'cuda'",
                                            "unknown Execution Accelerator 'cuda'"),
    "enable_mem_arena not a boolean": ("parameters['enable_mem_arena']: got 'yes'",
                                       "failed to convert 'yes' to boolean value for parameter 'enable_mem_arena'"),
    "no version directory": ("version directory: none found", "at least one version must be available"),
    "dims that are not the graph's": ("config input 'pixel_values': dims [3, 16, 32]",
                                      "the configuration declares dims [3, 16, 32]"),
    "a data type that is not the graph's": ("data_type TYPE_FP16; the onnx graph has FP32",
                                            "unexpected datatype TYPE_FP16 for input 'pixel_values'"),
    "an input the graph does not have": ("config input 'pixels': name not in the onnx graph", "unexpected input 'pixels'"),
    "two inputs with one name": ("names must be unique", "configuration expects 2 inputs, model provides 1"),
}


def our_gate(root: Path) -> str:
    """The build's own pre-publish gate, exactly as the build calls it (on the unpacked folder)."""
    return check_repository(root, model="rules")


@pytest.fixture(scope="module")
def good(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("rules")
    spec = parse_manifest({"version": 1, "models": [SPEC]}).models[0]
    steps: list[str] = []
    result = build_model(spec, BuildOptions(base_dir=work), release_dir=work, work_dir=work / "work", step=steps.append)
    assert steps[-1] == "pre-publish gate"  # the build ran this very gate on the tarball it wrote
    root = work / "good"
    with tarfile.open(work / result.tarball) as tar:
        tar.extractall(root, filter="data")
    return root


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonServer]:
    with triton_server(work_dir=tmp_path_factory.mktemp("triton")) as running:
        yield running


def _case(good: Path, tmp_path: Path, edit: Edit) -> Path:
    root = tmp_path / "model"
    shutil.copytree(good, root)
    edit(root / "rules")
    return root


def _load(server: TritonServer, root: Path, name: str) -> tuple[int, str]:
    """The server's answer to a load, and what its log says about that load (where the server
    answers only "failed to poll from model repository", the log holds the reason)."""
    before = server.log_path.stat().st_size if server.log_path.exists() else 0
    answer = server.request("POST", "/models", json.dumps({"model_name": name, "url": str(root)}).encode(),
                            headers={"Content-Type": "application/json"}, timeout=120)
    if answer.status == 200:
        server.request("DELETE", f"/models/{name}", timeout=120)
    with server.log_path.open("rb") as log:
        log.seek(before)
        logged = log.read().decode(errors="replace")
    return answer.status, answer.body.decode(errors="replace") + "\n" + logged


def test_the_unchanged_model_passes_both(server: TritonServer, good: Path) -> None:
    our_gate(good)
    assert _load(server, good, "good")[0] == 200


@pytest.mark.parametrize("case", list(REFUSED_BY_BOTH))
def test_refused_by_our_gate_and_by_the_real_server(server: TritonServer, good: Path, tmp_path: Path,
                                                    case: str) -> None:
    root = _case(good, tmp_path, REFUSED_BY_BOTH[case])
    ours, theirs = REASONS[case]
    with pytest.raises(ModelBuildError) as caught:
        our_gate(root)
    assert ours in str(caught.value), str(caught.value)
    assert "'rules'" in str(caught.value) and caught.value.model == "rules"
    status, message = _load(server, root, f"refused{list(REFUSED_BY_BOTH).index(case)}")
    assert status == 400, message
    assert theirs in message, message


@pytest.mark.parametrize("case", list(STRICTER_THAN_TRITON))
def test_stricter_than_triton_on_purpose(server: TritonServer, good: Path, tmp_path: Path, case: str) -> None:
    root = _case(good, tmp_path, STRICTER_THAN_TRITON[case])
    with pytest.raises(ModelBuildError) as caught:
        our_gate(root)
    assert STRICT_REASONS[case] in str(caught.value), str(caught.value)
    status, message = _load(server, root, f"strict{list(STRICTER_THAN_TRITON).index(case)}")
    assert status == 200, message


# ------------------------------------------------------------------------------------------------
# A tarball holding a whole repository: an ensemble and its member
# ------------------------------------------------------------------------------------------------

ENSEMBLE_CONFIG = """name: "ensemble"
platform: "ensemble"
max_batch_size: 4
input { name: "pixel_values" data_type: TYPE_FP32 dims: [3, 32, 32] }
output { name: "logits" data_type: TYPE_FP32 dims: [4] }
ensemble_scheduling { step { model_name: "rules" model_version: -1
  input_map { key: "pixel_values" value: "pixel_values" } output_map { key: "logits" value: "logits" } } }
"""


def _ensemble(good: Path, tmp_path: Path, edit: Callable[[Path], None] | None = None) -> Path:
    root = tmp_path / "repo"
    shutil.copytree(good, root)
    (root / "ensemble" / "1").mkdir(parents=True)
    (root / "ensemble" / "config.pbtxt").write_text(ENSEMBLE_CONFIG)
    if edit:
        edit(root)
    return root


def _member_renamed(root: Path) -> None:
    path = root / "rules" / "config.pbtxt"
    path.write_text(path.read_text().replace('name: "rules"', 'name: "other"', 1))


def _step_names_a_missing_member(root: Path) -> None:
    path = root / "ensemble" / "config.pbtxt"
    path.write_text(path.read_text().replace('model_name: "rules"', 'model_name: "absent"'))


def _ensemble_edit(old: str, new: str) -> Edit:
    def edit(root: Path) -> None:
        path = root / "ensemble" / "config.pbtxt"
        assert old in path.read_text()
        path.write_text(path.read_text().replace(old, new, 1))

    return edit


ENSEMBLE_REFUSED_BY_BOTH: dict[str, Edit] = {
    "member config name other than its folder": _member_renamed,
    "ensemble step naming a member not in the tarball": _step_names_a_missing_member,
    "member without a version directory": lambda root: shutil.rmtree(root / "rules" / "1"),
    "step mapping a tensor the member does not have": _ensemble_edit('key: "pixel_values"', 'key: "pixels"'),
    "ensemble output no step produces": _ensemble_edit('value: "logits"', 'value: "scores"'),
    "member config against its graph (data type)": lambda root: _config_edit(
        "data_type: TYPE_FP32", "data_type: TYPE_FP16")(root / "rules"),
}
ENSEMBLE_REASONS: dict[str, tuple[str, str]] = {
    "member config name other than its folder": ("config name 'other'", "directory name must equal model name"),
    "ensemble step naming a member not in the tarball": ("model 'absent' is not in the tarball",
                                                         "'absent': model not found"),
    "member without a version directory": ("version directory: none found", "at least one version must be available"),
    "step mapping a tensor the member does not have": ("input_map: key 'pixels'", "non-existing input pixels"),
    "ensemble output no step produces": ("ensemble output 'logits': no step produces it", "ensemble output 'logits'"),
    "member config against its graph (data type)": ("data_type TYPE_FP16; the onnx graph has FP32",
                                                    "unexpected datatype TYPE_FP16 for input 'pixel_values'"),
}


def test_an_ensemble_tarball_passes_both(server: TritonServer, good: Path, tmp_path: Path) -> None:
    root = _ensemble(good, tmp_path)
    assert our_gate(root) == "ensemble"
    status, message = _load(server, root, "ensemble-good")
    assert status == 200, message


@pytest.mark.parametrize("case", list(ENSEMBLE_REFUSED_BY_BOTH))
def test_ensemble_rules_refused_by_our_check_and_by_the_real_server(server: TritonServer, good: Path,
                                                                    tmp_path: Path, case: str) -> None:
    root = _ensemble(good, tmp_path, ENSEMBLE_REFUSED_BY_BOTH[case])
    ours, theirs = ENSEMBLE_REASONS[case]
    with pytest.raises(ModelBuildError) as caught:
        our_gate(root)
    assert ours in str(caught.value), str(caught.value)
    status, message = _load(server, root, f"ensemble{list(ENSEMBLE_REFUSED_BY_BOTH).index(case)}")
    assert status == 400, message
    assert theirs in message, message
