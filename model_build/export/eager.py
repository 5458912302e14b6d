"""The eager PyTorch module of a source and the inputs it is traced, validated and calibrated on.

``load_module`` wraps the transformers model so the graph's inputs and outputs are the ones
:func:`input_names` / :func:`output_names` name (pooling inside the graph for sentence
embeddings); ``sample_inputs``, ``reference_inputs`` and ``calibration_inputs`` make the batches:
real sentences through the source's own tokenizer where it has one, seeded random ids or pixels
else. Calibration inputs are held out from validation.

This module imports torch (the CLI imports it lazily); transformers is imported where it is used.
"""

from __future__ import annotations

import functools
import inspect
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
from torch import nn

from triton_mme_cdk.model_build.errors import SourceError
from triton_mme_cdk.model_build.manifest import (
    PAIR_TASKS,
    TEXT_TASKS,
    TOKENIZER_FILES,
    ModelSpec,
    OnnxFileSource,
    SyntheticSource,
)

#: Real sentences of different lengths: validation should see real token statistics and padding,
#: not only random ids (a broken attention mask shows up only with padded batches).
DEFAULT_SENTENCES: tuple[str, ...] = (
    "A man is playing a guitar.",
    "The new movie is awesome and everyone in the theatre loved it.",
    "Triton serves many models from one GPU endpoint.",
    "It is raining.",
    "The quick brown fox jumps over the lazy dog while the farmer watches from the porch.",
    "Stocks fell sharply on Monday after the central bank raised interest rates again.",
    "She opened the window to let in the cool morning air.",
    "How do I reset my password if I no longer have access to my email account?",
)

#: What the INT8 layer choice is calibrated on (:func:`calibration_inputs`). None of these is a
#: validation sentence (:data:`DEFAULT_SENTENCES`, or a manifest's ``sample_texts``, which
#: replace them there), and random inputs use their own seed: the accuracy gate is judged on
#: inputs the calibration never saw, so the cosine in the build table is a held-out figure.
CALIBRATION_SENTENCES: tuple[str, ...] = (
    "The committee postponed its decision until the next quarterly meeting.",
    "My phone battery drains quickly when the screen brightness is high.",
    "Fresh bread smells wonderful early in the morning.",
    "Can you recommend a quiet hotel near the train station?",
    "The river flooded the lower fields after three days of heavy rain.",
    "He forgot his umbrella at the office again.",
    "Researchers published a new method for measuring air quality in cities.",
    "Please send the signed contract back by Friday afternoon.",
    "The children built a sandcastle that the tide washed away.",
    "Our team won the final match in the last minute of extra time.",
    "Which medicine should I take for a mild headache?",
    "The museum reopened its ancient history wing after renovation.",
    "Traffic was slow on the bridge because of an accident.",
    "She learned to play the violin when she was seven years old.",
    "The software update fixed the crash that happened on startup.",
    "Warm soup is perfect on a cold winter evening.",
)
#: Seed of the random inputs (images; ids without a tokenizer) INT8 is calibrated on; the
#: validation samples use 0 and the recorded reference batch 1.
CALIBRATION_SEED = 7
#: Token ids for text models without a tokenizer (an ``onnx`` source): any BERT-like vocabulary
#: has at least this many entries, so the ids are valid whatever the model.
_FALLBACK_VOCAB = 1000

_OUTPUT_NAMES: dict[str, tuple[str, ...]] = {
    "sentence-embedding": ("sentence_embedding",),
    "feature-extraction": ("last_hidden_state",),
    "text-classification": ("logits",),
    "image-classification": ("logits",),
}
#: A text graph's inputs in the order the wrapper modules take them.
TEXT_INPUT_NAMES = ("input_ids", "attention_mask", "token_type_ids")


