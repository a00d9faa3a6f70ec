"""S9: ScaleNorm against LayerNorm, and Pre-LN without warmup (Nguyen & Salazar 2019). Pre-registered: the rules
below were committed before any run of this study (the README names the commit).

    python train.py -m experiment=s9_scalenorm hydra/launcher=joblib hydra.launcher.n_jobs=2   # 48 runs, ~15 min
    python -m experiments.studies.s9_scalenorm.r1_grid.analyze logs/s9_scalenorm/multiruns/<t>   # or no argument

Setting (configs/experiment/s9_scalenorm.yaml): Pre-LN, SmallInit (model.init=small), 4 layers, dim 64, 400
steps, no clipping; norm {layernorm, scalenorm} x warmup {0, 40} x lr {1e-3, 3e-3, 1e-2} x seeds 0-3.
A run's loss is minillm.outcome.loss_for_comparison (a diverged run counts as ln V).

Hypotheses (Nguyen & Salazar 2019, "Transformers without Tears"):
  W  Pre-LN trains without warmup: for each norm, the best seed-mean loss over the lr grid without warmup is
     within MARGIN_WARMUP of that with warmup 40, and no run of that cell fails (minillm.outcome's rule).
     Confirmed: both norms; partly: one; not at this scale: neither.
  S  ScaleNorm is at least as good as LayerNorm: paired over seeds, each norm at its best lr with warmup 40,
     the 95% t-interval of ScaleNorm - LayerNorm. Confirmed: its upper end < MARGIN_PARITY; contradicted: its
     lower end > MARGIN_PARITY; otherwise unresolved. "better" is added when the upper end is < 0.
  (The paper's speed claim is a kernel question: experiments/benchmarks/kernels times the norms.)
The interval is minillm.analysis.stats.paired_t's; beside S's word, the engine's (minillm.analysis.stats.verdict with
the same
margin: equivalent / better / worse / inconclusive). verdicts.json (.md, .png) holds minillm.analysis.compare's
verdicts for
the whole sweep, norm against LayerNorm in each warmup stratum at each norm's tuned lr: what `minillm-report
<sweep> --compare norm --baseline layernorm` gives.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from experiments.common import precondition as pc
from experiments.common.machine import runs_machine
from experiments.common.plots import pyplot, save
from experiments.common.study import Runs, analysis_main, by_seed, mean, paired, table
from minillm.analysis import stats as st
from minillm.analysis.compare import compare
from minillm.analysis.rules import REGISTERED_BEFORE
from minillm.metrics import VAL_LOSS
from minillm.outcome import failed_of, loss_for_comparison

HERE = Path(__file__).parent
# --- fixed before the runs ---------------------------------------------------------------------------------
NORMS = ("layernorm", "scalenorm")
WARMUPS = (0, 40)
MARGIN_WARMUP = 0.05  # nats
MARGIN_PARITY = 0.02  # nats (S6's parity margin)


def cell(runs: Runs, norm: str, warmup: int, lr: float) -> list[dict]:
    return sorted((r for r in runs if r["norm"] == norm and r["warmup_steps"] == warmup and math.isclose(r["lr"], lr)),
                  key=lambda r: r["seed"])


def parity(scale: Sequence[dict], layer: Sequence[dict]) -> dict:
    """Hypothesis S on the runs of its two cells: the paired t interval of ScaleNorm - LayerNorm (loss per
    minillm.outcome.loss_for_comparison), S's word (``verdict``) and the engine's (``engine``)."""
    res = paired(by_seed(scale, loss_for_comparison), by_seed(layer, loss_for_comparison))
    return {**res, "verdict": parity_verdict(res["ci_low"], res["ci_high"]),
            "engine": st.verdict(res["ci_low"], res["ci_high"], MARGIN_PARITY)}


def parity_verdict(lo: float | None, hi: float | None) -> str:
    """Hypothesis S's rule on the 95% interval of ScaleNorm - LayerNorm (no interval: unresolved)."""
    if lo is None or hi is None:
        return "unresolved"
    if hi < MARGIN_PARITY:
        return "confirmed" + (" (better)" if hi < 0 else "")
    return "contradicted" if lo > MARGIN_PARITY else "unresolved"


def numbers(res: dict) -> str:
    """S's interval as the tables write it."""
    if res["ci_low"] is None:
        return f"{res['n']} seed pair(s): no interval"
    return (f"ScaleNorm - LayerNorm {res['diff']:+.4f}, 95% CI [{res['ci_low']:+.4f}, {res['ci_high']:+.4f}] over "
            f"{res['n']} seeds")


