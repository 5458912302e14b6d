"""Prebuilt TensorRT plans (``format: tensorrt_plan``, issue 37): the manifest block and its refusals,
the rendered config (parsed into Triton's protobuf), the reproducible tarball and the gate, plans
fetched from a folder and from moto's S3 server, the fleet check the app runs at synth, the smoke
test's handling of a plan, the local endpoint's refusal on the real tritonserver, and the CLI.

The plan files are fake bytes: nothing here claims they run (the build records them as not
verified), and no GPU is needed. Torch, ONNX and the CDK are not mocked; the endpoint test builds a
real ONNX model beside the plan.
"""

from __future__ import annotations

import copy
import hashlib
import json
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient
import yaml
from tritonclient.grpc import model_config_pb2 as mc

from triton_mme_cdk.model_build import gpu_hosts
from triton_mme_cdk.model_build.artifact.gate import check_repository
from triton_mme_cdk.model_build.artifact.pack import package_plans, write_tarball
from triton_mme_cdk.model_build.artifact.render import render_plan_config
from triton_mme_cdk.model_build.artifact.tensorrt_engines import tensorrt_plan_problem
from triton_mme_cdk.model_build.artifact.triton_config import check_config
from triton_mme_cdk.model_build.aws_clients import make_s3_client
from triton_mme_cdk.model_build.errors import (
    ManifestError,
    PackageError,
    SourceError,
    TritonConfigError,
    VerifyError,
)
from triton_mme_cdk.model_build.export.engines import NOT_VERIFIED, fetch_plans
from triton_mme_cdk.model_build.gpu_hosts import TritonRelease
from triton_mme_cdk.model_build.manifest import parse_manifest
from triton_mme_cdk.model_build.pipeline import BuildOptions, build_release
from triton_mme_cdk.model_build.reference import read_reference
from triton_mme_cdk.model_build.release import compute_release
from triton_mme_cdk.model_build.release.identity import entry_model_key

ROOT = Path(__file__).resolve().parents[1]
T4_PLAN, A10G_PLAN = b"fake T4 engine " * 40, b"fake A10G engine " * 50
ENTRY: dict[str, Any] = {
    "name": "resnet-trt",
    "task": "image-classification",
    "format": "tensorrt_plan",
    "source": {"kind": "local", "path": "plans/resnet"},
    "max_batch_size": 8,
    "dynamic_batching": {"preferred_batch_size": [4], "max_queue_delay_microseconds": 100},
    "tensorrt_plan": {
        "tensorrt_version": "10.9.0",
        "cc_model_filenames": {"8.6": "resnet.a10g.plan", "7.5": "resnet.t4.plan"},
        "input": [{"name": "pixel_values", "data_type": "TYPE_FP32", "dims": [3, 224, 224]}],
        "output": [{"name": "logits", "data_type": "TYPE_FP32", "dims": [1000]}],
    },
}


def entry(**changes: Any) -> dict[str, Any]:
    data = copy.deepcopy(ENTRY)
    data.update(changes)
    return data


def plan_block(**changes: Any) -> dict[str, Any]:
    block = copy.deepcopy(ENTRY["tensorrt_plan"])
    block.update(changes)
    return block


def write_plans(base: Path) -> Path:
    folder = base / "plans" / "resnet"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "resnet.t4.plan").write_bytes(T4_PLAN)
    (folder / "resnet.a10g.plan").write_bytes(A10G_PLAN)
    return folder


def refusal(data: dict[str, Any]) -> str:
    """The one problem line of a refused entry (the message's first line is 'manifest: invalid')."""
    with pytest.raises(ManifestError) as caught:
        parse_manifest({"models": [data]})
    head, *lines = str(caught.value).splitlines()
    assert head == "manifest: invalid" and len(lines) == 1, str(caught.value)
    return lines[0]


# --------------------------------------------------------------------------------------------
# Manifest
# --------------------------------------------------------------------------------------------


def test_a_plan_entry_loads_with_its_block() -> None:
    spec = parse_manifest({"models": [ENTRY]}).models[0]
    assert spec.format == "tensorrt_plan" and spec.tensorrt_plan is not None
    assert spec.tensorrt_plan.cc_model_filenames == {"7.5": "resnet.t4.plan", "8.6": "resnet.a10g.plan"}
    assert spec.tensorrt_plan.plan_files() == ["resnet.a10g.plan", "resnet.t4.plan"]
    s3 = parse_manifest({"models": [entry(source={"kind": "s3", "uri": "s3://plans-bucket/resnet"})]})
    assert s3.models[0].source.kind == "s3"


