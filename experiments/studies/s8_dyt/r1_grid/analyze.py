"""S8: DyT (Zhu et al. 2025) against RMSNorm, alpha0 x lr, two token budgets. Pre-registered: the thresholds
and rules below were committed before any run of this study (the README names the commit).

    python -m experiments.studies.s8_dyt.r1_grid.run  # the three sweeps, then this analysis (~17 min)
    # the sweep folder(s) below, or no argument: the committed runs
    python -m experiments.studies.s8_dyt.r1_grid.analyze logs/s8_dyt/multiruns/<grid> <baseline> <long>

Hypotheses, each with its published source:
  H1 (Zhu et al. 2025, LLaMA 7B-70B: DyT matches RMSNorm's loss with alpha0 tuned): the best DyT cell (alpha0
      and lr tuned on the grid, mean over seeds) against the best RMSNorm lr at 400 steps, and the paired gap at
      1600 steps (lr 3e-3, the best alpha0 at 3e-3). Confirmed: gap <= PARITY at both budgets; partly: <= NEAR
      at both; otherwise not at this scale.
  H2 (Zhu et al. 2025, section "Initialization of alpha": smaller alpha0 trains more stably, a larger lr needs a
      smaller alpha0): the best alpha0 at lr 1e-2 is smaller than at lr 1e-3, and the spread of the mean loss
      over alpha0 at lr 1e-2 is >= SENSITIVITY x that at 1e-3. Confirmed: both; partly: one; else not at this
      scale.
  H3 (arXiv 2604.23434, "When does removing LayerNorm help?": DyT's bounding helps when tokens are scarce and
      costs once more tokens come): DyT's gap to RMSNorm (same seeds, lr 3e-3, the best alpha0 at 3e-3) grows
      from 400 to 1600 steps. Confirmed: the mean paired gap grows by more than the larger of the two budgets'
      sd of the paired gaps; contradicted: shrinks by more; otherwise not resolved.
A diverged run counts with the loss ln V (minillm.outcome.loss_for_comparison).
The sd of the paired gaps (H3's noise) and, beside the rules without deciding anything, the 95% paired t intervals
of the gaps at both budgets and of their growth come from minillm.analysis.stats.paired_t
(experiments.common.study.paired).

Added after the data (experiments.common.precondition; the rules above are unchanged): the premise tanh_saturation,
the fraction of DyT's inputs with |alpha x| >= 1, measured at initialization for each alpha0 of the grid
(saturation.py, saturation_at_init.json; the runs logged no DyT input statistics, so its value during training is
not known). Where it is absent at every alpha0, H1-H3 read PREMISE_ABSENT: a DyT whose tanh stays linear is a
scaled identity, not the bounded map the claims are about. H3 also reports the budgets in tokens per parameter.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from experiments.common import precondition as pre
from experiments.common.machine import runs_machine
from experiments.common.plots import pyplot, save
from experiments.common.study import Runs, ci, load, mean, paired, parse_args, table, write
from minillm.metrics import TRAIN_LOSS, VAL_LOSS
from minillm.outcome import loss_for_comparison

HERE = Path(__file__).parent
# --- fixed before the runs ---------------------------------------------------------------------------------
ALPHA0 = (0.25, 0.5, 1.0, 2.0)
LRS = (1e-3, 3e-3, 1e-2)
SEEDS = (0, 1, 2)
SHORT, LONG = 400, 1600  # steps: the two token budgets (x 16 x 64 tokens)
LONG_LR = 3e-3
PARITY = 0.03  # nats: "matches" (the calibration target)
NEAR = 0.10  # nats: "partly"
SENSITIVITY = 2.0  # H2: the alpha0 spread at lr 1e-2 must be >= 2x that at 1e-3


def alpha0(run: dict) -> float | None:
    return (run.get("norm_options") or {}).get("alpha0") if run.get("norm") == "dyt" else None


def cell(runs: Runs, norm: str, lr: float, steps: int, a0: float | None = None) -> dict[int, float]:
    """seed -> comparison loss of the runs of one cell."""
    return {r["seed"]: loss_for_comparison(r) for r in runs
            if r.get("norm") == norm and math.isclose(r["lr"], lr) and r["max_steps"] == steps and alpha0(r) == a0}


def gaps(dyt: dict[int, float], rms: dict[int, float]) -> list[float]:
    """DyT - RMSNorm per seed both ran, in seed order."""
    return [dyt[s] - rms[s] for s in sorted(dyt) if s in rms]


def saturation_block(saturation: dict[str, list[float]], init: str = "gpt2",
                     alphas: Sequence[float] = ALPHA0) -> dict:
    """tanh_saturation at initialization for the given init and alpha0s (saturation.py's measurements)."""
    cells = {f"alpha0={a:g}": saturation.get(f"{init}/{a:g}", []) for a in alphas}
    return pre.measure("tanh_saturation", cells, "at initialization, 128 val windows (saturation.py); not recorded "
                                                 "during training")


def analyze(runs: Runs, saturation: dict[str, list[float]] | None = None) -> tuple[dict, str]:
    """The round's tables and verdicts; ``saturation``: init/alpha0 -> fraction per seed (default: the committed
    saturation_at_init.json)."""
    from experiments.studies.s8_dyt.r1_grid import saturation as measured

    gate = saturation_block(measured.load() if saturation is None else saturation)
    grid = {(lr, a0): mean(cell(runs, "dyt", lr, SHORT, a0).values()) for lr in LRS for a0 in ALPHA0}
    rms = {lr: mean(cell(runs, "rmsnorm", lr, SHORT).values()) for lr in LRS}
    diverged = {(lr, a0): sum(bool(r.get("diverged")) for r in runs if r.get("norm") == "dyt" and
                              math.isclose(r["lr"], lr) and alpha0(r) == a0 and r["max_steps"] == SHORT)
                for lr in LRS for a0 in ALPHA0}
    rows = [[f"{lr:g}", *[f"{grid[lr, a]:.3f}" + (f" ({diverged[lr, a]} div.)" if diverged[lr, a] else "")
                          if grid[lr, a] is not None else "-" for a in ALPHA0], rms[lr]] for lr in LRS]
    grid_table = table(["lr", *[f"DyT alpha0={a:g}" for a in ALPHA0], "RMSNorm"], rows)

    best_a0 = {lr: min(ALPHA0, key=lambda a, lr=lr: grid[lr, a]) for lr in LRS}
    best_dyt = min(grid.values())
    best_rms = min(rms.values())
    gap_short = best_dyt - best_rms
    a0_long = best_a0[LONG_LR]
    short_cells = cell(runs, "dyt", LONG_LR, SHORT, a0_long), cell(runs, "rmsnorm", LONG_LR, SHORT)
    long_cells = cell(runs, "dyt", LONG_LR, LONG, a0_long), cell(runs, "rmsnorm", LONG_LR, LONG)
    short_pairs, long_pairs = gaps(*short_cells), gaps(*long_cells)
    short_t, long_t = paired(*short_cells), paired(*long_cells)
    gap_long = mean(long_pairs)

    def verdict_h1() -> str:
        if gap_long is None:
            return "not run"
        if max(gap_short, gap_long) <= PARITY:
            return "confirmed"
        return "partly" if max(gap_short, gap_long) <= NEAR else "not at this scale"

    spread = {lr: max(grid[lr, a] for a in ALPHA0) - min(grid[lr, a] for a in ALPHA0) for lr in LRS}
    smaller = best_a0[max(LRS)] < best_a0[min(LRS)]
    more_sensitive = spread[max(LRS)] >= SENSITIVITY * spread[min(LRS)]
    h2 = {2: "confirmed", 1: "partly", 0: "not at this scale"}[smaller + more_sensitive]

    growth = (gap_long - mean(short_pairs)) if gap_long is not None and short_pairs else None
    noise = max(short_t["sd"] or 0.0, long_t["sd"] or 0.0)  # the larger sd of the paired gaps
    growth_t = paired({s: long_cells[0][s] - long_cells[1][s] for s in long_t["seeds"]},
                      {s: short_cells[0][s] - short_cells[1][s] for s in short_t["seeds"]})
    h3 = ("not run" if growth is None else "confirmed" if growth > noise else
          "contradicted" if growth < -noise else "not resolved")

    n_params = mean(r.get("n_params") for r in runs if r.get("norm") == "rmsnorm" and r.get("n_params"))
    per_param = {steps: steps * 16 * 64 / n_params for steps in (SHORT, LONG)} if n_params else {}
    rule = {"h1": verdict_h1(), "h2": h2, "h3": h3}
    word = {k: pre.gate(v, gate) for k, v in rule.items()}
    results = {
        "machine": runs_machine(runs), "alpha0": ALPHA0, "lrs": LRS, "seeds": SEEDS, "steps": [SHORT, LONG],
        "grid_mean_loss": {f"{lr:g}/{a:g}": v for (lr, a), v in grid.items()},
        "rmsnorm_mean_loss": {f"{lr:g}": v for lr, v in rms.items()},
        "best_alpha0_per_lr": {f"{lr:g}": a for lr, a in best_a0.items()},
        "alpha0_spread_per_lr": {f"{lr:g}": v for lr, v in spread.items()},
        "h1": {"gap_short_best_cells": gap_short, "long_alpha0": a0_long, "paired_gaps_short": short_pairs,
               "paired_gaps_long": long_pairs, "gap_long": gap_long, "verdict": word["h1"], "rule_verdict": rule["h1"],
               "paired_t_short": short_t, "paired_t_long": long_t},
        "h2": {"best_alpha0_smaller_at_high_lr": smaller, "more_sensitive_at_high_lr": more_sensitive,
               "verdict": word["h2"], "rule_verdict": rule["h2"]},
        "h3": {"gap_growth": growth, "noise": noise, "verdict": word["h3"], "rule_verdict": rule["h3"],
               "paired_t_growth": growth_t, "tokens_per_parameter": {str(k): v for k, v in per_param.items()}},
        "precondition": [gate],
    }
    pairs_table = table(["budget", "seeds", "DyT - RMSNorm per seed", "mean", "95% CI (paired t)"],
                        [[f"{SHORT} steps", len(short_pairs), " / ".join(f"{v:+.3f}" for v in short_pairs),
                          mean(short_pairs), ci(short_t)],
                         [f"{LONG} steps", len(long_pairs), " / ".join(f"{v:+.3f}" for v in long_pairs), gap_long,
                          ci(long_t)]])
    md = "\n".join([
        f"# S8 results\n\nMachine: {results['machine']}.\n",
        f"## Mean final val loss, {SHORT} steps ({len(SEEDS)} seeds; diverged runs count as ln V)\n", grid_table,
        "", f"Best alpha0 per lr: {', '.join(f'{lr:g}: {a:g}' for lr, a in best_a0.items())}; spread over alpha0: "
            f"{', '.join(f'{lr:g}: {v:.3f}' for lr, v in spread.items())}.\n",
        f"## DyT (alpha0 {a0_long:g}) - RMSNorm at lr {LONG_LR:g}, paired by seed\n", pairs_table, "",
        f"- H1 (parity with tuned alpha0): best cells {gap_short:+.3f} at {SHORT} steps, "
        f"{'-' if gap_long is None else f'{gap_long:+.3f}'} at {LONG} steps -> **{word['h1']}** (by its rule: "
        f"{rule['h1']})",
        f"- H2 (larger lr needs smaller alpha0): best alpha0 smaller at lr {max(LRS):g}: {smaller}; "
        f"spread {spread[max(LRS)]:.3f} vs {spread[min(LRS)]:.3f} (>= {SENSITIVITY:g}x: {more_sensitive}) -> "
        f"**{word['h2']}** (by its rule: {rule['h2']})",
        f"- H3 (the gap grows with tokens): growth {'-' if growth is None else f'{growth:+.3f}'}, noise {noise:.3f}"
        f" -> **{word['h3']}** (by its rule: {rule['h3']}); the budgets are "
        + ", ".join(f"{v:.1f}" for v in per_param.values()) + " tokens per parameter",
        "", pre.line(gate),
        "", f"Beside the rules, not part of them: the intervals are minillm.analysis.stats' paired t "
            f"over the seeds; the "
            f"growth's, paired by seed, is {ci(growth_t)}."])
    return results, md


def plot(runs: Runs, results: dict, out: Path) -> None:
    plt = pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for lr in LRS:
        ys = [results["grid_mean_loss"][f"{lr:g}/{a:g}"] for a in ALPHA0]
        line = left.plot(ALPHA0, ys, marker="o", label=f"DyT, lr {lr:g}")[0]
        left.axhline(results["rmsnorm_mean_loss"][f"{lr:g}"], color=line.get_color(), ls="--", lw=1)
        for a in ALPHA0:  # each seed
            seeds = cell(runs, "dyt", lr, SHORT, a).values()
            left.scatter([a] * len(seeds), list(seeds), color=line.get_color(), s=8, alpha=0.5)
    unigram = mean(r.get("unigram_loss") for r in runs)
    for ax in (left, right):
        ax.axhline(unigram, color="k", ls=":", lw=1, label=f"unigram loss {unigram:.3f}")
    left.set(xscale="log", xlabel="alpha0", ylabel=f"final val loss, {SHORT} steps (mean of seeds)",
             title="DyT vs alpha0 (dashed: RMSNorm at that lr; dots: seeds)")
    left.legend(fontsize=8)
    a0 = results["h1"]["long_alpha0"]
    for r in runs:
        if r["max_steps"] == LONG and math.isclose(r["lr"], LONG_LR) and r.get("norm") in ("dyt", "rmsnorm"):
            pts = r["curves"].get(VAL_LOSS, [])
            color = "C0" if r["norm"] == "dyt" else "C3"
            name = f"DyT alpha0 {a0:g}" if r["norm"] == "dyt" else "RMSNorm"
            right.plot([s for s, _ in pts], [v for _, v in pts], color=color, alpha=0.7,
                       label=f"{name}, seed {r['seed']}")
    right.set(xlabel="step", ylabel="val loss", title=f"{LONG} steps, lr {LONG_LR:g}")
    right.legend(fontsize=7)
    save(fig, out / "dyt.png")


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(__doc__, argv)
    out = args.out or HERE
    runs = load(HERE, args.sweeps, lambda k: k in (VAL_LOSS, TRAIN_LOSS), args.out)
    results, md = analyze(runs)
    write(out, results, md)
    plot(runs, results, out)


if __name__ == "__main__":
    main()
