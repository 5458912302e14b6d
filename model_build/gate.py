"""The pre-publish gate, and opening a model as its Triton backend would.

Part of the build runtime (``model_build.build`` runs the gate on every tarball it writes), so it
is hashed into every model key; the client-side codec the smoke test uses lives in
``model_build.verify``, a tool, so editing it changes no key.

- ``check_repository``: the one pre-publish gate (layout, version folder, config, config against
  the graph, ensemble rules), each of its rules confirmed against the real server in
  ``tests/test_config_rules_on_triton.py``; its parts ``locate_model``, ``_version_dir``,
  ``check_ensemble_repository`` (layout) and ``check_signature`` / ``onnx_signature`` (the config
  against the graph, read with ``onnx.load``);
- ``open_model``: an ONNX Runtime session (or TorchScript module) with the settings a config asks
  for; the gate uses it for TorchScript, and the benchmarks time it directly.
"""

from __future__ import annotations

import re
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from model_build.errors import ModelBuildError, VerifyError
from model_build.triton_config import (
    ModelConfig,
    config_backend,
    wire_datatype,
)
from model_build.triton_config import mc as _mc

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
# Unpacking
# --------------------------------------------------------------------------------------------


def locate_model(root: Path, *, model: str | None = None) -> tuple[Path, str | None]:
    """The model directory inside an unpacked tarball, and its name (``None`` at the root).

    The container accepts ``config.pbtxt`` at the root or one top-level model directory; several
    directories are only meant for ensembles, which this build does not produce.
    """
    who = f"model {model!r}: " if model else ""
    if (root / "config.pbtxt").is_file():
        return root, None
    entries = sorted(root.iterdir())
    dirs = [p for p in entries if p.is_dir()]
    if len(dirs) == 1 and len(entries) == 1:
        if not (dirs[0] / "config.pbtxt").is_file():
            raise VerifyError(
                f"{who}tarball: {dirs[0].name + '/config.pbtxt'!r} is missing; every model "
                "directory needs a config.pbtxt",
                model=model,
            )
        return dirs[0], dirs[0].name
    names = [p.name + ("/" if p.is_dir() else "") for p in entries]
    raise VerifyError(
        f"{who}tarball: top level holds {names}; expected exactly one model directory or "
        "config.pbtxt at the root",
        model=model,
    )


def _version_dir(model_dir: Path, config: ModelConfig, model: str) -> tuple[int, Path]:
    """The version Triton serves under the config's version policy (default: the latest)."""
    versions = sorted(
        int(p.name) for p in model_dir.iterdir() if p.is_dir() and p.name.isdigit() and int(p.name) > 0
    )
    if not versions:
        raise VerifyError(
            f"model {model!r}: version directory: none found in the model directory; expected a "
            "numeric directory such as '1/'",
            model=model,
        )
    policy = config.version_policy
    chosen = versions[-1]
    if policy.HasField("specific"):
        wanted = [v for v in policy.specific.versions if v in versions]
        if not wanted:
            raise VerifyError(
                f"model {model!r}: version_policy.specific: got {list(policy.specific.versions)}; "
                f"the tarball holds versions {versions}",
                model=model,
            )
        chosen = max(wanted)
    return chosen, model_dir / str(chosen)


def check_ensemble_repository(root: Path, *, model: str | None = None) -> str:
    """The rules a tarball holding a whole repository (an ensemble and its members) must meet.

    SageMaker's front end loads the folder whose config says ``platform: "ensemble"``; Triton then
    loads each model its steps name, by folder, and a member's config ``name`` must be its folder's.
    Returns the ensemble's folder name.
    """
    from model_build.triton_config import parse_config

    who = f"model {model!r}: " if model else ""
    folders = sorted(p for p in root.iterdir() if p.is_dir())
    configs = {}
    for folder in folders:
        if not (folder / "config.pbtxt").is_file():
            raise VerifyError(f"{who}tarball: {folder.name + '/config.pbtxt'!r} is missing", model=model)
        configs[folder.name] = parse_config((folder / "config.pbtxt").read_text(), model=model)
    ensembles = [name for name, config in configs.items() if config.platform == "ensemble"]
    if len(ensembles) != 1:
        raise VerifyError(f"{who}tarball: {len(folders)} model folders and {len(ensembles)} ensembles "
                          f"{ensembles}; several folders need exactly one ensemble", model=model)
    for name, config in configs.items():
        if name not in ensembles and config.name and config.name != name:
            raise VerifyError(f"{who}member {name!r}: config name {config.name!r}; a member's config name "
                              "must be its folder's", model=model)
    for step in configs[ensembles[0]].ensemble_scheduling.step:
        if step.model_name not in configs:
            raise VerifyError(f"{who}ensemble step: model {step.model_name!r} is not in the tarball; its "
                              f"folders are {sorted(configs)}", model=model)
        _version_dir(root / step.model_name, configs[step.model_name], model or step.model_name)
    return ensembles[0]


