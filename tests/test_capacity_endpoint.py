"""The capacity simulator against the local endpoint on the real ``tritonserver`` (issue 50, point 5).

Copies of ``resnet-synthetic`` from ``models.yaml`` (as it is there, but for its number of copies)
are built and published; the local endpoint serves them with a memory budget of two and a half
copies, so it must unload. A Zipf sequence drawn by the ``capacity`` command's traffic code is
sent one request at a time, and the loads and warm answers the endpoint actually gave (its own
counters, and the server's log) are compared with what the simulator predicts for the same budget,
sizes and sequence: warm share within 2 percentage points, loads within 10%
(``benchmarks/capacity_endpoint.py`` says how).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.capacity_endpoint import (  # noqa: E402
    LOADS_TOLERANCE,
    WARM_TOLERANCE,
    Workload,
    check,
    image_request,
    predict,
    verdict,
    zipf_sequence,
)

#: Three copies, room for two and a half: with seed 0 the 18 requests give 6 loads under LRU (3
#: first loads, 3 after an eviction) and 12 warm answers. Each load is a real one on the server
#: (1.5 to 4 s on two busy cores), so the sequence is as short as still tells LRU from the other
#: simple policies (``test_the_sequence_tells_lru_from_fifo_and_mru``).
WORKLOAD = Workload(copies=3, room=2.5, requests=18, zipf=1.0, seed=0)


def _imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            found.add("." * node.level + (node.module or ""))
    return found


def test_the_simulator_shares_no_code_with_the_endpoint() -> None:
    simulator = _imports(ROOT / "model_build" / "capacity" / "simulate.py")
    # The standard library only: nothing of the project, so nothing of model_cache.py.
    assert simulator == {"__future__", "math", "collections", "collections.abc", "dataclasses", "typing"}, simulator
    endpoint = _imports(ROOT / "model_build" / "tools" / "local_endpoint" / "model_cache.py") | _imports(
        ROOT / "model_build" / "tools" / "local_endpoint" / "server.py")
    assert not [name for name in endpoint if "capacity" in name], endpoint


def test_the_verdict_holds_each_side_to_its_tolerance() -> None:
    measured = {"warm_share": 0.50, "loads": 10}
    assert verdict(measured, {"warm_share": 0.50 + WARM_TOLERANCE, "loads": 11}) == {
        "warm_share_diff": pytest.approx(WARM_TOLERANCE), "loads_rel_diff": pytest.approx(LOADS_TOLERANCE),
        "warm_within": True, "loads_within": True}
    missed = verdict(measured, {"warm_share": 0.53, "loads": 12})
    assert (missed["warm_within"], missed["loads_within"]) == (False, False)
    # No load measured: the load count cannot be judged, so it is not within.
    assert verdict({"warm_share": 1.0, "loads": 0}, {"warm_share": 1.0, "loads": 0})["loads_within"] is False


def test_the_prediction_is_lru_over_the_budget() -> None:
    # Room for two of three: a b a c b -> c evicts b, b evicts a: loads a b c b, the second a warm.
    predicted = predict(["a", "b", "c"], [10, 10, 10], 25, [0, 1, 0, 2, 1])
    assert (predicted["loads"], predicted["warm"], predicted["resident"]) == (4, 1, ["c", "b"])


def _replay(sequence: list[int], slots: int, policy: str) -> int:
    """Loads of a cache of ``slots`` under a simple policy (an independent replay, for the test)."""
    cache: list[int] = []
    loads = 0
    for item in sequence:
        if item in cache:
            if policy == "lru":
                cache.remove(item)
                cache.append(item)
            continue
        loads += 1
        if len(cache) == slots:
            cache.pop(-1 if policy == "mru" else 0)
        cache.append(item)
    return loads


def test_the_sequence_tells_lru_from_fifo_and_mru() -> None:
    """The check can fail: an endpoint evicting first-in or most-recently-used would load more
    than 10% more or fewer times than the simulator's LRU predicts on this sequence."""
    targets = [f"copy-{i}" for i in range(WORKLOAD.copies)]
    sequence = zipf_sequence("copy", targets, WORKLOAD)
    assert set(sequence) == set(range(WORKLOAD.copies))
    predicted = predict(targets, [10] * WORKLOAD.copies, int(WORKLOAD.room * 10), sequence)["loads"]
    assert predicted == _replay(sequence, 2, "lru") > WORKLOAD.copies  # evictions happen
    for policy in ("fifo", "mru"):
        other = _replay(sequence, 2, policy)
        assert not verdict({"warm_share": 1 - other / len(sequence), "loads": other},
                           {"warm_share": 1 - predicted / len(sequence), "loads": predicted})["loads_within"], policy


@pytest.mark.slow
def test_the_simulator_predicts_the_loads_and_warm_answers_of_the_local_endpoint(tmp_path: Path) -> None:
    from triton_helpers import requires_triton  # noqa: F401  (a missing Triton environment fails here)

    from benchmarks._common import manifest_entry
    from triton_mme_cdk.model_build.manifest import parse_manifest
    from triton_mme_cdk.model_build.pipeline import BuildOptions, build_release
    from triton_mme_cdk.model_build.release import compute_release

    entry = manifest_entry("resnet-synthetic")
    entry["copies"] = WORKLOAD.copies
    manifest = parse_manifest({"version": 1, "models": [entry]})
    release = compute_release(manifest, base_dir=ROOT)
    record, release_dir = build_release(manifest, release, BuildOptions(base_dir=ROOT), out_dir=tmp_path / "build")
    image = entry["image"]
    body, content_type = image_request("pixel_values", "logits", image["image_size"], image.get("channels", 3))
    result: dict[str, Any] = check(record.artifacts(release_dir)[0], WORKLOAD, body, content_type)

    measured, predicted = result["measured"], result["predicted"]
    assert measured["answered"] == WORKLOAD.requests, measured
    # What the endpoint did, by two counts of its own: its load counter and the server's log.
    assert measured["loads"] == measured["loads_in_server_log"], measured
    # The budget forced evictions: more loads than copies requested, and unloads.
    requested = len(set(result["sequence"]))
    assert measured["loads"] > requested and measured["unloads"] == measured["loads"] - len(measured["resident"])
    assert len(measured["resident"]) == int(WORKLOAD.room) and measured["loaded_bytes"] <= result["budget_bytes"]
    assert measured["warm"] + measured["loads"] == WORKLOAD.requests  # one at a time: each cold call loads once
    # The prediction, from the simulator alone, within the tolerances.
    assert result["warm_within"] and result["loads_within"], result
    assert sorted(predicted["resident"]) == sorted(measured["resident"]), result
