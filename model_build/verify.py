"""Load a packaged ``model.tar.gz`` the way the SageMaker Triton container does and answer one request.

This is the last check before an artifact is published: it reads only the tarball (not the build's
in-memory objects), so what passes here is what the endpoint will get. The steps mirror the
container and Triton:

1. unpack safely (no absolute paths, no ``..``, no links), find the one top-level model directory
   (or ``config.pbtxt`` at the root), read and check ``config.pbtxt``;
2. pick the version directory and the backend's default file name, and open the model with the
   settings the config asks for (ONNX Runtime session options from ``parameters`` and the graph
   level; TorchScript through ``torch.jit.load``);
3. build the HTTP request body with tritonclient's own request types, decode it as the server
   does and check it against the config, run the model, encode the response as Triton does and
   read it back with tritonclient's ``InferResult``;
4. compare every output with the reference recorded at build time.

The request/response codec functions are public so a smoke-test client for real endpoints can
reuse them (the SageMaker binary content type is
``application/vnd.sagemaker-triton.binary+json;json-header-size=<n>``).
"""

from __future__ import annotations

import json
import re
import tarfile
import tempfile
import time
import warnings
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np
import tritonclient.http as httpclient
from tritonclient.utils import (
    InferenceServerException,
    deserialize_bytes_tensor,
    np_to_triton_dtype,
    serialize_byte_tensor,
    triton_to_np_dtype,
)

from model_build.compare import compare_arrays
from model_build.errors import TritonConfigError, VerifyError
from model_build.manifest import Tolerance
from model_build.triton_config import (
    ModelConfig,
    check_config,
    config_backend,
    default_filename,
    wire_datatype,
)
from model_build.triton_config import mc as _mc

#: ``Content-Type`` of a binary request to the SageMaker Triton container.
SAGEMAKER_BINARY_CONTENT_TYPE = "application/vnd.sagemaker-triton.binary+json;json-header-size={}"

_BACKEND_FORMAT = {"onnxruntime": "onnx", "pytorch": "torchscript"}
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


@dataclass
class VerifyResult:
    """What verification found for one tarball."""

    target: str
    format: str
    max_abs_diff: dict[str, float] = field(default_factory=dict)
    ok: bool = False
    seconds: float = 0.0
    version: int = 1
    #: ONNX Runtime providers the session used (empty for TorchScript), to show CPU vs GPU.
    providers: tuple[str, ...] = ()

    @property
    def worst(self) -> float:
        return max(self.max_abs_diff.values(), default=0.0)


# --------------------------------------------------------------------------------------------
# Unpacking
# --------------------------------------------------------------------------------------------


def safe_extract(tarball: Path, dest: Path, *, model: str | None = None) -> None:
    """Unpack ``tarball`` into ``dest``, refusing anything that could escape or alias files.

    Every member is checked before anything is written (so a refused archive leaves nothing
    behind), then ``tarfile``'s ``data`` filter does the extraction as a second line of defence.
    """
    who = f"model {model!r}: " if model else ""
    try:
        with tarfile.open(tarball, mode="r:*") as tar:
            members = tar.getmembers()
            for member in members:
                name = member.name
                path = PurePosixPath(name.replace("\\", "/"))
                if path.is_absolute() or re.match(r"^[A-Za-z]:", name) or ".." in path.parts:
                    raise VerifyError(
                        f"{who}tarball member {name!r}: path is absolute or contains '..'; "
                        "allowed: relative paths inside the archive",
                        model=model,
                    )
                if member.issym() or member.islnk():
                    kind = "symlink" if member.issym() else "hard link"
                    raise VerifyError(
                        f"{who}tarball member {name!r}: is a {kind} to {member.linkname!r}; "
                        "allowed: regular files and directories only",
                        model=model,
                    )
                if not (member.isreg() or member.isdir()):
                    raise VerifyError(
                        f"{who}tarball member {name!r}: is a device, fifo or other special file; "
                        "allowed: regular files and directories only",
                        model=model,
                    )
            tar.extractall(dest, members=members, filter="data")
    except VerifyError:
        raise
    except (OSError, tarfile.TarError, EOFError) as error:
        raise VerifyError(f"{who}tarball {str(tarball)!r}: cannot be unpacked: {error}", model=model) from None


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


