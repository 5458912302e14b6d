"""Models on a live fleet: a model added under steady load, and a one-model change at scale.

**Added under load.** Two models are served by the local endpoint (the real ``tritonserver``
behind the SageMaker MME API, serving the fixed prefix) while two clients keep invoking them.
A third model is then published the way the stack publishes it (stored build, server-side copy
into the served prefix under its content name, routes written last) and invoked as soon as the
routes say so. Measured: requests that failed (goal 0), p99 latency of the steady models while
the change lands against before it (goal <= 1.5x), seconds from the publish to the new model's
first answer. **The old way**, for comparison: the same three models under a new release prefix
and the endpoint restarted on it (what a new ``ModelDataUrl`` means for a fleet), with the same
clients running: requests failed, and seconds until every model answers again. (A tiny run, the
test suite's, serves one steady model to one client: the same code, two cold loads fewer.)

**A one-model change at scale.** ``N`` models (3000 in a full run) are stored and routed; then
one model changes and the change is published and routed. Measured at moto's S3 server on
loopback: objects copied server-side (the changed model's own target is one copy, store ->
served name; the goal is 0 copies of the N-1 unchanged models), objects uploaded, and seconds.
The old per-release layout copied every target into the new prefix: that copy is measured too.
The stored builds are small generated tarballs: what S3 does does not depend on their bytes.
"""

from __future__ import annotations

import copy
import hashlib
import socket
import threading
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks._common import (
    RunContext,
    finish_result,
    goal,
    log,
    manifest_entry,
    new_result,
    percentile,
    spec_from,
    tiny_resnet_entry,
)

NAME = "live_fleet"
TITLE = "Models on a live fleet: one model added under load, and a one-model change at scale"
BUCKET = "bench-live"
PREFIX = "models"
BINARY = "application/vnd.sagemaker-triton.binary+json;json-header-size={}"
P99_GOAL = 1.5
#: Seconds of steady load before and after the model is added, and models in the store for the
#: one-model change. A quick run keeps more than 1000 models, so every listing of the store and
#: of the served prefix still spans more than one page (S3 returns at most 1000 keys a page). A
#: tiny run keeps half a second of load on each side of the change (a hundred requests or more).
SIZES: dict[str, dict[str, Any]] = {
    "tiny": {"phase_s": 0.5, "models_at_scale": 5},
    "quick": {"phase_s": 6.0, "models_at_scale": 1200},
    "full": {"phase_s": 10.0, "models_at_scale": 3000},
}


def _entry(ctx: RunContext, name: str, seed: int) -> dict[str, Any]:
    """The default manifest's ResNet entry under another name and seed (tiny: a tiny ResNet)."""
    entry = manifest_entry("resnet-synthetic")
    entry.update(name=name, copies=1)
    entry["source"] = dict(entry["source"], seed=seed)
    if ctx.tiny:
        entry = tiny_resnet_entry(entry, 32)
    return entry


def _body(image: int) -> tuple[bytes, str]:
    import tritonclient.http as httpclient

    tensor = httpclient.InferInput("pixel_values", [1, 3, image, image], "FP32")
    tensor.set_data_from_numpy(np.random.default_rng(0).random((1, 3, image, image), dtype=np.float32))
    body, header = httpclient.InferenceServerClient.generate_request_body(
        [tensor], outputs=[httpclient.InferRequestedOutput("logits", binary_data=True)])
    return body, BINARY.format(header)


