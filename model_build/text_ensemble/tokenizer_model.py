"""The tokenizer of a raw-text ensemble: a Triton python-backend ``model.py``, pure Python + numpy.

This file is copied unchanged into the tarball as ``tokenizer/1/model.py``. It runs inside the
SageMaker Triton image, whose Python has numpy and nothing else (no ``transformers``, no
``tokenizers``), and whose Python version differs between the image versions the stack accepts
(3.8 to 3.12): so it uses the standard library and numpy only, and Python 3.8 syntax only
(``from __future__ import annotations`` keeps the annotations unevaluated).

It reproduces the BERT WordPiece tokenizer of Hugging Face (``BertTokenizerFast``: the
``BertNormalizer``, ``BertPreTokenizer`` and ``WordPiece`` model of ``tokenizers``) from the
source's own ``vocab.txt`` and ``tokenizer_config.json``, which the build copies next to this file:

1. clean: drop NUL, U+FFFD and control characters (tab, newline and carriage return are
   whitespace), every whitespace character becomes a space;
2. put spaces around CJK ideographs (``tokenize_chinese_chars``), so each one is a word;
3. strip accents (NFD, drop combining marks) when ``strip_accents`` is true, or when it is unset
   and ``do_lower_case`` is true; lower-case when ``do_lower_case`` is true;
4. split on whitespace, and on every punctuation character (which becomes its own word);
5. greedy longest-match WordPiece per word (``##`` continuations); a word with no match, or
   longer than 100 characters, is ``[UNK]``;
6. ``[CLS] ... [SEP]``, padded with ``[PAD]`` to ``max_sequence_length``.

The output is always ``max_sequence_length`` wide: every request has the same shape, so the
dynamic batcher of the model behind the ensemble can put requests from different clients into one
batch (it only batches equal shapes). Masked positions do not change a mean-pooled embedding.

A text whose tokens do not fit is refused by default (parameter ``truncation: "refuse"``): the
issue asks for an error rather than an embedding of part of the text. With ``truncation:
"truncate"`` it is cut like the reference tokenizer (``truncation=True``) does.

Bad input is answered per request with an ``INVALID_ARG`` error naming the input (Triton's
SageMaker endpoint turns it into HTTP 400), and the model stays loaded for the next request.
"""

from __future__ import annotations

import json
import os
import unicodedata
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

try:  # only inside Triton; the tokenizer itself is importable (and tested) anywhere
    import triton_python_backend_utils as pb_utils
except ImportError:  # pragma: no cover - exercised on the real server
    pb_utils = None

#: The files the build copies next to this model.py (from the source's folder).
VOCAB_FILE = "vocab.txt"
CONFIG_FILE = "tokenizer_config.json"
#: The name of the ensemble's (and the tokenizer's) input tensor.
TEXT_INPUT = "TEXT"
#: Outputs this model can produce; its config names the ones the model behind it takes.
KNOWN_OUTPUTS = ("input_ids", "attention_mask", "token_type_ids")
TRUNCATION_MODES = ("refuse", "truncate")
#: Hugging Face's WordPiece limit: a longer word is one [UNK].
MAX_INPUT_CHARS_PER_WORD = 100
#: The tokenizer classes whose files this module reproduces.
WORDPIECE_CLASSES = ("BertTokenizer", "BertTokenizerFast", "DistilBertTokenizer", "DistilBertTokenizerFast")


class TokenizerError(ValueError):
    """A text this tokenizer cannot encode (the message names the input and what is allowed)."""


# --------------------------------------------------------------------------------------------
# Character classes (those of tokenizers' BertNormalizer / BertPreTokenizer)
# --------------------------------------------------------------------------------------------

_CJK_RANGES = (
    (0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F),
    (0x2B740, 0x2B81F), (0x2B920, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F),
)


def _is_control(char: str) -> bool:
    if char in "\t\n\r":
        return False
    return unicodedata.category(char).startswith("C")


