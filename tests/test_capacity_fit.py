"""The fit checks of issue 50, point 3: at synth (the construct, synthesized for real), at
``validate --instance-type`` (the CLI in a subprocess) and at build (a real build, its footprint
measured with a real ONNX Runtime session, recorded in the release index and checked before the
release is published to a real S3 server on loopback).

The big model is a synthetic BERT whose config alone makes it ~19 GiB: synth sizes it from its
parameter count and never builds it. It fits the A10G of ``ml.g5.xlarge`` (24 GiB) and not the T4 of
``ml.g4dn.xlarge`` (16 GiB), nor the A10G once ``SAGEMAKER_TRITON_MODEL_LOAD_GPU_LIMIT`` caps it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import aws_cdk as cdk
import pytest
from aws_cdk.assertions import Annotations, Match
from tar_helpers import tar_gz  # tests/ is on sys.path

from triton_mme_cdk import ModelSource, PropsError, TritonMultiModelEndpoint
from triton_mme_cdk.model_build.capacity.fit import Fleet, check_fit, fleet_from_record, release_check
from triton_mme_cdk.model_build.capacity.footprint import Coefficients, Footprint, index_footprints
from triton_mme_cdk.model_build.capacity.sizing import bert_parameters
from triton_mme_cdk.model_build.errors import FitError

ROOT = Path(__file__).resolve().parents[1]
BIG_BERT = {"vocab_size": 5_000_000, "hidden_size": 1024, "num_hidden_layers": 2, "num_attention_heads": 8,
            "intermediate_size": 4096}


def _manifest(folder: Path, *entries: dict[str, Any]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "models.yaml"
    path.write_text(json.dumps({"version": 1, "models": list(entries)}))
    return path


def _big(name: str = "huge-bert", **extra: Any) -> dict[str, Any]:
    return {"name": name, "task": "feature-extraction", "max_batch_size": 8,
            "source": {"kind": "synthetic", "architecture": "bert", "config": BIG_BERT}, **extra}


def _tiny(name: str = "tiny-resnet", **extra: Any) -> dict[str, Any]:
    return {"name": name, "task": "image-classification", "max_batch_size": 4, "image": {"image_size": 32},
            "source": {"kind": "synthetic", "architecture": "resnet", "config": {
                "embedding_size": 8, "hidden_sizes": [8, 16], "depths": [1, 1], "layer_type": "basic",
                "num_labels": 3}}, **extra}


def _endpoint(models: ModelSource, **settings: Any) -> cdk.Stack:
    stack = cdk.Stack(cdk.App(analytics_reporting=False), "Fit")
    TritonMultiModelEndpoint(stack, "Endpoint", models=models, **settings)
    return stack


def _warnings(stack: cdk.Stack) -> list[str]:
    return [str(entry.entry.data) for entry in Annotations.from_stack(stack).find_warning("*", Match.any_value())]


# ---------------------------------------------------------------------------------------------
# At synth
# ---------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_synth_refuses_a_model_larger_than_the_fleets_gpu(tmp_path: Path) -> None:
    models = ModelSource.from_manifest(_manifest(tmp_path, _big()))
    weights = bert_parameters(BIG_BERT, "feature-extraction") * 4
    with pytest.raises(PropsError) as refused:
        _endpoint(models, instance_type="ml.g4dn.xlarge")
    message = str(refused.value)
    assert message.startswith("model 'huge-bert' needs at least ")
    overhead = Coefficients.read()["runtime_overhead_bytes"].value  # the committed GPU check's, else the allowance
    assert overhead and f"{(weights + overhead) / 2**30:.2f} GiB of GPU memory" in message
    assert "instance_type ml.g4dn.xlarge gives: an NVIDIA T4 with 16.00 GiB" in message
    assert "estimate" in message
    # The same manifest fits the A10G of ml.g5.xlarge: each endpoint against its own fleet.
    fits = _endpoint(models, instance_type="ml.g5.xlarge")
    assert not [w for w in _warnings(fits) if "huge-bert" in w]
    # ... until the load limit caps what a load may find in use.
    with pytest.raises(PropsError, match=r"24\.00 GiB, 11\.84 GiB usable \(x SAGEMAKER_TRITON_MODEL_LOAD_GPU_LIMIT=0\.5"):
        _endpoint(models, instance_type="ml.g5.xlarge",
                  triton_environment={"SAGEMAKER_TRITON_MODEL_LOAD_GPU_LIMIT": "0.5"})
    with pytest.raises(PropsError, match=r"SAGEMAKER_TRITON_MODEL_LOAD_GPU_LIMIT: got '1\.5'; expected a fraction"):
        _endpoint(models, instance_type="ml.g5.xlarge",
                  triton_environment={"SAGEMAKER_TRITON_MODEL_LOAD_GPU_LIMIT": "1.5"})


@pytest.mark.slow
def test_synth_warns_of_a_served_set_larger_than_the_disk_and_of_what_it_cannot_size(tmp_path: Path) -> None:
    # 80 copies of a ~1 GiB model: about 160 GiB of tarballs and unpacked files, over g4dn.xlarge's 125 GB.
    medium = {**BIG_BERT, "vocab_size": 250_000}
    entry = _big("medium-bert", copies=80)
    entry["source"]["config"] = medium
    s3_entry = {"name": "from-s3", "task": "feature-extraction", "source": {"kind": "s3", "uri": "s3://bucket/model"}}
    stack = _endpoint(ModelSource.from_manifest(_manifest(tmp_path, entry, s3_entry)), instance_type="ml.g4dn.xlarge")
    warnings = _warnings(stack)
    (disk,) = [w for w in warnings if w.startswith("the served set")]
    assert "the served set of 81 target models takes " in disk
    assert "more than the 125.0 GB instance store of ml.g4dn.xlarge" in disk
    (unknown,) = [w for w in warnings if "from-s3" in w]
    assert "GPU memory estimate unknown" in unknown and "an s3 source is sized at deploy" in unknown
    # the same set fits the 900 GB of ml.g4dn.8xlarge: no disk warning there
    roomy = _endpoint(ModelSource.from_manifest(_manifest(tmp_path / "b", entry)), instance_type="ml.g4dn.8xlarge")
    assert not [w for w in _warnings(roomy) if w.startswith("the served set")]


@pytest.mark.slow
def test_two_endpoints_in_one_stack_are_each_checked_against_their_own_fleet(tmp_path: Path) -> None:
    # About 160 GB of served set: over the 125 GB of ml.g4dn.xlarge, within the 250 GB of ml.g5.xlarge.
    entry = _big("medium-bert", copies=80)
    entry["source"]["config"] = {**BIG_BERT, "vocab_size": 250_000}
    models = ModelSource.from_manifest(_manifest(tmp_path, entry))
    stack = cdk.Stack(cdk.App(analytics_reporting=False), "Two")
    TritonMultiModelEndpoint(stack, "Small", models=models, instance_type="ml.g4dn.xlarge", endpoint_name="small",
                             model_prefix="small")
    TritonMultiModelEndpoint(stack, "Large", models=models, instance_type="ml.g5.xlarge", endpoint_name="large",
                             model_prefix="large")
    found = Annotations.from_stack(stack).find_warning("*", Match.string_like_regexp("^the served set"))
    assert [entry.id for entry in found] == ["/Two/Small"]


def _index(footprints: list[Footprint], release_id: str = "r-0123456789abcdef") -> dict[str, Any]:
    return {"schema": 1, "release_id": release_id, "models": [
        {"target_model": f"{f.target}.tar.gz", "source_model": f.model, "size": 10, "footprint": f.to_json()}
        for f in footprints]}


@pytest.mark.slow
def test_a_release_is_checked_against_its_index_where_synth_can_read_it(tmp_path: Path) -> None:
    from triton_mme_cdk.model_build.capacity.sizing import synth_footprints
    from triton_mme_cdk.model_build.manifest import load_manifest

    manifest = load_manifest(_manifest(tmp_path, _big()))
    index = tmp_path / "_index.json"
    index.write_text(json.dumps(_index(synth_footprints(manifest.models, tmp_path))))
    with pytest.raises(PropsError, match=r"^model 'huge-bert' needs at least .* ml\.g4dn\.xlarge"):
        _endpoint(ModelSource.from_release("r-0123456789abcdef", index=index), instance_type="ml.g4dn.xlarge")
    (unknown,) = [w for w in _warnings(_endpoint(ModelSource.from_release("r-0123456789abcdef"),
                                                 instance_type="ml.g4dn.xlarge")) if "r-0123456789abcdef" in w]
    assert "release r-0123456789abcdef is served as published" in unknown and "not checked" in unknown
    # An index written before footprints were recorded reads as unknown, never as fitting.
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"schema": 1, "models": [{"target_model": "a.tar.gz", "source_model": "a", "size": 5}]}))
    warnings = _warnings(_endpoint(ModelSource.from_release("r-0123456789abcdef", index=old)))
    assert any("model 'a': GPU memory estimate unknown (weights not sized: the release index records no footprint" in w
               for w in warnings)
    with pytest.raises(PropsError, match="is release r-1111111111111111, not r-0123456789abcdef"):
        other = tmp_path / "other.json"
        other.write_text(json.dumps({"models": [], "release_id": "r-1111111111111111"}))
        _endpoint(ModelSource.from_release("r-0123456789abcdef", index=other))


# ---------------------------------------------------------------------------------------------
# At validate
# ---------------------------------------------------------------------------------------------


def _cli(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "triton_mme_cdk.model_build", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=300)


def test_validate_instance_type_refuses_a_model_larger_than_the_gpu(tmp_path: Path) -> None:
    path = _manifest(tmp_path, _big(), _tiny())
    refused = _cli("validate", "--manifest", str(path), "--instance-type", "ml.g4dn.xlarge")
    assert refused.returncode == 1
    lines = [line for line in refused.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in refused.stderr
    assert "model 'huge-bert' needs at least" in lines[0] and "ml.g4dn.xlarge" in lines[0] and "16.00 GiB" in lines[0]
    assert lines[0] in (ROOT / "docs" / "capacity.md").read_text(), "the page shows this very line"
    assert "huge-bert" in refused.stdout and "refused" in refused.stdout and "estimate" in refused.stdout
    fits = _cli("validate", "--manifest", str(path), "--instance-type", "ml.g5.xlarge")
    assert fits.returncode == 0, fits.stderr
    assert "fit on ml.g5.xlarge: 24.00 GiB GPU" in " ".join(fits.stdout.split())
    capped = _cli("validate", "--manifest", str(path), "--instance-type", "ml.g5.xlarge",
                  "--model-load-gpu-limit", "0.5")
    assert capped.returncode == 1 and "SAGEMAKER_TRITON_MODEL_LOAD_GPU_LIMIT=0.5" in capped.stderr


@pytest.mark.parametrize(("args", "expected"), [
    (["--instance-type", "ml.g6.xlarge"], "error: --instance-type: got 'ml.g6.xlarge'; a GPU multi-model endpoint "
                                          "runs on one of ml.g4dn.xlarge"),
    (["--instance-type", "ml.g5.xlarge", "--model-load-gpu-limit", "two"],
     "error: --model-load-gpu-limit: got 'two'; expected a fraction above 0 and at most 1"),
    (["--model-load-gpu-limit", "0.5"], "error: --model-load-gpu-limit: given without --instance-type"),
])
def test_validate_bad_fit_flags_are_one_line(args: list[str], expected: str) -> None:
    done = _cli("validate", "--manifest", "no-such-manifest.yaml", *args)
    assert done.returncode == 1 and done.stderr.startswith(expected), done.stderr
    assert "Traceback" not in done.stderr


# ---------------------------------------------------------------------------------------------
# At build: the real footprint, in the index, checked before publishing
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path, Path]:
    """One real build of a tiny ResNet and a tiny raw-text-free BERT (ONNX), with their footprints."""
    from triton_mme_cdk.model_build.manifest import load_manifest
    from triton_mme_cdk.model_build.pipeline import BuildOptions, build_release
    from triton_mme_cdk.model_build.release import compute_release

    work = tmp_path_factory.mktemp("fit-build")
    bert = {"name": "tiny-bert", "task": "feature-extraction", "max_batch_size": 64, "text": {"max_sequence_length": 64},
            "source": {"kind": "synthetic", "architecture": "bert", "config": {
                "vocab_size": 1000, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
                "intermediate_size": 128, "max_position_embeddings": 64}}}
    path = _manifest(work, _tiny(copies=2), bert)
    manifest = load_manifest(path)
    release = compute_release(manifest, base_dir=work)
    record, release_dir = build_release(manifest, release, BuildOptions(base_dir=work), out_dir=work / "build")
    return record, release_dir, path


@pytest.mark.slow
def test_the_build_measures_each_footprint(built: tuple[Any, Path, Path]) -> None:
    import tarfile

    record, release_dir, _ = built
    for model in record.models:
        footprint = Footprint.from_json(model.footprint)
        assert footprint is not None and footprint.stage == "build"
        tarball = release_dir / model.tarball
        assert footprint.tarball_bytes.value == tarball.stat().st_size
        with tarfile.open(tarball) as archive:
            members = [m for m in archive.getmembers() if m.isfile()]
        assert footprint.unpacked_bytes.value == sum(m.size for m in members)
        graph = [m for m in members if m.name.endswith("model.onnx")]
        assert footprint.weight_bytes.value == sum(m.size for m in graph) and not footprint.weight_bytes.estimate
        assert footprint.build_load_seconds.value is not None and footprint.build_load_seconds.value > 0
        assert footprint.working_bytes.known and footprint.working_bytes.estimate
        assert "ONNX Runtime CPU run" in footprint.working_bytes.source
        assert not footprint.lower_bound and footprint.gpu_memory().known
    bert = Footprint.from_json(next(m for m in record.models if m.name == "tiny-bert").footprint)
    assert bert is not None and "scaled linearly from batch 32 to 64" in bert.working_bytes.source
    assert (bert.largest_batch, bert.largest_sequence) == (64, 64)


@pytest.mark.slow
def test_the_footprint_reads_the_tarball_once_and_writes_nothing_outside_its_scratch(
    built: tuple[Any, Path, Path], tmp_path: Path
) -> None:
    """The measurement unpacks the tarball in one pass. A graph whose name leaves the folder (no
    tarball the build writes has one; verify refuses it) is not written anywhere, and its load
    time and working memory are unknown with the reason; the sizes are still counted."""
    import io
    import tarfile
    import uuid

    from triton_mme_cdk.model_build.capacity.measure import measure_footprint
    from triton_mme_cdk.model_build.manifest import load_manifest

    record, release_dir, path = built
    model = next(m for m in record.models if m.name == "tiny-bert")
    spec = next(s for s in load_manifest(path).models if s.name == "tiny-bert")
    again = measure_footprint(spec, release_dir / model.tarball)
    assert again.working_bytes.known and again.build_load_seconds.known and again.unpack_seconds.known
    assert again.unpacked_bytes.value == Footprint.from_json(model.footprint).unpacked_bytes.value  # type: ignore[union-attr]

    outside = f"outside-{uuid.uuid4().hex}"
    hostile = tmp_path / "hostile.tar.gz"
    with tarfile.open(release_dir / model.tarball) as source, tarfile.open(hostile, "w:gz") as target:
        for member in source.getmembers():
            data = source.extractfile(member).read() if member.isfile() else None  # type: ignore[union-attr]
            if member.name.endswith("/model.onnx"):
                member.name = f"../{outside}/1/model.onnx"
            target.addfile(member, io.BytesIO(data) if data is not None else None)
    footprint = measure_footprint(spec, hostile)
    assert not footprint.working_bytes.known and not footprint.build_load_seconds.known
    assert "not a plain relative path" in footprint.working_bytes.source, footprint.working_bytes.source
    assert footprint.unpacked_bytes.value == again.unpacked_bytes.value
    import tempfile
    assert not (Path(tempfile.gettempdir()) / outside).exists()


def test_a_graph_that_is_not_run_is_counted_but_never_written_out(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A TorchScript (or TensorRT) graph is not run at build, so the one pass over its tarball
    writes nothing to disk (a plan tarball can be gigabytes); its sizes are still counted."""
    from triton_mme_cdk.model_build.capacity import measure
    from triton_mme_cdk.model_build.manifest import load_manifest

    spec = load_manifest(_manifest(tmp_path, _tiny(name="ts", format="torchscript"))).models[0]
    tarball = tmp_path / "ts.tar.gz"
    files = {"ts/config.pbtxt": b'name: "ts"\n', "ts/1/model.pt": bytes(range(256)) * 64}
    tarball.write_bytes(tar_gz(files))
    scratches: list[Path | None] = []
    real = measure._unpack_once

    def spy(path: Path, scratch: Path | None) -> Any:
        scratches.append(scratch)
        return real(path, scratch)

    monkeypatch.setattr(measure, "_unpack_once", spy)
    footprint = measure.measure_footprint(spec, tarball)
    assert scratches == [None]
    assert footprint.weight_bytes.value == len(files["ts/1/model.pt"])
    assert footprint.unpacked_bytes.value == sum(len(data) for data in files.values())
    assert not footprint.working_bytes.known and "not run at build" in footprint.working_bytes.source


