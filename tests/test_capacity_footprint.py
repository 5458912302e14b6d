"""Footprints and the instance table (issue 50, points 1 and 2): the table covers every instance
type the construct accepts with a source per value; a synthetic config's parameter count equals the
real transformers model's; a footprint adds its parts as documented, survives JSON, and takes a
served row of ``gpu_check.json`` whole (the python stub's context inside it, not added twice)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from triton_mme_cdk.constructs.sagemaker_limits import MME_GPU_INSTANCE_TYPES, has_instance_storage
from triton_mme_cdk.model_build.capacity.footprint import (
    DOCUMENTED,
    MIB,
    Coefficients,
    Figure,
    Footprint,
    footprint_from_parts,
    unknown,
)
from triton_mme_cdk.model_build.capacity.sizing import (
    bert_parameters,
    hub_weight_bytes,
    resnet_parameters,
    source_weights,
    synth_footprints,
)
from triton_mme_cdk.model_build.gpu_hosts import INSTANCE_TYPES, instance_disk_bytes, instance_type
from triton_mme_cdk.model_build.manifest import HuggingFaceSource, ModelSpec, load_manifest

ROOT = Path(__file__).resolve().parents[1]


def test_instance_table_covers_every_accepted_type_with_sources() -> None:
    assert tuple(INSTANCE_TYPES) == MME_GPU_INSTANCE_TYPES
    for name, row in INSTANCE_TYPES.items():
        assert row.gpu_count == 1  # every MME GPU type has one GPU (developer guide)
        for value in ("gpu", "gpu_memory", "memory", "disk"):
            assert row.source_of(value) != "no source", (name, value)
        # the disk kind agrees with the construct's rule on VolumeSizeInGB
        assert (row.disk_kind == "nvme") == has_instance_storage(name)
    assert instance_type("ml.g4dn.xlarge").gpu_memory_bytes == 16 * 1024**3
    assert "unconfirmed" in instance_type("ml.g5.xlarge").source_of("gpu_memory")
    assert "unconfirmed" not in instance_type("ml.g4dn.xlarge").source_of("gpu_memory")
    # volume_size_gb replaces the EBS default of p3, not the fixed instance store of g5
    assert instance_disk_bytes("ml.p3.2xlarge", 100) == 100 * 1000**3
    assert instance_disk_bytes("ml.p3.2xlarge") == 30 * 1000**3
    assert instance_disk_bytes("ml.g5.xlarge", 100) == 250 * 1000**3
    with pytest.raises(KeyError, match=r"ml\.g6\.xlarge"):
        instance_type("ml.g6.xlarge")


@pytest.mark.parametrize("config", [
    {"embedding_size": 16, "hidden_sizes": [16, 32, 64, 128], "depths": [1, 1, 1, 1], "layer_type": "basic",
     "num_labels": 10},
    {"embedding_size": 8, "hidden_sizes": [16, 32], "depths": [2, 1], "layer_type": "bottleneck", "num_labels": 3},
])
def test_resnet_parameter_count_equals_the_real_model(config: dict) -> None:
    from transformers import ResNetConfig, ResNetForImageClassification

    model = ResNetForImageClassification(ResNetConfig(**config))
    real = sum(t.numel() for key, t in model.state_dict().items() if not key.endswith("num_batches_tracked"))
    assert resnet_parameters(config) == real


@pytest.mark.parametrize("task", ["feature-extraction", "text-classification"])
def test_bert_parameter_count_equals_the_real_model(task: str) -> None:
    from transformers import BertConfig, BertForSequenceClassification, BertModel

    config: dict[str, Any] = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64,
              "vocab_size": 100, "max_position_embeddings": 64}
    cls = BertForSequenceClassification if task == "text-classification" else BertModel
    model = cls(BertConfig(**config))
    assert bert_parameters(config, task) == sum(p.numel() for p in model.parameters())


def _parts(**given: object) -> Footprint:
    values: dict = {
        "target": "m", "model": "m", "stage": "build", "precision": "fp32", "instance_kind": "KIND_GPU",
        "instance_count": 1, "python_instances": 0, "weight_bytes": Figure(100 * MIB, "files", False),
        "working_bytes": Figure(20 * MIB, "measured", True), "tarball_bytes": Figure(90 * MIB, "tar", False),
        "unpacked_bytes": Figure(100 * MIB, "files", False), "build_load_seconds": Figure(0.1, "cpu", False),
    }
    values.update(given)
    return footprint_from_parts(**values)


def test_gpu_memory_is_the_documented_sum() -> None:
    overhead = DOCUMENTED["runtime_overhead_bytes"].value
    stub = DOCUMENTED["python_stub_gpu_bytes"].value
    assert overhead and stub
    one = _parts()
    assert one.gpu_memory().value == 100 * MIB + 20 * MIB + overhead
    assert one.gpu_memory().estimate and not one.lower_bound
    two = _parts(instance_count=2, python_instances=1)
    assert two.gpu_memory().value == 2 * (120 * MIB + overhead) + stub
    # KIND_CPU: the graph lives in host memory, the stub's context stays on the GPU
    cpu = _parts(instance_kind="KIND_CPU", python_instances=1)
    assert cpu.gpu_memory().value == stub
    python_host = cpu.python_host_bytes.value
    assert python_host is not None and cpu.host_memory().value == python_host + 120 * MIB
    # before a build the working memory is unknown: the sum is a lower bound and says so
    synth = _parts(working_bytes=unknown("at build"))
    assert synth.lower_bound and synth.gpu_memory().value == 100 * MIB + overhead
    assert "lower bound" in synth.gpu_memory().source
    assert not _parts(weight_bytes=unknown("s3")).gpu_memory().known


def test_footprint_json_round_trip_and_old_documents() -> None:
    footprint = _parts(python_instances=1)
    document = json.loads(json.dumps(footprint.to_json()))
    assert Footprint.from_json(document) == footprint
    assert document["gpu_memory"]["estimate"] is True and document["gpu_memory"]["source"]
    for old in (None, {}, {"schema": "triton-mme/footprint/2"}, "text"):
        assert Footprint.from_json(old) is None
    del document["working_bytes"]
    read = Footprint.from_json(document)
    assert read is not None and not read.working_bytes.known
    assert read.working_bytes.source == "working_bytes not recorded"


def test_coefficients_use_served_rows_only() -> None:
    committed_path = ROOT / "benchmarks" / "results" / "gpu_check.json"
    committed = Coefficients.read(committed_path)
    document = json.loads(committed_path.read_text())
    context_mib = document["stub_context"]["figures"]["cuda_context"]["mib"]
    # The committed GPU run's served rows count, each less the stub's context measured in the same run.
    rows = {(r["model"], r["variant"]): r for r in document["rows"]
            if r["runtime"].startswith("tritonserver-") and r["status"] == "measured"}
    assert rows and {(row.model, row.variant) for row in committed.served} == set(rows)
    for row in committed.served:
        assert row.gpu_bytes == (rows[row.model, row.variant]["gpu_memory_mib"] - context_mib) * MIB
    assert f"less the stub's CUDA context measured in the same run ({context_mib:.0f} MiB)" in committed.origin
    assert Coefficients.read(ROOT / "no-such.json").origin.endswith("does not exist")
    # Without the stub's context the served rows cannot be turned into the fleet's figures: not used.
    without = {**document, "stub_context": None}
    assert Coefficients.from_gpu_check(without).served == ()
    assert "no measured stub context" in Coefficients.from_gpu_check(without).origin
    # In-process rows alone are not used.
    in_process = {**document, "rows": [r for r in document["rows"] if not r["runtime"].startswith("tritonserver-")]}
    assert "in-process rows are not used" in Coefficients.from_gpu_check(in_process).origin
    document = {**in_process, "stub_context": {"figures": {"cuda_context": {"mib": 500.0}}}}
    document["rows"].append({"model": "m", "variant": "fp32", "runtime": "tritonserver-onnxruntime-cuda",
                             "status": "measured", "load_s": 0.8, "gpu_memory_mib": 700.0})
    document["rows"].append({"model": "m", "variant": "fp16", "runtime": "tritonserver-onnxruntime-cpu",
                             "status": "measured", "load_s": 0.2, "gpu_memory_mib": 1.0})
    read = Coefficients.from_gpu_check(document)
    assert [row.variant for row in read.served] == ["fp32"]
    served = _parts(coefficients=read)
    # the served row less the stand-in's stub context is the graph's figure under the C++ backend
    assert served.gpu_memory().value == 200.0 * MIB
    assert "make gpu-check" in served.gpu_memory().source and "less its stub's CUDA context" in served.gpu_memory().source
    # a python step of the target's own still adds its stub (the fleet runs that one in the python backend)
    with_step = _parts(coefficients=read, python_instances=1)
    assert with_step.gpu_memory().value == 200.0 * MIB + (DOCUMENTED["python_stub_gpu_bytes"].value or 0.0)
    # the stand-in's load includes starting its stub: the documented GPU load stays
    assert served.gpu_load_seconds.value != 0.8 and "documented figure" in served.gpu_load_seconds.source
    assert _parts(coefficients=read, precision="fp16").gpu_memory().value != 200.0 * MIB
    # without the build's figures in the rows, the runtime overhead stays the documented allowance ...
    assert read["runtime_overhead_bytes"] == DOCUMENTED["runtime_overhead_bytes"]
    # ... with them, a GPU run sets it: the largest served row's memory less the stub's context, its
    # weights and working memory; a row without a working memory (TorchScript) is left out
    document["rows"][-2].update(weight_bytes=100 * MIB, working_bytes_cpu=50 * MIB)
    document["rows"].append({"model": "n", "variant": "fp32", "runtime": "tritonserver-onnxruntime-cuda",
                             "status": "measured", "load_s": 0.5, "gpu_memory_mib": 900.0,
                             "weight_bytes": 200 * MIB, "working_bytes_cpu": 0.0})
    document["rows"].append({"model": "t", "variant": "fp32", "runtime": "tritonserver-pytorch-cuda",
                             "status": "measured", "load_s": 0.5, "gpu_memory_mib": 5000.0, "weight_bytes": MIB})
    measured = Coefficients.from_gpu_check(document)["runtime_overhead_bytes"]
    assert measured.value == 200 * MIB and "largest of 2 served rows" in measured.source
    assert _parts(coefficients=Coefficients.from_gpu_check(document), model="other").runtime_overhead_bytes == measured


def test_synth_footprints_of_the_default_manifest() -> None:
    manifest = load_manifest(ROOT / "models.yaml")
    footprints = {f.target: f for f in synth_footprints(manifest.models, ROOT)}
    assert set(footprints) == {target for target, _ in manifest.targets()}
    minilm = footprints["minilm-l6-embedding"]
    # the package's weight files, read from disk (the real all-MiniLM-L6-v2: about 90 MB)
    assert 80e6 < (minilm.weight_bytes.value or 0) < 100e6
    assert minilm.lower_bound and footprints["minilm-l6-text"].python_instances == 1
    resnet = footprints["resnet-synthetic-0"]
    spec = next(s for s in manifest.models if s.name == "resnet-synthetic")
    assert resnet.weight_bytes.value == resnet_parameters(spec.source.config) * 4  # type: ignore[union-attr]


def test_hub_model_sized_from_the_local_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    source = HuggingFaceSource(kind="huggingface", model_id="org/model", revision="a" * 40)
    assert hub_weight_bytes(source, tmp_path)[0] is None
    snapshot = tmp_path / "models--org--model" / "snapshots" / ("a" * 40)
    snapshot.mkdir(parents=True)
    (snapshot / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": 123456}}))
    assert hub_weight_bytes(source, tmp_path) == (123456, "hub index model.safetensors.index.json in the local "
                                                          "cache (metadata.total_size)")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    spec = ModelSpec.model_validate({"name": "hub", "task": "feature-extraction", "source": source.model_dump()})
    assert source_weights(spec, tmp_path).value == 123456


def test_a_synthetic_config_that_cannot_be_counted_is_unknown() -> None:
    spec = ModelSpec.model_validate({"name": "odd", "task": "feature-extraction", "source": {
        "kind": "synthetic", "architecture": "bert", "config": {"hidden_size": "wide"}}})
    figure = source_weights(spec, ROOT)
    assert not figure.known and figure.source.startswith("the synthetic config could not be counted (ValueError")
