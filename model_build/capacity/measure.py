"""A built model's footprint, measured on the build machine (called by the build, never at synth).

From the tarball the build wrote:

- the tarball's bytes, and the unpacked bytes (the sum of its members);
- the weight bytes at the served precision: the graph files the tarball holds (``model.onnx`` with
  its external data, ``model.pt``, ``model.plan``), the served graph itself;
- the unpack time: every member inflated once, on this machine's CPU;
- for an ONNX graph, an ONNX Runtime session on CPU: the time to create it (the build's load
  time), and the working memory of one run at the largest batch and sequence: the growth of the
  process's peak resident memory during that run (``/proc/self/clear_refs`` resets the peak first).
  It is taken as an estimate of the GPU's working memory: the same graph and shapes, another
  allocator. A largest batch above :data:`MEASURED_BATCH` is measured at that batch and scaled
  linearly, a sequence above :data:`MEASURED_SEQUENCE` quadratically, and the figure says so.

A TorchScript or TensorRT graph is not run here: its working memory and load time are unknown, and
its GPU estimate stays a lower bound. Nothing here fails a build: what cannot be measured is
recorded as unknown with the reason.
"""

from __future__ import annotations

import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

from triton_mme_cdk.model_build.capacity.footprint import (
    Coefficients,
    Figure,
    Footprint,
    footprint_from_parts,
    unknown,
)
from triton_mme_cdk.model_build.capacity.sizing import largest_shape, python_instances
from triton_mme_cdk.model_build.manifest import ModelSpec

#: The largest batch and sequence run at build; a larger ``max_batch_size`` is scaled linearly from
#: it, a longer ``max_sequence_length`` quadratically (attention's score matrices grow with its
#: square): a build must not run out of memory measuring what the GPU would.
MEASURED_BATCH = 32
MEASURED_SEQUENCE = 512
GRAPH_NAMES = ("model.onnx", "model.pt", "model.plan")
_PROC = Path("/proc/self")


def measure_footprint(spec: ModelSpec, tarball: Path, coefficients: Coefficients | None = None, *,
                      shm_default_byte_size: int | None = None) -> Footprint:
    """The footprint of ``spec``'s first target from its built ``tarball`` (see the module docstring).

    The tarball is read once: every member is inflated (the unpack time), and the graph's folder
    is kept in a scratch folder for the ONNX Runtime session."""
    with tempfile.TemporaryDirectory(prefix="footprint-") as scratch:
        # Only an ONNX graph is run here: nothing else is written (a plan tarball holds one file
        # per compute capability, gigabytes a Lambda's /tmp has no room to hold twice).
        members, seconds = _unpack_once(tarball, Path(scratch) if spec.format == "onnx" else None)
        unpacked = sum(member.size for member in members)
        graphs = _graph_members(members)
        weights = Figure(float(sum(member.size for member in graphs)),
                         "the served graph files in the tarball (" + ", ".join(m.name for m in graphs) + ")", False) \
            if graphs else unknown("no graph file found in the tarball")
        unpack = Figure(seconds, "measured at build: every member inflated once on the build's CPU", True)
        batch, sequence = largest_shape(spec)
        load, working = _onnx_session(Path(scratch), graphs, spec, batch, sequence)
    return footprint_from_parts(
        target=spec.target_names()[0], model=spec.name, stage="build", precision=spec.effective_precision,
        instance_kind=spec.instance_group.kind, instance_count=spec.instance_group.count,
        python_instances=python_instances(spec), weight_bytes=weights, working_bytes=working,
        tarball_bytes=Figure(float(tarball.stat().st_size), "the tarball's size", False),
        unpacked_bytes=Figure(float(unpacked), "the sum of the tarball's members", False),
        build_load_seconds=load, unpack_seconds=unpack, coefficients=coefficients,
        largest_batch=batch, largest_sequence=sequence,
        backend={"onnx": "onnxruntime", "torchscript": "pytorch", "tensorrt_plan": "tensorrt"}[spec.format],
        shm_default_byte_size=shm_default_byte_size)


def _unpack_once(tarball: Path, scratch: Path | None) -> tuple[list[tarfile.TarInfo], float]:
    """(the regular members, the seconds to inflate them all): one pass over ``tarball``. A member
    that may belong to a graph (not a ``.py`` file, not the tokenizer's: :func:`_graph_members`
    decides once every member is known) is also written under ``scratch`` at its path in the
    tarball, for the ONNX Runtime session (nothing without ``scratch``); the seconds count the
    inflation, not those writes. A name that is not a plain relative path is never written (the
    build wrote this tarball, and ``verify`` refuses such names; a measurement only skips them)."""
    members: list[tarfile.TarInfo] = []
    seconds = 0.0
    with tarfile.open(tarball, "r:gz") as archive:
        while True:
            started = time.perf_counter()
            member = archive.next()
            handle = archive.extractfile(member) if member is not None and member.isfile() else None
            seconds += time.perf_counter() - started
            if member is None:
                return members, seconds
            if handle is None:
                continue
            members.append(member)
            parts = Path(member.name).parts
            out = None
            if scratch is not None and _may_be_graph(member.name) and parts and not Path(member.name).is_absolute() \
                    and ".." not in parts:
                (scratch / member.name).parent.mkdir(parents=True, exist_ok=True)
                out = (scratch / member.name).open("wb")
            try:
                while True:
                    started = time.perf_counter()
                    chunk = handle.read(1 << 20)
                    seconds += time.perf_counter() - started
                    if not chunk:
                        break
                    if out is not None:
                        out.write(chunk)
            finally:
                if out is not None:
                    out.close()