class Load:
    """Closed-loop clients invoking fixed targets; every request's start, latency and outcome."""

    def __init__(self, url: str, targets: list[str], body: bytes, content_type: str) -> None:
        self.url, self.targets, self.body, self.content_type = url, targets, body, content_type
        self.samples: list[tuple[float, float, bool]] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._client, args=(target,), daemon=True) for target in targets]

    def _client(self, target: str) -> None:
        from triton_mme_cdk.model_build.tools.smoke.prepare import make_runtime_client

        runtime = make_runtime_client(endpoint_url=self.url, timeout_seconds=60)
        deadline = time.monotonic() + 900  # bounded whatever happens
        while not self._stop.is_set() and time.monotonic() < deadline:
            started = time.monotonic()
            try:
                runtime.invoke_endpoint(EndpointName="local", TargetModel=target, ContentType=self.content_type,
                                        Body=self.body)["Body"].read()
                ok = True
            except Exception:
                ok = False
                time.sleep(0.05)  # a refused connection returns at once: do not spin
            self.samples.append((started, time.monotonic() - started, ok))

    def __enter__(self) -> Load:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=120)

    def window(self, start: float, end: float) -> list[tuple[float, float, bool]]:
        return [s for s in self.samples if start <= s[0] < end]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_answer(invoke: Callable[[], Any], limit_s: float = 300.0) -> float:
    """Seconds until ``invoke`` succeeds (retried every 50 ms)."""
    started = time.monotonic()
    while True:
        try:
            invoke()
            return time.monotonic() - started
        except Exception:
            if time.monotonic() - started > limit_s:
                raise
            time.sleep(0.05)


def _under_load(ctx: RunContext) -> dict[str, Any]:
    from triton_mme_cdk.model_build.aws_clients import make_s3_client
    from triton_mme_cdk.model_build.manifest import parse_manifest
    from triton_mme_cdk.model_build.release import compute_release
    from triton_mme_cdk.model_build.release.index import read_routes
    from triton_mme_cdk.model_build.release.publish import publish_release
    from triton_mme_cdk.model_build.release.serving import activate_release
    from triton_mme_cdk.model_build.release.store import ReleaseTarget, publish_incremental
    from triton_mme_cdk.model_build.tools.local_endpoint.server import local_endpoint
    from triton_mme_cdk.model_build.tools.local_s3 import local_s3
    from triton_mme_cdk.model_build.tools.smoke.prepare import make_runtime_client

    phase = float(ctx.sizes(SIZES)["phase_s"])
    # A tiny run keeps one steady model (one client): each model is a cold load on both endpoints.
    names = ["steady-a"] if ctx.tiny else ["steady-a", "steady-b"]
    entries = [*(_entry(ctx, name, seed) for seed, name in enumerate(names)), _entry(ctx, "added", 2)]
    specs = [spec_from(entry) for entry in entries]
    built = {spec.name: ctx.build(spec) for spec in specs}
    image = specs[0].image_inputs.image_size
    body, content_type = _body(image)

    def deploy(s3: Any, names: list[str]) -> dict[str, str]:
        manifest = parse_manifest({"version": 1, "models": [copy.deepcopy(e) for e in entries if e["name"] in names]})
        release = compute_release(manifest)
        units = [(built[n][0].artifact(built[n][1]), release.model_keys[n]) for n in names]
        publish_incremental(units, ReleaseTarget.of(release, s3, BUCKET, PREFIX))
        activate_release(s3, BUCKET, PREFIX, release.release_id)
        routes = read_routes(s3, BUCKET, PREFIX)
        assert routes is not None
        return {name: route.target_model for name, route in routes.routes.items()}

    port = _free_port()
    out: dict[str, Any] = {"phase_s": phase, "image_size": image, "clients": len(names)}
    with local_s3() as url:
        s3 = make_s3_client(endpoint_url=url)
        s3.create_bucket(Bucket=BUCKET)
        first = deploy(s3, names)
        steady = [first[name] for name in names]
        with local_endpoint(s3_client=s3, bucket=BUCKET, model_prefix=PREFIX, port=port) as endpoint:
            runtime = make_runtime_client(endpoint_url=endpoint.url, timeout_seconds=120)
            for target in steady:  # loaded and warm before the measurement
                runtime.invoke_endpoint(EndpointName="local", TargetModel=target, ContentType=content_type, Body=body)
            loads = endpoint.cache.loads
            with Load(endpoint.url, steady, body, content_type) as load:
                time.sleep(phase)
                published = time.monotonic()
                second = deploy(s3, [*names, "added"])
                routed = time.monotonic()
                first_answer = _wait_answer(lambda: runtime.invoke_endpoint(
                    EndpointName="local", TargetModel=second["added"], ContentType=content_type, Body=body))
                answered = time.monotonic()
                time.sleep(phase)
            before = load.window(published - phase, published)
            during = load.window(published, answered + phase)
            out["add"] = {
                "publish_and_route_s": round(routed - published, 3),
                "publish_to_first_answer_s": round(answered - published, 3),
                "first_answer_after_routing_s": round(first_answer, 3),
                "requests_before": len(before), "requests_during": len(during),
                "failed": sum(1 for s in load.samples if not s[2]),
                "p99_before_s": round(percentile([s[1] for s in before if s[2]], 99), 4),
                "p99_during_s": round(percentile([s[1] for s in during if s[2]], 99), 4),
                "steady_reloads": endpoint.cache.loads - loads - 1,  # the added model's own load aside
            }
        # The old way: the same models under a new release prefix, the endpoint restarted on it.
        release_id = "r-00000000000001d0"
        publish_release([built[n][0].artifact(built[n][1]) for n in built], s3_client=s3, bucket=BUCKET,
                        release_prefix=f"{PREFIX}/{release_id}", index_extra={"release_id": release_id})
        old_way = Load(f"http://127.0.0.1:{port}", [f"{n}.tar.gz" for n in names], body,
                       content_type)
        with old_way:
            stopped = time.monotonic()
            with local_endpoint(s3_client=s3, bucket=BUCKET, release_id=release_id, port=port) as endpoint:
                runtime = make_runtime_client(endpoint_url=endpoint.url, timeout_seconds=120)
                for name in built:
                    _wait_answer(partial(runtime.invoke_endpoint,
                                         EndpointName="local", TargetModel=f"{name}.tar.gz",
                                         ContentType=content_type, Body=body))
                serving = time.monotonic()
                time.sleep(0.5)
        out["old_way"] = {
            "restart_to_all_answering_s": round(serving - stopped, 3),
            "failed": sum(1 for s in old_way.samples if not s[2]),
            "requests": len(old_way.samples),
        }
    log(f"{NAME}: added under load: {out['add']}; old way: {out['old_way']}")
    return out