REFUSALS = [
    ("block missing", entry(tensorrt_plan=None),
     "models[0](resnet-trt).tensorrt_plan: missing for format 'tensorrt_plan'; add the block with tensorrt_version"),
    ("block for onnx", entry(format="onnx", image={"image_size": 224}),
     "models[0](resnet-trt).tensorrt_plan: given for format 'onnx'; it applies to format 'tensorrt_plan' only"),
    ("hub source", entry(source={"kind": "huggingface", "model_id": "microsoft/resnet-50", "revision": "a" * 40}),
     "source.kind: got 'huggingface' with format 'tensorrt_plan'; prebuilt plans come from a 'local' folder"),
    ("onnx source", entry(source={"kind": "onnx", "path": "model.onnx"}),
     "source.kind: got 'onnx' with format 'tensorrt_plan'"),
    ("cpu instances", entry(instance_group={"kind": "KIND_CPU"}),
     "instance_group.kind: got 'KIND_CPU'; a TensorRT plan runs on the GPU only: use KIND_GPU"),
    ("auto instances", entry(instance_group={"kind": "KIND_AUTO"}),
     "instance_group.kind: got 'KIND_AUTO'; a TensorRT plan runs on the GPU only: use KIND_GPU"),
    ("fp16", entry(fp16=True), "fp16: given for format 'tensorrt_plan'; its precision was fixed when the plan"),
    ("precision", entry(precision="fp16"), "precision: given for format 'tensorrt_plan'; its precision was fixed"),
    ("optimize", entry(optimize=False), "optimize: given for format 'tensorrt_plan'"),
    ("onnxruntime", entry(onnxruntime={"enable_mem_arena": True}), "onnxruntime: given for format 'tensorrt_plan'"),
    ("tensorrt EP", entry(tensorrt={"precision_mode": "FP16"}),
     "tensorrt: given for format 'tensorrt_plan'; it tunes ONNX Runtime's TensorRT provider, not a prebuilt plan"),
    ("inputs text", entry(task="sentence-embedding", inputs="text"),
     "inputs: got 'text' with format 'tensorrt_plan'"),
    ("text block", entry(task="sentence-embedding", text={"max_sequence_length": 64}),
     "text: given for format 'tensorrt_plan'; a plan's inputs are declared in tensorrt_plan.input"),
    ("image block", entry(image={"image_size": 224}), "image: given for format 'tensorrt_plan'"),
    ("accuracy", entry(accuracy={"min_cosine": 0.9999}), "accuracy: given for format 'tensorrt_plan'"),
    ("no plans", entry(tensorrt_plan=plan_block(cc_model_filenames={})),
     "tensorrt_plan.cc_model_filenames: empty; give at least one plan keyed by compute capability"),
    ("bad cc", entry(tensorrt_plan=plan_block(cc_model_filenames={"sm86": "a.plan"})),
     "tensorrt_plan.cc_model_filenames: key 'sm86' is not a compute capability; use 'major.minor'"),
    ("cc leading zero", entry(tensorrt_plan=plan_block(cc_model_filenames={"08.6": "a.plan"})),
     "tensorrt_plan.cc_model_filenames: key '08.6' is not a compute capability"),
    ("escaping file", entry(tensorrt_plan=plan_block(cc_model_filenames={"8.6": "../a.plan"})),
     "tensorrt_plan.cc_model_filenames['8.6']: got '../a.plan'; a plan is a plain file name in the source folder"),
    ("file in a folder", entry(tensorrt_plan=plan_block(cc_model_filenames={"8.6": "sub/a.plan"})),
     "tensorrt_plan.cc_model_filenames['8.6']: got 'sub/a.plan'"),
    ("hidden file", entry(tensorrt_plan=plan_block(cc_model_filenames={"8.6": ".a.plan"})),
     "tensorrt_plan.cc_model_filenames['8.6']: got '.a.plan'"),
    ("short version", entry(tensorrt_plan=plan_block(tensorrt_version="10.9")),
     "tensorrt_plan.tensorrt_version: got '10.9'; give the TensorRT the plans were built with as major.minor.patch"),
    ("zero dim", entry(tensorrt_plan=plan_block(input=[{"name": "x", "data_type": "TYPE_FP32", "dims": [0, 3]}])),
     "tensorrt_plan.input[0](x).dims: got [0, 3]; give 1 to 8 dimensions, each -1 (variable) or >= 1"),
    ("no dims", entry(tensorrt_plan=plan_block(output=[{"name": "y", "data_type": "TYPE_FP32", "dims": []}])),
     "tensorrt_plan.output[0](y).dims: got []"),
    ("string type", entry(tensorrt_plan=plan_block(input=[{"name": "x", "data_type": "TYPE_STRING", "dims": [3]}])),
     "tensorrt_plan.input[0](x).data_type: got \"TYPE_STRING\"; input should be 'TYPE_BOOL'"),
    ("numpy spelling", entry(tensorrt_plan=plan_block(input=[{"name": "x", "data_type": "float32", "dims": [3]}])),
     "tensorrt_plan.input[0](x).data_type: got \"float32\""),
    ("bad name", entry(tensorrt_plan=plan_block(input=[{"name": "a b", "data_type": "TYPE_FP32", "dims": [3]}])),
     "tensorrt_plan.input[0].name: got 'a b'; give the engine's tensor name"),
    ("name twice", entry(tensorrt_plan=plan_block(output=[{"name": "pixel_values", "data_type": "TYPE_FP32",
                                                             "dims": [1]}])),
     "tensorrt_plan.output[0](pixel_values).name: got 'pixel_values', already the name of input[0]"),
    ("no outputs", entry(tensorrt_plan=plan_block(output=[])),
     "tensorrt_plan.output: empty; declare every output of the engine"),
    ("unknown key", entry(tensorrt_plan=plan_block(plans={"8.6": "a.plan"})),
     "tensorrt_plan.plans: unknown key; remove it or check its spelling"),
]


