"""S3 round 2: OLMo 2's norms in the LR-sensitivity sweep. Does normalizing each branch's output (placement
"branch", no input norm) together with QK-norm lower the sensitivity to the learning rate, and which of the two
does it? Pre-registered: the rules below were committed before any run of this round (the README names the
commit). Results go to this round's folder.

    python train.py -m experiment=s3_lr_sensitivity norm=rmsnorm placement=pre,branch \\
        model.qk_norm=none,rmsnorm module.z_loss=0 hydra/launcher=joblib hydra.launcher.n_jobs=2 \\
        hydra.sweep.dir=logs/s3_lr_sensitivity/multiruns/olmo2                # 56 runs, ~15 min on 2 cores
    # the sweep folder(s) below, or no argument: the committed runs
    python -m experiments.studies.s3_lr_sensitivity.r2_olmo2.analyze logs/s3_lr_sensitivity/multiruns/olmo2

Setting: S3's (4 layers, dim 64, 400 steps, warmup 40, no clipping, lr 3e-4 .. 3e-1, seeds 0 and 1), RMSNorm
everywhere as OLMo 2, QK-norm RMSNorm on queries and keys as OLMo 2, and no z-loss (OLMo 2 adds z-loss 1e-5;
S3 round 1 measured z-loss on its own, so here only the norms change).
LR sensitivity as S3 (minillm.analysis.report.lr_sensitivity: mean over the grid of loss(lr) - the best loss, a diverged
run counted at ln V), computed on the seed-mean losses and on each seed alone.

Hypotheses (Team OLMo 2024, "2 OLMo 2 Furious", section 3: reordered norm and QK-norm for stability; Wortsman et
al. 2023: QK-norm lowers LR sensitivity):
  O1 OLMo 2's norms (branch + QK-norm) lower LR sensitivity against Pre-LN without QK-norm: sensitivity
     <= LOWER x the baseline's, on the seed means and in every seed. Confirmed / not at this scale.
  O2 Each part alone (branch without QK-norm; Pre-LN with QK-norm), by the same rule: reported per part.
  O3 OLMo 2's norms raise the highest stable lr (no seed fails, minillm.outcome's rule) above the baseline's.
  O4 They cost no quality: best seed-mean loss over the grid <= the baseline's + MARGIN. Confirmed / not.
Beside O4's rule, not part of it: the 95% paired t interval of the difference of the two best cells, paired by seed
(minillm.analysis.stats.paired_t). O1-O3 are ratios and an lr, not comparisons of losses.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from experiments.common import precondition as pc
from experiments.common.machine import runs_machine
from experiments.common.plots import pyplot, save
from experiments.common.study import Runs, analysis_main, by_seed, ci, mean, paired, table
from minillm.analysis.report import lr_sensitivity
from minillm.metrics import MAX_ATTN_LOGIT
from minillm.outcome import failed_of, loss_for_comparison

HERE = Path(__file__).parent
# --- fixed before the runs ---------------------------------------------------------------------------------
LOWER = 0.8  # S3's rule: a change "lowers sensitivity" at <= 0.8x
MARGIN = 0.05  # nats: O4
BASELINE, OLMO2 = ("pre", "none"), ("branch", "rmsnorm")
PARTS = {"branch alone": ("branch", "none"), "QK-norm alone": ("pre", "rmsnorm")}


def variant(r: dict) -> tuple[str, str]:
    return r["placement"], r["qk_norm"]


def name(v: tuple[str, str]) -> str:
    return f"{v[0]}-LN" + (" + QK-norm" if v[1] != "none" else "")


def measures(runs: Runs, v: tuple[str, str]) -> dict:
    rs = Runs(r for r in runs if variant(r) == v)
    lrs, seeds = rs.values("lr"), rs.values("seed")
    by_lr = {lr: mean(loss_for_comparison(r) for r in rs.where(lr=lr)) for lr in lrs}
    per_seed = [lr_sensitivity({lr: loss_for_comparison(r) for lr in lrs for r in rs.where(lr=lr, seed=s)})
                for s in seeds]
    stable = [lr for lr in lrs if not any(map(failed_of, rs.where(lr=lr)))]
    return {"variant": name(v), "loss_by_lr": by_lr, "sensitivity": lr_sensitivity(by_lr),
            "sensitivity_per_seed": per_seed, "best_lr": min(by_lr, key=by_lr.get), "best_loss": min(by_lr.values()),
            "highest_stable_lr": max(stable) if stable else None, "runs": len(rs),
            "diverged": sum(bool(r.get("diverged")) for r in rs),
            "max_attn_logit": max(r.get("max_attn_logit") or 0.0 for r in rs)}


def lowers(m: dict, base: dict) -> bool:
    return m["sensitivity"] <= LOWER * base["sensitivity"] and all(
        s <= LOWER * b for s, b in zip(m["sensitivity_per_seed"], base["sensitivity_per_seed"], strict=True))


def analyze(runs: Runs) -> tuple[dict, str]:
    lrs = runs.values("lr")
    per = {v: measures(runs, v) for v in (BASELINE, *PARTS.values(), OLMO2)}
    rows = [[m["variant"], *(m["loss_by_lr"][lr] for lr in lrs), m["sensitivity"],
             " / ".join(f"{s:.3f}" for s in m["sensitivity_per_seed"]), m["best_lr"], m["best_loss"],
             m["highest_stable_lr"], f"{m['diverged']}/{m['runs']}", m["max_attn_logit"]] for m in per.values()]
    main = table(["variant", *(f"lr {lr:g}" for lr in lrs), "LR sensitivity", "per seed", "best lr", "best loss",
                  "highest stable lr", "diverged", "max attn logit"], rows)
    base, olmo = per[BASELINE], per[OLMO2]

    def best_cell(v: tuple[str, str]) -> dict:
        return by_seed((r for r in runs if variant(r) == v and r["lr"] == per[v]["best_lr"]), loss_for_comparison)

    quality = paired(best_cell(OLMO2), best_cell(BASELINE))
    verdicts = {
        "O1": ("confirmed" if lowers(olmo, base) else "not at this scale",
               f"{olmo['sensitivity']:.3f} vs {base['sensitivity']:.3f} (ratio "
               f"{olmo['sensitivity'] / base['sensitivity']:.2f}; per seed "
               + ", ".join(f"{s / b:.2f}" for s, b in zip(olmo["sensitivity_per_seed"], base["sensitivity_per_seed"],
                                                          strict=True)) + ")"),
        **{f"O2 {part}": ("lowers" if lowers(per[v], base) else "does not lower",
                          f"{per[v]['sensitivity']:.3f} vs {base['sensitivity']:.3f}") for part, v in PARTS.items()},
        "O3": ("confirmed" if (olmo["highest_stable_lr"] or 0) > (base["highest_stable_lr"] or 0)
               else "not at this scale", f"highest stable lr {olmo['highest_stable_lr']} vs "
                                         f"{base['highest_stable_lr']}"),
        "O4": ("confirmed" if olmo["best_loss"] <= base["best_loss"] + MARGIN else "not at this scale",
               f"best loss {olmo['best_loss']:.3f} vs {base['best_loss']:.3f} (difference {quality['diff']:+.3f}, "
               f"95% CI {ci(quality)} paired over {quality['n']} seeds)"),
    }
    vt = table(["hypothesis", "verdict", "numbers"], [[k, v, why] for k, (v, why) in verdicts.items()])
    gate = pc.none("the learning-rate sensitivity each arm is compared on is measured on every arm")
    md = (f"{pc.line(gate)}\n\nMachine: {runs_machine(runs)}. "
          f"{len(runs)} runs, RMSNorm, 2 seeds per cell (losses: seed "
          f"means, a diverged run "
          f"counts as ln V).\n\n{main}\n\n### Verdicts (rules fixed before the runs)\n\n{vt}\n")
    results = {"variants": [{**m, "loss_by_lr": {str(k): v for k, v in m["loss_by_lr"].items()}}
                            for m in per.values()], "verdicts": verdicts,
                            "machine": runs_machine(runs), "O4_paired_t": quality,
               "precondition": [gate]}
    return results, md


def plot(runs: Runs, out: Path) -> None:
    plt = pyplot()
    lrs = runs.values("lr")
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for i, v in enumerate((BASELINE, *PARTS.values(), OLMO2)):
        rs = Runs(r for r in runs if variant(r) == v)
        ax.plot(lrs, [mean(loss_for_comparison(r) for r in rs.where(lr=lr)) for lr in lrs], marker="o",
                color=f"C{i}", linestyle="-" if v[1] == "none" else "--", label=name(v))
    ax.set(xscale="log", xlabel="peak lr", ylabel="final val loss (diverged = ln V)",
           title="LR sensitivity: OLMo 2's norms (RMSNorm)")
    ax.legend(fontsize=8)
    save(fig, out / "olmo2.png")


def main(argv: Sequence[str] | None = None) -> None:
    analysis_main(__doc__, HERE, lambda k: k == MAX_ATTN_LOGIT, analyze, plot, argv)


if __name__ == "__main__":
    main()
