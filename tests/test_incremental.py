"""Incremental builds: model keys, the content-addressed store and releases assembled from it.

Identity is checked on a copy of the real ``model_build`` package; S3 is moto's server over
HTTP on loopback behind the counting proxy of ``s3_faults`` (requests and bytes are counted at
the server side of the wire, not inside publish); the end-to-end tests build tiny synthetic
ResNets with torch and ONNX Runtime for real.
"""

from __future__ import annotations

import copy
import hashlib
import io
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tarfile
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import numpy as np
import pytest
import yaml
from iam_grants import granted, record_s3_calls, role_s3_grants, s3_actions
from s3_faults import FaultProxy  # tests/ is on sys.path

from triton_mme_cdk.model_build import handler
from triton_mme_cdk.model_build.aws_clients import make_s3_client
from triton_mme_cdk.model_build.errors import PublishError
from triton_mme_cdk.model_build.handler import build_steps
from triton_mme_cdk.model_build.manifest import load_manifest, parse_manifest
from triton_mme_cdk.model_build.pipeline import BuildOptions, build_release, build_unit
from triton_mme_cdk.model_build.release import (
    PACKAGE_DIR,
    build_code_sha256,
    compute_release,
    entry_model_key,
    model_code_sha256,
    runtime_files,
    served_prefix,
    store_prefix,
)
from triton_mme_cdk.model_build.release.identity import MODEL_ENTRY_MODULES
from triton_mme_cdk.model_build.release.index import read_index
from triton_mme_cdk.model_build.release.publish import download_release
from triton_mme_cdk.model_build.release.routes import served_name
from triton_mme_cdk.model_build.release.store import (
    ReleaseTarget,
    StoredModel,
    assemble_release,
    is_stored,
    publish_incremental,
    publish_unit,
    stored_keys,
)
from triton_mme_cdk.model_build.types import Artifact

ROOT = Path(__file__).resolve().parents[1]
PREFIX = "models"


# ---------------------------------------------------------------------------------------------
# Identity: what changes a model's key and a release id, and what does not
# ---------------------------------------------------------------------------------------------


@pytest.fixture
def package(tmp_path: Path) -> Path:
    """A copy of the real ``model_build`` package that a test may edit."""
    copy_dir = tmp_path / "model_build"
    shutil.copytree(PACKAGE_DIR, copy_dir, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return copy_dir


def _append(path: Path, text: str = "\n# edited\n") -> None:
    path.write_text(path.read_text() + text)


def test_the_runtime_is_what_the_build_and_the_handler_import() -> None:
    names = {path.relative_to(PACKAGE_DIR).as_posix() for path in runtime_files()}
    assert {"pipeline/build.py", "export/convert.py", "export/validate.py", "artifact/pack.py",
            "handler/__init__.py", "handler/build_steps.py", "release/publish.py", "release/store.py",
            "release/identity.py", "artifact/gate.py", "Dockerfile", "requirements-lambda.txt"} <= names
    assert "__main__.py" not in names
    assert not any(name.startswith("tools/") for name in names)
    # The code of a model's bytes is a part of the runtime: not the handler nor the publisher.
    model_names = {p.relative_to(PACKAGE_DIR).as_posix() for p in runtime_files(entries=MODEL_ENTRY_MODULES)}
    assert {"export/convert.py", "artifact/pack.py", "release/identity.py"} <= model_names
    assert not {name for name in model_names if name.startswith(("handler/", "release/"))} - {
        "release/__init__.py", "release/identity.py"}, model_names


def test_an_edited_import_changes_the_runtime_files(package: Path) -> None:
    """The import scan is cached by each file's text: the same path with an added import is
    scanned again, and the module it names joins the runtime (and the keys' hashes)."""
    before = {p.relative_to(package).as_posix() for p in runtime_files(package)}
    (package / "extra_step.py").write_text("VALUE = 1\n")
    assert "extra_step.py" not in before
    _append(package / "pipeline" / "build.py", "\nfrom triton_mme_cdk.model_build import extra_step  # noqa\n")
    after = {p.relative_to(package).as_posix() for p in runtime_files(package)}
    assert after == before | {"extra_step.py"}


def test_editing_a_tool_changes_no_model_key_and_no_release_id(package: Path) -> None:
    manifest = load_manifest(ROOT / "models.yaml")
    before = compute_release(manifest, base_dir=ROOT, package_dir=package)
    tool_files = [package / "__main__.py", *sorted((package / "tools").rglob("*.py"))]
    assert len(tool_files) > 3
    for path in tool_files:
        _append(path)
    after = compute_release(manifest, base_dir=ROOT, package_dir=package)
    assert after.release_id == before.release_id
    assert dict(after.model_keys) == dict(before.model_keys)

    # The release layout (the handler) is part of the release id, not of any model's key.
    _append(package / "handler" / "build_steps.py")
    relaid = compute_release(manifest, base_dir=ROOT, package_dir=package)
    assert relaid.release_id != before.release_id
    assert dict(relaid.model_keys) == dict(before.model_keys)

    # The export code changes every model's bytes: every key changes.
    _append(package / "export" / "convert.py")
    rebuilt = compute_release(manifest, base_dir=ROOT, package_dir=package)
    assert all(rebuilt.model_keys[name] != key for name, key in before.model_keys.items())


def test_one_changed_entry_changes_its_own_key_alone() -> None:
    data = yaml.safe_load((ROOT / "models.yaml").read_text())
    first = compute_release(parse_manifest(data), base_dir=ROOT)
    changed = copy.deepcopy(data)
    changed["models"][1]["max_batch_size"] = data["models"][1]["max_batch_size"] * 2
    second = compute_release(parse_manifest(changed), base_dir=ROOT)
    name = changed["models"][1]["name"]
    assert second.release_id != first.release_id
    differing = {n for n in first.model_keys if first.model_keys[n] != second.model_keys[n]}
    assert differing == {name}

    # Copies are server-side copies of one tarball: a new release, the same keys.
    more = copy.deepcopy(data)
    more["models"][0]["copies"] = data["models"][0].get("copies", 1) + 1
    third = compute_release(parse_manifest(more), base_dir=ROOT)
    assert third.release_id != first.release_id
    assert dict(third.model_keys) == dict(first.model_keys)


def test_what_builds_the_bytes_is_part_of_every_key() -> None:
    manifest = load_manifest(ROOT / "models.yaml")
    base = compute_release(manifest, base_dir=ROOT)
    level = compute_release(manifest, base_dir=ROOT, compresslevel=9)
    torch = compute_release(manifest, base_dir=ROOT, versions=[("torch", "0.0.0")])
    for other in (level, torch):
        assert all(other.model_keys[n] != k for n, k in base.model_keys.items())
        assert other.release_id != base.release_id
    assert len(model_code_sha256()) == len(build_code_sha256()) == 64
    assert model_code_sha256() != build_code_sha256()


# ---------------------------------------------------------------------------------------------
# The store and the assembly, counted at the S3 server
# ---------------------------------------------------------------------------------------------


@pytest.fixture
def client(proxy: FaultProxy) -> Any:
    return make_s3_client(endpoint_url=proxy.url, max_attempts=3, read_timeout=10)


@pytest.fixture
def bucket(endpoint: str) -> str:
    name = f"inc-{uuid.uuid4().hex[:16]}"
    make_s3_client(endpoint_url=endpoint).create_bucket(Bucket=name)
    return name


def _artifact(folder: Path, name: str, *, size: int, copies: int = 1, seed: int = 0) -> Artifact:
    """A real ``model.tar.gz`` with a random payload, a reference ``.npz`` and a config."""
    folder.mkdir(parents=True, exist_ok=True)
    payload = random.Random(f"{name}-{seed}").randbytes(size)
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz", compresslevel=1) as tar:
        info = tarfile.TarInfo(f"{name}/1/model.onnx")
        info.size = len(payload)
        tar.addfile(info, io.BytesIO(payload))
    path = folder / f"{name}.tar.gz"
    path.write_bytes(buffer.getvalue())
    reference = folder / f"{name}.reference.npz"
    np.savez(reference, output=np.random.default_rng(seed).random((2, 4)))
    config = folder / f"{name}.config.pbtxt"
    config.write_text(f'name: "{name}"\n')
    data = path.read_bytes()
    targets = tuple(f"{name}-{i}" for i in range(copies)) if copies > 1 else (name,)
    return Artifact(name=name, format="onnx", path=path, sha256=hashlib.sha256(data).hexdigest(),
                    size=len(data), targets=targets, reference_path=reference, config_path=config)


def _key(artifact: Artifact) -> str:
    return "k-" + artifact.sha256[:32]


#: The footprint's figures measured on the build machine, which two builds of the same bytes differ in.
MEASURED_FIGURES = ("working_bytes", "build_load_seconds", "unpack_seconds", "gpu_memory")


def _without_measurements(*indexes: bytes) -> list[bytes]:
    """Indexes with the measured figures of their footprints left out (each must have them all)."""
    out = []
    for body in indexes:
        document = json.loads(body)
        for entry in document["models"]:
            for figure in MEASURED_FIGURES:
                assert entry["footprint"].pop(figure)["source"]
        out.append(json.dumps(document, sort_keys=True).encode())
    return out


def _release_objects(s3: Any, bucket: str, prefix: str) -> dict[str, bytes]:
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=f"{prefix}/")
    keys = [item["Key"] for page in pages for item in page.get("Contents", [])]
    return {key[len(prefix) + 1:]: s3.get_object(Bucket=bucket, Key=key)["Body"].read() for key in keys}


