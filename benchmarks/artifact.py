"""Artifact size and load: FP32 against FP16 MiniLM tarballs, and gzip levels 1, 6 and 9.

Both tarballs come from the project's build (``minilm-l6-embedding`` from models.yaml, and the
same entry with ``fp16: true``). Each is unpacked once to get the exact ``model.onnx`` and
``config.pbtxt`` it holds, then packed again with :func:`model_build.artifact.package_model` at
gzip levels 1, 6 and 9 (the levels' runs interleaved), and each of those tarballs is unpacked
with :func:`model_build.tarball.safe_extract` (what the build's verify step does). "Load" adds the
ONNX Runtime session creation from the config (:func:`model_build.artifact.backend.open_model`).

The result chooses the default level: the fastest to pack among the levels whose tarball is
within 1% of the smallest, since a release is packed once per build but its size costs on every
download, and ONNX weights (float noise to gzip) barely compress at any level.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any

from benchmarks._common import (
    RunContext,
    comparison,
    finish_result,
    goal,
    log,
    new_result,
    spec_from,
    stats,
    text_model_entry,
    timed,
    usable_cores,
)

NAME = "artifact"
TITLE = "Artifact size and load: FP32 against FP16, gzip levels 1, 6 and 9"
LEVELS = (1, 6, 9)
#: A level whose tarball is at most this much larger than the smallest counts as "as small".
SIZE_TOLERANCE = 0.01
#: Runs per level. The model is the same in every mode but tiny, and three runs are the least a
#: real run takes, so quick and full are the same here.
SIZES: dict[str, dict[str, Any]] = {
    "tiny": {"repeats": 1},
    "quick": {"repeats": 3},
    "full": {"repeats": 3},
}


def _current_default() -> int:
    from triton_mme_cdk.model_build.pipeline import DEFAULT_COMPRESSLEVEL

    return int(DEFAULT_COMPRESSLEVEL)


def _contents(tarball: Path, dest: Path) -> tuple[Path, str, str]:
    """The model file, config text and model directory name inside a built tarball."""
    from triton_mme_cdk.model_build.artifact.gate import locate_model
    from triton_mme_cdk.model_build.artifact.tarball import safe_extract

    safe_extract(tarball, dest)
    model_dir, name = locate_model(dest)
    assert name is not None
    return model_dir / "1" / "model.onnx", (model_dir / "config.pbtxt").read_text(encoding="utf-8"), name


def _measure_variant(tarball: Path, repeats: int, scratch: Path, threads: int) -> dict[str, Any]:
    from triton_mme_cdk.model_build.artifact.backend import open_model
    from triton_mme_cdk.model_build.artifact.pack import package_model
    from triton_mme_cdk.model_build.artifact.tarball import safe_extract
    from triton_mme_cdk.model_build.artifact.triton_config import check_config

    model_file, config_text, name = _contents(tarball, scratch / "source")
    samples: dict[int, dict[str, list[float]]] = {lvl: {"pack_s": [], "unpack_s": []} for lvl in LEVELS}
    sizes: dict[int, int] = {}
    digests: dict[int, set[str]] = {lvl: set() for lvl in LEVELS}
    for repeat in range(repeats):
        for level in LEVELS if repeat % 2 == 0 else tuple(reversed(LEVELS)):
            out = scratch / f"level{level}.tar.gz"
            seconds, (sha256, size) = timed(partial(
                package_model, model_name=name, config_text=config_text, model_file=model_file, format="onnx",
                out_path=out, compresslevel=level,
            ))
            samples[level]["pack_s"].append(seconds)
            sizes[level] = size
            digests[level].add(sha256)
    for repeat in range(repeats):
        for level in LEVELS if repeat % 2 == 0 else tuple(reversed(LEVELS)):
            dest = Path(tempfile.mkdtemp(prefix="unpack-", dir=scratch))
            seconds, _ = timed(partial(safe_extract, scratch / f"level{level}.tar.gz", dest))
            shutil.rmtree(dest, ignore_errors=True)
            samples[level]["unpack_s"].append(seconds)
    # Load: the ONNX Runtime session the config asks for (on the CPU provider here).
    config = check_config(config_text, model=name)
    config.parameters["intra_op_thread_count"].string_value = str(threads)
    session_s = []
    for _ in range(repeats + 1):
        seconds, runner = timed(lambda: open_model(model_file, config, model=name))
        del runner
        session_s.append(seconds)
    return {
        "model_bytes": model_file.stat().st_size,
        "levels": {
            str(level): {
                "bytes": sizes[level],
                "compression_ratio": round(model_file.stat().st_size / sizes[level], 4),
                "pack_s": stats(samples[level]["pack_s"]),
                "unpack_s": stats(samples[level]["unpack_s"]),
                "reproducible": len(digests[level]) == 1,
            }
            for level in LEVELS
        },
        "session_s": stats(session_s[1:]),  # the first session pays one-off library set-up
    }


def recommend(levels: dict[str, Any]) -> tuple[int, str]:
    """The level to use by default, and why, from one variant's measurements."""
    smallest = min(v["bytes"] for v in levels.values())
    candidates = [int(k) for k, v in levels.items() if v["bytes"] <= smallest * (1 + SIZE_TOLERANCE)]
    best = min(candidates, key=lambda lvl: (levels[str(lvl)]["pack_s"]["median"], lvl))
    top_level = max(int(k) for k in levels)
    chosen, tightest = levels[str(best)], levels[str(top_level)]
    extra = chosen["bytes"] - tightest["bytes"]
    saved = tightest["pack_s"]["median"] - chosen["pack_s"]["median"]
    if best == top_level:
        why = (
            f"level {best}: it gives the smallest tarball ({chosen['bytes'] / 1e6:.2f} MB) and, in this run, "
            f"also packed fastest ({chosen['pack_s']['median']:.2f} s); the levels' tarballs are within "
            f"{SIZE_TOLERANCE:.0%} of each other, so pack time decided."
        )
        return best, why
    why = (
        f"level {best}: its tarball is {extra / tightest['bytes']:+.2%} against level {top_level} "
        f"({chosen['bytes'] / 1e6:.2f} MB against {tightest['bytes'] / 1e6:.2f} MB) and it packs in "
        f"{chosen['pack_s']['median']:.2f} s instead of {tightest['pack_s']['median']:.2f} s; unpacking takes "
        f"{chosen['unpack_s']['median']:.2f} s against {tightest['unpack_s']['median']:.2f} s."
    )
    if extra > 0 and saved > 0:
        why += (
            f" The {extra / 1e3:.0f} kB more per download would cost more than the {saved:.2f} s saved "
            f"per build only over a link slower than {extra / saved / 1e3:.0f} kB/s per download."
        )
    return best, why