@pytest.mark.slow
def test_the_index_records_footprints_and_a_refusal_publishes_nothing(built: tuple[Any, Path, Path]) -> None:
    from moto.server import ThreadedMotoServer

    from triton_mme_cdk.model_build.aws_clients import make_s3_client
    from triton_mme_cdk.model_build.release import compute_release
    from triton_mme_cdk.model_build.release.store import ReleaseTarget, publish_incremental

    record, release_dir, path = built
    from triton_mme_cdk.model_build.manifest import load_manifest

    release = compute_release(load_manifest(path), base_dir=path.parent)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    try:
        host, port = server.get_host_and_port()
        s3 = make_s3_client(endpoint_url=f"http://{host}:{port}", region="us-east-1")
        s3.create_bucket(Bucket="models")
        artifacts = [(model.artifact(release_dir), model.key) for model in record.models]
        # A fleet whose usable GPU memory is below the smallest model: refused, nothing published.
        tight = Fleet("ml.g4dn.xlarge", {"SAGEMAKER_TRITON_MODEL_LOAD_GPU_LIMIT": "0.011"})
        with pytest.raises(FitError, match=r"needs .* of GPU memory when loaded \(estimate: 1 instance"):
            publish_incremental(artifacts, ReleaseTarget.of(release, s3, "models", "models", check=release_check(tight)))
        served = s3.list_objects_v2(Bucket="models", Prefix="models/served/").get("KeyCount", 0)
        indexes = s3.list_objects_v2(Bucket="models", Prefix="models/_releases/").get("KeyCount", 0)
        assert (served, indexes) == (0, 0)
        publish_incremental(artifacts, ReleaseTarget.of(release, s3, "models", "models",
                                                        check=release_check(Fleet("ml.g5.xlarge"))))
        body = s3.get_object(Bucket="models", Key=release.index_key("models"))["Body"].read()
    finally:
        server.stop()
    index = json.loads(body)
    footprints = {f.target: f for f in index_footprints(index)}
    assert set(footprints) == {"tiny-resnet-0", "tiny-resnet-1", "tiny-bert"}
    stored = Footprint.from_json(next(m for m in record.models if m.name == "tiny-bert").footprint)
    assert footprints["tiny-bert"] == stored
    assert footprints["tiny-resnet-1"].weight_bytes == footprints["tiny-resnet-0"].weight_bytes
    assert index["models"][0]["footprint"]["gpu_memory"]["estimate"] is True