def input_names(spec: ModelSpec, sample: Batch | None = None) -> tuple[str, ...]:
    """Graph input names in call order (the order the wrapper modules take them).

    Text graphs take ``input_ids`` and ``attention_mask``; a ``text-classification`` graph takes
    ``token_type_ids`` too when its samples carry them, that is when the source's tokenizer gives
    them (BERT-style, not RoBERTa-style), as ``CrossEncoder`` passes whatever the tokenizer gives.
    """
    if spec.task in TEXT_TASKS:
        takes_types = spec.task in PAIR_TASKS and sample is not None and "token_type_ids" in sample
        return TEXT_INPUT_NAMES if takes_types else TEXT_INPUT_NAMES[:2]
    return ("pixel_values",)


def output_names(spec: ModelSpec) -> tuple[str, ...]:
    """Graph output names in return order."""
    return _OUTPUT_NAMES[spec.task]


# --------------------------------------------------------------------------------------------
# load_module
# --------------------------------------------------------------------------------------------


class TokenFeatures(nn.Module):
    """The encoder's ``last_hidden_state`` ``[batch, sequence, hidden]`` (keyword calls: transformers 5
    no longer takes ``attention_mask`` positionally)."""

    def __init__(self, encoder: nn.Module) -> None:
        super().__init__()
        self.encoder = encoder

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state


class SequenceLogits(nn.Module):
    """A sequence-classification head's ``logits`` ``[batch, num_labels]`` (cross-encoders score a
    text or a pair; ``token_type_ids`` is passed only to a graph that takes it)."""

    def __init__(self, classifier: nn.Module) -> None:
        super().__init__()
        self.classifier = classifier

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        types = {} if token_type_ids is None else {"token_type_ids": token_type_ids}
        return self.classifier(input_ids=input_ids, attention_mask=attention_mask, **types).logits


class ImageLogits(nn.Module):
    """The classifier's ``logits`` as a plain tensor: exporters trace tensors, not ModelOutput."""

    def __init__(self, classifier: nn.Module) -> None:
        super().__init__()
        self.classifier = classifier

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self.classifier(pixel_values=pixel_values).logits


def load_module(spec: ModelSpec, source_dir: Path | None) -> nn.Module:
    """The eager module the export traces and validation compares against (eval, no grad)."""
    source = spec.source
    if isinstance(source, OnnxFileSource):
        raise SourceError("source: an onnx source has no PyTorch module; it is validated against "
                          "the source file itself", model=spec.name)
    if isinstance(source, SyntheticSource):
        inner = _synthetic(spec, source)
    else:
        if source_dir is None:
            raise SourceError("source: no folder was resolved for this source", model=spec.name)
        inner = _pretrained(spec, source_dir)
    _check_positions(spec, inner)
    module = _wrap(spec, inner, source_dir)
    module.eval()
    module.requires_grad_(False)
    return module


def _check_positions(spec: ModelSpec, inner: nn.Module) -> None:
    # A sequence longer than the position table fails deep inside the model (an index error at
    # validation, or worse, on the endpoint); the manifest field is what has to change.
    if spec.task not in TEXT_TASKS:
        return
    positions = getattr(getattr(inner, "config", None), "max_position_embeddings", None)
    if isinstance(positions, int) and spec.text_inputs.max_sequence_length > positions:
        raise SourceError(
            f"text.max_sequence_length: got {spec.text_inputs.max_sequence_length}; the model has "
            f"{positions} positions (max_position_embeddings), so at most {positions} is allowed",
            model=spec.name,
        )


def _wrap(spec: ModelSpec, inner: nn.Module, source_dir: Path | None) -> nn.Module:
    if spec.task == "sentence-embedding":
        from triton_mme_cdk.model_build.export.pooling import SentenceEmbedding, pooling_config

        return SentenceEmbedding(inner, pooling_config(source_dir, spec.name))
    if spec.task == "feature-extraction":
        return TokenFeatures(inner)
    if spec.task == "text-classification":
        return SequenceLogits(inner)
    return ImageLogits(inner)


def _config_class(architecture: str) -> Any:
    from transformers import BertConfig, ResNetConfig

    return ResNetConfig if architecture == "resnet" else BertConfig


