"""How much GPU memory a process holds only for being a CUDA process: the part of a served row that
is the python backend stub's, not the model's.

The served rows of ``make gpu-check`` (:mod:`benchmarks.gpu_served`) load each model into the local
endpoint's python-based stand-ins: every model instance is a ``triton_python_backend_stub`` process
with a CUDA context of its own, where the SageMaker image's C++ onnxruntime and pytorch backends run
inside the server's process and share its context. The capacity plan subtracts that context from a
served row (``model_build.capacity.footprint``), and takes it from here.

Each figure is one child process, started and stopped by this one, which never touches CUDA itself:
the device's used memory (``nvidia-smi``) while the child holds what it made, less before it started.

- ``cuda_context``: the driver's primary context and nothing else (``cuInit``, ``cuDevicePrimaryCtxRetain``);
- ``onnxruntime_cuda_session``: onnxruntime-gpu's CUDA provider on a 64x64 MatMul, run once (the context,
  cuBLAS and cuDNN handles, the arena's first chunk);
- ``torch_cuda``: PyTorch with one 64x64 matrix product (the context, its kernels, cuBLAS' workspace).

``python -m benchmarks.gpu_context [--out FILE]`` prints the JSON; a figure that cannot be measured
(no driver, no onnxruntime CUDA provider, no CUDA torch) is ``null`` with the reason, never 0.
"""

from __future__ import annotations

import argparse
import json
import select
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

SCHEMA = "triton-mme/gpu-context/1"
#: How long a child may take to make what it holds (importing torch, creating a session).
START_TIMEOUT_S = 180.0

_CHILDREN = {
    "cuda_context": """
import ctypes
cuda = ctypes.CDLL("libcuda.so.1")
context, device = ctypes.c_void_p(), ctypes.c_int()
for call, args in (("cuInit", (0,)), ("cuDeviceGet", (ctypes.byref(device), 0)),
                   ("cuDevicePrimaryCtxRetain", (ctypes.byref(context), device)),
                   ("cuCtxSetCurrent", (context,))):
    status = getattr(cuda, call)(*args)
    if status != 0:
        raise SystemExit(f"{call} returned CUDA error {status}")
""",
    "onnxruntime_cuda_session": """
import numpy as np, onnx, onnxruntime as ort
from onnx import TensorProto, helper
if hasattr(ort, "preload_dlls"):
    ort.preload_dlls()
graph = helper.make_graph([helper.make_node("MatMul", ["x", "x"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64, 64])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [64, 64])])
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
session = ort.InferenceSession(model.SerializeToString(), providers=["CUDAExecutionProvider"])
if session.get_providers()[0] != "CUDAExecutionProvider":
    raise SystemExit(f"no CUDA provider in this onnxruntime: {session.get_providers()}")
session.run(None, {"x": np.ones((64, 64), np.float32)})
""",
    "torch_cuda": """
import torch
if not torch.cuda.is_available():
    raise SystemExit(f"torch {torch.__version__} has no CUDA GPU")
square = torch.ones(64, 64, device="cuda")
(square @ square).sum().item()
""",
}
#: What each child holds, in words (the docs' sentence, ``benchmarks.gpu_table.context_sentence``).
FIGURES = {"cuda_context": "a bare CUDA context",
           "onnxruntime_cuda_session": "onnxruntime's CUDA provider on a 64x64 MatMul",
           "torch_cuda": "PyTorch with one matrix product"}
_HOLD = "\nimport sys\nprint('ready', flush=True)\nsys.stdin.readline()\n"


def used_mib() -> float | None:
    """The device's used memory in MiB (GPU 0), or None without a working ``nvidia-smi``."""
    try:
        done = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i", "0"],
                              capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    try:
        return float(done.stdout.strip().splitlines()[0]) if done.returncode == 0 else None
    except (ValueError, IndexError):
        return None


def measure(name: str, python: str) -> dict[str, Any]:
    """One child's held memory: ``{"mib": ..., "reason": ...}``."""
    before = used_mib()
    if before is None:
        return {"mib": None, "reason": "nvidia-smi cannot read the device's memory (no NVIDIA driver)"}
    child = subprocess.Popen([python, "-c", _CHILDREN[name] + _HOLD], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert child.stdin is not None and child.stdout is not None and child.stderr is not None
    try:
        ready, _, _ = select.select([child.stdout], [], [], START_TIMEOUT_S)
        if not ready:
            child.kill()
            child.wait()
            return {"mib": None, "reason": f"the child was not ready within {START_TIMEOUT_S:g} s"}
        if child.stdout.readline().strip() != "ready":
            child.wait(timeout=60)
            lines = child.stderr.read().strip().splitlines()
            return {"mib": None, "reason": lines[-1] if lines else f"the child exited {child.returncode}"}
        time.sleep(0.5)  # nvidia-smi's reading settles
        held = used_mib()
    finally:
        if child.poll() is None:
            child.stdin.write("\n")
            child.stdin.flush()
            try:
                child.wait(timeout=60)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
    if held is None:
        return {"mib": None, "reason": "nvidia-smi stopped answering"}
    return {"mib": round(held - before, 1), "reason": None, "before_mib": before}


def run(python: str = sys.executable) -> dict[str, Any]:
    figures = {name: measure(name, python) for name in _CHILDREN}
    return {"schema": SCHEMA, "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "python": python, "figures": figures}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu_context", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="write the JSON here too")
    parser.add_argument("--python", default=sys.executable, help="the Python the children run (default: this one)")
    args = parser.parse_args(argv)
    result = run(args.python)
    text = json.dumps(result, indent=2)
    if args.out:
        args.out.write_text(text + "\n", encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
