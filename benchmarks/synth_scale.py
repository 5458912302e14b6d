"""Synth at scale: the stack with generated manifests of 1, 100 and 1000 distinct models.

The design goal is a stack whose template does not grow with the models: the manifest is an S3
asset read by the build resource, not a resource per model, so CloudFormation's limits (500
resources, 1 MB template) never come near, and synth at 1000 models stays within 1.5x of
1 model. Two paths are timed, each from a cold start of nothing but the app:

- ``cdk synth`` through the pinned CLI (``npx --no-install cdk synth --quiet``), which starts
  Node, runs ``python3 app.py`` and reads the cloud assembly: what a user waits for;
- in-process: ``cdk.App`` + ``app.build_app`` + ``app.synth()`` in this Python process (jsii
  already started): the app's own work without the process start-up.

Each size is compared with the same stack synthesized without a manifest
(``mme:manifest_path=''`` and a fixed ``mme:release_id``), which leaves out the model build
resource and the manifest's validation; the manifest's validation alone
(:func:`model_build.manifest.load_manifest`) is timed too. Generated manifests are written to a
temporary folder and passed with ``-c mme:manifest_path=<file>``.

The pull-request plan is timed here too (issue 34): ``python -m model_build plan`` against a routes
file at 3,000 models (3 in the tiny run), as a CI runs it (a new process, JSON printed, the
markdown written), with the synthesized template given (``--template``: synth excluded, it is
timed above). The goal: within 5 s.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks._common import (
    ROOT,
    RunContext,
    comparison,
    finish_result,
    goal,
    log,
    manifest_entry,
    new_result,
    stats,
    timed,
)

NAME = "synth_scale"
TITLE = "cdk synth with 1, 100 and 1000 models"
#: Manifest sizes and runs per size. Synth time hardly depends on the size (the CLI's start-up is
#: most of it), so a quick run keeps the sizes the goals are stated at and runs each fewer times.
#: A tiny run synthesizes one manifest, of 3 models (one of each entry of models.yaml), and none:
#: every path once (each ``cdk synth`` through the CLI is a Node, Python and jsii start, 6 to 7 s);
#: the comparisons and goals then compare that size with itself.
SIZES: dict[str, dict[str, Any]] = {
    "tiny": {"models": (3,), "cli_repeats": 1, "in_process_repeats": 1},
    "quick": {"models": (1, 100, 1000), "cli_repeats": 3, "in_process_repeats": 3},
    "full": {"models": (1, 100, 1000), "cli_repeats": 5, "in_process_repeats": 5},
}
#: Release served when no manifest is given (any well-formed id: nothing is deployed).
NO_MANIFEST_RELEASE = "r-0000000000000000"
CFN_MAX_RESOURCES = 500
CFN_MAX_TEMPLATE_BYTES = 1_000_000  # "1 MB" for a template uploaded through S3
GOAL_SYNTH_RATIO = 1.5
#: The plan row: models in the routes and the manifest, runs, and the goal (seconds, synth excluded).
PLAN_SIZES: dict[str, dict[str, int]] = {"tiny": {"models": 3, "repeats": 1}, "quick": {"models": 3000, "repeats": 3},
                                         "full": {"models": 3000, "repeats": 5}}
GOAL_PLAN_SECONDS = 5.0
TEMPLATE_NAMES = ("minilm-l6-embedding", "resnet-synthetic", "resnet-synthetic-ts")


# ---------------------------------------------------------------------------------------------
# Manifests
# ---------------------------------------------------------------------------------------------


def generated_manifest(count: int) -> dict[str, Any]:
    """``count`` distinct models: the entries of models.yaml in turn, each renamed, synthetic
    weights seeded differently and batching delay varied, so no two entries are equal."""
    templates = [manifest_entry(name) for name in TEMPLATE_NAMES]
    models = []
    for i in range(count):
        entry = copy.deepcopy(templates[i % len(templates)])
        entry["name"] = f"{entry['name']}-{i:04d}"
        entry.pop("copies", None)
        if entry["source"].get("kind") == "synthetic":
            entry["source"]["seed"] = i
        if "dynamic_batching" in entry:
            entry["dynamic_batching"]["max_queue_delay_microseconds"] = 100 + i
        models.append(entry)
    return {"version": 1, "models": models}


def write_manifest(count: int, folder: Path) -> Path:
    import yaml

    path = folder / f"models-{count}.yaml"
    path.write_text(yaml.safe_dump(generated_manifest(count), sort_keys=False), encoding="utf-8")
    return path


# ---------------------------------------------------------------------------------------------
# The two synth paths
# ---------------------------------------------------------------------------------------------


def _context_flags(manifest: Path | None) -> dict[str, str]:
    if manifest is None:
        return {"mme:manifest_path": "", "mme:release_id": NO_MANIFEST_RELEASE}
    return {"mme:manifest_path": str(manifest)}


def _template(outdir: Path) -> bytes:
    """The stack's template in a cloud assembly folder."""
    templates = sorted(outdir.glob("*.template.json"))
    if len(templates) != 1:
        raise RuntimeError(f"expected one template in {outdir}, found {[p.name for p in templates]}")
    return templates[0].read_bytes()


