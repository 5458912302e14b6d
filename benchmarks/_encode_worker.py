"""``SentenceTransformer.encode`` timed in a process of its own, as a Python service runs it.

Why a separate process: what PyTorch's forward costs depends on the state of the process's
memory allocator. glibc's malloc serves a forward's large activation buffers with ``mmap`` and
hands them back after each call, so every call faults its pages in again. Once a process has
freed larger blocks (building a model does, and the text_ensemble benchmark builds its models in
its own process) glibc raises its thresholds and the same forward runs from the heap. Measured on
the Unigram row (8x50 tokens, 2 cores): 45 ms in a fresh process, 37-38 ms after a build in the
same process, and 37-38 ms in a fresh process started with ``MALLOC_MMAP_THRESHOLD_`` and
``MALLOC_TRIM_THRESHOLD_`` set (:data:`TUNED_ALLOCATOR`; either one alone did not do it). So the
baseline is measured on purpose, in clean processes, both ways: as installed, and with the
allocator tuned, rather than in whatever state the benchmark's own process happens to be in.

Protocol, one JSON object per line: the parent writes ``{"texts": [...], "batch": n,
"seconds": s, "min_calls": k, "model": i}`` to stdin and reads ``{"durations": [...]}`` (seconds
per call, timed here, so the pipe is not in them) or ``{"embeddings": [[...]]}`` for
``"seconds": 0``. A worker holds one model in a real run; a tiny run (the test suite's) starts
one worker for every folder (``"model"``: which one), the same code at a third of the start-up
cost (each worker imports torch and sentence-transformers, 4 to 5 s).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

#: glibc's tunables that keep a forward's buffers on the heap: the largest mmap threshold glibc
#: takes on 64-bit (32 MiB) and a trim threshold above it.
TUNED_ALLOCATOR = {"MALLOC_MMAP_THRESHOLD_": str(32 << 20), "MALLOC_TRIM_THRESHOLD_": str(128 << 20)}


class EncodeWorker:
    """A child process holding a ``SentenceTransformer`` per folder (one in a real run); ``time``
    runs ``encode`` there (``model``: the folder's index)."""

    def __init__(self, folder: Path | Sequence[Path], *, max_seq_length: int, threads: int | None,
                 tuned: bool) -> None:
        env = {key: value for key, value in os.environ.items() if key not in TUNED_ALLOCATOR}
        if tuned:
            env.update(TUNED_ALLOCATOR)
        folders = [folder] if isinstance(folder, Path) else list(folder)
        command = [sys.executable, "-m", "benchmarks._encode_worker", str(max_seq_length), str(threads or 0),
                   *map(str, folders)]
        self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, text=True,
                                        cwd=Path(__file__).resolve().parents[1])
        # Sent now, answered at the first call: workers started together load their models at once.
        self._send({"texts": ["warm up"], "batch": 1, "seconds": 0})
        self._unread = 1

    def _send(self, request: dict[str, Any]) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()

    def _read(self) -> str:
        assert self.process.stdout is not None
        return self.process.stdout.readline()

    def _ask(self, request: dict[str, Any]) -> dict[str, Any]:
        for _ in range(self._unread):
            if not self._read():
                break
        self._unread = 0
        self._send(request)
        line = self._read()
        if not line:
            raise RuntimeError(f"encode worker exited with status {self.process.wait()}")
        answer: dict[str, Any] = json.loads(line)
        return answer

    def time(self, texts: list[str], batch: int, seconds: float, min_calls: int, *, model: int = 0) -> list[float]:
        durations: list[float] = self._ask({"texts": texts, "batch": batch, "seconds": seconds,
                                            "min_calls": min_calls, "model": model})["durations"]
        return durations

    def encode(self, texts: list[str], batch: int, *, model: int = 0) -> list[list[float]]:
        embeddings: list[list[float]] = self._ask({"texts": texts, "batch": batch, "seconds": 0,
                                                   "model": model})["embeddings"]
        return embeddings

    def model(self, index: int) -> EncodeModel:
        """One of this worker's models, with ``time`` and ``encode`` of its own."""
        return EncodeModel(self, index)

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def __enter__(self) -> EncodeWorker:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.close()


class EncodeModel:
    """The model of index ``index`` in an :class:`EncodeWorker` (what a tiny run times per kind)."""

    def __init__(self, worker: EncodeWorker, index: int) -> None:
        self.worker, self.index = worker, index

    def time(self, texts: list[str], batch: int, seconds: float, min_calls: int) -> list[float]:
        return self.worker.time(texts, batch, seconds, min_calls, model=self.index)

    def encode(self, texts: list[str], batch: int) -> list[list[float]]:
        return self.worker.encode(texts, batch, model=self.index)


def main(argv: list[str]) -> int:
    max_len, threads, folders = int(argv[0]), int(argv[1]), argv[2:]
    import torch
    from sentence_transformers import SentenceTransformer

    from benchmarks._common import run_for

    if threads:
        torch.set_num_threads(threads)
    models = [SentenceTransformer(folder, device="cpu", local_files_only=True) for folder in folders]
    for model in models:
        model.max_seq_length = max_len
    for line in sys.stdin:
        request = json.loads(line)
        texts, batch = request["texts"], int(request["batch"])
        model = models[int(request.get("model", 0))]

        def encode(texts: list[str] = texts, batch: int = batch, model: Any = model) -> Any:
            return model.encode(texts, batch_size=batch, convert_to_numpy=True, show_progress_bar=False)

        if request["seconds"]:
            answer: dict[str, Any] = {"durations": run_for(encode, float(request["seconds"]),
                                                           min_calls=int(request.get("min_calls", 1)))}
        else:
            answer = {"embeddings": encode().tolist()}
        sys.stdout.write(json.dumps(answer) + "\n")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
