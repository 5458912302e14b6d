"""Turn a manifest source into files on disk, an eager PyTorch module and sample inputs.

Everything the export and validation steps need from a source goes through here, so that those
steps never care where a model came from. Loading never reaches a model hub: local folders are
opened with ``local_files_only=True``, and the only step that may use the network
(``huggingface`` sources) fails fast with a :class:`SourceError` where the hub is unreachable.

This module imports torch (the CLI imports it lazily); transformers is imported where it is used.
"""

from __future__ import annotations

import functools
import importlib.resources
import importlib.util
import inspect
import json
import os
import socket
import threading
from collections.abc import Callable, Sequence
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlparse

import numpy as np
import torch
from torch import nn

from model_build.errors import SourceError
from model_build.manifest import (
    TEXT_TASKS,
    HuggingFaceSource,
    LocalSource,
    ModelSpec,
    OnnxFileSource,
    PackageSource,
    S3Source,
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

#: Seconds to wait for a TCP connection to the hub before calling it unreachable. huggingface_hub
#: itself retries a failed lookup five times with back-off (about 25 s) before giving up.
HUB_PROBE_TIMEOUT_S = 5.0
#: Token ids for text models without a tokenizer (an ``onnx`` source): any BERT-like vocabulary
#: has at least this many entries, so the ids are valid whatever the model.
_FALLBACK_VOCAB = 1000

_OUTPUT_NAMES: dict[str, tuple[str, ...]] = {
    "sentence-embedding": ("sentence_embedding",),
    "feature-extraction": ("last_hidden_state",),
    "image-classification": ("logits",),
}


def input_names(spec: ModelSpec) -> tuple[str, ...]:
    """Graph input names in call order (the order the wrapper modules take them)."""
    if spec.task in TEXT_TASKS:
        return ("input_ids", "attention_mask")
    return ("pixel_values",)


def output_names(spec: ModelSpec) -> tuple[str, ...]:
    """Graph output names in return order."""
    return _OUTPUT_NAMES[spec.task]


# --------------------------------------------------------------------------------------------
# resolve_source
# --------------------------------------------------------------------------------------------


def resolve_source(
    spec: ModelSpec, *, base_dir: Path, work_dir: Path, s3_client: Any = None
) -> Path | None:
    """Make the source loadable from disk: a ``save_pretrained`` folder, a ``.onnx`` file or None.

    ``work_dir`` is a folder this source may fill (downloads land there); ``base_dir`` is the
    manifest's folder, against which relative paths are resolved. Synthetic sources have no files.
    """
    source = spec.source
    if isinstance(source, SyntheticSource):
        return None
    if isinstance(source, LocalSource):
        return _pretrained_dir(base_dir / source.path, spec, f"source.path {source.path!r}")
    if isinstance(source, PackageSource):
        return _package_dir(source, spec)
    if isinstance(source, HuggingFaceSource):
        return _huggingface(source, spec, work_dir)
    if isinstance(source, S3Source):
        bucket, prefix = _split_s3(source.uri)
        _download_prefix(_s3(s3_client), bucket, prefix, work_dir, spec)
        return _pretrained_dir(work_dir, spec, f"source.uri {source.uri!r}")
    if isinstance(source, OnnxFileSource):
        return _onnx_file(source, spec, base_dir=base_dir, work_dir=work_dir, s3_client=s3_client)
    raise SourceError(f"source.kind: unsupported kind {source.kind!r}", model=spec.name)


def _pretrained_dir(path: Path, spec: ModelSpec, what: str) -> Path:
    # transformers reports a missing folder as a hub lookup of a repo named like the path; a
    # check here names the manifest field instead.
    if not path.is_dir():
        raise SourceError(f"{what}: folder {str(path)!r} does not exist", model=spec.name)
    if not (path / "config.json").is_file():
        raise SourceError(
            f"{what}: folder {str(path)!r} has no config.json; expected a save_pretrained folder",
            model=spec.name,
        )
    _check_weights(path, spec, what)
    return path


#: Weight files of a ``save_pretrained`` folder, and the index that names the shards of a big one.
_WEIGHTS = ("model.safetensors", "pytorch_model.bin")
_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")


def _check_weights(path: Path, spec: ModelSpec, what: str) -> None:
    """A folder with a config but no (or not all) weight files is a partial upload or copy.

    transformers would otherwise fail deep inside ``from_pretrained`` (or, for some classes,
    initialise random weights and build a model that means nothing), so it is named here."""
    if any((path / name).is_file() for name in _WEIGHTS):
        return
    for index_name in _INDEXES:
        index = path / index_name
        if not index.is_file():
            continue
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8")).get("weight_map", {})
            shards = sorted({str(name) for name in weight_map.values()})
        except (OSError, ValueError, AttributeError) as error:
            raise SourceError(f"{what}: {index_name} cannot be read ({error}); upload it again",
                              model=spec.name) from None
        missing = [name for name in shards if not (path / name).is_file()]
        if not shards or missing:
            raise SourceError(
                f"{what}: {index_name} names {len(shards)} weight shard(s) and "
                f"{len(missing)} are missing ({', '.join(missing[:3]) or 'none listed'}); "
                "a partial upload? upload the whole save_pretrained folder",
                model=spec.name,
            )
        return
    raise SourceError(
        f"{what}: folder {str(path)!r} has config.json but no weights ({', '.join(_WEIGHTS)} or a "
        "sharded index); a partial upload? upload the whole save_pretrained folder",
        model=spec.name,
    )


def _package_dir(source: PackageSource, spec: ModelSpec) -> Path:
    try:
        found = importlib.util.find_spec(source.package)
    except (ImportError, ValueError):
        found = None
    if found is None:
        raise SourceError(
            f"source.package: {source.package!r} is not installed; install it or use another source",
            model=spec.name,
        )
    root = importlib.resources.files(source.package)
    if not isinstance(root, Path):
        # A zipped package has no folder transformers could open.
        raise SourceError(
            f"source.package: {source.package!r} is not installed as a folder (zip import); "
            "install it unzipped",
            model=spec.name,
        )
    folder = (root / source.path).resolve() if source.path else root.resolve()
    if not folder.is_relative_to(root.resolve()):
        raise SourceError(
            f"source.path: {source.path!r} leaves package {source.package!r}; use a folder inside it",
            model=spec.name,
        )
    return _pretrained_dir(folder, spec, f"source.path {source.path!r} in package {source.package!r}")


def _hub_offline() -> bool:
    # huggingface_hub reads HF_HUB_OFFLINE once at import; reading it here honours a value set
    # after that (by a test, or by the orchestrator before the first download).
    from huggingface_hub import constants

    flag = os.environ.get("HF_HUB_OFFLINE", os.environ.get("TRANSFORMERS_OFFLINE", ""))
    return constants.HF_HUB_OFFLINE or flag.strip().lower() in {"1", "true", "yes", "on"}


def _hub_reachable(endpoint: str, timeout: float = HUB_PROBE_TIMEOUT_S) -> bool:
    url = urlparse(endpoint)
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        with socket.create_connection((url.hostname or "", port), timeout=timeout):
            return True
    except OSError:
        return False


def _huggingface(source: HuggingFaceSource, spec: ModelSpec, work_dir: Path) -> Path:
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import (
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    what = f"model {source.model_id!r} at revision {source.revision}"
    offline = _hub_offline()
    if not offline and not _hub_reachable(constants.ENDPOINT):
        raise SourceError(
            f"source: cannot download {what}: the hub {constants.ENDPOINT} is unreachable "
            f"(no connection within {HUB_PROBE_TIMEOUT_S:g} s); use a package, local or s3 source",
            model=spec.name,
        )
    work_dir.mkdir(parents=True, exist_ok=True)
    try:
        folder = snapshot_download(
            source.model_id,
            revision=source.revision,
            local_dir=work_dir,
            local_files_only=offline,
            etag_timeout=HUB_PROBE_TIMEOUT_S,
        )
    except (RepositoryNotFoundError, RevisionNotFoundError) as error:
        raise SourceError(
            f"source: {what} not found on the hub ({type(error).__name__})", model=spec.name
        ) from None
    except LocalEntryNotFoundError:
        reason = "offline mode is on (HF_HUB_OFFLINE)" if offline else "the download failed"
        raise SourceError(
            f"source: cannot download {what}: the hub is unreachable ({reason}) and the revision "
            "is not in the local cache",
            model=spec.name,
        ) from None
    except (HfHubHTTPError, OSError) as error:
        raise SourceError(
            f"source: cannot download {what}: the hub is unreachable or refused: "
            f"{str(error).splitlines()[0] if str(error) else type(error).__name__}",
            model=spec.name,
        ) from None
    return _pretrained_dir(Path(folder), spec, f"source.model_id {source.model_id!r}")


def _split_s3(uri: str) -> tuple[str, str]:
    parsed = urlparse(uri)
    return parsed.netloc, parsed.path.lstrip("/")


def _s3(client: Any) -> Any:
    if client is not None:
        return client
    import boto3

    return boto3.client("s3")


def _safe_target(root: Path, relative: str, spec: ModelSpec, uri: str) -> Path:
    # An S3 key is any string: "../" in a key must not write outside the work folder.
    parts = PurePosixPath(relative).parts
    if not parts or any(part in ("..", "") for part in parts) or relative.startswith("/"):
        raise SourceError(f"source: object {uri!r} has an unsafe key; refusing to download it",
                          model=spec.name)
    return root.joinpath(*parts)


def _download_prefix(client: Any, bucket: str, prefix: str, work_dir: Path, spec: ModelSpec) -> None:
    from botocore.exceptions import BotoCoreError, ClientError

    # A trailing "/" keeps "models/bert" from also matching "models/bert-large/...".
    if prefix and not prefix.endswith("/"):
        prefix += "/"
    uri = f"s3://{bucket}/{prefix}"
    count = 0
    try:
        # The whole listing is checked before the first download: an empty or partial prefix
        # (no config.json, no weights) fails in one request, not after gigabytes.
        keys = [item["Key"]
                for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
                for item in page.get("Contents", []) if not item["Key"].endswith("/")]  # "/": console folder marker
        names = {key[len(prefix):] for key in keys}
        if keys and "config.json" not in names:
            raise SourceError(
                f"source.uri: {uri!r} holds {len(keys)} object(s) but no config.json; a partial upload? "
                "expected a whole save_pretrained folder",
                model=spec.name,
            )
        if keys and not names & set(_WEIGHTS + _INDEXES):
            raise SourceError(
                f"source.uri: {uri!r} holds config.json but no weights ({', '.join(_WEIGHTS)} or a sharded "
                "index); a partial upload? expected a whole save_pretrained folder",
                model=spec.name,
            )
        for key in keys:
            target = _safe_target(work_dir, key[len(prefix):], spec, f"s3://{bucket}/{key}")
            target.parent.mkdir(parents=True, exist_ok=True)
            client.download_file(bucket, key, str(target))
            count += 1
    except (ClientError, BotoCoreError) as error:
        raise SourceError(f"source.uri: cannot download {uri!r}: {error}", model=spec.name) from None
    if count == 0:
        raise SourceError(
            f"source.uri: no objects under {uri!r}; expected a save_pretrained folder (config.json "
            "and weights) there: check the URI, or wait until the upload has finished",
            model=spec.name,
        )


def s3_tokenizer_files(spec: ModelSpec, source: S3Source, folder: Path, s3_client: Any) -> Path:
    """Download the tokenizer files of an S3 source (those present) into ``folder``, alone.

    A raw-text target checks them before the export downloads the weights, so a prefix without
    them is refused in a few requests. A missing file is left to the caller's check; any other
    S3 error is a :class:`SourceError` naming the object.
    """
    from botocore.exceptions import BotoCoreError, ClientError

    from model_build.manifest import TOKENIZER_SOURCE_FILES

    bucket, prefix = _split_s3(source.uri)
    prefix = prefix if not prefix or prefix.endswith("/") else prefix + "/"
    folder.mkdir(parents=True, exist_ok=True)
    client = _s3(s3_client)
    for name in TOKENIZER_SOURCE_FILES:
        try:
            client.download_file(bucket, prefix + name, str(folder / name))
        except ClientError as error:
            if error.response.get("Error", {}).get("Code") not in {"404", "NoSuchKey", "NotFound"}:
                raise SourceError(f"source.uri: cannot read s3://{bucket}/{prefix}{name}: {error}",
                                  model=spec.name) from None
        except BotoCoreError as error:
            raise SourceError(f"source.uri: cannot read s3://{bucket}/{prefix}{name}: {error}",
                              model=spec.name) from None
    return folder


def _onnx_file(
    source: OnnxFileSource, spec: ModelSpec, *, base_dir: Path, work_dir: Path, s3_client: Any
) -> Path:
    if source.path.startswith("s3://"):
        from botocore.exceptions import BotoCoreError, ClientError

        bucket, key = _split_s3(source.path)
        if not key or key.endswith("/"):
            raise SourceError(f"source.path: {source.path!r} names no object; expected s3://bucket/key",
                              model=spec.name)
        work_dir.mkdir(parents=True, exist_ok=True)
        target = work_dir / PurePosixPath(key).name
        try:
            _s3(s3_client).download_file(bucket, key, str(target))
        except (ClientError, BotoCoreError) as error:
            raise SourceError(f"source.path: cannot download {source.path!r}: {error}",
                              model=spec.name) from None
        _check_onnx_file(target, source.path, spec)
        return target
    path = base_dir / source.path
    if not path.is_file():
        raise SourceError(f"source.path: file {str(path)!r} does not exist", model=spec.name)
    _check_onnx_file(path, source.path, spec)
    return path


def _check_onnx_file(path: Path, given: str, spec: ModelSpec) -> None:
    """Refuse, by its first bytes, a file that cannot be an ONNX model, before onnx parses it.

    A serialized ``ModelProto`` starts with its ``ir_version`` field (tag byte 0x08). Protobuf
    parses many arbitrary byte strings without complaint, so this check, not a parse error, is
    what names the common mistakes: an empty file, a Git LFS pointer, an HTML error page."""
    with path.open("rb") as handle:
        head = handle.read(64)
    if not head:
        raise SourceError(f"source.path: {given!r} is an empty file; expected an ONNX model", model=spec.name)
    if head.startswith(b"version https://git-lfs"):
        raise SourceError(f"source.path: {given!r} is a Git LFS pointer, not the model; run `git lfs pull`",
                          model=spec.name)
    if head[0] != 0x08:
        raise SourceError(
            f"source.path: {given!r} is not an ONNX model (its first bytes are {head[:8]!r}; a "
            "serialized ONNX ModelProto starts with byte 0x08)",
            model=spec.name,
        )


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
        from model_build.pooling import SentenceEmbedding, pooling_config

        return SentenceEmbedding(inner, pooling_config(source_dir, spec.name))
    if spec.task == "feature-extraction":
        return TokenFeatures(inner)
    return ImageLogits(inner)


def _config_class(architecture: str) -> Any:
    from transformers import BertConfig, ResNetConfig

    return ResNetConfig if architecture == "resnet" else BertConfig


def _synthetic(spec: ModelSpec, source: SyntheticSource) -> nn.Module:
    from transformers import BertModel, ResNetForImageClassification

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
    model_class = ResNetForImageClassification if source.architecture == "resnet" else BertModel
    # Weights come from torch's global RNG: a forked, seeded RNG makes them a function of the
    # seed alone and leaves the caller's random state untouched.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(source.seed)
        return model_class(config)


def _pretrained(spec: ModelSpec, source_dir: Path) -> nn.Module:
    from transformers import AutoModel, AutoModelForImageClassification

    model_class = AutoModelForImageClassification if spec.task == "image-classification" else AutoModel
    try:
        # float32 explicitly: transformers 5 loads a checkpoint in its stored dtype by default,
        # and the FP16 conversion (when asked for) is done on the ONNX graph instead.
        return model_class.from_pretrained(
            str(source_dir), local_files_only=True, dtype=torch.float32
        )
    except (OSError, ValueError, KeyError) as error:
        first = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise SourceError(
            f"source: cannot load a {spec.task} model from {str(source_dir)!r}: {first}",
            model=spec.name,
        ) from None


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
    return [encode(short), encode(padded), encode(longest)]


def reference_inputs(spec: ModelSpec, source_dir: Path | None, *, seed: int = 1) -> Batch:
    """A small batch (2, or 1 without batching) recorded at build time for the ``verify`` step."""
    size = 1 if spec.max_batch_size == 0 else min(2, spec.max_batch_size)
    if spec.task not in TEXT_TASKS:
        return _image_batch(spec, size, np.random.default_rng(seed))
    encode = _text_encoder(spec, source_dir, seed)
    texts = list(spec.text_inputs.sample_texts or DEFAULT_SENTENCES)
    return encode([texts[i % len(texts)] for i in range(size)])


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
    return [encode(texts[i:i + chunk]) for i in range(0, len(texts), chunk)]


def _batch_sizes(spec: ModelSpec) -> tuple[int, int, int]:
    if spec.max_batch_size == 0:
        return (1, 1, 1)
    cap = min(8, spec.max_batch_size)
    return (1, min(3, cap), cap)


def _image_batch(spec: ModelSpec, size: int, rng: np.random.Generator) -> Batch:
    image = spec.image_inputs
    shape = (size, image.channels, image.image_size, image.image_size)
    return {"pixel_values": rng.standard_normal(shape, dtype=np.float32)}


def text_batch(spec: ModelSpec, source_dir: Path | None, texts: Sequence[str], *, seed: int = 0) -> Batch:
    """``input_ids``/``attention_mask`` for ``texts``, padded to the longest, as a client sends them."""
    return _text_encoder(spec, source_dir, seed)(texts)


def _text_encoder(spec: ModelSpec, source_dir: Path | None, seed: int) -> Callable[[Sequence[str]], Batch]:
    """A function texts -> ``input_ids``/``attention_mask`` (int64, padded to the longest)."""
    max_len = spec.text_inputs.max_sequence_length
    tokenizer = _tokenizer(spec, source_dir)
    if tokenizer is None:
        return _random_ids_encoder(spec, source_dir, seed)

    def encode(texts: Sequence[str]) -> Batch:
        encoded = tokenizer(list(texts), padding="longest", truncation=True, max_length=max_len,
                            return_tensors="np")
        return {
            "input_ids": np.ascontiguousarray(encoded["input_ids"], dtype=np.int64),
            "attention_mask": np.ascontiguousarray(encoded["attention_mask"], dtype=np.int64),
        }

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
    from model_build.manifest import TOKENIZER_FILES

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


def _random_ids_encoder(
    spec: ModelSpec, source_dir: Path | None, seed: int
) -> Callable[[Sequence[str]], Batch]:
    """Seeded random ids for models without a tokenizer; a text's word count sets its length.

    Padding positions get id 0 and mask 0, as a tokenizer would give them.
    """
    vocab = _vocab_size(spec, source_dir)
    max_len = spec.text_inputs.max_sequence_length
    rng = np.random.default_rng(seed)

    def encode(texts: Sequence[str]) -> Batch:
        lengths = [min(max_len, len(text.split()) + 2) for text in texts]
        width = max(lengths)
        ids = rng.integers(1, vocab, size=(len(texts), width), dtype=np.int64)
        mask = (np.arange(width)[None, :] < np.array(lengths)[:, None]).astype(np.int64)
        return {"input_ids": ids * mask, "attention_mask": mask}

    return encode
