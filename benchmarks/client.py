"""The client (``triton_mme_client``) against ``invoke_endpoint`` with a body built by hand, on the
local endpoint: latency per call, and the S3 reads of the routes document.

Three targets of the default manifest's kinds are built the way the endpoint benchmark builds them
(shared builds in one run): the ResNet of models.yaml (ONNX, ``FP32`` pixels), MiniLM taking
tokens (``INT64`` ids and mask) and MiniLM taking raw text (a ``BYTES`` tensor, the tokenizer
ensemble); in a ``--tiny`` run the tiny models of those benchmarks under the same names. They are
published into the stack's layout (stored builds, the served prefix under content names, the
routes with each target's signature) in moto's S3 server and served by the local endpoint on the
real ``tritonserver``, every call at batch 1.

**Latency.** Two sides call the same target with the same request bytes through one boto3
``sagemaker-runtime`` client (botocore's retries off):

- *by hand*: ``invoke_endpoint(TargetModel=<the target, fixed>, Body=<bytes built once>)`` and the
  answer's bytes read, nothing parsed: the floor of any caller;
- *client*: ``TritonMmeClient.infer(<logical name>, <numpy inputs>)``, binary wire: the routes
  looked up (a conditional GET when they are older than ``refresh_seconds``), the inputs checked
  against the published signature, the body encoded, the call made, the answer decoded into
  numpy arrays.

Before timing, one call of the client goes through a recorder and its ``Body``, ``ContentType`` and
``TargetModel`` are checked equal to the hand-built ones, and its answer equal to the hand call's
answer decoded. The sides then alternate call by call (the order swapped every pair), so both see
the same machine state. The goal is judged on p50 over every call of each side (at least 3 runs of
each model, the models in turn); the median ratio of the calls of one pair, and p50 and p99 run by
run, are reported beside it: on a shared machine the speed of a run swings by more than the 10% the
goal allows, and only what both sides saw together cancels it. The client's own work per call
(route, check, encode, decode) is also timed without the network.

**S3 reads.** The client's S3 client goes through the recording proxy of ``tests/s3_faults.py``
(no rules: it forwards and records what reaches moto's server). The reads of the routes document
(new versions and 304s) are counted twice, from the resolver's counters and from the proxy's
records, over the wall time the client's calls span, against the bound of one read per
``refresh_seconds`` (``ceil(span / refresh_seconds) + 1``, the first read included).
"""

from __future__ import annotations