def test_one_changed_model_is_built_once_and_the_rest_are_server_side_copies(
    tmp_path: Path, proxy: FaultProxy, client: Any, bucket: str
) -> None:
    models = [_artifact(tmp_path / "a", f"m{i}", size=40_000 + i, copies=1 + i % 3) for i in range(8)]
    first = publish_incremental(
        [(a, _key(a)) for a in models], ReleaseTarget(client, bucket, PREFIX, f"{PREFIX}/r-1", {"release_id": "r-1"}),
    )
    assert stored_keys(client, bucket, PREFIX) == {_key(a) for a in models}
    assert first.targets == sum(len(a.targets) for a in models)

    changed = _artifact(tmp_path / "b", "m5", size=50_000, copies=models[5].targets.__len__(), seed=1)
    second_models = [*models[:5], changed, *models[6:]]
    proxy.reset_records()
    report = publish_incremental(
        [(a, _key(a)) for a in second_models], ReleaseTarget(client, bucket, PREFIX, f"{PREFIX}/r-2", {"release_id": "r-2"}),
    )
    uploads = proxy.forwarded("PUT", is_copy=False)
    copies = proxy.forwarded("PUT", is_copy=True)
    # Uploaded: the changed model's tarball, reference, config and store index, then the release index.
    uploaded_keys = sorted(unquote(r.target.split("?")[0]).split(f"/{bucket}/", 1)[-1] for r in uploads)
    store = store_prefix(PREFIX, _key(changed))
    assert uploaded_keys == sorted([
        f"{store}/model.tar.gz", f"{store}/_reference/m5.npz", f"{store}/_reference/m5.config.pbtxt",
        f"{store}/_index.json", f"{PREFIX}/r-2/_index.json",
    ])
    sent = proxy.bytes_uploaded()
    assert changed.size <= sent < changed.size + 20_000, sent
    # Copied server-side: the changed model's targets into the served prefix under their new
    # names, and nothing else (unchanged models keep their served objects; references stay in
    # the store and the index points at them).
    assert len(copies) == len(changed.targets) == report.copied
    assert {unquote(r.target.split("?")[0]).rsplit("/", 1)[1] for r in copies} == {
        served_name(t, changed.sha256) for t in changed.targets}
    assert report.bytes_sent == sent

    # The release reads back like any other: every file matches the index's digest.
    paths = download_release(client, bucket, f"{PREFIX}/r-2", tmp_path / "down")
    assert {p.name for p in paths if p.suffix == ".gz"} == {
        served_name(t, a.sha256) for a in second_models for t in a.targets}
    assert (tmp_path / "down" / served_name(changed.targets[0], changed.sha256)).read_bytes() == changed.path.read_bytes()
    index = read_index(client, bucket, f"{PREFIX}/r-2/_index.json")
    assert index is not None and index["release_id"] == "r-2"

    # Publishing the same release again sends nothing.
    proxy.reset_records()
    again = publish_incremental(
        [(a, _key(a)) for a in second_models], ReleaseTarget(client, bucket, PREFIX, f"{PREFIX}/r-2", {"release_id": "r-2"}),
    )
    assert proxy.bytes_uploaded() == 0 and again.bytes_sent == 0 and again.copied == 0
    assert proxy.forwarded("PUT") == []


