"""Opening a model as its Triton backend would: an ONNX Runtime session, or a TorchScript module,
with the settings its config asks for.

``open_model`` is what the gate uses for TorchScript (the module loads, and the config's inputs map
to ``forward``'s arguments), what the local endpoint's python-based backends mirror, and what the
benchmarks time directly.
"""

from __future__ import annotations

import re
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from triton_mme_cdk.model_build.artifact.signature import check_signature
from triton_mme_cdk.model_build.artifact.triton_config import ModelConfig, config_backend
from triton_mme_cdk.model_build.artifact.triton_config import mc as _mc
from triton_mme_cdk.model_build.errors import VerifyError

_ORT_TO_WIRE = {
    "tensor(float)": "FP32",
    "tensor(float16)": "FP16",
    "tensor(bfloat16)": "BF16",
    "tensor(double)": "FP64",
    "tensor(int8)": "INT8",
    "tensor(int16)": "INT16",
    "tensor(int32)": "INT32",
    "tensor(int64)": "INT64",
    "tensor(uint8)": "UINT8",
    "tensor(uint16)": "UINT16",
    "tensor(uint32)": "UINT32",
    "tensor(uint64)": "UINT64",
    "tensor(bool)": "BOOL",
    "tensor(string)": "BYTES",
}
_INDEXED_NAME = re.compile(r"^.+__([0-9]+)$")


# --------------------------------------------------------------------------------------------
# Running the model as the backend would
# --------------------------------------------------------------------------------------------


def _wants_gpu(config: ModelConfig) -> bool:
    kinds = {group.kind for group in config.instance_group}
    # No instance group: Triton uses the GPU when one is present.
    return not kinds or bool(kinds & {_mc.ModelInstanceGroup.KIND_GPU, _mc.ModelInstanceGroup.KIND_AUTO})


class _OnnxRunner:
    """An ONNX Runtime session built from the config as the onnxruntime backend builds it."""

    def __init__(self, path: Path, config: ModelConfig, model: str) -> None:
        import onnxruntime as ort

        params = {key: config.parameters[key].string_value for key in config.parameters}
        options = ort.SessionOptions()
        options.log_severity_level = 3
        level = int(config.optimization.graph.level) if config.optimization.HasField("graph") else 0
        options.graph_optimization_level = {
            -1: ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
            1: ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
            2: ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
        }.get(level, ort.GraphOptimizationLevel.ORT_ENABLE_ALL)
        options.execution_mode = (
            ort.ExecutionMode.ORT_PARALLEL
            if params.get("execution_mode") == "1"
            else ort.ExecutionMode.ORT_SEQUENTIAL
        )
        for key, attribute in (
            ("intra_op_thread_count", "intra_op_num_threads"),
            ("inter_op_thread_count", "inter_op_num_threads"),
        ):
            if int(params.get(key, "0")) > 0:
                setattr(options, attribute, int(params[key]))
        if "enable_mem_arena" in params:
            options.enable_cpu_mem_arena = params["enable_mem_arena"].lower() in {"1", "true", "on"}
        if "enable_mem_pattern" in params:
            options.enable_mem_pattern = params["enable_mem_pattern"].lower() in {"1", "true", "on"}
        key = "session.use_device_allocator_for_initializers"
        if key in params:
            options.add_session_config_entry(key, params[key])
        self.run_options = ort.RunOptions()
        key = "memory.enable_memory_arena_shrinkage"
        if key in params:
            self.run_options.add_run_config_entry(key, params[key])

        providers: list[Any] = []
        available = set(ort.get_available_providers())
        if _wants_gpu(config) and "CUDAExecutionProvider" in available:
            cuda: dict[str, str] = {}
            for acc in config.optimization.execution_accelerators.gpu_execution_accelerator:
                if acc.name == "tensorrt" and "TensorrtExecutionProvider" in available:
                    providers.append(("TensorrtExecutionProvider", _trt_options(dict(acc.parameters))))
                elif acc.name == "cuda":
                    cuda.update(acc.parameters)
            if "cudnn_conv_algo_search" in params:
                cuda["cudnn_conv_algo_search"] = ("EXHAUSTIVE", "HEURISTIC", "DEFAULT")[
                    int(params["cudnn_conv_algo_search"])
                ]
            if "arena_extend_strategy" in params:
                cuda["arena_extend_strategy"] = ("kNextPowerOfTwo", "kSameAsRequested")[
                    int(params["arena_extend_strategy"])
                ]
            for key in ("gpu_mem_limit", "do_copy_in_default_stream"):
                if key in params:
                    cuda[key] = params[key]
            providers.append(("CUDAExecutionProvider", cuda))
        providers.append("CPUExecutionProvider")
        try:
            self.session = ort.InferenceSession(str(path), sess_options=options, providers=providers)
        except Exception as error:  # onnxruntime raises its own exception types
            raise VerifyError(
                f"model {model!r}: onnx runtime cannot load {path.name!r}: {error}", model=model
            ) from None
        self.providers = tuple(self.session.get_providers())
        self._check_signature(config, model)

    def _check_signature(self, config: ModelConfig, model: str) -> None:
        """The backend refuses a config whose tensors the graph does not have (name, type, dims)."""
        check_signature(config, model, "onnx graph",
                        [(t.name, _ORT_TO_WIRE.get(t.type, t.type), list(t.shape)) for t in self.session.get_inputs()],
                        [(t.name, _ORT_TO_WIRE.get(t.type, t.type), list(t.shape)) for t in self.session.get_outputs()])

    def run(self, feeds: dict[str, np.ndarray], names: list[str]) -> dict[str, np.ndarray]:
        results = self.session.run(names, feeds, self.run_options)
        return {name: np.asarray(value) for name, value in zip(names, results, strict=True)}