# --------------------------------------------------------------------------------------------
# Request and response codec (tritonclient on the client side, Triton's format on the server)
# --------------------------------------------------------------------------------------------


def _np_dtype(datatype: str) -> Any:
    dtype = triton_to_np_dtype(datatype)
    if dtype is None:
        raise VerifyError(f"datatype: got {datatype!r}; not a triton data type")
    return dtype


def build_request(
    config: ModelConfig, inputs: Mapping[str, np.ndarray], *, outputs: list[str] | None = None
) -> tuple[bytes, int]:
    """The HTTP request body a tritonclient user sends, and its JSON header length.

    Each config input is sent as binary data with the config's data type and the array's shape;
    every config output (or ``outputs``) is requested as binary data.
    """
    model = config.name or "?"
    infer_inputs = []
    for io in config.input:
        if io.name not in inputs:
            raise VerifyError(
                f"model {model!r}: input {io.name!r}: no data given; the config expects inputs "
                + ", ".join(repr(i.name) for i in config.input),
                model=model,
            )
        array = np.asarray(inputs[io.name])
        datatype = wire_datatype(io.data_type)
        if datatype != "BYTES" and np_to_triton_dtype(array.dtype) != datatype:
            raise VerifyError(
                f"model {model!r}: input {io.name!r}: data has dtype {array.dtype.name!r} "
                f"({np_to_triton_dtype(array.dtype)}); the config expects {datatype}",
                model=model,
            )
        infer_input = httpclient.InferInput(io.name, list(array.shape), datatype)
        try:
            infer_input.set_data_from_numpy(array, binary_data=True)
        except InferenceServerException as error:
            raise VerifyError(f"model {model!r}: input {io.name!r}: {error}", model=model) from None
        infer_inputs.append(infer_input)
    names = outputs if outputs is not None else [o.name for o in config.output]
    requested = [httpclient.InferRequestedOutput(name, binary_data=True) for name in names]
    body, header_length = httpclient.InferenceServerClient.generate_request_body(
        infer_inputs, outputs=requested
    )
    if header_length is None:  # no binary section at all (a model without inputs)
        header_length = len(body)
    return bytes(body), int(header_length)


