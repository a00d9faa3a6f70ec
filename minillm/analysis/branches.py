"""The report's decay branches: runs started with ``decay_from=`` (their summary.json names a ``parent``), each the
WSD run of one budget, shown against the tokens they trained on: ``loss_vs_tokens.png`` (the stable runs' and
each branch's val loss curve, each branch's end marked, the ends joined: loss at each budget from one stable run)
and a table in report.md."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from minillm import schema
from minillm.analysis.runs import Run
from minillm.metrics import VAL_LOSS

PLOT = "loss_vs_tokens.png"


def is_branch(run: Run) -> bool:
    return isinstance(run.get("parent"), dict)


def tokens_per_step(run: Run) -> float | None:
    tokens, steps = run.get("tokens"), run.get("steps")
    return tokens / steps if tokens and steps else None


def val_curve(run: Run) -> tuple[list[float], list[float]]:
    """(tokens, val loss) of a run's validations: the logged step index i is after i + 1 optimizer steps."""
    per_step = tokens_per_step(run)
    if per_step is None:
        return [], []
    points = [(step, v) for step, v in run.curves.get(VAL_LOSS, []) if math.isfinite(v)]
    return [(s + 1) * per_step for s, _ in points], [v for _, v in points]


def _where(folder: str | Path) -> str:
    return os.path.realpath(folder)


def parent_of(branch: Run, by_dir: dict[str, Run]) -> Run | None:
    """The branch's parent among the runs (``by_dir``: by real path): the folder its summary recorded, else (a
    sweep read from another place, a relative path) the run folder of that name beside the branch."""
    recorded = branch.get("parent")["run_dir"]
    found = by_dir.get(_where(recorded))
    if found is None:
        found = by_dir.get(_where(Path(branch.dir).parent / Path(recorded).name))
    return found


def branch_start(branch: Run, parent: Run | None) -> tuple[float, float] | None:
    """Where a branch leaves its parent on the plot: at its own decay start (the checkpoint's step, in tokens), with
    the parent's val loss there (between two of its validations: the line between them); None when the parent
    has no validation at or before that step."""
    per_step = tokens_per_step(branch)
    if parent is None or per_step is None:
        return None
    at = branch.get("parent")["step"] * per_step
    points = list(zip(*val_curve(parent), strict=True))
    before = [p for p in points if p[0] <= at][-1:]
    after = [p for p in points if p[0] > at][:1]
    if not before:
        return None
    (x0, y0), = before
    if x0 == at or not after:
        return (at, y0) if x0 == at else (x0, y0)
    (x1, y1), = after
    return at, y0 + (y1 - y0) * (at - x0) / (x1 - x0)


def rows(runs: Sequence[Run]) -> list[dict[str, Any]]:
    """One row per branch, by parent and step: where it branched, its length, tokens and losses."""
    out = []
    for r in runs:
        if is_branch(r):
            parent = r.get("parent")
            out.append({"parent": Path(parent["run_dir"]).name, "from_step": parent["step"], "steps": r.get("steps"),
                        "tokens": r.get("tokens"), schema.FINAL_VAL_LOSS: r.get(schema.FINAL_VAL_LOSS),
                        schema.TEST_LOSS: r.get(schema.TEST_LOSS), "run": r.dir.name})
    return sorted(out, key=lambda row: (row["parent"], row["from_step"], row["steps"] or 0))


def markdown(runs: Sequence[Run]) -> str:
    lines = ["## Decay branches (loss at each budget)", "", f"![loss vs tokens]({PLOT})", "",
             "| parent | from step | steps | tokens | final val loss | test loss | run |", "|---" * 7 + "|"]
    for row in rows(runs):
        lines.append("| " + " | ".join("-" if v is None else f"{v:.4f}" if isinstance(v, float) else str(v)
                                       for v in row.values()) + " |")
    return "\n".join(lines) + "\n"


def plot(runs: Sequence[Run], path: Path) -> Path:
    """Val loss vs tokens: each stable run (a parent, or any run that is not a branch) as a line, each branch as a
    line from where it left its parent, its end as a point; the ends of one parent's branches joined."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    by_dir = {_where(r.dir): r for r in runs}
    ends: dict[str, list[tuple[float, float]]] = {}
    parents = {id(p) for r in runs if is_branch(r) and (p := parent_of(r, by_dir)) is not None}
    for r in runs:
        x, y = val_curve(r)
        if not is_branch(r):
            if x:
                stable = id(r) in parents
                ax.plot(x, y, lw=1.6, color="black" if stable else "gray", ls="-" if stable else ":",
                        label=f"{r.dir.name}" + (" (parent)" if stable else ""))
            continue
        parent = r.get("parent")
        start = branch_start(r, parent_of(r, by_dir))
        xs, ys = ([start[0]] if start else []) + x, ([start[1]] if start else []) + y
        if xs:
            line = ax.plot(xs, ys, lw=1.0, alpha=0.8, label=f"branch from step {parent['step']}")[0]
            ax.scatter(xs[-1:], ys[-1:], color=line.get_color(), zorder=3)
            ends.setdefault(parent["run_dir"], []).append((xs[-1], ys[-1]))
    for points in ends.values():
        points.sort()
        ax.plot([p[0] for p in points], [p[1] for p in points], ls="--", color="gray", lw=0.8)
    ax.set(xlabel="tokens", ylabel="val loss", title="decay branches: loss at each budget")
    if ax.lines:
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
