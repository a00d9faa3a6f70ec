"""S2 round 2: the key cells again in the paper's initialization. Round 1 ran with GPT-2's N(0, 0.02) init, which
removes the precondition of Xiong et al.'s analysis (S1: with init xavier, Post-LN's last-layer gradient is
4-5x Pre-LN's at L = 24; with GPT-2's init it is not). Pre-registered: the rules below were committed before any
run of this round (the README names the commit). Results go to this round's folder.

    python train.py -m experiment=s2_warmup model.init=xavier model.n_layers=12 scheduler.warmup_steps=0,100 \\
        seed=0,1,2 'tags=[xavier]' hydra/launcher=joblib hydra.launcher.n_jobs=2 \\
        hydra.sweep.dir=logs/s2_warmup/multiruns/xavier                 # 36 runs, ~27 min on 2 cores
    python -m experiments.studies.s2_warmup.r2_xavier.analyze logs/s2_warmup/multiruns/xavier   # or no argument

Setting: S2's (LayerNorm, dim 64, 400 steps, no clipping, cosine after a linear warmup), L = 12, placement
{pre, post} x lr {1e-3, 3e-3, 1e-2} x warmup {0, 100} x seeds {0, 1, 2}, model.init=xavier (Xavier-normal
linears, N(0, 1) embeddings: docs/norms_and_placements.md). A run's loss: minillm.outcome.loss_for_comparison.
Warmup gain at a (placement, lr) = mean loss without warmup - mean loss with 100 steps.

Hypotheses (Xiong et al. 2020, "On Layer Normalization in the Transformer Architecture", section 3-4):
  X1 Post-LN needs warmup: at some lr its warmup gain is >= NEEDS_WARMUP and >= 2x the larger seed range, or a
     run without warmup fails (minillm.outcome's rule) while none with warmup does at that lr.
  X2 Pre-LN does not: at every lr its warmup gain is <= INSENSITIVE.
  Confirmed: both; partly: one; not at this scale: neither. (S2 round 1's thresholds.)
Beside the rules, not part of them (minillm.analysis.stats): the 95% paired t interval of each warmup gain over the
seeds, and the two-sided Fisher p of the failures without against with warmup.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from experiments.common import precondition as pc
from experiments.common.machine import runs_machine
from experiments.common.plots import pyplot, save
from experiments.common.study import Runs, analysis_main, by_seed, ci, mean, paired, spread, table
from experiments.studies.s2_warmup.r1_grid.analyze import INSENSITIVE, NEEDS_WARMUP, xiong_premise
from minillm.analysis import stats as st
from minillm.metrics import VAL_LOSS
from minillm.outcome import failed_of, loss_for_comparison

HERE = Path(__file__).parent
WARMUP = 100


def cell(runs: Runs, placement: str, lr: float, warmup: int) -> Runs:
    return Runs(r for r in runs if r["placement"] == placement and r["lr"] == lr and r["warmup_steps"] == warmup)


def analyze(runs: Runs) -> tuple[dict, str]:
    lrs = runs.values("lr")
    rows, gains = [], {}
    for p in ("pre", "post"):
        for lr in lrs:
            cold, warm = cell(runs, p, lr, 0), cell(runs, p, lr, WARMUP)
            loss0, loss1 = mean(map(loss_for_comparison, cold)), mean(map(loss_for_comparison, warm))
            noise = max(spread(map(loss_for_comparison, cold)) or 0, spread(map(loss_for_comparison, warm)) or 0)
            f0, f1 = sum(map(failed_of, cold)), sum(map(failed_of, warm))
            gain_t = paired(by_seed(cold, loss_for_comparison), by_seed(warm, loss_for_comparison))
            fisher = st.fisher_p(f0, len(cold), f1, len(warm))
            gains[p, lr] = {"gain": loss0 - loss1, "noise": noise, "failed_cold": f0, "failed_warm": f1,
                            "gain_ci": [gain_t["ci_low"], gain_t["ci_high"]], "fisher_p": fisher}
            rows.append([p, f"{lr:g}", loss0, loss1, loss0 - loss1, ci(gain_t), noise,
                         f"{f0} / {f1}" + ("" if fisher is None or not f0 + f1 else f", p = {fisher:.2g}")])
    tab = table(["placement", "lr", "no warmup", f"warmup {WARMUP}", "warmup gain", "95% CI of the gain (paired t)",
                 "seed range", "failed (no warmup / warmup, Fisher p)"], rows)
    x1_at = [lr for lr in lrs if (gains["post", lr]["gain"] >= NEEDS_WARMUP and
                                   gains["post", lr]["gain"] >= 2 * gains["post", lr]["noise"]) or
             (gains["post", lr]["failed_cold"] and not gains["post", lr]["failed_warm"])]
    x2 = all(gains["pre", lr]["gain"] <= INSENSITIVE for lr in lrs)
    hits = bool(x1_at) + x2
    verdict = {2: "confirmed", 1: "partly", 0: "not at this scale"}[hits]
    verdicts = {"X1": ("holds" if x1_at else "does not hold", f"Post-LN needs warmup at lr {x1_at or 'none'}"),
                "X2": ("holds" if x2 else "does not hold", "Pre-LN warmup gain per lr: " + ", ".join(
                    f"{lr:g}: {gains['pre', lr]['gain']:+.3f}" for lr in lrs)),
                "overall": (verdict, f"{hits} of 2")}
    vt = table(["hypothesis", "verdict", "numbers"], [[k, v, why] for k, (v, why) in verdicts.items()])
    gate = xiong_premise("xavier")
    md = (f"Machine: {runs_machine(runs)}. "
          f"{len(runs)} runs, L = 12, init xavier, 3 seeds per cell (seed means; a diverged "
          f"run counts as ln V).\n\n{tab}\n\n{pc.line(gate)}\n\n### Verdicts (rules fixed before the runs)\n\n{vt}\n")
    return {"gains": [{"placement": p, "lr": lr, **g} for (p, lr), g in gains.items()], "verdicts": verdicts,
            "precondition": [gate], "machine": runs_machine(runs)}, md


def plot(runs: Runs, out: Path) -> None:
    plt = pyplot()
    lrs = runs.values("lr")
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for i, p in enumerate(("pre", "post")):
        for w in (0, WARMUP):
            ax.plot(lrs, [mean(map(loss_for_comparison, cell(runs, p, lr, w))) for lr in lrs], marker="o",
                    color=f"C{i}", ls="-" if w else "--", label=f"{p}-LN, warmup {w}")
            for lr in lrs:  # each seed
                ys = [loss_for_comparison(r) for r in cell(runs, p, lr, w)]
                ax.scatter([lr * (1.06 if w else 0.94)] * len(ys), ys, color=f"C{i}", s=9, alpha=0.5)
    unigram = mean(r.get("unigram_loss") for r in runs)
    ax.axhline(unigram, color="k", ls=":", lw=1, label=f"unigram loss {unigram:.3f}")
    ax.set(xscale="log", xlabel="peak lr", ylabel="final val loss (seed mean; dots: seeds)",
           title="S2, init xavier, L = 12")
    ax.legend(fontsize=8)
    save(fig, out / "xavier.png")


def main(argv: Sequence[str] | None = None) -> None:
    analysis_main(__doc__, HERE, lambda k: k == VAL_LOSS, analyze, plot, argv)


if __name__ == "__main__":
    main()