def synth_cli(manifest: Path | None, outdir: Path) -> float:
    """``npx --no-install cdk synth --quiet`` from the project root; seconds of wall time.

    Notices and telemetry are off: both would reach for the network, which is not synth.
    """
    command = ["npx", "--no-install", "cdk", "synth", "--quiet", "--no-notices", "-o", str(outdir)]
    for key, value in _context_flags(manifest).items():
        command += ["-c", f"{key}={value}"]
    env = {**os.environ, "CDK_DISABLE_CLI_TELEMETRY": "true"}
    started = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-15:])
        raise RuntimeError(f"cdk synth failed ({done.returncode}): {' '.join(command)}\n{tail}")
    return seconds


def synth_in_process(manifest: Path | None, outdir: Path, phases: dict[str, float] | None = None) -> float:
    """The app as ``app.py`` composes it, synthesized in this process; seconds of wall time.

    ``phases`` (when given) receives the two parts: ``construct`` (``cdk.App`` and ``build_app``,
    which reads the settings and the manifest and builds the constructs) and ``synth``
    (``app.synth()``: validation plugins, template, assets)."""
    import aws_cdk as cdk

    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    import app as cdk_app

    context = {**cdk_app.cdk_json_context(), **_context_flags(manifest)}
    started = time.perf_counter()
    application = cdk.App(context=context, outdir=str(outdir))
    cdk_app.build_app(application)
    constructed = time.perf_counter()
    application.synth()
    finished = time.perf_counter()
    if phases is not None:
        phases["construct"] = constructed - started
        phases["synth"] = finished - constructed
    return finished - started


PROJECT_CODE = ("app.py", "stacks", "constructs", "model_build")


def profile_in_process(manifest: Path | None, outdir: Path, top: int = 8) -> dict[str, Any]:
    """One in-process synth under cProfile: the project functions with the most time inside them
    and what they call (cumulative), as a share of the profiled synth. Python-side work is what
    cProfile sees; time spent waiting for the jsii (Node) process counts for the caller."""
    import cProfile
    import pstats

    profiler = cProfile.Profile()
    profiler.enable()
    synth_in_process(manifest, outdir)
    profiler.disable()
    table = pstats.Stats(profiler).stats  # type: ignore[attr-defined]
    total = max((ct for (_, _, _), (_, _, _, ct, _) in table.items()), default=0.0) or 1e-9
    rows = []
    for (filename, _line, function), (_cc, _nc, _tt, cumulative, _callers) in table.items():
        try:
            relative = Path(filename).resolve().relative_to(ROOT)
        except ValueError:
            continue
        if not relative.parts or relative.parts[0] not in PROJECT_CODE:
            continue
        rows.append({"function": f"{relative.as_posix()}:{function}", "cumulative_s": round(cumulative, 4),
                     "share": round(cumulative / total, 4)})
    rows.sort(key=lambda row: row["cumulative_s"], reverse=True)
    return {"profiled_s": round(total, 4), "top": rows[:top]}