def check_repository(path: Path, *, model: str) -> str:
    """The pre-publish gate: everything Triton checks when it loads a tarball, before it is published.

    ``path`` is a packaged ``model.tar.gz`` (unpacked safely into a temporary folder next to it) or
    an unpacked folder. The build runs it on every tarball it writes, single model or ensemble
    (``model_build.build.build_model`` through :func:`model_build.package.gate_tarball`);
    ``tests/test_config_rules_on_triton.py`` confirms each rule against the real ``tritonserver``.

    1. layout: ``config.pbtxt`` at the root or one model folder; several folders only as one
       ensemble and its members (:func:`check_ensemble_repository`);
    2. every folder's config parses and passes :func:`~model_build.triton_config.check_config`
       (ensembles and python members: Triton core's rules);
    3. a numeric version folder (the one the version policy serves) holding the model file;
    4. the config's inputs and outputs against the graph's (names, data types, dims), read with
       ``onnx.load`` (no weights, no ONNX Runtime session) or TorchScript's forward signature;
    5. an ensemble's steps map only tensors its members have, and produce every ensemble output.

    Returns the name of the folder the endpoint loads ("" for a config at the root). Raises a
    :class:`~model_build.errors.ModelBuildError` (``TritonConfigError`` or ``VerifyError``) naming
    the model, the field, the value and what is allowed.
    """
    path = Path(path)
    if path.is_file():
        import tempfile

        from model_build.tarball import safe_extract

        with tempfile.TemporaryDirectory(prefix=".gate-", dir=path.parent) as tmp:
            # The one reader of tarballs: the same limits and member checks as every other unpack.
            safe_extract(path, Path(tmp), model=model)
            return check_repository(Path(tmp), model=model)
    if not path.is_dir():
        raise VerifyError(f"model {model!r}: {str(path)!r} is neither a tarball nor a folder", model=model)
    folders = sorted(p for p in path.iterdir() if p.is_dir())
    try:
        if (path / "config.pbtxt").is_file() or len(folders) <= 1:
            model_dir, name = locate_model(path, model=model)
            _check_model_folder(model_dir, model, None)
            return name or ""
        main = check_ensemble_repository(path, model=model)
        configs = {folder.name: _check_model_folder(folder, model, folder.name) for folder in folders}
        _check_ensemble_wiring(main, configs, model)
        return main
    except ModelBuildError as error:
        error.model = model
        raise


def _check_model_folder(folder: Path, model: str, member: str | None) -> ModelConfig:
    """Steps 2-4 of :func:`check_repository` for one model folder."""
    from model_build.triton_config import check_repository_config, default_filename

    label = model if member is None else f"{model}/{member}"
    config = check_repository_config((folder / "config.pbtxt").read_text(encoding="utf-8", errors="replace"),
                                     model=label)
    _, version = _version_dir(folder, config, label)
    if config.platform == "ensemble":
        return config
    if config.backend == "python":
        if not (version / "model.py").is_file():
            raise VerifyError(f"model {label!r}: model file 'model.py': missing in version folder "
                              f"{version.name!r}; a python-backend model needs one", model=model)
        return config
    model_file = version / default_filename(config)
    if config_backend(config) == "onnxruntime":
        if model_file.is_dir():  # the backend reads <dir>/model.onnx for a directory
            model_file = model_file / "model.onnx"
        if not model_file.is_file():
            raise VerifyError(f"model {label!r}: model file {model_file.name!r}: missing in version folder "
                              f"{version.name!r}; allowed: the file default_model_filename names", model=model)
        from model_build.package import onnx_external_data_files

        for location in onnx_external_data_files(model_file):
            if not (model_file.parent / location).is_file():
                raise VerifyError(f"model {label!r}: external data file {location!r}: missing next to "
                                  f"{model_file.name!r}", model=model)
        inputs, outputs = onnx_signature(model_file, model=label)
        check_signature(config, label, "onnx graph", inputs, outputs)
    else:
        open_model(model_file, config, model=label)  # TorchScript: loads, maps inputs to forward's arguments
    return config


def _check_ensemble_wiring(main: str, configs: dict[str, ModelConfig], model: str) -> None:
    """Triton's ensemble rules: steps map member tensors; every ensemble input used, output produced."""
    ensemble = configs[main]
    available = {io.name for io in ensemble.input}
    produced: set[str] = set()
    for index, step in enumerate(ensemble.ensemble_scheduling.step):
        member = configs[step.model_name]
        where = f"model {model!r}: ensemble_scheduling.step[{index}]({step.model_name})"
        for field, mapping, tensors in (("input_map", step.input_map, member.input),
                                        ("output_map", step.output_map, member.output)):
            names = {io.name for io in tensors}
            for key in sorted(mapping):
                if key not in names:
                    raise VerifyError(f"{where}.{field}: key {key!r} is not a tensor of {step.model_name!r}; "
                                      "allowed: " + ", ".join(repr(n) for n in sorted(names)), model=model)
        for key in sorted(step.input_map):
            if step.input_map[key] not in available:
                raise VerifyError(f"{where}.input_map[{key!r}]: {step.input_map[key]!r} is neither an ensemble "
                                  "input nor an earlier step's output; allowed: "
                                  + ", ".join(repr(n) for n in sorted(available)), model=model)
        available |= set(step.output_map.values())
        produced |= set(step.output_map.values())
    for io in ensemble.output:
        if io.name not in produced:
            raise VerifyError(f"model {model!r}: ensemble output {io.name!r}: no step produces it; the steps "
                              "produce " + ", ".join(repr(n) for n in sorted(produced)), model=model)


