"""Reading a manifest: the YAML policy and limits, one message for every problem, and the checks
that need the manifest's folder (a raw-text source must hold a tokenizer).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from triton_mme_cdk.model_build.errors import ManifestError
from triton_mme_cdk.model_build.manifest.fields import LocalSource, PackageSource, Source
from triton_mme_cdk.model_build.manifest.schema import Manifest
from triton_mme_cdk.model_build.validation_messages import problem_line

# --------------------------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------------------------


def _location(loc: tuple[int | str, ...], data: Any) -> str:
    """``('models', 1, 'max_batch_size')`` -> ``models[1].max_batch_size`` (with the model name)."""
    parts: list[str] = []
    node = data
    for item in loc:
        if isinstance(item, int):
            label = f"[{item}]"
            try:
                node = node[item]
                if isinstance(node, dict) and isinstance(node.get("name"), str):
                    label = f"[{item}]({node['name']})"
            except (IndexError, KeyError, TypeError):
                node = None
            parts.append(label)
        else:
            try:
                node = node[item] if isinstance(node, dict) else None
            except (KeyError, TypeError):
                node = None
            parts.append(("." if parts else "") + item)
    return "".join(parts)


def _clean_loc(loc: tuple[int | str, ...]) -> tuple[int | str, ...]:
    # Pydantic adds the union tag ("huggingface", ...) and validator names to the location.
    kinds = {"huggingface", "local", "s3", "package", "onnx", "synthetic"}
    return tuple(p for p in loc if not (isinstance(p, str) and (p in kinds or "[" in p)))


def format_validation_error(error: ValidationError, data: Any, *, prefix: str = "") -> str:
    """One message: a line per problem naming the field, the value given and what is allowed."""
    lines = []
    items = error.errors()
    nested = [tuple(item["loc"]) for item in items]
    for item in items:
        raw = tuple(item["loc"])
        # A list whose entries failed is then also "too short": that echo is noise.
        if item["type"] == "too_short" and any(len(o) > len(raw) and o[: len(raw)] == raw for o in nested):
            continue
        loc = _clean_loc(raw)
        field = prefix + _location(loc, data) if loc else (prefix.rstrip(".") or "manifest")
        msg = item["msg"]
        if msg.startswith("Value error, "):
            msg = msg[len("Value error, "):]
            # Model-level checks already name their field; attach it to the model's location.
            lines.append(f"{field}.{msg}" if loc else msg)
            continue
        value = item.get("input")
        if item["type"] == "union_tag_invalid":
            lines.append(
                f"{field}.kind: got {value.get('kind')!r}; expected one of "
                "huggingface, local, s3, package, onnx, synthetic"
                if isinstance(value, dict)
                else f"{field}: {msg}"
            )
        else:
            lines.append(problem_line(field, item))
    return "\n".join(lines)


def parse_manifest(data: Any, *, origin: str = "manifest") -> Manifest:
    """Validate already-loaded YAML/JSON data; raises :class:`ManifestError` with every problem."""
    if not isinstance(data, dict):
        raise ManifestError(
            f"{origin}: got {type(data).__name__}; expected a mapping with a 'models' list"
        )
    try:
        return Manifest.model_validate(data)
    except ValidationError as error:
        raise ManifestError(f"{origin}: invalid\n{format_validation_error(error, data)}") from None


_SafeLoader: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

#: Largest manifest read (bytes): a generated thousand-model manifest is about a quarter of this. Checked
#: before the file is parsed, so a huge file costs one ``stat`` (or one bounded read from S3).
MAX_MANIFEST_BYTES = 2 * 1024 * 1024
#: Deepest nesting of mappings and lists; the schema itself needs 4.
MAX_MANIFEST_DEPTH = 32
#: Longest single scalar (characters); a real value is a name, a path or a number.
MAX_SCALAR_CHARS = 4096


def _line_col(text: str, offset: int) -> str:
    line = text.count("\n", 0, offset) + 1
    return f"line {line}, column {offset - (text.rfind(chr(10), 0, offset) + 1) + 1}"


def _decode(raw: bytes, where: str) -> str:
    """UTF-8 text, or one error saying why not (with the offset of the first bad byte).

    A UTF-8 byte-order mark is accepted and dropped (editors on Windows write one); a UTF-16 or
    UTF-32 mark is refused with what to do, and so is a NUL byte (a binary file).
    """
    if raw.startswith((b"\xff\xfe", b"\xfe\xff", b"\x00\x00\xfe\xff")):
        raise ManifestError(f"{where}: is UTF-16/UTF-32 text (byte-order mark {raw[:2].hex()}); save it as UTF-8")
    if raw.startswith(b"\xef\xbb\xbf"):
        raw = raw[3:]
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        prefix = raw[: error.start].decode("utf-8", "replace")
        raise ManifestError(
            f"{where}: is not UTF-8 text: byte 0x{raw[error.start]:02x} at offset {error.start} "
            f"({_line_col(prefix, len(prefix))}) is invalid; "
            "save the manifest as UTF-8"
        ) from None
    nul = text.find("\x00")
    if nul >= 0:
        raise ManifestError(
            f"{where}: holds a NUL byte at {_line_col(text, nul)}; a manifest is YAML text, not a binary file"
        )
    return text


def _yaml_problem(error: yaml.YAMLError, text: str) -> str:
    """A YAML error as one line, with a hint for the common case of tab indentation."""
    mark = getattr(error, "problem_mark", None)
    problem = getattr(error, "problem", None) or str(error).splitlines()[0]
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    if (mark is not None and 0 <= mark.index < len(text) and text[mark.index] == "\t") or "'\\t'" in str(problem):
        return f"a tab character{where}; YAML indentation must use spaces"
    context = getattr(error, "context", None)
    return f"not valid YAML{where}: {(context + ', ') if context else ''}{problem}"


#: The tags the one-pass reader constructs itself (every value a plain manifest holds); any other tag
#: (an explicit ``!!binary``, a ``<<`` merge key...) is left to PyYAML's own loader, unchanged.
_PLAIN_TAGS = frozenset(f"tag:yaml.org,2002:{name}" for name in ("null", "bool", "int", "float", "str", "timestamp"))
_NEEDS_LOADER = object()


def _read_yaml(text: str, where: str) -> Any:
    """The document's data, in one pass over the YAML events, checked before it is trusted.

    Refused: anchors and aliases (always: a manifest needs none, and an alias is how a small file
    expands to billions of nodes), more than one document, nesting deeper than
    :data:`MAX_MANIFEST_DEPTH`, a duplicate key in a mapping (YAML keeps the last one silently),
    a mapping key that is not a plain scalar, and scalars longer than :data:`MAX_SCALAR_CHARS`.

    The same pass builds the data: each scalar is resolved and constructed by the loader's own
    resolver and safe constructor, as ``yaml.load`` would, without the node tree ``yaml.load``
    builds first (parsing twice, events then nodes, was most of reading a large manifest). A
    document with a tag this pass does not construct is loaded again by ``yaml.load``.
    """
    loader = _SafeLoader(text)
    # per open collection: [is_mapping, expecting_key, keys, data, pending key]
    stack: list[list[Any]] = []
    documents = 0
    root: Any = None
    try:
        while loader.check_event():
            event = loader.get_event()
            at = event.start_mark
            pos = f"line {at.line + 1}, column {at.column + 1}" if at is not None else "?"
            if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None):
                kind = "an alias" if isinstance(event, yaml.AliasEvent) else "an anchor"
                raise ManifestError(
                    f"{where}: {kind} ({'*' if kind == 'an alias' else '&'}{event.anchor}) at {pos}; "
                    "YAML anchors and aliases are not allowed in a manifest: write each value out"
                )
            if isinstance(event, yaml.DocumentStartEvent):
                documents += 1
                if documents > 1:
                    raise ManifestError(
                        f"{where}: a second YAML document starts at {pos}; a manifest is one document "
                        "(remove the '---' line or split the file)"
                    )
                continue
            if isinstance(event, (yaml.ScalarEvent, yaml.MappingStartEvent, yaml.SequenceStartEvent)):
                is_key = False
                if stack and stack[-1][0]:
                    frame = stack[-1]
                    if frame[1]:
                        if not isinstance(event, yaml.ScalarEvent):
                            raise ManifestError(f"{where}: a mapping key at {pos} is not a plain value")
                        if event.value in frame[2]:
                            raise ManifestError(
                                f"{where}: duplicate key {event.value!r} at {pos}; each key may appear "
                                "once in a mapping"
                            )
                        frame[2].add(event.value)
                        is_key = True
                    frame[1] = not frame[1]
                if isinstance(event, yaml.ScalarEvent):
                    if len(event.value) > MAX_SCALAR_CHARS:
                        raise ManifestError(
                            f"{where}: a value of {len(event.value)} characters at {pos}; at most "
                            f"{MAX_SCALAR_CHARS} (MAX_SCALAR_CHARS)"
                        )
                    if root is not _NEEDS_LOADER:
                        value = _scalar(loader, event)
                        root = _NEEDS_LOADER if value is _NEEDS_LOADER else _place(stack, value, is_key, root)
                    continue
                if len(stack) >= MAX_MANIFEST_DEPTH:
                    raise ManifestError(
                        f"{where}: nesting deeper than {MAX_MANIFEST_DEPTH} levels at {pos} "
                        "(MAX_MANIFEST_DEPTH)"
                    )
                mapping = isinstance(event, yaml.MappingStartEvent)
                if event.tag not in (None, "!"):
                    root = _NEEDS_LOADER
                data: Any = {} if mapping else []
                if root is not _NEEDS_LOADER:
                    root = _place(stack, data, False, root)
                stack.append([mapping, True, set(), data, None])
            elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
                stack.pop()
        if root is _NEEDS_LOADER:
            return yaml.load(text, Loader=_SafeLoader)
        return root
    except yaml.YAMLError as error:
        raise ManifestError(f"{where}: {_yaml_problem(error, text)}") from None
    except (ValueError, OverflowError) as error:  # e.g. a timestamp with month 13
        raise ManifestError(f"{where}: a value cannot be read: {error}") from None
    finally:
        loader.dispose()


def _scalar(loader: Any, event: Any) -> Any:
    """A scalar as ``yaml.load`` constructs it, or :data:`_NEEDS_LOADER` for one left to it (another tag,
    or a value it refuses: ``yaml.load`` then says why, as before, once every structural check passed)."""
    tag = event.tag
    if tag is None or tag == "!":
        tag = loader.resolve(yaml.ScalarNode, event.value, event.implicit)
    if tag not in _PLAIN_TAGS:
        return _NEEDS_LOADER
    if tag == "tag:yaml.org,2002:str":
        return event.value
    node = yaml.ScalarNode(tag, event.value, event.start_mark, event.end_mark, event.style)
    try:
        return loader.yaml_constructors[tag](loader, node)
    except (ValueError, OverflowError):  # e.g. a timestamp with month 13: refused by yaml.load, after the checks
        return _NEEDS_LOADER


def _place(stack: list[list[Any]], value: Any, is_key: bool, root: Any) -> Any:
    """Put a value into the open collection (a key waits for its value); the root if none is open."""
    if not stack:
        return value
    frame = stack[-1]
    if not frame[0]:
        frame[3].append(value)
    elif is_key:
        frame[4] = value
    else:
        frame[3][frame[4]] = value
    return root


def _check_numbers(data: Any, where: str, path: str = "") -> None:
    """Refuse NaN and infinities anywhere (``.nan``, ``.inf``): no field of the schema means them."""
    if isinstance(data, float) and not math.isfinite(data):
        raise ManifestError(
            f"{where}: {path or 'manifest'}: got {data!r}; NaN and infinite numbers are not allowed"
        )
    if isinstance(data, dict):
        for key, value in data.items():
            _check_numbers(value, where, f"{path}.{key}" if path else str(key))
    elif isinstance(data, list):
        for index, value in enumerate(data):
            _check_numbers(value, where, f"{path}[{index}]")


def load_manifest_bytes(raw: bytes, *, origin: str) -> Manifest:
    """Decode, parse and validate a manifest's bytes; every refusal is one :class:`ManifestError`.

    The order is cheapest first: size, encoding, one libyaml event pass (aliases, documents,
    depth, duplicate keys; it constructs the data too), non-finite numbers, then the schema. Each step is
    linear in the file's size, so a refused file is refused in milliseconds.
    """
    where = f"manifest {origin!r}"
    if len(raw) > MAX_MANIFEST_BYTES:
        raise ManifestError(
            f"{where}: is {len(raw)} bytes; at most {MAX_MANIFEST_BYTES} (MAX_MANIFEST_BYTES) are read"
        )
    text = _decode(raw, where)
    if not text.strip():
        raise ManifestError(f"{where}: is empty; expected a mapping with a 'models' list")
    data = _read_yaml(text, where)
    _check_numbers(data, where)
    return parse_manifest(data, origin=origin)


def load_manifest(path: str | Path) -> Manifest:
    """Read and validate ``models.yaml``; at most :data:`MAX_MANIFEST_BYTES` are read."""
    path = Path(path)
    where = f"manifest {str(path)!r}"
    try:
        with path.open("rb") as handle:
            raw = handle.read(MAX_MANIFEST_BYTES + 1)
    except FileNotFoundError:
        raise ManifestError(f"manifest: file {str(path)!r} not found") from None
    except IsADirectoryError:
        raise ManifestError(f"{where}: is a directory; expected a YAML file") from None
    except OSError as error:
        raise ManifestError(f"{where}: cannot be read: {error.strerror or error}") from None
    manifest = load_manifest_bytes(raw, origin=str(path))
    _check_text_sources(manifest, path.resolve().parent, where)
    return manifest


#: The serialized fast tokenizer a raw-text target serves (model_build/text_ensemble/).
TOKENIZER_JSON = "tokenizer.json"
#: Files transformers converts into a fast tokenizer when a source has no tokenizer.json.
SLOW_TOKENIZER_FILES = ("vocab.txt", "vocab.json", "spiece.model", "sentencepiece.bpe.model", "spm.model",
                        "tokenizer.model")
#: The files whose presence means a folder has a tokenizer.
TOKENIZER_FILES = (TOKENIZER_JSON, "tokenizer_config.json", *SLOW_TOKENIZER_FILES)
#: Every file a tokenizer may read, downloaded alone for an S3 source before its weights.
TOKENIZER_SOURCE_FILES = (TOKENIZER_JSON, "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                          "merges.txt", "config.json", "sentence_bert_config.json", *SLOW_TOKENIZER_FILES)


def _source_folder(source: Source, base_dir: Path) -> Path | None:
    """The folder of a local or installed-package source, where one can be found without loading it."""
    import importlib.util

    if isinstance(source, LocalSource):
        return base_dir / source.path
    if isinstance(source, PackageSource):
        try:
            found = importlib.util.find_spec(source.package)
        except (ImportError, ValueError):
            return None
        locations = list(found.submodule_search_locations or []) if found else []
        return Path(locations[0]) / source.path if locations else None
    return None


def _check_text_sources(manifest: Manifest, base_dir: Path, where: str) -> None:
    """``inputs: text`` on a folder source without tokenizer files is refused here, at validate.

    Sources fetched at build time (hub, S3) are checked by the build before the export; a folder
    that is absent is the source check's to report.
    """
    for index, spec in enumerate(manifest.models):
        if spec.inputs != "text":
            continue
        folder = _source_folder(spec.source, base_dir)
        if folder is None or not folder.is_dir():
            continue
        if not any((folder / name).is_file() for name in (TOKENIZER_JSON, *SLOW_TOKENIZER_FILES)):
            raise ManifestError(
                f"{where}: models[{index}]({spec.name}).inputs: got 'text', but the source folder "
                f"{str(folder)!r} has no {TOKENIZER_JSON}, nor a file transformers converts one from "
                f"({', '.join(SLOW_TOKENIZER_FILES)}); save the tokenizer beside the model "
                "(tokenizer.save_pretrained)"
            )
