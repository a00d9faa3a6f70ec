"""S7: depth ladder, Pre-LN vs Post-LN vs DeepNorm (Wang et al. 2022, DeepNet).

    python train.py -m experiment=s7_depth                          # 24 runs
    # the sweep folder(s) below, or no argument: the committed runs
    python -m experiments.studies.s7_depth.r1_ladder.analyze logs/s7_depth/multiruns/<t>
    python -m experiments.studies.s7_depth.r1_ladder.analyze --out DIR                     # results and plots into DIR
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from experiments.common import precondition as pc
from experiments.common.machine import runs_machine
from experiments.common.plots import pyplot, save, xy
from experiments.common.study import Runs, analysis_main, mean, table
from minillm.analysis import stats as st
from minillm.metrics import TRAIN_LOSS, UPDATE_RATIO, VAL_LOSS
from minillm.outcome import failed_of, final_loss, is_stalled, loss_for_comparison

HERE = Path(__file__).parent
PLACEMENTS = ("pre", "post", "deepnorm")
EARLY = 50  # "early" = the first 50 optimizer steps
# Fixed before the sweep ran.
EXPLODES = 2.0  # Post-LN's early update "explodes" at depth when its max early update ratio at the deepest L is
#                 >= 2x DeepNorm's there
# Fixed after the first 24 runs (one Post-LN seed at L=48 stalled just under the failure line) and before the
# follow-up runs (seeds 2-9 of Post-LN and DeepNorm at L=48):
STALL = 0.25  # a run "stalled" when its final val loss is within STALL nats of the unigram loss, or above it
#              (minillm.outcome.is_stalled with this margin)
STALLS = 2  # Post-LN "stalls at depth where DeepNorm trains": >= STALLS of its runs at the deepest L stalled, and
#             no DeepNorm run there


def ratios(run: dict) -> list[tuple[int, float]]:
    """(step, update ratio) of the steps with a finite update (a non-finite one means the run diverged)."""
    return [(s, v) for s, v in run["curves"].get(UPDATE_RATIO, []) if math.isfinite(v)]


def early_update(run: dict) -> float | None:
    """Largest ||W_after - W_before|| / ||W_before|| over all parameters in the first EARLY steps."""
    return max((v for s, v in ratios(run) if s < EARLY), default=None)


def late_update(run: dict) -> float | None:
    """Mean update ratio over the last 50 steps of a run that trained to the end (a frozen model makes tiny
    updates); None for a run stopped early."""
    return None if run.get("stopped_early") else mean(v for _, v in ratios(run)[-50:])


def val_loss(run: dict) -> float:
    """Final val loss; a diverged run (or one without a finite final loss) counts as ln V."""
    return loss_for_comparison(run)


def stalled(run: dict) -> bool:
    return is_stalled(run, STALL)


def train_loss_at(run: dict, step: int) -> float | None:
    return dict(run["curves"].get(TRAIN_LOSS, [])).get(step)


def analyze(runs: Runs) -> tuple[dict, str]:
    depths = runs.values("n_layers")
    cells, rows = {}, []
    for placement in PLACEMENTS:
        for depth in depths:
            rs = runs.where(placement=placement, n_layers=depth)
            c = {"val": mean(final_loss(r) for r in rs),
                 "failed": sum(map(failed_of, rs)), "stalled": sum(map(stalled, rs)),
                 "runs": len(rs),
                 "early": mean(early_update(r) for r in rs), "late": mean(late_update(r) for r in rs),
                 "max_grad_norm": max(r.get("max_grad_norm") or 0 for r in rs)}
            cells[(placement, depth)] = c
            rows.append([placement, depth, c["val"], f"{c['failed']}/{c['runs']}", f"{c['stalled']}/{c['runs']}",
                         c["early"], c["late"], c["max_grad_norm"]])
    main = table(["placement", "L", "final val loss (not diverged)", "failed", "stalled",
                  f"max update ratio, steps < {EARLY}",
                  "mean update ratio, last 50 steps", "max grad norm"], rows, digits=4)
    deep, shallow = max(depths), min(depths)
    per_seed = table(["placement", "seed", "final val loss", "best val loss", "unigram loss", "failed", "stalled",
                      "train loss, step 59", f"max update ratio, steps < {EARLY}"],
                     [[r["placement"], r["seed"], val_loss(r), r["best_val_loss"], r["unigram_loss"], failed_of(r),
                       stalled(r), train_loss_at(r, 59), early_update(r)]
                      for p in PLACEMENTS for r in sorted(runs.where(placement=p, n_layers=deep),
                                                          key=lambda r: r["seed"])], digits=3)
    post_fail = cells[("post", deep)]["failed"] / cells[("post", deep)]["runs"]
    deep_fail = cells[("deepnorm", deep)]["failed"] / cells[("deepnorm", deep)]["runs"]
    ratio = cells[("post", deep)]["early"] / cells[("deepnorm", deep)]["early"]
    growth = {p: cells[(p, deep)]["early"] / cells[(p, shallow)]["early"] for p in PLACEMENTS}  # finite by now
    post, dn = cells["post", deep], cells["deepnorm", deep]
    stall_p = st.fisher_p(post["stalled"], post["runs"], dn["stalled"], dn["runs"], alternative="greater")
    checks = [
        [f"Post-LN fails at L={deep} where DeepNorm trains (failed fraction post / deepnorm)",
         f"{post_fail:.2f} / {deep_fail:.2f}", post_fail > 0 and deep_fail == 0],
        [f"Post-LN stalls at L={deep} where DeepNorm trains (stalled runs post / deepnorm)",
         f"{cells[('post', deep)]['stalled']}/{cells[('post', deep)]['runs']} / "
         f"{cells[('deepnorm', deep)]['stalled']}/{cells[('deepnorm', deep)]['runs']}",
         cells[("post", deep)]["stalled"] >= STALLS and cells[("deepnorm", deep)]["stalled"] == 0],
        ["p (one-sided Fisher) of that many stalls on Post-LN if both were equally likely to stall",
         f"{stall_p:.3f}", None],
        [f"Post-LN's early update at L={deep} vs DeepNorm's (ratio)", f"{ratio:.2f}", ratio >= EXPLODES],
        *[[f"{p}: early update at L={deep} / at L={shallow}", f"{growth[p]:.2f}", None] for p in PLACEMENTS],
    ]
    gate = stall_premise(runs.where(placement="post", n_layers=deep), "this round's Post-LN runs")
    md = (f"{pc.line(gate)}\n\nMachine: {runs_machine(runs)}. {len(runs)} runs, means over seeds. Update ratio = "
          f"||W_after - W_before|| / "
          f"||W_before|| over all parameters, one optimizer step, logged every step.\n\n{main}\n\n"
          f"### Every run at L={deep}\n\n{per_seed}\n\n### Checks\n\nThresholds fixed before the runs; the stall "
          f"check (stalled: final val loss >= unigram loss - {STALL}) after the first 24 runs and before the "
          f"follow-up seeds.\n\n{table(['check', 'value', 'holds'], checks)}\n")
    return {"cells": [{"placement": p, "n_layers": d, **c} for (p, d), c in cells.items()], "checks": checks,
            "precondition": [gate], "machine": runs_machine(runs)}, md


def stall_premise(post: list[dict], source: str, is_stalled=None) -> dict:
    """DeepNet's premise: Post-LN fails to train at depth (its runs stall at the unigram loss)."""
    k = sum(map(is_stalled or stalled, post))
    depth = post[0]["n_layers"] if post else "?"
    return pc.reported("Post-LN fails to train at depth (DeepNet's motivation; Wang et al. 2022)",
                       f"Post-LN runs at L = {depth} that stalled at the unigram loss", "at least 1",
                       {f"L={depth}": f"{k}/{len(post)}"}, "present" if k else "absent", source)