@pytest.mark.parametrize(("data", "expected"), [(d, e) for _, d, e in REFUSALS], ids=[i for i, _, _ in REFUSALS])
def test_each_refusal_is_one_line_naming_the_field_the_value_and_the_fix(data: dict[str, Any], expected: str) -> None:
    assert expected in refusal(data)


def test_the_manifest_hash_and_the_model_key_follow_the_block_and_the_plan_bytes(tmp_path: Path) -> None:
    folder = write_plans(tmp_path)
    manifest = parse_manifest({"models": [ENTRY]})
    same = parse_manifest({"models": [entry(tensorrt_plan=plan_block(cc_model_filenames={
        "7.5": "resnet.t4.plan", "8.6": "resnet.a10g.plan"}))]})  # the same map, another order
    other = parse_manifest({"models": [entry(tensorrt_plan=plan_block(tensorrt_version="10.9.1"))]})
    assert manifest.content_sha256() == same.content_sha256() != other.content_sha256()

    def key(spec: Any) -> str:
        return entry_model_key(spec, base_dir=tmp_path)

    before = key(manifest.models[0])
    assert key(same.models[0]) == before and key(other.models[0]) != before
    (folder / "resnet.t4.plan").write_bytes(T4_PLAN + b"rebuilt")
    assert key(manifest.models[0]) != before  # the plan's bytes are part of a local source's key


# --------------------------------------------------------------------------------------------
# Config, tarball, gate
# --------------------------------------------------------------------------------------------


def test_the_config_is_triton_s_tensorrt_plan_config_with_cc_model_filenames() -> None:
    text = render_plan_config(parse_manifest({"models": [ENTRY]}).models[0])
    config = mc.ModelConfig()
    from google.protobuf import text_format

    text_format.Parse(text, config)
    assert (config.name, config.platform, config.backend) == ("resnet-trt", "tensorrt_plan", "tensorrt")
    assert config.max_batch_size == 8 and not config.default_model_filename
    assert dict(config.cc_model_filenames) == {"7.5": "resnet.t4.plan", "8.6": "resnet.a10g.plan"}
    assert [(io.name, mc.DataType.Name(io.data_type), list(io.dims)) for io in config.input] == [
        ("pixel_values", "TYPE_FP32", [3, 224, 224])]
    assert [(io.name, mc.DataType.Name(io.data_type), list(io.dims)) for io in config.output] == [
        ("logits", "TYPE_FP32", [1000])]
    assert [(mc.ModelInstanceGroup.Kind.Name(g.kind), g.count) for g in config.instance_group] == [("KIND_GPU", 1)]
    assert list(config.dynamic_batching.preferred_batch_size) == [4]
    assert config.dynamic_batching.max_queue_delay_microseconds == 100
    assert text.index('key: "7.5"') < text.index('key: "8.6"')  # map keys printed sorted: stable text


@pytest.mark.parametrize(("change", "expected"), [
    (("KIND_GPU", "KIND_CPU"), "instance_group[0].kind: got 'KIND_CPU'; a TensorRT plan runs on the GPU only"),
    (('key: "7.5"', 'key: "sm75"'), "cc_model_filenames key: got 'sm75'; a compute capability"),
    (('"resnet.t4.plan"', '"../t4.plan"'), "cc_model_filenames['7.5']: got '../t4.plan'; a plain file name"),
    (("TYPE_FP32\n  dims: 1000", "TYPE_STRING\n  dims: 1000"), "output[0](logits).data_type: got 'TYPE_STRING'"),
], ids=["cpu", "cc", "file", "dtype"])
def test_check_config_refuses_a_plan_config_the_tensorrt_backend_would_not_load(change: tuple[str, str],
                                                                                 expected: str) -> None:
    text = render_plan_config(parse_manifest({"models": [ENTRY]}).models[0])
    assert change[0] in text
    with pytest.raises(TritonConfigError) as caught:
        check_config(text.replace(*change), model="resnet-trt")
    assert expected in str(caught.value)


