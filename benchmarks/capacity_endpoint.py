"""The capacity simulator checked against the local endpoint (issue 50, point 5).

The local endpoint (:mod:`model_build.tools.local_endpoint.model_cache`, in front of the real ``tritonserver``) unloads
the least recently used model when the unpacked size of the loaded ones would pass its memory
budget. Copies of one model of ``models.yaml`` are published, the endpoint is given a budget that
holds only some of them, and a Zipf request sequence (drawn by the ``capacity`` command's own
traffic code) is sent to it one request at a time. What the endpoint did is counted from the
endpoint itself: a request is warm when the endpoint's load counter did not move during it, and
the loads are the server's own ``successfully loaded`` log lines (checked against the counter).

The simulator (:func:`model_build.capacity.simulate.simulate`, which imports nothing of the
project and nothing of ``model_cache``) is given the same budget as one instance's GPU memory, each
copy's unpacked size as the build recorded it in its footprint (what the endpoint's budget
counts), the same sequence, one instance, no spill. Requests are one at a time, each sent once the
previous one is answered: the simulator gets them spaced further apart than any load takes, so
that neither side counts a wait for another request's load. The verdict: the predicted warm share
within :data:`WARM_TOLERANCE` of the measured one and the predicted loads within
:data:`LOADS_TOLERANCE` of the measured ones.

What this cannot check: SageMaker's own eviction (the endpoint is this project's emulation of it),
its routing over several instances, requests that overlap a load, and the real GPU's allocator
(the budget here counts unpacked bytes, not device memory).

Used by ``tests/test_capacity_endpoint.py`` and the ``capacity`` benchmark.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

#: The issue's tolerances: warm share within 2 percentage points, loads within 10%.
WARM_TOLERANCE = 0.02
LOADS_TOLERANCE = 0.10
#: The server's log line of a finished load (``successfully loaded '<hashed name>'``).
_LOADED = re.compile(r"successfully loaded '([^']+)'")


@dataclass(frozen=True)
class Workload:
    """How many copies, how much room, how many requests."""

    copies: int
    #: The budget in copies: 2.5 holds two copies, never three.
    room: float
    requests: int
    zipf: float = 1.0
    seed: int = 0

    def text(self) -> str:
        return (f"{self.requests} requests, Zipf s={self.zipf:g} (seed {self.seed}) over {self.copies} copies, "
                f"a budget of {self.room:g} copies")


def zipf_sequence(entry: str, targets: Sequence[str], workload: Workload) -> list[int]:
    """The first ``workload.requests`` requests of the ``capacity`` command's Zipf profile over
    ``targets`` (the copies of ``entry``, the most requested first): indexes into ``targets``."""
    from triton_mme_cdk.model_build.capacity.traffic import draw_requests, parse_profile

    rate = 10.0
    traffic = parse_profile({"total_rate": rate, "zipf": workload.zipf}, {entry: list(targets)})
    _, picks = draw_requests([traffic.rates[t] for t in targets], seconds=2.0 * workload.requests / rate + 10.0,
                             seed=workload.seed)
    if len(picks) < workload.requests:
        raise ValueError(f"drew {len(picks)} requests; expected at least {workload.requests}")
    return picks[:workload.requests]


def unpacked_bytes(footprint: Mapping[str, Any]) -> int:
    """The unpacked size a build recorded in a target's footprint (``Footprint.to_json``)."""
    value = (footprint.get("unpacked_bytes") or {}).get("value")
    if not isinstance(value, (int, float)) or value <= 0:
        raise ValueError(f"the footprint records no unpacked size: {footprint.get('unpacked_bytes')!r}")
    return int(value)


def measure(endpoint: Any, runtime: Any, targets: Sequence[str], sequence: Sequence[int], body: bytes,
            content_type: str) -> dict[str, Any]:
    """Send the sequence to the endpoint one request at a time; what it did, by its own counts."""
    cache = endpoint.cache
    log_before = len(_LOADED.findall(endpoint.server.log_path.read_text(errors="replace")))
    loads_before, unloads_before = cache.loads, cache.unloads
    warm, answered = [], 0
    cold_seconds: list[float] = []
    started = time.perf_counter()
    for index in sequence:
        before = cache.loads
        began = time.perf_counter()
        response = runtime.invoke_endpoint(EndpointName="local", TargetModel=targets[index],
                                           ContentType=content_type, Body=body)
        response["Body"].read()
        answered += response["ResponseMetadata"]["HTTPStatusCode"] == 200
        loaded = cache.loads - before
        warm.append(loaded == 0)
        if loaded:
            cold_seconds.append(time.perf_counter() - began)
    seconds = time.perf_counter() - started
    log_loads = len(_LOADED.findall(endpoint.server.log_path.read_text(errors="replace"))) - log_before
    return {
        "requests": len(sequence),
        "answered": answered,
        "warm": sum(warm),
        "warm_share": sum(warm) / len(sequence),
        "warm_by_request": warm,
        "loads": cache.loads - loads_before,
        "loads_in_server_log": log_loads,
        "unloads": cache.unloads - unloads_before,
        "resident": cache.loaded_targets(),
        "seconds": round(seconds, 3),
        "cold_seconds_max": round(max(cold_seconds, default=0.0), 3),
    }


