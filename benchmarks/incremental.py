"""Incremental release of a 1000-entry manifest where one entry changes.

A manifest of 1000 distinct models (``model-0000`` ... , synthetic ResNets that differ by seed)
is published once; then one entry changes (its ``max_batch_size``) and the new release is
published the way the stack's state machine and the CLI do it: build what has no stored key,
store it, copy the changed model into the served prefix under its new name (the unchanged ones
keep theirs), index last. Measured at moto's S3 server
on loopback, behind the counting proxy of ``tests/s3_faults.py``:

- models built (keys not in the store, computed as the plan step computes them);
- objects uploaded and copied server-side, and body bytes sent (on the wire, at the proxy);
- wall time of the release step.

Baseline: the behaviour before incremental builds, measured the same way: a new release
rebuilds every model and uploads every model's bytes (``publish_release`` of all 1000
artifacts into the new prefix).

Only one model is really built (with the project's build) and timed; the 1000 stored builds
are copies of its bytes (the bytes do not change what S3 does). A full build's wall time is
projected, not measured: ``ceil(models / concurrency)`` rounds of the median measured per-model
time, plus the measured assembly; a Lambda run's cold start and the Map's own overhead are not
in it.

The synthetic ResNet builds in about a second, far less than a real NLP model, so the projection
is also given from the default manifest's MiniLM entry (``minilm-l6-embedding``): one real build
of it, timed after the imports are paid (the full run), or, in a ``--tiny`` run, the ``seconds``
of that model in an existing ``build/<release>/build.json`` (none: not projected). Same formula,
the MiniLM time in place of the ResNet's: 1000 MiniLM-sized models.
"""

from __future__ import annotations

import copy
import math
import time
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

from benchmarks._common import ROOT, RunContext, finish_result, goal, log, new_result, stats, timed
from benchmarks._s3_server import S3Side, empty_bucket

NAME = "incremental"
TITLE = "A 1000-entry manifest where one entry changes"
#: Models in the manifest. The full-build goals are stated at 1000 models; a run at fewer leaves
#: them unjudged. The whole benchmark takes about two minutes at 1000 models on two cores, so a
#: quick run keeps the full size.
SIZES: dict[str, dict[str, Any]] = {
    "tiny": {"models": 5},
    "quick": {"models": 1000},
    "full": {"models": 1000},
}
CONCURRENCIES = (10, 50, 100)
PREFIX = "models"
#: The default manifest's entry whose build time stands for a real NLP model in the projection.
MINILM_MODEL = "minilm-l6-embedding"


def _projection(count: int, per_model_s: float, assembly_s: float) -> dict[str, dict[str, float]]:
    """``ceil(count / c)`` rounds of ``per_model_s`` plus the assembly, for each concurrency."""
    return {
        str(c): {"rounds": math.ceil(count / c), "seconds": round(math.ceil(count / c) * per_model_s + assembly_s, 1)}
        for c in CONCURRENCIES
    }


def _minilm_build_seconds(ctx: RunContext) -> dict[str, Any]:
    """The per-model build time of the default manifest's MiniLM entry: measured (a full run)
    or read from an existing build record (a ``--tiny`` run never builds it)."""
    import json

    from triton_mme_cdk.model_build.manifest import load_manifest

    if ctx.tiny:
        for record in sorted((ROOT / "build").glob("r-*/build.json")):
            for model in json.loads(record.read_text()).get("models", []):
                if model.get("name") == MINILM_MODEL and model.get("seconds"):
                    return {"model": MINILM_MODEL, "seconds": float(model["seconds"]),
                            "source": f"build record {record.relative_to(ROOT)}"}
        return {"model": MINILM_MODEL, "seconds": None, "source": "not measured (--tiny, no build record)"}
    from triton_mme_cdk.model_build.pipeline import BuildOptions, build_model

    spec = next(m for m in load_manifest(ROOT / "models.yaml").models if m.name == MINILM_MODEL)
    seconds, _ = timed(lambda: build_model(spec, BuildOptions(base_dir=ROOT), release_dir=ctx.scratch("incremental-minilm"),
                                           work_dir=ctx.scratch("incremental-minilm-work")))
    log(f"{NAME}: {MINILM_MODEL} builds in {seconds:.1f} s")
    return {"model": MINILM_MODEL, "seconds": round(seconds, 2), "source": "measured: one build, imports paid"}