def run(ctx: RunContext) -> dict[str, Any]:
    started = time.perf_counter()
    repeats = int(ctx.sizes(SIZES)["repeats"])
    specs = {"fp32": spec_from(text_model_entry(ctx.tiny)), "fp16": spec_from(text_model_entry(ctx.tiny, fp16=True))}
    result = new_result(NAME, TITLE, ctx, {
        "model": specs["fp32"].name,
        "levels": list(LEVELS),
        "repeats": repeats,
        "current_default_level": _current_default(),
        "size_tolerance": SIZE_TOLERANCE,
        "pack": "triton_mme_cdk.model_build.artifact.package_model (reproducible tar, gzip)",
        "unpack": "triton_mme_cdk.model_build.tarball.safe_extract (Python tarfile + gzip)",
        "load": "triton_mme_cdk.model_build.artifact.backend.open_model, ONNX Runtime CPU provider",
    })
    variants: dict[str, Any] = {}
    for key, spec in specs.items():
        built, release_dir = ctx.build(spec)
        log(f"artifact: {key}: pack and unpack at levels {', '.join(map(str, LEVELS))}")
        variants[key] = {
            "built_bytes": built.size,
            **_measure_variant(release_dir / built.tarball, repeats, ctx.scratch(f"artifact-{key}"),
                               ctx.threads or usable_cores()),
        }
    result["measurements"]["variants"] = variants

    default = str(_current_default())
    for key in variants:
        levels = variants[key]["levels"]
        for other in (str(lvl) for lvl in LEVELS if str(lvl) != default):
            for metric, unit, what in (("pack_s", "s", "pack time"), ("unpack_s", "s", "unpack time")):
                result["comparisons"].append(comparison(
                    f"{key}_{metric[:-2]}_level{other}_vs_{default}", what=f"{key} {what}", unit=unit,
                    baseline_label=f"level {default}", baseline=levels[default][metric],
                    candidate_label=f"level {other}", candidate=levels[other][metric], lower_is_better=True,
                ))
            result["comparisons"].append(comparison(
                f"{key}_size_level{other}_vs_{default}", what=f"{key} tarball size", unit="bytes",
                baseline_label=f"level {default}", baseline=stats([levels[default]["bytes"]]),
                candidate_label=f"level {other}", candidate=stats([levels[other]["bytes"]]), lower_is_better=True,
            ))
    fp32, fp16 = variants["fp32"], variants["fp16"]
    result["comparisons"].append(comparison(
        "size_fp16_vs_fp32", what=f"tarball size at level {default}", unit="bytes",
        baseline_label="FP32", baseline=stats([fp32["levels"][default]["bytes"]]),
        candidate_label="FP16", candidate=stats([fp16["levels"][default]["bytes"]]), lower_is_better=True,
    ))
    result["comparisons"].append(comparison(
        "unpack_fp16_vs_fp32", what=f"unpack time at level {default}", unit="s",
        baseline_label="FP32", baseline=fp32["levels"][default]["unpack_s"],
        candidate_label="FP16", candidate=fp16["levels"][default]["unpack_s"], lower_is_better=True,
    ))
    result["comparisons"].append(comparison(
        "session_fp16_vs_fp32", what="ONNX Runtime session creation (CPU)", unit="s",
        baseline_label="FP32", baseline=fp32["session_s"],
        candidate_label="FP16", candidate=fp16["session_s"], lower_is_better=True,
    ))

    chosen = {key: recommend(v["levels"]) for key, v in variants.items()}
    level, why = chosen["fp32"]
    agree = all(lvl == level for lvl, _ in chosen.values())
    result["measurements"]["recommendation"] = {
        "level": level,
        "why": why,
        "by_variant": {key: {"level": lvl, "why": text} for key, (lvl, text) in chosen.items()},
        "variants_agree": agree,
    }
    result["goals"].append(goal(
        "default_level_chosen",
        "choose the default gzip level from the measured size, pack time and unpack time",
        target=f"the fastest-packing level within {SIZE_TOLERANCE:.0%} of the smallest tarball",
        measured=level,
        met=True,
        detail=why + ("" if agree else " (the FP16 tarball points to level "
                      f"{chosen['fp16'][0]}: {chosen['fp16'][1]})"),
    ))
    return finish_result(result, started)