def _is_whitespace(char: str) -> bool:
    return char in " \t\n\r" or char.isspace() or unicodedata.category(char) == "Zs"


def _is_punctuation(char: str) -> bool:
    code = ord(char)
    if 33 <= code <= 47 or 58 <= code <= 64 or 91 <= code <= 96 or 123 <= code <= 126:
        return True
    return unicodedata.category(char).startswith("P")


def _is_cjk(code: int) -> bool:
    return any(low <= code <= high for low, high in _CJK_RANGES)


class WordPieceTokenizer:
    """BERT's tokenizer from ``vocab.txt`` + ``tokenizer_config.json``; see the module docstring."""

    def __init__(self, vocab: dict[str, int], *, lowercase: bool = True, strip_accents: bool | None = None,
                 tokenize_chinese_chars: bool = True, unk_token: str = "[UNK]", cls_token: str = "[CLS]",
                 sep_token: str = "[SEP]", pad_token: str = "[PAD]") -> None:
        for role, token in (("unk_token", unk_token), ("cls_token", cls_token), ("sep_token", sep_token),
                            ("pad_token", pad_token)):
            if token not in vocab:
                raise TokenizerError(f"{CONFIG_FILE}: {role} {token!r} is not in {VOCAB_FILE}")
        self.vocab = vocab
        self.lowercase = lowercase
        # tokenizers: strip_accents unset follows lowercase.
        self.strip_accents = lowercase if strip_accents is None else strip_accents
        self.tokenize_chinese_chars = tokenize_chinese_chars
        self.unk_id = vocab[unk_token]
        self.cls_id = vocab[cls_token]
        self.sep_id = vocab[sep_token]
        self.pad_id = vocab[pad_token]
        self._word_cache: dict[str, tuple[int, ...]] = {}

    @classmethod
    def from_dir(cls, folder: str) -> WordPieceTokenizer:
        """Read the two files from ``folder`` (the model's version folder inside the tarball)."""
        config_path = os.path.join(folder, CONFIG_FILE)
        try:
            with open(config_path, encoding="utf-8") as handle:
                config = json.load(handle)
        except (OSError, ValueError) as error:
            raise TokenizerError(f"{config_path}: cannot read it as JSON ({error})") from None
        if not isinstance(config, dict):
            raise TokenizerError(f"{config_path}: expected a JSON object, got {type(config).__name__}")
        klass = config.get("tokenizer_class")
        if klass is not None and klass not in WORDPIECE_CLASSES:
            raise TokenizerError(f"{config_path}: tokenizer_class {klass!r} is not a WordPiece tokenizer; "
                                 f"supported: {', '.join(WORDPIECE_CLASSES)}")
        vocab = read_vocab(os.path.join(folder, VOCAB_FILE))
        strip = config.get("strip_accents")
        return cls(
            vocab,
            lowercase=bool(config.get("do_lower_case", True)),
            strip_accents=None if strip is None else bool(strip),
            tokenize_chinese_chars=bool(config.get("tokenize_chinese_chars", True)),
            unk_token=str(config.get("unk_token", "[UNK]")),
            cls_token=str(config.get("cls_token", "[CLS]")),
            sep_token=str(config.get("sep_token", "[SEP]")),
            pad_token=str(config.get("pad_token", "[PAD]")),
        )

    # ---- text -> words ---------------------------------------------------------------------

    def normalize(self, text: str) -> str:
        """Steps 1-3 of the module docstring, in tokenizers' order."""
        chars: list[str] = []
        for char in text:
            code = ord(char)
            if code == 0 or code == 0xFFFD or _is_control(char):
                continue
            if _is_whitespace(char):
                chars.append(" ")
            elif self.tokenize_chinese_chars and _is_cjk(code):
                chars.extend((" ", char, " "))
            else:
                chars.append(char)
        out = "".join(chars)
        if self.strip_accents:
            out = "".join(c for c in unicodedata.normalize("NFD", out) if unicodedata.category(c) != "Mn")
        if self.lowercase:
            out = out.lower()
        return out

    def words(self, text: str) -> list[str]:
        """Step 4: whitespace split, then every punctuation character on its own."""
        words: list[str] = []
        for chunk in self.normalize(text).split():
            start = 0
            for index, char in enumerate(chunk):
                if _is_punctuation(char):
                    if index > start:
                        words.append(chunk[start:index])
                    words.append(char)
                    start = index + 1
            if start < len(chunk):
                words.append(chunk[start:])
        return words

    # ---- words -> ids ----------------------------------------------------------------------

    def _word_ids(self, word: str) -> tuple[int, ...]:
        cached = self._word_cache.get(word)
        if cached is not None:
            return cached
        if len(word) > MAX_INPUT_CHARS_PER_WORD:
            ids: tuple[int, ...] = (self.unk_id,)
        else:
            pieces: list[int] = []
            start = 0
            while start < len(word):
                end = len(word)
                found = None
                while start < end:
                    piece = word[start:end] if start == 0 else "##" + word[start:end]
                    found = self.vocab.get(piece)
                    if found is not None:
                        break
                    end -= 1
                if found is None:
                    pieces = [self.unk_id]
                    break
                pieces.append(found)
                start = end
            ids = tuple(pieces)
        if len(self._word_cache) < 100_000:  # bounded: a hostile stream cannot grow it without end
            self._word_cache[word] = ids
        return ids

    def token_ids(self, text: str) -> list[int]:
        """The WordPiece ids of ``text`` without special tokens."""
        ids: list[int] = []
        for word in self.words(text):
            ids.extend(self._word_ids(word))
        return ids

    def encode_batch(self, texts: Sequence[str], max_length: int, *, truncate: bool = False,
                     input_name: str = TEXT_INPUT) -> tuple[np.ndarray, np.ndarray]:
        """``input_ids`` and ``attention_mask`` (int64, ``[len(texts), max_length]``).

        Raises :class:`TokenizerError` naming ``input_name`` and the index for a text that is empty
        (or only whitespace/control characters) or, unless ``truncate``, longer than ``max_length``
        tokens with ``[CLS]`` and ``[SEP]``.
        """
        if max_length < 2:
            raise TokenizerError(f"max_sequence_length: got {max_length}; it must be at least 2 ([CLS] and [SEP])")
        ids = np.full((len(texts), max_length), self.pad_id, dtype=np.int64)
        mask = np.zeros((len(texts), max_length), dtype=np.int64)
        room = max_length - 2
        for row, text in enumerate(texts):
            tokens = self.token_ids(text)
            if not tokens:
                raise TokenizerError(f"input {input_name!r}[{row}]: the text is empty (or only whitespace/control "
                                     "characters); send at least one word")
            if len(tokens) > room:
                if not truncate:
                    raise TokenizerError(
                        f"input {input_name!r}[{row}]: {len(tokens) + 2} tokens with [CLS]/[SEP], the model takes at "
                        f"most max_sequence_length={max_length}; shorten the text or split it")
                tokens = tokens[:room]
            length = len(tokens) + 2
            ids[row, 0] = self.cls_id
            ids[row, 1:length - 1] = tokens
            ids[row, length - 1] = self.sep_id
            mask[row, :length] = 1
        return ids, mask


