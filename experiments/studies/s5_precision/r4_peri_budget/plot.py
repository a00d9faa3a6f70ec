"""S5 round 4's figure, from the committed runs, in three panels: the pilot's val loss against lr per placement (the
chosen lr marked); the judged runs' residual RMS after each block over that after the first (the premise's
r_l / r_1), each seed a line, with sqrt(l); and each block's max |h| / median |h| at the end, each seed a line,
with the 100x of massive activations. Drawn apart from the pre-registered analysis, whose file stays as committed.

    python -m experiments.studies.s5_precision.r4_peri_budget.plot     # writes peri_budget.png here
"""

from __future__ import annotations

import math
from pathlib import Path

from experiments.common.plots import pyplot, save
from experiments.common.study import load
from experiments.studies.s5_precision.r4_peri_budget import analyze as r4
from minillm.outcome import final_loss

HERE = Path(__file__).parent


def _profile(run: dict, name: str) -> list[float | None]:
    return [r4._last(run, i, name) for i in range(r4.DEPTH)]


def main() -> Path:
    runs = [r for r in load(HERE, [], r4.metric) if r4.TAG in (r.get("tags") or [])]
    chosen, _ = r4.pilot_choice(runs)
    plt = pyplot()
    fig, (loss_ax, growth_ax, spike_ax) = plt.subplots(1, 3, figsize=(13, 3.9))
    blocks = range(1, r4.DEPTH + 1)
    for i, placement in enumerate(r4.PLACEMENTS):
        label, color = f"{placement}-LN", f"C{i}"
        pilot = {r["lr"]: final_loss(r) for r in runs if r["placement"] == placement and r["seed"] == r4.PILOT_SEED}
        lrs = sorted(pilot)
        loss_ax.plot(lrs, [pilot[lr] for lr in lrs], "o-", color=color, label=label)
        if pilot.get(chosen[placement]) is not None:
            loss_ax.plot([chosen[placement]], [pilot[chosen[placement]]], "*", color=color, ms=14)
        judged = [r for r in runs if r["placement"] == placement and r["seed"] in r4.JUDGED_SEEDS]
        for k, r in enumerate(judged):
            rms, top, median = (_profile(r, m) for m in r4.KEPT)
            first = {"label": f"{label}, lr {chosen[placement]:g}"} if k == 0 else {}
            growth_ax.plot(blocks, [v / rms[0] for v in rms], color=color, alpha=0.7, **first)
            spike_ax.plot(blocks, [t / m for t, m in zip(top, median, strict=True)], color=color, alpha=0.7, **first)
    loss_ax.set(xscale="log", xlabel="lr", ylabel="final val loss",
                title=f"stage 1: the pilot (seed {r4.PILOT_SEED}); * chosen")
    loss_ax.set_xticks(r4.LRS, [f"{lr:g}" for lr in r4.LRS])
    loss_ax.minorticks_off()
    growth_ax.plot(blocks, [math.sqrt(n) for n in blocks], color="grey", ls=":", label="sqrt(l)")
    growth_ax.set(xlabel="block l", ylabel="residual RMS after block l / after block 1", yscale="log",
                  title=f"stage 2: seeds {', '.join(map(str, r4.JUDGED_SEEDS))}, {r4.STEPS} steps")
    spike_ax.axhline(100, color="grey", ls=":", label="massive activations (100x)")
    spike_ax.set(xlabel="block l", ylabel="max |h| / median |h| after block l", yscale="log",
                 title="stage 2: max against median |h|")
    for ax, where in ((loss_ax, "best"), (growth_ax, "upper left"), (spike_ax, "lower right")):
        ax.legend(fontsize=8, loc=where)
    out = HERE / "peri_budget.png"
    save(fig, out)
    return out


if __name__ == "__main__":
    print(main())