def _manifest(count: int, *, tiny_model: bool) -> dict[str, Any]:
    config = ({"embedding_size": 8, "hidden_sizes": [8, 8], "depths": [1, 1]} if tiny_model
              else {"embedding_size": 16, "hidden_sizes": [16, 32, 64, 128], "depths": [1, 1, 1, 1]})
    return {
        "version": 1,
        "models": [
            {
                "name": f"model-{i:04d}",
                "source": {"kind": "synthetic", "architecture": "resnet", "seed": i, "config": config},
                "task": "image-classification",
                "max_batch_size": 8,
                "image": {"image_size": 64, "channels": 3},
            }
            for i in range(count)
        ],
    }


def _as_key(artifact: Any, name: str, targets: tuple[str, ...]) -> Any:
    from dataclasses import replace

    return replace(artifact, name=name, targets=targets)


def run(ctx: RunContext) -> dict[str, Any]:
    from triton_mme_cdk.model_build.aws_clients import make_s3_client
    from triton_mme_cdk.model_build.manifest import parse_manifest
    from triton_mme_cdk.model_build.release import compute_release, store_prefix
    from triton_mme_cdk.model_build.release.publish import delete_release, publish_release
    from triton_mme_cdk.model_build.release.serving import activate_release
    from triton_mme_cdk.model_build.release.store import (
        ReleaseTarget,
        publish_incremental,
        publish_unit,
        stored_keys,
    )

    started = time.perf_counter()
    count = int(ctx.sizes(SIZES)["models"])
    full_count = int(SIZES["full"]["models"])
    data = _manifest(count, tiny_model=ctx.tiny)
    first = parse_manifest(data)
    changed_data = copy.deepcopy(data)
    changed_index = count // 2
    changed_data["models"][changed_index]["max_batch_size"] = 4
    second = parse_manifest(changed_data)
    release_1 = compute_release(first, base_dir=ROOT)
    release_2 = compute_release(second, base_dir=ROOT)
    changed_name = second.models[changed_index].name
    result = new_result(NAME, TITLE, ctx, {
        "models": count,
        "changed_model": changed_name,
        "change": "max_batch_size 8 -> 4",
        "concurrencies_projected": list(CONCURRENCIES),
        "repeats": ctx.repeats,
        "endpoint": "moto S3 server on 127.0.0.1 behind tests/s3_faults.FaultProxy (0 ms added), in a "
                    "child process",
        "baseline": "every model rebuilt and every tarball uploaded to the new prefix (publish_release)",
        "candidate": "build the keys not stored, publish_incremental (store + server-side copies)",
    })

    # The one real build, timed: the per-model time of the projection.
    from triton_mme_cdk.model_build.pipeline import BuildOptions, build_model

    spec = second.models[changed_index]
    build_times: list[float] = []
    built = None
    if not ctx.tiny:  # a first build pays the imports of torch and ONNX: not a per-model cost
        build_model(spec, BuildOptions(base_dir=ROOT), release_dir=ctx.scratch("incremental-warmup"),
                    work_dir=ctx.scratch("incremental-work"))
    for run_index in range(ctx.repeats):
        out = ctx.scratch(f"incremental-build-{run_index}")
        seconds, built = timed(partial(build_model, spec, BuildOptions(base_dir=ROOT), release_dir=out,
                                               work_dir=ctx.scratch("incremental-work")))
        build_times.append(seconds)
    assert built is not None
    artifact = built.artifact(out)
    log(f"{NAME}: one model builds in {min(build_times):.1f} s; tarball {artifact.size} bytes")

    keys_1, keys_2 = dict(release_1.model_keys), dict(release_2.model_keys)
    to_build = [name for name in keys_2 if keys_2[name] not in set(keys_1.values())]
    assert to_build == [changed_name], to_build

    with S3Side(str(ROOT / "tests")) as s3_side:
        url = s3_side.start_proxy(0.0)
        client = make_s3_client(endpoint_url=url)
        incremental_s: list[float] = []
        baseline_s: list[float] = []
        wire: dict[str, Any] = {}
        bucket = "bench-inc"
        client.create_bucket(Bucket=bucket)
        # The earlier release's builds are in the store (seeded once, in parallel; not measured)...
        with ThreadPoolExecutor(max_workers=8) as pool:
            list(pool.map(lambda s1: publish_unit(_as_key(artifact, s1.name, (s1.name,)), keys_1[s1.name],
                                                  s3_client=client, bucket=bucket, model_prefix=PREFIX),
                          first.models))
        # ... and served: assembled into the served prefix and routed, the live fleet a one-entry
        # change meets (not measured). Seeding the store alone, the first repeat copied every model
        # (nothing was served yet) and the later ones found what the first had copied.
        publish_incremental([(_as_key(artifact, s1.name, (s1.name,)), keys_1[s1.name]) for s1 in first.models],
                            ReleaseTarget.of(release_1, client, bucket, PREFIX))
        activate_release(client, bucket, PREFIX, release_1.release_id)
        log(f"{NAME}: {count} stored builds seeded ({time.perf_counter() - started:.0f} s into the benchmark)")
        for run_index in range(ctx.repeats):
            stored = stored_keys(client, bucket, PREFIX)  # one LIST, as the plan step lists the store
            planned = [name for name in keys_2 if keys_2[name] not in stored]
            assert planned == [changed_name], planned
            s3_side.reset()
            seconds, report = timed(lambda: publish_incremental(
                [(_as_key(artifact, s.name, (s.name,)), keys_2[s.name]) for s in second.models],
                ReleaseTarget.of(release_2, client, bucket, PREFIX),
            ))
            wire = s3_side.stats()
            wire["report"] = {"uploaded": report.uploaded, "copied": report.copied, "bytes_sent": report.bytes_sent}
            incremental_s.append(seconds)
            # Undo what the run added (the new store entry and the release) for the next repeat.
            for prefix in (store_prefix(PREFIX, keys_2[changed_name]), release_2.prefix(PREFIX)):
                delete_release(client, bucket, prefix)

            # Baseline: every model's bytes go to the new prefix again.
            full = f"bench-full-{run_index}"
            client.create_bucket(Bucket=full)
            s3_side.reset()
            seconds, _ = timed(partial(
                publish_release,
                [_as_key(artifact, s.name, (s.name,)) for s in second.models], s3_client=client, bucket=full,
                release_prefix=release_2.prefix(PREFIX), index_extra={"release_id": release_2.release_id},
            ))
            baseline_wire = s3_side.stats()
            baseline_s.append(seconds)
            empty_bucket(client, full)
            log(f"{NAME}: run {run_index + 1}/{ctx.repeats}: incremental {incremental_s[-1]:.1f} s, rebuild-all "
                f"upload {seconds:.1f} s ({time.perf_counter() - started:.0f} s into the benchmark)")
        empty_bucket(client, bucket)

    per_model = stats(build_times)
    assembly = stats(incremental_s)
    projection = _projection(count, per_model["median"], assembly["median"])
    minilm = _minilm_build_seconds(ctx)
    minilm_projection = (_projection(count, minilm["seconds"], assembly["median"])
                         if minilm["seconds"] is not None else None)
    sent = int(wire["bytes_uploaded"])
    result["measurements"] = {
        "per_model_build_s": per_model,
        "tarball_bytes": artifact.size,
        "models_built": {"incremental": len(planned), "baseline": count},
        "incremental": {"release_s": assembly, "requests": wire["requests"], "bytes_sent": sent,
                        "report": wire["report"]},
        "baseline": {"publish_s": stats(baseline_s), "requests": baseline_wire["requests"],
                     "bytes_sent": int(baseline_wire["bytes_uploaded"]),
                     "build_s_projected_serial": round(count * per_model["median"], 1)},
        "full_build_projection": projection,
        "minilm_per_model_build_s": minilm,
        "full_build_projection_minilm": minilm_projection,
    }
    result["comparisons"] = [
        {
            "name": "bytes_sent", "what": "body bytes sent for the new release", "unit": "bytes",
            "baseline_label": "rebuild + upload all", "baseline_median": float(baseline_wire["bytes_uploaded"]),
            "baseline_spread": [baseline_wire["bytes_uploaded"]] * 2,
            "candidate_label": "incremental", "candidate_median": float(sent), "candidate_spread": [sent, sent],
            "ratio": round(baseline_wire["bytes_uploaded"] / sent, 1) if sent else None,
            "ratio_definition": "baseline / candidate",
        },
        {
            "name": "models_built", "what": "models built for the new release", "unit": "models",
            "baseline_label": "rebuild all", "baseline_median": float(count), "baseline_spread": [count, count],
            "candidate_label": "incremental", "candidate_median": float(len(planned)),
            "candidate_spread": [len(planned), len(planned)],
            "ratio": float(count) / len(planned), "ratio_definition": "baseline / candidate",
        },
    ]
    copies = wire["requests"].get("COPY", 0)
    at_full = count >= full_count
    # The hour is stated for a full build of the full manifest: at fewer models the projection
    # (fewer rounds, a smaller assembly) would pass for what it does not measure.
    not_judged = "" if at_full else (
        f"stated at {full_count} models; this {ctx.mode} run has {count} (its projection is for {count}); "
        f"`make bench FULL=1` measures it")
    result["goals"] = [
        goal("one_built", "changing 1 of N entries builds 1 model, and copies only its own target into the "
             "served prefix (the N-1 unchanged models keep their served objects)",
             target="1 built, <= 1 copied", measured=f"{len(planned)} built, {copies} copied",
             met=len(planned) == 1 and copies <= 1,
             limit="" if len(planned) == 1 and copies <= 1 else "see the requests: more than the changed model moved"),
        goal("full_build_in_the_hour", f"a full build of {full_count} distinct models fits CloudFormation's hour "
             "at concurrency 50 (projected)", target="< 3600 s",
             measured=f"{projection['50']['seconds']:.0f} s" + ("" if at_full else f" at {count} models"),
             met=projection["50"]["seconds"] < 3600,
             detail="projected: ceil(N / 50) rounds of the median per-model build time measured here, "
                    "plus the measured assembly; no Lambda cold start", not_judged=not_judged),
    ]
    if minilm_projection is not None:
        result["goals"].append(goal(
            "minilm_full_build_in_the_hour", f"a full build of {full_count} MiniLM-sized models fits "
            "CloudFormation's hour at concurrency 50 (projected)", target="< 3600 s",
            measured=f"{minilm_projection['50']['seconds']:.0f} s" + ("" if at_full else f" at {count} models"),
            met=minilm_projection["50"]["seconds"] < 3600,
            detail=f"projected: ceil(N / 50) rounds of {minilm['seconds']:.1f} s ({minilm['source']}), plus the "
                   "measured assembly; no Lambda cold start", not_judged=not_judged))
    result["notes"] = [
        "Only one model is built for real; the stored builds of the other models reuse its bytes "
        "(what S3 does does not depend on them).",
        "Per-model time is measured on this machine's CPU; a Lambda with build_memory_mb 6144 has "
        "about 3.5 vCPUs, so its time may differ.",
    ]
    return finish_result(result, started)


