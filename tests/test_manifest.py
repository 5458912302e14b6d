"""The manifest schema: the default manifest, release ids, and a corpus of bad manifests.

Each bad manifest must give its own clear message naming the field, the value given and what is
allowed; the CLI must print it without a stack trace, before any model is loaded.
"""

from __future__ import annotations

import argparse
import copy
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from triton_mme_cdk.model_build.errors import ManifestError
from triton_mme_cdk.model_build.manifest import (
    TENSORRT_KEYS,
    load_manifest,
    load_manifest_bytes,
    parse_manifest,
)
from triton_mme_cdk.model_build.release import build_code_sha256, compute_release

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = yaml.safe_load((ROOT / "models.yaml").read_text())


def resnet(**overrides: Any) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "name": "vision",
        "source": {"kind": "synthetic", "architecture": "resnet", "seed": 0},
        "task": "image-classification",
        "max_batch_size": 8,
    }
    entry.update(overrides)
    return entry


def test_default_manifest_is_valid_and_lists_its_targets() -> None:
    manifest = load_manifest(ROOT / "models.yaml")
    targets = [name for name, _ in manifest.targets()]
    assert targets == [
        "minilm-l6-embedding",
        "minilm-l6-text",
        "resnet-synthetic-0",
        "resnet-synthetic-1",
        "resnet-synthetic-2",
        "resnet-synthetic-ts",
    ]
    assert manifest.target_count == 6
    assert [spec.inputs for spec in manifest.models[:2]] == ["tokens", "text"]
    minilm = manifest.models[0]
    assert minilm.source.kind == "package" and minilm.task == "sentence-embedding"
    assert {spec.format for spec in manifest.models} == {"onnx", "torchscript"}


def test_release_id_is_stable_and_follows_content_not_formatting(tmp_path: Path) -> None:
    manifest = load_manifest(ROOT / "models.yaml")
    # The same content written differently (JSON flow style, other key order) is the same release.
    reordered = {"models": [dict(reversed(list(m.items()))) for m in DEFAULT["models"]], "version": 1}
    other = tmp_path / "models.yaml"
    other.write_text(yaml.safe_dump(reordered, default_flow_style=True))
    first = compute_release(manifest, base_dir=ROOT)
    assert first == compute_release(load_manifest(other), base_dir=ROOT)
    assert first.release_id.startswith("r-") and len(first.release_id) == 18
    # Any change that shapes the artifacts gives a new release.
    changed = copy.deepcopy(DEFAULT)
    resnet = next(m for m in changed["models"] if m["name"] == "resnet-synthetic")
    resnet["max_batch_size"] = 8
    assert compute_release(parse_manifest(changed), base_dir=ROOT).release_id != first.release_id
    assert compute_release(manifest, base_dir=ROOT, code_sha256="0" * 64).release_id != first.release_id


def test_build_code_hash_changes_with_the_code(tmp_path: Path) -> None:
    package = tmp_path / "model_build"
    package.mkdir()
    # Runtime code is what the build reaches through its imports (tools are not part of it).
    (package / "pipeline.py").write_text("from triton_mme_cdk.model_build.export import A\n")  # an entry module
    (package / "export.py").write_text("A = 1\n")
    before = build_code_sha256(package)
    (package / "__pycache__").mkdir()
    (package / "__pycache__" / "export.cpython-311.pyc").write_bytes(b"\0")
    assert build_code_sha256(package) == before, "caches are not build code"
    (package / "export.py").write_text("A = 2\n")
    assert build_code_sha256(package) != before


def test_local_source_content_is_part_of_the_release(tmp_path: Path) -> None:
    folder = tmp_path / "my-model"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    data = {"models": [resnet(source={"kind": "local", "path": "my-model"}, name="mine")]}
    manifest = parse_manifest(data)
    before = compute_release(manifest, base_dir=tmp_path).release_id
    (folder / "config.json").write_text('{"changed": true}')
    assert compute_release(manifest, base_dir=tmp_path).release_id != before