def _may_be_graph(name: str) -> bool:
    return not name.endswith(".py") and "/tokenizer/" not in f"/{name}"


def _graph_members(members: list[tarfile.TarInfo]) -> list[tarfile.TarInfo]:
    """The served graph and its external data: the version folder holding a graph file (not the
    tokenizer's python step)."""
    folders = {member.name.rsplit("/", 1)[0] for member in members if member.name.rsplit("/", 1)[-1] in GRAPH_NAMES}
    return [member for member in members if member.name.rsplit("/", 1)[0] in folders and _may_be_graph(member.name)]


def _onnx_session(scratch: Path, graphs: list[tarfile.TarInfo], spec: ModelSpec, batch: int,
                  sequence: int) -> tuple[Figure, Figure]:
    """(session creation seconds, working memory) of the ONNX graph on CPU (its folder unpacked
    under ``scratch``), or unknowns saying why."""
    if spec.format != "onnx":
        why = f"not measured: a {spec.format} graph is not run at build"
        return unknown(why), unknown(why)
    onnx = [member for member in graphs if member.name.endswith(".onnx")]
    if len(onnx) != 1:
        why = f"not measured: {len(onnx)} ONNX graphs in the tarball"
        return unknown(why), unknown(why)
    graph = scratch / onnx[0].name
    if not graph.is_file():
        why = f"not measured: the graph's name {onnx[0].name!r} is not a plain relative path"
        return unknown(why), unknown(why)
    try:
        import numpy as np
        import onnxruntime as ort
    except ImportError as error:  # the build always has them; a bare install may not
        why = f"not measured: {error}"
        return unknown(why), unknown(why)
    options = ort.SessionOptions()
    options.log_severity_level = 3
    started = time.perf_counter()
    try:
        session = ort.InferenceSession(str(graph), options,
                                       providers=["CPUExecutionProvider"])
    except Exception as error:  # a measurement never fails the build
        why = f"not measured: ONNX Runtime could not load the graph ({type(error).__name__})"
        return unknown(why), unknown(why)
    load = Figure(time.perf_counter() - started, "measured at build: an ONNX Runtime session created on the "
                                                 "build's CPU", False)
    run_batch, run_sequence = min(batch, MEASURED_BATCH), min(sequence, MEASURED_SEQUENCE)
    before = _reset_peak()
    if before is None:
        return load, unknown("not measured: /proc/self/clear_refs is not available here")
    try:
        feeds = {item.name: _input(np, item, run_batch, run_sequence) for item in session.get_inputs()}
        session.run(None, feeds)
    except Exception as error:  # a measurement never fails the build
        return load, unknown(f"not measured: one run at batch {run_batch} failed ({type(error).__name__}: "
                             f"{str(error)[:200]})")
    peak = _peak()
    del session
    if peak is None:
        return load, unknown("not measured: /proc/self/status gave no peak")
    grown = max(0.0, float(peak - before))
    factor = (batch / run_batch) * ((sequence / run_sequence) ** 2 if run_sequence else 1.0)
    scaled = "".join((f", scaled linearly from batch {run_batch} to {batch}" if run_batch < batch else "",
                      f", quadratically from sequence {run_sequence} to {sequence}" if run_sequence < sequence else ""))
    working = Figure(grown * factor,
                     f"measured at build: peak resident memory growth of one ONNX Runtime CPU run at batch "
                     f"{run_batch}" + (f", sequence {run_sequence}" if run_sequence else "") + f"{scaled}; taken as "
                     "an estimate of the GPU's working memory", True)
    return load, working


def _input(np: Any, item: Any, batch: int, sequence: int) -> Any:
    """An input of ``item``'s type at the largest shape: ones for integer ids and masks (a valid
    token id everywhere), zeros for floats; the first variable dimension is the batch, the others
    the sequence."""
    dtype = {"tensor(int64)": np.int64, "tensor(int32)": np.int32, "tensor(float)": np.float32,
             "tensor(float16)": np.float16, "tensor(bool)": np.bool_}.get(item.type)
    if dtype is None:
        raise ValueError(f"input {item.name} has type {item.type}")
    shape = []
    for index, dim in enumerate(item.shape):
        if isinstance(dim, int) and dim > 0:
            shape.append(dim)
        elif index == 0:
            shape.append(batch)
        else:
            shape.append(max(1, sequence))
    return np.ones(shape, dtype=dtype) if dtype != np.float32 and dtype != np.float16 else np.zeros(shape, dtype=dtype)


def _reset_peak() -> int | None:
    """Reset the process's peak resident memory to its current one; the current one, in bytes."""
    try:
        (_PROC / "clear_refs").write_text("5")
    except OSError:
        return None
    return _status("VmRSS")


def _peak() -> int | None:
    return _status("VmHWM")


def _status(key: str) -> int | None:
    try:
        for line in (_PROC / "status").read_text().splitlines():
            if line.startswith(f"{key}:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None
