"""Render ``docs/benchmarks.md`` from the result files, so the page never disagrees with them.

:func:`render_markdown` is pure (results in, text out) so the tests can check it on the results
of a tiny run; :func:`write_docs` reads every ``<name>.json`` in a results folder and writes the
page. Each benchmark module renders its own tables (``markdown(result)``); this module adds the
parts they share: the command, the machine, the versions and the table of goals.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from benchmarks._common import (
    BENCHMARK_NAMES,
    MAKE_COMMAND,
    MAKE_FULL_COMMAND,
    MODES,
    QUICK_GOAL_S,
    iter_goals,
    mode_sizes,
    sizes_text,
    validate_result,
)

#: The record of the last run of every benchmark (written by ``python -m benchmarks``).
RUN_RECORD = "run.json"

SECTION_TITLES = {
    "synth_scale": "1. Synth at scale",
    "publish": "2. Publishing copies",
    "inference": "3. Serving the built artifact",
    "artifact": "4. Artifact size and load",
    "variants": "5. Fused graphs and precisions against the roofline",
    "build_memory": "Build memory: peak RSS per byte of weights",
}


def status(met: bool | None, not_judged: str = "") -> str:
    if not_judged:
        return f"n/a: {not_judged}"
    return "**met**" if met is True else "**not met**" if met is False else "not measured"


def goal_status(item: Mapping[str, Any]) -> str:
    return status(item["met"], str(item.get("not_judged") or ""))


def mode_line(name: str, result: Mapping[str, Any]) -> str:
    """The mode and sizes of one result, and the full run's sizes where they differ."""
    mode = str(result["mode"])
    line = f"Mode **{mode}**: {sizes_text(result['sizes']) or 'no sizes'}"
    if mode != "full":
        full = mode_sizes(name, "full")
        line += ("; a full run (`--full`) uses the same sizes" if full == result["sizes"]
                 else f"; a full run (`--full`): {sizes_text(full)}")
    return line + "."


def fmt_measured(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3g}x" if value < 1000 else f"{value:.4g}"
    return "n/a" if value is None else str(value)


def _commands(results: Mapping[str, Mapping[str, Any]]) -> str:
    """Each distinct command line with the benchmarks it wrote (a page can mix ``--only`` runs)."""
    by_command: dict[str, list[str]] = {}
    for name, result in results.items():
        by_command.setdefault(str(result["command"]), []).append(name)
    if len(by_command) == 1:
        return f"`{next(iter(by_command))}`"
    return "; ".join(f"`{command}` ({', '.join(names)})" for command, names in by_command.items())


def _machine_section(results: Mapping[str, Mapping[str, Any]]) -> list[str]:
    first = next(iter(results.values()))
    m, v = first["machine"], first["versions"]
    gpu = m.get("gpu") or {}
    gpu_text = ", ".join(gpu.get("devices") or []) or "none (no CUDA device)"
    lines = [
        "## Machine and versions",
        "",
        "| | |",
        "| --- | --- |",
        f"| CPU | {m['cpu_model']} |",
        f"| cores | {m['cores']} ({m.get('usable_cores', m['cores'])} usable by the run) |",
        f"| memory | {m.get('memory_gib')} GiB |",
        f"| GPU | {gpu_text}; ONNX Runtime providers: {', '.join(gpu.get('onnxruntime_providers') or [])} |",
        f"| platform | {m['platform']}, Python {m['python']} |",
    ]
    for key in ("torch", "onnxruntime", "aws-cdk-lib", "aws-cdk (cli)", "node", "onnx", "transformers",
                "boto3", "moto", "cdk-nag"):
        if v.get(key):
            lines.append(f"| {key} | {v[key]} |")
    lines += [
        "",
        "Load average (1, 5, 15 min) when each benchmark started and ended; a value near or above the "
        "core count means other processes shared the machine and the spreads below are wider for it:",
        "",
        "| benchmark | started | run time | load at start | load at end |",
        "| --- | --- | --- | --- | --- |",
    ]
    for name, result in results.items():
        mm = result["machine"]
        lines.append(
            f"| {name} | {result['started_at']} | {result['seconds']:.0f} s | "
            f"{mm.get('load_average_start')} | {mm.get('load_average_end')} |"
        )
    return lines