def _validation_parts(path: Path, repeats: int) -> dict[str, Any]:
    """What reading the manifest costs, in parts: the whole ``load_manifest`` (what the app calls),
    PyYAML's ``safe_load`` (pure Python), the same document with libyaml's ``CSafeLoader`` when
    PyYAML was built with it, and the schema alone (``parse_manifest`` on the parsed data)."""
    import yaml

    from triton_mme_cdk.model_build.manifest import load_manifest, parse_manifest

    text = path.read_text(encoding="utf-8")
    data = yaml.safe_load(text)
    parts: dict[str, Any] = {
        "manifest_validation_s": stats([timed(lambda: load_manifest(path))[0] for _ in range(repeats)]),
        "yaml_safe_load_s": stats([timed(lambda: yaml.safe_load(text))[0] for _ in range(repeats)]),
        "schema_s": stats([timed(lambda: parse_manifest(data))[0] for _ in range(repeats)]),
    }
    if getattr(yaml, "__with_libyaml__", False):
        parts["yaml_libyaml_s"] = stats(
            [timed(lambda: yaml.load(text, Loader=yaml.CSafeLoader))[0] for _ in range(repeats)]
        )
    return parts


# ---------------------------------------------------------------------------------------------
# The pull-request plan at thousands of models
# ---------------------------------------------------------------------------------------------


def plan_timing(ctx: RunContext, folder: Path, synthesized: dict[str, bytes] | None = None) -> dict[str, Any]:
    """``python -m model_build plan`` against a routes file of ``models`` routes (1% of the entries
    changed since, so the plan has updates to list), the template synthesized beforehand.

    ``synthesized``: in-process templates already made this run, by manifest size. Where the
    plan's size is one of them (a tiny run: 3 models, the synth rows' own manifest, written again
    with the same text), that template is used: synth is deterministic, so a second in-process
    synth of the same manifest would give the same bytes (in quick and full runs the plan's
    3,000 models are no synth size, and it is synthesized here)."""
    from triton_mme_cdk.model_build.manifest import load_manifest
    from triton_mme_cdk.model_build.release import entry_sha256, model_code_sha256
    from triton_mme_cdk.model_build.release.deployed import record_from_template
    from triton_mme_cdk.model_build.release.routes import Route, Routes

    chosen = ctx.sizes(PLAN_SIZES)
    count, repeats = int(chosen["models"]), int(chosen["repeats"])
    manifest_path = write_manifest(count, folder)
    template_path = folder / "plan-template.json"
    if synthesized and str(count) in synthesized:
        template_path.write_bytes(synthesized[str(count)])
    else:
        outdir = Path(tempfile.mkdtemp(prefix="plan-synth-", dir=ctx.work_dir))
        synth_in_process(manifest_path, outdir)
        template_path.write_bytes((outdir / "TritonMme.template.json").read_bytes())
        shutil.rmtree(outdir, ignore_errors=True)
    manifest = load_manifest(manifest_path)
    routes = {}
    for index, spec in enumerate(manifest.models):
        digest = "0" * 64 if index % 100 == 0 else entry_sha256(spec, manifest_path.parent)
        for target in spec.target_names():
            routes[target] = Route(target, f"{target}-0123456789ab.tar.gz", "f" * 64, 10**8, "k" * 64, spec.name,
                                   digest)
    routes_path = folder / "plan-routes.json"
    template = json.loads(template_path.read_text(encoding="utf-8"))
    routes_path.write_bytes(Routes("r-0123456789abcdef", "s3://b/models/served/", "k", routes,
                                   model_code_sha256=model_code_sha256(),
                                   deployed=record_from_template(template)).body())
    markdown_path = folder / "plan.md"
    command = [sys.executable, "-m", "model_build", "plan", "--manifest", str(manifest_path), "--routes-file",
               str(routes_path), "--template", str(template_path), "--format", "json", "--markdown-file",
               str(markdown_path), "--detailed-exitcode"]
    seconds: list[float] = []
    report: dict[str, Any] = {}
    for _ in range(repeats):
        started = time.perf_counter()
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)
        seconds.append(time.perf_counter() - started)
        if done.returncode != 3:
            raise RuntimeError(f"plan exited {done.returncode}, expected 3 (models only): {done.stderr[-800:]}")
        report = json.loads(done.stdout)
    log(f"plan: {count} models, {stats(seconds)['median']:.2f} s (median of {repeats})")
    # Its parts, each timed alone (what a missed goal is explained with): a new process that reads
    # the app's settings as plan does (cdk.json, no CDK import), and the manifest read and checked in this one.
    settings_s = [timed(lambda: subprocess.run(
        [sys.executable, "-c", "from triton_mme_cdk.model_build.tools.app_context import AppConfig; AppConfig.find()"],
        cwd=ROOT, capture_output=True, timeout=300, check=True))[0] for _ in range(repeats)]
    manifest_s = [timed(lambda: load_manifest(manifest_path))[0] for _ in range(repeats)]
    return {"models": count, "routes": len(routes), "repeats": repeats, "seconds": stats(seconds),
            "settings_process_s": stats(settings_s), "manifest_s": stats(manifest_s),
            "counts": report["models"]["counts"], "verdict": report["verdict"],
            "markdown_chars": len(markdown_path.read_text(encoding="utf-8")),
            "routes_bytes": routes_path.stat().st_size,
            "command": "python -m model_build plan --manifest <m> --routes-file <r> --template <t> --format json "
                       "--markdown-file <md> --detailed-exitcode"}