import json
import math
import struct
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks._common import (
    ROOT,
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

NAME = "client"
TITLE = "The client (triton_mme_client) against invoke_endpoint with a hand-built body: latency per call, S3 reads"
BUCKET = "bench-client"
PREFIX = "models"
ROUTES_KEY = f"{PREFIX}/_routes/routes.json"
ROUTES_URL = f"s3://{BUCKET}/{ROUTES_KEY}"
BINARY = "application/vnd.sagemaker-triton.binary+json;json-header-size={}"
#: The issue's goal: the client's p50 at most this multiple of the hand-built call's.
P50_GOAL = 1.1
#: The client's ``refresh_seconds`` here: short, so that a run spans many refresh periods and the
#: bound on S3 reads is tested many times over (the default is 30 s).
REFRESH_S = 2.0
#: Seconds of alternating calls per model and run (at least 3 runs; a tiny run: one, and at least
#: :data:`MIN_PAIRS` pairs of calls).
SIZES: dict[str, dict[str, Any]] = {
    "tiny": {"seconds_per_run": 0.1},
    "quick": {"seconds_per_run": 5.0},
    "full": {"seconds_per_run": 10.0},
}
MIN_PAIRS = 5
#: Wire datatypes of the arrays this benchmark builds by hand.
_DATATYPES = {"float32": "FP32", "int64": "INT64"}


def _specs(ctx: RunContext) -> dict[str, Any]:
    """The ResNet of models.yaml (one copy) and MiniLM taking tokens and raw text, as the endpoint
    benchmark builds them (a run of both builds each once)."""
    from benchmarks.endpoint import TINY_IMAGES
    from benchmarks.text_ensemble import minilm_specs

    entry = manifest_entry("resnet-synthetic")
    entry["copies"] = 1
    if ctx.tiny:
        entry = tiny_resnet_entry(entry, TINY_IMAGES["resnet-synthetic"])
    text = minilm_specs(ctx)
    return {"resnet-synthetic": spec_from(entry), "minilm-tokens": text["tokens"], "minilm-text": text["text"]}


def _inputs(name: str, spec: Any, ctx: RunContext) -> dict[str, np.ndarray]:
    """Batch-1 inputs: a random image, the token ids of the endpoint benchmark's sentence, or that
    sentence as text."""
    from benchmarks.endpoint import SENTENCE

    if spec.task == "image-classification":
        size = spec.image_inputs.image_size
        return {"pixel_values": np.random.default_rng(0).random((1, 3, size, size), dtype=np.float32)}
    if name == "minilm-text":
        return {"TEXT": np.array([[SENTENCE]], dtype=object)}
    from transformers import AutoTokenizer

    from benchmarks.text_ensemble import source_folder

    tokenizer = AutoTokenizer.from_pretrained(str(source_folder(spec, ctx)), local_files_only=True)
    ids = np.asarray([tokenizer(SENTENCE)["input_ids"]], dtype=np.int64)
    return {"input_ids": ids, "attention_mask": np.ones_like(ids)}


def hand_body(inputs: dict[str, np.ndarray]) -> tuple[bytes, str]:
    """The binary request of ``inputs`` built by hand from Triton's binary tensor extension: a JSON
    header naming each tensor with its ``binary_data_size``, every output asked for as binary data,
    then the raw tensors (little-endian, C order; a BYTES element as its 4-byte length and bytes)."""
    header_inputs, blobs = [], []
    for name, array in inputs.items():
        if array.dtype == object:
            datatype = "BYTES"
            raw = b"".join(struct.pack("<I", len(data)) + data
                           for data in (item.encode() if isinstance(item, str) else item for item in array.flat))
        else:
            datatype = _DATATYPES[array.dtype.name]
            raw = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<")).tobytes()
        header_inputs.append({"name": name, "shape": list(array.shape), "datatype": datatype,
                              "parameters": {"binary_data_size": len(raw)}})
        blobs.append(raw)
    header = json.dumps({"inputs": header_inputs, "parameters": {"binary_data_output": True}},
                        separators=(",", ":")).encode()
    return header + b"".join(blobs), BINARY.format(len(header))


class _Recorder:
    """A ``sagemaker-runtime`` client that keeps the arguments of every call (the check call only)."""

    def __init__(self, runtime: Any) -> None:
        self.runtime = runtime
        self.calls: list[dict[str, Any]] = []

    def invoke_endpoint(self, **kwargs: Any) -> Any:
        self.calls.append(kwargs)
        return self.runtime.invoke_endpoint(**kwargs)


def _deploy(ctx: RunContext, s3: Any, specs: dict[str, Any]) -> None:
    """Build, store, assemble and route the specs the way a deploy does (live_fleet's path)."""
    from triton_mme_cdk.model_build.manifest import parse_manifest
    from triton_mme_cdk.model_build.release import compute_release
    from triton_mme_cdk.model_build.release.serving import activate_release
    from triton_mme_cdk.model_build.release.store import ReleaseTarget, publish_incremental

    built = {name: ctx.build(spec) for name, spec in specs.items()}
    manifest = parse_manifest({"version": 1, "models": [spec.model_dump(mode="json", exclude_defaults=True)
                                                        for spec in specs.values()]})
    release = compute_release(manifest, base_dir=ROOT)
    units = [(built[name][0].artifact(built[name][1]), release.model_keys[name]) for name in specs]
    publish_incremental(units, ReleaseTarget.of(release, s3, BUCKET, PREFIX))
    activate_release(s3, BUCKET, PREFIX, release.release_id)


def _check_same_request(client: Any, recorder: _Recorder, runtime: Any, name: str, inputs: dict[str, np.ndarray],
                        body: bytes, content_type: str) -> dict[str, Any]:
    """One client call through the recorder: it sent the hand-built bytes to the routed target, and
    its answer is the hand call's answer decoded. Raises where not (the comparison would be void)."""
    from triton_mme_client.codec import decode

    answer = client.infer(name, inputs)  # the model's cold load happens here, before any timing
    sent = recorder.calls[-1]
    target = client.target_model(name)
    if sent["Body"] != body or sent["ContentType"] != content_type or sent["TargetModel"] != target:
        raise RuntimeError(f"{NAME}: {name}: the client sent another request than the hand-built one "
                           f"({len(sent['Body'])} bytes, {sent['ContentType']!r}, {sent['TargetModel']!r} against "
                           f"{len(body)} bytes, {content_type!r}, {target!r})")
    response = runtime.invoke_endpoint(EndpointName="local", TargetModel=target, ContentType=content_type, Body=body)
    raw, answer_type = response["Body"].read(), str(response.get("ContentType") or "")
    by_hand = decode(raw, answer_type)
    if sorted(by_hand) != sorted(answer) or not all(np.array_equal(by_hand[k], answer[k]) for k in answer):
        raise RuntimeError(f"{NAME}: {name}: the client's answer differs from the hand call's")
    return {"target_model": target, "request_bytes": len(body), "answer_bytes": len(raw), "answer_type": answer_type,
            "answer": raw, "outputs": {k: list(v.shape) for k, v in answer.items()}}


def _alternate(client_call: Callable[[], Any], hand_call: Callable[[], Any], resolver: Any, budget_s: float,
               min_pairs: int) -> dict[str, list[float]]:
    """Both sides' call seconds over ``budget_s``, one call each in turn (order swapped every pair),
    and the seconds of the client calls during which the resolver read the routes."""
    sides = {"client": client_call, "hand": hand_call}
    out: dict[str, list[float]] = {"client": [], "hand": [], "client_reading_routes": []}
    started = time.perf_counter()
    pair = 0
    while pair < min_pairs or time.perf_counter() - started < budget_s:
        for label in (("client", "hand") if pair % 2 == 0 else ("hand", "client")):
            reads = resolver.requests
            t0 = time.perf_counter()
            sides[label]()
            seconds = time.perf_counter() - t0
            out[label].append(seconds)
            if label == "client" and resolver.requests != reads:
                out["client_reading_routes"].append(seconds)
        pair += 1
    return out


def _client_work(client: Any, name: str, inputs: dict[str, np.ndarray], answer: bytes, answer_type: str,
                 budget_s: float) -> dict[str, Any]:
    """Seconds of the client's own work per call, the network left out: the route, the check of the
    inputs against the signature, the encoding, the decoding of a recorded answer."""
    from triton_mme_client.codec import decode, encode_binary
    from triton_mme_client.signatures import check_inputs

    def work() -> None:
        route = client.resolver.route(name)
        arrays = check_inputs(name, route.target_model, route.signature, inputs) if route.signature else inputs
        encode_binary(arrays)
        decode(answer, answer_type)

    return stats(run_for(work, budget_s, min_calls=20))


def _latency(samples: list[float]) -> dict[str, Any]:
    return {"p50": round(percentile(samples, 50), 6), "p99": round(percentile(samples, 99), 6), "calls": len(samples)}


def run(ctx: RunContext) -> dict[str, Any]:
    if str(ROOT / "tests") not in sys.path:
        sys.path.insert(0, str(ROOT / "tests"))  # the recording proxy lives with the tests
    from s3_faults import FaultProxy

    from triton_mme_cdk.model_build.aws_clients import make_s3_client
    from triton_mme_cdk.model_build.tools.local_endpoint.server import local_endpoint
    from triton_mme_cdk.model_build.tools.local_s3 import local_s3
    from triton_mme_cdk.model_build.tools.smoke.prepare import make_runtime_client
    from triton_mme_client import TritonMmeClient

    started = time.perf_counter()
    budget = float(ctx.sizes(SIZES)["seconds_per_run"])
    specs = _specs(ctx)
    result = new_result(NAME, TITLE, ctx, {
        "models": list(specs), "batch": 1, "repeats": ctx.repeats, "seconds_per_run": budget,
        "refresh_seconds": REFRESH_S, "wire": "binary",
        "path": "boto3 sagemaker-runtime (botocore retries off) -> local endpoint (served prefix, routes) -> "
                "tritonserver 2.51 (python-based backends, CPU); S3: moto's server on 127.0.0.1, the client's "
                "reads through the recording proxy of tests/s3_faults.py",
        "alternation": "one client call and one hand call in turn, the order swapped every pair",
    })
    inputs = {name: _inputs(name, spec, ctx) for name, spec in specs.items()}
    bodies = {name: hand_body(arrays) for name, arrays in inputs.items()}
    with local_s3() as url:
        s3 = make_s3_client(endpoint_url=url)
        s3.create_bucket(Bucket=BUCKET)
        _deploy(ctx, s3, specs)
        with FaultProxy(url) as proxy, local_endpoint(s3_client=s3, bucket=BUCKET, model_prefix=PREFIX) as endpoint:
            log(f"{NAME}: endpoint: {endpoint.ready_line()}")
            runtime = make_runtime_client(endpoint_url=endpoint.url, timeout_seconds=120)
            recorder = _Recorder(runtime)
            checker = TritonMmeClient("local", routes_url=ROUTES_URL, runtime=recorder, s3=s3, refresh_seconds=3600)
            checked = {name: _check_same_request(checker, recorder, runtime, name, inputs[name], *bodies[name])
                       for name in specs}
            signatures = {name: info.signature is not None for name, info in checker.models().items()}
            proxy.reset_records()
            client = TritonMmeClient("local", routes_url=ROUTES_URL, runtime=runtime,
                                     s3=make_s3_client(endpoint_url=proxy.url), refresh_seconds=REFRESH_S)
            samples: dict[str, dict[str, list[list[float]]]] = {
                name: {"client": [], "hand": [], "client_reading_routes": []} for name in specs}
            span_start = time.perf_counter()
            client.models()  # the first read of the routes: inside the span
            for _ in range(ctx.repeats):
                for name in specs:
                    body, content_type = bodies[name]
                    target = checked[name]["target_model"]

                    def by_hand(target: str = target, body: bytes = body, content_type: str = content_type) -> None:
                        runtime.invoke_endpoint(EndpointName="local", TargetModel=target, ContentType=content_type,
                                                Body=body)["Body"].read()

                    run = _alternate(partial(client.infer, name, inputs[name]), by_hand, client.resolver,
                                     budget, MIN_PAIRS)
                    for label, values in run.items():
                        samples[name][label].append(values)
            span = time.perf_counter() - span_start
            resolver = client.resolver
            s3_reads: dict[str, Any] = {"resolver_new": resolver.reads, "resolver_not_modified": resolver.not_modified,
                        "resolver_total": resolver.requests}
            seen = [r for r in proxy.records if r.method == "GET" and ROUTES_KEY in r.target]
            s3_reads.update(proxy_total=len(seen), proxy_200=sum(1 for r in seen if r.status == 200),
                            proxy_304=sum(1 for r in seen if r.status == 304),
                            proxy_other_requests=len(proxy.records) - len(seen))
            work = {name: _client_work(client, name, inputs[name], checked[name]["answer"],
                                       checked[name]["answer_type"], max(budget / 3, 0.05)) for name in specs}
            calls = client.retries, client.reroutes

    per_model: dict[str, Any] = {}
    for name in specs:
        runs = samples[name]
        pooled = {side: [s for values in runs[side] for s in values] for side in ("client", "hand")}
        reading = [s for values in runs["client_reading_routes"] for s in values]
        # Calls i of both sides ran next to each other (one pair): their ratio cancels a drift of the
        # machine's speed that the two distributions share.
        pairs = [c / h for c, h in zip(pooled["client"], pooled["hand"], strict=True)]
        per_model[name] = {
            **{k: v for k, v in checked[name].items() if k != "answer"},
            "signature_published": signatures.get(name),
            # Every call's seconds (median = p50 over every call; samples kept to recompute any figure).
            "calls_s": {side: stats(pooled[side]) for side in ("client", "hand")},
            "p99": {side: round(percentile(pooled[side], 99), 6) for side in ("client", "hand")},
            "p50_by_run": {side: stats([percentile(v, 50) for v in runs[side]]) for side in ("client", "hand")},
            "p99_by_run": {side: stats([percentile(v, 99) for v in runs[side]]) for side in ("client", "hand")},
            "pair_ratio": {"median": round(percentile(pairs, 50), 4), "q1": round(percentile(pairs, 25), 4),
                           "q3": round(percentile(pairs, 75), 4), "pairs": len(pairs)},
            "all_calls": {side: _latency(pooled[side]) for side in ("client", "hand")},
            "client_calls_reading_routes": {"calls": len(reading),
                                            "median_s": round(percentile(reading, 50), 6) if reading else None},
            "client_work_s": work[name],
        }
    client_calls = sum(m["all_calls"]["client"]["calls"] for m in per_model.values())
    bound = math.ceil(span / REFRESH_S) + 1
    s3_reads.update(span_s=round(span, 2), client_calls=client_calls, bound=bound,
                    per_1000_calls=round(s3_reads["resolver_total"] * 1000 / client_calls, 2),
                    bound_per_1000_calls=round(bound * 1000 / client_calls, 2))
    result["measurements"] = {"models": per_model, "s3_reads": s3_reads,
                              "client_retries": calls[0], "client_reroutes": calls[1]}
    for name, m in per_model.items():
        result["comparisons"].append(comparison(
            f"p50_{name}", what=f"{name} batch-1 call latency, every call (median = p50; spread: fastest and "
            "slowest call)", unit="s", baseline_label="invoke_endpoint, hand-built body",
            baseline=m["calls_s"]["hand"], candidate_label="TritonMmeClient.infer", candidate=m["calls_s"]["client"],
            lower_is_better=True))
        p99 = {side: {"median": m["p99"][side], "min": m["p99_by_run"][side]["min"],
                      "max": m["p99_by_run"][side]["max"]} for side in ("client", "hand")}
        result["comparisons"].append(comparison(
            f"p99_{name}", what=f"{name} batch-1 call latency, p99 of every call (spread: the runs' p99s)", unit="s",
            baseline_label="invoke_endpoint, hand-built body", baseline=p99["hand"],
            candidate_label="TritonMmeClient.infer", candidate=p99["client"], lower_is_better=True))
    _goals(ctx, result, per_model, s3_reads)
    result["notes"] = [
        "The hand-built side is the floor of any caller: its body is built once, outside the timed calls, and "
        "its answer is read as bytes, not parsed; the client builds the body and decodes the answer on every call.",
        f"refresh_seconds is {REFRESH_S:g} s here (the client's default is 30 s) so that the run spans many refresh "
        "periods; a client call that finds the routes older than that makes the conditional GET itself (the last "
        "table: how many calls did, and their median).",
        f"Client calls retried: {calls[0]}; rerouted: {calls[1]}.",
    ]
    log(f"{NAME}: " + "; ".join(
        f"{n} p50 {m['calls_s']['hand']['median'] * 1000:.2f} -> {m['calls_s']['client']['median'] * 1000:.2f} ms "
        f"(pairs {m['pair_ratio']['median']:.3f}x)" for n, m in per_model.items()) + f"; routes reads {s3_reads['resolver_total']} in {span:.1f} s (bound {bound})")
    return finish_result(result, started)


def _goals(ctx: RunContext, result: dict[str, Any], per_model: dict[str, Any], reads: dict[str, Any]) -> None:
    ratios = {name: m["calls_s"]["client"]["median"] / m["calls_s"]["hand"]["median"] for name, m in per_model.items()}
    worst = max(ratios, key=lambda n: ratios[n])
    met = ratios[worst] <= P50_GOAL
    work = per_model[worst]["client_work_s"]["median"]
    hand_p50 = per_model[worst]["calls_s"]["hand"]["median"]
    extra = per_model[worst]["calls_s"]["client"]["median"] - hand_p50
    result["goals"].append(goal(
        "client_p50", "the client's p50 per call against invoke_endpoint with a hand-built body (same target, "
        "same request bytes, batch 1)",
        target=f"<= {P50_GOAL:g}x, every model", measured=round(ratios[worst], 3), met=met,
        detail=f"client p50 / hand-built p50 over every call; worst: {worst}; "
               + ", ".join(f"{n} {r:.3f}x (median of per-pair ratios {per_model[n]['pair_ratio']['median']:.3f}x)"
                           for n, r in ratios.items())
               + f"; the client's own work per call (route, check, encode, decode) {work * 1e6:.0f} us on {worst}",
        limit="" if met else
        f"on {worst} the client's p50 is {extra * 1e3:.2f} ms above the hand-built call's {hand_p50 * 1e3:.2f} ms; its "
        f"own work outside the call measures {work * 1e3:.3f} ms, the median of per-pair ratios is "
        f"{per_model[worst]['pair_ratio']['median']:.3f}x; load average {result['machine']['load_average_start']} "
        f"at the start on {result['machine']['cores']} cores",
        not_judged="a tiny run times too few calls for a 10% difference" if ctx.tiny else ""))
    counted = max(reads["resolver_total"], reads["proxy_total"])
    agree = reads["resolver_total"] == reads["proxy_total"]
    result["goals"].append(goal(
        "routes_reads", f"S3 reads of the routes document (GETs, 304s included) at most one per refresh_seconds "
        f"({REFRESH_S:g} s here) of the calls' wall time",
        target=f"<= ceil(span / {REFRESH_S:g} s) + 1", measured=f"{counted} in {reads['span_s']:.1f} s",
        met=counted <= reads["bound"] and agree,
        detail=f"bound {reads['bound']}; resolver {reads['resolver_total']} ({reads['resolver_new']} new, "
               f"{reads['resolver_not_modified']} not modified), moto's server (proxy) {reads['proxy_total']} "
               f"({reads['proxy_200']} x 200, {reads['proxy_304']} x 304); {reads['per_1000_calls']:g} per 1,000 "
               f"calls over {reads['client_calls']} client calls",
        limit="" if counted <= reads["bound"] and agree else
        "the resolver read the routes more often than refresh_seconds allows, or its count and the server's disagree"))


def chart(result: dict[str, Any], path: Path) -> None:
    from benchmarks._charts import BASELINE, CANDIDATE, LIMIT, figure, save

    fig, axes = figure(2, TITLE.split(":")[0], width=6.0)
    models = result["measurements"]["models"]
    names = list(models)
    x = np.arange(len(names))
    for offset, quantile, side, color, hatch in ((-0.3, "p50", "hand", BASELINE, ""),
                                                 (-0.1, "p50", "client", CANDIDATE, ""),
                                                 (0.1, "p99", "hand", BASELINE, "//"),
                                                 (0.3, "p99", "client", CANDIDATE, "//")):
        values = [(models[n]["calls_s"][side]["median"] if quantile == "p50" else models[n]["p99"][side]) * 1000
                  for n in names]
        axes[0].bar(x + offset, values, 0.2, color=color, hatch=hatch,
                    label=f"{quantile} {'hand-built' if side == 'hand' else 'client'}")
    axes[0].set_xticks(x, names)
    axes[0].set_ylabel("ms per call (every call)")
    axes[0].legend(fontsize=8)
    axes[0].set_title("batch-1 latency, same target and bytes")
    reads = result["measurements"]["s3_reads"]
    bars = axes[1].bar(["resolver", "moto's server"], [reads["resolver_total"], reads["proxy_total"]], color=CANDIDATE)
    axes[1].axhline(reads["bound"], color=LIMIT, linestyle="--", label=f"bound ceil(T/R)+1 = {reads['bound']}")
    axes[1].set_ylabel("GETs of the routes (304s included)")
    axes[1].set_title(f"{reads['client_calls']} calls in {reads['span_s']:.0f} s, refresh {REFRESH_S:g} s")
    axes[1].legend(fontsize=8)
    for bar in bars:
        axes[1].annotate(str(int(bar.get_height())), (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                         ha="center", va="bottom", fontsize=8)
    save(fig, path)


def markdown(result: dict[str, Any]) -> str:
    from benchmarks._common import spread_text
    from benchmarks.report import table

    m = result["measurements"]
    rows = []
    for name, item in m["models"].items():
        calls, p99, pair = item["calls_s"], item["p99"], item["pair_ratio"]
        rows.append([
            f"`{name}`", f"{item['request_bytes']:,} B",
            f"{calls['hand']['median'] * 1000:.2f} ms", f"{calls['client']['median'] * 1000:.2f} ms",
            f"**{calls['client']['median'] / calls['hand']['median']:.3f}x**",
            f"{pair['median']:.3f}x ({pair['q1']:.2f} to {pair['q3']:.2f})",
            f"{p99['hand'] * 1000:.1f} ms", f"{p99['client'] * 1000:.1f} ms", f"{p99['client'] / p99['hand']:.3f}x",
            f"{item['client_work_s']['median'] * 1e6:.0f} us", f"{calls['hand']['n']} / {calls['client']['n']}",
        ])
    by_run = [[f"`{name}`", spread_text(item["p50_by_run"]["hand"], "ms", 1000),
               spread_text(item["p50_by_run"]["client"], "ms", 1000),
               spread_text(item["p99_by_run"]["hand"], "ms", 1000), spread_text(item["p99_by_run"]["client"], "ms", 1000)]
              for name, item in m["models"].items()]
    reads = m["s3_reads"]
    return "\n".join([
        f"Path: {result['parameters']['path']}. Batch 1, binary wire; sides alternate call by call "
        f"({result['parameters']['alternation']}). The hand-built side sends bytes built once and reads the "
        "answer's bytes; the client resolves, checks, encodes and decodes on every call.",
        "",
        table(["model", "request", "p50 by hand", "p50 client", "client / hand (p50)",
               "client / hand per pair (median, quartiles)", "p99 by hand", "p99 client", "client / hand (p99)",
               "client's own work per call", "calls (hand / client)"], rows),
        "",
        "Every call of each side counts (p50 and p99 over all of them). Per pair: a client call and the hand call "
        "next to it, their ratio. The same calls run by run (p50 and p99 of each run, median and range of the "
        f"{result['parameters']['repeats']} runs):",
        "",
        table(["model", "p50 by hand", "p50 client", "p99 by hand", "p99 client"], by_run),
        "",
        table(["routes reads (refresh_seconds " + f"{REFRESH_S:g} s)", "resolver", "moto's server (proxy)", "bound"], [
            [f"{reads['client_calls']} client calls in {reads['span_s']:.1f} s",
             f"{reads['resolver_total']} ({reads['resolver_new']} new, {reads['resolver_not_modified']} x 304)",
             f"{reads['proxy_total']} ({reads['proxy_200']} x 200, {reads['proxy_304']} x 304)", str(reads["bound"])],
            ["per 1,000 calls", f"{reads['per_1000_calls']:g}", "", f"{reads['bound_per_1000_calls']:g}"]]),
        "",
        table(["model", "client calls that read the routes", "their median"], [
            [f"`{name}`", str(item["client_calls_reading_routes"]["calls"]),
             "" if item["client_calls_reading_routes"]["median_s"] is None else
             f"{item['client_calls_reading_routes']['median_s'] * 1000:.2f} ms"] for name, item in m["models"].items()]),
    ])
