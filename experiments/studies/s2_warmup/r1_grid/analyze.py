"""S2: does Post-LN need warmup where Pre-LN does not? Table, verdict and plots of the s2_warmup sweep.

    python train.py -m experiment=s2_warmup                          # 72 runs -> logs/s2_warmup/multiruns/<t>/
    # the sweep folder(s) below, or no argument: the committed runs
    python -m experiments.studies.s2_warmup.r1_grid.analyze logs/s2_warmup/multiruns/<t>
    python -m experiments.studies.s2_warmup.r1_grid.analyze --out DIR  # results and plots into DIR

Beside the rules, not part of them: the 95% paired t interval of each warmup gain over the seeds (no warmup - the
best warmup, paired by seed; minillm.analysis.stats.paired_t through experiments.common.study.paired).

Added after the data (experiments.common.precondition): the premise of Xiong et al.'s warmup claim, Theorem 1's
large gradient of Post-LN near the output at initialization, as S1 measured it in these runs' init (GPT-2's).
Where it is absent the verdict reads PREMISE_ABSENT (the rule's word in verdict_rule).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from experiments.common import precondition as pc
from experiments.common.machine import runs_machine
from experiments.common.plots import pyplot, save, xy
from experiments.common.study import Runs, analysis_main, by_seed, ci, fmt, mean, paired, spread, table
from minillm.metrics import TRAIN_LOSS, VAL_LOSS
from minillm.outcome import failed_of, loss_for_comparison

HERE = Path(__file__).parent
# Fixed before the sweep ran. A run's loss is minillm.outcome.loss_for_comparison: its final val loss, a diverged run
# counting as ln V.
# warmup gain = loss without warmup - best loss with warmup (mean over seeds), per depth, placement and lr.
NEEDS_WARMUP = 0.10  # a placement "needs warmup" at a setting where the gain is >= 0.10 nats and >= 2x seed range
INSENSITIVE = 0.05  # a placement is "insensitive to warmup" where the gain is <= 0.05 nats


def analyze(runs: Runs) -> tuple[dict, str]:
    rows, gains = [], []
    for depth in runs.values("n_layers"):
        for placement in ("pre", "post"):
            for lr in runs.values("lr"):
                cell = runs.where(n_layers=depth, placement=placement, lr=lr)
                by_warmup = {w: cell.where(warmup_steps=w) for w in cell.values("warmup_steps")}
                if 0 not in by_warmup or len(by_warmup) < 2:  # an incomplete sweep
                    continue
                losses = {w: mean(loss_for_comparison(r) for r in rs) for w, rs in by_warmup.items()}
                seed_range = max((spread(loss_for_comparison(r) for r in rs) or 0.0) for rs in by_warmup.values())
                best_w = min((w for w in losses if w > 0), key=losses.get)
                gain = losses[0] - losses[best_w]
                gain_t = paired(by_seed(by_warmup[0], loss_for_comparison),
                                by_seed(by_warmup[best_w], loss_for_comparison))
                n_failed = {w: sum(map(failed_of, rs)) for w, rs in by_warmup.items()}
                gains.append({"n_layers": depth, "placement": placement, "lr": lr, "gain": gain,
                              "seed_range": seed_range, "best_warmup": best_w,
                              "needs": gain >= NEEDS_WARMUP and gain >= 2 * seed_range,
                              "insensitive": gain <= INSENSITIVE,
                              "gain_ci": [gain_t["ci_low"], gain_t["ci_high"]]})
                rows.append([depth, placement, lr, *(losses[w] for w in sorted(losses)), gain, ci(gain_t),
                             seed_range, " / ".join(f"{n_failed[w]}" for w in sorted(n_failed))])
    warmups = runs.values("warmup_steps")
    n_seeds = len(runs.values("seed"))
    main = table(["L", "placement", "lr", *(f"val loss, warmup {w}" for w in warmups), "warmup gain",
                  "95% CI of the gain (paired t)", "seed range",
                  f"failed of {n_seeds} ({' / '.join(map(str, warmups))})"], rows)

    post_needs = [g for g in gains if g["placement"] == "post" and g["needs"]]
    pre_insensitive_there = [g for g in gains if g["placement"] == "pre" and g["insensitive"]
                             and any(p["n_layers"] == g["n_layers"] and p["lr"] == g["lr"] for p in post_needs)]
    pre_needs = [g for g in gains if g["placement"] == "pre" and g["needs"]]
    if post_needs and len(pre_insensitive_there) == len(post_needs) and not pre_needs:
        verdict = "confirmed"
    elif post_needs:
        verdict = "partly"
    else:
        verdict = "not at this scale"
    n_failed = {(p, w > 0): sum(failed_of(r) for r in runs.where(placement=p) if
                              (r["warmup_steps"] > 0) == (w > 0)) for p in ("pre", "post") for w in (0, 1)}
    totals = {(p, w > 0): sum(1 for r in runs.where(placement=p) if (r["warmup_steps"] > 0) == (w > 0))
              for p in ("pre", "post") for w in (0, 1)}
    summary = table(["placement", "settings where warmup gains >= 0.10 nats (and >= 2x seed range)",
                     "largest warmup gain", "failed runs without warmup", "failed runs with warmup"],
                    [[p, sum(g["needs"] for g in gains if g["placement"] == p),
                      max(g["gain"] for g in gains if g["placement"] == p),
                      f"{n_failed[(p, False)]} / {totals[(p, False)]}", f"{n_failed[(p, True)]} / {totals[(p, True)]}"]
                     for p in ("pre", "post")])
    gate = xiong_premise("depth_scaled")
    rule, verdict = verdict, pc.gate(verdict, gate)
    md = (f"Machine: {runs_machine(runs)}. "
          f"{len(runs)} runs.\n\n{pc.line(gate)}\n\n### Final val loss by setting (mean of "
          f"{n_seeds} seeds)"
          f"\n\n{main}\n\n### Warmup gain per placement\n\n{summary}\n\nVerdict rule (fixed before the runs): "
          f"confirmed if Post-LN gains >= {NEEDS_WARMUP} nats from warmup somewhere (and >= 2x the seed range) "
          f"while Pre-LN gains <= {INSENSITIVE} at those settings and nowhere needs it; partly if only the "
          f"first holds. **Verdict: {verdict}** (by the rule: {rule}).\n\nBeside the rule, not part of it: the gain's "
          f"95% interval is "
          f"minillm.analysis.stats' paired t over the {n_seeds} seeds (no warmup - the best warmup, paired by seed).\n")
    return {"rows": rows, "gains": gains, "verdict": verdict, "verdict_rule": rule, "precondition": [gate],
            "machine": runs_machine(runs)}, md

def xiong_premise(init: str) -> dict:
    """Xiong et al.'s Theorem 1 premise as S1 measured it at initialization (its committed results.json): Post-LN's
    last-layer gradient over Pre-LN's at L = 24, per width, in the given init of S1 (depth_scaled: GPT-2's)."""
    import json

    from experiments.common.layout import STUDIES

    s1 = json.loads((STUDIES / "s1_grad_at_init" / "r1_grad_vs_depth" / "results.json").read_text())
    ratios = s1["verdicts"][init]["post_over_pre_deepest"]
    status = pc.overall("present" if v > 1 else "absent" for v in ratios.values())
    return pc.reported("Post-LN's gradient near the output is large at initialization, so large early steps break it "
                       "(Xiong et al. 2020, Theorem 1)", "Post-LN / Pre-LN gradient of the last layer's W2 at "
                       "initialization, L = 24", "at least 1", {f"d={d}": v for d, v in ratios.items()}, status,
                       f"S1 (r1_grad_vs_depth/results.json, init {init}), at init: not these runs")



def plot(runs: Runs, out: Path) -> None:
    plt = pyplot()
    depths, lrs, warmups = runs.values("n_layers"), runs.values("lr"), runs.values("warmup_steps")
    unigram = mean(r.get("unigram_loss") for r in runs)
    fig, axes = plt.subplots(1, len(depths) * 2, figsize=(4.2 * len(depths) * 2, 3.6), sharey=True)
    for ax, (depth, placement) in zip(axes, [(d, p) for d in depths for p in ("pre", "post")], strict=True):
        for w in warmups:
            ys = [mean(map(loss_for_comparison, runs.where(n_layers=depth, placement=placement, lr=lr, warmup_steps=w)))
                  for lr in lrs]
            line = ax.plot(lrs, ys, marker="o", label=f"warmup {w}")[0]
            for lr in lrs:  # each seed
                seeds = [loss_for_comparison(r) for r in runs.where(n_layers=depth, placement=placement, lr=lr,
                                                                     warmup_steps=w)]
                ax.scatter([lr] * len(seeds), seeds, color=line.get_color(), s=8, alpha=0.5)
        ax.axhline(unigram, color="k", ls=":", lw=1)
        ax.set(xscale="log", title=f"{placement}-LN, L={depth}", xlabel="peak lr")
    axes[0].set_ylabel(f"final val loss (dots: seeds; dotted: unigram {unigram:.3f})")
    axes[0].legend()
    save(fig, out / "loss_vs_lr.png")

    depth, lr = max(depths), max(lrs)
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6), sharey=True)
    for ax, placement in zip(axes, ("pre", "post"), strict=True):
        for w in warmups:
            for i, r in enumerate(runs.where(n_layers=depth, placement=placement, lr=lr, warmup_steps=w)):
                steps, values = xy(r["curves"][TRAIN_LOSS])
                ax.plot(steps, values, color=f"C{warmups.index(w)}", alpha=0.8,
                        label=f"warmup {w}" if i == 0 else None)
        ax.axhline(unigram, color="k", ls=":", lw=1, label="unigram loss" if placement == "pre" else None)
        ax.set(title=f"{placement}-LN, L={depth}, lr {fmt(lr, 4)}: train loss", xlabel="step", ylim=(1.5, 4.6))
    axes[0].legend()
    save(fig, out / "train_loss_deepest_highest_lr.png")


def main(argv: Sequence[str] | None = None) -> None:
    analysis_main(__doc__, HERE, lambda k: k in (TRAIN_LOSS, VAL_LOSS), analyze, plot, argv)


if __name__ == "__main__":
    main()
