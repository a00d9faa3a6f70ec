"""S5 round 3's figure, from the committed runs: the residual stream's RMS after each block at the last logged step,
relative to that after the first block (the premise's r_l / r_1), per placement and lr, each seed a line, with
sqrt(l) (the growth of equal, independent increments). Drawn apart from the pre-registered analysis, whose file
stays as committed before the runs.

    python -m experiments.studies.s5_precision.r3_peri_recipe.plot     # writes depth_profile.png here
"""

from __future__ import annotations

import math
from pathlib import Path

from experiments.common.plots import pyplot, save
from experiments.common.study import load
from experiments.studies.s5_precision.r3_peri_recipe import analyze as r3
from experiments.studies.s10_mixln.r2_lns.analyze import resid_layer

HERE = Path(__file__).parent


def main() -> Path:
    runs = load(HERE, [], r3.metric)
    plt = pyplot()
    fig, axes = plt.subplots(1, len(r3.LRS), figsize=(10, 3.8), sharey=True)
    for ax, lr in zip(axes, r3.LRS, strict=True):
        for i, placement in enumerate(r3.PLACEMENTS):
            for k, r in enumerate(x for x in runs if x["placement"] == placement and x["lr"] == lr):
                last = {resid_layer(key): pts[-1][1] for key, pts in r["curves"].items() if pts}
                depth = sorted(last)
                ax.plot([d + 1 for d in depth], [last[d] / last[0] for d in depth], color=f"C{i}", alpha=0.7,
                        label=f"{placement}-LN" if k == 0 else None)
        ls = range(1, r3.DEPTH + 1)
        ax.plot(ls, [math.sqrt(n) for n in ls], color="grey", ls=":", label="sqrt(l)")
        ax.set(xlabel="block l", title=f"lr {lr:g}, {r3.STEPS} steps", yscale="log")
    axes[0].set_ylabel("residual RMS after block l / after block 1")
    axes[0].legend(fontsize=8)
    out = HERE / "depth_profile.png"
    save(fig, out)
    return out


if __name__ == "__main__":
    print(main())
