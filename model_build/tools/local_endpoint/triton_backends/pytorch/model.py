"""Triton's ``pytorch`` (libtorch) backend, played by the python backend for the local endpoint.

Like ``pytorch_backend/src/libtorch.cc`` it loads ``<version>/model.pt`` with ``torch.jit.load``,
feeds the inputs positionally in the order of their ``<name>__<index>`` suffix, reads the outputs
by the same suffix, runs under ``torch.inference_mode`` (``INFERENCE_MODE`` parameter, default on
in 24.10) and takes the thread counts from ``INTRA_OP_THREAD_COUNT`` / ``INTER_OP_THREAD_COUNT``.
A ``KIND_GPU`` instance (kept only when the endpoint serves on a GPU) loads the module onto the
instance's device and runs there, as libtorch.cc does; a torch without CUDA is then a load error.
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
        # Each model instance runs in its own stub process, and nothing has run on torch's
        # inter-op pool before ``initialize``: the inter-op count can still be set here (torch
        # refuses it once that pool has started; that is reported as the config error it is).
        if "INTER_OP_THREAD_COUNT" in params:
            count = common.parse_int("INTER_OP_THREAD_COUNT", params["INTER_OP_THREAD_COUNT"])
            if count > 0 and torch.get_num_interop_threads() != count:
                try:
                    torch.set_num_interop_threads(count)
                except RuntimeError as error:
                    raise common.ConfigError(
                        f"INTER_OP_THREAD_COUNT '{count}': torch could not apply it ({error})") from None
        if "INTRA_OP_THREAD_COUNT" in params:
            count = common.parse_int("INTRA_OP_THREAD_COUNT", params["INTRA_OP_THREAD_COUNT"])
            if count > 0:
                torch.set_num_threads(count)
        self.device = torch.device("cpu")
        if common.kind_is_gpu(args):
            if not torch.cuda.is_available():
                raise common.ConfigError(
                    f"instance kind GPU: torch {torch.__version__} in this environment sees no CUDA device; "
                    "install torch's CUDA build into the triton environment, or serve the model with KIND_CPU")
            self.device = torch.device("cuda", common.device_id(args))
        self.module = torch.jit.load(common.model_path(args, self.config, "model.pt"), map_location=self.device)
        self.module.eval()
        self.inputs = _order([t["name"] for t in self.config.get("input", [])], "input")
        self.outputs = _order([t["name"] for t in self.config.get("output", [])], "output")
        self.batched = int(self.config.get("max_batch_size", 0)) > 0

    def execute(self, requests: list) -> list:
        def run(feeds: dict) -> list:
            context = torch.inference_mode() if self.inference_mode else torch.no_grad()
            with context:
                result = self.module(*[torch.from_numpy(feeds[name]).to(self.device) for name in self.inputs])
            results = result if isinstance(result, (tuple, list)) else [result]
            return [tensor.cpu().numpy() for tensor in results[: len(self.outputs)]]

        return common.execute(pb_utils, requests, self.inputs, self.outputs, run, batched=self.batched)