def _payload(i: int, version: int) -> bytes:
    return hashlib.sha256(f"{i}:{version}".encode()).digest() * 64  # 2 KiB, distinct per model and version


def _at_scale(ctx: RunContext, count: int) -> dict[str, Any]:
    from concurrent.futures import ThreadPoolExecutor

    from triton_mme_cdk.model_build.aws_clients import make_s3_client
    from triton_mme_cdk.model_build.release import Release, served_prefix
    from triton_mme_cdk.model_build.release.serving import activate_release
    from triton_mme_cdk.model_build.release.store import (
        ReleaseTarget,
        StoredModel,
        assemble_release,
        copy_served,
        publish_from_store,
        publish_unit,
        served_object,
    )
    from triton_mme_cdk.model_build.tools.local_s3 import local_s3
    from triton_mme_cdk.model_build.types import Artifact

    work = ctx.scratch("live-fleet-scale")

    def artifact(i: int, version: int) -> tuple[Artifact, str]:
        data = _payload(i, version)
        path = work / f"m{i:05d}-{version}.tar.gz"
        path.write_bytes(data)
        digest = hashlib.sha256(data).hexdigest()
        name = f"model-{i:05d}"
        return Artifact(name=name, format="onnx", path=path, sha256=digest, size=len(data), targets=(name,)), \
            "k-" + digest[:32]

    units = [artifact(i, 0) for i in range(count)]
    out: dict[str, Any] = {"models": count, "changes": []}
    with local_s3() as url:
        s3 = make_s3_client(endpoint_url=url)
        s3.create_bucket(Bucket=BUCKET)
        seeded = time.monotonic()
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda u: publish_unit(u[0], u[1], s3_client=s3, bucket=BUCKET, model_prefix=PREFIX), units))
        models = [StoredModel(a.name, key, a.targets, a.format, entry_sha256=key) for a, key in units]
        assemble_release(models, ReleaseTarget.of(Release("r-0000000000000000", "0" * 64, "c" * 64), s3, BUCKET, PREFIX))
        activate_release(s3, BUCKET, PREFIX, "r-0000000000000000")
        out["seed_s"] = round(time.monotonic() - seeded, 1)
        for repeat in range(ctx.repeats):
            changed = (repeat + 1) * count // (ctx.repeats + 1)
            units[changed] = artifact(changed, repeat + 1)
            models[changed] = StoredModel(units[changed][0].name, units[changed][1], units[changed][0].targets,
                                          "onnx", entry_sha256=units[changed][1])
            release = Release(f"r-{repeat + 1:016x}", "0" * 64, "c" * 64)
            started = time.monotonic()
            report = publish_from_store(models, {units[changed][1]: units[changed][0]},
                                        ReleaseTarget.of(release, s3, BUCKET, PREFIX))
            routed = activate_release(s3, BUCKET, PREFIX, release.release_id)
            seconds = time.monotonic() - started
            out["changes"].append({"model": units[changed][0].name, "seconds": round(seconds, 3),
                                   "copied": report.copied + routed.copied, "uploaded": report.uploaded,
                                   "copied_unchanged": report.copied + routed.copied - 1})
        # The old per-release layout: every target copied into the new release's prefix.
        started = time.monotonic()
        objects = [served_object(f"{PREFIX}/r-old-layout/{a.name}.tar.gz", a.name, a.name, a.size, a.sha256,
                                 f"{served_prefix(PREFIX)}/{a.name}-{a.sha256[:12]}.tar.gz") for a, _ in units]
        counts, _ = copy_served(s3, BUCKET, objects, {}, 16)
        out["old_layout"] = {"copied": counts["copied"], "seconds": round(time.monotonic() - started, 3)}
    log(f"{NAME}: one-model change at {count} models: {out['changes']}; old layout {out['old_layout']}")
    return out


