"""S11 round 1's figure, from the committed results: per lr and gain storage, each seed's val-loss difference decay
- no decay with the ±0.02-nat margin, and the effective gain RMS with and without decay. Drawn apart from the
pre-registered analysis, whose file stays as it was committed before the runs.

    python -m experiments.studies.s11_gain_decay.r1_prereg.plot     # writes gains.png here
"""

from __future__ import annotations

import json
from pathlib import Path

from experiments.common.plots import pyplot, save
from experiments.studies.s11_gain_decay.r1_prereg.analyze import COST, LRS, SEEDS

HERE = Path(__file__).parent


def main() -> Path:
    diffs = json.loads((HERE / "results.json").read_text())["differences"]
    gains = json.loads((HERE / "gains.json").read_text())
    plt = pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    cells = [(lr, zc) for lr in LRS for zc in (False, True)]
    names = [f"lr {lr:g}\n{'zero-centered' if zc else 'standard'}" for lr, zc in cells]
    for i, (lr, zc) in enumerate(cells):
        d = diffs[f"{lr:g}/{'zc' if zc else 'std'}"]
        left.scatter([i] * len(d), d, color="C3" if not zc else "C0", s=16)
        left.hlines(sum(d) / len(d), i - 0.25, i + 0.25, color="black")
        for j, dec in enumerate(("nodecay", "decay")):
            vals = [gains[f"lr{lr:g}_{dec}_{'zc' if zc else 'std'}_seed{s}"] for s in SEEDS]
            right.scatter([i + (j - 0.5) * 0.3] * len(vals), vals, color="grey" if dec == "nodecay" else "C1", s=14,
                          label=("no decay" if dec == "nodecay" else "decay") if i == 0 else None)
    for sign in (1, -1):
        left.axhline(sign * COST, color="grey", ls=":", lw=0.8)
    left.axhline(0, color="black", lw=0.5)
    left.set(xticks=range(len(cells)), xticklabels=names, ylabel="val loss, decay - no decay (nats)",
             title="each seed (bar: mean); dotted: the ±0.02 margin")
    right.set(xticks=range(len(cells)), xticklabels=names, ylabel="effective gain RMS (last checkpoint)",
              title="what decay does to the gains")
    right.legend(fontsize=8)
    out = HERE / "gains.png"
    save(fig, out)
    return out


if __name__ == "__main__":
    print(main())
