"""The local endpoint on the real ``tritonserver``: cold starts, warm latency, JSON against
binary+JSON bodies, and what Triton's dynamic batcher gives 8 concurrent clients.

Cold start and warm latency cover the two ResNets (ONNX, TorchScript) and MiniLM twice: taking
tokens (``minilm-tokens``) and raw text through the tokenizer ensemble (``minilm-text``), built
exactly as the ``text_ensemble`` benchmark builds them (in a ``--tiny`` run: a 2-layer WordPiece
model with MiniLM's settings, under the same names).

Bodies respect SageMaker's 6 MB ``InvokeEndpoint`` limit (the local endpoint refuses larger ones
with a 413, as the service does): the JSON body of a 224x224 ResNet batch of 8 is far above it, so
JSON and binary+JSON are compared at the largest batch whose JSON body fits, and the batch-8 JSON
body is sent once to record its refusal.

Everything goes through boto3's ``sagemaker-runtime`` client to the local endpoint
(:mod:`model_build.tools.local_endpoint.server`), which downloads the published tarball from a local S3
endpoint (moto's server), unpacks it and loads it on the server: the path a SageMaker MME takes,
on CPU with the python-based ONNX Runtime / PyTorch backends (see the deviations in docs/local-endpoint.md).
"""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks._common import (
    RunContext,
    comparison,
    finish_result,
    goal,
    log,
    manifest_entry,
    new_result,
    percentile,
    run_for,
    spec_from,
    stats,
    tiny_resnet_entry,
)

NAME = "endpoint"
TITLE = "Local endpoint on the real tritonserver: cold start, warm latency, JSON vs binary, dynamic batching"
BUCKET = "bench-endpoint"
BINARY = "application/vnd.sagemaker-triton.binary+json;json-header-size={}"
#: The seed articles' claim for image payloads; the target this benchmark checks.
BINARY_GOAL = 2.0
BATCHING_GOAL = 1.5
#: Cold start (download + sha256 + unpack + load + first answer) of every model, median, seconds.
COLD_START_GOAL_S = 10.0
#: Warm p99 at batch 1 of every model, seconds.
WARM_P99_GOAL_S = 0.1
#: Seconds of calls per warm measurement and calls per throughput run (each of 3 runs). The models
#: and batches are the same in quick and full; a quick run measures each for half as long. A tiny
#: run's measurements are their least number of calls (20 warm, 2 per body, one per client).
SIZES: dict[str, dict[str, Any]] = {
    "tiny": {"seconds_per_measurement": 0.1, "throughput_calls": 8},
    "quick": {"seconds_per_measurement": 4.0, "throughput_calls": 160},
    "full": {"seconds_per_measurement": 8.0, "throughput_calls": 320},
}
#: The sentence of every batch-1 text request; the token target gets its ids from the source's own
#: tokenizer (MiniLM's: [101, 2023, 2003, 1037, 7099, 6251, 1012, 102]).
SENTENCE = "This is a sample sentence."
#: A tiny run's ResNets (:data:`~benchmarks._common.TINY_RESNET` weights) and their images: the ONNX
#: one at the smallest image whose batch-8 JSON body (8 x 3 x 128 x 128 floats, about 7.9 MB) is
#: still over the 6 MB limit, so the refusal and the largest fitting batch are measured as at 224;
#: the TorchScript one, called at batch 1 only, at 32.
TINY_IMAGES = {"resnet-synthetic": 128, "resnet-synthetic-ts": 32}


def _request(name: str, array: np.ndarray, output: str, *, binary: bool) -> tuple[bytes, str]:
    import tritonclient.http as httpclient

    tensor = httpclient.InferInput(name, list(array.shape), "FP32")
    tensor.set_data_from_numpy(array, binary_data=binary)
    wanted = httpclient.InferRequestedOutput(output, binary_data=binary)
    body, header = httpclient.InferenceServerClient.generate_request_body([tensor], outputs=[wanted])
    return body, (BINARY.format(header) if header else "application/json")


