"""S8 round 2: why does DyT stall here? Two follow-ups of round 1, whose grid did not bracket the best alpha0 (the
smallest, 0.25, won at every lr) and whose DyT runs mostly ended at the unigram loss. Pre-registered: the rules
below were committed before any run of this round (the README names the commit). Results: this round's folder.

    python train.py -m experiment=s8_dyt norm=dyt model.norm_options.alpha0=0.05,0.1 \\
        optimizer.lr=1e-3,3e-3,1e-2 seed=0,1,2 hydra/launcher=joblib hydra.launcher.n_jobs=2 \\
        hydra.sweep.dir=logs/s8_dyt/multiruns/round2_small                                   # 18 runs
    python train.py -m experiment=s8_dyt norm=dyt model.init=xavier model.norm_options.alpha0=0.1,0.25,0.5,1.0 \\
        optimizer.lr=3e-3 seed=0,1,2 'tags=[xavier]' hydra/launcher=joblib hydra.launcher.n_jobs=2 \\
        hydra.sweep.dir=logs/s8_dyt/multiruns/round2_xavier_dyt                              # 12 runs
    python train.py -m experiment=s8_dyt norm=rmsnorm model.init=xavier optimizer.lr=3e-3 seed=0,1,2 \\
        'tags=[xavier]' hydra/launcher=joblib hydra.launcher.n_jobs=2 \\
        hydra.sweep.dir=logs/s8_dyt/multiruns/round2_xavier_rmsnorm                          # 3 runs
    python -m experiments.studies.s8_dyt.r2_alpha0_init.analyze logs/s8_dyt/multiruns/round2_*

Round 1's committed runs (experiments/studies/s8_dyt/r1_grid/runs.jsonl, same code path and
machine type) supply the alpha0 0.25-2 cells of the gpt2-init grid.

Why unit-scale inputs: with minillm's default GPT-2 init the embeddings are N(0, 0.02), so the first DyT sees
inputs of RMS ~0.02 where tanh is linear and its output is alpha0 x 0.02, while RMSNorm rescales them to 1.
model.init=xavier draws the embeddings N(0, 1) (docs/norms_and_placements.md).

Hypotheses:
  D1 (round 1's H2 left open: does a smaller alpha0 keep helping?): over alpha0 in {0.05 .. 2} at lr 3e-3 (GPT-2
     init, seed means) the best alpha0 is interior (neither the smallest nor the largest): "bracketed";
     otherwise "not bracketed".
  D2 (DyT needs inputs at the scale a norm would give them): with unit-scale embeddings (init xavier, lr 3e-3) the
     best DyT alpha0's paired gap to RMSNorm (same init and seeds) is <= NEAR: confirmed; it is > NEAR but at
     least SHRINK smaller than round 1's gap under GPT-2 init at lr 3e-3 (+0.892): partly; else not at this scale.
A diverged run counts with the loss ln V (minillm.outcome.loss_for_comparison).
Beside D2's rule, not part of it: the 95% paired t interval of the gap (minillm.analysis.stats.paired_t).

Added after the data (experiments.common.precondition; the rules above are unchanged):
  precondition  tanh_saturation at initialization (round 1's saturation.py) for both inits: the GPT-2-init grid (D1;
     a property of the grid, not a test of a claim, so not gated) and the xavier arm, whose best alpha0 D2 reads.
  interval  D2's seed mean read against its thresholds given its 95% interval: the word is the strongest level the
     whole interval supports (the rule's word, on the seed mean alone, is in the text).
  provenance  the commits, kernels and torch versions of the runs of each part (round 1's and round 2's runs).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from experiments.common import precondition as pre
from experiments.common.machine import provenance, runs_machine
from experiments.common.plots import pyplot, save
from experiments.common.study import Runs, ci, load, mean, paired, parse_args, table, write
from experiments.studies.s8_dyt.r1_grid import analyze as s8
from minillm.outcome import loss_for_comparison

HERE = Path(__file__).parent
# --- fixed before the runs ---------------------------------------------------------------------------------
SMALL_ALPHA0 = (0.05, 0.1)
XAVIER_ALPHA0 = (0.1, 0.25, 0.5, 1.0)
LR = 3e-3
NEAR = s8.NEAR  # 0.10 nats
SHRINK = 0.20  # nats
ROUND1_GAP = 0.892  # round 1: DyT (alpha0 0.25) - RMSNorm at lr 3e-3, 400 steps, mean of 3 paired seeds


def xavier(run: dict) -> bool:
    return "xavier" in (run.get("tags") or [])


def cells(runs: Runs, init_xavier: bool, norm: str, lr: float, a0: float | None) -> dict[int, float]:
    return {r["seed"]: loss_for_comparison(r) for r in runs
            if xavier(r) == init_xavier and r.get("norm") == norm and math.isclose(r["lr"], lr)
            and r["max_steps"] == s8.SHORT and s8.alpha0(r) == a0}


def analyze(runs: Runs, saturation: dict[str, list[float]] | None = None) -> tuple[dict, str]:
    """The round's tables and verdicts; ``saturation`` as round 1's analyze takes it (default: the committed file)."""
    from experiments.studies.s8_dyt.r1_grid import saturation as measured

    sat = measured.load() if saturation is None else saturation
    alphas = sorted({*SMALL_ALPHA0, *s8.ALPHA0})
    grid = {(lr, a): mean(cells(runs, False, "dyt", lr, a).values()) for lr in s8.LRS for a in alphas}
    rows = [[f"{lr:g}", *[grid[lr, a] for a in alphas]] for lr in s8.LRS]
    grid_table = table(["lr", *[f"alpha0={a:g}" for a in alphas]], rows)
    at_lr = {a: grid[LR, a] for a in alphas if grid[LR, a] is not None}
    best = min(at_lr, key=at_lr.get)
    d1 = "bracketed" if min(at_lr) < best < max(at_lr) else "not bracketed"

    rms = cells(runs, True, "rmsnorm", LR, None)
    x_cells = {a: cells(runs, True, "dyt", LR, a) for a in XAVIER_ALPHA0}
    x_mean = {a: mean(c.values()) for a, c in x_cells.items()}
    x_best = min(x_mean, key=lambda a: x_mean[a] if x_mean[a] is not None else math.inf)
    gaps = s8.gaps(x_cells[x_best], rms)
    gap = mean(gaps)
    gap_t = paired(x_cells[x_best], rms)
    d2 = ("confirmed" if gap is not None and gap <= NEAR else
          "partly" if gap is not None and gap <= ROUND1_GAP - SHRINK else "not at this scale")
    gates = [s8.saturation_block(sat, "gpt2", alphas), s8.saturation_block(sat, "xavier", XAVIER_ALPHA0)]
    near, shrunk = (pre.against(gaps, t, "at most") for t in (NEAR, ROUND1_GAP - SHRINK))
    d2_interval = ("confirmed" if near["reading"] == "holds" else "partly" if shrunk["reading"] == "holds" else
                   "unresolved" if "unresolved" in (near["reading"], shrunk["reading"]) else "not at this scale")
    d2_word = pre.gate(d2_interval, pre.cell(gates[1], f"alpha0={x_best:g}"))
    x_table = table(["init xavier, lr 3e-3", *[f"DyT alpha0={a:g}" for a in XAVIER_ALPHA0], "RMSNorm"],
                    [["mean val loss", *[x_mean[a] for a in XAVIER_ALPHA0], mean(rms.values())]])
    verdicts = {"D1": (d1, f"best alpha0 at lr {LR:g}: {best:g} of {', '.join(f'{a:g}' for a in alphas)}"),
                "D2": (d2_word, f"by its rule (seed mean): {d2}; by the interval: {near['reading']} against "
                       f"{NEAR:g}, {shrunk['reading']} against {ROUND1_GAP - SHRINK:g}; init xavier: DyT (alpha0 "
                       f"{x_best:g}) - RMSNorm, paired per seed " + " / ".join(f"{g:+.3f}" for g in gaps) +
                       f", mean {gap:+.3f}, 95% CI {ci(gap_t)} (GPT-2 init, round 1: +{ROUND1_GAP:.3f})"
                       if gap is not None else "missing")}
    vt = table(["hypothesis", "verdict", "numbers"], [[k, v, why] for k, (v, why) in verdicts.items()])
    short = Runs(r for r in runs if r["max_steps"] == s8.SHORT)
    origin = provenance(short, lambda r: ("xavier arm" if xavier(r) else "GPT-2-init grid, alpha0 " +
                                          ("0.05-0.1 (round 2)" if s8.alpha0(r) in SMALL_ALPHA0 else
                                           "0.25-2 and RMSNorm (round 1)")))
    lines = "\n\n".join(pre.line(g) for g in gates)
    md = (f"Machine: {runs_machine(runs)}. "
          f"{len(runs)} runs (round 1's and round 2's), 400 steps, seed means; a diverged "
          f"run counts as ln V.\n\n### DyT, GPT-2 init (alpha0 0.25-2 from round 1)\n\n{grid_table}\n\n"
          f"### Unit-scale embeddings\n\n{x_table}\n\n{lines}\n\n{origin}\n\n### Verdicts (rules fixed before the "
          f"runs; the precondition gate and the interval reading added after the data)\n\n{vt}\n")
    return {"grid_gpt2_init": {f"{lr:g}/{a:g}": v for (lr, a), v in grid.items()},
            "xavier": {**{f"dyt/{a:g}": v for a, v in x_mean.items()}, "rmsnorm": mean(rms.values())},
            "paired_gaps_xavier": gaps, "verdicts": verdicts, "machine": runs_machine(runs), "paired_t_xavier": gap_t,
            "precondition": gates, "d2_against": {"near": near, "shrunk": shrunk}}, md


def plot(results: dict, out: Path, runs: Runs | None = None) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4))
    alphas = sorted({*SMALL_ALPHA0, *s8.ALPHA0})
    for lr in s8.LRS:
        ax.plot(alphas, [results["grid_gpt2_init"][f"{lr:g}/{a:g}"] for a in alphas], marker="o",
                label=f"DyT, GPT-2 init, lr {lr:g}")
    ax.plot(XAVIER_ALPHA0, [results["xavier"][f"dyt/{a:g}"] for a in XAVIER_ALPHA0], marker="s", color="k",
            label="DyT, unit-scale embeddings, lr 3e-3")
    ax.axhline(results["xavier"]["rmsnorm"], color="k", ls="--", lw=1, label="RMSNorm, unit-scale embeddings")
    if runs:  # each seed of the xavier arm, and the unigram loss the GPT-2-init plateau sits on
        for a in XAVIER_ALPHA0:
            ys = [loss_for_comparison(r) for r in runs if r.get("init") == "xavier" and r.get("norm") == "dyt"
                  and s8.alpha0(r) == a]
            ax.scatter([a] * len(ys), ys, color="k", s=8, alpha=0.5)
        unigram = mean(r.get("unigram_loss") for r in runs)
        ax.axhline(unigram, color="grey", ls=":", lw=1, label=f"unigram loss {unigram:.3f}")
    ax.set(xscale="log", xlabel="alpha0", ylabel="final val loss, 400 steps (seed mean)", title="S8 round 2")
    ax.legend(fontsize=7)
    save(fig, out / "round2.png")


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(__doc__, argv)
    out = args.out or HERE
    new = load(HERE, args.sweeps, lambda k: False, out)
    round1 = load(s8.HERE, [], lambda k: False)
    runs = Runs([*round1, *new])
    results, md = analyze(runs)
    write(out, results, md)
    plot(results, out, runs)


if __name__ == "__main__":
    main()
