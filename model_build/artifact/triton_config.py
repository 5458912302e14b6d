"""Check Triton ``config.pbtxt`` files (written by :mod:`model_build.artifact.render`).

:func:`check_config` re-reads a config and applies, before anything is uploaded, the checks that
Triton's core (``model_config_utils.cc``) and the ONNX Runtime backend (``src/onnxruntime.cc``)
apply when the model is loaded on the endpoint (and, for prebuilt plans, what the TensorRT backend
reads of a config: GPU instances, its data types, ``cc_model_filenames``). On a SageMaker multi-model endpoint a config that
fails there is only found on the first invocation, as a 5xx on somebody else's request; here it is
a build error that names the field, the value and what is allowed.

A few checks are stricter than Triton on purpose, each noted where it is made: Triton ignores
unknown ``parameters`` keys and graph levels other than -1/1/2 (a typo then silently changes
nothing), and it accepts ``dynamic_batching`` on a model that cannot batch. A config that lists
one tensor twice under the same name is refused by Triton's onnxruntime backend too (its input
count differs from the graph's: tests/test_config_rules_on_triton.py); here the message says why.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import TypeAlias

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from triton_mme_cdk.model_build.errors import TritonConfigError
from triton_mme_cdk.model_build.manifest import TENSORRT_DATA_TYPES, TENSORRT_KEYS
from triton_mme_cdk.model_build.manifest.engines import COMPUTE_CAPABILITY_PATTERN, PLAN_FILE_PATTERN

#: The generated protobuf class (untyped for mypy: the package ships no stubs).
ModelConfig: TypeAlias = mc.ModelConfig

#: ``backend`` and ``platform`` for each export format (Triton core ``constants.h``).
FORMAT_BACKEND: dict[str, tuple[str, str]] = {
    "onnx": ("onnxruntime", "onnxruntime_onnx"),
    "torchscript": ("pytorch", "pytorch_libtorch"),
    "tensorrt_plan": ("tensorrt", "tensorrt_plan"),
}
#: File name the backend opens in the version directory when ``default_model_filename`` is unset.
BACKEND_DEFAULT_FILENAME: dict[str, str] = {
    "onnxruntime": "model.onnx",
    "pytorch": "model.pt",
    "tensorrt": "model.plan",
}
_PLATFORM_BACKEND = {platform: backend for backend, platform in FORMAT_BACKEND.values()}
_GRAPH_LEVEL_VALUES = (-1, 1, 2)

#: Values the backend's ``ParseBoolValue`` accepts (case-insensitive), for keys it parses itself.
_BACKEND_BOOLS = frozenset({"true", "false", "on", "off", "1", "0"})
#: Values accepted where the string is handed on to ONNX Runtime unchanged (CUDA/TensorRT
#: provider options), which are also accepted by the backend's own parser.
_ORT_BOOLS = frozenset({"true", "false", "True", "False", "1", "0"})

_INT = re.compile(r"^-?[0-9]+$")
_UINT = re.compile(r"^[0-9]+$")
_SHRINKAGE = re.compile(r"^(cpu|gpu):[0-9]+(;(cpu|gpu):[0-9]+)*$")


# --------------------------------------------------------------------------------------------
# Value checkers: each returns None when the value is legal, else the "allowed" text.
# --------------------------------------------------------------------------------------------

Checker = Callable[[str], "str | None"]


def _one_of(*values: str) -> Checker:
    def check(value: str) -> str | None:
        return None if value in values else "one of " + ", ".join(repr(v) for v in values)

    return check


def _int_at_least(low: int) -> Checker:
    def check(value: str) -> str | None:
        if _INT.match(value) and int(value) >= low:
            return None
        return f"a decimal integer >= {low}"

    return check


def _any_int(value: str) -> str | None:
    return None if _INT.match(value) else "a decimal integer"


def _positive_uint(value: str) -> str | None:
    return None if _UINT.match(value) and int(value) >= 1 else "a decimal integer >= 1 (bytes)"


def _backend_bool(value: str) -> str | None:
    return None if value.lower() in _BACKEND_BOOLS else "'1', '0', 'true' or 'false'"


def _ort_bool(value: str) -> str | None:
    return None if value in _ORT_BOOLS else "'1', '0', 'true' or 'false'"


def _non_empty(value: str) -> str | None:
    return None if value else "a non-empty string"


def _shrinkage(value: str) -> str | None:
    return None if _SHRINKAGE.match(value) else "a list like 'cpu:0;gpu:0'"


#: Model-level ``parameters`` the ONNX Runtime backend reads (src/onnxruntime.cc). The backend
#: ignores any other key; here an unknown key is an error, because it is almost always a typo
#: that would silently leave the default in place.
ORT_PARAMETERS: dict[str, Checker] = {
    "execution_mode": _one_of("0", "1"),
    "intra_op_thread_count": _int_at_least(0),
    "inter_op_thread_count": _int_at_least(0),
    "enable_mem_arena": _backend_bool,
    "enable_mem_pattern": _backend_bool,
    "memory.enable_memory_arena_shrinkage": _shrinkage,
    "session.use_device_allocator_for_initializers": _one_of("0", "1"),
    "cudnn_conv_algo_search": _one_of("0", "1", "2"),
    "gpu_mem_limit": _positive_uint,
    "arena_extend_strategy": _one_of("0", "1"),
    "do_copy_in_default_stream": _ort_bool,
}

TENSORRT_PRECISION_MODES = ("FP32", "FP16", "BF16", "INT8")
_TRT_INT_KEYS = frozenset(
    {
        "trt_max_partition_iterations",
        "trt_min_subgraph_size",
        "trt_dla_core",
        "trt_builder_optimization_level",
        "trt_auxiliary_streams",
        "trt_ep_context_embed_mode",
    }
)
_TRT_BOOL_KEYS = frozenset(
    {
        "int8_use_native_calibration_table",
        "trt_dla_enable",
        "trt_engine_cache_enable",
        "trt_dump_subgraphs",
        "trt_force_sequential_engine_build",
        "trt_context_memory_sharing_enable",
        "trt_layer_norm_fp32_fallback",
        "trt_timing_cache_enable",
        "trt_force_timing_cache",
        "trt_detailed_build_log",
        "trt_build_heuristics_enable",
        "trt_sparsity_enable",
        "trt_cuda_graph_enable",
        "trt_dump_ep_context_model",
    }
)


def _trt_checker(key: str) -> Checker:
    if key == "precision_mode":
        return _one_of(*TENSORRT_PRECISION_MODES)
    if key == "max_workspace_size_bytes":
        return _positive_uint
    if key in _TRT_INT_KEYS:
        return _any_int
    if key in _TRT_BOOL_KEYS:
        return _ort_bool
    return _non_empty


#: Keys of the ``cuda`` accelerator that the backend parses as booleans itself; other keys are
#: handed to ONNX Runtime's CUDA provider options, which checks them when the session is created.
_CUDA_ACCELERATOR_BOOLS = frozenset({"do_copy_in_default_stream", "use_ep_level_unified_stream"})
GPU_ACCELERATORS = ("tensorrt", "cuda")
CPU_ACCELERATORS = ("openvino",)


# --------------------------------------------------------------------------------------------
# Checking
# --------------------------------------------------------------------------------------------


def _quote(value: object) -> str:
    return repr(value) if isinstance(value, str) else str(value)


class _Problems:
    """Collects every problem so one build run reports all of them, not the first only."""

    def __init__(self, model: str) -> None:
        self.model = model
        self.lines: list[str] = []

    def add(self, field: str, value: object, allowed: str) -> None:
        self.lines.append(f"{field}: got {_quote(value)}; {allowed}")

    def raise_if_any(self) -> None:
        if self.lines:
            head = f"model {self.model!r}: config.pbtxt would not load in triton"
            raise TritonConfigError("\n".join([head, *self.lines]), model=self.model)


def _check_io(config: ModelConfig, problems: _Problems) -> None:
    mbs = config.max_batch_size
    for kind, tensors in (("input", config.input), ("output", config.output)):
        # Backends map tensors by name: two inputs (or two outputs) with one name cannot work.
        seen: dict[str, str] = {}
        for index, io in enumerate(tensors):
            where = f"{kind}[{index}]"
            if not io.name:
                problems.add(f"{where}.name", "", "every tensor needs a name")
            else:
                where = f"{kind}[{index}]({io.name})"
                if io.name in seen:
                    problems.add(
                        f"{where}.name",
                        io.name,
                        f"names must be unique; already used by {seen[io.name]}",
                    )
                else:
                    seen[io.name] = f"{kind}[{index}]"
            if io.data_type == mc.TYPE_INVALID:
                problems.add(f"{where}.data_type", "TYPE_INVALID", "set a data_type such as TYPE_FP32")
            elif config.backend == "onnxruntime" and io.data_type == mc.TYPE_BF16:
                problems.add(
                    f"{where}.data_type", "TYPE_BF16", "the onnxruntime backend has no bf16 tensors"
                )
            _check_dims(problems, f"{where}.dims", list(io.dims),
                        "dims may not be empty; use dims [1] with an empty reshape for a per-batch scalar")
            if io.HasField("reshape"):
                _check_dims(problems, f"{where}.reshape.shape", list(io.reshape.shape),
                            "an empty reshape needs max_batch_size >= 1 (the tensor would hold no data)"
                            if mbs == 0 else None)


def _check_dims(problems: _Problems, field: str, dims: list[int], if_empty: str | None) -> None:
    """One shape: each dimension -1 (variable) or >= 1; ``if_empty`` says why an empty shape
    would not load (None: empty is allowed here)."""
    if not dims and if_empty:
        problems.add(field, "[]", if_empty)
    if any(dim != -1 and dim < 1 for dim in dims):
        problems.add(field, dims, "each dimension must be -1 (variable) or >= 1")


def _check_batching(config: ModelConfig, problems: _Problems) -> None:
    mbs = config.max_batch_size
    if mbs < 0:
        problems.add("max_batch_size", mbs, "must be >= 0 (0 turns batching off)")
        return
    if not config.HasField("dynamic_batching"):
        return
    if mbs == 0:
        # Stricter than Triton, which builds a dynamic batcher that can never form a batch.
        problems.add(
            "dynamic_batching",
            "given with max_batch_size 0",
            "dynamic batching needs max_batch_size >= 1",
        )
        return
    db = config.dynamic_batching
    for size in db.preferred_batch_size:
        if size < 1:
            problems.add("dynamic_batching.preferred_batch_size", size, "each size must be >= 1")
        elif size > mbs:
            problems.add(
                "dynamic_batching.preferred_batch_size",
                size,
                f"each size must be at most max_batch_size ({mbs})",
            )
    levels = db.priority_levels
    if levels and not 1 <= db.default_priority_level <= levels:
        problems.add(
            "dynamic_batching.default_priority_level",
            db.default_priority_level,
            f"must be in [1, {levels}] when priority_levels is {levels}",
        )


def _check_instance_groups(config: ModelConfig, problems: _Problems) -> None:
    if len(config.instance_group) == 0:
        # Triton fills in one group itself; nothing to check.
        return
    for index, group in enumerate(config.instance_group):
        where = f"instance_group[{index}]"
        kind = mc.ModelInstanceGroup.Kind.Name(group.kind)
        if kind == "KIND_MODEL":
            problems.add(
                f"{where}.kind",
                kind,
                "allowed: KIND_GPU, KIND_CPU, KIND_AUTO (KIND_MODEL is for backends that place "
                "devices themselves; onnxruntime and pytorch do not)",
            )
        if group.count < 0:
            problems.add(f"{where}.count", group.count, "must be >= 1 (0 or absent means 1)")
        if kind == "KIND_CPU" and len(group.gpus) > 0:
            problems.add(f"{where}.gpus", list(group.gpus), "a KIND_CPU group may not list gpus")


def _check_backend(config: ModelConfig, problems: _Problems) -> str | None:
    """The backend the config loads with (``None`` if the pair is not one this build serves)."""
    backend, platform = config.backend, config.platform
    allowed = "allowed: " + ", ".join(f"backend {b!r} with platform {p!r}" for b, p in FORMAT_BACKEND.values())
    if not backend and not platform:
        problems.add("backend", "", "set backend (and platform); " + allowed)
        return None
    if backend and backend not in BACKEND_DEFAULT_FILENAME:
        problems.add("backend", backend, allowed)
        return None
    if platform and platform not in _PLATFORM_BACKEND:
        problems.add("platform", platform, allowed)
        return None
    if backend and platform and _PLATFORM_BACKEND[platform] != backend:
        problems.add("platform", platform, f"does not match backend {backend!r}; {allowed}")
        return None
    return backend or _PLATFORM_BACKEND[platform]


def _check_parameters(
    where: str, params: Iterable[tuple[str, str]], checkers: dict[str, Checker], problems: _Problems
) -> None:
    for key, value in params:
        checker = checkers.get(key)
        if checker is None:
            problems.add(
                f"{where} key",
                key,
                "unknown key; allowed: " + ", ".join(sorted(checkers)),
            )
            continue
        allowed = checker(value)
        if allowed is not None:
            problems.add(f"{where}[{key!r}]", value, "allowed: " + allowed)


def _check_onnxruntime(config: ModelConfig, problems: _Problems) -> None:
    _check_parameters(
        "parameters",
        ((key, config.parameters[key].string_value) for key in sorted(config.parameters)),
        ORT_PARAMETERS,
        problems,
    )
    optimization = config.optimization
    if optimization.HasField("graph"):
        level = optimization.graph.level
        # The backend treats anything other than -1/1/2 as "all optimizations" without a word;
        # an explicit odd value is refused here so the config says what it means.
        if level not in _GRAPH_LEVEL_VALUES:
            problems.add(
                "optimization.graph.level",
                level,
                "allowed: -1 (basic), 1 (extended), 2 (disable all); leave the block out for all",
            )
    accelerators = optimization.execution_accelerators
    for index, acc in enumerate(accelerators.gpu_execution_accelerator):
        where = f"optimization.execution_accelerators.gpu_execution_accelerator[{index}]"
        if acc.name not in GPU_ACCELERATORS:
            problems.add(f"{where}.name", acc.name, "allowed: " + ", ".join(GPU_ACCELERATORS))
            continue
        if acc.name == "tensorrt":
            checkers = {key: _trt_checker(key) for key in TENSORRT_KEYS}
            _check_parameters(
                f"{where}(tensorrt).parameters",
                sorted(acc.parameters.items()),
                checkers,
                problems,
            )
        else:
            for key, value in sorted(acc.parameters.items()):
                if key in _CUDA_ACCELERATOR_BOOLS and _ort_bool(value) is not None:
                    problems.add(
                        f"{where}(cuda).parameters[{key!r}]", value, "allowed: '1', '0', 'true' or 'false'"
                    )
    for index, acc in enumerate(accelerators.cpu_execution_accelerator):
        if acc.name not in CPU_ACCELERATORS:
            problems.add(
                f"optimization.execution_accelerators.cpu_execution_accelerator[{index}].name",
                acc.name,
                "allowed: " + ", ".join(CPU_ACCELERATORS),
            )


def _check_no_accelerators(config: ModelConfig, problems: _Problems, backend: str) -> None:
    accelerators = config.optimization.execution_accelerators
    if len(accelerators.gpu_execution_accelerator) or len(accelerators.cpu_execution_accelerator):
        problems.add(
            "optimization.execution_accelerators",
            f"given for backend {backend!r}",
            "execution accelerators apply to the onnxruntime backend only",
        )


def _check_tensorrt(config: ModelConfig, problems: _Problems) -> None:
    """The TensorRT backend: GPU instances only, TensorRT data types, ``cc_model_filenames`` keyed
    by compute capability with plain file names of the version folder. The engines themselves are
    not read here: that needs a GPU and the TensorRT they were built with."""
    _check_no_accelerators(config, problems, "tensorrt")
    for index, group in enumerate(config.instance_group):
        kind = mc.ModelInstanceGroup.Kind.Name(group.kind)
        if kind == "KIND_CPU":
            problems.add(f"instance_group[{index}].kind", kind, "a TensorRT plan runs on the GPU only: use KIND_GPU")
    for kind, tensors in (("input", config.input), ("output", config.output)):
        for index, io in enumerate(tensors):
            name = mc.DataType.Name(io.data_type)
            if io.data_type != mc.TYPE_INVALID and name not in TENSORRT_DATA_TYPES:
                problems.add(f"{kind}[{index}]({io.name}).data_type", name,
                             "the tensorrt backend maps " + ", ".join(TENSORRT_DATA_TYPES))
    for cc in sorted(config.cc_model_filenames):
        filename = config.cc_model_filenames[cc]
        if not re.match(COMPUTE_CAPABILITY_PATTERN, cc):
            problems.add("cc_model_filenames key", cc, "a compute capability 'major.minor' such as '8.6'")
        if not re.match(PLAN_FILE_PATTERN, filename) or ".." in filename:
            problems.add(f"cc_model_filenames[{cc!r}]", filename, "a plain file name in the version folder")


def parse_config(text: str, *, model: str | None = None) -> ModelConfig:
    """Parse ``config.pbtxt`` text into the protobuf; a syntax error names its line."""
    config = mc.ModelConfig()
    try:
        text_format.Parse(text, config)
    except text_format.ParseError as error:
        line = error.GetLine()
        where = f"line {line}" if line is not None else "text"
        message = str(error)
        message = re.sub(r"^\d+:\d+ : ", "", message)
        name = model or "?"
        raise TritonConfigError(
            f"model {name!r}: config.pbtxt {where}: cannot be parsed: {message[:1].lower()}{message[1:]}",
            model=model,
        ) from None
    return config


def check_config(text: str, *, model: str | None = None) -> ModelConfig:
    """Parse ``config.pbtxt`` and apply the checks Triton makes when it loads the model.

    Returns the parsed protobuf. Raises :class:`TritonConfigError` listing every problem, one per
    line, each naming the field, the value given and what is allowed.
    """
    config = parse_config(text, model=model)
    problems = _Problems(model or config.name or "?")
    backend = _check_backend(config, problems)
    _check_batching(config, problems)
    _check_io(config, problems)
    _check_instance_groups(config, problems)
    if backend == "onnxruntime":
        _check_onnxruntime(config, problems)
    elif backend == "pytorch":
        _check_no_accelerators(config, problems, "pytorch")
    elif backend == "tensorrt":
        _check_tensorrt(config, problems)
    problems.raise_if_any()
    return config


def check_repository_config(text: str, *, model: str | None = None) -> ModelConfig:
    """:func:`check_config` for any folder of a tarball: an ensemble or a python-backend member too.

    Model configs (``onnxruntime``/``pytorch``/``tensorrt``) get every check of :func:`check_config`; an
    ``ensemble`` (``platform: "ensemble"``) or a ``backend: "python"`` member gets the checks of
    Triton's core that apply to every model (batching, tensors, instance groups).
    """
    config = parse_config(text, model=model)
    if config.platform != "ensemble" and config.backend != "python":
        return check_config(text, model=model)
    problems = _Problems(model or config.name or "?")
    _check_batching(config, problems)
    _check_io(config, problems)
    _check_instance_groups(config, problems)
    problems.raise_if_any()
    return config


def config_backend(config: ModelConfig) -> str:
    """The backend of a checked config (``platform`` alone names it too)."""
    return config.backend or _PLATFORM_BACKEND[config.platform]


def default_filename(config: ModelConfig) -> str:
    """The file the backend opens inside the version directory."""
    return config.default_model_filename or BACKEND_DEFAULT_FILENAME[config_backend(config)]


def wire_datatype(data_type: int) -> str:
    """``TYPE_FP32`` -> ``FP32`` as used on the HTTP/gRPC protocol (``TYPE_STRING`` -> ``BYTES``)."""
    name = mc.DataType.Name(data_type)[len("TYPE_"):]
    return "BYTES" if name == "STRING" else name