def _synthetic(spec: ModelSpec, source: SyntheticSource) -> nn.Module:
    from transformers import BertForSequenceClassification, BertModel, ResNetForImageClassification

    config_class = _config_class(source.architecture)
    # transformers configs accept any keyword silently; a typo would give a different model.
    # num_labels is the one derived keyword (it sizes id2label) that is neither a parameter
    # nor a serialised key.
    known = (set(inspect.signature(config_class.__init__).parameters) | set(config_class().to_dict())
             | {"num_labels"}) - {"self", "kwargs"}
    unknown = sorted(set(source.config) - known)
    if unknown:
        raise SourceError(
            f"source.config: unknown key(s) {unknown} for {config_class.__name__}",
            model=spec.name,
        )
    try:
        config = config_class(**source.config)
    except (TypeError, ValueError) as error:
        raise SourceError(f"source.config: {error}", model=spec.name) from None
    model_class: Any = ResNetForImageClassification if source.architecture == "resnet" else (
        BertForSequenceClassification if spec.task == "text-classification" else BertModel)
    # Weights come from torch's global RNG: a forked, seeded RNG makes them a function of the
    # seed alone and leaves the caller's random state untouched.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(source.seed)
        return model_class(config)


def _pretrained(spec: ModelSpec, source_dir: Path) -> nn.Module:
    from transformers import AutoModel, AutoModelForImageClassification, AutoModelForSequenceClassification

    model_class: Any = {"image-classification": AutoModelForImageClassification,
                        "text-classification": AutoModelForSequenceClassification}.get(spec.task, AutoModel)
    try:
        # float32 explicitly: transformers 5 loads a checkpoint in its stored dtype by default,
        # and the FP16 conversion (when asked for) is done on the ONNX graph instead.
        model, loading = model_class.from_pretrained(
            str(source_dir), local_files_only=True, dtype=torch.float32, output_loading_info=True
        )
    except (OSError, ValueError, KeyError) as error:
        first = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise SourceError(
            f"source: cannot load a {spec.task} model from {str(source_dir)!r}: {first}",
            model=spec.name,
        ) from None
    missing = sorted(loading.get("missing_keys") or ())
    if spec.task == "text-classification" and missing:
        # transformers initialises a missing head at random (and only logs it): the scores would
        # mean nothing. An encoder-only checkpoint is a feature-extraction or embedding source.
        raise SourceError(
            f"source: {str(source_dir)!r} has no trained classification head for task text-classification "
            f"(weights {', '.join(missing[:4])} are missing from the checkpoint); use a sequence-classification "
            "checkpoint (a cross-encoder or reranker), or task sentence-embedding/feature-extraction",
            model=spec.name,
        )
    return model


# --------------------------------------------------------------------------------------------
# sample inputs
# --------------------------------------------------------------------------------------------

Batch = dict[str, np.ndarray]


def sample_inputs(spec: ModelSpec, source_dir: Path | None, *, seed: int = 0) -> list[Batch]:
    """Inputs of different batch sizes (and, for text, lengths) for tracing and validation.

    A graph traced on one shape can hard-code it; only inputs of other shapes reveal that. Text
    samples cover an unpadded single sentence, a padded batch of real sentences and a batch with
    one sequence at ``max_sequence_length``. With ``max_batch_size`` 0 the batch is fixed at 1.
    """
    sizes = _batch_sizes(spec)
    if spec.task not in TEXT_TASKS:
        rng = np.random.default_rng(seed)
        return [_image_batch(spec, size, rng) for size in sizes]
    encode = _text_encoder(spec, source_dir, seed)
    long_text = _long_text(spec, source_dir)
    texts = list(spec.text_inputs.sample_texts or DEFAULT_SENTENCES)
    short = [texts[0]]
    padded = [texts[(1 + i) % len(texts)] for i in range(sizes[1])]
    if len(padded) == 1:  # fixed batch: a second length instead of a padded batch
        padded = [texts[1 % len(texts)]]
    longest = [texts[(2 + i) % len(texts)] for i in range(sizes[2] - 1)] + [long_text]
    if spec.task in PAIR_TASKS:
        # A scorer takes a text or a pair: the single text alone, the other batches as pairs
        # (the second segment's token type ids, truncation of the longest member of a pair).
        return [encode(short), encode(padded, _partners(texts, padded)), encode(longest, _partners(texts, longest))]
    return [encode(short), encode(padded), encode(longest)]