def _targets(ctx: RunContext) -> dict[str, dict[str, Any]]:
    """The two ResNet entries of models.yaml (ONNX and TorchScript), one copy each, and MiniLM
    taking tokens and raw text (the ``text_ensemble`` benchmark's specs: its build is shared)."""
    from transformers import AutoTokenizer

    from benchmarks.text_ensemble import minilm_specs, source_folder

    out: dict[str, dict[str, Any]] = {}
    for name, input_name, output in (("resnet-synthetic", "pixel_values", "logits"),
                                     ("resnet-synthetic-ts", "pixel_values__0", "logits__0")):
        entry = manifest_entry(name)
        entry["copies"] = 1
        if ctx.tiny:
            entry = tiny_resnet_entry(entry, TINY_IMAGES[name])
        out[name] = {"spec": spec_from(entry), "input": input_name, "output": output, "kind": "image"}
    text_specs = minilm_specs(ctx)
    tokenizer = AutoTokenizer.from_pretrained(str(source_folder(text_specs["tokens"], ctx)), local_files_only=True)
    out["minilm-tokens"] = {"spec": text_specs["tokens"], "kind": "tokens",
                            "token_ids": [int(i) for i in tokenizer(SENTENCE)["input_ids"]]}
    out["minilm-text"] = {"spec": text_specs["text"], "kind": "text"}
    return out


def _batch1(item: dict[str, Any], rng: np.random.Generator) -> tuple[bytes, str]:
    """One batch-1 request for a target: binary+JSON for images (of the target's size), JSON for
    tokens and text."""
    if item["kind"] == "image":
        image = item["spec"].image_inputs.image_size
        return _request(item["input"], rng.random((1, 3, image, image), dtype=np.float32), item["output"], binary=True)
    if item["kind"] == "tokens":
        ids = item["token_ids"]
        inputs = [{"name": name, "datatype": "INT64", "shape": [1, len(ids)], "data": data}
                  for name, data in (("input_ids", ids), ("attention_mask", [1] * len(ids)))]
    else:
        inputs = [{"name": "TEXT", "datatype": "BYTES", "shape": [1, 1], "data": [SENTENCE]}]
    return json.dumps({"inputs": inputs}).encode(), "application/json"


def _largest_fitting_batch(onnx: dict[str, Any], image: int, rng: np.random.Generator, limit: int) -> int:
    """The largest batch (8 down to 1) whose JSON body (the bigger one) is within ``limit`` bytes."""
    for batch in range(8, 0, -1):
        body, _ = _request(onnx["input"], rng.random((batch, 3, image, image), dtype=np.float32), onnx["output"],
                           binary=False)
        if len(body) <= limit:
            return batch
    return 0


