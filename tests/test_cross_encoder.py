"""Cross-encoders and rerankers (issue 24): task ``text-classification``, a text or a pair of texts in,
the sequence-classification head's logits out.

Sources are made offline (model_build/tools/text_sources.py ``make_cross_encoder_source``): a
tokenizer trained on a small multilingual corpus and a small random ``*ForSequenceClassification``
of its architecture, saved with ``save_pretrained``. BERT's tokenizer gives ``token_type_ids`` (the
second text of a pair is segment 1), RoBERTa's does not: the graph takes them exactly where the
tokenizer gives them, as ``CrossEncoder`` passes them.

(a) The manifest: what is accepted and refused for the task, each refusal naming the field.
(b) A checkpoint without a trained head is refused before export (transformers would initialise
    one at random and only log it).
(c) Slow: exports of both kinds (tokens in) equal ``CrossEncoder.predict`` on pairs; both kinds
    built with ``inputs: text``, published and served on the real tritonserver behind the local
    endpoint: ``TEXT`` + ``TEXT_PAIR`` in, logits equal to ``CrossEncoder.predict`` (max |diff|
    printed); ``TEXT`` alone equal to transformers on single texts; mismatched or empty pairs a
    400 (Triton's own, for rows that do not line up, or the tokenizer's naming
    ``TEXT_PAIR``); the smoke test sends the build's pair reference and passes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from triton_mme_cdk.model_build.errors import ManifestError, SourceError
from triton_mme_cdk.model_build.manifest import parse_manifest
from triton_mme_cdk.model_build.tools.text_sources import CORPUS, make_cross_encoder_source, make_text_source

MAX_LEN = 48
#: Pairs across scripts and lengths, the second member sometimes far longer than the first (the
#: longest member is the one truncated).
FIRSTS = [CORPUS[0], CORPUS[3], CORPUS[5], CORPUS[8], CORPUS[10], CORPUS[12]]
SECONDS = [CORPUS[1], CORPUS[13] * 4, CORPUS[6], CORPUS[9], CORPUS[2], CORPUS[16]]


def entry(name: str = "rerank", **overrides: object) -> dict[str, object]:
    return {"name": name, "source": {"kind": "local", "path": "source"}, "task": "text-classification",
            "inputs": "text", "max_batch_size": 8, "instance_group": {"kind": "KIND_CPU", "count": 1},
            "text": {"max_sequence_length": MAX_LEN, "truncation": "truncate"}, **overrides}


def predict(folder: Path, firsts: list[str], seconds: list[str]) -> np.ndarray:
    """``CrossEncoder.predict`` without its activation: the logits, ``[n, num_labels]``."""
    import torch
    from sentence_transformers import CrossEncoder

    model = CrossEncoder(str(folder), device="cpu", local_files_only=True, max_length=MAX_LEN)
    scores = model.predict(list(zip(firsts, seconds, strict=True)), activation_fn=torch.nn.Identity(),
                           convert_to_numpy=True, show_progress_bar=False)
    return np.asarray(scores, dtype=np.float32).reshape(len(firsts), -1)


# --------------------------------------------------------------------------------------------
# (a) the manifest
# --------------------------------------------------------------------------------------------

def test_the_task_takes_raw_text_and_tokens():
    for inputs in ("text", "tokens"):
        overrides: dict[str, Any] = {} if inputs == "text" else {"inputs": "tokens", "text": {"max_sequence_length": MAX_LEN}}
        spec = parse_manifest({"models": [entry(**overrides)]}).models[0]
        assert spec.task == "text-classification" and spec.inputs == inputs


@pytest.mark.parametrize(("overrides", "message"), [
    ({"source": {"kind": "synthetic", "architecture": "resnet"}, "inputs": "tokens", "text": None},
     "task: text-classification needs a text architecture"),
    ({"image": {"image_size": 32}}, "image: given for text task 'text-classification'"),
    ({"precision": "int8"}, "precision: got 'int8' for task 'text-classification' without a tolerance"),
    ({"precision": "fp16", "instance_group": {"kind": "KIND_GPU", "count": 1}},
     "precision: got 'fp16' for task 'text-classification' without a tolerance"),
    ({"task": "image-classification", "inputs": "text", "text": None},
     "inputs: got 'text' for task 'image-classification'; raw-text inputs are for feature-extraction, "
     "sentence-embedding, text-classification"),
])
def test_the_manifest_refuses_what_cannot_work_naming_the_field(overrides, message):
    with pytest.raises(ManifestError) as caught:
        parse_manifest({"models": [{k: v for k, v in entry(**overrides).items() if v is not None}]})
    assert message in str(caught.value)


def test_a_lower_precision_is_allowed_with_a_tolerance_for_the_logits():
    spec = parse_manifest({"models": [entry(precision="int8", tolerance={"atol": 0.05, "rtol": 0})]}).models[0]
    assert spec.effective_precision == "int8"


# --------------------------------------------------------------------------------------------
# (b) a checkpoint without a trained head
# --------------------------------------------------------------------------------------------

def test_an_encoder_checkpoint_without_a_head_is_refused_naming_the_missing_weights(tmp_path):
    from triton_mme_cdk.model_build.export.eager import load_module

    folder = make_text_source("wordpiece", tmp_path / "source", pooling=None, max_length=MAX_LEN).path
    spec = parse_manifest({"models": [entry()]}).models[0]
    with pytest.raises(SourceError) as caught:
        load_module(spec, folder)
    message = str(caught.value)
    assert "no trained classification head for task text-classification" in message
    assert "classifier.weight" in message and "sequence-classification checkpoint" in message


# --------------------------------------------------------------------------------------------
# (c) exports and the served ensemble
# --------------------------------------------------------------------------------------------

#: kind -> (num_labels, whether the tokenizer gives token_type_ids).
KINDS = {"wordpiece": (1, True), "bpe": (3, False)}


@pytest.mark.slow
@pytest.mark.parametrize("kind", list(KINDS))
def test_the_export_takes_token_types_where_the_tokenizer_gives_them_and_equals_cross_encoder(tmp_path, kind):
    import onnxruntime as ort
    from transformers import AutoTokenizer

    from triton_mme_cdk.model_build.export.validate import export_and_validate

    labels, types = KINDS[kind]
    make_cross_encoder_source(kind, tmp_path / "source", num_labels=labels, max_length=MAX_LEN)
    spec = parse_manifest({"models": [entry(inputs="tokens", text={"max_sequence_length": MAX_LEN})]}).models[0]
    exported, report, _ = export_and_validate(spec, base_dir=tmp_path, work_dir=tmp_path / "work")
    names = [tensor.name for tensor in exported.inputs]
    assert names == ["input_ids", "attention_mask", *(["token_type_ids"] if types else [])]
    assert [(out.name, out.shape) for out in exported.outputs] == [("logits", (-1, labels))]
    assert report.max_abs_diff["logits"] < 1e-4

    tokenizer = AutoTokenizer.from_pretrained(str(tmp_path / "source"), local_files_only=True)
    encoded = tokenizer(FIRSTS, SECONDS, padding=True, truncation=True, max_length=MAX_LEN, return_tensors="np")
    if types:
        assert encoded["token_type_ids"].max() == 1  # the second segment is there to be seen
    session = ort.InferenceSession(str(exported.path), providers=["CPUExecutionProvider"])
    (actual,) = session.run(["logits"], {name: encoded[name].astype(np.int64) for name in names})
    expected = predict(tmp_path / "source", FIRSTS, SECONDS)
    assert float(np.abs(actual - expected).max()) < 1e-4
    # The scores depend on the pairing (a wrong segment or mask would hardly move random logits
    # that sit near zero: the source's head is initialised to spread them).
    assert float(np.abs(expected - predict(tmp_path / "source", FIRSTS, SECONDS[::-1])).max()) > 1e-2


@pytest.mark.slow
def test_pairs_in_logits_out_on_the_local_endpoint_like_cross_encoder(tmp_path, capsys):
    import torch
    from botocore.exceptions import ClientError
    from transformers import AutoModelForSequenceClassification, AutoTokenizer
    from triton_helpers import served_manifest

    from triton_mme_cdk.model_build.tools.smoke.prepare import make_client, make_runtime_client
    from triton_mme_cdk.model_build.tools.smoke.runner import run_smoke

    entries = []
    for kind, (labels, _) in KINDS.items():
        make_cross_encoder_source(kind, tmp_path / kind, num_labels=labels, max_length=MAX_LEN)
        entries.append(entry(f"rerank-{kind}", source={"kind": "local", "path": kind}))
    manifest = parse_manifest({"version": 1, "models": entries})
    report: dict[str, float] = {}

    def invoke(runtime, target: str, inputs: list[dict[str, object]]) -> np.ndarray:
        answer = runtime.invoke_endpoint(EndpointName="local", TargetModel=target, ContentType="application/json",
                                         Body=json.dumps({"inputs": inputs}))
        out = json.loads(answer["Body"].read())["outputs"][0]
        assert out["name"] == "logits"
        return np.asarray(out["data"], dtype=np.float32).reshape(out["shape"])

    def strings(name: str, values: list[str]) -> dict[str, object]:
        return {"name": name, "datatype": "BYTES", "shape": [len(values), 1], "data": values}

    with served_manifest(manifest, tmp_path, tmp_path / "build", "rerank") as (endpoint, runtime, s3):
        for kind, (labels, _) in KINDS.items():
            target = f"rerank-{kind}.tar.gz"
            pairs = invoke(runtime, target, [strings("TEXT", FIRSTS), strings("TEXT_PAIR", SECONDS)])
            expected = predict(tmp_path / kind, FIRSTS, SECONDS)
            assert pairs.shape == expected.shape == (len(FIRSTS), labels)
            report[kind] = float(np.abs(pairs - expected).max())
            assert report[kind] < 1e-4, (kind, report[kind])

            # Without TEXT_PAIR each text is scored alone, as transformers scores it.
            singles = invoke(runtime, target, [strings("TEXT", FIRSTS)])
            tokenizer = AutoTokenizer.from_pretrained(str(tmp_path / kind), local_files_only=True)
            model = AutoModelForSequenceClassification.from_pretrained(str(tmp_path / kind), local_files_only=True)
            with torch.no_grad():
                alone = model(**tokenizer(FIRSTS, padding=True, truncation=True, max_length=MAX_LEN,
                                          return_tensors="pt")).logits.numpy()
            assert float(np.abs(singles - alone).max()) < 1e-4
            assert float(np.abs(singles - pairs).max()) > 1e-2  # the pair was really scored as a pair

        for inputs, message in (
            # Triton itself refuses rows that do not line up, before the tokenizer step sees them.
            ([strings("TEXT", FIRSTS[:2]), strings("TEXT_PAIR", SECONDS[:1])], "batch size does not match other inputs"),
            ([strings("TEXT", FIRSTS[:2]), strings("TEXT_PAIR", ["fine", " "])], "input 'TEXT_PAIR'[1]: the text is empty"),
        ):
            with pytest.raises(ClientError) as caught:
                invoke(runtime, "rerank-bpe.tar.gz", inputs)
            assert message in str(caught.value)
        # The server kept answering.
        assert invoke(runtime, "rerank-bpe.tar.gz", [strings("TEXT", FIRSTS[:1])]).shape == (1, 3)

        # The build's reference is a request of pairs: smoke sends it and compares the answers.
        smoke = run_smoke(endpoint_name="local", sagemaker_client=make_client("sagemaker", endpoint_url=endpoint.url),
                          runtime_client=make_runtime_client(endpoint_url=endpoint.url, timeout_seconds=120),
                          s3_client=s3, timeout_seconds=120)
        assert smoke.ok, [row.error for row in smoke.rows]
        assert sorted(row.target for row in smoke.rows) == ["rerank-bpe.tar.gz", "rerank-wordpiece.tar.gz"]
    with capsys.disabled():
        print("\nmax |ensemble - CrossEncoder.predict| per kind: "
              + ", ".join(f"{kind} {diff:.1e}" for kind, diff in report.items()))


@pytest.mark.slow
def test_the_build_check_refuses_a_served_tokenizer_whose_pairs_differ_naming_the_pair(tmp_path):
    """A served tokenizer.json giving the second text of a pair segment 0: single texts still match,
    pairs do not; the check names the token type ids and the pair, before anything is packaged."""
    import dataclasses

    from triton_mme_cdk.model_build.errors import ValidationMismatchError
    from triton_mme_cdk.model_build.export.validate import export_and_validate
    from triton_mme_cdk.model_build.text_ensemble.check import check_text_ensemble
    from triton_mme_cdk.model_build.text_ensemble.served_tokenizer import prepare_tokenizer

    make_cross_encoder_source("wordpiece", tmp_path / "source", max_length=MAX_LEN)
    spec = parse_manifest({"models": [entry()]}).models[0]
    exported, _, _ = export_and_validate(spec, base_dir=tmp_path, work_dir=tmp_path / "work")
    served = prepare_tokenizer(spec, tmp_path / "source")
    report = check_text_ensemble(spec, exported, served)
    assert report.max_abs_diff is not None and report.max_abs_diff < 1e-4
    assert set(report.reference_inputs) == {"TEXT", "TEXT_PAIR"}

    document = json.loads(served.tokenizer_json)
    for piece in document["post_processor"]["pair"]:
        for item in piece.values():
            item["type_id"] = 0
    drifted = dataclasses.replace(served, tokenizer_json=json.dumps(document))
    with pytest.raises(ValidationMismatchError, match=r"other token_type_ids than transformers\.AutoTokenizer for pair 0 "):
        check_text_ensemble(spec, exported, drifted)