BAD: list[tuple[str, dict[str, Any], list[str]]] = [
    ("not a mapping", [], ["expected a mapping"]),  # type: ignore[list-item]
    ("no models", {"models": []}, ["models", "at least 1"]),
    ("unknown top-level key", {"models": [resnet()], "modles": []}, ["modles", "unknown key"]),
    ("unknown version", {"version": 2, "models": [resnet()]}, ["version", "got 2"]),
    ("upper-case name", {"models": [resnet(name="Vision")]}, ["name", '"Vision"', "pattern"]),
    ("name with a slash", {"models": [resnet(name="a/b")]}, ["name", '"a/b"']),
    ("name too long", {"models": [resnet(name="x" * 65)]}, ["name", "at most 64"]),
    (
        "copies make a name too long",
        {"models": [resnet(name="x" * 62, copies=200)]},
        ["name", "copies 200", "at most 64"],
    ),
    (
        "duplicate names",
        {"models": [resnet(), resnet()]},
        ["'vision'", "given twice", "unique"],
    ),
    (
        "a copy collides with another model",
        {"models": [resnet(name="bert", copies=3), resnet(name="bert-1")]},
        ["'bert-1'", "published by both", "'bert'"],
    ),
    ("negative batch", {"models": [resnet(max_batch_size=-1)]}, ["max_batch_size", "got -1", "greater than or equal to 0"]),
    (
        "preferred size above max batch",
        {"models": [resnet(max_batch_size=4, dynamic_batching={"preferred_batch_size": [2, 8]})]},
        ["dynamic_batching.preferred_batch_size", "[8]", "at most max_batch_size (4)"],
    ),
    (
        "dynamic batching without batching",
        {"models": [resnet(max_batch_size=0, dynamic_batching={})]},
        ["dynamic_batching", "max_batch_size 0"],
    ),
    (
        "unknown source kind",
        {"models": [resnet(source={"kind": "hub", "model_id": "x"})]},
        ["source.kind", "'hub'", "huggingface, local, s3, package, onnx, synthetic"],
    ),
    (
        "hub source without pinned revision",
        {"models": [resnet(source={"kind": "huggingface", "model_id": "a/b", "revision": "main"})]},
        ["source.revision", '"main"', "pattern"],
    ),
    (
        "s3 source without s3 scheme",
        {"models": [resnet(source={"kind": "s3", "uri": "https://bucket/x"})]},
        ["source.uri", "https://bucket/x"],
    ),
    (
        "source owner not an account id",
        {"models": [resnet(source={"kind": "s3", "uri": "s3://bucket/x/", "owner": "12345"})]},
        ["source.owner", "12345"],
    ),
    (
        "source owner with a local file",
        {"models": [resnet(source={"kind": "onnx", "path": "m.onnx", "owner": "123456789012"})]},
        ["source.owner", "local path 'm.onnx'", "s3://"],
    ),
    (
        "two owners for one source bucket",
        {"models": [resnet(name="a", source={"kind": "s3", "uri": "s3://src/a/", "owner": "111111111111"}),
                    resnet(name="b", source={"kind": "onnx", "path": "s3://src/b.onnx", "owner": "222222222222"})]},
        ["models(b).source.owner", "'222222222222'", "bucket 'src'", "'a' gives to '111111111111'"],
    ),
    (
        "unknown onnxruntime key",
        {"models": [resnet(onnxruntime={"graph_level": 1})]},
        ["onnxruntime.graph_level", "unknown key"],
    ),
    (
        "bad onnxruntime value",
        {"models": [resnet(onnxruntime={"cudnn_conv_algo_search": "fastest"})]},
        ["onnxruntime.cudnn_conv_algo_search", '"fastest"', "'exhaustive', 'heuristic' or 'default'"],
    ),
    (
        "unknown TensorRT key",
        {"models": [resnet(tensorrt={"extra": {"trt_turbo": "1"}})]},
        ["tensorrt.extra", "unknown TensorRT key 'trt_turbo'", "trt_engine_cache_prefix"],
    ),
    (
        "bad precision",
        {"models": [resnet(tensorrt={"precision_mode": "FP8"})]},
        ["tensorrt.precision_mode", '"FP8"', "'FP32', 'FP16', 'BF16' or 'INT8'"],
    ),
    (
        "TensorRT on CPU",
        {"models": [resnet(tensorrt={}, instance_group={"kind": "KIND_CPU"})]},
        ["tensorrt", "KIND_CPU"],
    ),
    (
        "ORT tuning on TorchScript",
        {"models": [resnet(format="torchscript", onnxruntime={"execution_mode": "parallel"})]},
        ["onnxruntime", "format 'torchscript'", "'onnx' only"],
    ),
    (
        "FP16 on TorchScript",
        {"models": [resnet(format="torchscript", fp16=True)]},
        ["fp16", "format 'torchscript'"],
    ),
    (
        "parallel execution with one inter-op thread",
        {"models": [resnet(onnxruntime={"execution_mode": "parallel", "inter_op_thread_count": 1})]},
        ["onnxruntime.inter_op_thread_count: got 1", "runs sequentially"],
    ),
    ("unknown format", {"models": [resnet(format="tensorflow_savedmodel")]}, ["format", '"tensorflow_savedmodel"']),
    ("unknown task", {"models": [resnet(task="translation")]}, ["task", '"translation"']),
    (
        "text settings on a vision model",
        {"models": [resnet(text={"max_sequence_length": 64})]},
        ["text", "image-classification", "use image instead"],
    ),
    ("zero copies", {"models": [resnet(copies=0)]}, ["copies", "got 0", "greater than or equal to 1"]),
    (
        "negative tolerance",
        {"models": [resnet(tolerance={"atol": -1})]},
        ["tolerance.atol", "got -1", "greater than or equal to 0"],
    ),
    (
        "instance group kind",
        {"models": [resnet(instance_group={"kind": "KIND_TPU"})]},
        ["instance_group.kind", '"KIND_TPU"'],
    ),
]