# ---------------------------------------------------------------------------------------------
# The benchmark
# ---------------------------------------------------------------------------------------------


def run(ctx: RunContext) -> dict[str, Any]:

    started = time.perf_counter()
    chosen = ctx.sizes(SIZES)
    sizes = tuple(chosen["models"])
    cli_repeats = int(chosen["cli_repeats"])  # the CLI path is the noisiest: Node, Python and jsii start-up
    inproc_repeats = int(chosen["in_process_repeats"])
    folder = ctx.scratch("synth-manifests")
    manifests = {str(n): write_manifest(n, folder) for n in sizes}
    configs: dict[str, Path | None] = {**manifests, "none": None}
    result = new_result(NAME, TITLE, ctx, {
        "sizes": list(sizes),
        "cli_repeats": cli_repeats,
        "in_process_repeats": inproc_repeats,
        "cli_command": "npx --no-install cdk synth --quiet --no-notices -o <tmp> -c mme:manifest_path=<file> "
                       "(CDK_DISABLE_CLI_TELEMETRY=true)",
        "no_manifest_context": f"-c mme:manifest_path= -c mme:release_id={NO_MANIFEST_RELEASE}",
        "manifest_entries": "models.yaml's entries in turn, renamed <name>-<i>, seeds and batching delays varied",
        "manifest_bytes": {k: p.stat().st_size for k, p in manifests.items()},
    })

    cli: dict[str, list[float]] = {k: [] for k in configs}
    inproc: dict[str, list[float]] = {k: [] for k in configs}
    phases: dict[str, dict[str, list[float]]] = {k: {"construct": [], "synth": []} for k in configs}

    def in_process(manifest: Path | None, outdir: Path) -> float:
        parts: dict[str, float] = {}
        seconds = synth_in_process(manifest, outdir, parts)
        key = next(k for k, v in configs.items() if v == manifest)
        for name, value in parts.items():
            phases[key][name].append(value)
        return seconds
    #: (resources, template bytes) by path and size. The CLI's template has one resource more
    #: (CDKMetadata: the CLI turns version reporting on) and path metadata, so the two differ.
    shape: dict[str, dict[str, dict[str, int]]] = {"cli": {}, "in-process": {}}
    #: The in-process template of each size (the plan row's template where its size is one).
    in_process_templates: dict[str, bytes] = {}

    def one(path_name: str, func: Any, key: str, store: dict[str, list[float]]) -> None:
        outdir = Path(tempfile.mkdtemp(prefix=f"synth-{path_name}-", dir=ctx.work_dir))
        try:
            store[key].append(func(configs[key], outdir))
            data = _template(outdir)
        finally:
            shutil.rmtree(outdir, ignore_errors=True)
        resources, size = len(json.loads(data)["Resources"]), len(data)
        if path_name == "in-process":
            in_process_templates[key] = data
        seen = shape[path_name].setdefault(key, {"resources": resources, "template_bytes": size})
        if seen != {"resources": resources, "template_bytes": size}:
            raise RuntimeError(f"{key} models: {path_name} synth gave another template ({resources}, {size})"
                               f" than before ({seen})")

    # In-process first: one warm-up synth starts jsii and loads aws-cdk-lib (excluded).
    log("synth: in-process warm-up (jsii start-up)")
    warm_dir = Path(tempfile.mkdtemp(prefix="synth-warm-", dir=ctx.work_dir))
    warmup_s = synth_in_process(configs[str(sizes[0])], warm_dir)
    shutil.rmtree(warm_dir, ignore_errors=True)
    for repeat in range(inproc_repeats):
        for key in configs if repeat % 2 == 0 else list(reversed(configs)):
            one("in-process", in_process, key, inproc)
    log("synth: in-process " + ", ".join(f"{k}: {stats(v)['median']:.2f} s" for k, v in inproc.items()))
    profile_dir = Path(tempfile.mkdtemp(prefix="synth-profile-", dir=ctx.work_dir))
    profile = profile_in_process(configs[str(sizes[-1])], profile_dir)
    shutil.rmtree(profile_dir, ignore_errors=True)
    for repeat in range(cli_repeats):
        for key in configs if repeat % 2 == 0 else list(reversed(configs)):
            one("cli", synth_cli, key, cli)
        log(f"synth: cdk synth run {repeat + 1}/{cli_repeats}: "
            + ", ".join(f"{k}: {v[-1]:.1f} s" for k, v in cli.items()))

    validation = {key: _validation_parts(path, max(3, inproc_repeats)) for key, path in manifests.items()}

    by_size = {
        key: {
            "models": 0 if key == "none" else int(key),
            "cli_s": stats(cli[key]),
            "in_process_s": stats(inproc[key]),
            "in_process_construct_s": stats(phases[key]["construct"]),
            "in_process_synth_s": stats(phases[key]["synth"]),
            # The deployed template is the CLI's; the in-process one is kept for reference.
            **shape["cli"][key],
            "in_process_template": shape["in-process"][key],
            **(validation.get(key, {})),
        }
        for key in configs
    }
    plan = plan_timing(ctx, folder, in_process_templates)
    result["measurements"] = {"by_size": by_size, "in_process_warmup_s": round(warmup_s, 3),
                              f"in_process_profile_{sizes[-1]}": profile, "plan": plan}

    small, large = str(sizes[0]), str(sizes[-1])
    for path_key, label in (("cli_s", "cdk synth (CLI)"), ("in_process_s", "in-process app.synth()")):
        result["comparisons"].append(comparison(
            f"{path_key[:-2]}_{large}_vs_{small}", what=f"{label} time, {large} models against {small}",
            unit="s", baseline_label=f"{small} model(s)", baseline=by_size[small][path_key],
            candidate_label=f"{large} models", candidate=by_size[large][path_key], lower_is_better=True,
        ))
        for key in manifests:
            result["comparisons"].append(comparison(
                f"{path_key[:-2]}_{key}_vs_none", what=f"{label} time, {key} models against no manifest",
                unit="s", baseline_label="no manifest", baseline=by_size["none"][path_key],
                candidate_label=f"{key} model(s)", candidate=by_size[key][path_key], lower_is_better=True,
            ))
    for metric in ("resources", "template_bytes"):
        result["comparisons"].append(comparison(
            f"{metric}_{large}_vs_{small}", what=f"template {metric.replace('_', ' ')}", unit=metric.split("_")[-1],
            baseline_label=f"{small} model(s)", baseline=stats([by_size[small][metric]]),
            candidate_label=f"{large} models", candidate=stats([by_size[large][metric]]), lower_is_better=True,
        ))

    full_large = max(SIZES["full"]["models"])
    not_judged = "" if int(large) >= full_large else (
        f"stated at {full_large} models; this {ctx.mode} run's largest manifest has {large}")
    _goals(result, by_size, small, large, profile, not_judged)
    plan_full = PLAN_SIZES["full"]["models"]
    result["goals"].append(goal(
        "plan_time",
        f"python -m model_build plan against a routes file at {plan_full} models within {GOAL_PLAN_SECONDS:g} s "
        "(synth excluded)",
        target=f"<= {GOAL_PLAN_SECONDS:g} s", measured=f"{plan['seconds']['median']:.2f} s",
        met=plan["seconds"]["median"] <= GOAL_PLAN_SECONDS,
        detail=(f"{plan['models']} models: " + ", ".join(f"{n} {k}" for k, n in plan["counts"].items())
                + f", verdict {plan['verdict']}; a new process each run "
                f"(the settings from cdk.json, the manifest, the diff engine on Node.js); markdown "
                f"{plan['markdown_chars']} characters."),
        not_judged="" if plan["models"] >= plan_full else f"stated at {plan_full} models; this run has "
                                                                f"{plan['models']}",
        limit="" if plan["seconds"]["median"] <= GOAL_PLAN_SECONDS else (
            f"measured: a new process that only reads the app's settings (cdk.json) takes "
            f"{plan['settings_process_s']['median']:.2f} s, and reading the {plan['models']}-entry "
            f"manifest {plan['manifest_s']['median']:.2f} s; the rest is "
            "the entries' hashes, the routes and the diff engine on Node.js"),
    ))
    result["notes"].append(
        f"In-process synth reuses one jsii process; its start-up (the first synth, {warmup_s:.1f} s) is "
        "excluded. The CLI path pays Node, Python and jsii start-up on every run, as a user does."
    )
    return finish_result(result, started)