def test_the_deploy_reads_its_fleet_from_the_deployed_record() -> None:
    from triton_mme_cdk.model_build.release.deployed import parse_record

    # The record the default stack's build resource carries (the committed synth snapshot).
    template = json.loads((ROOT / "tests" / "snapshots" / "TritonMme.template.json").read_text())
    (deployed,) = [r["Properties"]["Deployed"] for r in template["Resources"].values()
                   if r["Type"] == "Custom::TritonModelRelease"]
    default = fleet_from_record(parse_record(deployed, where="snapshot"))
    assert default is not None and default.instance_type == "ml.g5.xlarge"
    assert default.environment["SAGEMAKER_TRITON_SHM_DEFAULT_BYTE_SIZE"] == "16777216"
    record = {"resources": {
        "Config": {"Type": "AWS::SageMaker::EndpointConfig", "Properties": {"ProductionVariants": [
            {"InstanceType": "ml.p3.2xlarge", "VolumeSizeInGB": 50}]}},
        "Model": {"Type": "AWS::SageMaker::Model", "Properties": {"PrimaryContainer": {"Environment": {
            "SAGEMAKER_TRITON_MODEL_LOAD_GPU_LIMIT": "0.8", "OTHER": {"Ref": "X"}}}}}}}
    fleet = fleet_from_record(record)
    assert fleet == Fleet("ml.p3.2xlarge", {"SAGEMAKER_TRITON_MODEL_LOAD_GPU_LIMIT": "0.8"}, 50, "instance type")
    assert fleet_from_record(None) is None and fleet_from_record({"Resources": {}}) is None
    release_check(None)([{"target_model": "x.tar.gz", "source_model": "x"}])  # no fleet recorded: nothing checked
    report = check_fit(index_footprints({"models": [{"target_model": "x.tar.gz", "source_model": "x", "size": 1}]}),
                       fleet)
    assert [f.level for f in report.findings] == ["unknown", "unknown"]


