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


def seed_lines(ax: Any, value: dict[int, dict[str, float]], arms: Sequence[str], ylabel: str, title: str) -> None:
    """value[seed][arm] drawn as one grey line per seed across the arms, and the seed mean of each arm."""
    x = range(len(arms))
    for per_arm in value.values():
        ax.plot(x, [per_arm.get(a) for a in arms], "o-", color="grey", alpha=0.5, lw=0.8, ms=4)
    means = [[per_arm[a] for per_arm in value.values() if a in per_arm] for a in arms]
    ax.plot(x, [sum(m) / len(m) if m else None for m in means], "s", color="C3", ms=8, label="seed mean")
    ax.set(ylabel=ylabel, title=title)
    ax.set_xticks(list(x), arms)
    ax.legend(fontsize=7)


def paired_differences(ax: Any, value: dict[int, dict[str, float]], pairs: Sequence[tuple]) -> None:
    """For each (a, b, threshold or None, name): the per-seed differences value[a] - value[b], their mean, and the
    threshold a rule reads them against (dotted red)."""
    for i, (a, b, threshold, _) in enumerate(pairs):
        d = [v[a] - v[b] for v in value.values() if a in v and b in v]
        ax.scatter([i] * len(d), d, color="C0", s=16, alpha=0.7)
        if d:
            ax.plot([i - 0.2, i + 0.2], [sum(d) / len(d)] * 2, color="C0")
        if threshold is not None:
            ax.plot([i - 0.3, i + 0.3], [threshold] * 2, color="C3", ls=":", lw=1)
    ax.axhline(0, color="grey", lw=0.6)
    ax.set(ylabel="paired difference, nats (per seed)", title="what the rules read (red: each threshold)")
    ax.set_xticks(range(len(pairs)), [f"{n}: {a} - {b}" for a, b, _, n in pairs], fontsize=7)
