"""The report's decay branches: runs started with ``decay_from=`` (their summary.json names a ``parent``), each the
WSD run of one budget, shown against the tokens they trained on: ``loss_vs_tokens.png`` (the stable runs' and
each branch's val loss curve, each branch's end marked, the ends joined: loss at each budget from one stable run)
and a table in report.md."""

from __future__ import annotations

import math
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
    by_dir = {str(r.dir): r for r in runs}
    ends: dict[str, list[tuple[float, float]]] = {}
    parents = {r.get("parent")["run_dir"] for r in runs if is_branch(r)}
    for r in runs:
        x, y = val_curve(r)
        if not is_branch(r):
            if x:
                stable = str(r.dir) in parents
                ax.plot(x, y, lw=1.6, color="black" if stable else "gray", ls="-" if stable else ":",
                        label=f"{r.dir.name}" + (" (parent)" if stable else ""))
            continue
        parent = r.get("parent")
        before = by_dir.get(parent["run_dir"])
        per_step = tokens_per_step(r)
        start = [(x0, y0) for x0, y0 in zip(*val_curve(before), strict=True)
                 if per_step and x0 <= parent["step"] * per_step][-1:] if before else []
        xs, ys = [p[0] for p in start] + x, [p[1] for p in start] + y
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