def _goals(result: dict[str, Any], by_size: dict[str, Any], small: str, large: str,
           profile: dict[str, Any], not_judged: str = "") -> None:
    resources = [by_size[k]["resources"] for k in by_size if k != "none"]
    sizes = [by_size[k]["template_bytes"] for k in by_size if k != "none"]
    grow_res = max(resources) - min(resources)
    result["goals"].append(goal(
        "resources_constant",
        f"the number of resources does not grow with the models (and stays under {CFN_MAX_RESOURCES})",
        target=f"same count at every size, < {CFN_MAX_RESOURCES}",
        measured=f"{by_size[small]['resources']} at {small}, {by_size[large]['resources']} at {large}",
        met=grow_res == 0 and max(resources) < CFN_MAX_RESOURCES,
        detail=f"Without a manifest: {by_size['none']['resources']} resources.",
        limit="" if grow_res == 0 else f"{grow_res} more resources at {large} models",
        not_judged=not_judged,
    ))
    growth = max(sizes) / min(sizes)
    result["goals"].append(goal(
        "template_size_constant",
        "the template size does not grow with the models (and stays under 1 MB)",
        target=f"within 1% at every size, < {CFN_MAX_TEMPLATE_BYTES} bytes",
        measured=f"{by_size[small]['template_bytes']} B at {small}, {by_size[large]['template_bytes']} B at {large}",
        met=growth <= 1.01 and max(sizes) < CFN_MAX_TEMPLATE_BYTES,
        detail=f"Largest / smallest: {growth:.4f}; without a manifest: {by_size['none']['template_bytes']} B.",
        limit="" if growth <= 1.01 else f"the template grows {growth:.2f}x from {small} to {large} models",
        not_judged=not_judged,
    ))
    for key, label in (("cli_s", "cdk synth (CLI)"), ("in_process_s", "in-process app.synth()")):
        ratio = by_size[large][key]["median"] / by_size[small][key]["median"]
        met = ratio <= GOAL_SYNTH_RATIO
        limit = ""
        if not met:
            limit = _synth_limit(by_size, key, label, small, large, profile)
        result["goals"].append(goal(
            f"synth_time_{key[:-2]}",
            f"{label} at {large} models within {GOAL_SYNTH_RATIO:g}x of {small} model",
            target=f"<= {GOAL_SYNTH_RATIO:g}x",
            measured=round(ratio, 4),
            met=met,
            detail=(f"Medians: {by_size[small][key]['median']:.2f} s at {small}, "
                    f"{by_size[large][key]['median']:.2f} s at {large}, {by_size['none'][key]['median']:.2f} s "
                    "without a manifest."),
            limit=limit,
            not_judged=not_judged,
        ))