def _partners(texts: Sequence[str], firsts: Sequence[str]) -> list[str]:
    """A second text for each of ``firsts`` (the next sample text), making pairs of two texts."""
    return [texts[(texts.index(text) + 1) % len(texts)] if text in texts else texts[0] for text in firsts]


def reference_inputs(spec: ModelSpec, source_dir: Path | None, *, seed: int = 1) -> Batch:
    """A small batch (2, or 1 without batching) recorded at build time for the ``verify`` step."""
    size = 1 if spec.max_batch_size == 0 else min(2, spec.max_batch_size)
    if spec.task not in TEXT_TASKS:
        return _image_batch(spec, size, np.random.default_rng(seed))
    encode = _text_encoder(spec, source_dir, seed)
    texts = list(spec.text_inputs.sample_texts or DEFAULT_SENTENCES)
    firsts = [texts[i % len(texts)] for i in range(size)]
    return encode(firsts, _partners(texts, firsts) if spec.task in PAIR_TASKS else None)


def reference_sentences(spec: ModelSpec) -> list[str]:
    """Real sentences for the sentence-transformers comparison."""
    return list(spec.text_inputs.sample_texts or DEFAULT_SENTENCES)


def calibration_inputs(spec: ModelSpec, source_dir: Path | None) -> list[Batch]:
    """Inputs the INT8 layer choice is made on, disjoint from the validation inputs.

    Text: :data:`CALIBRATION_SENTENCES` less any the manifest also validates on, in batches of
    up to 8; images (and ids without a tokenizer): seeded with :data:`CALIBRATION_SEED`.
    """
    sizes = _batch_sizes(spec)
    if spec.task not in TEXT_TASKS:
        rng = np.random.default_rng(CALIBRATION_SEED)
        return [_image_batch(spec, size, rng) for size in sizes]
    validated = set(reference_sentences(spec))
    texts = [text for text in CALIBRATION_SENTENCES if text not in validated]
    encode = _text_encoder(spec, source_dir, CALIBRATION_SEED)
    chunk = sizes[2]
    pairs = spec.task in PAIR_TASKS
    return [encode(part, _partners(texts, part) if pairs else None)
            for part in (texts[i:i + chunk] for i in range(0, len(texts), chunk))]


def _batch_sizes(spec: ModelSpec) -> tuple[int, int, int]:
    if spec.max_batch_size == 0:
        return (1, 1, 1)
    cap = min(8, spec.max_batch_size)
    return (1, min(3, cap), cap)


def _image_batch(spec: ModelSpec, size: int, rng: np.random.Generator) -> Batch:
    image = spec.image_inputs
    shape = (size, image.channels, image.image_size, image.image_size)
    return {"pixel_values": rng.standard_normal(shape, dtype=np.float32)}


def text_batch(spec: ModelSpec, source_dir: Path | None, texts: Sequence[str], *, seed: int = 0,
               pairs: Sequence[str] | None = None) -> Batch:
    """The graph's text inputs for ``texts`` (and ``pairs``), padded to the longest, as a client
    sends them."""
    return _text_encoder(spec, source_dir, seed)(texts, pairs)


class TextEncode(Protocol):
    """Texts (and, for pairs, the second texts) -> the graph's text inputs."""

    def __call__(self, texts: Sequence[str], pairs: Sequence[str] | None = None, /) -> Batch: ...


def _text_encoder(spec: ModelSpec, source_dir: Path | None, seed: int) -> TextEncode:
    """A function (texts, pairs or None) -> ``input_ids``/``attention_mask`` (int64, padded to the
    longest), and ``token_type_ids`` for a ``text-classification`` source whose tokenizer gives them."""
    max_len = spec.text_inputs.max_sequence_length
    tokenizer = _tokenizer(spec, source_dir)
    if tokenizer is None:
        return _random_ids_encoder(spec, source_dir, seed)
    names = TEXT_INPUT_NAMES if spec.task in PAIR_TASKS else TEXT_INPUT_NAMES[:2]

    def encode(texts: Sequence[str], pairs: Sequence[str] | None = None) -> Batch:
        encoded = tokenizer(list(texts), None if pairs is None else list(pairs), padding="longest",
                            truncation=True, max_length=max_len, return_tensors="np")
        return {name: np.ascontiguousarray(encoded[name], dtype=np.int64) for name in names if name in encoded}

    return encode