def test_a_model_missing_from_the_store_fails_the_release_by_name_and_a_rerun_finishes(
    tmp_path: Path, proxy: FaultProxy, client: Any, bucket: str
) -> None:
    models = [_artifact(tmp_path, f"n{i}", size=20_000, copies=2) for i in range(3)]
    for artifact in models[:2]:
        publish_unit(artifact, _key(artifact), s3_client=client, bucket=bucket, model_prefix=PREFIX)
    planned = [StoredModel(a.name, _key(a), a.targets, a.format) for a in models]
    release = f"{PREFIX}/r-3"
    with pytest.raises(PublishError) as caught:
        assemble_release(planned, ReleaseTarget(client, bucket, PREFIX, release))
    assert caught.value.model == "n2"
    assert _key(models[2]) in str(caught.value)
    assert _release_objects(client, bucket, release) == {}, "no index"
    assert _release_objects(client, bucket, f"{PREFIX}/served") == {}, "nothing copied"

    publish_unit(models[2], _key(models[2]), s3_client=client, bucket=bucket, model_prefix=PREFIX)
    proxy.reset_records()
    report = assemble_release(planned, ReleaseTarget(client, bucket, PREFIX, release))
    # Each target copied once into the served prefix; the references stay in the store.
    assert report.copied == 3 * 2 and proxy.bytes_uploaded() == report.bytes_sent > 0
    assert read_index(client, bucket, f"{release}/_index.json") is not None


# ---------------------------------------------------------------------------------------------
# End to end with real builds: the per-model unit + final step equals the CLI's release
# ---------------------------------------------------------------------------------------------

TINY = {
    "kind": "synthetic",
    "architecture": "resnet",
    "config": {"embedding_size": 8, "hidden_sizes": [8, 8, 8, 8], "depths": [1, 1, 1, 1],
               "layer_type": "basic", "num_labels": 4},
}


def _tiny_manifest(count: int, *, broken: str | None = None) -> dict[str, Any]:
    models: list[dict[str, Any]] = []
    for i in range(count):
        models.append({
            "name": f"tiny-{i}",
            "source": dict(copy.deepcopy(TINY), seed=i),  # no shared dicts: YAML would alias them
            "task": "image-classification",
            "format": "torchscript" if i == 1 else "onnx",
            "max_batch_size": 2,
            "image": {"image_size": 32, "channels": 3},
            "copies": 2 if i == 0 else 1,
        })
    if broken:
        models.append({"name": broken, "source": {"kind": "s3", "uri": "s3://no-such-source-bucket/x/"},
                       "task": "feature-extraction", "max_batch_size": 2})
    return {"version": 1, "models": models}


#: Run in a folder that holds only the runtime files, as the build image does.
RUNTIME_ONLY_BUILD = """
import json, sys
from pathlib import Path
import triton_mme_cdk.model_build
import triton_mme_cdk.model_build.handler  # the module of every entry point the image's CMD names
from triton_mme_cdk.model_build.pipeline import BuildOptions, build_unit
from triton_mme_cdk.model_build.manifest import parse_manifest
spec = parse_manifest(json.loads(sys.argv[1])).models[0]
result, built = build_unit(spec, "k-runtime", BuildOptions(base_dir=Path.cwd()), store_dir=Path.cwd() / "store")
print(json.dumps({"package": triton_mme_cdk.model_build.__file__, "built": built, "sha256": result.sha256}))
"""


def test_the_runtime_files_alone_build_a_model(tmp_path: Path) -> None:
    """The build image holds ``runtime_files()`` and no tool: that set imports every handler and
    builds a model, byte for byte as the whole package does (a runtime module importing a tool,
    or reading a file that is not runtime, fails here)."""
    image = tmp_path / "image"
    for path in runtime_files():
        target = image / "triton_mme_cdk" / "model_build" / path.relative_to(PACKAGE_DIR)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target)
    assert not (image / "triton_mme_cdk" / "model_build" / "tools").exists()
    (image / "triton_mme_cdk" / "__init__.py").write_text("")  # as the Dockerfile writes it: no re-export
    data = _tiny_manifest(1)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    result = subprocess.run([sys.executable, "-c", RUNTIME_ONLY_BUILD, json.dumps(data)], cwd=image, env=env,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout.splitlines()[-1])
    assert Path(out["package"]).parent == image / "triton_mme_cdk" / "model_build"
    assert out["built"] is True
    whole, _ = build_unit(parse_manifest(data).models[0], "k-whole", BuildOptions(base_dir=tmp_path),
                          store_dir=tmp_path / "store")
    assert out["sha256"] == whole.sha256