def _build(base: Path, out: Path, manifest: dict[str, Any] | None = None) -> tuple[Any, Path]:
    loaded = parse_manifest(manifest or {"models": [ENTRY]})
    release = compute_release(loaded, base_dir=base)
    return build_release(loaded, release, BuildOptions(base_dir=base), out_dir=out)


def test_the_build_packs_config_and_plans_reproducibly_and_says_the_plan_was_not_run(tmp_path: Path) -> None:
    write_plans(tmp_path)
    record, release_dir = _build(tmp_path, tmp_path / "out1")
    again, again_dir = _build(tmp_path, tmp_path / "out2")
    tarball = release_dir / "resnet-trt.tar.gz"
    assert tarball.read_bytes() == (again_dir / "resnet-trt.tar.gz").read_bytes()
    with tarfile.open(tarball) as tar:
        members = {m.name: (m.isdir(), m.mtime, m.uid, tar.extractfile(m).read() if m.isfile() else b"")  # type: ignore[union-attr]
                   for m in tar.getmembers()}
    assert sorted(members) == ["resnet-trt", "resnet-trt/1", "resnet-trt/1/resnet.a10g.plan",
                               "resnet-trt/1/resnet.t4.plan", "resnet-trt/config.pbtxt"]
    assert members["resnet-trt/1/resnet.t4.plan"][3] == T4_PLAN
    assert members["resnet-trt/1/resnet.a10g.plan"][3] == A10G_PLAN
    assert members["resnet-trt/config.pbtxt"][3].decode() == (release_dir / "resnet-trt.config.pbtxt").read_text()
    assert {(mtime, uid) for _, mtime, uid, _ in members.values()} == {(0, 0)}
    result = record.models[0]
    assert result.sha256 == hashlib.sha256(tarball.read_bytes()).hexdigest() == again.models[0].sha256
    # What the build records about verification: not run, nothing measured, never a difference of 0.
    assert result.verified is False and result.max_abs_diff == {} and result.reference_check == NOT_VERIFIED
    assert result.precision == "unknown" and result.accuracy == {}
    assert result.difference_text().startswith("not run (not verified: a TensorRT plan cannot run on CPU")
    assert "export + optimize + validate" not in result.step_seconds
    assert set(result.step_seconds) == {"fetch plans (not run: no GPU)", "config", "package", "pre-publish gate"}
    # The reference holds the request a smoke test sends (declared-shape zeros) and no outputs.
    with pytest.raises(VerifyError, match="needs at least one input and one output"):
        read_reference(release_dir / "resnet-trt.reference.npz")
    inputs, outputs = read_reference(release_dir / "resnet-trt.reference.npz", outputs_required=False)
    assert outputs == {} and list(inputs) == ["pixel_values"]
    assert inputs["pixel_values"].shape == (1, 3, 224, 224) and inputs["pixel_values"].dtype == np.float32
    assert not inputs["pixel_values"].any()


def _unpacked_with(tmp_path: Path, files: dict[str, bytes]) -> Path:
    config = render_plan_config(parse_manifest({"models": [ENTRY]}).models[0])
    tarball = tmp_path / "hostile.tar.gz"
    write_tarball({"resnet-trt/config.pbtxt": config.encode(), **files}, tarball)
    return tarball


def test_the_gate_passes_a_built_plan_and_refuses_a_missing_or_empty_plan_file(tmp_path: Path) -> None:
    write_plans(tmp_path)
    _, release_dir = _build(tmp_path, tmp_path / "out")
    assert check_repository(release_dir / "resnet-trt.tar.gz", model="resnet-trt") == "resnet-trt"
    missing = _unpacked_with(tmp_path, {"resnet-trt/1/resnet.t4.plan": T4_PLAN})
    with pytest.raises(VerifyError, match=r"plan file 'resnet.a10g.plan': missing in version folder '1'"):
        check_repository(missing, model="resnet-trt")
    empty = _unpacked_with(tmp_path, {"resnet-trt/1/resnet.t4.plan": T4_PLAN, "resnet-trt/1/resnet.a10g.plan": b""})
    with pytest.raises(VerifyError, match=r"plan file 'resnet.a10g.plan': empty in version folder '1'"):
        check_repository(empty, model="resnet-trt")


