"""Plot plumbing the studies share: pyplot on the Agg backend (files only), saving a figure, a curve's points."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any


def pyplot() -> Any:
    """matplotlib.pyplot on the Agg backend, imported when a plot is first drawn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(fig: Any, path: Path, dpi: int = 110) -> None:
    """tight_layout, write the PNG, close the figure."""
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    pyplot().close(fig)


def xy(points: Sequence[Sequence[float]]) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """A logged curve [(step, value), ...] as (steps, values)."""
    steps, values = zip(*points, strict=True)
    return steps, values
