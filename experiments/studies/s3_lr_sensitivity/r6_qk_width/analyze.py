"""S3 round 6 (pre-registered): does QK-norm's benefit grow with width? Wortsman et al. 2023 (Fig. 1)
report that without qk-layernorm the final loss grows more sensitive to the learning rate as the model grows,
while with it the loss-vs-lr curve stays flat. Round 1 measured the benefit at one width (QK-norm lowered the
sensitivity 2.4-2.6x); rounds 4-5 measured how the best lr moves with width, without QK-norm. This round crosses
the two. The rules below are committed before any run; the data commit cites this one.

Setting: configs/experiment/s3_lr_sensitivity.yaml (4 layers, 4 heads, 400 steps, no clipping), RMSNorm (round 1
found the two norms' QK-norm effects alike, 2.4x and 2.6x, and rounds 4-5 their lr slopes within 0.03 decades per
doubling: one norm keeps the round near an hour), z-loss 0; width (model.dim) {32, 64, 128, 256} x QK-norm {none,
layernorm} x lr {3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1, 3e-1} (round 1's grid, which reaches the high lrs where
attention logits grow) x seeds {0, 1, 2}: 168 runs, both arms from one commit.

    python train.py -m experiment=s3_lr_sensitivity norm=rmsnorm model.dim=32,64,128,256 \\
        model.qk_norm=none,layernorm module.z_loss=0 optimizer.lr=3e-4,1e-3,3e-3,1e-2,3e-2,1e-1,3e-1 \\
        seed=0,1,2 'tags=[qk_width]' hydra/launcher=joblib hydra.launcher.n_jobs=2 \\
        hydra.sweep.dir=logs/s3_lr_sensitivity/multiruns/qk_width
    python -m experiments.studies.s3_lr_sensitivity.r6_qk_width.analyze logs/s3_lr_sensitivity/multiruns/qk_width

Compute estimate (2-core CPU, two runs side by side; round 4's wall times, 11 s, 18 s, 38 s and 120 s a run at
widths 32-256): 42 runs per width, ~65 min in all.

Measures, per width, QK-norm setting and seed: the LR sensitivity (minillm.analysis.report.lr_sensitivity: the mean
over the
grid of the final val loss minus the grid's best, a diverged run counting as ln V; round 1's measure, per seed);
the best lr lr* (round 4's parabola vertex on this grid).
Precondition (the gate, per width; round 1's rule): attention logits grow without QK-norm: the max attention logit
over the grid and seeds without QK-norm / with it at least LOGIT_GROWTH. A width without it reads "premise absent
at this scale" in Q1; Q2 needs it at every width.
Hypotheses (3 seeds, paired by seed; each read with its 95% interval; Holm across the five parts):
  Q1 (per width; QK-norm lowers the lr sensitivity): sensitivity with / without QK-norm at most LOWER (log scale).
  Q2 (the benefit grows with width): per seed, the slope of the sensitivity against log2(width) without QK-norm
     minus that with it, at least GROWS nats per doubling.
  Each: "confirmed" when its interval clears the threshold, "not at this scale" when it lies wholly on the other
  side, "unresolved" when it crosses it; premise absent where the gate says so.
Reported, not tested: the lr* slope per doubling of width with and without QK-norm (round 4's measure).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from experiments.common import precondition as pre
from experiments.common import prereg
from experiments.common.study import Runs, analysis_main, mean, table
from experiments.studies.s3_lr_sensitivity.r4_width_transfer import analyze as r4
from minillm.analysis.report import lr_sensitivity
from minillm.outcome import loss_for_comparison

HERE = Path(__file__).parent
# --- fixed before the runs ---------------------------------------------------------------------------------
WIDTHS, QK, SEEDS = (32, 64, 128, 256), ("none", "layernorm"), (0, 1, 2)
LRS = (3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1, 3e-1)
LOWER = 0.8  # round 1's: a mitigation lowers the sensitivity when it is at most 0.8x without it
LOGIT_GROWTH = 10.0  # round 1's: logits grow without QK-norm when their max is at least 10x the QK-norm one
GROWS = 0.02  # nats of lr sensitivity per doubling of width (round 1's sensitivities: 0.14-0.39 nats at width 64)


def cell(runs: Runs, width: int, qk: str, seed: int) -> dict[float, float] | None:
    """lr -> final val loss (diverged: ln V) of one (width, QK-norm, seed), None unless the grid is complete."""
    losses = {r["lr"]: loss_for_comparison(r) for r in runs
              if r["dim"] == width and r["qk_norm"] == qk and r["seed"] == seed}
    return losses if sorted(losses) == sorted(LRS) else None


def log_lr_star(losses: dict[float, float]) -> float:
    """log10 of the best lr: round 4's parabola vertex, on this round's grid."""
    saved, r4.LRS = r4.LRS, LRS
    try:
        return r4.best_log_lr([losses[lr] for lr in LRS])[0]
    finally:
        r4.LRS = saved


def analyze(runs: Runs) -> tuple[dict, str]:
    runs = Runs(r for r in runs if "qk_width" in (r.get("tags") or []) and r["norm"] == "rmsnorm"
                and not r.get("z_loss"))
    prereg.require(runs, "the max attention logit (summary max_attn_logit)", lambda r: "max_attn_logit" in r)
    sens = {(w, q): {} for w in WIDTHS for q in QK}
    star = {(w, q): {} for w in WIDTHS for q in QK}
    for w in WIDTHS:
        for q in QK:
            for s in SEEDS:
                losses = cell(runs, w, q, s)
                if losses is not None:
                    sens[w, q][s], star[w, q][s] = lr_sensitivity(losses), log_lr_star(losses)

    def top_logit(w: int, q: str) -> float:
        return max((r.get("max_attn_logit") or 0.0 for r in runs if r["dim"] == w and r["qk_norm"] == q),
                   default=0.0)

    growth = {f"width {w}": top_logit(w, "none") / top_logit(w, "layernorm") if top_logit(w, "layernorm") else None
              for w in WIDTHS}
    gate = pre.reported("attention logits grow without QK-norm (QK-norm's problem; Wortsman et al. 2023)",
                        "max attention logit over the grid and seeds without QK-norm / with it",
                        f"at least {LOGIT_GROWTH:g}", growth, "mixed", "this round's runs (max_attn_logit)")
    for name, value in growth.items():
        gate["cells"][name]["status"] = ("not recorded" if value is None else
                                         "present" if value >= LOGIT_GROWTH else "absent")
    gate["status"] = pre.overall(c["status"] for c in gate["cells"].values())

    def slopes(q: str, values: dict) -> dict[int, float]:
        out = {}
        for s in SEEDS:
            points = [(math.log2(w), values[w, q][s]) for w in WIDTHS if s in values[w, q]]
            if len(points) == len(WIDTHS):
                out[s] = r4.slope(*zip(*points, strict=True))
        return out

    spec = {f"Q1 width {w}": (prereg.ratios(sens[w, "layernorm"], sens[w, "none"]), LOWER, "at most", True)
            for w in WIDTHS}
    spec["Q2"] = (prereg.diffs(slopes("none", sens), slopes("layernorm", sens)), GROWS, "at least")
    parts = pre.parts(spec)
    verdicts = {}
    for w in WIDTHS:
        word, why = prereg.verdict_line(f"Q1 width {w}", parts["parts"][f"Q1 width {w}"],
                                        "sensitivity with / without QK-norm")
        verdicts[f"Q1 width {w}"] = (pre.gate(word, pre.cell(gate, f"width {w}")), why)
    word, why = prereg.verdict_line("Q2", parts["parts"]["Q2"], "sensitivity slope without - with QK-norm, nats "
                                    "per doubling of width")
    verdicts["Q2"] = (pre.gate(word, *(pre.cell(gate, f"width {w}") for w in WIDTHS)), why)
    lr_slopes = {q: slopes(q, star) for q in QK}
    rows = [[w, q, mean(sens[w, q].values()) if sens[w, q] else None,
             mean(10 ** v for v in star[w, q].values()) if star[w, q] else None, top_logit(w, q)]
            for w in WIDTHS for q in QK]
    tab = table(["width", "QK-norm", "lr sensitivity (seed mean)", "best lr (seed mean)", "max attention logit"],
                rows, digits=4)
    vt = table(["hypothesis", "verdict", "numbers"], [[k, v, why] for k, (v, why) in verdicts.items()])
    reported = "; ".join(f"QK-norm {q}: {mean(v.values()):+.3f} decades per doubling (per seed "
                         f"{' / '.join(f'{x:+.3f}' for x in v.values())})" for q, v in lr_slopes.items() if v)
    md = (f"RMSNorm, widths {', '.join(map(str, WIDTHS))}, lr grid {', '.join(f'{lr:g}' for lr in LRS)}, "
          f"{len(runs)} runs.\n\n{tab}\n\n{pre.line(gate)}\n\n### Verdicts (rules fixed before the runs; "
          f"{parts['text']})\n\n{vt}\n\nReported, not tested: the best lr's slope against log2(width): {reported}.\n")
    return {"sensitivity": {f"{w}/{q}": v for (w, q), v in sens.items()},
            "best_log10_lr": {f"{w}/{q}": v for (w, q), v in star.items()}, "lr_slopes": lr_slopes,
            "verdicts": verdicts, "precondition": [gate], "holm": parts}, md


def main(argv: Sequence[str] | None = None) -> None:
    analysis_main(__doc__, HERE, lambda k: False, analyze, None, argv)


if __name__ == "__main__":
    main()