def _goals_section(results: Mapping[str, Mapping[str, Any]]) -> list[str]:
    lines = [
        "## Goals",
        "",
        "| benchmark | goal | target | measured | status |",
        "| --- | --- | --- | --- | --- |",
    ]
    for name, item in iter_goals(results.values()):
        lines.append(
            f"| {name} ({results[name]['mode']}) | {item['text']} | {item['target']} | "
            f"{fmt_measured(item['measured'])} | {goal_status(item)} |"
        )
    missed = [(name, item) for name, item in iter_goals(results.values()) if item["met"] is False]
    if missed:
        lines += ["", "What limits the goals that are not met (measured in the same run):", ""]
        for name, item in missed:
            lines.append(f"- **{name} / {item['id']}**: {item['limit'] or item['detail']}")
    return lines


def _modes_section(results: Mapping[str, Mapping[str, Any]], run: Mapping[str, Any] | None) -> list[str]:
    """How long a run takes, and which mode and sizes each result on the page comes from."""
    lines = ["## Run time, modes and sizes", ""]
    total = sum(float(r["seconds"]) for r in results.values())
    modes = sorted({str(r["mode"]) for r in results.values()}, key=MODES.index)
    lines.append(
        f"The benchmarks on this page ran for {total / 60:.1f} minutes in all (the sum of their own run times; "
        f"mode{'s' if len(modes) > 1 else ''}: {', '.join(modes)})."
    )
    if run is not None:
        wall = float(run["wall_s"])
        m = run.get("machine") or {}
        verdict = ""
        if run.get("mode") == "quick":
            verdict = (f" Goal: `make bench` under {QUICK_GOAL_S / 60:.0f} minutes on a 2-core machine: "
                       + ("**met**" if wall < QUICK_GOAL_S and not run.get("failed") else "**not met**") + ".")
        lines.append(
            f"The last run of every benchmark (`{run['command']}`, mode **{run['mode']}**) started "
            f"{run['started_at']} and took **{wall / 60:.1f} minutes** of wall time on {m.get('cpu_model')}, "
            f"{m.get('cores')} cores ({m.get('usable_cores')} usable), {m.get('memory_gib')} GiB; load average "
            f"(1, 5, 15 min) {run.get('load_average_start')} at the start and {run.get('load_average_end')} at "
            "the end (other processes on the machine slow a run down and widen its spreads)."
            + (f" Failed: {', '.join(run['failed'])}." if run.get("failed") else "") + verdict
        )
        later = [name for name, result in results.items()
                 if not run["started_at"] <= str(result["started_at"]) <= str(run.get("finished_at", "~"))]
        if later:
            lines.append(
                f"The results of {', '.join(later)} on this page come from other runs than that one (their "
                "commands are named above, their start times and load in the table under the machine)."
            )
    lines += [
        "",
        "| benchmark | mode | sizes of this result | sizes of a full run | run time |",
        "| --- | --- | --- | --- | --- |",
    ]
    for name, result in results.items():
        full = mode_sizes(name, "full")
        lines.append(
            f"| {name} | {result['mode']} | {sizes_text(result['sizes'])} | "
            f"{'same' if full == result['sizes'] else sizes_text(full)} | {float(result['seconds']):.0f} s |"
        )
    return lines


