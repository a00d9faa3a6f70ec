"""S5 round 3 (pre-registered): Peri-LN in the setting closest to its paper's that this machine runs,
premise gate first. Rounds 1-2 ran Peri-LN with GPT-2's depth-scaled init, where Pre-LN's stream did not grow
faster than sqrt(L) (the premise absent), and the previous review asked for Peri-LN's own recipe. Kim et al. 2025
train Pre-LN and Peri-LN LLaMA-style models (RMSNorm, no biases) with every weight drawn N(0, 0.02), without GPT-2's
depth scaling of the residual projections, and report Peri-LN's stream growing less and its loss lower. S10 round 4
found the premise present in that init: with the plain init, width 48 and 12 layers, Pre-LN's stream grew 1.10-1.47x
sqrt(L). This round uses that setting. The rules below are committed before any run; the data commit cites this one.

Setting: configs/experiment/s10_mixln.yaml (RMSNorm, 400-step base, last checkpoint) with dim 48, 12 layers,
model.depth_scaled_init=false (every linear N(0, 0.02)), STEPS steps (warmup 100), the residual RMS after every
block logged; placement {pre, peri} x lr {1e-3, 3e-3} (Peri-LN's paper reports it tolerating larger lrs) x seeds
{0, 1, 2}: 12 runs, run.sh beside this file. Not the paper's scale (400M-3.2B parameters, 30B tokens) or data.

    bash experiments/studies/s5_precision/r3_peri_recipe/run.sh

Compute estimate (S10's 12-layer runs at ~7,000 tokens/s per process): 1,000 steps x 1,024 tokens, ~150 s a run,
12 runs ~30 min on one core.

Measures per run: final val loss (minillm.outcome.final_loss); depth growth r_L / r_1 (the residual RMS after the
last block over that after the first, at the last logged step). Each placement's lr: the grid point with the lower
seed-mean val loss (chosen on these runs, as S5 round 2's stage 1 did on one seed).
Precondition (the gate, read first; experiments.common.precondition stream_growth): Pre-LN's (r_L / r_1) / sqrt(L)
at least 1 at its chosen lr, per seed. Absent (or mixed): P1 and P2 read "premise absent at this scale".
Hypotheses (3 seeds, paired by seed, each placement at its chosen lr; 95% intervals, Holm across the two parts):
  P1 (Peri-LN keeps the stream from growing): Peri / Pre depth growth at most BOUNDS (ratio, log scale).
  P2 (Peri-LN trains at least as well): Peri - Pre val loss at most MARGIN.
  Each: "confirmed" when its interval clears the threshold, "not at this scale" when it lies wholly on the other
  side, "unresolved" when it crosses it.
Reported, not tested: both placements' losses at both lrs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from experiments.common import precondition as pre
from experiments.common import prereg
from experiments.common.study import Runs, analysis_main, mean, table
from experiments.studies.s10_mixln.r2_lns import analyze as lns
from minillm.outcome import final_loss

HERE = Path(__file__).parent
# --- fixed before the runs ---------------------------------------------------------------------------------
DEPTH, DIM, STEPS, SEEDS = 12, 48, 1000, (0, 1, 2)
LRS, PLACEMENTS = (1e-3, 3e-3), ("pre", "peri")
BOUNDS = 0.5  # Peri's depth growth at most half of Pre-LN's (S5 round 2's "bounds" rule, the 2x of round 1)
MARGIN = 0.02  # nats: the project's equivalence margin
TAG = "peri_recipe"


def metric(key: str) -> bool:
    return lns.resid_layer(key) is not None


def analyze(runs: Runs) -> tuple[dict, str]:
    runs = Runs(r for r in runs if TAG in (r.get("tags") or []) and r["n_layers"] == DEPTH)
    prereg.require(runs, "the residual RMS per block (layer/<i>/resid_rms)", lambda r: lns.depth_growth(r) is not None)
    val = {(p, lr): prereg.by_seed([r for r in runs if r["placement"] == p and r["lr"] == lr], final_loss)
           for p in PLACEMENTS for lr in LRS}
    growth = {(p, lr): prereg.by_seed([r for r in runs if r["placement"] == p and r["lr"] == lr], lns.depth_growth)
              for p in PLACEMENTS for lr in LRS}
    chosen = {p: min(LRS, key=lambda lr, p=p: mean(val[p, lr].values()) or math.inf) for p in PLACEMENTS}
    stream = pre.measure("stream_growth", {f"L={DEPTH}": [g / math.sqrt(DEPTH) for g in
                                                          growth["pre", chosen["pre"]].values()]},
                         "layer/<i>/resid_rms at the last logged step, this round's Pre-LN runs at their lr")
    peri, pre_ = ("peri", chosen["peri"]), ("pre", chosen["pre"])
    parts = pre.parts({"P1": (prereg.ratios(growth[peri], growth[pre_]), BOUNDS, "at most", True),
                       "P2": (prereg.diffs(val[peri], val[pre_]), MARGIN, "at most")})
    verdicts = {}
    for name, text in (("P1", "Peri / Pre depth growth"), ("P2", "Peri - Pre val loss")):
        word, why = prereg.verdict_line(name, parts["parts"][name], text)
        verdicts[name] = (pre.gate(word, {"status": "absent" if stream["status"] != "present" else "present"}),
                          why)
    rows = [[p, lr, len(val[p, lr]), mean(val[p, lr].values()), mean(growth[p, lr].values()),
             "chosen" if chosen[p] == lr else ""] for p in PLACEMENTS for lr in LRS]
    tab = table(["placement", "lr", "runs", "val loss", "depth growth r_L / r_1", "lr"], rows)
    vt = table(["hypothesis", "verdict", "numbers"], [[k, w, why] for k, (w, why) in verdicts.items()])
    md = (f"L = {DEPTH}, dim {DIM}, plain init, {STEPS} steps, seed means.\n\n{tab}\n\n{pre.line(stream)}\n\n"
          f"### Verdicts (rules fixed before the runs; {parts['text']})\n\n{vt}\n")
    return {"cells": {f"{p}/{lr:g}": {"val": val[p, lr], "growth": growth[p, lr]} for p in PLACEMENTS for lr in LRS},
            "chosen_lr": chosen, "verdicts": verdicts, "precondition": [stream], "holm": parts}, md


def main(argv: Sequence[str] | None = None) -> None:
    analysis_main(__doc__, HERE, metric, analyze, None, argv)


if __name__ == "__main__":
    main()
