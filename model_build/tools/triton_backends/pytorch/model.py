"""Triton's ``pytorch`` (libtorch) backend, played by the python backend on CPU for the local endpoint.

Like ``pytorch_backend/src/libtorch.cc`` it loads ``<version>/model.pt`` with ``torch.jit.load``,
feeds the inputs positionally in the order of their ``<name>__<index>`` suffix, reads the outputs
by the same suffix, runs under ``torch.inference_mode`` (``INFERENCE_MODE`` parameter, default on
in 24.10) and takes the thread counts from ``INTRA_OP_THREAD_COUNT`` / ``INTER_OP_THREAD_COUNT``.
"""

from __future__ import annotations

import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import local_backend_common as common
import torch
import triton_python_backend_utils as pb_utils

_INDEXED = re.compile(r"^.+__(\d+)$")


def _order(names: list[str], kind: str) -> list[str]:
    indices = []
    for name in names:
        match = _INDEXED.match(name)
        if match is None:
            raise common.ConfigError(
                f"{kind} names must follow the <name>__<index> convention for this backend; got {names}"
            )
        indices.append(int(match.group(1)))
    return [name for _, name in sorted(zip(indices, names, strict=True))]


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        self.config = common.load_args(args)
        params = common.parameters(self.config)
        self.inference_mode = common.parse_bool("INFERENCE_MODE", params.get("INFERENCE_MODE", "true"))
        for key, setter in (("INTRA_OP_THREAD_COUNT", torch.set_num_threads),):
            if key in params and common.parse_int(key, params[key]) > 0:
                setter(common.parse_int(key, params[key]))
        self.module = torch.jit.load(common.model_path(args, self.config, "model.pt"), map_location="cpu")
        self.module.eval()
        self.inputs = _order([t["name"] for t in self.config.get("input", [])], "input")
        self.outputs = _order([t["name"] for t in self.config.get("output", [])], "output")
        self.batched = int(self.config.get("max_batch_size", 0)) > 0

    def execute(self, requests: list) -> list:
        def run(feeds: dict) -> list:
            context = torch.inference_mode() if self.inference_mode else torch.no_grad()
            with context:
                result = self.module(*[torch.from_numpy(feeds[name]) for name in self.inputs])
            results = result if isinstance(result, (tuple, list)) else [result]
            return [tensor.numpy() for tensor in results[: len(self.outputs)]]

        return common.execute(pb_utils, requests, self.inputs, self.outputs, run, batched=self.batched)