def plot(runs: Runs, out: Path) -> None:
    plt = pyplot()
    depths = runs.values("n_layers")
    fig, axes = plt.subplots(1, 3, figsize=(17, 4))
    for i, placement in enumerate(PLACEMENTS):
        axes[0].plot(depths, [mean(val_loss(r) for r in runs.where(placement=placement, n_layers=d)) for d in depths],
                     marker="o", color=f"C{i}", label=f"{placement} (mean)")
        at = runs.where(placement=placement)
        axes[0].scatter([r["n_layers"] * (1 + 0.04 * (i - 1)) for r in at], [val_loss(r) for r in at], s=10,
                        color=f"C{i}", alpha=0.5)
        for r in runs.where(placement=placement, n_layers=max(depths), seed=0):
            steps, values = xy(ratios(r))
            axes[1].plot(steps, values, color=f"C{i}", label=placement)
        for r in runs.where(placement=placement, n_layers=max(depths)):
            steps, values = xy(r["curves"][TRAIN_LOSS])
            axes[2].plot(steps, values, color=f"C{i}", lw=0.8, alpha=0.7,
                         label=placement if r["seed"] == 0 else None)
    axes[0].set(xscale="log", xlabel="layers L",
                ylabel="final val loss (diverged = ln V)", title="depth ladder (dim 64), dots: runs")
    axes[1].set(yscale="log", xlabel="step", ylabel="update ratio ||dW|| / ||W||",
                title=f"per-step model update, L={max(depths)}, seed 0")
    axes[0].set_xticks(depths, [str(d) for d in depths], minor=False)
    axes[0].set_xticks([], minor=True)
    axes[2].axhline(runs[0]["unigram_loss"], color="gray", lw=0.8, ls=":", label="unigram loss")
    axes[2].set(xlabel="step", ylabel="train loss (nats/char)", ylim=(1.8, 4.6),
                title=f"train loss, every run at L={max(depths)}")
    for ax in axes:
        ax.legend(fontsize=8)
    save(fig, out / "depth.png")


def main(argv: Sequence[str] | None = None) -> None:
    analysis_main(__doc__, HERE, lambda k: k in (TRAIN_LOSS, VAL_LOSS, UPDATE_RATIO), analyze, plot, argv)


if __name__ == "__main__":
    main()
