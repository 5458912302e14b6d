"""Matplotlib on the Agg backend (no display on a build machine), one style for every chart."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # (after use(): the backend must be chosen first)

#: Baseline in grey, the project's path in blue, a third series in orange: the same everywhere.
BASELINE = "#8c8c8c"
CANDIDATE = "#1f77b4"
OTHER = "#ff7f0e"
LIMIT = "#d62728"


def figure(ncols: int, title: str, *, width: float = 5.2, height: float = 4.2) -> tuple[Any, Any]:
    fig, axes = plt.subplots(1, ncols, figsize=(width * ncols, height), squeeze=False)
    fig.suptitle(title, fontsize=13)
    return fig, list(axes[0])


def error_bars(stats_list: list[dict[str, Any]], scale: float = 1.0) -> list[list[float]]:
    """Asymmetric error bars from median to min and max."""
    lower = [(s["median"] - s["min"]) * scale for s in stats_list]
    upper = [(s["max"] - s["median"]) * scale for s in stats_list]
    return [lower, upper]


def save(fig: Any, path: Path, note: str = "") -> None:
    if note:
        fig.text(0.01, 0.01, note, fontsize=8, color="#555555", ha="left", va="bottom")
    fig.tight_layout(rect=(0, 0.04 if note else 0, 1, 0.95))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def annotate_bars(ax: Any, bars: Any, labels: list[str]) -> None:
    for bar, label in zip(bars, labels, strict=True):
        ax.annotate(label, (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center",
                    va="bottom", fontsize=8, xytext=(0, 2), textcoords="offset points")
