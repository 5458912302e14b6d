"""The tokenizer a raw-text target serves: the source's, as ``transformers.AutoTokenizer`` runs it.

Clients of an embedding model were evaluated with ``AutoTokenizer`` (sentence-transformers uses it
too), so that is the reference the served ids must equal. The build loads the source with it and
serializes the ``tokenizers`` pipeline it holds (``backend_tokenizer``), with truncation and
padding cleared: the served ``model.py`` sets them per request from the config. That is the
source's own ``tokenizer.json`` where transformers takes the file as it is (BERT, RoBERTa); where
transformers 5 rebuilds part of the pipeline from the tokenizer class (found: ``XLMRobertaTokenizer``
drops the file's normalizer and adds a whitespace split), the served file follows transformers,
because that is what the model's users get. A source with no ``tokenizer.json`` (a BERT
``vocab.txt``, a SentencePiece ``.model``) is converted by transformers at build time, the way
``AutoTokenizer`` converts it for every user; a source it cannot convert is refused naming the file.

Checked before any export (each a :class:`~model_build.errors.TokenizerCheckError` naming the
file): a tokenizer file exists; ``tokenizer.json`` parses; the tokenizer is a fast one; it has a pad
token (rows are padded to one width) inside its vocabulary; its largest id fits the model's
embedding table (``vocab_size`` in ``config.json``); and, as it will be served, it encodes each of
the entry's sample texts to tokens of their own, not all of them unknown (:func:`refuse_tokenless_texts`).
A tokenizer saved without its vocabulary fails that last check: transformers 5 ignores the
``vocab_file``/``merges_file`` given to a fast tokenizer class (``RobertaTokenizerFast(vocab_file=...,
merges_file=...)``) and saves a ``tokenizer.json`` of the special tokens alone, which encodes every
text to nothing.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from triton_mme_cdk.model_build.errors import TokenizerCheckError
from triton_mme_cdk.model_build.manifest import SLOW_TOKENIZER_FILES as SLOW_FILES
from triton_mme_cdk.model_build.manifest import ModelSpec
from triton_mme_cdk.model_build.text_ensemble.tokenizer_model import TOKENIZER_FILE

#: sentence-transformers' settings of its Transformer module (``do_lower_case``).
SENTENCE_BERT_CONFIG = "sentence_bert_config.json"


@dataclass(frozen=True)
class ServedTokenizer:
    """What the tarball's tokenizer step gets: ``tokenizer.json`` and the config's parameters."""

    tokenizer_json: str
    #: ``pad_token``, ``pad_id``, ``pad_type_id``, ``padding_side``, ``truncation_side``, ``lowercase``.
    parameters: dict[str, str]
    #: The tokenizer's class as transformers named it, and its model kind (WordPiece, BPE, Unigram).
    tokenizer_class: str
    kind: str
    #: The folder the tokenizer was read from (the reference of the ids check).
    source_dir: Path


def _fail(spec: ModelSpec, message: str) -> TokenizerCheckError:
    return TokenizerCheckError(f"inputs: text: {message}", model=spec.name)


def _source(spec: ModelSpec) -> str:
    """``source local 'models/x'``: the entry's source as the manifest names it."""
    source = spec.source
    named = getattr(source, "model_id", None) or getattr(source, "uri", None) or "/".join(
        part for part in (getattr(source, "package", ""), getattr(source, "path", "")) if part)
    return f"source {source.kind} {named!r}"


def _file(folder: Path) -> Path:
    """The file the tokenizer was read from: ``tokenizer.json``, or the folder it was converted from."""
    return folder / TOKENIZER_FILE if (folder / TOKENIZER_FILE).is_file() else folder


