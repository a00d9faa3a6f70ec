"""S4 round 5's figure, from the committed runs: each run's value (final val loss in eval mode, a failed run at
ln V) per arm at batch 4 unclipped and clipped and at batch 64, a dot per seed and a bar at the seed mean. Drawn
apart from the pre-registered analysis.

    python -m experiments.studies.s4_batchnorm.r5_powernorm_parts.plot     # writes parts.png here
"""

from __future__ import annotations

import json
from pathlib import Path

from experiments.common.plots import pyplot, save
from experiments.common.study import mean
from experiments.studies.s4_batchnorm.r5_powernorm_parts.analyze import ARMS, arm, clipped, entered
from minillm.outcome import failed_of

HERE = Path(__file__).parent
PANELS = ((4, False, "batch 4, unclipped (the released recipe)"), (4, True, "batch 4, clipped at 1.0"),
          (64, False, "batch 64, unclipped"))


def main() -> Path:
    runs = [json.loads(line) for line in (HERE / "runs.jsonl").read_text().splitlines() if line.strip()]
    plt = pyplot()
    fig, axes = plt.subplots(1, len(PANELS), figsize=(13, 4), sharey=True)
    for ax, (batch, clip, title) in zip(axes, PANELS, strict=True):
        for i, a in enumerate(ARMS):
            mine = [r for r in runs if arm(r) == a and r["batch_size"] == batch and clipped(r) == clip]
            if not mine:
                continue
            for r in mine:
                ax.scatter(i + 0.08 * (r["seed"] - 2), entered(r), s=14, color="C3" if failed_of(r) else "C0")
            ax.hlines(mean(entered(r) for r in mine), i - 0.3, i + 0.3, color="k", lw=1)
        ax.set_xticks(range(len(ARMS)), ARMS)
        ax.set(title=title, ylabel="final val loss (nats; failed at ln V, red)")
    save(fig, HERE / "parts.png")
    return HERE / "parts.png"


if __name__ == "__main__":
    print(main())
