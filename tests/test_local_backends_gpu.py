"""The local endpoint's python-based onnxruntime backend on a GPU instance: which providers it gives
the session, and that it never answers from another device than the config says.

On this CPU machine a ``KIND_GPU`` instance cannot be started (Triton itself refuses it without a
GPU), so these tests call the backend's module directly, with Triton's own
``triton_python_backend_utils`` (from the triton environment) and this project's ONNX Runtime;
``make gpu-check`` runs the same code inside the real tritonserver on a GPU.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import onnxruntime as ort
import pytest
from triton_helpers import requires_triton  # tests/ is on sys.path

from triton_mme_cdk.model_build.artifact.backend import _trt_options
from triton_mme_cdk.model_build.manifest.fields import TensorRTAccelerator
from triton_mme_cdk.model_build.tools.local_endpoint.triton_server import (
    BACKENDS_SOURCE,
    TritonEnvironment,
    library_path,
)

pytestmark = requires_triton


@pytest.fixture(scope="module")
def backend() -> ModuleType:
    """``triton_backends/onnxruntime/model.py`` as the stub imports it (its folder and Triton's
    utils on the path)."""
    utils = TritonEnvironment.find().package / "backends" / "python"
    sys.path.insert(0, str(utils))
    try:
        spec = importlib.util.spec_from_file_location("local_onnxruntime_backend",
                                                      BACKENDS_SOURCE / "onnxruntime" / "model.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.path.insert(0, str(BACKENDS_SOURCE))  # local_backend_common, copied beside model.py there
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(utils))
        if str(BACKENDS_SOURCE) in sys.path:
            sys.path.remove(str(BACKENDS_SOURCE))


GPU_PROVIDERS = ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"]


def test_a_cpu_instance_runs_on_the_cpu_provider(backend: ModuleType) -> None:
    assert backend.providers({}, gpu=False, device=0, available=GPU_PROVIDERS) == ["CPUExecutionProvider"]


def test_a_gpu_instance_gets_tensorrt_then_cuda_on_its_device(backend: ModuleType) -> None:
    trt = TensorRTAccelerator(precision_mode="FP16", engine_cache=True).parameters(cache_folder="m-0123456789ab")
    config = {
        "parameters": {"cudnn_conv_algo_search": {"string_value": "1"}, "gpu_mem_limit": {"string_value": "1024"}},
        "optimization": {"execution_accelerators": {"gpu_execution_accelerator": [
            {"name": "tensorrt", "parameters": trt},
            {"name": "cuda", "parameters": {"cudnn_conv_use_max_workspace": "1"}},
        ]}},
    }
    chosen = backend.providers(config, gpu=True, device=1, available=GPU_PROVIDERS)
    assert chosen == [
        ("TensorrtExecutionProvider", {"device_id": "1", **_trt_options(trt)}),
        ("CUDAExecutionProvider", {"device_id": "1", "cudnn_conv_use_max_workspace": "1",
                                   "cudnn_conv_algo_search": "HEURISTIC", "gpu_mem_limit": "1024"}),
        "CPUExecutionProvider",
    ]
    assert chosen[0][1]["trt_fp16_enable"] == "1" and chosen[0][1]["trt_engine_cache_enable"] == "true"
    # Without accelerators: CUDA on the instance's device, then the CPU for what CUDA does not run.
    assert backend.providers({}, gpu=True, device=0, available=GPU_PROVIDERS) == [
        ("CUDAExecutionProvider", {"device_id": "0"}), "CPUExecutionProvider"]


@pytest.mark.parametrize("params", [
    {"precision_mode": "FP16", "max_workspace_size_bytes": "1073741824"},
    {"precision_mode": "INT8", "int8_calibration_table_name": "t.cache", "int8_use_native_calibration_table": "1"},
    {"precision_mode": "FP32", "trt_builder_optimization_level": "3", "trt_dump_subgraphs": ""},
    TensorRTAccelerator(precision_mode="BF16", engine_cache=True).parameters(cache_folder="x-0"),
])
def test_the_tensorrt_keys_map_as_the_builds_gate_maps_them(backend: ModuleType, params: dict[str, str]) -> None:
    assert backend.trt_options(params) == _trt_options(params)


def test_a_gpu_instance_without_the_gpu_providers_is_one_load_error(backend: ModuleType) -> None:
    common = sys.modules["local_backend_common"]
    with pytest.raises(common.ConfigError, match=r"instance kind GPU \(device 0\): onnxruntime .* has no "
                                                 r"CUDAExecutionProvider .*install onnxruntime-gpu"):
        backend.providers({}, gpu=True, device=0, available=["CPUExecutionProvider"])
    config = {"optimization": {"execution_accelerators": {"gpu_execution_accelerator": [{"name": "tensorrt"}]}}}
    with pytest.raises(common.ConfigError, match=r"the tensorrt accelerator: .* no TensorrtExecutionProvider"):
        backend.providers(config, gpu=True, device=0, available=["CUDAExecutionProvider", "CPUExecutionProvider"])
    bad = {"parameters": {"arena_extend_strategy": {"string_value": "7"}}}
    with pytest.raises(common.ConfigError, match=r"unsupported arena_extend_strategy '7' \(expected 0 to 1\)"):
        backend.providers(bad, gpu=True, device=0, available=GPU_PROVIDERS)


def test_a_session_that_fell_back_to_the_cpu_is_refused(backend: ModuleType, tmp_path: Path) -> None:
    """ONNX Runtime without CUDA (this machine's) only warns when CUDA is asked for and runs on the
    CPU: the backend refuses that session instead of answering from the CPU."""
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = tmp_path / "model.onnx"
    onnx.save(model, path)
    common = sys.modules["local_backend_common"]
    with pytest.raises(common.ConfigError, match=r"onnxruntime did not use CUDAExecutionProvider "
                                                 r"\(the session runs on \['CPUExecutionProvider'\]\)"):
        backend.open_session(str(path), ort.SessionOptions(),
                             [("CUDAExecutionProvider", {"device_id": "0"}), "CPUExecutionProvider"])
    session = backend.open_session(str(path), ort.SessionOptions(), ["CPUExecutionProvider"])
    assert session.get_providers() == ["CPUExecutionProvider"]


def _fake_environment(root: Path) -> TritonEnvironment:
    """A triton environment of Python 3.99 (no such libpython anywhere) under ``root/env``."""
    site = root / "env" / "lib" / "python3.99" / "site-packages"
    site.mkdir(parents=True)
    return TritonEnvironment(root=root / "env", site_packages=site)


def _fake_base_python(root: Path) -> Path:
    """``root/base``: a Python prefix with its libpython3.99 in ``lib``, the environment's ``home``."""
    (root / "base" / "bin").mkdir(parents=True)
    (root / "base" / "lib").mkdir()
    (root / "base" / "lib" / "libpython3.99.so.1.0").write_bytes(b"")
    (root / "env" / "pyvenv.cfg").write_text(f"home = {root / 'base' / 'bin'}\nversion = 3.99.0\n")
    return root / "base" / "lib"


def test_the_stubs_libpython_is_looked_for_beside_the_base_python(tmp_path: Path) -> None:
    """A GPU machine's Python may live in its own prefix (not the system's): the server is started
    with that prefix's lib on its library path, and a Python whose shared library is nowhere is one
    clear reason instead of a stub that never starts."""
    env = _fake_environment(tmp_path)
    missing = env.missing_libpython(inherited="")
    assert missing.startswith("no libpython3.99.so.1.0 on this machine") and "apt-get install libpython3.99" in missing
    base_lib = _fake_base_python(tmp_path)
    assert env.python_library_dirs == [base_lib] and env.missing_libpython() == ""


def test_the_servers_library_path_keeps_the_callers_after_its_own(tmp_path: Path) -> None:
    """A GPU container may reach the driver's libcuda only through the inherited LD_LIBRARY_PATH:
    the server keeps it, after pytriton's libraries and the stub's libpython, without repeats."""
    env = _fake_environment(tmp_path)
    base_lib = _fake_base_python(tmp_path)
    own = [str(env.site_packages / "nvidia_pytriton.libs"), str(base_lib)]
    assert library_path(env, "").split(":") == own
    inherited = f"/usr/local/nvidia/lib64::{base_lib}:/usr/local/cuda/lib64"
    assert library_path(env, inherited).split(":") == [*own, "/usr/local/nvidia/lib64", "/usr/local/cuda/lib64"]


def test_a_libpython_on_the_servers_library_path_is_found_there(tmp_path: Path) -> None:
    """Where the loader's cache lacks it, a libpython in pytriton's library folder or on the
    caller's LD_LIBRARY_PATH is on the server's path too: the stub can start."""
    env = _fake_environment(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    assert env.missing_libpython(inherited=str(elsewhere)).startswith("no libpython3.99.so.1.0")
    (elsewhere / "libpython3.99.so.1.0").write_bytes(b"")
    assert env.missing_libpython(inherited=str(elsewhere)) == ""
    assert env.missing_libpython(inherited="").startswith("no libpython3.99.so.1.0")
    env.libraries.mkdir()
    (env.libraries / "libpython3.99.so.1.0").write_bytes(b"")
    assert env.missing_libpython(inherited="") == ""