def _read_json(spec: ModelSpec, path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as error:
        raise _fail(spec, f"{path}: cannot read it as JSON ({error})") from None


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def prepare_tokenizer(spec: ModelSpec, source_dir: Path | None) -> ServedTokenizer:
    """Load, check and serialize the source's tokenizer (see the module docstring)."""
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    if source_dir is None or not Path(source_dir).is_dir():
        raise _fail(spec, f"the source {spec.source.kind!r} has no folder of tokenizer files; use a source folder "
                    f"with {TOKENIZER_FILE} (or {', '.join(SLOW_FILES)})")
    folder = Path(source_dir)
    own = folder / TOKENIZER_FILE
    if not own.is_file() and not any((folder / name).is_file() for name in SLOW_FILES):
        raise _fail(spec, f"{str(folder)!r} has no {TOKENIZER_FILE}, nor a file to convert one from "
                    f"({', '.join(SLOW_FILES)}); save the tokenizer beside the model (tokenizer.save_pretrained)")
    if own.is_file():
        try:
            Tokenizer.from_file(str(own))
        except Exception as error:  # the Rust side raises plain Exception
            raise _fail(spec, f"{own}: does not parse as a tokenizers file ({_first_line(error)})") from None
    try:
        reference = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    except Exception as error:  # transformers raises many types here (ValueError, OSError, ImportError...)
        slow = [name for name in SLOW_FILES if (folder / name).is_file()]
        converted = "" if own.is_file() else (f" (it has no {TOKENIZER_FILE}; converting {', '.join(slow)} to one "
                                              "failed: save the fast tokenizer with it, tokenizer.save_pretrained)")
        raise _fail(spec, f"transformers cannot load the tokenizer of {str(folder)!r}{converted}: "
                    f"{_first_line(error)}") from None
    if not getattr(reference, "is_fast", False):
        raise _fail(spec, f"{str(folder)!r} holds a slow-only tokenizer ({type(reference).__name__}) that "
                    f"transformers does not convert to {TOKENIZER_FILE}; save a fast tokenizer with it")
    if reference.pad_token is None or reference.pad_token_id is None:
        raise _fail(spec, f"the tokenizer of {str(folder)!r} ({type(reference).__name__}) has no pad token; every row "
                    "is padded to text.max_sequence_length: set tokenizer.pad_token and save it again")
    _check_vocabulary(spec, folder, len(reference))
    backend = Tokenizer.from_str(reference.backend_tokenizer.to_str())
    backend.no_truncation()
    backend.no_padding()
    sentence_config = folder / SENTENCE_BERT_CONFIG
    lowercase = bool(_read_json(spec, sentence_config).get("do_lower_case", False)) if sentence_config.is_file() \
        else False
    size = backend.get_vocab_size(with_added_tokens=True)
    if not 0 <= int(reference.pad_token_id) < size:
        raise _fail(spec, f"{_source(spec)}: {_file(folder)}: the pad token {reference.pad_token!r} has id "
                    f"{reference.pad_token_id}, outside the tokenizer's vocabulary of {size} tokens (ids 0 to "
                    f"{size - 1}): padded rows would look up an id the model has no embedding for; save the "
                    "tokenizer again with its pad token in the vocabulary")
    from triton_mme_cdk.model_build.export.eager import reference_sentences

    samples = reference_sentences(spec)
    refuse_tokenless_texts(spec, backend, [text.lower() for text in samples] if lowercase else samples,
                           folder=folder, tokenizer_class=type(reference).__name__,
                           unknown=reference.unk_token_id)
    _check_special_tokens(spec, folder, reference, backend, samples[0])
    tokenizer_json = backend.to_str()
    return ServedTokenizer(
        tokenizer_json=tokenizer_json,
        parameters={
            "pad_token": str(reference.pad_token),
            "pad_id": str(int(reference.pad_token_id)),
            "pad_type_id": str(int(getattr(reference, "pad_token_type_id", 0) or 0)),
            "padding_side": str(reference.padding_side),
            "truncation_side": str(reference.truncation_side),
            "lowercase": "true" if lowercase else "false",
        },
        tokenizer_class=type(reference).__name__,
        kind=str(json.loads(tokenizer_json)["model"]["type"]),
        source_dir=folder,
    )


def _check_vocabulary(spec: ModelSpec, folder: Path, size: int) -> None:
    """Ids at or past the model's ``vocab_size`` would index past its embedding table."""
    config = folder / "config.json"
    if not config.is_file():
        return
    data = _read_json(spec, config)
    vocab_size = data.get("vocab_size") if isinstance(data, dict) else None
    if isinstance(vocab_size, int) and size > vocab_size:
        raise _fail(spec, f"the tokenizer of {str(folder)!r} has {size} tokens but the model's embedding table has "
                    f"vocab_size {vocab_size} (config.json); ids from {vocab_size} on have no embedding: this "
                    "tokenizer is not the model's")


def refuse_tokenless_texts(spec: ModelSpec, backend: Any, texts: Sequence[str], *, folder: Path,
                           tokenizer_class: str, unknown: int | None) -> None:
    """Each text must encode (with ``backend``, the served pipeline) to at least one token of its
    own, besides the special ones; and not every such token of every text may be ``unknown`` (a
    WordPiece or Unigram vocabulary without the text's words). Otherwise one
    :class:`TokenizerCheckError` naming the source, the file, the tokenizer's kind and vocabulary
    size and the text, and what to do."""
    kind = type(backend.model).__name__
    described = (f"{_source(spec)}: {_file(folder)}: the tokenizer ({tokenizer_class}, {kind}, "
                 f"{backend.get_vocab_size(with_added_tokens=True)} tokens in its vocabulary)")
    remedy = ("its vocabulary is missing or its normalizer removes the text: load the tokenizer from its own "
              "files (AutoTokenizer.from_pretrained) and save it again with save_pretrained (transformers 5 "
              "ignores vocab_file/merges_file given to a fast tokenizer class and saves the special tokens alone)")
    known = False
    for text in texts:
        try:
            encoding = backend.encode(text)
        except Exception as error:  # the Rust side raises plain Exception (a WordPiece without its [UNK]...)
            raise _fail(spec, f"{described} cannot encode {text!r} ({_first_line(error)}); {remedy}") from None
        own = [token for token, sequence in zip(encoding.ids, encoding.sequence_ids, strict=True)
               if sequence is not None]
        if not own:
            special = ", ".join(encoding.tokens) or "none"
            raise _fail(spec, f"{described} encodes {text!r} to no token but its special ones ({special}); "
                        f"{remedy}")
        known = known or any(token != unknown for token in own)
    if texts and not known:
        raise _fail(spec, f"{described} encodes every sample text to its unknown token only (e.g. {texts[0]!r}); "
                    f"{remedy}")


def _check_special_tokens(spec: ModelSpec, folder: Path, reference: Any, backend: Any, sample: str) -> None:
    """A tokenizer that names a ``cls_token`` and a ``sep_token`` (BERT, RoBERTa, XLM-R...) adds at
    least one of them to a text: its ``post_processor`` does. One without (deleted, or a
    ``tokenizer.json`` saved without it and loaded as the file says) gives the model text without
    the tokens it was trained with, and ``AutoTokenizer`` agrees, so no later check would see it."""
    cls, sep = reference.cls_token_id, reference.sep_token_id
    if cls is None or sep is None:  # GPT-2 style byte-level BPE, T5: no such tokens to expect
        return
    encoding = backend.encode(sample)
    if cls not in encoding.ids and sep not in encoding.ids:
        raise _fail(spec, f"{_source(spec)}: {_file(folder)}: the tokenizer ({type(reference).__name__}, "
                    f"{type(backend.model).__name__}) names cls_token {reference.cls_token!r} and sep_token "
                    f"{reference.sep_token!r} but adds neither to {sample!r} (tokens: {' '.join(encoding.tokens)}): "
                    "its post_processor is missing; save the tokenizer again from its own files "
                    "(AutoTokenizer.from_pretrained, save_pretrained)")


@contextmanager
def tokenizer_errors(spec: ModelSpec, served: ServedTokenizer) -> Iterator[None]:
    """The served tokenizer step's own errors (a :class:`~model_build.text_ensemble.tokenizer_model.
    TokenizerError`, written for a client's request) raised by a build check, as one
    :class:`TokenizerCheckError` naming the source and the file."""
    from triton_mme_cdk.model_build.text_ensemble.tokenizer_model import TokenizerError

    try:
        yield
    except TokenizerError as error:
        raise _fail(spec, f"{_source(spec)}: {_file(served.source_dir)}: the tokenizer ({served.tokenizer_class}, "
                    f"{served.kind}) fails on the build's check texts: {error}") from None


def encoder_for(served: ServedTokenizer, spec: ModelSpec, *, truncate: bool | None = None,
                padding: str | None = None) -> Any:
    """The served ``model.py``'s :class:`TextEncoder` for ``served``, in this process (for checks);
    ``truncate`` and ``padding`` default to the entry's ``text`` settings."""
    import tokenizers

    from triton_mme_cdk.model_build.text_ensemble.tokenizer_model import TextEncoder

    truncation = spec.text_inputs.truncation if truncate is None else ("truncate" if truncate else "refuse")
    parameters = {**served.parameters, "max_sequence_length": str(spec.text_inputs.max_sequence_length),
                  "truncation": truncation, "padding": padding or spec.text_padding}
    return TextEncoder.from_json(served.tokenizer_json, parameters, tokenizers)