def _synth_limit(
    by_size: dict[str, Any], key: str, label: str, small: str, large: str, profile: dict[str, Any]
) -> str:
    """The growth of synth time with the models, split into the parts measured in this run."""
    def med(size: str, part: str) -> float:
        return float(by_size[size][part]["median"])

    extra = med(large, key) - med(small, key)
    load = med(large, "manifest_validation_s") - med(small, "manifest_validation_s")
    text = (
        f"measured: {label} takes {extra:.2f} s more at {large} models than at {small}. Reading the "
        f"manifest (model_build.manifest.load_manifest, as the app calls it) takes "
        f"{med(large, 'manifest_validation_s'):.2f} s at {large} models ({load:.2f} s more than at {small}); "
        f"for reference, the same document takes {med(large, 'yaml_safe_load_s'):.2f} s with PyYAML's "
        f"pure-Python safe_load"
    )
    if "yaml_libyaml_s" in by_size[large]:
        text += f", {med(large, 'yaml_libyaml_s'):.2f} s with libyaml's CSafeLoader"
    text += f", and the schema alone (pydantic) {med(large, 'schema_s'):.3f} s."
    if key == "in_process_s":
        construct = med(large, "in_process_construct_s") - med(small, "in_process_construct_s")
        synth = med(large, "in_process_synth_s") - med(small, "in_process_synth_s")
        text += (
            f" Of the growth, building the app (build_app: settings, manifest, constructs) accounts for "
            f"{construct:.2f} s and app.synth() for {synth:.2f} s."
        )
        if profile.get("top"):
            text += (
                f" Profile of one in-process synth at {large} models (cProfile; time in each project function "
                "and what it calls, share of the profiled synth): "
                + ", ".join(f"{row['function']} {row['share']:.0%}" for row in profile["top"][:6])
                + "."
            )
    else:
        text += (f" The rest of the growth ({extra - load:.2f} s) is the app's other work and the start-up "
                 "noise of the CLI path (see the spread).")
    return text