def _long_text(spec: ModelSpec, source_dir: Path | None) -> str:
    """A text of at least ``max_sequence_length`` tokens (truncated to it when encoded)."""
    max_len = spec.text_inputs.max_sequence_length
    tokenizer = _tokenizer(spec, source_dir)
    if tokenizer is None:
        # Without a tokenizer the word count sets the length: max_len words, max_len tokens.
        return " ".join(["word"] * max_len)
    base = " ".join(spec.text_inputs.sample_texts or DEFAULT_SENTENCES)
    text = base
    for _ in range(max_len):  # bounded: a tokenizer that drops the text must not hang the build
        if len(tokenizer(text)["input_ids"]) >= max_len:
            break
        text = f"{text} {base}"
    return text


def _tokenizer(spec: ModelSpec, source_dir: Path | None) -> Any:
    if source_dir is None or not source_dir.is_dir():
        return None
    names = TOKENIZER_FILES
    if not any((source_dir / name).is_file() for name in names):
        return None
    try:
        return _load_tokenizer(str(source_dir), threading.get_ident())
    except (OSError, ValueError) as error:
        raise SourceError(f"source: cannot load the tokenizer from {str(source_dir)!r}: {error}",
                          model=spec.name) from None


@functools.lru_cache(maxsize=8)
def _load_tokenizer(path: str, thread: int) -> Any:
    # Samples, the reference batch and the sentence-transformers check all tokenize; loading
    # once per folder keeps that cheap. One per thread too: a fast tokenizer changes its
    # truncation state on each call and refuses concurrent use ("Already borrowed"), and the
    # build may export models in parallel threads.
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path, local_files_only=True)


def _vocab_size(spec: ModelSpec, source_dir: Path | None) -> int:
    source = spec.source
    if isinstance(source, SyntheticSource):
        return int(_config_class(source.architecture)(**source.config).vocab_size)
    if source_dir is not None and (source_dir / "config.json").is_file():
        import json

        size = json.loads((source_dir / "config.json").read_text()).get("vocab_size")
        if isinstance(size, int) and size > 1:
            return size
    return _FALLBACK_VOCAB


def _random_ids_encoder(spec: ModelSpec, source_dir: Path | None, seed: int) -> TextEncode:
    """Seeded random ids for models without a tokenizer; a text's word count sets its length.

    Padding positions get id 0 and mask 0, as a tokenizer would give them. A synthetic (BERT)
    ``text-classification`` model also gets ``token_type_ids``: 1 over a pair's second text. An
    ``onnx`` source gets none: its graph, if it takes them, is fed zeros (one segment).
    """
    vocab = _vocab_size(spec, source_dir)
    max_len = spec.text_inputs.max_sequence_length
    rng = np.random.default_rng(seed)
    types = spec.task in PAIR_TASKS and isinstance(spec.source, SyntheticSource)

    def encode(texts: Sequence[str], pairs: Sequence[str] | None = None) -> Batch:
        firsts = [len(text.split()) + 2 for text in texts]
        seconds = [0] * len(texts) if pairs is None else [len(text.split()) + 1 for text in pairs]
        lengths = [min(max_len, a + b) for a, b in zip(firsts, seconds, strict=True)]
        width = max(lengths)
        ids = rng.integers(1, vocab, size=(len(texts), width), dtype=np.int64)
        positions = np.arange(width)[None, :]
        mask = (positions < np.array(lengths)[:, None]).astype(np.int64)
        batch = {"input_ids": ids * mask, "attention_mask": mask}
        if types:
            batch["token_type_ids"] = (positions >= np.array(firsts)[:, None]).astype(np.int64) * mask
        return batch

    return encode
