"""Triton's ``onnxruntime`` backend, played by the python backend for the local endpoint.

It reads the config the way ``onnxruntime_backend/src/onnxruntime.cc`` does: the model-level
``parameters`` it knows (others ignored, as there), ``optimization { graph { level } }``, the CPU
accelerators (only ``openvino`` exists; anything else is refused) and the tensorrt accelerator's
keys (an unknown key is refused). A ``KIND_CPU`` instance runs on ONNX Runtime's CPU provider. A
``KIND_GPU`` instance (the endpoint keeps that kind only when it serves on a GPU, with
onnxruntime-gpu in the triton environment) gets the providers the C++ backend gives it: the
TensorRT provider first where the config asks for the ``tensorrt`` accelerator (its keys mapped as
the backend maps them), then CUDA on the instance's device with the ``cuda`` accelerator's and the
model-level CUDA keys. A provider this ONNX Runtime lacks, or a session that did not take the
provider asked for first (ONNX Runtime falls back to the CPU with only a warning), is a load error
that names it: the model never answers from another device than its config says.
``memory.enable_memory_arena_shrinkage`` is a run option there and here: passed as given to every
``run`` (ONNX Runtime checks the value, e.g. ``cpu:0``, and fails the request that carries a bad one).
Like the backend's ``ValidateInputs``, the config must list as many (non-optional) inputs as the
graph has ("configuration expects N inputs, model provides M"); the backend fills a config's
inputs itself only under auto-complete when the config lists none, which this stand-in does not do.
Batching is Triton's own: the dynamic batcher hands this file several requests per ``execute``.
"""

from __future__ import annotations

import contextlib
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import local_backend_common as common
import onnxruntime as ort
import triton_python_backend_utils as pb_utils

#: ``optimization.graph.level`` -> ORT level, as the backend maps it (anything else: all).
_LEVELS = {
    -1: ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    1: ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    2: ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
}
#: Keys of the tensorrt accelerator the backend knows; any other is a load error there.
_TRT_KEYS = {
    "precision_mode", "max_workspace_size_bytes", "trt_max_partition_iterations", "trt_min_subgraph_size",
    "int8_calibration_table_name", "int8_use_native_calibration_table", "trt_dla_enable", "trt_dla_core",
    "trt_engine_cache_enable", "trt_engine_cache_path", "trt_dump_subgraphs", "trt_force_sequential_engine_build",
    "trt_context_memory_sharing_enable", "trt_layer_norm_fp32_fallback", "trt_timing_cache_enable",
    "trt_timing_cache_path", "trt_force_timing_cache", "trt_detailed_build_log", "trt_build_heuristics_enable",
    "trt_sparsity_enable", "trt_builder_optimization_level", "trt_auxiliary_streams", "trt_tactic_sources",
    "trt_extra_plugin_lib_paths", "trt_profile_min_shapes", "trt_profile_max_shapes", "trt_profile_opt_shapes",
    "trt_cuda_graph_enable", "trt_dump_ep_context_model", "trt_ep_context_file_path",
    "trt_ep_context_embed_mode",
}


def session_options(config: dict) -> ort.SessionOptions:
    options = ort.SessionOptions()
    params = common.parameters(config)
    level = config.get("optimization", {}).get("graph", {}).get("level", 0)
    options.graph_optimization_level = _LEVELS.get(int(level), ort.GraphOptimizationLevel.ORT_ENABLE_ALL)
    if "intra_op_thread_count" in params:
        count = common.parse_int("intra_op_thread_count", params["intra_op_thread_count"])
        if count > 0:
            options.intra_op_num_threads = count
    if "inter_op_thread_count" in params:
        count = common.parse_int("inter_op_thread_count", params["inter_op_thread_count"])
        if count > 0:
            options.inter_op_num_threads = count
    if "execution_mode" in params:
        mode = common.parse_int("execution_mode", params["execution_mode"])
        if mode not in (0, 1):
            raise common.ConfigError(f"unsupported execution mode '{mode}' (expected 0 or 1)")
        options.execution_mode = ort.ExecutionMode.ORT_PARALLEL if mode else ort.ExecutionMode.ORT_SEQUENTIAL
    if "enable_mem_arena" in params:
        options.enable_cpu_mem_arena = common.parse_bool("enable_mem_arena", params["enable_mem_arena"])
    if "enable_mem_pattern" in params:
        options.enable_mem_pattern = common.parse_bool("enable_mem_pattern", params["enable_mem_pattern"])
    if "session.use_device_allocator_for_initializers" in params:
        options.add_session_config_entry(
            "session.use_device_allocator_for_initializers", params["session.use_device_allocator_for_initializers"]
        )
    return options