def render_markdown(
    results: Mapping[str, Mapping[str, Any]], *, docs_dir: Path, results_dir: Path,
    run: Mapping[str, Any] | None = None,
) -> str:
    """The whole page for the given results (``{benchmark name: result document}``) and the record
    of the last run of every benchmark (``run.json``), if any."""
    ordered = {name: results[name] for name in BENCHMARK_NAMES if name in results}
    lines = [
        "# Benchmarks",
        "",
        "<!-- Generated by `make bench` from benchmarks/results/*.json; do not edit by hand. -->",
        "",
        f"Commands: `{MAKE_COMMAND}` (quick) and `{MAKE_FULL_COMMAND}`. Results on this page come from "
        + (_commands(ordered) if ordered else "no run")
        + ". Every number is a median over repeated runs (at least 3; spread given as min to max), "
        "measured in one process on the machine below; each comparison names both medians and "
        "their ratio, oriented so that a ratio above 1 favours the project's path.",
        "",
        "Modes. `make bench` runs the **quick** mode: every benchmark and every row of its tables, at sizes "
        f"that fit a coffee break (under {QUICK_GOAL_S / 60:.0f} minutes on a 2-core machine): fewer models "
        "where the growth curve is what matters, fewer runs or shorter timed runs where the same quantity is "
        "measured. `make bench FULL=1` (`--full`) runs the **full** sizes, the ones the goals are stated at. "
        "Each result file records its mode and sizes (`mode`, `sizes`), and each section below states them "
        "beside the result. A goal stated at a size the run did not reach reads *n/a* with the reason, never "
        "met or not met.",
        "",
    ]
    if not ordered:
        return "\n".join([*lines, "No results yet: run `make bench`.", ""])
    if any(r.get("tiny") for r in ordered.values()):
        lines += [
            "> **Tiny run**: sizes were cut down for a smoke test (`--tiny`); these numbers say "
            "nothing about the goals.",
            "",
        ]
    missing = [name for name in BENCHMARK_NAMES if name not in ordered]
    if missing:
        lines += [f"> Missing results: {', '.join(missing)} (run `make bench`).", ""]
    lines += [
        "Run them all with `make bench` (or `make bench FULL=1`); one or more with "
        "`.venv/bin/python -m benchmarks --only NAME ... [--full]` "
        f"({', '.join(BENCHMARK_NAMES)}); `--threads N` sets the thread count of both runtimes in the "
        "inference benchmark (default: every usable core); `--tiny` is the smoke-test size the test suite "
        "runs (`tests/test_benchmarks.py`), written to a temporary folder.",
        "",
    ]
    lines += [*_modes_section(ordered, run), "", *_goals_section(ordered), "", *_machine_section(ordered), ""]
    for name, result in ordered.items():
        module = importlib.import_module(f"benchmarks.{name}")
        png = results_dir / f"{name}.png"
        rel = Path(os.path.relpath(png, docs_dir)).as_posix()
        lines += [f"## {SECTION_TITLES.get(name, name)}", "", f"*{result['title']}* (`{name}.json`)", "",
                  mode_line(name, result), ""]
        for item in result["goals"]:
            lines.append(
                f"- Goal: {item['text']} (target {item['target']}): {goal_status(item)}, "
                f"measured {fmt_measured(item['measured'])}. {item['detail']}"
            )
            if item["met"] is False and item.get("limit"):
                lines.append(f"  - What limits it: {item['limit']}")
        lines += ["", module.markdown(result).rstrip(), ""]
        if result.get("notes"):
            lines += ["Notes:", ""] + [f"- {note}" for note in result["notes"]] + [""]
        lines += [f"![{name}]({rel})", ""]
    lines += _gpu_check_section(results_dir)
    return "\n".join(lines).rstrip() + "\n"


def _gpu_check_section(results_dir: Path) -> list[str]:
    """The "GPU check" section from ``gpu_check.json`` (``make gpu-check``, run on a GPU machine
    only), or one line saying it has not run."""
    from benchmarks.gpu_table import RESULT_PATH, SCHEMA, markdown

    path = results_dir / RESULT_PATH.name
    head = ["## GPU check (`make gpu-check`)", ""]
    try:
        result = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return [*head, "Not run yet: `make gpu-check` on a machine with a CUDA GPU writes it.", ""]
    if not isinstance(result, dict) or result.get("schema") != SCHEMA:
        return [*head, f"`{path.name}` is of another version; run `make gpu-check` again.", ""]
    return [*head, markdown(result).rstrip(), ""]


def load_results(results_dir: Path, *, skipped: list[str] | None = None) -> dict[str, dict[str, Any]]:
    """Every well-formed ``<name>.json`` of a known benchmark in ``results_dir``.

    A file that is not JSON or does not match the result schema (one written by an older
    version) is left out and named in ``skipped`` (path and why), so a ``--only`` run still
    writes the page; the page then lists that benchmark as missing."""
    found: dict[str, dict[str, Any]] = {}
    for name in BENCHMARK_NAMES:
        path = results_dir / f"{name}.json"
        if not path.is_file():
            continue
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            problems = [f"not JSON: {error}"]
        else:
            problems = validate_result(data, name)
        if problems:
            if skipped is not None:
                skipped.append(f"{path}: " + "; ".join(problems))
            continue
        found[name] = data
    return found


def load_run(results_dir: Path) -> dict[str, Any] | None:
    """The record of the last run of every benchmark in ``results_dir`` (``run.json``), if any
    and well-formed."""
    path = results_dir / RUN_RECORD
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    needed = ("mode", "command", "started_at", "wall_s", "machine")
    return data if isinstance(data, dict) and all(key in data for key in needed) else None


def write_docs(results_dir: Path, docs_path: Path) -> Path:
    """Write the page from the results in ``results_dir``; a result left out is said on stderr."""
    skipped: list[str] = []
    results = load_results(results_dir, skipped=skipped)
    for line in skipped:
        print(f"benchmarks: left out of {docs_path.name} (re-run that benchmark): {line}", file=sys.stderr)
    text = render_markdown(results, docs_dir=docs_path.parent, results_dir=results_dir, run=load_run(results_dir))
    docs_path.parent.mkdir(parents=True, exist_ok=True)
    docs_path.write_text(text, encoding="utf-8")
    return docs_path


def table(header: list[str], rows: list[list[Any]]) -> str:
    """A markdown table."""
    out = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    out += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(out)
