"""S7, the mechanism: does Post-LN's early *model update* (the change of the model's output per step, DeepNet's
||ΔF||) explode at L=48, and does it tell the runs that stalled from those that trained?

Reruns the first 100 steps of the 20 runs at L=48 (Post-LN and DeepNorm, seeds 0-9) with the same schedule
and ``callbacks.stability.output_change=true``, which adds two eval-mode forwards per step and leaves training
untouched, so each rerun repeats the committed run's losses and inherits its "stalled" label:

    python train.py -m experiment=s7_depth placement=post,deepnorm model.n_layers=48 seed=0,1,2,3,4,5,6,7,8,9 \\
        trainer.max_steps=100 scheduler.total_steps=300 callbacks.stability.output_change=true
    # the sweep folder(s) below, or no argument: the committed runs
    python -m experiments.studies.s7_depth.r2_output_change.analyze logs/s7_output/<time>
    python -m experiments.studies.s7_depth.r2_output_change.analyze --out DIR               # results and plot into DIR
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from experiments.common import precondition as pc
from experiments.common.machine import runs_machine
from experiments.common.plots import pyplot, save, xy
from experiments.common.study import load, mean, parse_args, table, write
from experiments.studies.s7_depth.r1_ladder import analyze as ladder
from experiments.studies.s7_depth.r1_ladder.analyze import EARLY, EXPLODES, stalled
from minillm.metrics import OUTPUT_CHANGE, TRAIN_LOSS, UPDATE_RATIO

OUT = Path(__file__).parent
METRICS = (TRAIN_LOSS, OUTPUT_CHANGE, UPDATE_RATIO)


def early_max(run: dict, metric: str) -> float:
    return max(v for s, v in run["curves"][metric] if s < EARLY)


def early_argmax(run: dict) -> int:
    """Step of the largest model update in the first EARLY steps."""
    return max(((s, v) for s, v in run["curves"][OUTPUT_CHANGE] if s < EARLY), key=lambda sv: sv[1])[0]


def late_mean(run: dict) -> float:
    """Mean model update over the steps from 50 on (of the first 100): does the model still move?"""
    return mean(v for s, v in run["curves"][OUTPUT_CHANGE] if s >= EARLY)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(__doc__, argv)
    out = args.out or OUT
    runs = load(OUT, args.sweeps, lambda k: k in METRICS, out)
    deep = max(r["n_layers"] for r in runs)
    full = {(r["placement"], r["seed"]): r for r in load(ladder.HERE, [], lambda k: k == TRAIN_LOSS)
            if r["n_layers"] == deep}
    groups: dict[str, list[dict]] = {"post, stalled": [], "post, trained": [], "deepnorm": []}
    mismatch = 0.0  # largest |train loss of the rerun - train loss of the full run| at a common step
    for r in runs:
        ref = full[(r["placement"], r["seed"])]
        ref_loss = dict(ref["curves"][TRAIN_LOSS])
        mismatch = max([mismatch, *(abs(v - ref_loss[s]) for s, v in r["curves"][TRAIN_LOSS] if s in ref_loss)])
        r["stalled"] = stalled(ref)
        key = "deepnorm" if r["placement"] == "deepnorm" else f"post, {'stalled' if r['stalled'] else 'trained'}"
        groups[key].append(r)
    rows = [[g, len(rs), mean(early_max(r, OUTPUT_CHANGE) for r in rs),
             min(early_max(r, OUTPUT_CHANGE) for r in rs), max(early_max(r, OUTPUT_CHANGE) for r in rs),
             mean(late_mean(r) for r in rs), mean(early_max(r, UPDATE_RATIO) for r in rs)]
            for g, rs in groups.items() if rs]
    post = groups["post, stalled"] + groups["post, trained"]
    ratio = mean(early_max(r, OUTPUT_CHANGE) for r in post) / mean(
        early_max(r, OUTPUT_CHANGE) for r in groups["deepnorm"])
    stall_min = min((early_max(r, OUTPUT_CHANGE) for r in groups["post, stalled"]), default=None)
    trained_max = max((early_max(r, OUTPUT_CHANGE) for r in groups["post, trained"]), default=None)
    separates = None if stall_min is None or trained_max is None else stall_min > trained_max
    checks = [[f"Post-LN's early model update vs DeepNorm's (mean of max over steps < {EARLY})", f"{ratio:.2f}",
               ratio >= EXPLODES],
              ["every stalled Post-LN run's early model update exceeds every trained one's",
               f"{fmt_pair(stall_min, trained_max)}", separates]]
    from experiments.studies.s7_depth.r1_ladder.analyze import stall_premise

    gate = stall_premise(post, "the full runs these reruns repeat (their stall from round 1)",
                         lambda r: r in groups["post, stalled"])
    md = (f"{pc.line(gate)}\n\nMachine: {runs_machine(runs)}. {len(runs)} reruns of the first 100 steps at L=48. Model "
          f"update = RMS change of "
          f"the log-probabilities of 4 probe sequences over one optimizer step (eval mode). Largest difference "
          f"between a rerun's train losses and its full run's: {mismatch:.2e}.\n\n"
          + table(["runs", "n", f"max model update, steps < {EARLY} (mean)", "min", "max",
                   f"mean model update, steps {EARLY}-99", f"max update ratio dW/W, steps < {EARLY} (mean)"],
                  rows, digits=4)
          + "\n\n### Checks (thresholds fixed before the reruns)\n\n"
          + table(["check", "value", "holds"], checks)
          + "\n\n### Every run\n\n"
          + table(["runs", "seed", f"max model update, steps < {EARLY}", "at step",
                   f"mean model update, steps {EARLY}-99"],
                  [[g, r["seed"], early_max(r, OUTPUT_CHANGE), early_argmax(r), late_mean(r)]
                   for g, rs in groups.items() for r in sorted(rs, key=lambda r: r["seed"])], digits=3))
    write(out, {"rows": rows, "checks": checks, "max_loss_mismatch": mismatch, "precondition": [gate],
                "machine": runs_machine(runs)}, md)
    plot(groups, out)


def fmt_pair(a: float | None, b: float | None) -> str:
    return "-" if a is None or b is None else f"min stalled {a:.3f} vs max trained {b:.3f}"


def plot(groups: dict[str, list[dict]], out: Path) -> None:
    plt = pyplot()
    colors = {"post, stalled": "C3", "post, trained": "C1", "deepnorm": "C2"}
    fig, axes = plt.subplots(1, 2, figsize=(12, 4))
    for g, rs in groups.items():
        for i, r in enumerate(rs):
            for ax, metric in zip(axes, (OUTPUT_CHANGE, TRAIN_LOSS), strict=True):
                steps, values = xy(r["curves"][metric])
                ax.plot(steps, values, color=colors[g], lw=0.8, alpha=0.7, label=g if i == 0 else None)
    axes[0].set(yscale="log", xlabel="step", ylabel="RMS change of log-probs per step",
                title="model update per step, L=48")
    axes[1].set(xlabel="step", ylabel="train loss (nats/char)", title="train loss (first 100 of 300 steps)")
    for ax in axes:
        ax.axvline(40, color="gray", lw=0.8, ls=":")  # end of warmup
        ax.legend(fontsize=8)
    save(fig, out / "output_change.png")


if __name__ == "__main__":
    main()
