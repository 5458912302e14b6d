"""Verify a raw-text ensemble before it is packaged: strings -> the ensemble's path -> outputs.

The ensemble's path is replayed in-process exactly as the server runs it: the tarball's own
tokenizer step (:class:`~model_build.text_ensemble.tokenizer_model.TextEncoder` of the same file,
on the served ``tokenizer.json``) then the exported file through the serving runtime
(:func:`model_build.export.validate.exported_runner`). Two checks, on the manifest's sample texts and on
texts in other scripts (Japanese, Chinese, Korean, Arabic, accented Latin, Cyrillic, emoji,
combining marks, a very long word, whitespace runs), where tokenizers differ most:

1. token ids, attention mask and token type ids equal those of ``transformers.AutoTokenizer`` for
   the source, exactly (a different id is a silently different embedding: no tolerance applies);
2. for ``sentence-embedding`` sources that sentence-transformers loads, the outputs equal
   ``SentenceTransformer.encode`` within the model's tolerance; for ``text-classification``
   sources (cross-encoders, rerankers), the logits of pairs equal ``CrossEncoder.predict``'s
   (without its activation), within the tolerance.

Tasks that score pairs are checked on pairs too (each text with the next one): ids and token type
ids of both segments, truncation of the longest member, and the reference request carries
``TEXT_PAIR`` so that ``verify``, ``smoke`` and the demo send pairs.

A failure raises :class:`~model_build.errors.ValidationMismatchError` naming the text; a text the
served tokenizer encodes to no token of its own, :class:`~model_build.errors.TokenizerCheckError`
naming the source, the file and the text (before any id is compared). The pipeline's step turns the
tokenizer step's own errors into that one line too (``served_tokenizer.tokenizer_errors``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from triton_mme_cdk.model_build.errors import ValidationMismatchError
from triton_mme_cdk.model_build.manifest import PAIR_TASKS, ModelSpec, Tolerance
from triton_mme_cdk.model_build.text_ensemble.ensemble import MASK_TASKS
from triton_mme_cdk.model_build.text_ensemble.served_tokenizer import (
    ServedTokenizer,
    encoder_for,
    refuse_tokenless_texts,
)
from triton_mme_cdk.model_build.text_ensemble.tokenizer_model import PAIR_INPUT, TEXT_INPUT
from triton_mme_cdk.model_build.types import ExportedModel

#: Texts in other scripts checked for every raw-text target, besides the manifest's samples.
OTHER_SCRIPTS: tuple[str, ...] = (
    "東京は日本の首都で、カタカナとひらがなと漢字を使います。",
    "我爱北京天安门，天安门上太阳升。",  # noqa: RUF001 - the full-width comma is part of the test
    "한국어 문장도 토큰화됩니다.",
    "Crème brûlée à la façon d'Ångström; naïve café, ÉCOLE, İstanbul, straße.",
    "Съешь же ещё этих мягких французских булок, да выпей чаю.",
    "Great job 👍🏽 see you soon 😀 🇯🇵 ❤️",
    "مرحبا بالعالم، هذه جملة باللغة العربية.",
    "Combining marks: e\u0301 a\u0308 n\u0303 \u1e9b\u0323 and Zalgo t\u0336e\u0337x\u0338t",
    "Pneumonoultramicroscopicsilicovolcanoconiosis" * 3,
    "  spaces   and\ttabs\n\nand newlines  between   words  ",
)


@dataclass(frozen=True)
class TextEnsembleReport:
    """What the check compared (recorded with the build)."""

    texts: int
    tokens_identical: bool
    #: Largest ``|ensemble - SentenceTransformer.encode|``; ``None`` when no such reference exists.
    max_abs_diff: float | None
    #: A request of strings and the answer the ensemble path gives (our tokenizer, the exported
    #: model): the reference ``verify``, ``smoke`` and the demo send to the endpoint.
    reference_inputs: dict[str, np.ndarray]
    reference_outputs: dict[str, np.ndarray]


def check_text_ensemble(spec: ModelSpec, exported: ExportedModel, tokenizer: ServedTokenizer) -> TextEnsembleReport:
    """Run both checks of the module docstring; raise on the first text that differs."""
    from transformers import AutoTokenizer

    from triton_mme_cdk.model_build.export.eager import reference_sentences
    from triton_mme_cdk.model_build.export.validate import (
        compare_outputs,
        elementwise_tolerance_applies,
        exported_runner,
        has_sentence_transformers_reference,
        has_source_folder,
        reference_normalizes,
    )

    source_dir = tokenizer.source_dir
    max_len = spec.text_inputs.max_sequence_length
    texts = [*reference_sentences(spec), *OTHER_SCRIPTS]
    # Pairs: each text with the next one (pair tasks only).
    pairs = [texts[(i + 1) % len(texts)] for i in range(len(texts))] if spec.task in PAIR_TASKS else None
    # Ids against the reference at one width (max_length), then the model on the request shapes
    # the server makes (the entry's padding), so both the ids and the served padding are checked.
    full_width = encoder_for(tokenizer, spec, truncate=True, padding="max_length")
    # All three arrays come out: the runner feeds the graph the ones it takes (exported_feeds).
    encode = encoder_for(tokenizer, spec, truncate=True).encode_batch

    reference = AutoTokenizer.from_pretrained(str(source_dir), local_files_only=True)

    def lowered(values: list[str]) -> list[str]:
        return [text.lower() for text in values] if tokenizer.parameters.get("lowercase") == "true" else values

    from tokenizers import Tokenizer

    # Every text (pairs are the same texts) gives tokens of its own: else one line naming it, not the
    # served step's per-request error about row 0 of a batch.
    refuse_tokenless_texts(spec, Tokenizer.from_str(tokenizer.tokenizer_json), lowered(texts), folder=source_dir,
                           tokenizer_class=tokenizer.tokenizer_class, unknown=None)

    for second in (None, pairs) if pairs is not None else (None,):
        ours = full_width.encode_batch(texts, second)
        expected = reference(lowered(texts), None if second is None else lowered(second), truncation=True,
                             max_length=max_len, padding="max_length", return_tensors="np")
        _check_ids(spec, texts, second, ours, expected)

    run = exported_runner(exported)
    chunk = max(1, min(8, spec.max_batch_size))
    rows = min(chunk, len(texts))
    first = encode(texts[:rows], None if pairs is None else pairs[:rows])
    answers = run(first)
    outputs = {tensor.name: np.asarray(value) for tensor, value in zip(exported.outputs, answers, strict=True)}
    if spec.task in MASK_TASKS and "attention_mask" not in outputs:
        outputs["attention_mask"] = first["attention_mask"]
    # Fixed-width UTF-8 bytes: the .npz stays pickle-free; tritonclient sends them as BYTES.
    request = {TEXT_INPUT: _strings(texts[:rows])}
    if pairs is not None:
        request[PAIR_INPUT] = _strings(pairs[:rows])
    tolerance = spec.tolerance if elementwise_tolerance_applies(spec) else Tolerance(atol=np.inf, rtol=0)
    if pairs is not None and has_source_folder(spec, source_dir):
        assert source_dir is not None
        diff = _check_cross_encoder(spec, exported, source_dir, texts, pairs, encode, run, tolerance, chunk)
        return TextEnsembleReport(texts=len(texts), tokens_identical=True, max_abs_diff=diff,
                                  reference_inputs=request, reference_outputs=outputs)
    if not has_sentence_transformers_reference(spec, source_dir):
        return TextEnsembleReport(texts=len(texts), tokens_identical=True, max_abs_diff=None,
                                  reference_inputs=request, reference_outputs=outputs)

    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(source_dir), device="cpu", local_files_only=True)
    model.max_seq_length = min(model.max_seq_length or max_len, max_len)
    wanted = model.encode(texts, convert_to_numpy=True, show_progress_bar=False,
                          normalize_embeddings=reference_normalizes(spec, source_dir))
    actual = np.concatenate([run(encode(texts[i:i + chunk]))[0] for i in range(0, len(texts), chunk)])
    diff = compare_outputs(spec.name, f"{exported.outputs[0].name} (strings vs sentence-transformers)",
                           actual, wanted, tolerance)
    return TextEnsembleReport(texts=len(texts), tokens_identical=True, max_abs_diff=diff,
                              reference_inputs=request, reference_outputs=outputs)


def _strings(texts: list[str]) -> np.ndarray:
    return np.array([[text.encode("utf-8")] for text in texts], dtype=np.bytes_)


def _check_ids(spec: ModelSpec, texts: list[str], pairs: list[str] | None, ours: dict[str, np.ndarray],
               expected: Any) -> None:
    """Every row's ids, mask and token type ids equal the reference tokenizer's, exactly."""
    mask = ours["attention_mask"]
    for name in ("input_ids", "attention_mask", "token_type_ids"):
        if name not in expected:
            continue
        for row, text in enumerate(texts):
            if not np.array_equal(ours[name][row], expected[name][row]):
                what = f"text {row} {text[:60]!r}" if pairs is None else f"pair {row} ({text[:40]!r}, {pairs[row][:40]!r})"
                raise ValidationMismatchError(
                    f"model {spec.name!r}: inputs: text: the ensemble's tokenizer gives other {name} than "
                    f"transformers.AutoTokenizer for {what}: "
                    f"{_unpadded(ours[name][row], mask[row])} vs "
                    f"{_unpadded(expected[name][row], expected['attention_mask'][row])}",
                    model=spec.name, output=name, max_abs_diff=float("inf"), tolerance=0.0)


def _check_cross_encoder(spec: ModelSpec, exported: ExportedModel, source_dir: Path, texts: list[str], pairs: list[str],
                         encode: Callable[[list[str], list[str] | None], dict[str, np.ndarray]],
                         run: Callable[[dict[str, np.ndarray]], list[np.ndarray]], tolerance: Tolerance,
                         chunk: int) -> float:
    """The served path's logits of ``pairs`` against ``CrossEncoder.predict`` (no activation: the
    graph returns logits; a client applies the sigmoid or softmax it wants)."""
    import torch
    from sentence_transformers import CrossEncoder

    from triton_mme_cdk.model_build.export.validate import compare_outputs

    model = CrossEncoder(str(source_dir), device="cpu", local_files_only=True,
                         max_length=spec.text_inputs.max_sequence_length)
    wanted = model.predict(list(zip(texts, pairs, strict=True)), activation_fn=torch.nn.Identity(),
                           convert_to_numpy=True, show_progress_bar=False)
    actual = np.concatenate([run(encode(texts[i:i + chunk], pairs[i:i + chunk]))[0]
                             for i in range(0, len(texts), chunk)])
    wanted = np.asarray(wanted, dtype=np.float32).reshape(actual.shape)
    return compare_outputs(spec.name, f"{exported.outputs[0].name} (pairs vs CrossEncoder.predict)",
                           actual, wanted, tolerance)


def _unpadded(ids: np.ndarray, mask: np.ndarray) -> list[int]:
    """The ids of one row where the mask is set (for the error message)."""
    return [int(i) for i, kept in zip(ids, mask, strict=True) if kept]
