"""Keep a build's peak memory near the model's size (issue 36).

A build holds the model several times over if nothing is done about it: the eager module, the
exporter's proto, ONNX protos passed from step to step, ONNX Runtime sessions. Two helpers:

- :func:`release_memory`: collect garbage and hand freed heap pages back to the system. The
  protobuf and ONNX Runtime buffers of a model are large allocations; glibc keeps freed ones on
  its heap (its mmap threshold rises after the first large free), so without ``malloc_trim`` the
  process's resident size stays at its high-water mark and the next step's peak adds to it.
- :class:`RecordedRunner`: the eager reference's outputs, computed once for every batch a build
  compares on, so the eager module can be freed before ONNX Runtime loads the exported graph.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
from collections.abc import Callable, Iterable

import numpy as np

Batch = dict[str, np.ndarray]
Runner = Callable[[Batch], list[np.ndarray]]

_LIBC: ctypes.CDLL | None = None


def _libc() -> ctypes.CDLL | None:
    global _LIBC
    if _LIBC is None:
        name = ctypes.util.find_library("c")
        try:
            _LIBC = ctypes.CDLL(name) if name else None
        except OSError:
            _LIBC = None
    return _LIBC


#: Models with fewer bytes of weights than this skip :func:`release_memory`'s collection.
COLLECT_FROM_BYTES = 64 * 2**20


def release_memory(weight_bytes: int) -> None:
    """For a model of ``weight_bytes``: ``gc.collect()``, then glibc's ``malloc_trim(0)`` where
    there is one (a no-op elsewhere); nothing for a model below :data:`COLLECT_FROM_BYTES`.

    Why a threshold: a full collection walks every Python object of the process, 0.1 to 0.2 s
    once torch, transformers and ONNX Runtime are imported. A build calls this after each step,
    so a tiny model's build spent more time collecting than exporting (14 calls, 2.7 s of a 24 s
    build of the default manifest). What a step leaves for the collector is at most a few copies
    of the model's weights; below 64 MiB that is small beside the ~1 GB the libraries themselves
    hold, and reference counting frees everything that is not in a cycle anyway."""
    if weight_bytes < COLLECT_FROM_BYTES:
        return
    gc.collect()
    libc = _libc()
    trim = getattr(libc, "malloc_trim", None) if libc is not None else None
    if trim is not None:
        trim(0)


def module_bytes(module: object) -> int:
    """Bytes of a PyTorch module's parameters and buffers (what :func:`release_memory` is given)."""
    tensors = [*module.parameters(), *module.buffers()]  # type: ignore[attr-defined]
    return sum(int(t.numel()) * int(t.element_size()) for t in tensors)


def _key(batch: Batch) -> tuple[object, ...]:
    return tuple((name, value.dtype.str, value.shape, value.tobytes()) for name, value in sorted(batch.items()))


class RecordedRunner:
    """A reference runner that answers from outputs recorded earlier with the real one.

    :meth:`record` runs the real runner on each batch and keeps its outputs (copies); calling the
    instance on a recorded batch returns them, on any other batch it runs the real runner, which
    fails once it is dropped (:meth:`drop`): a batch nobody recorded is a bug of the caller, not a
    reason to keep the model in memory.
    """

    def __init__(self, runner: Runner) -> None:
        self._runner: Runner | None = runner
        self._outputs: dict[tuple[object, ...], list[np.ndarray]] = {}

    def record(self, batches: Iterable[Batch]) -> None:
        for batch in batches:
            key = _key(batch)
            if key not in self._outputs:
                assert self._runner is not None, "record after drop"
                self._outputs[key] = [np.array(a, copy=True) for a in self._runner(batch)]

    def drop(self) -> None:
        """Forget the real runner (and the module it holds)."""
        self._runner = None

    def __call__(self, batch: Batch) -> list[np.ndarray]:
        found = self._outputs.get(_key(batch))
        if found is not None:
            return [np.array(a, copy=True) for a in found]
        if self._runner is None:
            raise RuntimeError("reference runner: batch not recorded before the module was freed")
        return self._runner(batch)
