"""S3 round 4 (pre-registered): does the best learning rate transfer across width, and does the norm
change it? With the standard parametrization and AdamW the best lr falls as the model widens (the premise of muP;
Everett et al. 2024 report it per parametrization); rounds 1-2 measured sensitivity at one width only. The rules
below are committed before any run; the data commit cites this one.

Setting: configs/experiment/s3_lr_sensitivity.yaml (4 layers, 4 heads, 400 steps), z-loss 0, no QK-norm, width
(model.dim) {32, 64, 128, 256} x lr {1e-3, 3e-3, 1e-2, 3e-2, 1e-1} x norm {layernorm, rmsnorm} x seeds {0, 1, 2}:
120 runs.

    python train.py -m experiment=s3_lr_sensitivity model.dim=32,64,128,256 model.qk_norm=none module.z_loss=0 \\
        optimizer.lr=1e-3,3e-3,1e-2,3e-2,1e-1 seed=0,1,2 hydra/launcher=joblib hydra.launcher.n_jobs=2 \\
        hydra.sweep.dir=logs/s3_lr_sensitivity/multiruns/width
    python -m experiments.studies.s3_lr_sensitivity.r4_width_transfer.analyze logs/s3_lr_sensitivity/multiruns/width

Compute estimate (2-core CPU, two runs side by side): ~10 s a run at dim 32, ~20 s at 64 (round 1), ~50 s at 128,
~4 min at 256 (3.2M parameters, from S7's 2.6M-parameter runs): 30 runs per width, ~2 h in all.

Measures: per norm, width and seed, the best lr lr* = the vertex of the parabola through the best grid lr and its
two neighbours on log10(lr) (minillm.outcome.loss_for_comparison: a diverged run counts as ln V); per norm and seed,
the transfer slope = the least-squares slope of log10(lr*) against log2(width): how many decades the best lr moves
per doubling of the width.
Precondition (fixed before the runs): the best lr is bracketed (not at either end of the grid) in every cell;
reported per norm; an unbracketed norm reads "premise absent at this scale" (its lr* is then a grid edge).
Hypotheses (3 seeds; each read with its 95% interval; Holm across T1 layernorm, T1 rmsnorm, T2):
  T1 (per norm; the best lr does not transfer under the standard parametrization): slope at most -MOVES.
  T2 (the norm does not change the transfer): LayerNorm's slope - RMSNorm's, paired by seed, within +-SAME: both
     one-sided readings hold: confirmed; either fails: not at this scale; else unresolved.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from experiments.common import precondition as pre
from experiments.common import prereg
from experiments.common.study import Runs, analysis_main, mean, table
from minillm.outcome import loss_for_comparison

HERE = Path(__file__).parent
# --- fixed before the runs ---------------------------------------------------------------------------------
WIDTHS, LRS, NORMS, SEEDS = (32, 64, 128, 256), (1e-3, 3e-3, 1e-2, 3e-2, 1e-1), ("layernorm", "rmsnorm"), (0, 1, 2)
MOVES = 0.1  # decades of lr per doubling of width (a factor 1.26)
SAME = 0.1  # decades per doubling


def best_log_lr(losses: Sequence[float], lrs: Sequence[float] | None = None) -> tuple[float, bool]:
    """(log10 of the best lr, bracketed): the vertex of the parabola through the best grid point and its two
    neighbours on log10(lr) (the grid ``lrs``, default this round's LRS); a grid edge, unbracketed, when the best
    point is one."""
    xs = [math.log10(lr) for lr in (LRS if lrs is None else lrs)]
    i = min(range(len(losses)), key=lambda k: losses[k])
    if i in (0, len(losses) - 1):
        return xs[i], False
    (x0, x1, x2), (y0, y1, y2) = xs[i - 1:i + 2], losses[i - 1:i + 2]
    den = (x1 - x0) * (y1 - y2) - (x1 - x2) * (y1 - y0)
    num = (x1 - x0) ** 2 * (y1 - y2) - (x1 - x2) ** 2 * (y1 - y0)
    return (x1 - 0.5 * num / den if den else x1), True


def slope(xs: Sequence[float], ys: Sequence[float]) -> float:
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)


def analyze(runs: Runs) -> tuple[dict, str]:
    runs = Runs(r for r in runs if r.get("qk_norm") in (None, "none") and not r.get("z_loss"))
    best, bracketed, slopes = {}, {n: [] for n in NORMS}, {n: {} for n in NORMS}
    for n in NORMS:
        for s in SEEDS:
            points = []
            for w in WIDTHS:
                cell = {r["lr"]: loss_for_comparison(r) for r in runs
                        if r["norm"] == n and r["dim"] == w and r["seed"] == s}
                if len(cell) < len(LRS):
                    continue
                x, ok = best_log_lr([cell[lr] for lr in sorted(cell)])
                best[n, w, s] = x
                bracketed[n].append(ok)
                points.append((math.log2(w), x))
            if len(points) >= 2:
                slopes[n][s] = slope(*zip(*points, strict=True))
    gate = pre.reported("the best lr lies inside the lr grid (lr* measurable)", "cells (width, seed) whose best lr "
                        "is not a grid edge", "every cell", {n: f"{sum(b)}/{len(b)}" for n, b in bracketed.items()},
                        "mixed", "this round's runs")
    for n, b in bracketed.items():
        gate["cells"][n]["status"] = "present" if b and all(b) else "absent" if not any(b) else "mixed"
    gate["status"] = pre.overall(c["status"] for c in gate["cells"].values())
    diff = prereg.diffs(slopes["layernorm"], slopes["rmsnorm"])
    parts = pre.parts({"T1 layernorm": (list(slopes["layernorm"].values()), -MOVES, "at most"),
                       "T1 rmsnorm": (list(slopes["rmsnorm"].values()), -MOVES, "at most"),
                       "T2": (diff, SAME, "at most")})
    verdicts = {}
    for n in NORMS:
        w, why = prereg.verdict_line(f"T1 {n}", parts["parts"][f"T1 {n}"], "slope of log10 lr* per doubling")
        verdicts[f"T1 {n}"] = (pre.gate(w, pre.cell(gate, n)), why)
    low = pre.against(diff, -SAME, "at least")
    high = parts["parts"]["T2"]
    t2 = ("confirmed" if low["reading"] == high["reading"] == "holds" else
          "not at this scale" if "fails" in (low["reading"], high["reading"]) else "unresolved")
    verdicts["T2"] = (pre.gate(t2, gate), prereg.verdict_line("T2", high, "LayerNorm - RMSNorm slope")[1] +
                      f"; against -{SAME:g}: {low['reading']}")
    rows = [[n, w, mean(10 ** best[n, w, s] for s in SEEDS if (n, w, s) in best)] for n in NORMS for w in WIDTHS]
    tab = table(["norm", "width", "best lr (seed mean of the parabola vertex)"], rows, digits=4)
    vt = table(["hypothesis", "verdict", "numbers"], [[k, w, why] for k, (w, why) in verdicts.items()])
    md = f"{tab}\n\n{pre.line(gate)}\n\n### Verdicts (rules fixed before the runs; {parts['text']})\n\n{vt}\n"
    return {"best_log10_lr": {f"{n}/{w}/{s}": v for (n, w, s), v in best.items()}, "slopes": slopes,
            "verdicts": verdicts, "precondition": [gate], "holm": parts}, md


def main(argv: Sequence[str] | None = None) -> None:
    analysis_main(__doc__, HERE, lambda k: False, analyze, None, argv)


if __name__ == "__main__":
    main()
