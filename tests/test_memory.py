"""``model_build.export.memory``: when a build step collects garbage, and the size it judges by."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest
import torch

from triton_mme_cdk.model_build.export.memory import COLLECT_FROM_BYTES, module_bytes, release_memory


@pytest.fixture
def full_collections() -> Iterator[list[int]]:
    """The generation of each collection the interpreter runs while the test does."""
    seen: list[int] = []

    def record(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            seen.append(info["generation"])

    gc.callbacks.append(record)
    try:
        yield seen
    finally:
        gc.callbacks.remove(record)


def test_a_small_model_is_not_collected_for(full_collections: list[int]) -> None:
    release_memory(COLLECT_FROM_BYTES - 1)
    assert 2 not in full_collections


def test_a_big_model_gets_a_full_collection(full_collections: list[int]) -> None:
    release_memory(COLLECT_FROM_BYTES)
    assert 2 in full_collections


def test_module_bytes_counts_parameters_and_buffers_at_their_dtype() -> None:
    linear = torch.nn.Linear(3, 4)  # 12 weights + 4 biases
    assert module_bytes(linear) == 16 * 4
    assert module_bytes(linear.half()) == 16 * 2
    norm = torch.nn.BatchNorm1d(5)  # weight, bias; running mean, var (float32); num_batches_tracked (int64)
    assert module_bytes(norm) == 4 * 5 * 4 + 8