# --------------------------------------------------------------------------------------------
# Running the model as the backend would
# --------------------------------------------------------------------------------------------


def _wants_gpu(config: ModelConfig) -> bool:
    kinds = {group.kind for group in config.instance_group}
    # No instance group: Triton uses the GPU when one is present.
    return not kinds or bool(kinds & {_mc.ModelInstanceGroup.KIND_GPU, _mc.ModelInstanceGroup.KIND_AUTO})


#: One graph tensor: name, wire data type (``FP32``...), shape (``-1`` or a name where variable).
GraphTensor = tuple[str, str, list[Any]]


def check_signature(config: ModelConfig, model: str, what: str, inputs: list[GraphTensor],
                    outputs: list[GraphTensor]) -> None:
    """Refuse a config whose tensors are not the graph's: name, data type, dims (batch axis aside).

    The onnxruntime backend makes the same checks when it loads the model (``ValidateInputs`` /
    ``ValidateOutputs`` of ``onnxruntime_backend``); each refusal names the model, the config field,
    its value and what the graph has.
    """
    for kind, graph_side, config_side in (("input", inputs, config.input), ("output", outputs, config.output)):
        graph = {name: wire for name, wire, _ in graph_side}
        shapes = {name: list(shape)[1 if config.max_batch_size > 0 else 0:] for name, _, shape in graph_side}
        for io in config_side:
            if io.name not in graph:
                raise VerifyError(
                    f"model {model!r}: config {kind} {io.name!r}: name not in the {what}; allowed: the "
                    f"graph's {kind}s " + ", ".join(repr(n) for n in sorted(graph)),
                    model=model,
                )
            if graph[io.name] != wire_datatype(io.data_type):
                raise VerifyError(
                    f"model {model!r}: config {kind} {io.name!r}: data_type "
                    f"{_mc.DataType.Name(io.data_type)}; the {what} has {graph[io.name]} "
                    f"(allowed: TYPE_{graph[io.name].replace('BYTES', 'STRING')})",
                    model=model,
                )
            dims = list(io.reshape.shape) if io.HasField("reshape") else list(io.dims)
            shape = shapes[io.name]
            if len(dims) != len(shape) or any(isinstance(g, int) and g >= 0 and d != -1 and g != d
                                              for g, d in zip(shape, dims, strict=True)):
                raise VerifyError(
                    f"model {model!r}: config {kind} {io.name!r}: dims {dims}; the {what} has "
                    f"{['-1' if not isinstance(g, int) or g < 0 else g for g in shape]} "
                    f"(batch axis {'removed' if config.max_batch_size > 0 else 'kept'}); allowed: those "
                    "dims, -1 where the graph's dimension is variable",
                    model=model,
                )
        if kind == "input" and len(graph) != len(config_side):
            missing = sorted(set(graph) - {io.name for io in config_side})
            raise VerifyError(
                f"model {model!r}: input: the {what} also needs {missing}; the config must list every "
                "graph input",
                model=model,
            )


def onnx_signature(path: Path, *, model: str) -> tuple[list[GraphTensor], list[GraphTensor]]:
    """Inputs and outputs of an ONNX file read with ``onnx.load`` (graph only, no weights, no session)."""
    import onnx  # lazy: a TorchScript model needs no onnx

    try:
        proto = onnx.load(str(path), load_external_data=False)
    except Exception as error:  # onnx raises DecodeError and others
        raise VerifyError(f"model {model!r}: model file {path.name!r}: not a readable onnx model: {error}",
                          model=model) from None
    initializers = {tensor.name for tensor in proto.graph.initializer}

    def tensors(values: Any) -> list[GraphTensor]:
        found: list[GraphTensor] = []
        for value in values:
            if value.name in initializers:  # IR < 4 lists initializers as inputs
                continue
            tensor_type = value.type.tensor_type
            wire = _ONNX_TO_WIRE.get(onnx.TensorProto.DataType.Name(tensor_type.elem_type), "?")
            shape = [dim.dim_value if dim.HasField("dim_value") else -1 for dim in tensor_type.shape.dim]
            found.append((value.name, wire, shape))
        return found

    return tensors(proto.graph.input), tensors(proto.graph.output)


_ONNX_TO_WIRE = {
    "FLOAT": "FP32", "FLOAT16": "FP16", "BFLOAT16": "BF16", "DOUBLE": "FP64", "INT8": "INT8", "INT16": "INT16",
    "INT32": "INT32", "INT64": "INT64", "UINT8": "UINT8", "UINT16": "UINT16", "UINT32": "UINT32",
    "UINT64": "UINT64", "BOOL": "BOOL", "STRING": "BYTES",
}


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