# ---------------------------------------------------------------------------------------------
# Chart and docs
# ---------------------------------------------------------------------------------------------


def chart(result: dict[str, Any], path: Path) -> None:
    from matplotlib.ticker import NullLocator

    from benchmarks._charts import BASELINE, CANDIDATE, LIMIT, OTHER, error_bars, figure, save

    by_size = result["measurements"]["by_size"]
    keys = [k for k in by_size if k != "none"]
    models = [by_size[k]["models"] for k in keys]
    fig, (ax_time, ax_res, ax_bytes) = figure(3, "cdk synth against the number of models in the manifest")
    for key, label, color in (("cli_s", "cdk synth (CLI)", CANDIDATE), ("in_process_s", "in-process app.synth()", OTHER)):
        values = [by_size[k][key] for k in keys]
        ax_time.errorbar(models, [v["median"] for v in values], yerr=error_bars(values), marker="o",
                         color=color, label=label, capsize=3)
        ax_time.axhline(by_size["none"][key]["median"], color=color, linestyle=":", linewidth=1,
                        label=f"{label}, no manifest")
    ax_time.set_xscale("log")
    ax_time.set_xticks(models, [str(m) for m in models])
    ax_time.xaxis.set_minor_locator(NullLocator())
    ax_time.set_ylim(bottom=0)
    ax_time.set_xlabel("models in the manifest (log scale)")
    ax_time.set_ylabel("seconds (median; bars min to max)")
    ax_time.set_title("synth time")
    ax_time.legend(fontsize=7)

    labels = [str(m) for m in models] + ["none"]
    resources = [by_size[k]["resources"] for k in keys] + [by_size["none"]["resources"]]
    ax_res.bar(labels, resources, color=[CANDIDATE] * len(keys) + [BASELINE])
    ax_res.axhline(CFN_MAX_RESOURCES, color=LIMIT, linestyle="--", label=f"CloudFormation limit ({CFN_MAX_RESOURCES})")
    for x, value in enumerate(resources):
        ax_res.annotate(str(value), (x, value), ha="center", va="bottom", fontsize=8)
    ax_res.set_xlabel("models in the manifest")
    ax_res.set_ylabel("resources in the template")
    ax_res.set_title("resources")
    ax_res.legend(fontsize=8)

    sizes_kb = [by_size[k]["template_bytes"] / 1000 for k in keys] + [by_size["none"]["template_bytes"] / 1000]
    ax_bytes.bar(labels, sizes_kb, color=[CANDIDATE] * len(keys) + [BASELINE])
    ax_bytes.axhline(CFN_MAX_TEMPLATE_BYTES / 1000, color=LIMIT, linestyle="--", label="CloudFormation limit (1 MB)")
    for x, value in enumerate(sizes_kb):
        ax_bytes.annotate(f"{value:.1f}", (x, value), ha="center", va="bottom", fontsize=8)
    ax_bytes.set_yscale("log")
    ax_bytes.set_xlabel("models in the manifest")
    ax_bytes.set_ylabel("template kB (log scale)")
    ax_bytes.set_title("template size")
    ax_bytes.legend(fontsize=8)
    save(fig, path, note=f"{result['machine']['cpu_model']}; {result['versions'].get('aws-cdk-lib')} aws-cdk-lib, "
                         f"CLI {result['versions'].get('aws-cdk (cli)')}")