def read_vocab(path: str) -> dict[str, int]:
    """``vocab.txt``: one token per line, its id the line number (as Hugging Face reads it)."""
    vocab: dict[str, int] = {}
    try:
        with open(path, encoding="utf-8") as handle:
            for index, line in enumerate(handle):
                token = line.rstrip("\n")
                if token and token not in vocab:
                    vocab[token] = index
    except (OSError, UnicodeDecodeError) as error:
        raise TokenizerError(f"{path}: cannot read the vocabulary ({error})") from None
    if not vocab:
        raise TokenizerError(f"{path}: the vocabulary is empty")
    return vocab


def decode_texts(values: Iterable[Any], input_name: str = TEXT_INPUT) -> list[str]:
    """UTF-8 bytes (a BYTES tensor's elements) -> str; invalid UTF-8 named with its index."""
    texts: list[str] = []
    for index, value in enumerate(values):
        if isinstance(value, str):
            texts.append(value)
            continue
        if not isinstance(value, (bytes, bytearray, np.bytes_)):
            raise TokenizerError(f"input {input_name!r}[{index}]: expected UTF-8 bytes, got {type(value).__name__}")
        try:
            texts.append(bytes(value).decode("utf-8"))
        except UnicodeDecodeError as error:
            raise TokenizerError(f"input {input_name!r}[{index}]: not valid UTF-8 (byte {error.start}: "
                                 f"{error.reason}); send UTF-8 text") from None
    return texts