def test_package_plans_takes_the_files_the_config_names_and_refuses_an_empty_one(tmp_path: Path) -> None:
    folder = write_plans(tmp_path)
    config = render_plan_config(parse_manifest({"models": [ENTRY]}).models[0])
    (folder / "resnet.t4.plan").write_bytes(b"")
    with pytest.raises(PackageError, match=r"plan file 'resnet.t4.plan': empty in"):
        package_plans(model_name="resnet-trt", config_text=config, plan_dir=folder, out_path=tmp_path / "x.tar.gz")
    onnx_config = config.replace('platform: "tensorrt_plan"', 'platform: "onnxruntime_onnx"').replace(
        'backend: "tensorrt"', 'backend: "onnxruntime"')
    with pytest.raises(PackageError, match="a plan tarball needs backend 'tensorrt'"):
        package_plans(model_name="resnet-trt", config_text=onnx_config.split("cc_model_filenames")[0],
                      plan_dir=folder, out_path=tmp_path / "x.tar.gz")
    assert not (tmp_path / "x.tar.gz").exists()


# --------------------------------------------------------------------------------------------
# Fetching plans: a local folder, an S3 prefix (moto's server)
# --------------------------------------------------------------------------------------------


def test_a_local_plan_that_is_missing_empty_or_links_outside_the_folder_is_refused(tmp_path: Path) -> None:
    folder = write_plans(tmp_path)
    spec = parse_manifest({"models": [ENTRY]}).models[0]
    assert fetch_plans(spec, base_dir=tmp_path, work_dir=tmp_path / "work") == folder.resolve()
    (folder / "resnet.t4.plan").unlink()
    with pytest.raises(SourceError, match=r"'resnet.t4.plan' is missing in source.path 'plans/resnet'"):
        fetch_plans(spec, base_dir=tmp_path, work_dir=tmp_path / "work")
    (folder / "resnet.t4.plan").write_bytes(b"")
    with pytest.raises(SourceError, match=r"'resnet.t4.plan' in source.path 'plans/resnet' is an empty file"):
        fetch_plans(spec, base_dir=tmp_path, work_dir=tmp_path / "work")
    (folder / "resnet.t4.plan").unlink()
    (tmp_path / "elsewhere.plan").write_bytes(T4_PLAN)
    (folder / "resnet.t4.plan").symlink_to(tmp_path / "elsewhere.plan")
    with pytest.raises(SourceError, match=r"'resnet.t4.plan' in 'plans/resnet' links outside the source folder"):
        fetch_plans(spec, base_dir=tmp_path, work_dir=tmp_path / "work")
    gone = parse_manifest({"models": [entry(source={"kind": "local", "path": "plans/none"})]}).models[0]
    with pytest.raises(SourceError, match=r"source.path: 'plans/none': folder .* does not exist"):
        fetch_plans(gone, base_dir=tmp_path, work_dir=tmp_path / "work")


def test_an_s3_plan_source_downloads_the_declared_keys_alone(tmp_path: Path, endpoint: str) -> None:
    s3 = make_s3_client(endpoint_url=endpoint)
    s3.create_bucket(Bucket="plans-bucket")
    s3.put_object(Bucket="plans-bucket", Key="resnet/resnet.t4.plan", Body=T4_PLAN)
    s3.put_object(Bucket="plans-bucket", Key="resnet/resnet.a10g.plan", Body=A10G_PLAN)
    s3.put_object(Bucket="plans-bucket", Key="resnet/model.onnx", Body=b"not declared: never read")
    manifest = {"models": [entry(source={"kind": "s3", "uri": "s3://plans-bucket/resnet"})]}
    spec = parse_manifest(manifest).models[0]
    folder = fetch_plans(spec, base_dir=tmp_path, work_dir=tmp_path / "work", s3_client=s3)
    assert sorted(p.name for p in folder.iterdir()) == ["resnet.a10g.plan", "resnet.t4.plan"]
    assert (folder / "resnet.t4.plan").read_bytes() == T4_PLAN
    # The whole build from S3 ends in a tarball that holds the downloaded plans.
    loaded = parse_manifest(manifest)
    _, release_dir = build_release(loaded, compute_release(loaded, base_dir=tmp_path),
                                   BuildOptions(base_dir=tmp_path, s3_client=s3), out_dir=tmp_path / "out")
    with tarfile.open(release_dir / "resnet-trt.tar.gz") as tar:
        assert tar.extractfile("resnet-trt/1/resnet.a10g.plan").read() == A10G_PLAN  # type: ignore[union-attr]
    s3.delete_object(Bucket="plans-bucket", Key="resnet/resnet.a10g.plan")
    with pytest.raises(SourceError, match=r"'resnet.a10g.plan' is missing: no object s3://plans-bucket/resnet/"):
        fetch_plans(spec, base_dir=tmp_path, work_dir=tmp_path / "work2", s3_client=s3)


# --------------------------------------------------------------------------------------------
# The fleet check (run at synth by the app)
# --------------------------------------------------------------------------------------------


