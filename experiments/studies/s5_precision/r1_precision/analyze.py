"""S5, training: activation growth per placement under fp32, bf16-mixed and fp16 (GradScaler) on the CPU.

    python train.py -m experiment=s5_precision trainer.precision=32-true,bf16-mixed hydra.sweep.dir=logs/s5/a
    python train.py -m experiment=s5_precision trainer=cpu_fp16 hydra.sweep.dir=logs/s5/b
    # the sweep folder(s) below, or no argument: the committed runs
    python -m experiments.studies.s5_precision.r1_precision.analyze logs/s5/a logs/s5/b
    python -m experiments.studies.s5_precision.r1_precision.analyze --out DIR              # results and plots into DIR

Beside the rules, not part of them: each precision's difference from fp32 with its 95% paired t interval over the
seeds and the engine's word for it at the margin SAME (minillm.analysis.stats.paired_t, verdict), and verdicts.json
(.md,
.png): minillm.analysis.compare's verdicts, each precision against fp32 per placement (what `minillm-report <sweeps>
--compare precision_used --baseline 32-true` gives).

Added after the data (experiments.common.precondition): the premises of "Peri-LN bounds the residual stream" on
the Pre-LN fp32 runs. stream_growth ((r_L / r_1) / sqrt(L)) and massive_activations (max |h| / median |h|) were
not recorded (only max |h| per block); the proxy is the final max |h| after the last block over that after the
first, over sqrt(L).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from experiments.common import precondition as pc
from experiments.common.machine import runs_machine
from experiments.common.plots import pyplot, save, xy
from experiments.common.study import Runs, analysis_main, by_seed, ci, mean, paired, spread, table
from minillm.analysis import stats as st
from minillm.analysis.compare import compare
from minillm.analysis.rules import REGISTERED_BEFORE
from minillm.metrics import AMP_SCALE, parse_metric
from minillm.outcome import final_loss

HERE = Path(__file__).parent
PLACEMENTS = ("pre", "post", "peri")
PRECISIONS = ("32-true", "bf16-mixed", "16-mixed")
# Fixed before the sweep ran.
BOUNDED = 2.0  # Peri-LN "bounds" the residual stream when Pre-LN's final max|h| is >= 2x Peri-LN's
SAME = 0.02  # a precision "does not change the result" when its val loss is within 0.02 nats of fp32's


def resid_block(key: str) -> int | None:
    """i when key is layer_metric(i, "resid_max"), the max |h| of the residual stream after block i."""
    parsed = parse_metric(key)
    i = parsed[1] if parsed and parsed[0] == "layer" and parsed[2] == "resid_max" else None
    return int(i) if i is not None and i.isdigit() else None


def resid_keys(run: dict) -> list[str]:
    """The run's layer/<i>/resid_max curves, in block order."""
    return sorted((k for k in run["curves"] if resid_block(k) is not None), key=resid_block)


def last(run: dict, key: str) -> float | None:
    """The last finite logged value of a curve."""
    points = [v for _, v in run["curves"].get(key, []) if math.isfinite(v)]
    return points[-1] if points else None


def layer_max(run: dict) -> list[float | None]:
    """Final max |h| of the residual stream after each block."""
    return [last(run, k) for k in resid_keys(run)]