def engine(runs: Runs) -> dict:
    """verdicts.json: minillm.analysis.compare on the sweep, each norm against LayerNorm per warmup, at its tuned lr."""
    return compare(runs, "norm", "layernorm", margin=MARGIN_PARITY, **REGISTERED_BEFORE)


def analyze(runs: Runs) -> tuple[dict, str]:
    lrs = runs.values("lr")
    grid = {(n, w, lr): cell(runs, n, w, lr) for n in NORMS for w in WARMUPS for lr in lrs}
    loss = {k: mean(map(loss_for_comparison, rs)) for k, rs in grid.items()}
    fails = {k: sum(map(failed_of, rs)) for k, rs in grid.items()}
    rows = [[n, w, *(f"{loss[n, w, lr]:.3f}" + (f" ({fails[n, w, lr]} failed)" if fails[n, w, lr] else "")
                     for lr in lrs)] for n in NORMS for w in WARMUPS]
    tab = table(["norm", "warmup steps", *(f"lr {lr:g}" for lr in lrs)], rows)
    best_lr = {(n, w): min(lrs, key=lambda lr, n=n, w=w: loss[n, w, lr]) for n in NORMS for w in WARMUPS}

    ok = []
    w_numbers = []
    for n in NORMS:
        d = loss[n, 0, best_lr[n, 0]] - loss[n, 40, best_lr[n, 40]]
        clean = not fails[n, 0, best_lr[n, 0]]
        w_numbers.append(f"{n}: best without - with warmup {d:+.3f} (lr {best_lr[n, 0]:g} vs {best_lr[n, 40]:g}), "
                         f"{fails[n, 0, best_lr[n, 0]]} failed")
        if d <= MARGIN_WARMUP and clean:
            ok.append(n)
    w = "confirmed" if len(ok) == len(NORMS) else "partly" if ok else "not at this scale"

    sc = {r["seed"]: loss_for_comparison(r) for r in grid["scalenorm", 40, best_lr["scalenorm", 40]]}
    ln = {r["seed"]: loss_for_comparison(r) for r in grid["layernorm", 40, best_lr["layernorm", 40]]}
    diffs = [sc[s] - ln[s] for s in sorted(sc) if s in ln]
    s = parity(grid["scalenorm", 40, best_lr["scalenorm", 40]], grid["layernorm", 40, best_lr["layernorm", 40]])
    verdicts = {"W": (w, "; ".join(w_numbers)),
                "S": (s["verdict"], f"{numbers(s)} (lr {best_lr['scalenorm', 40]:g} vs {best_lr['layernorm', 40]:g}"
                                    f"); engine: {s['engine']}")}
    vt = table(["hypothesis", "verdict", "numbers"], [[k, v, why] for k, (v, why) in verdicts.items()])
    gate = pc.none("training without warmup, and parity with LayerNorm, are measured on every arm")
    md = (f"{pc.line(gate)}\n\nMachine: {runs_machine(runs)}. "
          f"{len(runs)} runs, seed-mean loss (a diverged run counts as "
          f"ln V) per cell."
          f"\n\n{tab}\n\n### Verdicts (rules fixed before the runs)\n\n{vt}\n")
    results = {"loss": [{"norm": n, "warmup": w, "lr": lr, "loss": loss[n, w, lr], "failed": fails[n, w, lr]}
                        for n, w, lr in grid], "verdicts": verdicts, "paired_diffs": diffs,
                        "machine": runs_machine(runs),
               "precondition": [gate],
               "S_interval": s}
    return results, md


def plot(runs: Runs, out: Path) -> None:
    plt = pyplot()
    lrs = runs.values("lr")
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    for i, n in enumerate(NORMS):
        for w in WARMUPS:
            axes[0].plot(lrs, [mean(map(loss_for_comparison, cell(runs, n, w, lr))) for lr in lrs], marker="o",
                         color=f"C{i}", linestyle="-" if w else "--", label=f"{n}, warmup {w}")
            r = next(iter(cell(runs, n, w, max(lrs))), None)
            if r and r["curves"].get(VAL_LOSS):
                steps, values = zip(*r["curves"][VAL_LOSS], strict=True)
                axes[1].plot(steps, values, color=f"C{i}", linestyle="-" if w else "--", label=f"{n}, warmup {w}")
    axes[0].set(xscale="log", xlabel="peak lr", ylabel="final val loss (diverged = ln V)", title="loss by lr")
    axes[1].set(xlabel="step", ylabel="val loss", title=f"lr {max(lrs):g}, seed 0")
    for ax in axes:
        ax.legend(fontsize=8)
    save(fig, out / "scalenorm.png")


def main(argv: Sequence[str] | None = None) -> None:
    analysis_main(__doc__, HERE, lambda k: k == VAL_LOSS, analyze, plot, argv, engine=engine)


if __name__ == "__main__":
    main()