@pytest.mark.parametrize(("case", "data", "expected"), BAD, ids=[case for case, _, _ in BAD])
def test_bad_manifest_gives_its_own_clear_error(case: str, data: Any, expected: list[str]) -> None:
    with pytest.raises(ManifestError) as caught:
        parse_manifest(data)
    message = str(caught.value)
    for fragment in expected:
        assert fragment in message, f"{case}: {fragment!r} not in {message!r}"
    assert "Traceback" not in message
    # Only the real problem is reported, not its echo on the enclosing list.
    assert "tuple should have at least 1 item" not in message or case == "no models"


def test_error_locates_the_model_by_index_and_name() -> None:
    data = {"models": [resnet(name="first"), resnet(name="second", max_batch_size=-3)]}
    with pytest.raises(ManifestError) as caught:
        parse_manifest(data)
    assert "models[1](second).max_batch_size: got -3" in str(caught.value)


def test_bad_manifests_give_distinct_messages() -> None:
    messages = set()
    for _, data, _ in BAD:
        with pytest.raises(ManifestError) as caught:
            parse_manifest(data)
        messages.add(str(caught.value))
    assert len(messages) == len(BAD)


def test_tensorrt_keys_are_the_documented_list() -> None:
    reference = (ROOT.parent / "shared" / "reference" / "sagemaker-triton-mme.md")
    if not reference.exists():
        pytest.skip("the shared reference file is not next to this checkout")
    text = reference.read_text()
    section = text[text.index("Keys: `precision_mode`"):text.index("Another accelerator name")]
    documented = set(re.findall(r"`([a-z0-9_]+)`", section))
    assert documented == set(TENSORRT_KEYS)


