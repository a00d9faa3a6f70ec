"""S11 round 3's figure, from the committed runs: each seed's final val loss with and without decay per lr (a line
per seed; the unigram loss named in the title), the paired differences the rules read with their threshold, and
the mean DyT alpha with and without decay. Drawn apart from the pre-registered analysis, whose file stays as it
was committed before the runs.

    python -m experiments.studies.s11_gain_decay.r3_dyt_trained.plot     # writes decay.png here
"""

from __future__ import annotations

import json
from pathlib import Path

from experiments.common.plots import paired_differences, pyplot, save, seed_lines
from experiments.common.study import mean
from experiments.studies.s11_gain_decay.r2_lns_dyt.analyze import decayed
from experiments.studies.s11_gain_decay.r3_dyt_trained.analyze import COST, LRS, SEEDS, TAG, key
from minillm.outcome import final_loss

HERE = Path(__file__).parent


def label(lr: float, dec: bool) -> str:
    return f"lr {lr:g}" + (" decay" if dec else "")


def main() -> Path:
    runs = [json.loads(line) for line in (HERE / "runs.jsonl").read_text().splitlines() if line.strip()]
    runs = [r for r in runs if TAG in (r.get("tags") or [])]
    params = json.loads((HERE / "params.json").read_text())
    cells = [label(lr, dec) for lr in LRS for dec in (False, True)]
    loss = {s: {label(r["lr"], decayed(r)): final_loss(r) for r in runs if r["seed"] == s} for s in SEEDS}
    plt = pyplot()
    fig, (left, middle, right) = plt.subplots(1, 3, figsize=(14, 4))
    unigram = mean(r["unigram_loss"] for r in runs if r.get("unigram_loss"))
    seed_lines(left, loss, cells, "final val loss (nats)", f"DyT, unit-scale embeddings (unigram loss {unigram:.2f})")
    paired_differences(middle, loss, [(label(lr, True), label(lr, False), COST, f"H lr {lr:g}") for lr in LRS])
    middle.set_xticks(range(len(LRS)), [f"lr {lr:g}:\ndecay - none" for lr in LRS], fontsize=8)
    for i, c in enumerate(cells):
        vals = [params[key(r)] for r in runs if label(r["lr"], decayed(r)) == c and key(r) in params]
        right.scatter([i] * len(vals), vals, color="C3" if c.endswith("decay") else "C0", s=14, alpha=0.7)
    right.set(ylabel="mean DyT alpha (last checkpoint)", title="alpha with and without decay")
    right.set_xticks(range(len(cells)), cells, fontsize=8)
    out = HERE / "decay.png"
    save(fig, out)
    return out


if __name__ == "__main__":
    print(main())