def analyze(runs: Runs) -> tuple[dict, str]:
    rows, cells = [], {}
    for placement in PLACEMENTS:
        for precision in PRECISIONS:
            rs = runs.where(placement=placement, precision_used=precision)
            if not rs:
                continue
            per_run = [layer_max(r) for r in rs if resid_keys(r)]
            c = {"val": mean(final_loss(r) for r in rs), "range": spread(final_loss(r) for r in rs),
                 "diverged": sum(bool(r.get("diverged")) for r in rs),
                 "max_h": mean(m[-1] for m in per_run), "max_h_run": max(r.get("max_abs_h") or 0 for r in rs),
                 "per_layer": [mean(v) for v in zip(*per_run, strict=True)],
                 "skipped": sum(r.get("skipped_steps") or 0 for r in rs),
                 "nonfinite": sum(r.get("nonfinite_grad_steps") or 0 for r in rs),
                 "scale": mean(r.get("amp_scale") for r in rs), "tokens_per_s": mean(r["tokens_per_s"] for r in rs)}
            cells[(placement, precision)] = c
            rows.append([placement, precision, c["val"], c["range"], c["diverged"],
                         " / ".join("-" if v is None else f"{v:.1f}" for v in c["per_layer"]),
                         c["max_h_run"], c["skipped"], c["nonfinite"], c["scale"], c["tokens_per_s"]])
    main = table(["placement", "precision", "val loss", "seed range", "diverged", "final max|h| after each block",
                  "max|h| over the run", "skipped steps", "non-finite grad steps", "final loss scale", "tokens/s"],
                 rows, digits=3)
    checks = []
    for precision in PRECISIONS:
        pre, peri = cells.get(("pre", precision)), cells.get(("peri", precision))
        if pre and peri and pre["max_h"] and peri["max_h"]:
            ratio = pre["max_h"] / peri["max_h"]
            checks.append([f"Peri-LN bounds the residual stream ({precision}): pre / peri final max|h|", ratio,
                           "-", "-", ratio >= BOUNDED])
    for placement in PLACEMENTS:
        for precision in PRECISIONS[1:]:
            a, b = cells.get((placement, "32-true")), cells.get((placement, precision))
            if a and b and a["val"] is not None and b["val"] is not None:
                diff = b["val"] - a["val"]
                t = paired(*(by_seed(runs.where(placement=placement, precision_used=q), final_loss)
                             for q in (precision, "32-true")))
                checks.append([f"{placement}: {precision} val loss - fp32", diff, ci(t),
                               st.verdict(t["ci_low"], t["ci_high"], SAME), abs(diff) <= SAME])
    base = [layer_max(r) for r in sorted(runs.where(placement="pre", precision_used="32-true"), key=lambda r: r["seed"])
            if resid_keys(r)]
    proxy = {f"L={len(base[0])}, per seed": " / ".join(f"{x[-1] / x[0] / math.sqrt(len(x)):.2f}" for x in base)}
    gates = [pc.not_recorded("stream_growth", "the runs logged max |h| per block, not its RMS", proxy if base else None,
                             "final max |h| after the last block / after the first, over sqrt(L)"),
             pc.not_recorded("massive_activations", "the runs logged max |h| per block, not the median of |h|")]
    md = (f"Machine: {runs_machine(runs)}. "
          f"{len(runs)} runs, means over seeds. fp16 = `trainer=cpu_fp16`: fp16 autocast "
          f"with a GradScaler (init scale 65536) on the CPU.\n\n{main}\n\n" + "\n\n".join(map(pc.line, gates)) +
          "\n\n### Checks (thresholds fixed before the "
          f"runs)\n\n{table(['check', 'value', '95% CI (paired t)', f'engine (margin {SAME})', 'holds'], checks)}"
          f"\n\nThe interval and the engine's word are beside the rules, not part of them: "
          f"minillm.analysis.stats' paired "
          f"t over the seeds and its verdict at the margin {SAME}. verdicts.md: minillm.analysis.compare's verdicts.\n")
    return {"cells": [{"placement": p, "precision": q, **c} for (p, q), c in cells.items()], "checks": checks,
            "precondition": gates, "machine": runs_machine(runs)}, md


def plot(runs: Runs, out: Path) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8), sharey=True)
    for ax, placement in zip(axes, PLACEMENTS, strict=True):
        r = runs.where(placement=placement, precision_used="32-true", seed=0)[0]
        keys = resid_keys(r)
        for i, k in enumerate(keys):
            steps, values = xy(r["curves"][k])
            ax.plot(steps, values, color=plt.cm.viridis(i / max(1, len(keys) - 1)), label=f"after block {i}")
        ax.set(yscale="log", xlabel="step", title=f"{placement}-LN (fp32, seed 0): max |h|")
    axes[0].set_ylabel("max |h| of the residual stream")
    axes[0].legend(fontsize=7)
    save(fig, out / "residual_growth.png")


def engine(runs: Runs) -> dict:
    """verdicts.json: minillm.analysis.compare, each precision against fp32 per placement, margin SAME."""
    return compare(runs, "precision_used", "32-true", margin=SAME, **REGISTERED_BEFORE)


def main(argv: Sequence[str] | None = None) -> None:
    analysis_main(__doc__, HERE, lambda k: k == AMP_SCALE or resid_block(k) is not None, analyze, plot, argv,
                  engine=engine)


if __name__ == "__main__":
    main()