def run(ctx: RunContext) -> dict[str, Any]:
    from botocore.exceptions import ClientError

    from triton_mme_cdk.model_build.tools.local_endpoint.server import MAX_BODY_BYTES
    from triton_mme_cdk.model_build.tools.smoke.prepare import make_runtime_client

    started = time.perf_counter()
    chosen = ctx.sizes(SIZES)
    budget = float(chosen["seconds_per_measurement"])
    body_calls = 2 if ctx.tiny else 5  # calls per body encoding at least (each a 6 MB body at most)
    targets = _targets(ctx)
    result = new_result(NAME, TITLE, ctx, {
        "models": list(targets), "repeats": ctx.repeats, "seconds_per_measurement": budget,
        "throughput_calls_per_run": int(chosen["throughput_calls"]),
        "path": "boto3 sagemaker-runtime -> local endpoint -> tritonserver 2.51 (python-based backends, CPU)",
        "batching": "8 clients each sending batch-1 requests, against 1 client; dynamic batching as in models.yaml",
    })
    specs = [item["spec"] for item in targets.values()]
    with ctx.served(specs, release_id="r-bench00000000000", bucket=BUCKET) as endpoint:
        log(f"endpoint: {endpoint.ready_line()}")
        runtime = make_runtime_client(endpoint_url=endpoint.url, timeout_seconds=300)
        image = targets["resnet-synthetic"]["spec"].image_inputs.image_size
        rng = np.random.default_rng(0)

        def invoke(target: str, body: bytes, content_type: str) -> None:
            runtime.invoke_endpoint(EndpointName="local", TargetModel=target, ContentType=content_type,
                                    Body=body)["Body"].read()

        cold: dict[str, Any] = {}
        warm: dict[str, Any] = {}
        for name, item in targets.items():
            target = f"{name}.tar.gz"
            body, ctype = _batch1(item, rng)
            samples = []
            for _ in range(ctx.repeats):
                endpoint.cache.unload_all()
                t0 = time.perf_counter()
                invoke(target, body, ctype)
                samples.append(time.perf_counter() - t0)
            cold[name] = stats(samples)
            latencies = run_for(partial(invoke, target, body, ctype),
                                budget, min_calls=20)
            warm[name] = {**stats(latencies), "p50": percentile(latencies, 50), "p99": percentile(latencies, 99),
                          "calls": len(latencies)}
            log(f"endpoint: {name}: cold {cold[name]['median'] * 1000:.0f} ms, warm p50 "
                f"{warm[name]['p50'] * 1000:.1f} ms p99 {warm[name]['p99'] * 1000:.1f} ms")
        result["measurements"]["cold_s"] = cold
        result["measurements"]["warm_s"] = warm

        onnx = targets["resnet-synthetic"]
        # Batch 8: the binary body fits the 6 MB limit and is measured; the JSON one is refused.
        batch8 = rng.random((8, 3, image, image), dtype=np.float32)
        body8, ctype8 = _request(onnx["input"], batch8, onnx["output"], binary=True)
        json8, json8_type = _request(onnx["input"], batch8, onnx["output"], binary=False)
        refused: dict[str, Any] = {"request_bytes": len(json8), "limit_bytes": MAX_BODY_BYTES}
        try:
            invoke("resnet-synthetic.tar.gz", json8, json8_type)
            refused["refused"] = False
        except ClientError as error:
            refused.update(refused=True, status=error.response["ResponseMetadata"]["HTTPStatusCode"],
                           code=error.response["Error"]["Code"])
        batch8_binary = {**stats(run_for(lambda: invoke("resnet-synthetic.tar.gz", body8, ctype8), budget,
                                         min_calls=body_calls)), "request_bytes": len(body8)}
        result["measurements"]["batch8_encodings_s"] = {"json": refused, "binary": batch8_binary}
        log(f"endpoint: batch 8 JSON body {len(json8)} bytes: "
            f"{'refused ' + str(refused.get('status')) if refused['refused'] else 'accepted'}")

        fit = _largest_fitting_batch(onnx, image, rng, MAX_BODY_BYTES)
        if fit == 0:
            raise RuntimeError(f"even a batch-1 JSON body of a {image}x{image} image exceeds {MAX_BODY_BYTES} bytes")
        batch = rng.random((fit, 3, image, image), dtype=np.float32)
        encodings: dict[str, Any] = {"batch": fit}
        for label, binary in (("json", False), ("binary", True)):
            body, ctype = _request(onnx["input"], batch, onnx["output"], binary=binary)
            encodings[label] = {**stats(run_for(partial(
                invoke, "resnet-synthetic.tar.gz", body, ctype), budget, min_calls=body_calls)),
                "request_bytes": len(body)}
        result["measurements"]["encodings_s"] = encodings
        binary_vs_json = comparison(
            "binary_vs_json", what=f"ResNet batch {fit} request latency through the endpoint "
            "(the largest batch whose JSON body fits the 6 MB limit)", unit="s",
            baseline_label="JSON", baseline=encodings["json"], candidate_label="binary+JSON",
            candidate=encodings["binary"], lower_is_better=True)
        result["comparisons"].append(binary_vs_json)

        body, ctype = _request(onnx["input"], rng.random((1, 3, image, image), dtype=np.float32),
                               onnx["output"], binary=True)
        throughput = {}
        for clients in (1, 8):
            rates = []
            for _ in range(ctx.repeats):
                calls = int(chosen["throughput_calls"])
                with ThreadPoolExecutor(clients) as pool:
                    t0 = time.perf_counter()
                    list(pool.map(lambda _: invoke("resnet-synthetic.tar.gz", body, ctype), range(calls)))
                    rates.append(calls / (time.perf_counter() - t0))
            throughput[str(clients)] = stats(rates)
        result["measurements"]["throughput_rps"] = throughput
        batching = comparison(
            "throughput_8_clients_vs_1", what="ResNet batch-1 requests per second", unit="requests/s",
            baseline_label="1 client", baseline=throughput["1"], candidate_label="8 clients",
            candidate=throughput["8"], lower_is_better=False)
        result["comparisons"].append(batching)

    worst_cold = max(cold, key=lambda n: cold[n]["median"])
    worst_p99 = max(warm, key=lambda n: warm[n]["p99"])
    result["goals"].append(goal(
        "cold_start", "a first call (download, sha256, unpack, load, answer) of every model stays well under "
        "the 60 s InvokeEndpoint timeout",
        target=f"<= {COLD_START_GOAL_S:g} s median, every model", measured=f"{cold[worst_cold]['median']:.2f} s",
        met=cold[worst_cold]["median"] <= COLD_START_GOAL_S, detail=f"slowest: {worst_cold}",
        limit="" if cold[worst_cold]["median"] <= COLD_START_GOAL_S else
        "the python backend starts one stub process per model and imports ONNX Runtime/torch in it; "
        "2 shared cores load it",
    ))
    result["goals"].append(goal(
        "warm_p99", "warm batch-1 requests of every model answer within an interactive budget",
        target=f"<= {WARM_P99_GOAL_S * 1000:g} ms p99, every model", measured=f"{warm[worst_p99]['p99'] * 1000:.0f} ms",
        met=warm[worst_p99]["p99"] <= WARM_P99_GOAL_S, detail=f"slowest: {worst_p99}",
        limit="" if warm[worst_p99]["p99"] <= WARM_P99_GOAL_S else
        "CPU inference on python-based backends, on 2 cores shared with the client and the endpoint "
        "(the GPU endpoint runs the C++ backends)",
    ))
    result["goals"].append(goal(
        "binary_faster_than_json", "binary+JSON bodies are much faster than JSON for image batches (seed articles)",
        target=f">= {BINARY_GOAL:g}x at the largest batch whose JSON body fits 6 MB (batch {encodings['batch']})",
        measured=round(binary_vs_json["ratio"], 2),
        met=binary_vs_json["ratio"] >= BINARY_GOAL,
        detail=f"JSON body {encodings['json']['request_bytes']} bytes, binary {encodings['binary']['request_bytes']} "
               f"bytes; at batch 8 the JSON body ({refused['request_bytes']} bytes) is refused by the 6 MB limit "
               f"(refused: {refused['refused']}), the binary one ({batch8_binary['request_bytes']} bytes) is not",
        limit="" if binary_vs_json["ratio"] >= BINARY_GOAL else
        "on loopback the JSON encode/decode of the floats is the difference; model time is the same",
    ))
    result["goals"].append(goal(
        "dynamic_batching_throughput", "8 concurrent clients get more throughput than 1 through Triton's dynamic batcher",
        target=f">= {BATCHING_GOAL:g}x requests/s", measured=round(batching["ratio"], 2),
        met=batching["ratio"] >= BATCHING_GOAL,
        limit="" if batching["ratio"] >= BATCHING_GOAL else
        "2 cores run the client, the endpoint, the server and the python backend's stub at once",
    ))
    result["notes"].append("cold = download from local S3 + sha256 + unpack + load on tritonserver + first answer")
    result["notes"].append(
        f"SageMaker's InvokeEndpoint takes bodies up to {MAX_BODY_BYTES} bytes: the ResNet batch-8 JSON body "
        f"({refused['request_bytes']} bytes) was {'refused' if refused['refused'] else 'accepted'}; JSON and "
        f"binary+JSON are compared at batch {encodings['batch']}")
    return finish_result(result, started)


