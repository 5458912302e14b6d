"""``python -m model_build capacity`` end to end (issue 50, point 4): a manifest, a traffic profile,
footprints and a price table in, the plan out as text, JSON (validated against
``model_build/tools/capacity/capacity.schema.json``) and markdown; every bad input one line naming the
field, exit 1, before anything is simulated."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

from triton_mme_cdk.model_build.__main__ import main
from triton_mme_cdk.model_build.capacity.footprint import Coefficients, Figure
from triton_mme_cdk.model_build.capacity.inputs import instance_shapes, measured_service_ms
from triton_mme_cdk.model_build.capacity.sizing import synth_footprints
from triton_mme_cdk.model_build.manifest import load_manifest
from triton_mme_cdk.model_build.release.routes import ModelPlan, Planned, Route
from triton_mme_cdk.model_build.tools.review.plan_capacity import capacity_line

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = json.loads((ROOT / "model_build" / "tools" / "capacity" / "capacity.schema.json").read_text())

MANIFEST = """\
version: 1
models:
  - name: net
    source:
      kind: synthetic
      architecture: resnet
      seed: 0
      config: {embedding_size: 8, hidden_sizes: [8, 8], depths: [1, 1], layer_type: basic, num_labels: 2}
    task: image-classification
    format: onnx
    max_batch_size: 4
    image: {image_size: 32, channels: 3}
    copies: 4
