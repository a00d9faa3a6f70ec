"""S12 round 2's figure, from the committed runs and results: per arm (standard: S3 rounds 4-5's runs; muP: this
round's), the final val loss against the lr at each width (a dot per seed, the line through the seed means), and
the best lr against the width per arm (a dot per seed, the line through the seeds' geometric mean). Drawn apart from
the pre-registered analysis.

    python -m experiments.studies.s12_mup_transfer.r2_transfer_400.plot     # writes transfer.png here
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from experiments.common.plots import pyplot, save
from experiments.common.study import mean
from experiments.studies.s12_mup_transfer.r1_transfer.plot import best_lr_panel
from experiments.studies.s12_mup_transfer.r2_transfer_400.analyze import LRS, SEEDS, WIDTHS, arm_of, standard_runs
from minillm.outcome import loss_for_comparison

HERE = Path(__file__).parent
COLORS = {w: f"C{i}" for i, w in enumerate(WIDTHS)}


def main() -> Path:
    mup = [json.loads(line) for line in (HERE / "runs.jsonl").read_text().splitlines() if line.strip()]
    runs = {"standard": list(standard_runs()), "mup": [r for r in mup if arm_of(r) == "mup"]}
    best = json.loads((HERE / "results.json").read_text())["best_log10_lr"]
    plt = pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(12.6, 4), sharey=False)
    for ax, arm in zip(axes, SEEDS, strict=False):
        for w in WIDTHS:
            cells = [[loss_for_comparison(r) for r in runs[arm] if r["dim"] == w and math.isclose(r["lr"], lr)]
                     for lr in LRS]
            for lr, vals in zip(LRS, cells, strict=True):
                ax.scatter([lr] * len(vals), vals, color=COLORS[w], s=10, alpha=0.5)
            ax.plot(LRS, [mean(v) if v else None for v in cells], color=COLORS[w], label=f"width {w}")
        ax.set(xscale="log", xlabel="lr", ylabel="final val loss (nats; diverged at ln V)",
               title=f"{arm} ({len(SEEDS[arm])} seeds)")
        ax.set_xticks(LRS, [f"{lr:g}" for lr in LRS])
        ax.minorticks_off()
        ax.legend(fontsize=7)
    best_lr_panel(axes[-1], best, SEEDS, WIDTHS, spread=0.03)
    out = HERE / "transfer.png"
    save(fig, out)
    return out


if __name__ == "__main__":
    print(main())