# --------------------------------------------------------------------------------------------
# The Triton model
# --------------------------------------------------------------------------------------------

def _parameter(config: dict[str, Any], key: str, default: str) -> str:
    value = config.get("parameters", {}).get(key, {}).get("string_value")
    return default if value is None else str(value)


class TritonPythonModel:
    """Strings in (``TEXT``, BYTES ``[batch, 1]``), token ids out (INT64 ``[batch, max_len]``)."""

    def initialize(self, args: dict[str, str]) -> None:
        config = json.loads(args["model_config"])
        folder = os.path.join(args["model_repository"], args["model_version"])
        self.tokenizer = WordPieceTokenizer.from_dir(folder)
        self.max_length = int(_parameter(config, "max_sequence_length", "0"))
        truncation = _parameter(config, "truncation", "refuse")
        if truncation not in TRUNCATION_MODES:
            raise TokenizerError(f"config parameter truncation: got {truncation!r}; allowed: "
                                 + ", ".join(TRUNCATION_MODES))
        self.truncate = truncation == "truncate"
        self.outputs = [output["name"] for output in config["output"]]
        unknown = [name for name in self.outputs if name not in KNOWN_OUTPUTS]
        if unknown:
            raise TokenizerError(f"config outputs {unknown}: this tokenizer produces {', '.join(KNOWN_OUTPUTS)}")
        # Encoding a text cannot fail the next one: a word cache is the only state.
        self.tokenizer.encode_batch(["warm up"], self.max_length)

    def _error(self, message: str) -> Any:
        code = getattr(pb_utils.TritonError, "INVALID_ARG", None)
        error = pb_utils.TritonError(message) if code is None else pb_utils.TritonError(message, code)
        return pb_utils.InferenceResponse(output_tensors=[], error=error)

    def _answer(self, request: Any) -> Any:
        tensor = pb_utils.get_input_tensor_by_name(request, TEXT_INPUT)
        if tensor is None:
            return self._error(f"input {TEXT_INPUT!r} is missing; send a BYTES tensor of UTF-8 strings, shape [batch, 1]")
        values = tensor.as_numpy()
        if values.dtype != np.object_:
            return self._error(f"input {TEXT_INPUT!r}: datatype must be BYTES (UTF-8 strings), got {values.dtype}")
        if values.size == 0:
            return self._error(f"input {TEXT_INPUT!r}: the batch is empty (shape {list(values.shape)}); "
                               "send at least one string")
        try:
            texts = decode_texts(values.reshape(-1), TEXT_INPUT)
            ids, mask = self.tokenizer.encode_batch(texts, self.max_length, truncate=self.truncate)
        except TokenizerError as error:
            return self._error(str(error))
        arrays = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
        return pb_utils.InferenceResponse(
            output_tensors=[pb_utils.Tensor(name, arrays[name]) for name in self.outputs])

    def execute(self, requests: list[Any]) -> list[Any]:
        return [self._answer(request) for request in requests]