def chart(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    m = result["measurements"]
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.5))
    axes[0].bar(["rebuild all", "incremental"], [m["baseline"]["bytes_sent"], m["incremental"]["bytes_sent"]])
    axes[0].set_yscale("log")
    axes[0].set_ylabel("bytes sent")
    proj = m["full_build_projection"]
    axes[1].bar([f"c={c}" for c in proj], [v["seconds"] for v in proj.values()])
    axes[1].axhline(3600, color="red", linestyle="--", label="CloudFormation hour")
    axes[1].set_ylabel("projected full build (s)")
    axes[1].legend()
    fig.suptitle(result["title"])
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def markdown(result: dict[str, Any]) -> str:
    from benchmarks.report import table

    p, m = result["parameters"], result["measurements"]
    inc, base = m["incremental"], m["baseline"]
    rows = [
        ["models built", str(m["models_built"]["baseline"]), str(m["models_built"]["incremental"])],
        ["objects uploaded (PUT)", str(base["requests"].get("PUT", 0)), str(inc["requests"].get("PUT", 0))],
        ["objects copied server-side", str(base["requests"].get("COPY", 0)), str(inc["requests"].get("COPY", 0))],
        ["bytes sent", str(base["bytes_sent"]), str(inc["bytes_sent"])],
        ["S3 step wall time (median)", f"{base['publish_s']['median']:.2f} s", f"{inc['release_s']['median']:.2f} s"],
        ["build time (serial, projected)", f"{base['build_s_projected_serial']:.0f} s",
         f"{m['per_model_build_s']['median']:.1f} s (measured)"],
    ]
    minilm = m.get("minilm_per_model_build_s") or {}
    by_minilm = m.get("full_build_projection_minilm") or {}
    projection = [[c, str(v["rounds"]), f"{v['seconds']:.0f} s",
                   f"{by_minilm[c]['seconds']:.0f} s" if c in by_minilm else "not measured"]
                  for c, v in m["full_build_projection"].items()]
    minilm_line = (f"MiniLM column: {minilm.get('model')} builds in {minilm['seconds']:.1f} s "
                   f"({minilm.get('source')}), same formula." if minilm.get("seconds") is not None
                   else f"MiniLM column: {minilm.get('source', 'not measured')}.")
    return "\n".join([
        f"{p['models']} distinct models; `{p['changed_model']}` changes ({p['change']}). Endpoint: "
        f"{p['endpoint']}. Baseline: {p['baseline']}. Project: {p['candidate']}. Tarball "
        f"{m['tarball_bytes']} bytes; one model builds in {m['per_model_build_s']['median']:.1f} s here.",
        "",
        table(["", "rebuild everything", "incremental"], rows),
        "",
        "Projected wall time of a **full** build (every model new) on the state machine: "
        "`ceil(models / concurrency)` rounds of the measured per-model time plus the measured "
        "assembly; Lambda cold starts are not included. " + minilm_line,
        "",
        table(["MaxConcurrency", "rounds", "projected (synthetic ResNet)", "projected (MiniLM)"], projection),
    ])
