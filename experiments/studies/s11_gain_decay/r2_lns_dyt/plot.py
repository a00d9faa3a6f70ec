"""S11 round 2's figure, from the committed runs: each seed's final val loss with and without decay per arm and lr
(a line per seed; the unigram loss named in the title), the paired differences the rules read with their threshold,
and the decayed parameter (LNS: the effective gain RMS; DyT: the mean alpha) with and without decay.
Drawn apart from the pre-registered analysis, whose file stays as it was committed before the runs.

    python -m experiments.studies.s11_gain_decay.r2_lns_dyt.plot     # writes decay.png here
"""

from __future__ import annotations

import json
from pathlib import Path

from experiments.common.plots import paired_differences, pyplot, save, seed_lines
from experiments.common.study import mean
from experiments.studies.s11_gain_decay.r2_lns_dyt.analyze import ARMS, COST, LRS, SEEDS, WHAT, arm, decayed, key
from minillm.outcome import final_loss

HERE = Path(__file__).parent


def label(a: str, lr: float, dec: bool) -> str:
    return f"{a} {lr:g}" + (" decay" if dec else "")


def main() -> Path:
    runs = [json.loads(line) for line in (HERE / "runs.jsonl").read_text().splitlines() if line.strip()]
    runs = [r for r in runs if "decay2" in (r.get("tags") or []) and arm(r)]
    params = json.loads((HERE / "params.json").read_text())
    cells = [label(a, lr, dec) for a in ARMS for lr in LRS for dec in (False, True)]
    loss = {s: {label(arm(r), r["lr"], decayed(r)): final_loss(r) for r in runs if r["seed"] == s} for s in SEEDS}
    plt = pyplot()
    fig, (left, middle, right) = plt.subplots(1, 3, figsize=(16, 4))
    unigram = mean(r["unigram_loss"] for r in runs if r.get("unigram_loss"))
    seed_lines(left, loss, cells, "final val loss (nats)", f"a line per seed (unigram loss {unigram:.2f})")
    left.tick_params(axis="x", labelsize=6, labelrotation=30)
    paired_differences(middle, loss, [(label(a, lr, True), label(a, lr, False), COST, f"H {a} {lr:g}")
                                      for a in ARMS for lr in LRS])
    middle.set_xticks(range(len(ARMS) * len(LRS)), [f"{a} lr {lr:g}:\ndecay - none" for a in ARMS for lr in LRS],
                      fontsize=7)
    for i, c in enumerate(cells):
        vals = [params[key(r)] for r in runs if label(arm(r), r["lr"], decayed(r)) == c and key(r) in params]
        right.scatter([i] * len(vals), vals, color="C3" if c.endswith("decay") else "C0", s=14, alpha=0.7)
    right.set(ylabel="decayed parameter (last checkpoint)",
              title=f"lns: {WHAT['lns']}; dyt: {WHAT['dyt']}")
    right.set_xticks(range(len(cells)), cells, fontsize=6, rotation=30)
    out = HERE / "decay.png"
    save(fig, out)
    return out


if __name__ == "__main__":
    print(main())