def _trt_options(params: dict[str, str]) -> dict[str, str]:
    """Triton's TensorRT accelerator keys as ONNX Runtime TensorRT provider options."""
    options: dict[str, str] = {}
    for key, value in params.items():
        if key == "precision_mode":
            flag = {"FP16": "trt_fp16_enable", "BF16": "trt_bf16_enable", "INT8": "trt_int8_enable"}
            if value in flag:
                options[flag[value]] = "1"
        elif key == "max_workspace_size_bytes":
            options["trt_max_workspace_size"] = value
        elif key in {"int8_calibration_table_name", "int8_use_native_calibration_table"}:
            options["trt_" + key] = value
        elif value:
            options[key] = value
    return options


class _TorchRunner:
    """A TorchScript module called as the pytorch backend calls it."""

    def __init__(self, path: Path, config: ModelConfig, model: str) -> None:
        import torch  # lazy: verifying an ONNX model must not pay for importing torch

        self._torch = torch
        self.model = model
        self.device = "cuda" if _wants_gpu(config) and torch.cuda.is_available() else "cpu"
        try:
            with warnings.catch_warnings():
                # Deprecated in torch, but TorchScript is what Triton's pytorch backend loads.
                warnings.simplefilter("ignore", DeprecationWarning)
                self.module = torch.jit.load(str(path), map_location=self.device)
        except Exception as error:  # torch raises RuntimeError and others
            raise VerifyError(
                f"model {model!r}: torch.jit.load cannot load {path.name!r}: {error}", model=model
            ) from None
        self.module.eval()
        self.providers: tuple[str, ...] = ()
        self.input_order = self._order([io.name for io in config.input], model, "input")
        self.output_order = self._order([io.name for io in config.output], model, "output")

    def _order(self, names: list[str], model: str, kind: str) -> list[str]:
        """Names by position: ``<name>__<index>`` gives the index, else forward's argument names."""
        indexed = [_INDEXED_NAME.match(n) for n in names]
        if all(indexed):
            by_index = {int(m.group(1)): n for m, n in zip(indexed, names, strict=True) if m}
            if sorted(by_index) != list(range(len(names))):
                raise VerifyError(
                    f"model {model!r}: {kind} names {names}: the '__<index>' suffixes must be "
                    f"0 to {len(names) - 1}, each once",
                    model=model,
                )
            return [by_index[i] for i in range(len(names))]
        if kind == "input":
            try:
                arguments = [a.name for a in self.module.forward.schema.arguments][1:]
            except AttributeError:
                arguments = []
            if sorted(arguments) == sorted(names):
                return arguments
        return names

    def run(self, feeds: dict[str, np.ndarray], names: list[str]) -> dict[str, np.ndarray]:
        torch = self._torch
        args = [torch.from_numpy(np.ascontiguousarray(feeds[n])).to(self.device) for n in self.input_order]
        with torch.inference_mode():
            result = self.module(*args)
        values = list(result) if isinstance(result, tuple | list) else [result]
        if len(values) != len(self.output_order):
            raise VerifyError(
                f"model {self.model!r}: output: the module returned {len(values)} tensors; the "
                f"config lists {len(self.output_order)} outputs",
                model=self.model,
            )
        produced = {
            name: value.detach().cpu().numpy()
            for name, value in zip(self.output_order, values, strict=True)
        }
        return {name: produced[name] for name in names}


def open_model(model_path: Path, config: ModelConfig, *, model: str) -> _OnnxRunner | _TorchRunner:
    """Open the model file with the runtime its backend uses."""
    backend = config_backend(config)
    if backend == "onnxruntime":
        if model_path.is_dir():  # the backend reads <dir>/model.onnx for a directory
            model_path = model_path / "model.onnx"
        if not model_path.is_file():
            raise VerifyError(
                f"model {model!r}: model file {model_path.name!r}: missing in the version directory",
                model=model,
            )
        return _OnnxRunner(model_path, config, model)
    if not model_path.is_file():
        raise VerifyError(
            f"model {model!r}: model file {model_path.name!r}: missing in the version directory",
            model=model,
        )
    return _TorchRunner(model_path, config, model)
