"""S9 round 2: S (ScaleNorm vs LayerNorm) left unresolved by 4 seeds; 12 more seeds at the cell S compares.
Pre-registered: the rule below was committed before any run of this round (the README names the commit).
Results go to this round's folder.

    python train.py -m experiment=s9_scalenorm optimizer.lr=1e-2 scheduler.warmup_steps=40 \\
        seed=4,5,6,7,8,9,10,11,12,13,14,15 hydra/launcher=joblib hydra.launcher.n_jobs=2 \\
        hydra.sweep.dir=logs/s9_scalenorm/multiruns/seeds                   # 24 runs, ~10 min on 2 cores
    python -m experiments.studies.s9_scalenorm.r2_more_seeds.analyze logs/s9_scalenorm/multiruns/seeds  # or no argument

The cell: lr 1e-2 with warmup 40, the best lr of both norms in S9's grid (seeds 0-3, committed). The new seeds'
runs join the committed seeds 0-3 of that cell. Nothing else of S9 is re-judged (W stays over seeds 0-3).

Hypothesis S, as in analyze.py, over seeds 0-15: the 95% t-interval of ScaleNorm - LayerNorm, paired by seed.
Confirmed: its upper end < MARGIN_PARITY ("better" added when < 0); contradicted: its lower end > MARGIN_PARITY;
otherwise unresolved. Reported beside it: whether the interval excludes zero, and the engine's word
(analyze.parity). verdicts.json (.md, .png): minillm.analysis.compare on the cell's runs, ScaleNorm against LayerNorm
at lr
LR, as `minillm-report --compare norm --baseline layernorm --lr 0.01` gives it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from experiments.common import precondition as pc
from experiments.common.machine import provenance, runs_machine
from experiments.common.plots import pyplot, save
from experiments.common.study import Runs, load, parse_args, table, write, write_verdicts
from experiments.studies.s9_scalenorm.r1_grid import analyze as s9
from minillm.analysis.compare import compare
from minillm.analysis.rules import REGISTERED_BEFORE
from minillm.outcome import loss_for_comparison

HERE = Path(__file__).parent
# --- fixed before the runs ---------------------------------------------------------------------------------
LR, WARMUP = 1e-2, 40
SEEDS = range(16)


def compared(runs: Runs) -> dict[str, list[dict]]:
    """norm -> its runs of the cell, seeds in SEEDS."""
    return {n: [r for r in s9.cell(runs, n, WARMUP, LR) if r["seed"] in SEEDS] for n in s9.NORMS}


def analyze(runs: Runs) -> tuple[dict, str]:
    cells = compared(runs)
    per_norm = {n: {r["seed"]: loss_for_comparison(r) for r in rs} for n, rs in cells.items()}
    res = s9.parity(cells["scalenorm"], cells["layernorm"])
    seeds = res["seeds"]
    diffs = [per_norm["scalenorm"][s] - per_norm["layernorm"][s] for s in seeds]
    lo, hi = res["ci_low"], res["ci_high"]
    excludes = lo is not None and (lo > 0 or hi < 0)
    rows = [[s, per_norm["layernorm"][s], per_norm["scalenorm"][s], d] for s, d in zip(seeds, diffs, strict=True)]
    tab = table(["seed", "LayerNorm", "ScaleNorm", "ScaleNorm - LayerNorm"], rows)
    zero = "excludes zero" if excludes else "holds zero"
    numbers = (f"{res['diff']:+.4f}, 95% CI [{lo:+.4f}, {hi:+.4f}] over {len(diffs)} seeds ({zero}; paired t, "
               f"p = {res['p']:.2g}; engine: {res['engine']})" if lo is not None else f"{len(diffs)} seed(s)")
    used = [r for r in runs if r["norm"] in s9.NORMS and r["warmup_steps"] == WARMUP and math.isclose(r["lr"], LR)
            and r["seed"] in seeds]
    gate = pc.none("a parity of two norms, measured on both")
    md = (f"{pc.line(gate)}\n\n{provenance(used, lambda r: r['norm'])} The runs record no start time; their commit is "
          f"the checkout they ran from.\n\nMachine: {runs_machine(used)}. lr {LR:g}, warmup "
          f"{WARMUP}, paired by seed.\n\n"
          f"{tab}\n\n"
          f"### Verdict (rule fixed before the runs)\n\nS: **{res['verdict']}**: ScaleNorm - LayerNorm {numbers}\n\n"
          f"Engine: minillm.analysis.stats.paired_t for the interval; "
          f"verdicts.md for minillm.analysis.compare's full verdict.\n")
    return {"verdict": res["verdict"], "mean": res["diff"], "ci": [lo, hi], "seeds": seeds, "diffs": diffs,
            "excludes_zero": excludes, "machine": runs_machine(used), "p": res["p"], "sd": res["sd"],
            "engine_verdict": res["engine"], "precondition": [gate]}, md


def plot(runs: Runs, results: dict, out: Path) -> None:
    """seeds.png: each seed's LayerNorm and ScaleNorm loss (AVX2 seeds 0-3 grey, AVX512 seeds 4-15 blue), and the
    paired differences with their mean, 95% interval and the +-0.02 parity margin."""
    plt = pyplot()
    cells = compared(runs)
    per_norm = {n: {r["seed"]: (loss_for_comparison(r), r.get("cpu_capability")) for r in rs}
                for n, rs in cells.items()}
    fig, (a, b) = plt.subplots(1, 2, figsize=(9, 3.4))
    for s in results["seeds"]:
        (ln, cap), (sn, _) = per_norm["layernorm"][s], per_norm["scalenorm"][s]
        a.plot([0, 1], [ln, sn], marker="o", lw=0.8, color="tab:blue" if cap == "AVX512" else "grey")
    a.set_xticks([0, 1], ["LayerNorm", "ScaleNorm"])
    a.set_ylabel(f"final val loss (lr {LR:g}, warmup {WARMUP})")
    a.set_title("per seed (grey: AVX2, seeds 0-3; blue: AVX512)", fontsize=9)
    b.scatter(results["seeds"], results["diffs"], s=14, color="k")
    b.axhline(results["mean"], color="tab:red", label=f"mean {results['mean']:+.4f}")
    b.axhspan(*results["ci"], color="tab:red", alpha=0.2, label="95% CI (paired t)")
    for m in (-s9.MARGIN_PARITY, s9.MARGIN_PARITY):
        b.axhline(m, ls="--", color="grey", lw=0.8)
    b.axhline(0, color="k", lw=0.5)
    b.set_xlabel("seed")
    b.set_ylabel("ScaleNorm - LayerNorm (nats)")
    b.set_title(f"parity margin +-{s9.MARGIN_PARITY:g} dashed", fontsize=9)
    b.legend(fontsize=8)
    save(fig, out / "seeds.png")


def engine(runs: Runs) -> dict:
    """verdicts.json: minillm.analysis.compare on the cell's runs (seeds in SEEDS), ScaleNorm against LayerNorm at
    LR."""
    return compare([r for rs in compared(runs).values() for r in rs], "norm", "layernorm", margin=s9.MARGIN_PARITY,
                   lr=LR, **REGISTERED_BEFORE)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(__doc__, argv)
    out = args.out or HERE
    new = load(HERE, args.sweeps, lambda k: False, out)
    first = load(s9.HERE, [], lambda k: False)
    runs = Runs([*first, *new])
    results, md = analyze(runs)
    write(out, results, md)
    write_verdicts(out, engine(runs))
    plot(runs, results, out)


if __name__ == "__main__":
    main()