@pytest.fixture
def lambda_env(endpoint: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Any:
    monkeypatch.setenv("MODEL_BUILD_S3_ENDPOINT_URL", endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    return make_s3_client(endpoint_url=endpoint)


def _request(s3: Any, data: dict[str, Any], bucket: str) -> dict[str, str]:
    """The custom resource's properties for ``data``, its manifest uploaded like the asset."""
    s3.put_object(Bucket=bucket, Key="asset/manifest.yaml", Body=yaml.safe_dump(data).encode())
    release = compute_release(parse_manifest(data))
    return {"ManifestBucket": bucket, "ManifestKey": "asset/manifest.yaml",
            "ManifestSha256": release.manifest_sha256, "ModelBucket": bucket, "ModelPrefix": PREFIX,
            "ReleaseId": release.release_id, "CodeSha256": release.code_sha256}


def _run_map(props: dict[str, str], s3: Any) -> list[dict[str, Any]]:
    """What the state machine does: write the plan, one build_item per item, in any order."""
    plan = handler.plan_items({"Request": props})
    items = json.loads(s3.get_object(Bucket=plan["Bucket"], Key=plan["Key"])["Body"].read())
    assert len(items) == plan["Count"]
    return [handler.build_item({"Request": props, **item}) for item in reversed(items)]


@pytest.mark.slow
def test_per_model_units_and_the_final_step_equal_the_cli_release_byte_for_byte(
    tmp_path: Path, lambda_env: Any, endpoint: str
) -> None:
    s3 = lambda_env
    data = _tiny_manifest(3)
    manifest = parse_manifest(data)
    release = compute_release(manifest, base_dir=tmp_path)

    # The CLI: `build --jobs 2`, then the incremental publish, into one bucket.
    cli_bucket = f"cli-{uuid.uuid4().hex[:12]}"
    s3.create_bucket(Bucket=cli_bucket)
    record, release_dir = build_release(manifest, release, BuildOptions(base_dir=tmp_path, jobs=2), out_dir=tmp_path / "build")
    assert sorted(record.built) == ["tiny-0", "tiny-1", "tiny-2"]
    publish_incremental(
        [(m.artifact(release_dir), m.key) for m in record.models], ReleaseTarget.of(release, s3, cli_bucket, PREFIX)
    )
    again, _ = build_release(manifest, release, BuildOptions(base_dir=tmp_path, jobs=2), out_dir=tmp_path / "build")
    assert again.built == [], "every key is stored: a re-run builds nothing"

    # The Lambda: the Map's per-model unit for each item, then the final step, into another.
    map_bucket = f"map-{uuid.uuid4().hex[:12]}"
    s3.create_bucket(Bucket=map_bucket)
    props = _request(s3, data, map_bucket)
    assert props["ReleaseId"] == release.release_id
    results = _run_map(props, s3)
    assert sorted(r["Model"] for r in results) == ["tiny-0", "tiny-1", "tiny-2"]
    assert all(r["Built"] for r in results)
    finished = handler.finish_release({"Request": props})
    assert finished["ModelCount"] == "4"

    for prefix in (release.prefix(PREFIX), served_prefix(PREFIX)):
        cli_objects = _release_objects(s3, cli_bucket, prefix)
        map_objects = _release_objects(s3, map_bucket, prefix)
        assert set(cli_objects) == set(map_objects)
        # Each index records the footprints its own builds measured (load and unpack times, working
        # memory: this machine's, each time): the rest of the index is the same, byte for byte.
        for name in [name for name in cli_objects if name.endswith("_index.json")]:
            cli_objects[name], map_objects[name] = _without_measurements(cli_objects[name], map_objects[name])
        assert cli_objects == map_objects, "the two ways of building give the same release, byte for byte"
    served = {name.rsplit("-", 1)[0] for name in cli_objects}
    assert served == {"tiny-0-0", "tiny-0-1", "tiny-1", "tiny-2"}

    # Change one entry: the plan holds that model alone; the others are copied.
    changed = copy.deepcopy(data)
    changed["models"][2]["max_batch_size"] = 4
    new_props = _request(s3, changed, map_bucket)
    rebuilt = _run_map(new_props, s3)
    assert [r["Model"] for r in rebuilt] == ["tiny-2"]
    handler.finish_release({"Request": new_props})
    new_index = read_index(s3, map_bucket, f"{PREFIX}/_releases/{new_props['ReleaseId']}/_index.json")
    assert new_index is not None and len(new_index["models"]) == 4


@pytest.mark.slow
def test_a_failing_model_fails_the_release_naming_it_and_a_rerun_builds_only_what_is_missing(
    tmp_path: Path, lambda_env: Any
) -> None:
    s3 = lambda_env
    bucket = f"fail-{uuid.uuid4().hex[:12]}"
    s3.create_bucket(Bucket=bucket)
    data = _tiny_manifest(1, broken="gone")
    props = _request(s3, data, bucket)
    plan = handler.plan_items({"Request": props})
    items = json.loads(s3.get_object(Bucket=bucket, Key=plan["Key"])["Body"].read())
    assert [item["Model"] for item in items] == ["tiny-0", "gone"]
    assert handler.build_item({"Request": props, **items[0]})["Built"] is True
    with pytest.raises(handler.HandlerError) as caught:
        handler.build_item({"Request": props, **items[1]})
    assert "model 'gone'" in str(caught.value) and len(str(caught.value)) <= 400
    with pytest.raises(handler.HandlerError) as final:
        handler.finish_release({"Request": props})
    assert "model 'gone'" in str(final.value)
    assert read_index(s3, bucket, f"{PREFIX}/_releases/{props['ReleaseId']}/_index.json") is None

    # A re-run (say after the source appeared, here after dropping the entry) plans only what
    # is missing; the model built before the failure is not built again.
    fixed = _tiny_manifest(2)
    fixed_props = _request(s3, fixed, bucket)
    rerun = handler.plan_items({"Request": fixed_props})
    assert rerun["Count"] == 1
    assert [r["Model"] for r in _run_map(fixed_props, s3)] == ["tiny-1"]
    handler.finish_release({"Request": fixed_props})
    assert read_index(s3, bucket, f"{PREFIX}/_releases/{fixed_props['ReleaseId']}/_index.json") is not None


def test_a_map_item_whose_key_this_runtime_does_not_compute_is_refused(tmp_path: Path, lambda_env: Any) -> None:
    s3 = lambda_env
    bucket = f"key-{uuid.uuid4().hex[:12]}"
    s3.create_bucket(Bucket=bucket)
    props = _request(s3, _tiny_manifest(1), bucket)
    with pytest.raises(handler.HandlerError, match="planned key 'k-0'"):
        handler.build_item({"Request": props, "Model": "tiny-0", "Key": "k-0"})
    with pytest.raises(handler.HandlerError, match="field Model: got 'nope'"):
        handler.build_item({"Request": props, "Model": "nope", "Key": "k-0"})
    assert stored_keys(s3, bucket, PREFIX) == set()


def test_is_stored_reads_one_keys_index_alone(lambda_env: Any) -> None:
    """A unit counts once its index is there (written last); a half-stored unit, a key that only
    begins like it, or another prefix's unit do not."""
    s3 = lambda_env
    bucket = f"stored-{uuid.uuid4().hex[:12]}"
    s3.create_bucket(Bucket=bucket)
    whole, half = "k-" + "a" * 32, "k-" + "b" * 32
    s3.put_object(Bucket=bucket, Key=f"{store_prefix(PREFIX, whole)}/_index.json", Body=b"{}")
    s3.put_object(Bucket=bucket, Key=f"{store_prefix(PREFIX, half)}/model.tar.gz", Body=b"x")
    s3.put_object(Bucket=bucket, Key=f"{store_prefix(PREFIX, whole + 'c')}/_index.json", Body=b"{}")
    assert is_stored(s3, bucket, PREFIX, whole)
    assert not is_stored(s3, bucket, PREFIX, half)
    assert not is_stored(s3, bucket, PREFIX, whole[:-1])
    assert not is_stored(s3, bucket, "other", whole)
    assert stored_keys(s3, bucket, PREFIX) == {whole, whole + "c"}  # the same rule, listed whole


def test_each_entry_key_computed_alone_equals_the_releases() -> None:
    manifest = parse_manifest(_tiny_manifest(3, broken="gone"))
    release = compute_release(manifest)
    assert {spec.name: entry_model_key(spec) for spec in manifest.models} == dict(release.model_keys)


@pytest.mark.slow
def test_a_rerun_map_item_costs_one_listing_of_its_own_key_whatever_the_store_holds(
    lambda_env: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A retried Map item finds its key stored with one LIST whose prefix is that key's index:
    not a listing of the whole store, which at thousands of models is pages per item."""

    s3 = lambda_env
    bucket = f"item-{uuid.uuid4().hex[:12]}"
    s3.create_bucket(Bucket=bucket)
    for i in range(3):  # other models' units in the store
        s3.put_object(Bucket=bucket, Key=f"{store_prefix(PREFIX, f'k-other{i}')}/_index.json", Body=b"{}")
    props = _request(s3, _tiny_manifest(1), bucket)
    (item,) = json.loads(s3.get_object(Bucket=bucket, Key=handler.plan_items({"Request": props})["Key"])["Body"].read())
    assert handler.build_item({"Request": props, **item})["Built"] is True

    calls = record_s3_calls(monkeypatch)
    assert handler.build_item({"Request": props, **item})["Built"] is False
    listings = [params for name, params in calls if name.startswith("ListObjects")]
    assert listings == [{"Bucket": bucket, "Prefix": f"{store_prefix(PREFIX, item['Key'])}/_index.json", "MaxKeys": 1}]
    assert [name for name, _ in calls] == ["GetObject", "ListObjectsV2"], calls  # the manifest, then the check


# ---------------------------------------------------------------------------------------------
# The custom resource drives the state machine (Step Functions API of moto's server)
# ---------------------------------------------------------------------------------------------


@pytest.fixture
def machine(endpoint: str, monkeypatch: pytest.MonkeyPatch, lambda_env: Any) -> str:
    """A state machine on moto's Step Functions API: it records executions and their status
    (it runs no Lambda), so the test performs the Map's steps through the build function's
    entry point, as the state machine would."""
    monkeypatch.setenv("MODEL_BUILD_STATES_ENDPOINT_URL", endpoint)
    import boto3

    states = boto3.client("stepfunctions", endpoint_url=endpoint)
    return str(states.create_state_machine(
        name=f"build-{uuid.uuid4().hex[:8]}", definition='{"StartAt":"x","States":{"x":{"Type":"Succeed"}}}',
        roleArn="arn:aws:iam::123456789012:role/build",
    )["stateMachineArn"])


def _cfn_event(props: dict[str, str], **extra: Any) -> dict[str, Any]:
    return {"RequestType": "Create", "RequestId": str(uuid.uuid4()), "ResourceProperties": props,
            "StackId": "arn:aws:cloudformation:us-east-1:123456789012:stack/TritonMme/1", **extra}


def _states_client(endpoint: str) -> Any:
    import boto3

    return boto3.client("stepfunctions", endpoint_url=endpoint)


@pytest.mark.slow
def test_on_event_starts_the_build_and_is_complete_polls_it_until_the_index_exists(
    lambda_env: Any, machine: str, endpoint: str
) -> None:
    s3 = lambda_env
    bucket = f"sfn-{uuid.uuid4().hex[:12]}"
    s3.create_bucket(Bucket=bucket)
    props = dict(_request(s3, _tiny_manifest(1), bucket), BuildStateMachineArn=machine)
    started = handler.on_event(_cfn_event(props))
    execution = started["Data"]["BuildExecutionArn"]
    described = _states_client(endpoint).describe_execution(executionArn=execution)
    assert described["status"] == "RUNNING"
    assert json.loads(described["input"]) == {"Request": props}
    polled = _cfn_event(props, PhysicalResourceId=started["PhysicalResourceId"], Data=started["Data"])
    assert handler.is_complete(polled) == {"IsComplete": False}

    # What the state machine does: plan, one build per item, finish (one entry point).
    plan = handler.build_step({"Step": "plan", "Request": props})
    items = json.loads(s3.get_object(Bucket=bucket, Key=plan["Key"])["Body"].read())
    for item in items:
        handler.build_step({"Step": "build", "Request": props, **item})
    handler.place_step({"Step": "finish", "Request": props})
    done = handler.is_complete(polled)
    assert done["IsComplete"] is True and done["Data"]["ModelCount"] == "2"  # tiny-0 has 2 copies
    # The same release again starts no execution: its index exists.
    assert "Data" not in handler.on_event(_cfn_event(props))


@pytest.mark.slow
def test_a_build_that_ends_while_is_complete_polls_completes_the_resource(
    lambda_env: Any, machine: str, endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The execution's last step writes the index, then the execution succeeds. A poll that
    falls between the two (CI saw it with the provider framework's waiter) must complete, not
    read "succeeded but the release has no index": the poll reads the status first."""
    from triton_mme_cdk.model_build.handler import custom_resource

    s3 = lambda_env
    bucket = f"sfr-{uuid.uuid4().hex[:12]}"
    s3.create_bucket(Bucket=bucket)
    props = dict(_request(s3, _tiny_manifest(1), bucket), BuildStateMachineArn=machine)
    started = handler.on_event(_cfn_event(props))
    plan = handler.build_step({"Step": "plan", "Request": props})
    for item in json.loads(s3.get_object(Bucket=bucket, Key=plan["Key"])["Body"].read()):
        handler.build_step({"Step": "build", "Request": props, **item})
    real_states = custom_resource._states

    class EndsNow:
        """Step Functions as the poll sees it when the build ends at this instant: the last step
        writes the index and the execution reads SUCCEEDED from then on."""

        def describe_execution(self, executionArn: str) -> dict[str, Any]:
            handler.place_step({"Step": "finish", "Request": props})
            return dict(real_states().describe_execution(executionArn=executionArn), status="SUCCEEDED")

    monkeypatch.setattr(custom_resource, "_states", EndsNow)
    polled = _cfn_event(props, PhysicalResourceId=started["PhysicalResourceId"], Data=started["Data"])
    done = handler.is_complete(polled)
    assert done["IsComplete"] is True and done["Data"]["ModelCount"] == "2"


def test_a_failed_build_execution_fails_the_resource_naming_the_model(
    lambda_env: Any, machine: str, endpoint: str
) -> None:
    s3 = lambda_env
    bucket = f"sfx-{uuid.uuid4().hex[:12]}"
    s3.create_bucket(Bucket=bucket)
    props = dict(_request(s3, _tiny_manifest(0, broken="gone"), bucket), BuildStateMachineArn=machine)
    started = handler.on_event(_cfn_event(props))
    execution = started["Data"]["BuildExecutionArn"]
    plan = handler.build_step({"Step": "plan", "Request": props})
    (item,) = json.loads(s3.get_object(Bucket=bucket, Key=plan["Key"])["Body"].read())
    with pytest.raises(handler.HandlerError):
        handler.build_step({"Step": "build", "Request": props, **item})
    # The Map fails on its first failed item; the execution ends failed.
    _states_client(endpoint).stop_execution(executionArn=execution, error="States.ExceedToleratedFailureThreshold")
    polled = _cfn_event(props, PhysicalResourceId=started["PhysicalResourceId"], Data=started["Data"])
    with pytest.raises(handler.HandlerError) as caught:
        handler.is_complete(polled)
    reason = str(caught.value)
    assert "model 'gone'" in reason and len(reason) <= 400 and "Traceback" not in reason
    assert read_index(s3, bucket, f"{PREFIX}/_releases/{props['ReleaseId']}/_index.json") is None
    # A new attempt's plan resets the record (a put: the build role may not delete), so an
    # attempt that fails without a model's record reports its own error, not the stale model.
    handler.build_step({"Step": "plan", "Request": props})
    failure = s3.get_object(Bucket=bucket, Key=f"{PREFIX}/_plans/{props['ReleaseId']}.failure.json")
    assert failure["Body"].read() == build_steps.NO_FAILURE
    with pytest.raises(handler.HandlerError) as again:
        handler.is_complete(polled)
    assert "model 'gone'" not in str(again.value)
    assert str(again.value).startswith("build execution aborted")
    with pytest.raises(handler.HandlerError, match="field Step: got 'nope'"):
        handler.build_step({"Step": "nope", "Request": props})


def test_build_jobs_must_be_a_whole_number_of_processes(tmp_path: Path) -> None:
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "model_build", "build", "--jobs", "0", "--out", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 2
    assert "argument --jobs: got '0'; expected a whole number >= 1" in done.stderr
    assert "Traceback" not in done.stderr and not any(tmp_path.iterdir()), "nothing built"
    with pytest.raises(ValueError, match="jobs: got 0; expected >= 1"):
        BuildOptions(base_dir=ROOT, jobs=0)


@pytest.mark.slow
def test_build_jobs_a_failing_model_names_it_and_a_rerun_builds_only_what_is_missing(
    tmp_path: Path, lambda_env: Any, endpoint: str
) -> None:
    from functools import partial

    from triton_mme_cdk.model_build.errors import ModelBuildError

    broken = parse_manifest(_tiny_manifest(1, broken="gone"))
    release = compute_release(broken, base_dir=tmp_path)
    factory = partial(make_s3_client, endpoint_url=endpoint)
    with pytest.raises(ModelBuildError) as caught:
        build_release(broken, release, BuildOptions(base_dir=tmp_path, jobs=2, s3_factory=factory), out_dir=tmp_path / "b")
    assert caught.value.model == "gone"
    assert not (tmp_path / "b" / release.release_id / "build.json").exists(), "no release folder record"
    stored = {p.name for p in (tmp_path / "b" / "_builds").iterdir() if not p.name.startswith(".")}
    assert stored == {release.model_keys["tiny-0"]}, "the model that built is kept"

    fixed = parse_manifest(_tiny_manifest(2))
    record, _ = build_release(fixed, compute_release(fixed, base_dir=tmp_path),
                              BuildOptions(base_dir=tmp_path, jobs=2, s3_factory=factory), out_dir=tmp_path / "b")
    assert record.built == ["tiny-1"]


# ---------------------------------------------------------------------------------------------
# Least privilege: every S3 call of a Create and an Update is one the stack grants by default
# ---------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def role_grants(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[tuple[str, re.Pattern[str], list[str] | None]]]:
    """The S3 actions the default stack grants each of the build's two roles: ``(action,
    resource, s3:prefix condition)``, read from a synthesized template (default settings:
    ``artifacts_on_delete`` is ``retain``). ``place``: the role of on_event, is_complete and the
    Finish task; ``build``: the role of build_step (plan, per-model build, job steps)."""
    from cdk_helpers import synth

    template = synth(tmp_path_factory.mktemp("grants"), nag=False).data
    grants = {"place": role_s3_grants(template, "ModelBuildRole"), "build": role_s3_grants(template, "ModelBuildBuildRole")}
    assert {g[0] for g in grants["place"]} >= {"s3:GetObject", "s3:PutObject", "s3:ListBucket"}
    deletable = {pattern.pattern for action, pattern, _ in grants["place"] if action == "s3:DeleteObject"}
    assert deletable and all("/models/served/" in p for p in deletable), (
        "the default (retain) deletes only unrouted served objects", deletable)
    # The role that parses model sources writes the store, the plans and the jobs' inputs, nothing else.
    writable = {pattern.pattern for action, pattern, _ in grants["build"] if action == "s3:PutObject"}
    assert writable and all(any(f"/models/{folder}/" in p for folder in ("_builds", "_plans", "_jobs"))
                            for p in writable), writable
    assert not {action for action, _, _ in grants["build"]} & {"s3:DeleteObject", "s3:PutObjectTagging"}
    return grants


@pytest.mark.slow
def test_every_s3_call_of_a_create_and_an_update_is_granted_to_its_steps_own_role(
    lambda_env: Any, machine: str, endpoint: str, monkeypatch: pytest.MonkeyPatch, role_grants: Any
) -> None:
    """moto checks no IAM: record each S3 call the handlers make (a botocore hook on the real
    clients, before each call), with the role of the step that made it (build_step: the build
    role; on_event, is_complete and the Finish task: the placing role), and check it against
    that role's grants in the template."""
    monkeypatch.setenv("MODEL_BUILD_CLOUDFORMATION_ENDPOINT_URL", endpoint)  # no such stack: a supersede
    calls = record_s3_calls(monkeypatch)
    roles: list[tuple[int, str]] = []  # (index of the first call, role) of each step, in order

    def as_role(role: str, step: Any) -> Any:
        def run(*args: Any, **kwargs: Any) -> Any:
            roles.append((len(calls), role))
            return step(*args, **kwargs)
        return run

    on_event, is_complete = as_role("place", handler.on_event), as_role("place", handler.is_complete)
    build_step, place_step = as_role("build", handler.build_step), as_role("place", handler.place_step)
    s3 = lambda_env
    model_bucket = f"iam-{uuid.uuid4().hex[:12]}"
    asset_bucket = f"cdk-assets-{uuid.uuid4().hex[:12]}"
    s3.create_bucket(Bucket=model_bucket)
    s3.create_bucket(Bucket=asset_bucket)

    def properties(data: dict[str, Any]) -> dict[str, str]:
        body = yaml.safe_dump(data).encode()
        asset_key = f"{hashlib.sha256(body).hexdigest()}.yaml"  # as the CDK names a file asset
        s3.put_object(Bucket=asset_bucket, Key=asset_key, Body=body)
        release = compute_release(parse_manifest(data))
        return {"ManifestBucket": asset_bucket, "ManifestKey": asset_key, "ModelBucket": model_bucket,
                "ManifestSha256": release.manifest_sha256, "ModelPrefix": PREFIX, "OnDelete": "retain",
                "ReleaseId": release.release_id, "CodeSha256": release.code_sha256,
                "BuildStateMachineArn": machine}

    def deploy(kind: str, props: dict[str, str], **extra: Any) -> dict[str, Any]:
        event = dict(_cfn_event(props, **extra), RequestType=kind)
        started = on_event(event)
        plan = build_step({"Step": "plan", "Request": props})
        for item in json.loads(s3.get_object(Bucket=model_bucket, Key=plan["Key"])["Body"].read()):
            build_step({"Step": "build", "Request": props, **item})
        place_step({"Step": "finish", "Request": props})
        done = is_complete(dict(event, PhysicalResourceId=started["PhysicalResourceId"], Data=started["Data"]))
        assert done["IsComplete"] is True
        return started

    data = _tiny_manifest(2)
    props = properties(data)
    created = deploy("Create", props)
    changed = copy.deepcopy(data)
    changed["models"][1]["max_batch_size"] = 4
    # The shortest window the function keeps (RetentionDays "0" is raised to its 1-day floor): the
    # changed model's old served object is unrouted now and deleted at the next poll once its
    # record is two days old (the record aged here, as time would).
    new_props = dict(properties(changed), RetentionDays="0")
    updated = deploy("Update", new_props, PhysicalResourceId=created["PhysicalResourceId"], OldResourceProperties=props)
    routes_key = f"{PREFIX}/_routes/routes.json"
    document = json.loads(s3.get_object(Bucket=model_bucket, Key=routes_key)["Body"].read())
    assert document["unrouted"], "the changed model's old object is unrouted"
    for item in document["unrouted"].values():
        item["since"] = "2000-01-01T00:00:00Z"
    s3.put_object(Bucket=model_bucket, Key=routes_key, Body=json.dumps(document).encode())
    assert is_complete(dict(_cfn_event(new_props), RequestType="Update", PhysicalResourceId=updated["PhysicalResourceId"],
                            Data=updated["Data"], OldResourceProperties=props))["IsComplete"] is True
    # A Delete while the stack lives deletes nothing.
    is_complete(dict(_cfn_event(props), RequestType="Delete", PhysicalResourceId=created["PhysicalResourceId"]))
    # A failing model records its reason (a Map item of a release whose source is missing).
    broken = properties(_tiny_manifest(0, broken="gone"))
    (item,) = json.loads(s3.get_object(Bucket=model_bucket, Key=build_step(
        {"Step": "plan", "Request": broken})["Key"])["Body"].read())
    with pytest.raises(handler.HandlerError):
        build_step({"Step": "build", "Request": broken, **item})

    def arn(bucket: str) -> str:
        names = {model_bucket: "MODEL", asset_bucket: "ASSET"}
        return f"arn:aws:s3:::{names.get(bucket, bucket)}"

    operations = {name for name, _ in calls}
    assert {"GetObject", "PutObject", "CopyObject", "ListObjectsV2", "DeleteObjects"} <= operations, operations
    # A model's s3 source is granted per manifest (the default manifest has none): the broken
    # entry's listing of its source bucket is that grant's business, not the model prefix's.
    sources = {params.get("Bucket") for _, params in calls} - {model_bucket, asset_bucket}
    assert sources == {"no-such-source-bucket"}, sources
    def role_of(index: int) -> str:
        return next(role for start, role in reversed(roles) if start <= index)

    # The steps run one after another here, so each call belongs to the step that started last.
    assert {role_of(i) for i in range(len(calls))} == {"place", "build"}
    denied = []
    for index, (operation, params) in enumerate(calls):
        if params.get("Bucket") in sources:
            continue
        role = role_of(index)
        for action, resource, prefix in s3_actions(operation, params, arn):
            if not granted(role_grants[role], action, resource, prefix):
                denied.append(f"{role}: {operation} needs {action} on {resource}" + (f" (prefix {prefix!r})" if prefix else ""))
    assert denied == [], "\n".join(sorted(set(denied)))
    # What separates them: the build steps wrote nothing the fleet serves; the placing steps did.
    writes = {(role_of(i), params["Key"].split("/")[1]) for i, (operation, params) in enumerate(calls)
              if operation in ("PutObject", "CopyObject") and params.get("Bucket") == model_bucket}
    assert {folder for role, folder in writes if role == "build"} <= {"_builds", "_plans", "_jobs"}, writes
    assert {folder for role, folder in writes if role == "place"} == {"served", "_routes", "_releases"}, writes


# ---------------------------------------------------------------------------------------------
# CLI publish is incremental against the bucket (a fresh checkout builds only what is missing)
# ---------------------------------------------------------------------------------------------


def _cli(*args: str) -> Any:
    import subprocess
    import sys

    from cdk_helpers import subprocess_env

    return subprocess.run([sys.executable, "-m", "model_build", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=600, env=subprocess_env())


@pytest.mark.slow
def test_cli_publish_from_a_fresh_checkout_builds_only_the_changed_entry_and_copies_the_rest(
    tmp_path: Path, proxy: FaultProxy, bucket: str
) -> None:
    data = _tiny_manifest(3)
    manifest_path = tmp_path / "models.yaml"
    manifest_path.write_text(yaml.safe_dump(data))
    out = tmp_path / "build"
    common = ["--manifest", str(manifest_path), "--out", str(out), "--bucket", bucket,
              "--endpoint-url", proxy.url]
    first = _cli("publish", *common)
    assert first.returncode == 0, first.stderr
    assert "built 3 of 3 models (tiny-0, tiny-1, tiny-2); 0 already stored" in first.stdout

    shutil.rmtree(out)  # a fresh checkout: nothing built locally
    data["models"][2]["max_batch_size"] = 4
    manifest_path.write_text(yaml.safe_dump(data))
    release = compute_release(parse_manifest(data), base_dir=tmp_path)
    proxy.reset_records()
    second = _cli("publish", *common)
    assert second.returncode == 0, second.stderr
    assert "built 1 of 3 models (tiny-2); 2 already stored" in second.stdout, second.stdout
    # At the server: bytes went up for the changed model's store, the release index and the
    # routes only; the changed model's one target is copied into the served prefix under its new
    # name, and nothing of the two unchanged models is copied (they keep their served objects).
    uploads = sorted(unquote(r.target.split("?")[0]).split(f"/{bucket}/", 1)[-1]
                     for r in proxy.forwarded("PUT", is_copy=False))
    store = store_prefix(PREFIX, release.model_keys["tiny-2"])
    assert uploads == sorted([f"{store}/model.tar.gz", f"{store}/_reference/tiny-2.npz",
                              f"{store}/_reference/tiny-2.config.pbtxt", f"{store}/_index.json",
                              f"{release.prefix(PREFIX)}/_index.json", f"{PREFIX}/_routes/routes.json"]), uploads
    copied = [unquote(r.target.split("?")[0]).split(f"/{bucket}/", 1)[-1]
              for r in proxy.forwarded("PUT", is_copy=True)]
    assert len(copied) == 1 and copied[0].startswith(f"{served_prefix(PREFIX)}/tiny-2-"), copied
    assert {p.name for p in (out / "_builds").iterdir()} == {release.model_keys["tiny-2"]}


# ---------------------------------------------------------------------------------------------
# The Lambda image and a laptop compute the same keys: same versions of every keyed library
# ---------------------------------------------------------------------------------------------


def _pins(text: str) -> dict[str, str]:
    pins = {}
    for line in text.splitlines():
        match = re.match(r"^\s*([A-Za-z0-9_.-]+)(?:\[[^\]]*\])?==([^\s;#]+)", line)
        if match:
            pins[re.sub(r"[-_.]+", "-", match.group(1)).lower()] = match.group(2)
    return pins


def test_the_lambda_image_pins_every_keyed_library_to_the_project_constraints() -> None:
    from importlib import metadata

    from triton_mme_cdk.model_build.release import BYTE_LIBRARIES

    constraints = _pins((ROOT / "constraints.txt").read_text())
    lambda_pins = _pins((ROOT / "model_build" / "requirements-lambda.txt").read_text())
    # torch comes first, from the CPU index, on its own `pip install` line of the Dockerfile;
    # that index's wheel reports the version with its local tag (2.13.0+cpu), as the venv's does.
    dockerfile = (ROOT / "model_build" / "Dockerfile").read_text()
    torch_line = next(line for line in dockerfile.splitlines() if "pip install" in line and "torch==" in line)
    assert "download.pytorch.org/whl/cpu" in torch_line
    lambda_pins["torch"] = _pins(torch_line.split("install", 1)[1].replace(" ", "\n"))["torch"] + "+cpu"
    for name in BYTE_LIBRARIES:
        key = re.sub(r"[-_.]+", "-", name).lower()
        assert key in lambda_pins, f"{name}: part of every model key but not pinned in requirements-lambda.txt"
        assert lambda_pins[key] == constraints.get(key), (name, lambda_pins[key], constraints.get(key))
        # The venv (`make setup`) has what constraints.txt says: its keys are the Lambda's keys.
        assert metadata.version(name) == constraints[key], (name, metadata.version(name))


# ---------------------------------------------------------------------------------------------
# The same release retried after a transient failure builds only what is missing
# ---------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_the_same_release_retried_after_a_source_appears_builds_only_the_missing_model(
    tmp_path: Path, lambda_env: Any
) -> None:
    s3 = lambda_env
    bucket = f"retry-{uuid.uuid4().hex[:12]}"
    s3.create_bucket(Bucket=bucket)
    data = _tiny_manifest(2)
    source = f"s3://{bucket}/uploads/late/model.onnx"
    data["models"].append({"name": "late", "source": {"kind": "onnx", "path": source},
                           "task": "image-classification", "format": "onnx", "max_batch_size": 2,
                           "image": {"image_size": 32, "channels": 3}})
    props = _request(s3, data, bucket)

    # First attempt: the late model's source is not uploaded yet; the others build and are stored.
    first = _run_map_tolerating_failures(props, s3)
    assert sorted(first) == ["late", "tiny-0", "tiny-1"]
    assert first["tiny-0"] is True and first["tiny-1"] is True
    assert isinstance(first["late"], handler.HandlerError) and "model 'late'" in str(first["late"])
    with pytest.raises(handler.HandlerError, match="model 'late'"):
        handler.finish_release({"Request": props})
    assert read_index(s3, bucket, f"{PREFIX}/_releases/{props['ReleaseId']}/_index.json") is None

    # The upload lands (a real ONNX model: tiny-0's, taken from its stored build).
    keys = compute_release(parse_manifest(data), base_dir=tmp_path).model_keys
    stored = s3.get_object(Bucket=bucket, Key=f"{store_prefix(PREFIX, keys['tiny-0'])}/model.tar.gz")["Body"].read()
    with tarfile.open(fileobj=io.BytesIO(stored), mode="r:gz") as tar:
        member = next(m for m in tar.getmembers() if m.name.endswith("/model.onnx"))
        onnx_bytes = tar.extractfile(member).read()  # type: ignore[union-attr]
    s3.put_object(Bucket=bucket, Key="uploads/late/model.onnx", Body=onnx_bytes)

    # The same release again (same properties, as the Provider's retry or a redeploy sends):
    # the plan holds the late model alone, and the release completes.
    retry = _run_map_tolerating_failures(props, s3)
    assert retry == {"late": True}, retry
    finished = handler.finish_release({"Request": props})
    assert finished["ModelCount"] == "4"
    index = read_index(s3, bucket, f"{PREFIX}/_releases/{props['ReleaseId']}/_index.json")
    assert index is not None and set(index["model_keys"]) == {"tiny-0", "tiny-1", "late"}
    assert stored_keys(s3, bucket, PREFIX) == set(keys.values())


def _run_map_tolerating_failures(props: dict[str, str], s3: Any) -> dict[str, Any]:
    """The Map with a tolerated failure count: every item runs; each item's Built flag or error."""
    plan = handler.plan_items({"Request": props})
    items = json.loads(s3.get_object(Bucket=plan["Bucket"], Key=plan["Key"])["Body"].read())
    outcomes: dict[str, Any] = {}
    for item in items:
        try:
            outcomes[item["Model"]] = handler.build_item({"Request": props, **item})["Built"]
        except handler.HandlerError as error:
            outcomes[item["Model"]] = error
    return outcomes