"""
#: 5000 MiB each: an ml.g4dn.xlarge (16 GiB, less tritonserver's 164 MiB, less 10% slack: 14,598 MiB)
#: holds two, an ml.g5.xlarge (24 GiB: 21,970 MiB) all four.
FOOTPRINTS = "models:\n  net: {gpu_mib: 5000, disk_mib: 100, load_s: 2.0, fetch_s: 1.0}\n"
PRICES = """\
date: 2026-11-27
source: a test's own figures
verified: false
per_hour: {ml.g4dn.xlarge: 1.0, ml.g5.xlarge: 1.5}
"""


@pytest.fixture()
def work(tmp_path: Path) -> Path:
    (tmp_path / "models.yaml").write_text(MANIFEST)
    (tmp_path / "footprints.yaml").write_text(FOOTPRINTS)
    (tmp_path / "prices.yaml").write_text(PRICES)
    (tmp_path / "traffic.yaml").write_text("total_rate: 2\nzipf: 0\n")
    return tmp_path


def args(work: Path, *extra: str, footprints: bool = True) -> list[str]:
    given = ["--footprints", str(work / "footprints.yaml")] if footprints else []
    return ["capacity", "--manifest", str(work / "models.yaml"), *given, "--traffic", str(work / "traffic.yaml"), "--instance-type", "ml.g4dn.xlarge", "--instance-type",
            "ml.g5.xlarge", "--duration", "1200", "--warmup", "120", *extra]


def test_the_plan_end_to_end_names_the_cheapest_fleet_in_every_format(work: Path) -> None:
    # Four equally hot models. One g4dn (room for two) thrashes; two hold two each (cold models go to
    # the idle instances in turn): 2.0 an hour. One g5 holds all four for 1.5: the cheapest.
    done = subprocess.run([sys.executable, "-m", "model_build", *args(
        work, "--prices", str(work / "prices.yaml"), "--format", "json", "--markdown-file", str(work / "plan.md"),
        "--json-file", str(work / "plan.json"))], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    jsonschema.validate(report, SCHEMA, cls=jsonschema.Draft202012Validator)
    assert json.loads((work / "plan.json").read_text()) == report
    assert report["cheapest"] == {"instance_type": "ml.g5.xlarge", "count": 1, "cost_per_hour": 1.5}
    rows = {(row["instance_type"], row["count"]): row for row in report["candidates"]}
    assert rows[("ml.g4dn.xlarge", 1)]["warm_share"] < 0.9 and rows[("ml.g4dn.xlarge", 1)]["loads_per_minute"] > 1
    assert rows[("ml.g4dn.xlarge", 2)]["warm_share"] == 1.0 and rows[("ml.g4dn.xlarge", 2)]["cost_per_hour"] == 2.0
    assert rows[("ml.g5.xlarge", 1)]["resident_models"] == ["net-0", "net-1", "net-2", "net-3"]
    assert [m["footprint_source"] for m in report["models"]] == ["given"] * 4
    assert report["prices"]["verified"] is False
    assert report["traffic"]["requests"] == pytest.approx(2400, rel=0.1)
    markdown = (work / "plan.md").read_text()
    assert "| ml.g5.xlarge | 1 | simulated | 100.00% |" in markdown
    assert "UNVERIFIED prices of 2026-11-27" in markdown


def test_the_text_report_and_the_same_seed_give_the_same_numbers(work: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(args(work)) == 0
    first = capsys.readouterr().out
    assert main(args(work)) == 0
    assert capsys.readouterr().out == first
    assert "no price table given" in first and "fleets that meet the target" in first
    assert main(args(work, "--seed", "9")) == 0
    assert capsys.readouterr().out != first


def test_without_footprints_the_manifest_is_sized_as_synth_does_and_says_estimate(
        work: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(args(work, "--format", "json", footprints=False)) == 0
    report = json.loads(capsys.readouterr().out)
    assert {m["footprint_source"] for m in report["models"]} == {"estimated"}
    assert all("LOWER BOUND" in m["footprint_note"] and "disk " in m["footprint_note"]
               and "estimate" in m["footprint_note"].split("disk ")[1] for m in report["models"])
    assert report["cheapest"] is None and all(row["meets_target"] for row in report["candidates"])


def test_a_release_index_gives_the_footprints_its_build_recorded(work: Path, capsys: pytest.CaptureFixture[str]) -> None:
    manifest = load_manifest(work / "models.yaml")
    entries = []
    for footprint in synth_footprints(manifest.models, work):
        recorded = footprint.__class__(**{**footprint.__dict__, "stage": "build",
                                          "working_bytes": Figure(64 * 2**20, "measured at build", True),
                                          "tarball_bytes": Figure(2**20, "measured", False),
                                          "unpacked_bytes": Figure(2**20, "measured", False)})
        entries.append({"logical_name": footprint.target, "footprint": recorded.to_json()})
    (work / "index.json").write_text(json.dumps({"schema": 1, "models": entries}))
    command = args(work, "--format", "json", "--release-index", str(work / "index.json"), footprints=False)
    assert main(command) == 0
    report = json.loads(capsys.readouterr().out)
    assert {m["footprint_source"] for m in report["models"]} == {"recorded (estimate)"}
    assert {m["disk_bytes"] for m in report["models"]} == {2 * 2**20}
    (work / "old.json").write_text(json.dumps({"schema": 1, "models": [{"logical_name": "net-0"}]}))
    assert main([*command[:-2], "--release-index", str(work / "old.json")]) == 1
    assert "records no footprints" in capsys.readouterr().err


def test_service_times_come_from_the_gpu_checks_measurements() -> None:
    measured = measured_service_ms(ROOT / "benchmarks" / "results" / "gpu_check.json",
                                   [("minilm-l6-embedding", "onnx", "fp32"), ("nothing", "onnx", "fp32")])
    check = json.loads((ROOT / "benchmarks" / "results" / "gpu_check.json").read_text())
    row = next(r for r in check["rows"] if (r["model"], r["runtime"], r["variant"]) ==
               ("minilm-l6-embedding", "onnxruntime-cuda", "fp32"))
    assert set(measured) == {"minilm-l6-embedding"}
    assert measured["minilm-l6-embedding"][0] == row["batch1"]["p50_ms"]
    assert "not the fleet's GPU" in measured["minilm-l6-embedding"][1]


@pytest.mark.parametrize(("files", "extra", "expected"), [
    ({"traffic.yaml": "rates: {other: 1}\n"}, (), "traffic.yaml.rates.other: got 'other'; no such model"),
    ({"traffic.yaml": "rates: {net: -2}\n"}, (), "traffic.yaml.rates.net: got -2; expected requests per second"),
    ({"traffic.yaml": "rates: {net: lots}\n"}, (), "traffic.yaml.rates.net: got 'lots'"),
    ({"traffic.yaml": "zipf: 9\n"}, (), "traffic.yaml.zipf: got 9; expected a Zipf exponent in [0, 4]"),
    ({}, ("--instance-type", "ml.c5.xlarge"), "--instance-type: got 'ml.c5.xlarge'; expected one of ml.g4dn.xlarge"),
    ({"prices.yaml": "source: x\nper_hour: {ml.g5.xlarge: 1}\n"}, ("--prices", "PRICES"), "prices.yaml.date: got None"),
    ({"prices.yaml": "date: 2026-01-01\nper_hour: {ml.g5.xlarge: 1}\n"}, ("--prices", "PRICES"),
     "prices.yaml.source: got None"),
    ({"footprints.yaml": "models: {net: {gpu_mib: -1, disk_mib: 1, load_s: 1}}\n"}, (),
     "footprints.yaml.models.net.gpu_mib: got -1"),
    ({}, ("--warm-share", "1.5"), "--warm-share: got '1.5'; expected a share in [0, 1]"),
    ({}, ("--warmup", "5000"), "--warmup: got '5000'"),
])
def test_bad_input_is_one_line_naming_the_field_and_exit_1(work: Path, capsys: pytest.CaptureFixture[str],
                                                          files: dict[str, str], extra: tuple[str, ...],
                                                          expected: str) -> None:
    for name, text in files.items():
        (work / name).write_text(text)
    command = [str(work / "prices.yaml") if a == "PRICES" else a for a in args(work, *extra)]
    assert main(command) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0] and "Traceback" not in captured.err


def test_bad_input_through_the_command_line_prints_no_stack_trace(work: Path) -> None:
    (work / "traffic.yaml").write_text("zipf: -1\n")
    done = subprocess.run([sys.executable, "-m", "model_build", *args(work)], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.strip() == "error: traffic.yaml.zipf: got -1; expected a Zipf exponent in [0, 4]"


# ---------------------------------------------------------------------------------------------
# plan's capacity line
# ---------------------------------------------------------------------------------------------

def _fleet(instance_type: str = "ml.g4dn.xlarge", count: int = 1, limit: str | None = None) -> dict:
    environment = {"SAGEMAKER_TRITON_MODEL_LOAD_GPU_LIMIT": limit} if limit else {}
    return {"Resources": {
        "Config": {"Type": "AWS::SageMaker::EndpointConfig",
                   "Properties": {"ProductionVariants": [{"InstanceType": instance_type, "InitialInstanceCount": count}]}},
        "Model": {"Type": "AWS::SageMaker::Model", "Properties": {"PrimaryContainer": {"Environment": environment}}},
    }}


def _route(name: str) -> Route:
    return Route(name, f"{name}-000000000000.tar.gz", "a" * 64, 1, "k-0", name.rsplit("-", 1)[0])


def test_the_plan_line_says_what_more_copies_do_to_the_resident_set_and_warm_share(tmp_path: Path) -> None:
    # Each copy of the tiny synthetic net is estimated at its weights plus the runtime overhead (the
    # committed GPU check's, else the allowance): an ml.g4dn.xlarge (16 GiB less tritonserver's 164 MiB)
    # holds as many as fit. 40 live copies all stay resident and warm; 300 after the change cannot.
    (tmp_path / "models.yaml").write_text(MANIFEST.replace("copies: 4", "copies: 300"))
    manifest = load_manifest(tmp_path / "models.yaml")
    coefficients = Coefficients.read()
    per_copy = synth_footprints(manifest.models, tmp_path, coefficients)[0].gpu_memory().value
    usable = instance_shapes(["ml.g4dn.xlarge"], coefficients)[0].gpu_bytes
    assert per_copy and 40 * per_copy < usable < 300 * per_copy
    fits = int(usable // per_copy)
    models = ModelPlan(added=[Planned(f"net-{i}", "0" * 64) for i in range(40, 300)],
                       unchanged=[_route(f"net-{i}") for i in range(40)], live_release="r-0")
    line = capacity_line(manifest, tmp_path, models, _fleet())
    assert line.before is not None and line.after is not None
    assert (len(line.before.resident_models), line.before.warm_share) == (40, 1.0)
    after_warm = line.after.warm_share
    assert len(line.after.resident_models) == fits and after_warm is not None and after_warm < 0.99
    assert line.text().startswith("capacity at 1 x ml.g4dn.xlarge (Zipf s=1 over 300 models, 10 req/s in total; "
                                  "footprints ESTIMATED from the manifest): resident 40/40 models, 100.0% warm -> "
                                  f"resident {fits}/300 models, ")
    # Half the GPU for loads (SAGEMAKER_TRITON_MODEL_LOAD_GPU_LIMIT=0.5): about half as many resident.
    halved = capacity_line(manifest, tmp_path, models, _fleet(limit="0.5")).after
    halved_usable = instance_shapes(["ml.g4dn.xlarge"], coefficients, load_gpu_limit=0.5)[0].gpu_bytes
    assert halved is not None and len(halved.resident_models) == int(halved_usable // per_copy) < fits
    # Twice the instances the copies need evict nothing: each load after the warm-up is a model's first
    # (a rarely asked copy first asked then), never one evicted and loaded again.
    enough = capacity_line(manifest, tmp_path, models, _fleet(count=-(-2 * 300 // fits))).after
    assert enough is not None and enough.loads == enough.downloads
    assert enough.warm_share is not None and enough.warm_share > after_warm


def test_the_plan_line_says_unknown_rather_than_guessing(tmp_path: Path) -> None:
    (tmp_path / "models.yaml").write_text(MANIFEST)
    manifest = load_manifest(tmp_path / "models.yaml")
    removed = ModelPlan(unchanged=[_route(f"net-{i}") for i in range(4)], removed=[_route("gone-0")])
    line = capacity_line(manifest, tmp_path, removed, _fleet())
    assert line.before is None and line.after is not None
    assert "unknown (1 removed models have no footprint in the manifest (gone-0))" in line.text()
    first = capacity_line(manifest, tmp_path, ModelPlan(added=[Planned(f"net-{i}", "0" * 64) for i in range(4)]), _fleet())
    assert "nothing live -> resident 4/4 models" in first.text()
    assert capacity_line(manifest, tmp_path, removed, {"Resources": {}}).text() == (
        "capacity not predicted (the template has no single endpoint config with a literal instance type and count)")
    assert "ml.x1.large is not in the instance table" in capacity_line(manifest, tmp_path, removed,
                                                                         _fleet("ml.x1.large")).text()


def test_the_plan_json_with_its_capacity_line_matches_the_plan_schema(tmp_path: Path) -> None:
    from triton_mme_cdk.model_build.tools.review.plan_report import PlanReport
    from triton_mme_cdk.model_build.tools.review.plan_verdict import Verdict

    (tmp_path / "models.yaml").write_text(MANIFEST)
    manifest = load_manifest(tmp_path / "models.yaml")
    models = ModelPlan(added=[Planned(f"net-{i}", "0" * 64) for i in range(4)])
    report = PlanReport(stack="TritonMme", models=models, verdict=Verdict(fleet="created", data="safe", compared_with="nothing deployed"), routes_where="r.json",
                        capacity=capacity_line(manifest, tmp_path, models, _fleet()))
    document = report.as_json()
    plan_schema = json.loads((ROOT / "model_build" / "tools" / "review" / "plan.schema.json").read_text())
    jsonschema.validate(document, plan_schema, cls=jsonschema.Draft202012Validator)
    assert document["capacity"]["after"] == {"resident_models": 4, "models": 4, "warm_share": 1.0,
                                             "loads_per_minute": 0.0}
    lines = report.text().splitlines()
    assert [line for line in lines if line.startswith("capacity at ")] == [lines[-3]], lines  # before digest, verdict
    assert lines[-3].startswith("capacity at 1 x ml.g4dn.xlarge")
    assert "**Capacity:** at 1 x ml.g4dn.xlarge" in report.markdown()


# ---------------------------------------------------------------------------------------------
# The worked example of docs/operations.md, "Sizing the fleet"
# ---------------------------------------------------------------------------------------------


def _section(page: str, title: str) -> str:
    start = page.index(f"## {title}\n")
    end = page.find("\n## ", start + 1)
    return page[start:end if end >= 0 else len(page)]


def test_the_worked_example_in_the_operations_guide_is_the_commands_real_output(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """The page pastes the output of two commands on the default manifest: each must be what the
    command prints now (a GPU run that changes the coefficients, or a change of the report,
    shows up here: run the commands again and paste)."""
    import re

    section = _section((ROOT / "docs" / "operations.md").read_text(encoding="utf-8"), "Sizing the fleet")
    prices = "examples/capacity/prices.example.yaml"
    first = f"python -m model_build capacity --prices {prices}"
    sed = "sed 's/^    copies: 3$/    copies: 200/' models.yaml > models-200.yaml"
    second = (f"python -m model_build capacity --manifest models-200.yaml --prices {prices} \\\n"
              "    --instance-type ml.g4dn.xlarge --instance-type ml.g5.xlarge")
    assert first in section and sed in section and second in section

    monkeypatch.chdir(ROOT)
    assert main(["capacity", "--prices", prices]) == 0
    default = capsys.readouterr().out
    assert "cheapest fleet that meets the target: 1 x ml.g4dn.xlarge" in default
    # The sed of the page changes exactly the copies of resnet-synthetic.
    manifest, changed = re.subn(r"(?m)^    copies: 3$", "    copies: 200", (ROOT / "models.yaml").read_text())
    assert changed == 1
    (tmp_path / "models-200.yaml").write_text(manifest)
    monkeypatch.chdir(tmp_path)
    assert main(["capacity", "--manifest", "models-200.yaml", "--prices", str(ROOT / prices),
                 "--instance-type", "ml.g4dn.xlarge", "--instance-type", "ml.g5.xlarge"]) == 0
    many = capsys.readouterr().out
    assert "203 target models" in many and "cheapest fleet that meets the target: 3 x ml.g4dn.xlarge" in many
    for output in (default, many):
        assert f"```text\n{output.rstrip()}\n```" in section, output