#: The one ``parameters`` key the backend applies per run, not per session.
ARENA_SHRINKAGE = "memory.enable_memory_arena_shrinkage"


def run_options(config: dict) -> ort.RunOptions:
    """The backend's run options: ``memory.enable_memory_arena_shrinkage`` as given (e.g. ``cpu:0``)."""
    options = ort.RunOptions()
    params = common.parameters(config)
    if ARENA_SHRINKAGE in params:
        options.add_run_config_entry(ARENA_SHRINKAGE, params[ARENA_SHRINKAGE])
    return options


def check_accelerators(config: dict) -> None:
    accelerators = config.get("optimization", {}).get("execution_accelerators", {})
    for acc in accelerators.get("cpu_execution_accelerator", []):
        if acc.get("name") != "openvino":
            raise common.ConfigError(f"unknown Execution Accelerator '{acc.get('name')}' is requested")
    for acc in accelerators.get("gpu_execution_accelerator", []):
        name = acc.get("name")
        if name == "tensorrt":
            for key in acc.get("parameters", {}):
                if key not in _TRT_KEYS:
                    raise common.ConfigError(f"unknown parameter '{key}' is provided for TensorRT Execution Accelerator")
        elif name != "cuda":
            raise common.ConfigError(f"unknown Execution Accelerator '{name}' is requested")


#: ONNX tensor element types -> Triton config data types.
_ONNX_TYPES = {
    "tensor(float)": "TYPE_FP32", "tensor(float16)": "TYPE_FP16", "tensor(double)": "TYPE_FP64",
    "tensor(int64)": "TYPE_INT64", "tensor(int32)": "TYPE_INT32", "tensor(int16)": "TYPE_INT16",
    "tensor(int8)": "TYPE_INT8", "tensor(uint8)": "TYPE_UINT8", "tensor(bool)": "TYPE_BOOL",
    "tensor(string)": "TYPE_STRING", "tensor(bfloat16)": "TYPE_BF16",
}


def check_io(session: ort.InferenceSession, config: dict) -> None:
    """The backend's ``ValidateInputs``/``ValidateOutputs``: names, data types and shapes."""
    batched = int(config.get("max_batch_size", 0)) > 0
    expected = sum(1 for tensor in config.get("input", []) if not tensor.get("optional", False))
    expected += len(config.get("batch_input", []))
    graph_inputs = session.get_inputs()
    if len(graph_inputs) != expected:
        raise common.ConfigError(
            f"configuration expects {expected} inputs, model provides {len(graph_inputs)} "
            f"(the model's inputs: {sorted(item.name for item in graph_inputs)})"
        )
    for kind, declared, actual in (("input", config.get("input", []), session.get_inputs()),
                                   ("output", config.get("output", []), session.get_outputs())):
        model = {item.name: item for item in actual}
        for tensor in declared:
            name = tensor["name"]
            if name not in model:
                raise common.ConfigError(
                    f"unexpected {kind} '{name}' in model configuration; the model has {sorted(model)}"
                )
            expected = _ONNX_TYPES.get(model[name].type, model[name].type)
            if tensor.get("data_type") != expected:
                raise common.ConfigError(
                    f"unexpected datatype {tensor.get('data_type')} for {kind} '{name}', model provides {expected}"
                )
            dims = [int(d) for d in tensor.get("reshape", {}).get("shape", tensor.get("dims", []))]
            shape = list(model[name].shape)
            if batched:
                shape = shape[1:]
            if len(shape) != len(dims) or any(
                isinstance(m, int) and m >= 0 and d != -1 and m != d for m, d in zip(shape, dims, strict=False)
            ):
                raise common.ConfigError(
                    f"model '{kind}' '{name}' has shape {shape} (batch axis removed: {batched}); "
                    f"the configuration declares dims {dims}"
                )


#: ``precision_mode`` -> the TensorRT provider's flag for it (FP32 sets none).
_TRT_PRECISION_FLAGS = {"FP16": "trt_fp16_enable", "BF16": "trt_bf16_enable", "INT8": "trt_int8_enable"}
#: Accelerator keys the backend passes under another provider option name (even when empty).
_TRT_RENAMED = {"max_workspace_size_bytes": "trt_max_workspace_size",
                "int8_calibration_table_name": "trt_int8_calibration_table_name",
                "int8_use_native_calibration_table": "trt_int8_use_native_calibration_table"}


