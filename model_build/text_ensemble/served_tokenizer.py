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

Checked before any export (each a :class:`~model_build.errors.PackageError` naming the file):
a tokenizer file exists; ``tokenizer.json`` parses; the tokenizer is a fast one; it has a pad
token (rows are padded to one width); its largest id fits the model's embedding table
(``vocab_size`` in ``config.json``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from model_build.errors import PackageError
from model_build.manifest import SLOW_TOKENIZER_FILES as SLOW_FILES
from model_build.manifest import ModelSpec
from model_build.text_ensemble.tokenizer_model import TOKENIZER_FILE

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


def _fail(spec: ModelSpec, message: str) -> PackageError:
    return PackageError(f"inputs: text: {message}", model=spec.name)


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


def encoder_for(served: ServedTokenizer, spec: ModelSpec, *, truncate: bool | None = None,
                padding: str | None = None) -> Any:
    """The served ``model.py``'s :class:`TextEncoder` for ``served``, in this process (for checks);
    ``truncate`` and ``padding`` default to the entry's ``text`` settings."""
    import tokenizers

    from model_build.text_ensemble.tokenizer_model import TextEncoder

    truncation = spec.text_inputs.truncation if truncate is None else ("truncate" if truncate else "refuse")
    parameters = {**served.parameters, "max_sequence_length": str(spec.text_inputs.max_sequence_length),
                  "truncation": truncation, "padding": padding or spec.text_padding}
    return TextEncoder.from_json(served.tokenizer_json, parameters, tokenizers)