@pytest.mark.slow
def test_the_stacks_build_refuses_before_publishing_with_the_fleet_of_its_record(
        endpoint: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The Lambda's path: the Map's per-model units, then the final step, whose request carries the
    stack's deployed record. Its fleet's load limit leaves less GPU memory than the model's measured
    footprint: the final step fails naming the model and the fit check, and writes no index."""
    import yaml

    from triton_mme_cdk.model_build import handler
    from triton_mme_cdk.model_build.aws_clients import make_s3_client
    from triton_mme_cdk.model_build.manifest import parse_manifest
    from triton_mme_cdk.model_build.release import compute_release
    from triton_mme_cdk.model_build.release.deployed import parse_record, record_json

    for key, value in (("MODEL_BUILD_S3_ENDPOINT_URL", endpoint), ("AWS_ACCESS_KEY_ID", "testing"),
                       ("AWS_SECRET_ACCESS_KEY", "testing"), ("AWS_DEFAULT_REGION", "us-east-1"),
                       ("TMPDIR", str(tmp_path))):
        monkeypatch.setenv(key, value)
    s3 = make_s3_client(endpoint_url=endpoint)
    s3.create_bucket(Bucket="fleet-fit")
    data = {"version": 1, "models": [_tiny()]}
    s3.put_object(Bucket="fleet-fit", Key="asset/manifest.yaml", Body=yaml.safe_dump(data).encode())
    release = compute_release(parse_manifest(data))
    template = json.loads((ROOT / "tests" / "snapshots" / "TritonMme.template.json").read_text())
    (deployed,) = [r["Properties"]["Deployed"] for r in template["Resources"].values()
                   if r["Type"] == "Custom::TritonModelRelease"]
    record = parse_record(deployed, where="snapshot")

    def props(limit: str) -> dict[str, str]:
        for resource in record["resources"].values():
            if resource["Type"] == "AWS::SageMaker::Model":
                resource["Properties"]["PrimaryContainer"]["Environment"]["SAGEMAKER_TRITON_MODEL_LOAD_GPU_LIMIT"] = limit
        return {"ManifestBucket": "fleet-fit", "ManifestKey": "asset/manifest.yaml",
                "ManifestSha256": release.manifest_sha256, "ModelBucket": "fleet-fit", "ModelPrefix": "models",
                "ReleaseId": release.release_id, "CodeSha256": release.code_sha256, "Deployed": record_json(record)}

    tight = props("0.011")  # the A10G's 24 GiB x 0.011, less tritonserver's 164 MiB: about 106 MiB usable
    plan = handler.plan_items({"Request": tight})
    items = json.loads(s3.get_object(Bucket=plan["Bucket"], Key=plan["Key"])["Body"].read())
    for item in items:
        handler.build_item({"Request": tight, **item})
    with pytest.raises(handler.HandlerError) as refused:
        handler.finish_release({"Request": tight})
    message = str(refused.value)
    assert "fit check of model 'tiny-resnet' failed" in message and "ml.g5.xlarge" in message, message
    listed = s3.list_objects_v2(Bucket="fleet-fit", Prefix="models/")
    keys = [item["Key"] for item in listed.get("Contents", [])]
    assert not [k for k in keys if k.startswith(("models/served/", "models/_releases/"))], keys
    # The same build on the fleet without the limit is published.
    assert handler.finish_release({"Request": props("1")})["ModelCount"] == "1"
    assert s3.list_objects_v2(Bucket="fleet-fit", Prefix=f"models/_releases/{release.release_id}/")["KeyCount"] == 1
