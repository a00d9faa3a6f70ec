"""S3 round 4's figure, from the committed runs: the final val loss against the lr for each width (a dot per seed,
the line through the seed means, the unigram loss dotted), one panel per norm; and the best lr (the parabola
vertex of the pre-registered analysis) against the width, a dot per seed, the line through the seed means. Drawn
apart from the pre-registered analysis, whose file stays as it was committed before the runs.

    python -m experiments.studies.s3_lr_sensitivity.r4_width_transfer.plot     # writes width_transfer.png here
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path

from experiments.common.plots import pyplot, save
from experiments.common.study import mean
from experiments.studies.s3_lr_sensitivity.r4_width_transfer.analyze import LRS, NORMS, SEEDS, WIDTHS
from minillm.outcome import loss_for_comparison

HERE = Path(__file__).parent


def loss_panel(ax, runs: list[dict], lrs: Sequence[float], title: str) -> None:
    """The final val loss of ``runs`` against the lr for each width: a dot per seed, the line through the seed means,
    the unigram loss dotted."""
    colors = {w: f"C{i}" for i, w in enumerate(WIDTHS)}
    for w in WIDTHS:
        cells = [[loss_for_comparison(r) for r in runs if r["dim"] == w and math.isclose(r["lr"], lr)] for lr in lrs]
        for lr, vals in zip(lrs, cells, strict=True):
            ax.scatter([lr] * len(vals), vals, color=colors[w], s=10, alpha=0.5)
        ax.plot(lrs, [mean(v) if v else None for v in cells], color=colors[w], label=f"width {w}")
    ax.axhline(mean(r["unigram_loss"] for r in runs if r.get("unigram_loss")), color="grey", lw=0.8, ls=":",
               label="unigram loss")
    ax.set(xscale="log", xlabel="lr", ylabel="final val loss (nats; a diverged run at ln V)", title=title)
    ax.set_xticks(lrs, [f"{lr:g}" for lr in lrs])
    ax.minorticks_off()
    ax.legend(fontsize=7)


def main(folder: Path = HERE, lrs: tuple[float, ...] = LRS) -> Path:
    """The figure of a round's committed runs and results (round 5 draws its own with its grid)."""
    best = json.loads((folder / "results.json").read_text())["best_log10_lr"]
    runs = [json.loads(line) for line in (folder / "runs.jsonl").read_text().splitlines() if line.strip()]
    plt = pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    for ax, norm in zip(axes[:2], NORMS, strict=True):
        loss_panel(ax, [r for r in runs if r["norm"] == norm], lrs, norm)
    right = axes[2]
    for color, norm in zip(("C0", "C3"), NORMS, strict=True):
        per_width = [[10 ** best[f"{norm}/{w}/{s}"] for s in SEEDS if f"{norm}/{w}/{s}" in best] for w in WIDTHS]
        for w, vals in zip(WIDTHS, per_width, strict=True):
            right.scatter([w] * len(vals), vals, color=color, s=12, alpha=0.6)
        right.plot(WIDTHS, [10 ** mean(math.log10(v) for v in vals) for vals in per_width], color=color, label=norm)
    right.set(xscale="log", yscale="log", xlabel="width (model.dim)", ylabel="best lr (parabola vertex)",
              title="does the best lr move with width?")
    right.set_xticks(WIDTHS, [str(w) for w in WIDTHS])
    right.minorticks_off()
    right.legend(fontsize=7)
    out = folder / "width_transfer.png"
    save(fig, out)
    return out


if __name__ == "__main__":
    print(main())