def markdown(result: dict[str, Any]) -> str:
    """Tables of the synth benchmark for docs/benchmarks.md."""
    from benchmarks._common import spread_text
    from benchmarks.report import table

    params = result["parameters"]
    by_size = result["measurements"]["by_size"]
    ratios = {c["name"]: c["ratio"] for c in result["comparisons"]}
    rows = []
    for key, m in by_size.items():
        validation = "-"
        if "manifest_validation_s" in m:
            validation = spread_text(m["manifest_validation_s"], "s") + f"; YAML {m['yaml_safe_load_s']['median']:.3g} s"
            if "yaml_libyaml_s" in m:
                validation += f" (libyaml: {m['yaml_libyaml_s']['median']:.3g} s)"
            validation += f", schema {m['schema_s']['median']:.3g} s"
        manifest_kb = f"{params['manifest_bytes'][key] / 1000:.1f}" if key in params["manifest_bytes"] else "-"
        vs_none = (f"{1 / ratios[f'cli_{key}_vs_none']:.2f}x / {1 / ratios[f'in_process_{key}_vs_none']:.2f}x"
                   if key != "none" else "1x")
        rows.append([
            "no manifest" if key == "none" else key, manifest_kb, spread_text(m["cli_s"], "s"),
            spread_text(m["in_process_s"], "s"), vs_none, validation, m["resources"], m["template_bytes"],
        ])
    return "\n".join([
        f"Manifests of {', '.join(map(str, params['sizes']))} distinct models ({params['manifest_entries']}), "
        f"written to a temporary folder. CLI: `{params['cli_command']}`, {params['cli_repeats']} runs per size; "
        f"in-process: `cdk.App` + `app.build_app` + `app.synth()`, {params['in_process_repeats']} runs per size; "
        f"sizes interleaved. Without a manifest: `{params['no_manifest_context']}`.",
        "",
        table(["models", "manifest kB", "cdk synth (CLI)", "in-process synth", "time vs no manifest (CLI / in-process)",
               "manifest validation (load_manifest)", "resources", "template bytes"], rows),
        "",
        "In-process synth in two phases (medians): building the app (`build_app`: settings, manifest, "
        "constructs) and `app.synth()` (cdk-nag, template, assets):",
        "",
        table(["models", "build_app", "app.synth()"], [
            ["no manifest" if key == "none" else key, spread_text(m["in_process_construct_s"], "s"),
             spread_text(m["in_process_synth_s"], "s")]
            for key, m in by_size.items()
        ]),
        *_profile_lines(result),
        *_plan_lines(result),
    ])


def _plan_lines(result: dict[str, Any]) -> list[str]:
    from benchmarks._common import spread_text

    plan = result["measurements"].get("plan")
    if not plan:
        return []
    counts = plan["counts"]
    return [
        "",
        f"The pull-request plan: `{plan['command']}` against a routes file of {plan['routes']} routes "
        f"({plan['routes_bytes'] / 1e6:.1f} MB) and a manifest of {plan['models']} entries, 1% of them changed "
        f"({counts['updated']} updated, {counts['unchanged']} unchanged: verdict {plan['verdict']}), a new process "
        f"each of {plan['repeats']} runs, the template synthesized beforehand: "
        f"**{spread_text(plan['seconds'], 's')}**; its markdown comment {plan['markdown_chars']} characters.",
    ]


def _profile_lines(result: dict[str, Any]) -> list[str]:
    from benchmarks.report import table

    found = [(k, v) for k, v in result["measurements"].items() if k.startswith("in_process_profile_")]
    if not found:
        return []
    key, profile = found[0]
    return [
        "",
        f"Where one in-process synth at {key.rsplit('_', 1)[-1]} models spends its time (cProfile, "
        f"{profile['profiled_s']:.2f} s profiled; time in each project function and what it calls; "
        "profiling slows Python code down, so shares matter more than seconds):",
        "",
        table(["function", "cumulative s", "share"],
              [[f"`{row['function']}`", row["cumulative_s"], f"{row['share']:.0%}"] for row in profile["top"]]),
    ]
