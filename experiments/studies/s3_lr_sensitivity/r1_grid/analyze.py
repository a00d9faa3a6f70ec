"""S3: LR sensitivity of norm variants, attention-logit growth, QK-norm and z-loss (Wortsman et al. 2023).

    python train.py -m experiment=s3_lr_sensitivity                  # 112 runs
    # the sweep folder(s) below, or no argument: the committed runs
    python -m experiments.studies.s3_lr_sensitivity.r1_grid.analyze logs/s3_lr_sensitivity/multiruns/<t>
    python -m experiments.studies.s3_lr_sensitivity.r1_grid.analyze --out DIR      # results and plots into DIR
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from experiments.common import precondition as pc
from experiments.common.machine import runs_machine
from experiments.common.plots import pyplot, save, xy
from experiments.common.study import Runs, analysis_main, mean, table
from minillm.analysis.report import lr_sensitivity
from minillm.metrics import MAX_ATTN_LOGIT
from minillm.outcome import failed_of, loss_for_comparison

HERE = Path(__file__).parent
# Fixed before the sweep ran (Wortsman et al.: QK-norm and z-loss each lower LR sensitivity; every run whose max
# attention logit passed 1e4 diverged).
LOWER = 0.8  # a mitigation "lowers sensitivity" when its sensitivity is <= 0.8x the same variant's without it
LOGIT_GROWTH = 10.0  # attention logits "grow" without QK-norm when the max over the grid is >= 10x the QK-norm one
LOGIT_LIMIT = 1e4


def variant(r: dict) -> tuple[str, str, float]:
    return r["norm"], r["qk_norm"], r["z_loss"]


def name(v: tuple[str, str, float]) -> str:
    return v[0] + (" + qk-LN" if v[1] != "none" else "") + (f" + z-loss {v[2]:g}" if v[2] else "")


def analyze(runs: Runs) -> tuple[dict, str]:
    lrs = runs.values("lr")
    variants = sorted({variant(r) for r in runs})
    per = {}
    for v in variants:
        rs = Runs(r for r in runs if variant(r) == v)
        by_lr = {lr: mean(loss_for_comparison(r) for r in rs.where(lr=lr)) for lr in lrs}
        stable = [lr for lr in lrs if not any(map(failed_of, rs.where(lr=lr)))]
        diverged = [r for r in rs if r.get("diverged")]
        per[v] = {"variant": name(v), "loss_by_lr": by_lr, "sensitivity": lr_sensitivity(by_lr),
                  "best_lr": min(by_lr, key=by_lr.get), "best_loss": min(by_lr.values()),
                  "highest_stable_lr": max(stable) if stable else None,
                  "diverged_runs": len(diverged), "runs": len(rs),
                  "max_attn_logit": max(r.get("max_attn_logit") or 0.0 for r in rs),
                  "max_attn_logit_diverged": max((r.get("max_attn_logit") or 0.0 for r in diverged), default=None),
                  "max_log_z": max(r.get("max_log_z") or 0.0 for r in rs)}
    rows = [[p["variant"], *(p["loss_by_lr"][lr] for lr in lrs), p["sensitivity"], p["best_lr"],
             p["highest_stable_lr"], f"{p['diverged_runs']}/{p['runs']}", p["max_attn_logit"],
             p["max_attn_logit_diverged"], p["max_log_z"]] for p in per.values()]
    main = table(["variant", *(f"lr {lr:g}" for lr in lrs), "LR sensitivity", "best lr", "highest stable lr",
                  "diverged", "max attn logit", "max attn logit (diverged)", "max log Z"], rows)

    checks = []
    for norm in sorted({v[0] for v in variants}):
        base = per.get((norm, "none", 0.0))
        qk = per.get((norm, "layernorm", 0.0))
        z = next((p for v, p in per.items() if v[0] == norm and v[1] == "none" and v[2] > 0), None)
        if base and qk:
            checks.append(("QK-norm lowers LR sensitivity", norm, base["sensitivity"], qk["sensitivity"],
                           qk["sensitivity"] <= LOWER * base["sensitivity"]))
            checks.append(("attention logits grow without QK-norm", norm, base["max_attn_logit"],
                           qk["max_attn_logit"], base["max_attn_logit"] >= LOGIT_GROWTH * qk["max_attn_logit"]))
        if base and z:
            checks.append(("z-loss lowers LR sensitivity", norm, base["sensitivity"], z["sensitivity"],
                           z["sensitivity"] <= LOWER * base["sensitivity"]))
    over = [r for r in runs if (r.get("max_attn_logit") or 0) > LOGIT_LIMIT]
    check_rows = [[c[0], c[1], c[2], c[3], c[4]] for c in checks]
    check_rows.append([f"every run with max attention logit > {LOGIT_LIMIT:g} diverged", "all",
                       f"{len(over)} runs over", f"{sum(bool(r.get('diverged')) for r in over)} diverged",
                       all(r.get("diverged") for r in over) if over else None])
    claims = table(["claim", "norm", "without", "with", "holds"], check_rows)
    plain = [r for r in runs if r["qk_norm"] == "none"]
    grow = {c[1]: c[2] / c[3] for c in checks if c[0] == "attention logits grow without QK-norm" and c[3]}
    diverged = sum(bool(r.get("diverged")) for r in plain if not r["z_loss"])
    gates = [pc.reported("attention logits grow without QK-norm (QK-norm's problem; Wortsman et al. 2023)",
                         "max attention logit without QK-norm / with it, over the grid", f"at least {LOGIT_GROWTH:g}",
                         grow, pc.overall("present" if v >= LOGIT_GROWTH else "absent" for v in grow.values()),
                         "this round's runs (max_attn_logit)"),
             pc.reported("output-logit divergence without z-loss (z-loss's problem; Wortsman et al. 2023)",
                         "runs without z-loss or QK-norm that diverged", "at least 1", {"every norm and lr": diverged},
                         "present" if diverged else "absent", "this round's runs; the z-loss check reads "
                         f"{pc.PREMISE_ABSENT} where this is absent")]
    md = (f"Machine: {runs_machine(runs)}. {len(runs)} runs, seeds pooled. Loss = final val loss, a diverged run "
          f"counts as ln V = {runs[0]['loss_init']:.3f}.\n\n### Final val loss by peak learning rate\n\n{main}\n\n"
          f"### Claims (thresholds fixed before the runs: a mitigation lowers sensitivity when it is <= "
          f"{LOWER}x; logits grow when >= {LOGIT_GROWTH:g}x)\n\n{claims}\n\n" + "\n\n".join(map(pc.line, gates))
          + "\n")
    results = {"variants": [{**p, "loss_by_lr": {str(k): v for k, v in p["loss_by_lr"].items()}}
                            for p in per.values()], "checks": check_rows, "precondition": gates,
                            "machine": runs_machine(runs)}
    return results, md


def plot(runs: Runs, out: Path) -> None:
    plt = pyplot()
    lrs = runs.values("lr")
    variants = sorted({variant(r) for r in runs})
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
    for i, v in enumerate(variants):
        rs = Runs(r for r in runs if variant(r) == v)
        style = dict(color=f"C{i}", marker="o", linestyle="-" if v[1] == "none" else "--")
        axes[0].plot(lrs, [mean(loss_for_comparison(r) for r in rs.where(lr=lr)) for lr in lrs],
                     label=name(v), **style)
        axes[1].plot(lrs, [max(r.get("max_attn_logit") or 0.0 for r in rs.where(lr=lr)) for lr in lrs], **style)
    axes[0].set(xscale="log", xlabel="peak lr", ylabel="final val loss (diverged = ln V)", title="LR sensitivity")
    axes[1].set(xscale="log", yscale="log", xlabel="peak lr", ylabel="max attention logit (any seed)",
                title="attention-logit growth")
    axes[0].legend(fontsize=7)
    save(fig, out / "lr_sensitivity.png")

    top = max(lr for lr in lrs if any(r["curves"].get(MAX_ATTN_LOGIT) for r in runs.where(lr=lr)))
    fig, ax = plt.subplots(figsize=(6, 3.8))
    for i, v in enumerate(variants):
        for r in (r for r in runs.where(lr=top, seed=0) if variant(r) == v):
            steps, values = xy(r["curves"].get(MAX_ATTN_LOGIT, [(0, float("nan"))]))
            ax.plot(steps, values, color=f"C{i}", linestyle="-" if v[1] == "none" else "--", label=name(v))
    ax.set(yscale="log", xlabel="step", ylabel="max attention logit", title=f"lr {top:g}, seed 0")
    ax.legend(fontsize=7)
    save(fig, out / "attn_logit_curves.png")


def main(argv: Sequence[str] | None = None) -> None:
    analysis_main(__doc__, HERE, lambda k: k == MAX_ATTN_LOGIT, analyze, plot, argv)


if __name__ == "__main__":
    main()
