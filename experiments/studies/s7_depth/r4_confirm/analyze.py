"""S7 confirmation, pre-registered: on fresh seeds, does Post-LN at L=48 stall where DeepNorm trains, and which
of DeepNorm's two parts (the residual scale alpha, DeepNet's initialization) removes the stalls?

This file, with its thresholds, was committed before any of its runs existed (the README names the commits).

    python train.py -m experiment=s7_depth name=s7_confirm hydra/launcher=joblib hydra.launcher.n_jobs=2 \\
        model.n_layers=48 placement=post,deepnorm model.init=gpt2,deepnet seed=10,11,12,13,14,15,16,17,18,19 \\
        callbacks.stability.every_n_steps=10
    # the sweep folder(s) below, or no argument: the committed runs
    python -m experiments.studies.s7_depth.r4_confirm.analyze logs/s7_confirm/multiruns/<id>

Four arms, 10 fresh seeds each (seeds 0-9 were seen before: one of them motivated the "stalled" criterion):
    post + gpt2      Post-LN as before (minillm's default init)
    deepnorm + deepnet   DeepNorm as DeepNet defines it (alpha = (2L)^(1/4) and its init)
    post + deepnet   DeepNet's initialization alone (no residual scale)
    deepnorm + gpt2  the residual scale alone (GPT-2's initialization)

The tests are minillm.analysis.stats': the pre-registered one-sided Fisher test (fisher_p, alternative "greater"), and,
reported beside the rules without deciding anything, each arm's stall rate with its Clopper-Pearson interval
(exact_ci) and the two-sided Fisher p of each arm against Post-LN (what minillm-report's fisher_p gives).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from experiments.common import precondition as pc
from experiments.common.machine import provenance, runs_machine
from experiments.common.plots import pyplot, save, xy
from experiments.common.study import load, mean, parse_args, rate_ci, table, write
from minillm.analysis import stats as st
from minillm.metrics import TRAIN_LOSS
from minillm.outcome import final_loss, is_stalled

OUT = Path(__file__).parent
# --- fixed before the runs ---------------------------------------------------------------------------------
STALL_MARGIN = 0.25  # stalled: not diverged and final val loss >= unigram loss - 0.25 nats (minillm.outcome), with
#                      the unigram loss of the evaluated windows (the corrected rule)
CONFIRM_MIN_POST = 2  # confirmed: >= 2 of 10 Post-LN runs stall and 0 of 10 DeepNorm runs do ...
ALPHA = 0.05  # ... and the one-sided Fisher exact test of "Post-LN stalls more often" gives p < 0.05
SUFFICES_MAX = 1  # a part "suffices" when its arm stalls in at most 1 of 10 runs, while Post-LN stalls in >= 2
ARMS = (("post", "gpt2"), ("deepnorm", "deepnet"), ("post", "deepnet"), ("deepnorm", "gpt2"))
NAMES = {("post", "gpt2"): "Post-LN", ("deepnorm", "deepnet"): "DeepNorm (alpha + DeepNet init)",
         ("post", "deepnet"): "DeepNet init only", ("deepnorm", "gpt2"): "alpha only"}


def stalled(run: dict) -> bool:
    return is_stalled(run, STALL_MARGIN)


def plot(runs, cells: dict, out: Path) -> None:
    """confirm.png: the train loss of every run per arm (stalled runs red), the unigram loss dashed."""
    plt = pyplot()
    fig, axes = plt.subplots(1, len(ARMS), figsize=(4 * len(ARMS), 3.4), sharey=True)
    for ax, arm in zip(axes, ARMS, strict=True):
        c = cells[arm]
        for r in sorted(runs.where(placement=arm[0], init=arm[1]), key=lambda r: r["seed"]):
            if r["curves"].get(TRAIN_LOSS):
                ax.plot(*xy(r["curves"][TRAIN_LOSS]), lw=0.8, alpha=0.8, color="tab:red" if stalled(r) else "tab:blue")
        ax.axhline(c["unigram"], ls="--", color="k", lw=0.8, label=f"unigram loss {c['unigram']:.3f}")
        ax.set_title(f"{NAMES[arm]}: {c['stalled']}/{c['runs']} stalled", fontsize=9)
        ax.set_xlabel("step")
        ax.set_ylim(1.8, 4.6)
    axes[0].set_ylabel("train loss (red: stalled)")
    axes[0].legend(fontsize=8)
    save(fig, out / "confirm.png")


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(__doc__, argv)
    out = args.out or OUT
    runs = load(OUT, args.sweeps, lambda k: k == TRAIN_LOSS, out)
    cells = {}
    for arm in ARMS:
        rs = sorted(runs.where(placement=arm[0], init=arm[1]), key=lambda r: r["seed"])
        cells[arm] = {"runs": len(rs), "stalled": sum(map(stalled, rs)),
                      "trained_loss": mean(final_loss(r) for r in rs if not stalled(r)),
                      "per_seed": [(r["seed"], final_loss(r), stalled(r)) for r in rs],
                      "unigram": mean(r["unigram_loss"] for r in rs)}
    post, deep = cells[ARMS[0]], cells[ARMS[1]]
    p = st.fisher_p(post["stalled"], post["runs"], deep["stalled"], deep["runs"], alternative="greater")
    for c in cells.values():
        c["stalled_ci"] = st.exact_ci(c["stalled"], c["runs"])
        c["fisher_p_vs_post"] = st.fisher_p(c["stalled"], c["runs"], post["stalled"], post["runs"])
    confirmed = post["stalled"] >= CONFIRM_MIN_POST and deep["stalled"] == 0 and p < ALPHA
    suffices = {arm: post["stalled"] >= CONFIRM_MIN_POST and cells[arm]["stalled"] <= SUFFICES_MAX
                for arm in ARMS[2:]}
    rows = [[NAMES[arm], arm[0], arm[1], rate_ci(c["stalled"], c["runs"]),
             "-" if arm == ARMS[0] else f"{c['fisher_p_vs_post']:.3f}", c["trained_loss"],
             ", ".join(f"{v:.3f}{'*' if s else ''}" for _, v, s in c["per_seed"])] for arm, c in cells.items()]
    checks = [[f"Post-LN stalls in >= {CONFIRM_MIN_POST}/10, DeepNorm in 0/10, Fisher p < {ALPHA}",
               f"{post['stalled']}/10 vs {deep['stalled']}/10, p = {p:.3f}", confirmed]]
    checks += [[f"{NAMES[arm]} suffices (<= {SUFFICES_MAX}/10 stall while Post-LN has >= {CONFIRM_MIN_POST})",
                f"{cells[arm]['stalled']}/10", suffices[arm]] for arm in ARMS[2:]]
    from experiments.studies.s7_depth.r1_ladder.analyze import stall_premise

    post_runs = runs.where(placement="post", init="gpt2")
    gate = stall_premise(post_runs, "this round's Post-LN arm (its own stall rule)", stalled)
    origin = provenance(runs, lambda r: NAMES[(r["placement"], r["init"])])
    md = (f"{pc.line(gate)}\n\n{origin}\n\nMachine: {runs_machine(runs)}. L=48, LayerNorm, dim 64, lr 3e-3, warmup 40, "
          f"300 steps, seeds 10-19. "
          f"Stalled: final val loss >= unigram loss of the evaluated windows ({post['unigram'] or float('nan'):.3f}) "
          f"- {STALL_MARGIN}; * marks a stalled run. Beside the rules, not part of "
          f"them (minillm.analysis.stats): the 95% Clopper-Pearson interval of each stall rate, "
          f"and the two-sided Fisher p "
          f"of each arm's stalls against Post-LN's.\n\n"
          + table(["arm", "placement", "init", "stalled [95% CI]", "Fisher p vs Post-LN",
                   "final val loss of the runs that trained (mean)", "final val loss per seed (10-19)"], rows)
          + "\n\n" + table(["check (fixed before the runs)", "measured", "holds"], checks) + "\n")
    write(out, {"cells": {f"{a[0]}+{a[1]}": c for a, c in cells.items()}, "fisher_p": p, "confirmed": confirmed,
                "suffices": {f"{a[0]}+{a[1]}": s for a, s in suffices.items()}, "precondition": [gate],
                "machine": runs_machine(runs)}, md)
    plot(runs, cells, out)


if __name__ == "__main__":
    main()
