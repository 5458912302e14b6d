"""What the CLI prints of a build: the table of a release's models (format, size, hash, largest
difference against PyTorch, the accuracy gates) and sizes in binary units."""

from __future__ import annotations

from typing import Any

from rich.table import Table


def human_size(size: float) -> str:
    """``1.5 MB``: a byte count in binary units, as the CLI prints sizes."""
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1024 or unit == "GB":
            return f"{size:.1f} {unit}" if unit != "B" else f"{int(size)} B"
        size /= 1024
    return f"{size:.1f} GB"


def build_table(record: Any) -> Table:
    """The table ``build`` and ``demo`` print: one row per built model of the release record."""
    table = Table(title=f"release {record.release_id}")
    for column in ("model", "format", "size", "sha256", "max difference", "gates vs FP32", "time"):
        table.add_column(column, justify="right" if column in {"size", "time"} else "left")
    for model in record.models:
        diff = model.difference_text()
        fmt = model.format + (" fused" if model.fused_ops.get("Attention") else "")
        fmt += f" {model.precision}" if model.format == "onnx" else ""
        fmt += " grouped" if model.length_grouping.startswith("on") else ""
        table.add_row(
            model.name + (f" x{len(model.targets)}" if len(model.targets) > 1 else ""),
            fmt,
            human_size(model.size),
            model.sha256[:16],
            diff,
            gates_text(model.accuracy),
            f"{model.seconds:.1f} s",
        )
    return table


def gates_text(accuracy: dict[str, float]) -> str:
    """``cos 0.99999 >= 0.9999, top-k 1.00 >= 1.0``: each measured value with its gate."""
    parts = []
    if "min_cosine" in accuracy:
        parts.append(f"cos {accuracy['min_cosine']:.5f} >= {accuracy.get('min_cosine_gate', 0):g}")
    if "top_k_agreement" in accuracy:
        parts.append(f"top-k {accuracy['top_k_agreement']:.2f} >= {accuracy.get('top_k_gate', 0):g}")
    return ", ".join(parts) or "-"
