"""The reference ``.npz`` of a build: the inputs a model was validated on and its outputs.

One writer and one reader of the format, used by the build (validate, the text-ensemble step),
the smoke client and the tests. numpy and the standard library only: a smoke test run from a
laptop or a CI job reads references without torch or onnx.

Entries are ``input:<name>`` and ``output:<name>``; any ``.npz`` reader (``np.load``) reads
the file, and equal arrays give byte-identical files.
"""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import numpy as np

from triton_mme_cdk.model_build.errors import VerifyError

#: The zip entries' date (the earliest a zip can hold): no build time in the bytes.
_ZIP_EPOCH = (1980, 1, 1, 0, 0, 0)


def _npy_bytes(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.lib.format.write_array(buffer, np.ascontiguousarray(array), allow_pickle=False)
    return buffer.getvalue()


def write_reference(path: Path, inputs: dict[str, np.ndarray], outputs: dict[str, np.ndarray]) -> None:
    """An ``.npz`` (``input:<name>``, ``output:<name>``) with byte-identical output for equal arrays.

    ``np.savez`` stamps each zip entry with the current time; here entries are sorted, stored
    uncompressed (no dependence on the zlib build) and dated 1980-01-01, and ``np.load`` reads the
    file like any ``.npz``.
    """
    entries = {f"input:{k}": v for k, v in inputs.items()}
    entries.update({f"output:{k}": v for k, v in outputs.items()})
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as archive:
        for key in sorted(entries):
            info = zipfile.ZipInfo(f"{key}.npy", date_time=_ZIP_EPOCH)
            info.create_system = 3  # Unix, whatever the building machine
            info.external_attr = 0o644 << 16
            archive.writestr(info, _npy_bytes(entries[key]))


def read_reference(path: Path, *, outputs_required: bool = True) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Inputs and outputs from a file written by :func:`write_reference`.

    ``outputs_required=False`` accepts a file with inputs alone: a prebuilt TensorRT plan's, whose
    outputs were never computed (no GPU at build time), so a reader knows to compare no values.
    """
    inputs: dict[str, np.ndarray] = {}
    outputs: dict[str, np.ndarray] = {}
    try:
        with np.load(path, allow_pickle=False) as data:
            for key in data.files:
                kind, _, name = key.partition(":")
                if kind not in ("input", "output") or not name:
                    raise VerifyError(
                        f"reference {str(path)!r}: unexpected entry {key!r}; entries are "
                        "'input:<name>' or 'output:<name>'"
                    )
                (inputs if kind == "input" else outputs)[name] = data[key]
    except (OSError, ValueError, zipfile.BadZipFile) as error:
        raise VerifyError(f"reference {str(path)!r}: not a readable .npz: {error}") from None
    if not inputs or (outputs_required and not outputs):
        raise VerifyError(f"reference {str(path)!r}: needs at least one input and one output")
    return inputs, outputs