@pytest.fixture
def release_2501(monkeypatch: pytest.MonkeyPatch) -> None:
    """A Triton image row of our own (the real table is filled in elsewhere)."""
    monkeypatch.setitem(gpu_hosts.TRITON_RELEASES, "25.01", TritonRelease(
        version="25.01", cuda="12.8.0", tensorrt="10.8.0.43", min_driver=570,
        min_compute_capability="7.5"))


def _fleet_manifest(**block: Any) -> Any:
    other = {"name": "tiny", "source": {"kind": "synthetic", "architecture": "resnet"}, "task": "image-classification"}
    return parse_manifest({"models": [other, other | {"name": "tiny2"}, entry(tensorrt_plan=plan_block(**block))]})


def test_the_fleet_check_names_a_gpu_without_a_plan(release_2501: None) -> None:
    manifest = _fleet_manifest(tensorrt_version="10.8.0", cc_model_filenames={"7.5": "resnet.t4.plan"})
    assert tensorrt_plan_problem(manifest, instance_type="ml.g5.xlarge", image_version="25.01") == (
        "models[2] 'resnet-trt' tensorrt_plan.cc_model_filenames: the fleet's ml.g5.xlarge has an NVIDIA A10G, "
        "compute capability 8.6; plans are given for 7.5: build the plan on an A10G and add it under \"8.6\", or "
        "change mme:instance_type")
    problem = tensorrt_plan_problem(manifest, instance_type="ml.p3.2xlarge", image_version="25.01")
    assert problem is not None and "has an NVIDIA V100, compute capability 7.0" in problem
    assert "build the plan on a V100" in problem


def test_the_fleet_check_names_a_tensorrt_version_the_image_does_not_have(release_2501: None) -> None:
    manifest = _fleet_manifest()  # built with 10.9.0; image 25.01 has 10.8.0
    assert tensorrt_plan_problem(manifest, instance_type="ml.g4dn.xlarge", image_version="25.01") == (
        "models[2] 'resnet-trt' tensorrt_plan.tensorrt_version: got '10.9.0'; Triton image 25.01 has TensorRT "
        "10.8.0.43, and a plan loads only with the TensorRT that built it: rebuild the plans with TensorRT "
        "10.8.0.43 (the 25.01 NGC TensorRT container), or choose the mme:triton_image_version whose TensorRT is "
        "10.9.0")


def test_the_fleet_check_passes_matching_plans_and_compares_major_minor_patch(release_2501: None) -> None:
    for version in ("10.8.0", "10.8.0.43", "10.8.0.1"):
        manifest = _fleet_manifest(tensorrt_version=version)
        assert tensorrt_plan_problem(manifest, instance_type="ml.g5.12xlarge", image_version="25.01") is None
        assert tensorrt_plan_problem(manifest, instance_type="ml.g4dn.2xlarge", image_version="25.01") is None
    problem = tensorrt_plan_problem(_fleet_manifest(tensorrt_version="10.8.1"), instance_type="ml.g5.xlarge",
                                    image_version="25.01")
    assert problem is not None and "got '10.8.1'" in problem


def test_the_fleet_check_reports_what_it_cannot_know_never_as_fine(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gpu_hosts, "TRITON_RELEASES", {})
    manifest = _fleet_manifest()
    unknown_image = tensorrt_plan_problem(manifest, instance_type="ml.g5.xlarge", image_version="24.09")
    assert unknown_image is not None and unknown_image.startswith(
        "models[2] 'resnet-trt' tensorrt_plan.tensorrt_version: '10.9.0' cannot be checked for "
        "mme:triton_image_version '24.09'")
    unknown_gpu = tensorrt_plan_problem(manifest, instance_type="ml.g6.xlarge", image_version="24.09")
    assert unknown_gpu is not None and "cannot be checked for mme:instance_type 'ml.g6.xlarge'" in unknown_gpu
    # Without plans there is nothing to check, and the tables are not read.
    plain = parse_manifest({"models": [{"name": "tiny", "source": {"kind": "synthetic", "architecture": "resnet"},
                                        "task": "image-classification"}]})
    assert tensorrt_plan_problem(plain, instance_type="ml.g6.xlarge", image_version="24.09") is None


# --------------------------------------------------------------------------------------------
# The smoke test's view of a plan (a GPU endpoint: names, types and shapes; no values)
# --------------------------------------------------------------------------------------------


def _answer(name: str, datatype: str, values: np.ndarray) -> Any:
    body = json.dumps({"model_name": "resnet-trt", "outputs": [
        {"name": name, "datatype": datatype, "shape": list(values.shape), "data": values.reshape(-1).tolist()}]})
    return httpclient.InferResult.from_response_body(body.encode(), header_length=None)


