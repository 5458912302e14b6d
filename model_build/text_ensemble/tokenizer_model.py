"""The tokenizer of a raw-text ensemble: a Triton python-backend ``model.py`` running ``tokenizers``.

This file is copied unchanged into the tarball as ``tokenizer/1/model.py``. Beside it the build
puts:

- ``tokenizer.json``: the tokenizer ``transformers.AutoTokenizer`` runs for the source, serialized
  by ``tokenizers`` (the library behind every Hugging Face fast tokenizer). WordPiece (BERT),
  byte-level BPE (RoBERTa, GPT-2) and Unigram/SentencePiece (XLM-R, T5, DeBERTa-v3) are all one
  format to it, so nothing here is specific to a tokenizer kind, and nothing is re-implemented:
  the ids come from the same Rust code the reference runs;
- ``site-packages/tokenizers/``: the manylinux wheel of ``tokenizers`` pinned in
  ``serving-wheels.txt``, unpacked. The SageMaker Triton image's Python has numpy but no
  ``tokenizers``; the tarball brings its own, so a stock image loads it offline. It goes first
  on ``sys.path`` so the tarball's copy is the one imported, on the endpoint and locally.

Settings come from the config's ``parameters`` (written by ``model_build.text_ensemble.ensemble``
from the reference tokenizer): ``max_sequence_length``, ``truncation`` (``refuse`` or
``truncate``), ``truncation_side``, ``padding_side``, ``pad_token``/``pad_id``/``pad_type_id`` and
``lowercase`` (sentence-transformers' ``do_lower_case``: the text is lower-cased before it is
tokenized, as ``SentenceTransformer.encode`` does).

Padding (``padding``): ``bucket`` (the default) pads a request's rows to its longest row, rounded
up to a multiple of 8 (at most ``max_sequence_length``): a 12-token sentence costs the model 16
positions, not 128, and requests of similar length still share a shape, which is what the dynamic
batcher of the model behind the ensemble needs to join them (it only batches equal shapes).
``longest`` pads to the longest row alone (``padding=True`` of a Hugging Face tokenizer): the fewest
positions, for CPU instances, where no matrix-shape alignment pays and the model's batcher
matters less. ``max_length`` pads every row to ``max_sequence_length``: one shape for every
request, at the cost of computing every position. Masked positions change no pooled embedding.

A text whose tokens do not fit is refused by default (``truncation: "refuse"``): an embedding of
part of a text is an error a client does not see. With ``"truncate"`` it is cut as the reference
tokenizer does with ``truncation=True``. An empty or whitespace-only text, or one the normalizer
reduces to nothing (control characters), is refused for every tokenizer kind: its embedding would
be that of the special tokens (or of spaces) alone.

Pairs (cross-encoders): when the config declares the optional input ``TEXT_PAIR``, a request may
send it with one string per ``TEXT`` row; its rows are encoded as pairs, with the token type ids of
the second segment, exactly as ``tokenizer(texts, pairs)`` does. A request whose ``TEXT_PAIR`` row
count differs from ``TEXT``'s is refused (a batch cannot mix pairs and single texts).

Bad input is answered per request with an ``INVALID_ARG`` error naming the input and the row
(Triton's SageMaker endpoint turns it into HTTP 400), and the model stays loaded for the next one.
Python 3.8 syntax and the standard library + numpy only, besides the vendored ``tokenizers``.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

try:  # only inside Triton; the encoder itself is importable (and tested) anywhere
    import triton_python_backend_utils as pb_utils
except ImportError:  # pragma: no cover - exercised on the real server
    pb_utils = None

#: The serialized tokenizer the build writes next to this model.py.
TOKENIZER_FILE = "tokenizer.json"
#: The folder (next to this model.py) holding the unpacked ``tokenizers`` wheel.
VENDOR_DIR = "site-packages"
#: The names of the ensemble's (and the tokenizer's) input tensors.
TEXT_INPUT = "TEXT"
PAIR_INPUT = "TEXT_PAIR"
#: Outputs this model can produce; its config names the ones the model behind it takes.
KNOWN_OUTPUTS = ("input_ids", "attention_mask", "token_type_ids")
TRUNCATION_MODES = ("refuse", "truncate")
PADDING_MODES = ("bucket", "longest", "max_length")
#: ``bucket`` padding rounds a request's longest row up to a multiple of this.
#: 8: the alignment of FP16 tensor-core matrix shapes (Hugging Face's collators use it for the same
#: reason); 16 was measured too, and padded 28% more positions than 8 on the benchmark's sentences.
PAD_MULTIPLE = 8
SIDES = ("right", "left")
#: The most UTF-8 bytes one string may have, checked before it is decoded or tokenized (the
#: config's ``max_text_bytes``; this default where a config predates it). Tokenizing costs time in
#: the length of the text, whatever ``truncation`` then keeps: without a cap one request of
#: SageMaker's 6 MB payload is one string the CPU tokenizes before the first check.
DEFAULT_MAX_TEXT_BYTES = 65536


class TokenizerError(ValueError):
    """A text this tokenizer cannot encode (the message names the input and what is allowed)."""


def import_tokenizers(folder: str) -> Any:
    """``tokenizers``, from ``folder/site-packages`` when the tarball carries it.

    The vendored copy goes first on ``sys.path``: a ``tokenizers`` the image happens to have is
    not the version the build verified the ids with.
    """
    vendor = os.path.join(folder, VENDOR_DIR)
    if os.path.isdir(vendor) and vendor not in sys.path:
        sys.path.insert(0, vendor)
    try:
        import tokenizers
    except ImportError as error:
        raise TokenizerError(
            f"cannot import tokenizers from {vendor} on Python {sys.version_info.major}.{sys.version_info.minor} "
            f"({error}); the tarball carries the wheel for the Python of the configured Triton image "
            "(mme:triton_image_version): rebuild the model for this image") from None
    return tokenizers


class TextEncoder:
    """Texts (or pairs) -> fixed-width ``input_ids``/``attention_mask``/``token_type_ids``."""

    def __init__(self, tokenizer: Any, *, max_length: int, pad_id: int, pad_token: str, pad_type_id: int = 0,
                 padding_side: str = "right", truncation_side: str = "right", truncate: bool = False,
                 lowercase: bool = False, padding: str = "bucket",
                 max_text_bytes: int = DEFAULT_MAX_TEXT_BYTES) -> None:
        if max_length < 2:
            raise TokenizerError(f"max_sequence_length: got {max_length}; it must be at least 2")
        for name, side in (("padding_side", padding_side), ("truncation_side", truncation_side)):
            if side not in SIDES:
                raise TokenizerError(f"{name}: got {side!r}; allowed: {', '.join(SIDES)}")
        if padding not in PADDING_MODES:
            raise TokenizerError(f"padding: got {padding!r}; allowed: {', '.join(PADDING_MODES)}")
        if max_text_bytes < 1:
            raise TokenizerError(f"max_text_bytes: got {max_text_bytes}; it must be at least 1")
        self.tokenizer = tokenizer
        self.max_length = max_length
        self.max_text_bytes = max_text_bytes
        self.truncate = truncate
        self.lowercase = lowercase
        self.padding = padding
        # The reference's truncation (PreTrainedTokenizerFast with truncation=True); padding is done
        # per request (:meth:`width`), with the reference's pad token and side.
        tokenizer.enable_truncation(max_length, strategy="longest_first", direction=truncation_side)
        tokenizer.no_padding()
        self.pad = {"direction": padding_side, "pad_id": pad_id, "pad_type_id": pad_type_id, "pad_token": pad_token}

    @classmethod
    def from_json(cls, tokenizer_json: str, parameters: dict[str, str], tokenizers: Any) -> TextEncoder:
        """The encoder of a served ``tokenizer.json`` with the config's string ``parameters``."""
        truncation = parameters.get("truncation", "refuse")
        if truncation not in TRUNCATION_MODES:
            raise TokenizerError(f"config parameter truncation: got {truncation!r}; allowed: "
                                 + ", ".join(TRUNCATION_MODES))
        try:
            tokenizer = tokenizers.Tokenizer.from_str(tokenizer_json)
        except Exception as error:  # the Rust side raises plain Exception
            raise TokenizerError(f"{TOKENIZER_FILE}: cannot load it with tokenizers ({error})") from None
        try:
            return cls(
                tokenizer,
                max_length=int(parameters.get("max_sequence_length", "0")),
                pad_id=int(parameters.get("pad_id", "0")),
                pad_token=parameters.get("pad_token", "[PAD]"),
                pad_type_id=int(parameters.get("pad_type_id", "0")),
                padding_side=parameters.get("padding_side", "right"),
                truncation_side=parameters.get("truncation_side", "right"),
                truncate=truncation == "truncate",
                lowercase=parameters.get("lowercase", "false") == "true",
                padding=parameters.get("padding", "bucket"),
                max_text_bytes=int(parameters.get("max_text_bytes", str(DEFAULT_MAX_TEXT_BYTES))),
            )
        except ValueError as error:
            raise TokenizerError(f"config parameters: {error}") from None

    def width(self, longest: int) -> int:
        """The padded width of a request whose longest row has ``longest`` tokens."""
        if self.padding == "max_length":
            return self.max_length
        if self.padding == "longest":
            return min(self.max_length, longest)
        return min(self.max_length, -(-longest // PAD_MULTIPLE) * PAD_MULTIPLE)

    def encode_batch(self, texts: Sequence[str], pairs: Sequence[str] | None = None, *,
                     input_name: str = TEXT_INPUT) -> dict[str, np.ndarray]:
        """``input_ids``, ``attention_mask``, ``token_type_ids`` (int64 ``[len(texts), width]``).

        Raises :class:`TokenizerError` naming the input and row for a text with no token but the
        special ones, or (unless ``truncate``) one longer than ``max_length`` with them.
        """
        if pairs is not None and len(pairs) != len(texts):
            raise TokenizerError(f"input {PAIR_INPUT!r}: {len(pairs)} rows for {len(texts)} rows of {input_name!r}; "
                                 "send one second text per text (a batch cannot mix pairs and single texts)")
        for name, values in ((input_name, texts), (PAIR_INPUT, pairs or ())):
            for row, text in enumerate(values):
                if not text.strip():  # a byte-level BPE would encode the spaces: refused alike for every kind
                    raise TokenizerError(f"input {name!r}[{row}]: the text is empty (or only whitespace); "
                                         "send at least one word")
        if self.lowercase:
            texts = [text.lower() for text in texts]
            pairs = None if pairs is None else [text.lower() for text in pairs]
        batch: list[Any] = list(texts) if pairs is None else list(zip(texts, pairs))  # noqa: B905 - lengths checked above; strict= is 3.10+
        encodings = self.tokenizer.encode_batch(batch)
        segments = ((0, input_name),) if pairs is None else ((0, input_name), (1, PAIR_INPUT))
        for row, encoding in enumerate(encodings):
            present = set(encoding.sequence_ids)
            for segment, name in segments:
                if segment not in present:
                    raise TokenizerError(f"input {name!r}[{row}]: the text is empty (or only whitespace/control "
                                         "characters); send at least one word")
            if encoding.overflowing and not self.truncate:
                raise TokenizerError(
                    f"input {input_name!r}[{row}]: more than max_sequence_length={self.max_length} tokens with the "
                    "special tokens; shorten the text or split it (or build the model with text.truncation: truncate)")
        width = self.width(max(len(encoding.ids) for encoding in encodings))
        for encoding in encodings:
            encoding.pad(width, **self.pad)
        shape = (len(batch), width)
        return {
            "input_ids": np.array([e.ids for e in encodings], dtype=np.int64).reshape(shape),
            "attention_mask": np.array([e.attention_mask for e in encodings], dtype=np.int64).reshape(shape),
            "token_type_ids": np.array([e.type_ids for e in encodings], dtype=np.int64).reshape(shape),
        }


def decode_texts(values: Iterable[Any], input_name: str = TEXT_INPUT,
                 max_bytes: int = DEFAULT_MAX_TEXT_BYTES) -> list[str]:
    """UTF-8 bytes (a BYTES tensor's elements) -> str; invalid UTF-8, or a string of more than
    ``max_bytes`` bytes, named with its index (the size is checked before anything is decoded)."""
    texts: list[str] = []
    for index, value in enumerate(values):
        if isinstance(value, str):
            size = len(value.encode("utf-8", "surrogatepass"))
        elif isinstance(value, (bytes, bytearray, np.bytes_)):
            size = len(value)
        else:
            raise TokenizerError(f"input {input_name!r}[{index}]: expected UTF-8 bytes, got {type(value).__name__}")
        if size > max_bytes:
            raise TokenizerError(f"input {input_name!r}[{index}]: {size} bytes; at most {max_bytes} per string "
                                 "(the model's text.max_text_bytes): shorten the text or split it")
        if isinstance(value, str):
            texts.append(value)
            continue
        try:
            texts.append(bytes(value).decode("utf-8"))
        except UnicodeDecodeError as error:
            raise TokenizerError(f"input {input_name!r}[{index}]: not valid UTF-8 (byte {error.start}: "
                                 f"{error.reason}); send UTF-8 text") from None
    return texts


# --------------------------------------------------------------------------------------------
# The Triton model
# --------------------------------------------------------------------------------------------

def config_parameters(config: dict[str, Any]) -> dict[str, str]:
    """The config's ``parameters`` as plain strings."""
    return {key: str(value.get("string_value", "")) for key, value in config.get("parameters", {}).items()}


class TritonPythonModel:
    """Strings in (``TEXT``, BYTES ``[batch, 1]``), token ids out (INT64 ``[batch, width]``)."""

    def initialize(self, args: dict[str, str]) -> None:
        config = json.loads(args["model_config"])
        folder = os.path.join(args["model_repository"], args["model_version"])
        tokenizers = import_tokenizers(folder)
        path = os.path.join(folder, TOKENIZER_FILE)
        try:
            with open(path, encoding="utf-8") as handle:
                text = handle.read()
        except (OSError, UnicodeDecodeError) as error:
            raise TokenizerError(f"{path}: cannot read it ({error})") from None
        self.encoder = TextEncoder.from_json(text, config_parameters(config), tokenizers)
        self.outputs = [output["name"] for output in config["output"]]
        unknown = [name for name in self.outputs if name not in KNOWN_OUTPUTS]
        if unknown:
            raise TokenizerError(f"config outputs {unknown}: this tokenizer produces {', '.join(KNOWN_OUTPUTS)}")
        self.takes_pairs = any(item["name"] == PAIR_INPUT for item in config["input"])
        self.encoder.encode_batch(["warm up"])

    def _error(self, message: str) -> Any:
        code = getattr(pb_utils.TritonError, "INVALID_ARG", None)
        error = pb_utils.TritonError(message) if code is None else pb_utils.TritonError(message, code)
        return pb_utils.InferenceResponse(output_tensors=[], error=error)

    def _strings(self, request: Any, name: str) -> list[str] | None:
        tensor = pb_utils.get_input_tensor_by_name(request, name)
        if tensor is None:
            return None
        values = tensor.as_numpy()
        if values.dtype != np.object_:
            raise TokenizerError(f"input {name!r}: datatype must be BYTES (UTF-8 strings), got {values.dtype}")
        if values.size == 0:
            raise TokenizerError(f"input {name!r}: the batch is empty (shape {list(values.shape)}); "
                                 "send at least one string")
        return decode_texts(values.reshape(-1), name, self.encoder.max_text_bytes)

    def _answer(self, request: Any) -> Any:
        try:
            texts = self._strings(request, TEXT_INPUT)
            if texts is None:
                return self._error(f"input {TEXT_INPUT!r} is missing; send a BYTES tensor of UTF-8 strings, "
                                   "shape [batch, 1]")
            pairs = self._strings(request, PAIR_INPUT) if self.takes_pairs else None
            arrays = self.encoder.encode_batch(texts, pairs)
        except TokenizerError as error:
            return self._error(str(error))
        return pb_utils.InferenceResponse(
            output_tensors=[pb_utils.Tensor(name, arrays[name]) for name in self.outputs])

    def execute(self, requests: list[Any]) -> list[Any]:
        return [self._answer(request) for request in requests]
