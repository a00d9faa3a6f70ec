"""S7 round 6 (pre-registered): do the residual scalars still cost loss at L = 48 when the budget is
longer and the lr is not S7's, against DeepNorm in the same sweep? Round 5 confirmed that ReZero and LayerScale
take Post-LN at 48 layers from 5 of 10 failed runs to 0 of 10, but its runs that trained ended worse with a scalar
(2.196 and 2.188 against Post-LN's 2.099 and round 4's DeepNorm at 2.079, other seeds), at 300 steps and lr 3e-3,
short for scalars that start at 0 or 1e-6 and must grow before a block contributes. This round asks whether that
cost is a budget or lr effect. The rules below are committed before any run; the data commit cites this one.

Setting: configs/experiment/s7_depth.yaml at L = 48 (LayerNorm, dim 64, 4 heads, warmup 40, no clipping, GPT-2's
init; 2.6M parameters) at STEPS steps (3x round 5's), compiled, the stability metrics every 50 steps; arms post,
post+rezero, post+layerscale (model.branch_scale, its default inits) and deepnorm; lr LRS; fresh seeds SEEDS:
80 runs, run.sh beside this file.

    bash experiments/studies/s7_depth/r6_scalars_budget/run.sh 3e-3
    bash experiments/studies/s7_depth/r6_scalars_budget/run.sh 1e-2

Compute estimate, measured on the 2-core VM before the pre-registration (two compiled processes of one thread side
by side, 200 steps): 2.6k tokens/s per process after ~2.5 min of compilation, so ~8 min a run of 900 steps and
~5.5 h for the 80 runs; run.sh runs one lr per call (40 runs, ~2.8 h), so the two halves may run apart,
from the same commit. Failed runs that trip the divergence guard end early.

Measure, per run: "failed" = diverged, not trained, or stalled within STALL_MARGIN nats of the unigram loss (S7's
rule); the final val loss of a run that did not fail.
Precondition (the gate, per lr): DeepNorm, the reference, trains: it fails in at most SUFFICES of its 10 runs at that
lr. Absent at an lr: that lr's parts read "premise absent at this scale". Reported beside it, deciding nothing:
Post-LN's own failures at each lr (round 5's premise, at this budget).
Hypotheses (per scalar s and lr, 4 parts: the cost of the scalar against DeepNorm on the seed pairs where both
trained, paired by seed; 95% t interval; words from the interval, the Holm-adjusted one-sided p over the 4 parts
reported beside and deciding nothing):
  C-s@lr (the scalar's cost is gone): post+s - deepnorm final val loss at most MARGIN: "confirmed" when the
    interval lies at or below MARGIN, "not at this scale" when it lies wholly above, "unresolved" when it crosses.
  Fewer than 3 such pairs: "unresolved".
Reported, not tested: each arm's failures with their Clopper-Pearson interval at each lr, and the mean final val loss
of its runs that trained; round 5's 300-step numbers beside them (other seeds, so not a paired comparison).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from experiments.common import precondition as pre
from experiments.common import prereg
from experiments.common.machine import runs_commits, runs_machine
from experiments.common.plots import paired_differences, pyplot, save, seed_lines
from experiments.common.study import Runs, analysis_main, mean, rate_ci, table
from experiments.studies.s7_depth.r5_residual_scalars.analyze import STALL_MARGIN, SUFFICES, scalar_of
from minillm.metrics import TRAIN_LOSS
from minillm.outcome import failed_of, final_loss, is_stalled

HERE = Path(__file__).parent
# --- fixed before the runs ---------------------------------------------------------------------------------
DEPTH, STEPS, SEEDS = 48, 900, tuple(range(30, 40))
LRS = (3e-3, 1e-2)
SCALARS = ("rezero", "layerscale")
ARMS = ("post", "post+rezero", "post+layerscale", "deepnorm")
MARGIN = 0.02  # nats: the project's equivalence margin
MIN_PAIRS = 3


def arm_of(run: dict) -> str | None:
    if run.get("norm") == "none":
        return None
    scalar = scalar_of(run)
    if run.get("placement") == "deepnorm":
        return "deepnorm" if scalar == "none" else None
    if run.get("placement") != "post":
        return None
    return "post" if scalar == "none" else f"post+{scalar}"


def of_this_round(runs: Runs) -> Runs:
    return Runs(r for r in runs if r.get("n_layers") == DEPTH and r["seed"] in SEEDS and r.get("max_steps") == STEPS
                and arm_of(r) is not None and r["lr"] in LRS)


def failed(run: dict) -> bool:
    return failed_of(run) or is_stalled(run, STALL_MARGIN)


def analyze(runs: Runs) -> tuple[dict, str]:
    runs = of_this_round(runs)
    cell = {(a, lr): [r for r in runs if arm_of(r) == a and r["lr"] == lr] for a in ARMS for lr in LRS}
    count = {k: (sum(map(failed, rs)), len(rs)) for k, rs in cell.items()}
    trained = {k: {r["seed"]: final_loss(r) for r in rs if not failed(r) and final_loss(r) is not None}
               for k, rs in cell.items()}
    gates = {}
    for lr in LRS:
        k, n = count["deepnorm", lr]
        status = "not recorded" if n == 0 else "present" if k <= SUFFICES else "absent"
        gates[lr] = pre.reported(f"DeepNorm, the reference, trains at L={DEPTH}, lr {lr:g}",
                                 "failed runs (diverged, not trained or stalled) of 10", f"at most {SUFFICES}",
                                 {f"lr={lr:g}": f"{k}/{n}"}, status, "this round's runs")
    named = {f"C-{s}@{lr:g}": (prereg.diffs(trained[f"post+{s}", lr], trained["deepnorm", lr]), MARGIN, "at most")
             for s in SCALARS for lr in LRS}
    parts = pre.parts(named)
    verdicts = {}
    for name, (values, _, _) in named.items():
        lr = float(name.split("@")[1])
        if len(values) < MIN_PAIRS:
            word, why = "unresolved", f"{name}: {len(values)} seed pair(s) where both trained (fewer than {MIN_PAIRS})"
        else:
            word, why = prereg.verdict_line(name, parts["parts"][name], "post+scalar - deepnorm val loss")
        verdicts[name] = (pre.gate(word, gates[lr]), why)
    rows = [[a, f"{lr:g}", rate_ci(*count[a, lr]), mean(trained[a, lr].values())] for lr in LRS for a in ARMS]
    tab = table(["arm", "lr", "failed (95% CI)", "final val loss of the runs that trained (mean)"], rows)
    vt = table(["hypothesis", "verdict", "numbers"], [[k, w, why] for k, (w, why) in verdicts.items()])
    md = (f"Machine: {runs_machine(runs)} (commit {runs_commits(runs)}).\n\n"
          f"L = {DEPTH}, LayerNorm, {STEPS} steps, seeds {SEEDS[0]}-{SEEDS[-1]}, {len(runs)} runs.\n\n{tab}\n\n"
          + "\n\n".join(pre.line(g) for g in gates.values())
          + f"\n\n### Verdicts (rules fixed before the runs; words from the 95% intervals; {parts['text']})\n\n{vt}\n")
    return {"failed": {f"{a}@{lr:g}": list(c) for (a, lr), c in count.items()},
            "trained_loss": {f"{a}@{lr:g}": v for (a, lr), v in trained.items()}, "verdicts": verdicts,
            "precondition": list(gates.values()), "holm": parts}, md


def plot(runs: Runs, out: Path) -> None:
    """scalars_budget.png (drawn after the data; it decides nothing): per lr, each seed's final val loss per arm
    among the runs that trained (the failed counted in the title), and the per-seed differences the C parts read."""
    res, _ = analyze(runs)
    plt = pyplot()
    fig, axes = plt.subplots(len(LRS), 2, figsize=(14, 4 * len(LRS)), gridspec_kw={"width_ratios": [3, 2]})
    for (left, right), lr in zip(axes, LRS, strict=True):
        value: dict[int, dict[str, float]] = {}
        for arm in ARMS:
            for seed, loss in res["trained_loss"][f"{arm}@{lr:g}"].items():
                value.setdefault(seed, {})[arm] = loss
        failed_of_arm = ", ".join(f"{a} {k}/{n}" for a in ARMS for k, n in [res["failed"][f"{a}@{lr:g}"]])
        seed_lines(left, value, ARMS, "final val loss (runs that trained)", f"lr {lr:g}; failed: {failed_of_arm}")
        left.title.set_fontsize(8)
        paired_differences(right, value, [(f"post+{s}", "deepnorm", MARGIN, f"C-{s}") for s in SCALARS])
    fig.suptitle(f"L = {DEPTH}, {STEPS} steps: Post-LN without and with a scalar, and DeepNorm", fontsize=10)
    save(fig, out / "scalars_budget.png")


def main(argv: Sequence[str] | None = None) -> None:
    analysis_main(__doc__, HERE, lambda k: k == TRAIN_LOSS, analyze, plot, argv)


if __name__ == "__main__":
    main()