def test_smoke_prepares_declared_zeros_for_a_plan_and_checks_its_answer_without_values(
        tmp_path: Path, endpoint: str) -> None:
    from triton_mme_cdk.model_build.tools.smoke.prepare import CallFailed, prepare_reference
    from triton_mme_cdk.model_build.tools.smoke.runner import _check_answer

    write_plans(tmp_path)
    _, release_dir = _build(tmp_path, tmp_path / "out")
    s3 = make_s3_client(endpoint_url=endpoint)
    s3.create_bucket(Bucket="smoke-plan")
    for name in ("resnet-trt.reference.npz", "resnet-trt.config.pbtxt"):
        s3.put_object(Bucket="smoke-plan", Key=f"store/{name}", Body=(release_dir / name).read_bytes())
    keys = {"resnet-trt.npz": "store/resnet-trt.reference.npz", "resnet-trt.config.pbtxt": "store/resnet-trt.config.pbtxt"}
    reference = prepare_reference(s3, "smoke-plan", "models", "resnet-trt", {"target_model": "resnet-trt.tar.gz"},
                                   {}, tmp_path, keys)
    assert reference.error is None and reference.values_checked is False
    assert reference.batch == 1 and reference.outputs == {} and reference.body
    assert _check_answer(_answer("logits", "FP32", np.random.rand(1, 1000)), reference, 1e-3, 1e-3) is None
    with pytest.raises(CallFailed, match=r"output 'logits': shape \[1, 999\]; expected \[1, 1000\]"):
        _check_answer(_answer("logits", "FP32", np.zeros((1, 999))), reference, 1e-3, 1e-3)
    with pytest.raises(CallFailed, match=r"output 'logits': datatype FP16; the config declares FP32"):
        _check_answer(_answer("logits", "FP16", np.zeros((1, 1000))), reference, 1e-3, 1e-3)


# --------------------------------------------------------------------------------------------
# The local endpoint (the real tritonserver on CPU) and the smoke test against it
# --------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_the_local_endpoint_refuses_a_plan_plainly_and_keeps_serving_and_smoke_skips_it(tmp_path: Path) -> None:
    from botocore.exceptions import ClientError
    from triton_helpers import served_manifest  # tests/ is on sys.path; imported here: it needs the server

    from triton_mme_cdk.model_build.tools.local_endpoint.server import ENDPOINT_NAME
    from triton_mme_cdk.model_build.tools.smoke.prepare import make_client, make_runtime_client
    from triton_mme_cdk.model_build.tools.smoke.runner import run_smoke

    write_plans(tmp_path)
    tiny = {"name": "tiny-onnx", "task": "image-classification", "max_batch_size": 2, "image": {"image_size": 32},
            "source": {"kind": "synthetic", "architecture": "resnet", "seed": 1, "config": {
                "embedding_size": 8, "hidden_sizes": [8, 8, 16, 16], "depths": [1, 1, 1, 1],
                "layer_type": "basic", "num_labels": 4}}}
    manifest = parse_manifest({"models": [tiny, ENTRY]})
    with served_manifest(manifest, tmp_path, tmp_path / "build", "plan-endpoint") as (local, runtime, s3):
        body = np.zeros(4, dtype=np.float32).tobytes()
        with pytest.raises(ClientError) as caught:
            runtime.invoke_endpoint(EndpointName=ENDPOINT_NAME, TargetModel="resnet-trt.tar.gz",
                                    ContentType="application/octet-stream", Body=body)
        error = caught.value.response
        assert error["Error"]["Code"] == "CannotServeOnCpu"
        assert error["ResponseMetadata"]["HTTPStatusCode"] == 501
        assert error["Error"]["Message"].startswith(
            "model 'resnet-trt.tar.gz' is a TensorRT plan (tensorrt_plan); the local endpoint runs on CPU and "
            "cannot load it")
        assert "resnet-trt.tar.gz" not in local.cache.loaded_targets()
        report = run_smoke(
            endpoint_name=ENDPOINT_NAME, sagemaker_client=make_client("sagemaker", endpoint_url=local.url),
            runtime_client=make_runtime_client(endpoint_url=local.url, timeout_seconds=120), s3_client=s3,
            release=local.release.release_id, timeout_seconds=120)
        rows = {row.target: row for row in report.rows}
        assert rows["tiny-onnx.tar.gz"].ok and rows["tiny-onnx.tar.gz"].max_diff is not None
        plan = rows["resnet-trt.tar.gz"]
        assert not plan.ok and plan.error is None and plan.kind is None
        assert plan.skipped is not None and "the local endpoint runs on CPU and cannot load it" in plan.skipped
        assert [row.target for row in report.skipped] == ["resnet-trt.tar.gz"] and report.failures == []
        assert report.summary() == "1 of 2 targets passed; 1 skipped, 0 failed" and report.ok
        assert "tiny-onnx.tar.gz" in local.cache.loaded_targets()  # the server kept serving the other model