def chart(result: dict[str, Any], path: Path) -> None:
    from benchmarks._charts import BASELINE, CANDIDATE, annotate_bars, error_bars, figure, save

    variants = result["measurements"]["variants"]
    levels = [str(lvl) for lvl in result["parameters"]["levels"]]
    fig, (ax_size, ax_pack, ax_unpack) = figure(3, f"{result['parameters']['model']} tarballs by gzip level")
    width = 0.38
    colors = {"fp32": BASELINE, "fp16": CANDIDATE}
    for i, key in enumerate(variants):
        xs = [j + (i - 0.5) * width for j in range(len(levels))]
        sizes = [variants[key]["levels"][lvl]["bytes"] / 1e6 for lvl in levels]
        bars = ax_size.bar(xs, sizes, width, color=colors.get(key), label=key.upper())
        annotate_bars(ax_size, bars, [f"{s:.2f}" for s in sizes])
        for ax, metric in ((ax_pack, "pack_s"), (ax_unpack, "unpack_s")):
            values = [variants[key]["levels"][lvl][metric] for lvl in levels]
            bars = ax.bar(xs, [v["median"] for v in values], width, color=colors.get(key), label=key.upper(),
                          yerr=error_bars(values), capsize=3)
            annotate_bars(ax, bars, [f"{v['median']:.2f}" for v in values])
    for ax, ylabel, title in (
        (ax_size, "MB (tarball)", "size"),
        (ax_pack, "seconds to pack (median; bars min to max)", "pack time"),
        (ax_unpack, "seconds to unpack (median; bars min to max)", "unpack time"),
    ):
        ax.set_xticks(range(len(levels)), [f"level {lvl}" for lvl in levels])
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.legend(fontsize=8)
    rec = result["measurements"]["recommendation"]
    save(fig, path, note=f"recommended default: level {rec['level']}; {result['machine']['cpu_model']}")