def predict(targets: Sequence[str], sizes: Sequence[int], budget: int, sequence: Sequence[int]) -> dict[str, Any]:
    """The simulator's answer for the same budget, sizes and sequence: one instance, no spill."""
    from triton_mme_cdk.model_build.capacity.simulate import InstanceShape, ModelLoad, Routing, simulate

    load_seconds = 1.0
    models = [ModelLoad(target, size, size, load_seconds) for target, size in zip(targets, sizes, strict=True)]
    # Far apart: every load ends before the next request, as on the endpoint called one at a time.
    times = [index * 10.0 * load_seconds for index in range(len(sequence))]
    shape = InstanceShape("local endpoint", budget, 2 * sum(sizes))
    result = simulate(models, shape, 1, times, list(sequence), routing=Routing(spill_after_seconds=float("inf")))
    return {"requests": result.requests, "warm": result.warm, "warm_share": result.warm_share,
            "loads": result.loads, "resident": result.resident[0]}


def verdict(measured: Mapping[str, Any], predicted: Mapping[str, Any]) -> dict[str, Any]:
    """The differences and whether each is within its tolerance."""
    warm_diff = abs(predicted["warm_share"] - measured["warm_share"])
    loads_diff = abs(predicted["loads"] - measured["loads"]) / measured["loads"] if measured["loads"] else None
    return {
        "warm_share_diff": round(warm_diff, 6),
        "loads_rel_diff": None if loads_diff is None else round(loads_diff, 6),
        "warm_within": warm_diff <= WARM_TOLERANCE + 1e-9,
        "loads_within": loads_diff is not None and loads_diff <= LOADS_TOLERANCE + 1e-9,
    }


def image_request(input_name: str, output_name: str, image_size: int, channels: int = 3) -> tuple[bytes, str]:
    """One batch-1 binary+JSON request for an image model (zeros: the answer is not checked here)."""
    import numpy as np
    import tritonclient.http as httpclient

    array = np.zeros((1, channels, image_size, image_size), dtype=np.float32)
    tensor = httpclient.InferInput(input_name, list(array.shape), "FP32")
    tensor.set_data_from_numpy(array, binary_data=True)
    output = httpclient.InferRequestedOutput(output_name, binary_data=True)
    body, header = httpclient.InferenceServerClient.generate_request_body([tensor], outputs=[output])
    return body, f"application/vnd.sagemaker-triton.binary+json;json-header-size={header}"


def check(artifact: Any, workload: Workload, body: bytes, content_type: str, *, bucket: str = "capacity-check",
          release_id: str = "r-capacitycheck0000") -> dict[str, Any]:
    """Publish ``artifact`` (a built model whose ``targets`` are its copies) to moto's S3 server,
    serve it on the local endpoint with a budget of ``workload.room`` copies, send the Zipf
    sequence and compare the simulator's prediction with what the endpoint did."""
    from triton_mme_cdk.model_build.aws_clients import make_s3_client
    from triton_mme_cdk.model_build.release.publish import publish_release
    from triton_mme_cdk.model_build.tools.local_endpoint.server import local_endpoint
    from triton_mme_cdk.model_build.tools.local_s3 import local_s3
    from triton_mme_cdk.model_build.tools.smoke.prepare import make_runtime_client

    if len(artifact.targets) != workload.copies:
        raise ValueError(f"the artifact has {len(artifact.targets)} targets; the workload asks for {workload.copies}")
    size = unpacked_bytes(artifact.footprint or {})
    budget = int(workload.room * size)
    targets = [f"{target}.tar.gz" for target in artifact.targets]
    sequence = zipf_sequence(artifact.name, targets, workload)
    predicted = predict(targets, [size] * len(targets), budget, sequence)
    with local_s3() as url:
        s3 = make_s3_client(endpoint_url=url)
        s3.create_bucket(Bucket=bucket)
        publish_release([artifact], s3_client=s3, bucket=bucket, release_prefix=f"models/{release_id}",
                        index_extra={"release_id": release_id})
        with local_endpoint(s3_client=s3, bucket=bucket, release_id=release_id, memory_budget_bytes=budget) as endpoint:
            runtime = make_runtime_client(endpoint_url=endpoint.url, timeout_seconds=120)
            measured = measure(endpoint, runtime, targets, sequence, body, content_type)
            measured["loaded_bytes"] = endpoint.cache.loaded_bytes()
    return {"workload": workload.text(), "unpacked_bytes": size, "budget_bytes": budget, "sequence": sequence,
            "measured": measured, "predicted": predicted, **verdict(measured, predicted)}
