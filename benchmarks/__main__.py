"""``python -m benchmarks [--only NAME ...] [--full | --tiny] [--out DIR] [--docs PATH]``.

Runs the benchmarks in one process (same machine, same library state for both sides of every
comparison), writes ``<out>/<name>.json`` and ``<out>/<name>.png`` for each, then renders the
docs page from every result file found in ``<out>``. The default mode, quick (``make bench``),
measures every benchmark and every row at sizes that fit a coffee break (under 25 minutes on two
cores); ``--full`` (``make bench FULL=1``) runs the sizes the goals are stated at. Both write
``benchmarks/results/`` and ``docs/benchmarks.md``, and each result file records its mode.
``--tiny`` runs each benchmark at a tiny size into a temporary folder (or ``--out``) and writes
the page next to the results, so a tiny run never overwrites real numbers.

A run of every benchmark (no ``--only``) also writes ``<out>/run.json``: its mode, start, wall
time and the machine's load before and after; the page reports it.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import shlex
import sys
import tempfile
import time
import traceback
from pathlib import Path

from benchmarks._common import (
    BENCHMARK_NAMES,
    ROOT,
    RunContext,
    load_average,
    log,
    machine,
    validate_result,
    write_json,
)

RESULTS_DIR = ROOT / "benchmarks" / "results"
DOCS_PATH = ROOT / "docs" / "benchmarks.md"


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.split("\n\n")[1])
    parser.add_argument("--only", nargs="+", choices=BENCHMARK_NAMES, metavar="NAME",
                        help="run only these benchmarks: " + ", ".join(BENCHMARK_NAMES))
    sizes = parser.add_mutually_exclusive_group()
    sizes.add_argument("--full", action="store_true",
                       help="the full sizes the goals are stated at (make bench FULL=1; about two hours on two "
                            "cores); default: the quick sizes (make bench; under 25 minutes)")
    sizes.add_argument("--tiny", action="store_true",
                       help="tiny sizes and one repeat (what the tests run); results go to a temporary folder")
    parser.add_argument("--out", type=Path, help=f"folder for the JSON and PNG files (default {RESULTS_DIR})")
    parser.add_argument("--threads", type=int, metavar="N",
                        help="threads for PyTorch and ONNX Runtime alike (default: every usable core)")
    parser.add_argument("--docs", type=Path,
                        help=f"markdown page to write (default {DOCS_PATH}, or <out>/benchmarks.md with --out or --tiny)")
    return parser.parse_args(argv)


def command_line(argv: list[str]) -> str:
    return shlex.join([".venv/bin/python", "-m", "benchmarks", *argv])


def mode_of(args: argparse.Namespace) -> str:
    return "tiny" if args.tiny else "full" if args.full else "quick"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    mode = mode_of(args)
    names = list(args.only or BENCHMARK_NAMES)
    if args.out is not None:
        out_dir = args.out.resolve()
    elif args.tiny:
        out_dir = Path(tempfile.mkdtemp(prefix="bench-tiny-"))
    else:
        out_dir = RESULTS_DIR
    docs_path = (args.docs or (out_dir / "benchmarks.md" if (args.out or args.tiny) else DOCS_PATH)).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    started_at = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    load_start = load_average()
    failed: list[str] = []
    seconds: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="bench-work-") as work:
        ctx = RunContext(mode=mode, out_dir=out_dir, work_dir=Path(work), command=command_line(argv),
                         threads=args.threads)
        for name in names:
            module = importlib.import_module(f"benchmarks.{name}")
            if ctx.tiny:
                _freeze_heap()
            log(f"{name}: start ({mode})")
            try:
                result = module.run(ctx)
                problems = validate_result(result, name)
                if problems:
                    raise RuntimeError(f"{name}: malformed result: " + "; ".join(problems))
                write_json(out_dir / f"{name}.json", result)
                module.chart(result, out_dir / f"{name}.png")
            except Exception:
                failed.append(name)
                log(f"{name}: FAILED\n{traceback.format_exc()}")
                continue
            verdicts = ", ".join(
                f"{g['id']}: {'met' if g['met'] else 'not met' if g['met'] is False else 'n/a'}"
                + (f" ({g['measured']})" if g["measured"] is not None else "")
                for g in result["goals"]
            )
            seconds[name] = float(result["seconds"])
            log(f"{name}: done in {result['seconds']:.1f} s; {verdicts}")

    if args.only is None:
        write_json(out_dir / "run.json", run_record(mode, command_line(argv), started_at,
                                                    time.perf_counter() - started, seconds, failed, load_start))
    from benchmarks.report import write_docs

    write_docs(out_dir, docs_path)
    total = time.perf_counter() - started
    log(f"results in {out_dir}; docs {docs_path}; total {total:.1f} s")
    if failed:
        log("failed: " + ", ".join(failed))
        return 1
    return 0


def _freeze_heap() -> None:
    """Tiny runs only: collect, then move every object alive now (torch, transformers, aws-cdk and
    the rest of the imports) out of the collector's sight (``gc.freeze``), so that the interpreter's
    own full collections during the builds walk the objects created since, not the whole heap
    (0.2 s each in this process). A tiny model's build asks for none itself
    (``model_build.export.memory.release_memory`` skips models below 64 MiB).
    Nothing else changes: the same code runs, and quick and full runs do not freeze (a build's
    seconds are part of what they report)."""
    gc.collect()
    gc.freeze()


def run_record(mode: str, command: str, started_at: str, wall_s: float, seconds: dict[str, float],
               failed: list[str], load_start: list[float] | None) -> dict[str, object]:
    """What a run of every benchmark writes to ``run.json``: the make bench time the docs report."""
    info = machine()
    return {
        "mode": mode,
        "command": command,
        "started_at": started_at,
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "wall_s": round(wall_s, 1),
        "benchmark_seconds": seconds,
        "failed": failed,
        "machine": {"cpu_model": info["cpu_model"], "cores": info["cores"], "usable_cores": info["usable_cores"],
                    "memory_gib": info["memory_gib"], "platform": info["platform"]},
        "load_average_start": load_start,
        "load_average_end": load_average(),
    }


if __name__ == "__main__":
    sys.exit(main())