def chart(result: dict[str, Any], path: Path) -> None:
    from benchmarks._charts import figure, save

    fig, axes = figure(2, TITLE.split(":")[0])
    names = list(result["measurements"]["warm_s"])
    cold = [result["measurements"]["cold_s"][n]["median"] * 1000 for n in names]
    p50 = [result["measurements"]["warm_s"][n]["p50"] * 1000 for n in names]
    p99 = [result["measurements"]["warm_s"][n]["p99"] * 1000 for n in names]
    x = np.arange(len(names))
    axes[0].bar(x - 0.25, cold, 0.25, label="cold")
    axes[0].bar(x, p50, 0.25, label="warm p50")
    axes[0].bar(x + 0.25, p99, 0.25, label="warm p99")
    axes[0].set_xticks(x, names)
    axes[0].set_ylabel("ms")
    axes[0].set_yscale("log")
    axes[0].legend()
    axes[0].set_title("latency per model (batch 1)")
    rates = result["measurements"]["throughput_rps"]
    axes[1].bar(["1 client", "8 clients"], [rates["1"]["median"], rates["8"]["median"]])
    axes[1].set_ylabel("requests/s")
    axes[1].set_title("ResNet batch-1 throughput")
    save(fig, path)


def markdown(result: dict[str, Any]) -> str:
    """Tables of the endpoint benchmark for docs/benchmarks.md."""
    from benchmarks._common import spread_text
    from benchmarks.report import table

    m = result["measurements"]
    rows = [[f"`{name}`", spread_text(m["cold_s"][name], "s"), f"{m['warm_s'][name]['p50'] * 1000:.1f} ms",
             f"{m['warm_s'][name]['p99'] * 1000:.1f} ms", m["warm_s"][name]["calls"]] for name in m["warm_s"]]
    ratios = {c["name"]: c["ratio"] for c in result["comparisons"]}
    enc, rps, b8 = m["encodings_s"], m["throughput_rps"], m["batch8_encodings_s"]
    refused = (f"refused ({b8['json'].get('status')} {b8['json'].get('code')})" if b8["json"]["refused"]
               else "accepted")
    return "\n".join([
        f"Path: {result['parameters']['path']}. Cold: {result['notes'][0]}.",
        "",
        table(["model", "cold start", "warm p50 (batch 1)", "warm p99 (batch 1)", "warm calls"], rows),
        "",
        table(["", "JSON", "binary+JSON", "binary speed-up"], [[
            f"ResNet batch {enc['batch']} latency", spread_text(enc["json"], "s"), spread_text(enc["binary"], "s"),
            f"**{ratios['binary_vs_json']:.2f}x**"], [
            "request body", f"{enc['json']['request_bytes'] / 1e6:.2f} MB", f"{enc['binary']['request_bytes'] / 1e6:.2f} MB", ""], [
            "ResNet batch 8 (6 MB limit)", f"{b8['json']['request_bytes'] / 1e6:.2f} MB: {refused}",
            f"{b8['binary']['request_bytes'] / 1e6:.2f} MB: {spread_text(b8['binary'], 's')}", ""]]),
        "",
        table(["", "1 client", "8 clients", "gain"], [[
            "ResNet batch-1 requests/s", f"{rps['1']['median']:.1f}", f"{rps['8']['median']:.1f}",
            f"**{ratios['throughput_8_clients_vs_1']:.2f}x**"]]),
    ])
