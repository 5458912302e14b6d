"""A model's published inputs and outputs, and the check of a request against them.

The build records each target's tensors as its ``config.pbtxt`` declares them (names, Triton wire
datatypes, dims without the batch axis, and ``max_batch_size``) in the release index; the routes
document carries them with each route (``"signature"``). A route without one (a release of an
earlier version) has an unknown signature: the client then sends what it is given.

Conversions are never silent losses: an array whose dtype casts safely to the model's (``int32``
to ``INT64``) is converted; one of the same kind whose values survive the cast exactly (``int64``
token ids to ``INT32``) is converted; anything else (``float64`` to ``FP32``, floats to integers)
is refused with the cast to make.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from triton_mme_client.errors import InvalidInput

#: Triton wire datatype -> numpy dtype (BYTES: numpy object arrays of ``bytes`` or ``str``).
NUMPY_DTYPES: dict[str, Any] = {
    "BOOL": np.bool_, "UINT8": np.uint8, "UINT16": np.uint16, "UINT32": np.uint32, "UINT64": np.uint64,
    "INT8": np.int8, "INT16": np.int16, "INT32": np.int32, "INT64": np.int64,
    "FP16": np.float16, "FP32": np.float32, "FP64": np.float64, "BYTES": np.object_,
}
DATATYPES = frozenset(NUMPY_DTYPES)


@dataclass(frozen=True)
class TensorSpec:
    """One input or output: its name, Triton datatype and dims (``-1``: variable), batch axis excluded."""

    name: str
    datatype: str
    dims: tuple[int, ...]

    def as_json(self) -> dict[str, Any]:
        return {"name": self.name, "datatype": self.datatype, "dims": list(self.dims)}

    def describe(self, max_batch_size: int) -> str:
        shape = ["-1" if d < 0 else str(d) for d in self.dims]
        if max_batch_size > 0:
            shape.insert(0, f"batch<={max_batch_size}")
        return f"{self.datatype}[{', '.join(shape)}]"


@dataclass(frozen=True)
class Signature:
    """A target's tensors; ``max_batch_size`` > 0: every request shape starts with a batch axis."""

    max_batch_size: int
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]

    def as_json(self) -> dict[str, Any]:
        return {"max_batch_size": self.max_batch_size, "inputs": [t.as_json() for t in self.inputs],
                "outputs": [t.as_json() for t in self.outputs]}

    def takes(self) -> str:
        """``input_ids INT64[batch<=8, -1], attention_mask INT64[batch<=8, -1]``: for error messages."""
        return ", ".join(f"{t.name} {t.describe(self.max_batch_size)}" for t in self.inputs)