def run(ctx: RunContext) -> dict[str, Any]:
    started = time.perf_counter()
    count = int(ctx.sizes(SIZES)["models_at_scale"])
    result = new_result(NAME, TITLE, ctx, {
        "models_at_scale": count, "repeats": ctx.repeats,
        "path": "boto3 sagemaker-runtime -> local endpoint (fixed served prefix) -> tritonserver 2.51; "
                "S3: moto's server on 127.0.0.1",
    })
    load = _under_load(ctx)
    scale = _at_scale(ctx, count)
    result["measurements"] = {"under_load": load, "at_scale": scale}
    add = load["add"]
    ratio = add["p99_during_s"] / add["p99_before_s"] if add["p99_before_s"] else None
    copied_unchanged = max(change["copied_unchanged"] for change in scale["changes"])
    seconds = sorted(change["seconds"] for change in scale["changes"])[len(scale["changes"]) // 2]
    result["comparisons"] = [{
        "name": "objects_copied", "what": f"objects copied server-side for a one-model change at {count} models",
        "unit": "objects", "baseline_label": "per-release prefix (earlier layout)",
        "baseline_median": float(scale["old_layout"]["copied"]), "baseline_spread": [scale["old_layout"]["copied"]] * 2,
        "candidate_label": "fixed served prefix",
        "candidate_median": float(max(c["copied"] for c in scale["changes"])),
        "candidate_spread": [min(c["copied"] for c in scale["changes"]), max(c["copied"] for c in scale["changes"])],
        "ratio": round(scale["old_layout"]["copied"] / max(1, max(c["copied"] for c in scale["changes"])), 1),
        "ratio_definition": "baseline / candidate",
    }]
    result["goals"] = [
        goal("add_no_failed_requests", "adding a model to a running fleet fails no request of the other models",
             target="0 failed", measured=add["failed"], met=add["failed"] == 0,
             detail=f"{add['requests_before'] + add['requests_during']} requests measured; the old way (new prefix, "
                    f"endpoint restarted): {load['old_way']['failed']} of {load['old_way']['requests']} failed",
             limit="" if add["failed"] == 0 else "see the log: a steady model's request failed while the change landed"),
        goal("add_p99", "p99 latency of the other models while a model is added, against before",
             target=f"<= {P99_GOAL:g}x", measured=round(ratio, 2) if ratio is not None else None,
             met=ratio is not None and ratio <= P99_GOAL,
             detail=f"p99 {add['p99_before_s'] * 1000:.1f} ms before, {add['p99_during_s'] * 1000:.1f} ms during; "
                    f"publish to first answer of the new model {add['publish_to_first_answer_s']:.2f} s",
             limit="" if ratio is not None and ratio <= P99_GOAL else
             "2 cores run the clients, the endpoint, tritonserver, the new model's load (a python stub process "
             "importing its runtime) and the S3 server at once; on SageMaker the load runs on the instance only"),
        goal("scale_copies_unchanged", f"a one-model change at {count} models copies nothing of the unchanged models",
             target="0 copies of unchanged models", measured=copied_unchanged, met=copied_unchanged == 0,
             detail=f"the changed model's own target is one server-side copy (store -> its new served name); "
                    f"median {seconds:.2f} s for the publish and routing; the earlier per-release layout copied "
                    f"{scale['old_layout']['copied']} objects ({scale['old_layout']['seconds']:.1f} s)"),
    ]
    result["notes"] = [
        "Failed requests count every steady-model request the "
        + ("two clients" if load["clients"] == 2 else f"{load['clients']} client(s)")
        + " sent from the start of the load to its end.",
        "The old way restarts the endpoint on a new prefix: every model loads cold again on the new fleet.",
    ]
    return finish_result(result, started)


def chart(result: dict[str, Any], path: Path) -> None:
    from benchmarks._charts import figure, save

    fig, axes = figure(2, TITLE.split(":")[0])
    add, old = result["measurements"]["under_load"]["add"], result["measurements"]["under_load"]["old_way"]
    axes[0].bar(["p99 before", "p99 during add"], [add["p99_before_s"] * 1000, add["p99_during_s"] * 1000])
    axes[0].set_ylabel("ms")
    axes[0].set_title(f"steady models; failed: {add['failed']} (old way: {old['failed']})")
    comp = result["comparisons"][0]
    axes[1].bar(["earlier layout", "fixed prefix"], [comp["baseline_median"], comp["candidate_median"]])
    axes[1].set_yscale("symlog")
    axes[1].set_ylabel("objects copied")
    axes[1].set_title(f"one-model change at {result['parameters']['models_at_scale']} models")
    save(fig, path)


def markdown(result: dict[str, Any]) -> str:
    from benchmarks.report import table

    load, scale = result["measurements"]["under_load"], result["measurements"]["at_scale"]
    add, old = load["add"], load["old_way"]
    rows = [
        ["failed requests of the steady models", str(add["failed"]), str(old["failed"])],
        ["seconds until the new model answers", f"{add['publish_to_first_answer_s']:.2f} s (publish + route + cold load)",
         f"{old['restart_to_all_answering_s']:.2f} s (restart + every model cold)"],
        ["steady p99 before / during", f"{add['p99_before_s'] * 1000:.1f} / {add['p99_during_s'] * 1000:.1f} ms", ""],
        ["steady models reloaded", str(add["steady_reloads"]), "all"],
    ]
    changes = [[c["model"], str(c["uploaded"]), str(c["copied"]), str(c["copied_unchanged"]), f"{c['seconds']:.2f} s"]
               for c in scale["changes"]]
    return "\n".join([
        f"Path: {result['parameters']['path']}. Image size {load['image_size']}, {load['clients']} clients, "
        f"{load['phase_s']:g} s of load before and after the change.",
        "",
        table(["", "add a model (fixed prefix, routes)", "old way (new prefix, endpoint restarted)"], rows),
        "",
        f"One-model change at {scale['models']} models (seeded in {scale['seed_s']:.0f} s; the earlier layout "
        f"copied {scale['old_layout']['copied']} objects in {scale['old_layout']['seconds']:.1f} s):",
        "",
        table(["changed model", "uploaded", "copied", "copied (unchanged models)", "publish + route"], changes),
    ])