def trt_options(params: dict[str, str]) -> dict[str, str]:
    """The tensorrt accelerator's keys as TensorRT provider options, as the backend maps them:
    the precision as its flag, three keys renamed, every other non-empty key as given. (The
    build's gate, ``model_build.artifact.backend._trt_options``, maps them too: this file runs in
    the stub and imports nothing of the project; a test holds the two to the same answers.)"""
    mode = params.get("precision_mode")
    flags = {_TRT_PRECISION_FLAGS[mode]: "1"} if mode in _TRT_PRECISION_FLAGS else {}
    renamed = {_TRT_RENAMED[key]: value for key, value in params.items() if key in _TRT_RENAMED}
    passed = {key: value for key, value in params.items()
              if value and key != "precision_mode" and key not in _TRT_RENAMED}
    return {**flags, **renamed, **passed}


def providers(config: dict, *, gpu: bool, device: int, available: list[str]) -> list:
    """The session's providers for one instance: the CPU provider, or (on a GPU instance)
    TensorRT where asked, then CUDA on ``device``, then the CPU for what neither runs."""
    if not gpu:
        return ["CPUExecutionProvider"]
    if "CUDAExecutionProvider" not in available:
        raise common.ConfigError(
            f"instance kind GPU (device {device}): onnxruntime {ort.__version__} in this environment has no "
            f"CUDAExecutionProvider (providers: {available}); install onnxruntime-gpu into the triton "
            "environment, or serve the model with KIND_CPU"
        )
    params = common.parameters(config)
    result: list = []
    cuda: dict[str, str] = {"device_id": str(device)}
    accelerators = config.get("optimization", {}).get("execution_accelerators", {})
    for acc in accelerators.get("gpu_execution_accelerator", []):
        if acc.get("name") == "tensorrt":
            if "TensorrtExecutionProvider" not in available:
                raise common.ConfigError(
                    f"the tensorrt accelerator: onnxruntime {ort.__version__} in this environment has no "
                    f"TensorrtExecutionProvider (providers: {available})"
                )
            result.append(("TensorrtExecutionProvider",
                           {"device_id": str(device), **trt_options(acc.get("parameters", {}))}))
        elif acc.get("name") == "cuda":
            cuda.update(acc.get("parameters", {}))
    for key, names in (("cudnn_conv_algo_search", ("EXHAUSTIVE", "HEURISTIC", "DEFAULT")),
                       ("arena_extend_strategy", ("kNextPowerOfTwo", "kSameAsRequested"))):
        if key in params:
            index = common.parse_int(key, params[key])
            if not 0 <= index < len(names):
                raise common.ConfigError(f"unsupported {key} '{index}' (expected 0 to {len(names) - 1})")
            cuda[key] = names[index]
    for key in ("gpu_mem_limit", "do_copy_in_default_stream"):
        if key in params:
            cuda[key] = params[key]
    return [*result, ("CUDAExecutionProvider", cuda), "CPUExecutionProvider"]


def open_session(path: str, options: ort.SessionOptions, chosen: list) -> ort.InferenceSession:
    """A session on ``chosen``; a load error when ONNX Runtime did not take the first of them."""
    session = ort.InferenceSession(path, sess_options=options, providers=chosen)
    wanted = chosen[0] if isinstance(chosen[0], str) else chosen[0][0]
    if session.get_providers()[0] != wanted:
        raise common.ConfigError(
            f"onnxruntime did not use {wanted} (the session runs on {session.get_providers()}); "
            "its log above says why (a CUDA, cuDNN or TensorRT library it could not load)"
        )
    return session


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        self.config = common.load_args(args)
        check_accelerators(self.config)
        options = session_options(self.config)
        path = common.model_path(args, self.config, "model.onnx")
        gpu = common.kind_is_gpu(args)
        if gpu and hasattr(ort, "preload_dlls"):
            # CUDA, cuDNN and cuBLAS from the pip-installed NVIDIA packages, which are on no library
            # path here (the image has them in the system's); a library still missing shows as the
            # provider refusal below.
            with contextlib.suppress(Exception):  # the refusal below names the provider that did not load
                ort.preload_dlls()
        chosen = providers(self.config, gpu=gpu, device=common.device_id(args),
                           available=ort.get_available_providers())
        self.session = open_session(path, options, chosen)
        check_io(self.session, self.config)
        self.inputs = [tensor["name"] for tensor in self.config.get("input", [])]
        self.outputs = [tensor["name"] for tensor in self.config.get("output", [])]
        self.batched = int(self.config.get("max_batch_size", 0)) > 0
        self.run_options = run_options(self.config)

    def execute(self, requests: list) -> list:
        def run(feeds: dict) -> list:
            return self.session.run(self.outputs, feeds, self.run_options)

        return common.execute(pb_utils, requests, self.inputs, self.outputs, run, batched=self.batched)
