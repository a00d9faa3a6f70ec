"""S10 round 4's figure, from the committed runs: each seed's final val loss per variant (a line per seed; the unigram
loss named in the title), the paired differences B1 and B2 read with their threshold, and the layer drop of every
block per variant (seed mean, each seed's curve faint): the premise is Pre-LN's deep half going idle.
Drawn apart from the pre-registered analysis, whose file stays as it was committed before the runs.

    python -m experiments.studies.s10_mixln.r4_lns_budget.plot     # writes budget.png here
"""

from __future__ import annotations

import json
from pathlib import Path

from experiments.common.plots import paired_differences, pyplot, save, seed_lines
from experiments.common.study import mean
from experiments.studies.s10_mixln.r1_mixln import analyze as s10
from experiments.studies.s10_mixln.r2_lns import analyze as lns
from experiments.studies.s10_mixln.r4_lns_budget.analyze import DEPTH, GAP, SEEDS, STEPS, VARIANTS
from minillm.outcome import final_loss

HERE = Path(__file__).parent


def main() -> Path:
    runs = [json.loads(line) for line in (HERE / "runs.jsonl").read_text().splitlines() if line.strip()]
    runs = [r for r in runs if r.get("n_layers") == DEPTH and "plain" in (r.get("tags") or [])]
    drops = json.loads((HERE / "layer_drop.json").read_text())
    plt = pyplot()
    fig, (left, middle, right) = plt.subplots(1, 3, figsize=(15, 4))
    loss = {s: {lns.variant(r): final_loss(r) for r in runs if r["seed"] == s} for s in SEEDS}
    unigram = mean(r["unigram_loss"] for r in runs if r.get("unigram_loss"))
    seed_lines(left, loss, VARIANTS, "final val loss (nats)",
               f"{STEPS} steps, a line per seed (unigram loss {unigram:.2f})")
    paired_differences(middle, loss, (("pre", "pre+LNS", GAP, "B1"), ("mix", "pre+LNS", GAP, "B2"),
                                      ("pre", "mix", None, "reported")))
    for j, v in enumerate(VARIANTS):
        curves = [drops[s10.key(r) + "_" + v]["drop"] for r in runs
                  if lns.variant(r) == v and s10.key(r) + "_" + v in drops]
        for c in curves:
            right.plot(range(1, DEPTH + 1), c, color=f"C{j}", alpha=0.25, lw=0.7)
        if curves:
            right.plot(range(1, DEPTH + 1), [mean(c[i] for c in curves) for i in range(DEPTH)], "o-", color=f"C{j}",
                       ms=3, label=f"{v} (seed mean)")
    right.axvline(DEPTH / 2 + 0.5, color="grey", lw=0.6, ls=":")
    right.set_yscale("log")  # every drop here is positive (layer_drop.json: 0.006 to 1.8 nats)
    right.set(xlabel="block dropped (1 = first)", ylabel="val loss increase (nats)",
              title="layer drop: the premise is Pre-LN's deep half idle")
    right.legend(fontsize=7)
    out = HERE / "budget.png"
    save(fig, out)
    return out


if __name__ == "__main__":
    print(main())
