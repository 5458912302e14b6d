"""Hostile and broken manifests: each is refused by the CLI (``validate`` and ``publish``), by the
CDK app and by the custom-resource Lambda with one error naming the file and what is wrong, fast,
in bounded memory, and with nothing written to S3 (moto's real server) or the build folder.

The limits (``MAX_MANIFEST_BYTES``, ``MAX_MANIFEST_DEPTH``, ``MAX_SCALAR_CHARS``) and the alias
policy (anchors and aliases refused outright) are documented in docs/manifest.md.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from hostile_helpers import (
    SYNTH_TIME_LIMIT_S,
    Outcome,
    assert_refused,
    run_app_refusals,
    run_bounded,
)

from triton_mme_cdk.model_build.aws_clients import make_s3_client
from triton_mme_cdk.model_build.manifest import MAX_MANIFEST_BYTES, MAX_MANIFEST_DEPTH, MAX_SCALAR_CHARS
from triton_mme_cdk.model_build.tools.local_s3 import local_s3

VALID = (
    "version: 1\n"
    "models:\n"
    "  - name: tiny\n"
    "    source: {kind: synthetic, architecture: bert, config: {num_hidden_layers: 1}}\n"
    "    task: sentence-embedding\n"
    "    format: onnx\n"
    "    max_batch_size: 2\n"
    "    text: {max_sequence_length: 8}\n"
)


def _billion_laughs(levels: int = 9) -> str:
    lines = ['a0: &a0 ["lol"]']
    for i in range(1, levels + 1):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]")
    return "\n".join(lines) + "\n" + VALID


#: name -> (file bytes, fragments the error line must hold besides the file name)
CORPUS: dict[str, tuple[bytes, tuple[str, ...]]] = {
    "latin1": (VALID.replace("tiny", "caf\xe9").encode("latin-1"), ("not UTF-8", "0xe9", "line 3")),
    "binary": (bytes(range(128, 256)) * 64, ("not UTF-8", "offset 0")),
    "nul-bytes": (b"version: 1\x00\x00\x00models: []\n", ("NUL byte", "not a binary file")),
    "utf16": (VALID.encode("utf-16"), ("UTF-16", "save it as UTF-8")),
    "billion-laughs": (_billion_laughs().encode(), ("anchor", "&a0", "not allowed")),
    "merge-key": (
        b"base: &base {format: onnx}\nversion: 1\nmodels:\n  - <<: *base\n    name: x\n",
        ("anchor", "&base"),
    ),
    "alias-only": (b"version: 1\nmodels: *nowhere\n", ("alias", "not allowed")),
    "deep-nesting": (("models: " + "[" * 100_000 + "]" * 100_000 + "\n").encode(), (f"deeper than {MAX_MANIFEST_DEPTH}",)),
    "huge-file": ((VALID + "# padding\n" * (MAX_MANIFEST_BYTES // 10 + 1)).encode(), (f"at most {MAX_MANIFEST_BYTES}",)),
    "duplicate-key": (VALID.replace("    format: onnx\n", "    format: onnx\n    format: torchscript\n").encode(),
                      ("duplicate key 'format'", "line 7")),
    "nan": (VALID.replace("max_batch_size: 2", "max_batch_size: .nan").encode(), ("models[0].max_batch_size", "NaN")),
    "inf": (VALID.replace("max_batch_size: 2", "max_batch_size: -.inf").encode(), ("max_batch_size", "infinite")),
    "tabs": (VALID.replace("  - name: tiny", "\t- name: tiny").encode(), ("tab character", "line 3", "spaces")),
    "two-documents": ((VALID + "---\n" + VALID).encode(), ("second YAML document", "line 9")),
    "empty": (b"   \n\n", ("is empty",)),
    "long-value": (VALID.replace("tiny", "t" * (MAX_SCALAR_CHARS + 1)).encode(), ("characters", f"at most {MAX_SCALAR_CHARS}")),
    "not-yaml": (b"version: 1\nmodels: [unclosed\n", ("not valid YAML", "line 3")),
}

#: The corpus entry whose runs are plain fresh subprocesses (``run_bounded(fresh=True)``); the
#: others are forked from the zygote (tests/hostile_helpers.py says what that shares).
FRESH = min(CORPUS)


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    with local_s3() as endpoint:
        yield endpoint


def _write(tmp_path: Path, name: str) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_bytes(CORPUS[name][0])
    return path


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_publish_refuses_hostile_manifest(name: str, tmp_path: Path, s3_endpoint: str) -> None:
    """`publish` is the widest path (manifest -> build folder -> S3): nothing may reach either."""
    s3 = make_s3_client(endpoint_url=s3_endpoint)
    bucket = f"hostile-{name}"
    s3.create_bucket(Bucket=bucket)
    path = _write(tmp_path, name)
    out = tmp_path / "build"
    outcome = run_bounded(["-m", "model_build", "publish", "--manifest", str(path), "--out", str(out),
                           "--bucket", bucket, "--endpoint-url", s3_endpoint], fresh=name == FRESH)
    assert_refused(outcome, str(path), *CORPUS[name][1])
    assert not out.exists() or not any(out.iterdir())
    assert s3.list_objects_v2(Bucket=bucket).get("KeyCount", 0) == 0


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_validate_refuses_hostile_manifest(name: str, tmp_path: Path) -> None:
    path = _write(tmp_path, name)
    outcome = run_bounded(["-m", "model_build", "validate", "--manifest", str(path)], fresh=name == FRESH)
    assert_refused(outcome, str(path), *CORPUS[name][1])
    assert sorted(tmp_path.iterdir()) == [path], "validate writes nothing"


def test_utf8_byte_order_mark_is_accepted(tmp_path: Path) -> None:
    """Windows editors write a UTF-8 BOM: it is dropped, not refused."""
    path = tmp_path / "bom.yaml"
    path.write_bytes(b"\xef\xbb\xbf" + VALID.encode())
    outcome = run_bounded(["-m", "model_build", "validate", "--manifest", str(path)])
    assert outcome.returncode == 0, outcome.stderr
    assert "tiny" in outcome.stdout


@pytest.mark.parametrize("key", ["trt_extra_plugin_lib_paths", "trt_ep_context_file_path", "trt_timing_cache_path"])
def test_a_path_valued_tensorrt_key_is_refused(key: str, tmp_path: Path) -> None:
    """A models-only change must not make the fleet's ONNX Runtime load a native library or a file
    at a path it names (issue 62): refused, the line naming the field, the value and what is allowed."""
    path = tmp_path / "trt.yaml"
    path.write_text(VALID + f"    tensorrt: {{extra: {{{key}: /opt/ml/models/x/model/1/p.so}}}}\n")
    outcome = run_bounded(["-m", "model_build", "validate", "--manifest", str(path)])
    assert_refused(outcome, str(path), "invalid")
    (detail,) = [line for line in outcome.stderr.splitlines() if "tensorrt.extra" in line]
    for fragment in (key, "'/opt/ml/models/x/model/1/p.so'", "path-valued", "allowed are the keys that take no path"):
        assert fragment in detail, detail


def test_a_directory_is_not_a_manifest(tmp_path: Path) -> None:
    outcome = run_bounded(["-m", "model_build", "validate", "--manifest", str(tmp_path)])
    assert_refused(outcome, str(tmp_path), "is a directory")


def _synth_case(folder: Path, name: str) -> tuple[dict[str, object], Path]:
    """The app's context for a corpus entry (``mme:manifest_path``, as ``cdk synth -c`` passes it)
    and an output folder of its own."""
    folder.mkdir(parents=True, exist_ok=True)
    return {"mme:manifest_path": str(_write(folder, name))}, folder / "cdk.out"


@pytest.fixture(scope="module")
def synth_refusals(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Outcome, Path]]:
    """Every entry refused by the app: :data:`FRESH` as ``python app.py`` in a fresh process, the
    others in one process (``run_app_refusals``: jsii's node starts once, not per entry)."""
    root = tmp_path_factory.mktemp("synth")
    cases = {name: _synth_case(root / name, name) for name in sorted(CORPUS)}
    outcomes = run_app_refusals(cases, root / "_runs", fresh=FRESH)
    return {name: (outcomes[name], root / name) for name in cases}


@pytest.mark.slow  # a CDK app (Node.js, jsii); the same corpus runs through `validate` in test-fast
@pytest.mark.parametrize("name", sorted(CORPUS))
def test_synth_refuses_hostile_manifest(name: str, synth_refusals: dict[str, tuple[Outcome, Path]]) -> None:
    """The CDK app reads the manifest before it builds a construct: refused without a template."""
    outcome, folder = synth_refusals[name]
    assert_refused(outcome, str(folder / f"{name}.yaml"), *CORPUS[name][1], time_limit=SYNTH_TIME_LIMIT_S)
    out = folder / "cdk.out"
    assert not out.exists() or not list(out.rglob("*.json")), "no template, no asset manifest"


#: The custom resource's Lambda, in a subprocess: CloudFormation shows ``error: <reason>``.
HANDLER_RUNNER = """
import json, sys
from triton_mme_cdk.model_build import handler
try:
    result = getattr(handler, sys.argv[1])(json.loads(sys.argv[2]))
except handler.HandlerError as error:
    print(f"error: {error}", file=sys.stderr)
    sys.exit(1)
print(json.dumps(result))
"""


@pytest.mark.parametrize("entry", ["on_event", "is_complete", "build_step"])
@pytest.mark.parametrize("name", sorted(CORPUS))
def test_handler_refuses_hostile_manifest(name: str, entry: str, tmp_path: Path, s3_endpoint: str) -> None:
    """The manifest asset as the Lambda reads it (from S3): each entry point that reads it
    (the custom resource's two and the state machine's plan step) fails with the reason naming
    the object, and writes nothing to the model bucket or the Lambda's /tmp."""
    s3 = make_s3_client(endpoint_url=s3_endpoint)
    assets, models = f"assets-{name}-{entry}".replace("_", "-")[:63], f"models-{name}-{entry}".replace("_", "-")[:63]
    for bucket in (assets, models):
        s3.create_bucket(Bucket=bucket)
    s3.put_object(Bucket=assets, Key=f"{name}.yaml", Body=CORPUS[name][0])
    props = {"ServiceToken": "arn:aws:lambda:us-east-1:123456789012:function:provider",
             "ManifestBucket": assets, "ManifestKey": f"{name}.yaml", "ManifestSha256": "0" * 64,
             "ModelBucket": models, "ModelPrefix": "models", "ReleaseId": "r-0123456789abcdef"}
    event = ({"Step": "plan", "Request": props} if entry == "build_step" else
             {"RequestType": "Create", "RequestId": "r1", "ResourceProperties": props,
              "StackId": "arn:aws:cloudformation:us-east-1:1:stack/s/x"})
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    outcome = run_bounded(["-c", HANDLER_RUNNER, entry, json.dumps(event)],
                          env={"MODEL_BUILD_S3_ENDPOINT_URL": s3_endpoint, "AWS_DEFAULT_REGION": "us-east-1",
                               "TMPDIR": str(scratch)},
                          fresh=name == FRESH and entry == "on_event")
    line = assert_refused(outcome, f"s3://{assets}/{name}.yaml", *CORPUS[name][1])
    assert len(line) <= 420, "CloudFormation shows a short reason"
    assert s3.list_objects_v2(Bucket=models).get("KeyCount", 0) == 0
    assert not any(scratch.iterdir())
