"""S4: BatchNorm vs LayerNorm vs RMSNorm at batch 4 and 64 (Shen et al. 2020; the textbook
reasons of S0).

    python train.py -m experiment=s4_batchnorm                      # 18 runs
    python -m experiments.studies.s4_batchnorm.r1_grid.analyze logs/s4_batchnorm/multiruns/<t>   # or no argument
    python -m experiments.studies.s4_batchnorm.r1_grid.analyze --out DIR             # results and plots into DIR

Beside the rules, not part of them: each difference's 95% paired t interval over the seeds both arms trained
(minillm.analysis.stats.paired_t), and verdicts.json (.md, .png): minillm.analysis.compare's verdicts, each norm
against LayerNorm
per batch size, margin GAP (what `minillm-report <sweep> --compare norm --baseline layernorm --margin 0.05` gives).
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path

from experiments.common import precondition as pc
from experiments.common.machine import runs_machine
from experiments.common.plots import pyplot, save, xy
from experiments.common.study import Runs, analysis_main, by_seed, ci, mean, paired, spread, table
from minillm.analysis.compare import compare
from minillm.analysis.rules import REGISTERED_BEFORE
from minillm.metrics import TRAIN_LOSS, VAL_LOSS, parse_metric
from minillm.outcome import failed_of, final_loss

HERE = Path(__file__).parent
NORMS = ("batchnorm", "layernorm", "rmsnorm")
# Fixed before the sweep ran.
GAP = 0.05  # BN is "worse" than LN when its eval-mode val loss is >= 0.05 nats and >= 2x the seed range higher;
#             RMSNorm is "within noise" of LN when |diff| <= max(0.05, 2x the seed range)
MISMATCH = 0.05  # BN has a train/eval mismatch when its (val - train) gap exceeds LN's by >= 0.05 nats
NOISIER = 2.0  # batch statistics "fluctuate more" at batch 4 when their mean deviation is >= 2x that at 64


def final_train_loss(run: dict, last: int = 50) -> float | None:
    """Mean train loss (batch statistics, train mode) over the last `last` steps."""
    points = [(s, v) for s, v in run["curves"].get(TRAIN_LOSS, []) if math.isfinite(v)]
    if not points:
        return None
    end = points[-1][0]
    return statistics.fmean(v for s, v in points if s > end - last)


def is_bn_mean_dist(key: str) -> bool:
    """A norm site's RMS distance between batch and running means (norm/<site>/bn_mean_dist)."""
    return (parse_metric(key) or ("", "", ""))[::2] == ("norm", "bn_mean_dist")


def bn_deviation(run: dict) -> list[tuple[int, float]]:
    """Per logged step: mean over BatchNorm sites of the RMS distance between batch and running means."""
    by_step = defaultdict(list)
    for key, points in run["curves"].items():
        if is_bn_mean_dist(key):
            for step, value in points:
                by_step[step].append(value)
    return [(s, statistics.fmean(v)) for s, v in sorted(by_step.items())]


def val_train_gap(run: dict) -> float | None:
    """Final val loss (eval mode) - train loss of the last 50 steps (batch statistics)."""
    v, t = final_loss(run), final_train_loss(run)
    return v - t if v is not None and t is not None else None


def engine(runs: Runs) -> dict:
    """verdicts.json: minillm.analysis.compare, each norm against LayerNorm per batch size, margin GAP."""
    return compare(runs, "norm", "layernorm", margin=GAP, **REGISTERED_BEFORE)