def markdown(result: dict[str, Any]) -> str:
    """Tables of the artifact benchmark for docs/benchmarks.md."""
    from benchmarks._common import spread_text
    from benchmarks.report import table

    params = result["parameters"]
    variants = result["measurements"]["variants"]
    rows = []
    for key, v in variants.items():
        for level, m in v["levels"].items():
            rows.append([
                key.upper(), level, f"{m['bytes'] / 1e6:.3f}", f"{m['compression_ratio']:.3f}",
                spread_text(m["pack_s"], "s"), spread_text(m["unpack_s"], "s"),
                "yes" if m["reproducible"] else "**no**",
            ])
    ratios = {c["name"]: c for c in result["comparisons"]}
    size = ratios["size_fp16_vs_fp32"]
    rec = result["measurements"]["recommendation"]
    out = [
        f"`{params['model']}` as built, FP32 and FP16 (`fp16: true`), repacked by {params['pack']} at each "
        f"level and unpacked by {params['unpack']}; {params['repeats']} runs each, levels interleaved. "
        f"The model file holds {variants['fp32']['model_bytes'] / 1e6:.1f} MB (FP32) and "
        f"{variants['fp16']['model_bytes'] / 1e6:.1f} MB (FP16).",
        "",
        table(["weights", "gzip level", "tarball MB", "model bytes / tarball bytes", "pack", "unpack",
               "same bytes every run"], rows),
        "",
        table(["", "FP32", "FP16", "ratio (FP32 / FP16)"], [
            [f"tarball at level {params['current_default_level']}", f"{size['baseline_median'] / 1e6:.2f} MB",
             f"{size['candidate_median'] / 1e6:.2f} MB", f"{size['ratio']:.2f}x"],
            ["unpack", spread_text(variants["fp32"]["levels"][str(params["current_default_level"])]["unpack_s"], "s"),
             spread_text(variants["fp16"]["levels"][str(params["current_default_level"])]["unpack_s"], "s"),
             f"{ratios['unpack_fp16_vs_fp32']['ratio']:.2f}x"],
            ["ONNX Runtime session (CPU)", spread_text(variants["fp32"]["session_s"], "s"),
             spread_text(variants["fp16"]["session_s"], "s"), f"{ratios['session_fp16_vs_fp32']['ratio']:.2f}x"],
        ]),
        "",
        f"### Default gzip level: {rec['level']}",
        "",
        f"Rule: among the levels whose tarball is within {params['size_tolerance']:.0%} of the smallest, the "
        f"fastest to pack (a release is packed once per build, in the build Lambda's time limit too, and "
        f"downloaded by every instance that loads it, so size wins unless the sizes are this close). "
        f"Measured: {rec['why']}",
    ]
    if not rec["variants_agree"]:
        fp16 = rec["by_variant"]["fp16"]
        out += ["", f"For the FP16 tarball the same rule gives level {fp16['level']}: {fp16['why']}"]
    out += ["", f"The build's `DEFAULT_COMPRESSLEVEL` (model_build/release/identity.py) was {params['current_default_level']} "
                "when this ran; the tarballs above were packed at each level explicitly, so the choice does "
                "not depend on it."]
    return "\n".join(out)
