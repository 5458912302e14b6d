"""Request bodies and answers of Triton's inference protocol as the SageMaker Triton container
takes them: JSON, or JSON with the binary tensor extension.

Binary (the default): a JSON header naming each tensor, with ``binary_data_size``, then the raw
tensors in order, sent as ``application/vnd.sagemaker-triton.binary+json;json-header-size=<n>``.
Numbers are little-endian in C order; a BYTES element is a 4-byte little-endian length and its
bytes (Triton's ``docs/protocol/extension_binary_data.md``). The answer comes back the same way,
its header's length in its ``Content-Type``; an answer without one is all JSON.
"""

from __future__ import annotations

import json
import re
import struct
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from triton_mme_client.signatures import NUMPY_DTYPES, wire_datatype

#: ``Content-Type`` of a binary request (and answer) of the SageMaker Triton container.
BINARY_CONTENT_TYPE = "application/vnd.sagemaker-triton.binary+json;json-header-size={}"
JSON_CONTENT_TYPE = "application/json"
_HEADER_SIZE = re.compile(r"json-header-size\s*=\s*(\d+)", re.IGNORECASE)


class DecodeError(ValueError):
    """An answer that is not a Triton inference response (says what is wrong)."""


def serialize_bytes(array: np.ndarray) -> bytes:
    """BYTES elements in C order, each as a 4-byte little-endian length and its bytes (str: UTF-8)."""
    parts = []
    for item in array.flat:
        data = item.encode("utf-8") if isinstance(item, str) else bytes(item)
        parts.append(struct.pack("<I", len(data)))
        parts.append(data)
    return b"".join(parts)


def deserialize_bytes(data: bytes, count: int) -> np.ndarray:
    """``count`` length-prefixed elements of ``data``, as a flat object array of ``bytes``."""
    items: list[bytes] = []
    offset = 0
    for _ in range(count):
        if offset + 4 > len(data):
            raise DecodeError(f"BYTES tensor: {len(data)} bytes hold fewer than {count} elements")
        (length,) = struct.unpack_from("<I", data, offset)
        offset += 4
        if offset + length > len(data):
            raise DecodeError(f"BYTES tensor: an element of {length} bytes runs past the tensor's {len(data)} bytes")
        items.append(data[offset:offset + length])
        offset += length
    if offset != len(data):
        raise DecodeError(f"BYTES tensor: {len(data) - offset} bytes left after its {count} elements")
    result = np.empty(count, dtype=np.object_)
    result[:] = items
    return result


def _raw(array: np.ndarray, datatype: str) -> bytes:
    if datatype == "BYTES":
        return serialize_bytes(array)
    return np.ascontiguousarray(array, dtype=np.dtype(NUMPY_DTYPES[datatype]).newbyteorder("<")).tobytes()


def encode_binary(inputs: Mapping[str, np.ndarray], outputs: Sequence[str] = ()) -> tuple[bytes, str]:
    """``(body, content type)`` of a binary request; ``outputs``: those to return (empty: all),
    each asked for as binary data."""
    header_inputs, blobs = [], []
    for name, array in inputs.items():
        datatype = wire_datatype(array)
        raw = _raw(array, datatype)
        header_inputs.append({"name": name, "shape": list(array.shape), "datatype": datatype,
                              "parameters": {"binary_data_size": len(raw)}})
        blobs.append(raw)
    header: dict[str, Any] = {"inputs": header_inputs}
    if outputs:
        header["outputs"] = [{"name": name, "parameters": {"binary_data": True}} for name in outputs]
    else:
        header["parameters"] = {"binary_data_output": True}
    text = json.dumps(header, separators=(",", ":")).encode()
    return text + b"".join(blobs), BINARY_CONTENT_TYPE.format(len(text))


def encode_json(inputs: Mapping[str, np.ndarray], outputs: Sequence[str] = ()) -> tuple[bytes, str]:
    """``(body, content type)`` of an all-JSON request (BYTES elements as UTF-8 text)."""
    header_inputs = []
    for name, array in inputs.items():
        datatype = wire_datatype(array)
        if datatype == "BYTES":
            data: list[Any] = [item.decode("utf-8") if isinstance(item, bytes) else str(item) for item in array.flat]
        else:
            data = array.ravel().tolist()
        header_inputs.append({"name": name, "shape": list(array.shape), "datatype": datatype, "data": data})
    document: dict[str, Any] = {"inputs": header_inputs}
    if outputs:
        document["outputs"] = [{"name": name} for name in outputs]
    return json.dumps(document, separators=(",", ":")).encode(), JSON_CONTENT_TYPE


def header_length(content_type: str) -> int | None:
    """The JSON header's length that a binary answer's ``Content-Type`` names (None: all JSON)."""
    match = _HEADER_SIZE.search(content_type or "")
    return int(match.group(1)) if match else None


def decode(body: bytes, content_type: str) -> dict[str, np.ndarray]:
    """Every output of an inference answer (binary or JSON), as numpy arrays of their datatypes
    and shapes (BYTES: object arrays of ``bytes``)."""
    size = header_length(content_type)
    if size is not None and not 0 < size <= len(body):
        raise DecodeError(f"answer of {len(body)} bytes names a JSON header of {size} bytes")
    head, rest = (body, b"") if size is None else (body[:size], body[size:])
    try:
        document = json.loads(head)
    except (ValueError, UnicodeDecodeError) as error:
        raise DecodeError(f"answer's JSON header does not parse ({error}): {head[:120]!r}") from None
    if not isinstance(document, dict) or not isinstance(document.get("outputs"), list):
        raise DecodeError(f"answer has no outputs list: {head[:200]!r}")
    results: dict[str, np.ndarray] = {}
    offset = 0
    for output in document["outputs"]:
        try:
            name, datatype = str(output["name"]), str(output["datatype"])
            shape = [int(d) for d in output["shape"]]
        except (KeyError, TypeError, ValueError):
            raise DecodeError(f"answer output {str(output)[:120]!r} lacks a name, datatype or shape") from None
        if datatype not in NUMPY_DTYPES:
            raise DecodeError(f"answer output {name!r}: datatype {datatype!r} is not one this client reads")
        count = int(np.prod(shape)) if shape else 1
        binary_size = (output.get("parameters") or {}).get("binary_data_size")
        if binary_size is not None:
            data = rest[offset:offset + int(binary_size)]
            if len(data) != int(binary_size):
                raise DecodeError(f"answer output {name!r}: {binary_size} bytes named, {len(data)} present")
            offset += int(binary_size)
            if datatype == "BYTES":
                array = deserialize_bytes(data, count)
            else:
                dtype = np.dtype(NUMPY_DTYPES[datatype]).newbyteorder("<")
                if len(data) != count * dtype.itemsize:
                    raise DecodeError(f"answer output {name!r}: {len(data)} bytes for {count} {datatype} values")
                array = np.frombuffer(data, dtype=dtype).astype(dtype.newbyteorder("="))
        elif "data" in output:
            values = output["data"]
            if datatype == "BYTES":
                array = np.empty(len(values), dtype=np.object_)
                array[:] = [v.encode("utf-8") if isinstance(v, str) else bytes(v) for v in values]
            else:
                array = np.asarray(values, dtype=NUMPY_DTYPES[datatype])
            if array.size != count:
                raise DecodeError(f"answer output {name!r}: {array.size} values for shape {shape}")
        else:
            raise DecodeError(f"answer output {name!r} has neither data nor binary_data_size")
        results[name] = array.reshape(shape)
    return results