def analyze(runs: Runs) -> tuple[dict, str]:
    batches = runs.values("batch_size")
    cells = {}

    def diff(measure: Callable[[dict], float | None], norm: str, b: int) -> dict:
        """The paired t interval of norm - LayerNorm at batch b, of ``measure`` per seed."""
        return paired(*(by_seed(runs.where(norm=n, batch_size=b), measure) for n in (norm, "layernorm")))

    for b in batches:
        for norm in NORMS:
            rs = runs.where(norm=norm, batch_size=b)
            val = [final_loss(r) for r in rs]
            train = [final_train_loss(r) for r in rs]
            devs = [[v for _, v in bn_deviation(r)] for r in rs]
            dev = [mean(d[len(d) // 2:]) for d in devs]
            gaps = [v - t for v, t in zip(val, train, strict=True) if v is not None and t is not None]
            cells[(norm, b)] = {"val": mean(val), "val_range": spread(val), "train": mean(train),
                                "gap": mean(gaps), "bn_dev": mean(dev), "runs": len(rs),
                                "diverged": sum(bool(r.get("diverged")) for r in rs),
                                "failed": sum(map(failed_of, rs)),
                                "val_per_seed": [r.get("final_val_loss") for r in sorted(rs, key=lambda r: r["seed"])]}
    rows = [[norm, b, c["val"], c["val_range"], " / ".join(f"{v:.3f}" for v in c["val_per_seed"]), c["train"],
             c["gap"], c["bn_dev"], f"{c['diverged']} / {c['failed']}"] for (norm, b), c in cells.items()]
    main = table(["norm", "batch", "val loss, eval mode (not diverged)", "seed range", "val loss per seed",
                  "train loss (last 50 steps)", "val - train", "batch vs running mean distance (2nd half)",
                  "diverged / failed"], rows)
    checks = []
    for b in batches:
        bn, ln = cells[("batchnorm", b)], cells[("layernorm", b)]
        noise = max(bn["val_range"] or 0, ln["val_range"] or 0)
        interval = ci(diff(final_loss, "batchnorm", b))
        if bn["val"] is None or bn["diverged"]:  # a diverged BatchNorm run is worse by definition
            d = "-" if bn["val"] is None else f"{bn['val'] - ln['val']:.3f}"
            checks.append([f"BN worse than LN at batch {b}", f"{d} ({bn['diverged']} of {bn['runs']} BN runs "
                           "diverged)", noise, interval, True])
        else:
            d = bn["val"] - ln["val"]
            checks.append([f"BN worse than LN at batch {b}", d, noise, interval, d >= GAP and d >= 2 * noise])
        if bn["gap"] is not None and ln["gap"] is not None:
            checks.append([f"BN train/eval mismatch beyond LN's at batch {b}", bn["gap"] - ln["gap"], None,
                           ci(diff(val_train_gap, "batchnorm", b)), bn["gap"] - ln["gap"] >= MISMATCH])
    small, large = min(batches), max(batches)
    ratio = cells[("batchnorm", small)]["bn_dev"] / cells[("batchnorm", large)]["bn_dev"]
    checks.append([f"batch statistics deviate more at batch {small} than {large} (ratio)", ratio, None, "-",
                   ratio >= NOISIER])
    for b in batches:
        rms, ln = cells[("rmsnorm", b)], cells[("layernorm", b)]
        noise = max(rms["val_range"] or 0, ln["val_range"] or 0)
        d = rms["val"] - ln["val"]
        checks.append([f"RMSNorm within seed noise of LayerNorm at batch {b}", d, noise,
                       ci(diff(final_loss, "rmsnorm", b)), abs(d) <= max(GAP, 2 * noise)])
    gate = pc.none("BatchNorm's small-batch failure is the claim itself, observed or not in these runs")
    md = (f"{pc.line(gate)}\n\nMachine: {runs_machine(runs)}. "
          f"{len(runs)} runs ({len(runs.values('seed'))} seeds per cell), "
          f"means over "
          f"seeds.\n\n{main}\n\n### Checks (thresholds fixed before the runs)\n\n"
          f"{table(['check', 'value', 'seed range', '95% CI (paired t)', 'holds'], checks)}\n\n"
          f"The intervals are beside the rules, not part of them: minillm.analysis.stats' paired t over the seeds both "
          f"arms have a loss for (a diverged run has none). verdicts.md: minillm.analysis.compare's verdicts.\n")
    return {"cells": [{"norm": n, "batch_size": b, **c} for (n, b), c in cells.items()], "checks": checks,
            "precondition": [gate], "machine": runs_machine(runs)}, md


def plot(runs: Runs, out: Path) -> None:
    plt = pyplot()
    batches = runs.values("batch_size")
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    width = 0.8 / len(NORMS)
    for i, norm in enumerate(NORMS):
        for j, b in enumerate(batches):
            rs = runs.where(norm=norm, batch_size=b)
            vals = [v for v in (final_loss(r) for r in rs) if v is not None]
            axes[0].bar(j + i * width, mean(vals), width, color=f"C{i}", label=norm if j == 0 else None)
            axes[0].scatter([j + i * width] * len(vals), vals, color="k", s=8, zorder=3)
            if len(vals) < len(rs):  # diverged seeds are off the scale: say so on the bar
                axes[0].annotate(f"+{len(rs) - len(vals)} diverged", (j + i * width, mean(vals)), ha="center",
                                 va="bottom", fontsize=8, xytext=(0, 14), textcoords="offset points")
    axes[0].set(xticks=[j + width for j in range(len(batches))], xticklabels=[f"batch {b}" for b in batches],
                ylabel="val loss, eval mode (nats/char)", ylim=(1.5, None), title="final val loss per seed")
    axes[0].legend()
    for j, b in enumerate(batches):
        for k, r in enumerate(r for r in runs.where(norm="batchnorm", batch_size=b) if bn_deviation(r)):
            steps, values = xy(bn_deviation(r))
            axes[1].plot(steps, values, color=f"C{j + 3}", alpha=0.8, label=f"batch {b}" if k == 0 else None)
    axes[1].set(yscale="log", xlabel="step", ylabel="RMS(batch mean - running mean)",
                title="BatchNorm: batch statistics vs running statistics")
    axes[1].legend()
    save(fig, out / "batchnorm.png")


def main(argv: Sequence[str] | None = None) -> None:
    analysis_main(__doc__, HERE, lambda k: k in (TRAIN_LOSS, VAL_LOSS) or is_bn_mean_dist(k), analyze, plot, argv,
                  engine=engine)


if __name__ == "__main__":
    main()