def parse_request_header(body: bytes, header_length: int) -> dict[str, Any]:
    """The JSON header of a request body (names, datatypes, shapes, requested outputs)."""
    if not 0 < header_length <= len(body):
        raise VerifyError(
            f"request: json-header-size {header_length} does not fit a body of {len(body)} bytes"
        )
    try:
        header = json.loads(body[:header_length].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise VerifyError(f"request: json header cannot be parsed: {error}") from None
    if not isinstance(header, dict) or not isinstance(header.get("inputs"), list):
        raise VerifyError("request: json header has no 'inputs' list")
    return header


def decode_request(body: bytes, header_length: int) -> dict[str, np.ndarray]:
    """Decode a request body into arrays as Triton's HTTP server does.

    tritonclient ships no request decoder (only ``InferResult`` for responses), so this follows
    the binary tensor extension: the JSON header, then each input's raw bytes in header order,
    ``binary_data_size`` bytes each; BYTES tensors use tritonclient's own length-prefixed
    deserializer. Leftover or missing bytes are an error, as in the server.
    """
    header = parse_request_header(body, header_length)
    arrays: dict[str, np.ndarray] = {}
    offset = header_length
    for entry in header["inputs"]:
        name = entry.get("name")
        datatype = entry.get("datatype")
        shape = entry.get("shape")
        if not isinstance(name, str) or not isinstance(datatype, str) or not isinstance(shape, list):
            raise VerifyError(f"request: input entry {entry!r} needs name, datatype and shape")
        if name in arrays:
            raise VerifyError(f"request: input {name!r}: given twice")
        dtype = _np_dtype(datatype)
        size = (entry.get("parameters") or {}).get("binary_data_size")
        array: np.ndarray
        if size is None:
            if "data" not in entry:
                raise VerifyError(f"request: input {name!r}: has neither binary_data_size nor data")
            array = np.array(entry["data"], dtype=dtype).reshape(shape)
        else:
            if not isinstance(size, int) or size < 0 or offset + size > len(body):
                raise VerifyError(
                    f"request: input {name!r}: binary_data_size {size} runs past the end of the "
                    f"body ({len(body) - offset} bytes left)"
                )
            raw = body[offset : offset + size]
            offset += size
            if datatype == "BYTES":
                array = deserialize_bytes_tensor(raw) if size else np.empty(0, dtype=np.object_)
            else:
                itemsize = np.dtype(dtype).itemsize
                count = int(np.prod(shape)) if shape else 1
                if size != count * itemsize:
                    raise VerifyError(
                        f"request: input {name!r}: binary_data_size {size} does not match shape "
                        f"{shape} of {datatype} ({count * itemsize} bytes)"
                    )
                array = np.frombuffer(raw, dtype=np.dtype(dtype).newbyteorder("<")).astype(dtype)
            array = array.reshape(shape)
        arrays[name] = array
    if offset != len(body):
        raise VerifyError(
            f"request: {len(body) - offset} bytes after the last input are not claimed by any "
            "binary_data_size"
        )
    return arrays


def encode_response(
    outputs: Mapping[str, np.ndarray], *, model_name: str = "", model_version: str = "1"
) -> tuple[bytes, int]:
    """A response body as Triton writes it for binary outputs, and its JSON header length.

    The header lists each output with ``binary_data_size``; the raw little-endian bytes follow in
    the same order (the length goes in the ``Inference-Header-Content-Length`` header).
    """
    entries = []
    blobs = []
    for name, value in outputs.items():
        array = np.asarray(value)
        if array.dtype == np.object_ or array.dtype.kind in "SU":
            datatype = "BYTES"
            serialized = serialize_byte_tensor(array)
            blob = serialized.item() if serialized.size > 0 else b""
        else:
            datatype = np_to_triton_dtype(array.dtype)
            if datatype is None:
                raise VerifyError(f"response: output {name!r}: dtype {array.dtype.name!r} has no triton type")
            blob = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<")).tobytes()
        entries.append(
            {
                "name": name,
                "datatype": datatype,
                "shape": [int(d) for d in array.shape],
                "parameters": {"binary_data_size": len(blob)},
            }
        )
        blobs.append(blob)
    header = json.dumps(
        {"model_name": model_name, "model_version": model_version, "outputs": entries},
        separators=(",", ":"),
    ).encode("utf-8")
    return header + b"".join(blobs), len(header)


def parse_response(body: bytes, header_length: int | None) -> httpclient.InferResult:
    """Read a response body with tritonclient's own parser (what a client application uses)."""
    return httpclient.InferResult.from_response_body(body, header_length=header_length)


def _shape_matches(shape: list[int], expected: list[int]) -> bool:
    return len(shape) == len(expected) and all(e == -1 or s == e for s, e in zip(shape, expected, strict=True))


def check_request(
    config: ModelConfig,
    arrays: Mapping[str, np.ndarray],
    *,
    requested_outputs: list[str] | None = None,
    model: str | None = None,
) -> None:
    """Check decoded request tensors against the config as Triton does before running a model.

    Names must be exactly the config's inputs, data types must match, and the shape must be the
    batch (at most ``max_batch_size``) followed by the config ``dims`` (``-1`` matches any size).
    """
    model = model or config.name or "?"
    expected = {io.name: io for io in config.input}
    unknown = sorted(set(arrays) - set(expected))
    if unknown:
        raise VerifyError(
            f"model {model!r}: request input {unknown[0]!r}: not in the config; allowed inputs: "
            + ", ".join(sorted(expected)),
            model=model,
        )
    mbs = config.max_batch_size
    for name, io in expected.items():
        if name not in arrays:
            raise VerifyError(f"model {model!r}: request input {name!r}: missing", model=model)
        array = arrays[name]
        want = wire_datatype(io.data_type)
        got = "BYTES" if array.dtype == np.object_ else np_to_triton_dtype(array.dtype)
        if got != want:
            raise VerifyError(
                f"model {model!r}: request input {name!r}: datatype {got}; the config expects {want}",
                model=model,
            )
        shape = list(array.shape)
        dims = list(io.dims)
        if mbs >= 1:
            if not shape or not 1 <= shape[0] <= mbs:
                raise VerifyError(
                    f"model {model!r}: request input {name!r}: shape {shape}; the batch dimension "
                    f"must be 1 to max_batch_size ({mbs})",
                    model=model,
                )
            shape = shape[1:]
        if not _shape_matches(shape, dims):
            raise VerifyError(
                f"model {model!r}: request input {name!r}: shape {list(array.shape)}; the config "
                f"expects {'[batch] + ' if mbs >= 1 else ''}{dims}",
                model=model,
            )
    if requested_outputs is not None:
        outputs = {o.name for o in config.output}
        for name in requested_outputs:
            if name not in outputs:
                raise VerifyError(
                    f"model {model!r}: requested output {name!r}: not in the config; allowed: "
                    + ", ".join(sorted(outputs)),
                    model=model,
                )


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
        """The backend refuses a config whose tensors the graph does not have (name and type)."""
        for kind, graph_side, config_side in (
            ("input", self.session.get_inputs(), config.input),
            ("output", self.session.get_outputs(), config.output),
        ):
            graph = {t.name: _ORT_TO_WIRE.get(t.type, t.type) for t in graph_side}
            for io in config_side:
                if io.name not in graph:
                    raise VerifyError(
                        f"model {model!r}: config {kind} {io.name!r}: not in the onnx graph; the "
                        f"graph's {kind}s are " + ", ".join(sorted(graph)),
                        model=model,
                    )
                if graph[io.name] != wire_datatype(io.data_type):
                    raise VerifyError(
                        f"model {model!r}: config {kind} {io.name!r}: data_type "
                        f"{_mc.DataType.Name(io.data_type)}; the onnx graph has {graph[io.name]}",
                        model=model,
                    )
            if kind == "input" and len(graph) != len(config_side):
                missing = sorted(set(graph) - {io.name for io in config_side})
                raise VerifyError(
                    f"model {model!r}: input: the onnx graph also needs {missing}; the config "
                    "must list every graph input",
                    model=model,
                )

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


# --------------------------------------------------------------------------------------------
# Shapes between client view (config dims) and model view (reshape)
# --------------------------------------------------------------------------------------------


def _view(array: np.ndarray, io: Any, mbs: int, *, to_model: bool) -> np.ndarray:
    """Apply the config's ``reshape``: client shape is dims, the model sees reshape.shape."""
    if not io.HasField("reshape"):
        return array
    target = list(io.reshape.shape) if to_model else list(io.dims)
    if mbs >= 1:
        target = [array.shape[0], *target]
    return array.reshape(target)


def _compare(
    name: str, got: np.ndarray, ref: np.ndarray, tolerance: Tolerance, model: str
) -> float:
    result = compare_arrays(name, got, ref, atol=tolerance.atol, rtol=tolerance.rtol)
    if not result.ok:
        raise VerifyError(f"model {model!r}: {result.problem}", model=model)
    return result.max_abs_diff


def _load_reference(path: Path, model: str) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {key: data[key] for key in data.files}
    except (OSError, ValueError, zipfile.BadZipFile) as error:
        raise VerifyError(f"model {model!r}: reference {str(path)!r}: cannot be read: {error}", model=model) from None
    inputs = {k[len("input:"):]: v for k, v in arrays.items() if k.startswith("input:")}
    outputs = {k[len("output:"):]: v for k, v in arrays.items() if k.startswith("output:")}
    return inputs, outputs


# --------------------------------------------------------------------------------------------
# The whole check
# --------------------------------------------------------------------------------------------


def verify_artifact(
    tarball: Path,
    reference_npz: Path,
    *,
    tolerance: Tolerance,
    target_model: str | None = None,
) -> VerifyResult:
    """Unpack, load and query ``tarball`` once, and compare the answer with ``reference_npz``.

    Raises :class:`VerifyError` naming the model and what is wrong (the output and its largest
    difference for a numerical mismatch); returns the measured differences when all is well.
    """
    started = time.perf_counter()
    tarball = Path(tarball)
    label = target_model or tarball.name
    with tempfile.TemporaryDirectory(prefix="verify-") as tmp:
        root = Path(tmp)
        safe_extract(tarball, root, model=label)
        model_dir, dir_name = locate_model(root, model=label)
        config_text = (model_dir / "config.pbtxt").read_text(encoding="utf-8")
        try:
            config = check_config(config_text, model=target_model or dir_name)
        except TritonConfigError as error:
            raise VerifyError(str(error), model=target_model or dir_name) from None
        target = target_model or dir_name or config.name or tarball.name
        backend = config_backend(config)
        version, version_dir = _version_dir(model_dir, config, target)
        model_path = version_dir / default_filename(config)
        runner = open_model(model_path, config, model=target)

        ref_inputs, ref_outputs = _load_reference(Path(reference_npz), target)
        mbs = config.max_batch_size
        client_inputs: dict[str, np.ndarray] = {}
        for io in config.input:
            if io.name not in ref_inputs:
                raise VerifyError(
                    f"model {target!r}: reference: no 'input:{io.name}' array; it holds "
                    + ", ".join(sorted(ref_inputs)),
                    model=target,
                )
            client_inputs[io.name] = _view(ref_inputs[io.name], io, mbs, to_model=False)
        output_names = [o.name for o in config.output]

        body, header_length = build_request(config, client_inputs)
        header = parse_request_header(body, header_length)
        decoded = decode_request(body, header_length)
        for name, array in client_inputs.items():
            if not np.array_equal(decoded[name], array):
                raise VerifyError(
                    f"model {target!r}: request input {name!r}: decoded body differs from the data sent",
                    model=target,
                )
        requested = [o["name"] for o in header.get("outputs", [])]
        check_request(config, decoded, requested_outputs=requested, model=target)

        feeds = {io.name: _view(decoded[io.name], io, mbs, to_model=True) for io in config.input}
        try:
            produced = runner.run(feeds, output_names)
        except VerifyError:
            raise
        except Exception as error:  # the runtime's own error types
            raise VerifyError(f"model {target!r}: inference failed: {error}", model=target) from None

        response_outputs: dict[str, np.ndarray] = {}
        for io in config.output:
            array = _view(produced[io.name], io, mbs, to_model=False)
            want = wire_datatype(io.data_type)
            got = "BYTES" if array.dtype == np.object_ else np_to_triton_dtype(array.dtype)
            if got != want:
                raise VerifyError(
                    f"model {target!r}: output {io.name!r}: the model returned {got}; the config "
                    f"declares {_mc.DataType.Name(io.data_type)}",
                    model=target,
                )
            expected = [-1, *io.dims] if mbs >= 1 else list(io.dims)
            if not _shape_matches(list(array.shape), expected):
                raise VerifyError(
                    f"model {target!r}: output {io.name!r}: the model returned shape "
                    f"{list(array.shape)}; the config declares {expected}",
                    model=target,
                )
            response_outputs[io.name] = array

        response, response_header = encode_response(
            response_outputs, model_name=target, model_version=str(version)
        )
        result = parse_response(response, response_header)

        diffs: dict[str, float] = {}
        for io in config.output:
            got = result.as_numpy(io.name)
            if got is None:
                raise VerifyError(f"model {target!r}: output {io.name!r}: missing in the response", model=target)
            if io.name not in ref_outputs:
                raise VerifyError(
                    f"model {target!r}: reference: no 'output:{io.name}' array; it holds "
                    + ", ".join(sorted(ref_outputs)),
                    model=target,
                )
            ref = ref_outputs[io.name]
            if io.HasField("reshape") and got.shape != ref.shape and got.size == ref.size:
                got = got.reshape(ref.shape)  # the reference was recorded in the model's shape
            diffs[io.name] = _compare(io.name, got, ref, tolerance, target)

    return VerifyResult(
        target=target,
        format=_BACKEND_FORMAT[backend],
        max_abs_diff=diffs,
        ok=True,
        seconds=time.perf_counter() - started,
        version=version,
        providers=runner.providers,
    )