# --------------------------------------------------------------------------------------------
# The CLI
# --------------------------------------------------------------------------------------------


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "model_build", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)


def test_the_cli_builds_a_plan_entry_into_a_tarball_and_refuses_a_bad_one_in_one_line(tmp_path: Path) -> None:
    write_plans(tmp_path)
    good = tmp_path / "models.yaml"
    good.write_text(yaml.safe_dump({"version": 1, "models": [ENTRY]}))
    result = cli("build", "--manifest", str(good), "--out", str(tmp_path / "build"))
    assert result.returncode == 0, result.stderr
    assert "tensorrt_plan" in result.stdout and "not run (not verified" in result.stdout
    assert list((tmp_path / "build").glob("r-*/resnet-trt.tar.gz"))

    (tmp_path / "plans" / "resnet" / "resnet.a10g.plan").unlink()
    result = cli("build", "--manifest", str(good), "--out", str(tmp_path / "build2"))
    output = result.stdout + result.stderr
    assert result.returncode == 1 and "Traceback" not in output
    errors = [line for line in output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "'resnet.a10g.plan' is missing in source.path 'plans/resnet'" in errors[0]

    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"version": 1, "models": [entry(instance_group={"kind": "KIND_CPU"})]}))
    result = cli("validate", "--manifest", str(bad))
    output = result.stdout + result.stderr
    assert result.returncode == 1 and "Traceback" not in output
    assert [line for line in output.splitlines() if line.startswith("error:")] == [f"error: {bad}: invalid"]
    assert ("models[0](resnet-trt).instance_group.kind: got 'KIND_CPU'; a TensorRT plan runs on the GPU only: "
            "use KIND_GPU") in output


# --------------------------------------------------------------------------------------------
# The fleet check at synth, on the real table
# --------------------------------------------------------------------------------------------


def _s3_plan_manifest(tmp_path: Path, **block: Any) -> Path:
    plan = entry(source={"kind": "s3", "uri": "s3://plans-bucket/resnet"}, tensorrt_plan=plan_block(**block))
    path = tmp_path / "models.yaml"
    path.write_text(yaml.safe_dump({"version": 1, "models": [plan]}), encoding="utf-8")
    return path


@pytest.mark.slow
def test_synth_refuses_a_fleet_its_plans_do_not_fit_and_warns_where_it_cannot_compare(tmp_path: Path) -> None:
    from aws_cdk.assertions import Annotations, Match
    from cdk_helpers import synth

    from triton_mme_cdk.constructs.sagemaker_limits import PropsError

    only_t4 = _s3_plan_manifest(tmp_path, cc_model_filenames={"7.5": "resnet.t4.plan"})
    with pytest.raises(PropsError) as caught:
        synth(tmp_path / "a", nag=False, manifest_path=only_t4)  # the default fleet: ml.g5.xlarge (A10G, 8.6)
    assert str(caught.value) == (
        "models[0] 'resnet-trt' tensorrt_plan.cc_model_filenames: the fleet's ml.g5.xlarge has an NVIDIA A10G, "
        "compute capability 8.6; plans are given for 7.5: build the plan on an A10G and add it under \"8.6\", or "
        "change mme:instance_type")
    # 24.05's TensorRT (10.0.1) is confirmed: a plan of 10.9.0 cannot load there.
    with pytest.raises(PropsError) as caught:
        synth(tmp_path / "b", nag=False, manifest_path=_s3_plan_manifest(tmp_path), triton_image_version="24.05")
    assert str(caught.value).startswith("models[0] 'resnet-trt' tensorrt_plan.tensorrt_version: got '10.9.0'; "
                                        "Triton image 24.05 has TensorRT 10.0.1")
    fits = synth(tmp_path / "c", nag=False, manifest_path=_s3_plan_manifest(tmp_path, tensorrt_version="10.0.1.6"),
                 triton_image_version="24.05")
    assert Annotations.from_stack(fits.stack).find_warning("*", Match.string_like_regexp("TensorRT")) == []
    # 25.04's TensorRT (the default fleet's image) is not confirmed: synth goes on, and says the versions were not compared.
    unknown = synth(tmp_path / "d", nag=False, manifest_path=_s3_plan_manifest(tmp_path))
    warnings = [str(w.entry.data) for w in Annotations.from_stack(unknown.stack).find_warning(
        "*", Match.string_like_regexp("TensorRT"))]
    assert len(warnings) == 1 and warnings[0].startswith(
        "the TensorRT of Triton image 25.04 is not confirmed in model_build/gpu_hosts.py, so the plans' TensorRT "
        "versions (resnet-trt 10.9.0) are not checked against it")
