"""S8 round 3's figure, from the committed runs: each seed's final val loss per arm (a line per seed across the arms;
the unigram loss, far above, named in the title), the paired differences the rules read with their thresholds, and
each DyT run's tanh saturation at the end of training (the 1% premise line dotted).
Drawn apart from the pre-registered analysis, whose file stays as it was committed before the runs.

    python -m experiments.studies.s8_dyt.r3_budget_per_site.plot     # writes budget.png here
"""

from __future__ import annotations

import json
from pathlib import Path

from experiments.common.plots import paired_differences, pyplot, save, seed_lines
from experiments.common.study import mean
from experiments.studies.s8_dyt.r3_budget_per_site.analyze import ARMS, PARITY, PER_SITE, SEEDS, STEPS, arm, key
from minillm.outcome import final_loss

HERE = Path(__file__).parent


def main() -> Path:
    runs = [json.loads(line) for line in (HERE / "runs.jsonl").read_text().splitlines() if line.strip()]
    runs = [r for r in runs if "budget" in (r.get("tags") or []) and r.get("max_steps") == STEPS]
    saturation = json.loads((HERE / "saturation.json").read_text())
    plt = pyplot()
    fig, (left, middle, right) = plt.subplots(1, 3, figsize=(15, 4))
    loss = {s: {arm(r): final_loss(r) for r in runs if r["seed"] == s} for s in SEEDS}
    unigram = mean(r["unigram_loss"] for r in runs if r.get("unigram_loss"))
    seed_lines(left, loss, ARMS, "final val loss (nats)",
               f"{STEPS} steps, a line per seed (unigram loss {unigram:.2f})")
    paired_differences(middle, loss, (("uniform", "rmsnorm", PARITY, "D3"), ("attn 1.0", "uniform", -PER_SITE, "D4a"),
                                      ("attn 2.0", "uniform", -PER_SITE, "D4b")))
    dyt = ARMS[1:]
    for i, a in enumerate(dyt):
        vals = [100 * saturation[key(r)] for r in runs if arm(r) == a and key(r) in saturation]
        right.scatter([i] * len(vals), vals, color="C0", s=16, alpha=0.7)
        right.plot([i - 0.2, i + 0.2], [mean(vals)] * 2, color="C0")
    right.axhline(1.0, color="grey", lw=0.8, ls=":", label="premise: 1% of the inputs saturate")
    right.set(ylabel="% of DyT inputs with |alpha x| >= 1", title="tanh saturation at the end (last checkpoint)")
    right.set_xticks(range(len(dyt)), dyt)
    right.legend(fontsize=7)
    out = HERE / "budget.png"
    save(fig, out)
    return out


if __name__ == "__main__":
    print(main())