def parse_signature(value: Any) -> Signature | None:
    """The ``"signature"`` object of a route or index entry; None where there is none (unknown).

    Raises ``ValueError`` (with what is wrong) for one that is present but malformed."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise ValueError(f"signature is {type(value).__name__}, expected an object")
    batch = value.get("max_batch_size")
    if not isinstance(batch, int) or isinstance(batch, bool) or batch < 0:
        raise ValueError(f"signature max_batch_size {batch!r}; expected an integer >= 0")

    def tensors(kind: str) -> tuple[TensorSpec, ...]:
        items = value.get(kind)
        if not isinstance(items, list):
            raise ValueError(f"signature {kind} is {type(items).__name__}, expected a list")
        found = []
        for item in items:
            if not isinstance(item, Mapping) or not isinstance(item.get("name"), str):
                raise ValueError(f"signature {kind}: {str(item)[:80]!r} has no name")
            datatype, dims = item.get("datatype"), item.get("dims")
            if datatype not in DATATYPES:
                raise ValueError(f"signature {kind} {item['name']!r}: datatype {datatype!r}; allowed: "
                                 + ", ".join(sorted(DATATYPES)))
            if not isinstance(dims, list) or not all(isinstance(d, int) and not isinstance(d, bool) for d in dims):
                raise ValueError(f"signature {kind} {item['name']!r}: dims {dims!r}; expected a list of integers")
            found.append(TensorSpec(item["name"], datatype, tuple(dims)))
        return tuple(found)

    return Signature(batch, tensors("inputs"), tensors("outputs"))


def wire_datatype(array: np.ndarray) -> str:
    """The Triton datatype of a numpy array as given (object, str and bytes arrays are BYTES)."""
    if array.dtype.kind in "OUS":
        return "BYTES"
    for name, dtype in NUMPY_DTYPES.items():
        if name != "BYTES" and array.dtype == np.dtype(dtype):
            return name
    raise InvalidInput(f"dtype {array.dtype} has no Triton datatype; allowed: "
                       + ", ".join(str(np.dtype(d)) for n, d in NUMPY_DTYPES.items() if n != "BYTES")
                       + ", object/str/bytes (BYTES)")


def convert(array: np.ndarray, datatype: str) -> np.ndarray | None:
    """``array`` as ``datatype``'s numpy dtype without losing a value, or None where that cannot be."""
    if datatype == "BYTES":
        if array.dtype.kind not in "OUS":
            return None
        if array.dtype.kind == "O" and not all(isinstance(item, bytes | str) for item in array.flat):
            return None
        return array.astype(np.object_, copy=False)
    if array.dtype.kind in "OUS":
        return None
    target = np.dtype(NUMPY_DTYPES[datatype])
    if np.can_cast(array.dtype, target, casting="safe"):
        return array.astype(target, copy=False)
    same_kind = {array.dtype.kind, target.kind} <= {"i", "u"} or array.dtype.kind == target.kind == "f"
    if not same_kind:
        return None
    with np.errstate(all="ignore"):
        cast = array.astype(target)
        back = cast.astype(array.dtype)
    exact = np.array_equal(back, array, equal_nan=True) if array.dtype.kind == "f" else np.array_equal(back, array)
    return cast if exact else None


def check_inputs(model: str, target_model: str, signature: Signature,
                 inputs: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """``inputs`` converted to the signature's datatypes; :class:`InvalidInput` naming the model,
    the input, what was given and what the model takes, for the first that does not fit."""

    def refuse(what: str) -> InvalidInput:
        return InvalidInput(f"model {model!r}: {what}; the model takes {signature.takes()}",
                            model=model, target_model=target_model)

    wanted = {spec.name: spec for spec in signature.inputs}
    unknown = sorted(set(inputs) - set(wanted))
    if unknown:
        raise refuse(f"input {unknown[0]!r} is not one of its inputs")
    missing = [name for name in wanted if name not in inputs]
    if missing:
        raise refuse(f"input {missing[0]!r} is missing")
    checked: dict[str, np.ndarray] = {}
    for name, spec in wanted.items():
        given = inputs[name]
        array = given if isinstance(given, np.ndarray) else np.asarray(given)
        rank = len(spec.dims) + (1 if signature.max_batch_size > 0 else 0)
        if array.ndim != rank:
            raise refuse(f"input {name!r}: rank {array.ndim} (shape {list(array.shape)}); it takes rank {rank}")
        dims = array.shape[1:] if signature.max_batch_size > 0 else array.shape
        if signature.max_batch_size > 0 and not 1 <= array.shape[0] <= signature.max_batch_size:
            raise refuse(f"input {name!r}: batch of {array.shape[0]} (shape {list(array.shape)}); "
                         f"it takes 1 to {signature.max_batch_size}")
        for axis, (got, want) in enumerate(zip(dims, spec.dims, strict=True)):
            if want >= 0 and got != want:
                raise refuse(f"input {name!r}: shape {list(array.shape)} (dimension {axis} is {got}, "
                             f"expected {want})")
        converted = convert(array, spec.datatype)
        if converted is None:
            hint = "" if spec.datatype == "BYTES" else f" (cast it yourself: .astype(np.{np.dtype(NUMPY_DTYPES[spec.datatype]).name}))"
            raise refuse(f"input {name!r}: dtype {array.dtype} does not convert to {spec.datatype} without "
                         f"losing values{hint}")
        checked[name] = converted
    return checked