def run_cli(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "model_build", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    (action,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(action.choices)


def test_cli_usage_line_lists_every_subcommand() -> None:
    """Issue 38: ``--help`` opened with a hand-written line listing 7 of the 9 subcommands; the line
    and the module's docstring are now filled from the parser, and each subcommand runs its own func."""
    import triton_mme_cdk.model_build.__main__ as cli

    commands = _subcommands(cli._parser())
    assert {"validate", "build", "publish", "verify", "demo", "smoke", "endpoint", "plan", "releases"} <= set(commands)
    listed = "{" + ",".join(commands) + "}"
    result = subprocess.run([sys.executable, "-m", "model_build", "--help"], cwd=ROOT, capture_output=True, text=True,
                            timeout=120, env={**os.environ, "COLUMNS": "1000"})  # no wrapping (argparse's width)
    assert result.returncode == 0, result.stderr
    description = " ".join(result.stdout.split("\n\n")[1].split())
    assert description.startswith(f"``python -m model_build {listed}``"), description
    assert cli.__doc__ is not None and cli.__doc__.splitlines()[0].startswith(f"``python -m model_build {listed}``")
    assert all(callable(p.get_default("func")) for p in commands.values()), "a subcommand runs nothing"


def test_cli_usage_line_follows_a_new_subcommand(monkeypatch: pytest.MonkeyPatch) -> None:
    """A subcommand added by a tool's parser appears in the usage line with no other edit."""
    import triton_mme_cdk.model_build.__main__ as cli

    original = cli.add_plan_parsers

    def with_one_more(sub: Any, default_prefix: str) -> None:
        original(sub, default_prefix)
        sub.add_parser("newcommand", help="added by the test").set_defaults(func=lambda args: 0)

    monkeypatch.setattr(cli, "add_plan_parsers", with_one_more)
    parser = cli._parser()
    assert parser.description is not None
    listed = parser.description.split("{", 1)[1].split("}", 1)[0].split(",")
    assert "newcommand" in listed, listed
    assert all(f",{name}," in parser.description for name in ("plan", "releases", "pr-comment"))
    assert cli.main(["newcommand"]) == 0


def test_cli_validate_prints_targets_and_release() -> None:
    result = run_cli("validate", "--manifest", str(ROOT / "models.yaml"))
    assert result.returncode == 0, result.stderr
    release = compute_release(load_manifest(ROOT / "models.yaml"), base_dir=ROOT).release_id
    assert release in result.stdout
    assert "resnet-synthetic-0 .. resnet-synthetic-2" in result.stdout
    assert "6 target models in 4 entries" in result.stdout


def test_cli_bad_manifest_is_one_message_without_traceback(tmp_path: Path) -> None:
    bad = tmp_path / "models.yaml"
    bad.write_text(yaml.safe_dump({"models": [resnet(max_batch_size=2, dynamic_batching={
        "preferred_batch_size": [4]})]}))
    result = run_cli("build", "--manifest", str(bad), "--out", str(tmp_path / "out"))
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert "models[0](vision).dynamic_batching.preferred_batch_size: got [4]" in result.stderr
    # Refused before any slow work: nothing was written.
    assert not (tmp_path / "out").exists()


def test_cli_missing_manifest(tmp_path: Path) -> None:
    result = run_cli("validate", "--manifest", str(tmp_path / "nope.yaml"))
    assert result.returncode == 1
    assert "nope.yaml" in result.stderr and "not found" in result.stderr
    assert "Traceback" not in result.stderr


def test_cli_invalid_yaml(tmp_path: Path) -> None:
    bad = tmp_path / "models.yaml"
    bad.write_text("models: [\n")
    result = run_cli("validate", "--manifest", str(bad))
    assert result.returncode == 1 and "not valid YAML" in result.stderr
    assert "Traceback" not in result.stderr


#: YAML a manifest may hold, each scalar form the safe loader resolves, and the forms the one-pass
#: reader hands back to ``yaml.load`` (explicit tags, a merge key without an alias).
YAML_FORMS = {
    "default manifest": (ROOT / "models.yaml").read_text(),
    "ints": "a: [0, -12, +3, 0o17, 017, 0x1f, 1_000, 0b101, 1:30, 190:20:30]\n",
    "floats": "a: [1.5, 1e3, 6.8523015e+5, .5, -.inf, .NaN, 1_000.5, 190:20:30.15]\n",
    "bools and nulls": "a: [yes, No, on, OFF, true, False, y, n, ~, null, Null, ]\nb:\nc: ''\n",
    "timestamps": "a: [2001-12-14, 2001-12-14t21:59:43.10-05:00, 2001-12-14 21:59:43.10, 2002-12-14]\n",
    "quoted and block": "a: '1'\nb: \"true\"\nc: |\n  two\n  lines\nd: >\n  folded\n  text\ne: \"\\u00e9\\t\"\n",
    "keys of every kind": "1: a\ntrue: b\n~: c\n1.5: d\n2001-01-01: e\n'2': f\n",
    "nested flow": "a: {b: [1, {c: [[], {}]}], d: [x, 'y', \"z\"]}\n",
    "root sequence": "- 1\n- [2, {a: b}]\n- {}\n",
    "root scalar": "just text\n",
    "comments only": "# nothing\n",
    "non-specific tag": "a: ! 12\nb: ! [1]\n",
    "explicit tags": "a: !!str 12\nb: !!float 1\nc: !!binary aGk=\nd: !!set {x, y}\ne: !!omap [{k: 1}]\n",
    "merge key": "a:\n  <<: {b: 1, c: 2}\n  c: 3\n",
}


@pytest.mark.parametrize("name", list(YAML_FORMS))
def test_one_pass_reader_builds_what_yaml_load_builds(name: str) -> None:
    """The manifest's one event pass constructs the data itself (issue 38): the same values of the
    same types as ``yaml.load`` on the loader the project uses, for every scalar form."""
    from triton_mme_cdk.model_build.manifest import loading

    text = YAML_FORMS[name]
    expected = yaml.load(text, Loader=loading._SafeLoader)
    got = loading._read_yaml(text, "manifest 'm'")
    # repr, not ==: 1 == 1.0 == True, and a key or value of another type must not pass.
    assert repr(got) == repr(expected)


def test_one_pass_reader_reports_structure_before_values() -> None:
    """A value the safe loader refuses (a timestamp with month 13) is reported as before: after the
    structural checks, so a later duplicate key is still what the error names."""
    bad_date = "when: 2001-13-01\n"
    with pytest.raises(ManifestError, match=r"^manifest 'm': a value cannot be read: month must be in 1\.\.12$"):
        load_manifest_bytes(bad_date.encode(), origin="m")
    with pytest.raises(ManifestError, match=r"duplicate key 'x' at line 3, column 1"):
        load_manifest_bytes((bad_date + "x: 1\nx: 2\n").encode(), origin="m")
    with pytest.raises(ManifestError, match=r"could not determine a constructor for the tag"):
        load_manifest_bytes(b"a: !!python/name:os.system x\n", origin="m")
