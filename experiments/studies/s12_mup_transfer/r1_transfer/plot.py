"""S12 round 1's figure, from the committed runs and results: per arm, the final val loss against the lr at each
width (a dot per seed, the line through the seed means, the unigram loss dotted), and the best lr against the width
per arm (a dot per seed, the line through the seeds' geometric mean). Drawn apart from the pre-registered analysis.

    python -m experiments.studies.s12_mup_transfer.r1_transfer.plot     # writes transfer.png here
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from experiments.common.plots import pyplot, save
from experiments.common.study import mean
from experiments.studies.s12_mup_transfer.r1_transfer.analyze import ARMS, LRS, SEEDS, WIDTHS, arm_of
from minillm.outcome import loss_for_comparison

HERE = Path(__file__).parent
COLORS = {w: f"C{i}" for i, w in enumerate(WIDTHS)}


def best_lr_panel(ax, best: dict, seeds: dict[str, tuple[int, ...]], widths: tuple[int, ...],
                  spread: float = 0.0) -> None:
    """The best lr against the width per arm: a dot per seed (``best``: results.json's "arm/width/seed" -> log10
    lr*; dots of arm i shifted by a factor 1 + spread * (2i - 1) to keep two arms apart), a line through the seeds'
    geometric mean."""
    for i, arm in enumerate(seeds):
        per_width = [[10 ** best[f"{arm}/{w}/{s}"] for s in seeds[arm] if f"{arm}/{w}/{s}" in best] for w in widths]
        for w, vals in zip(widths, per_width, strict=True):
            ax.scatter([w * (1 + spread * (2 * i - 1))] * len(vals), vals, color=f"C{i}", s=12, alpha=0.6)
        ax.plot(widths, [10 ** mean(math.log10(v) for v in vals) if vals else None for vals in per_width],
                color=f"C{i}", label=arm)
    ax.set(xscale="log", yscale="log", xlabel="width (model.dim)", ylabel="best lr (per seed)",
           title="does the best lr transfer?")
    ax.set_xticks(widths, [str(w) for w in widths])
    ax.minorticks_off()
    ax.legend(fontsize=7)


def main() -> Path:
    runs = [json.loads(line) for line in (HERE / "runs.jsonl").read_text().splitlines() if line.strip()]
    best = json.loads((HERE / "results.json").read_text())["best_log10_lr"]
    arms = [a for a in ARMS if any(arm_of(r) == a for r in runs)]
    plt = pyplot()
    fig, axes = plt.subplots(1, len(arms) + 1, figsize=(4.2 * (len(arms) + 1), 4))
    for ax, a in zip(axes, arms, strict=False):
        mine = [r for r in runs if arm_of(r) == a]
        for w in WIDTHS:
            cells = [[loss_for_comparison(r) for r in mine if r["dim"] == w and math.isclose(r["lr"], lr)]
                     for lr in LRS]
            for lr, vals in zip(LRS, cells, strict=True):
                ax.scatter([lr] * len(vals), vals, color=COLORS[w], s=10, alpha=0.5)
            ax.plot(LRS, [mean(v) if v else None for v in cells], color=COLORS[w], label=f"width {w}")
        ax.axhline(mean(r["unigram_loss"] for r in mine if r.get("unigram_loss")), color="grey", lw=0.8, ls=":",
                   label="unigram loss")
        ax.set(xscale="log", xlabel="lr", ylabel="final val loss (nats; diverged at ln V)", title=a)
        ax.set_xticks(LRS, [f"{lr:g}" for lr in LRS])
        ax.minorticks_off()
        ax.legend(fontsize=7)
    best_lr_panel(axes[-1], best, {a: SEEDS for a in arms}, WIDTHS)
    out = HERE / "transfer.png"
    save(fig, out)
    return out


if __name__ == "__main__":
    print(main())
