"""S4: BatchNorm vs LayerNorm vs RMSNorm at batch 4 and 64 (Shen et al. 2020; seeds/002).

    python train.py -m experiment=s4_batchnorm                      # 18 runs
    python experiments/s4_batchnorm/analyze.py logs/s4_batchnorm/multiruns/<t>   # or no argument
"""

from __future__ import annotations

import statistics
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from study import Runs, load, machine, mean, spread, table, write  # noqa: E402

HERE = Path(__file__).parent
NORMS = ("batchnorm", "layernorm", "rmsnorm")
# Fixed before the sweep ran.
GAP = 0.05  # BN is "worse" than LN when its eval-mode val loss is >= 0.05 nats and >= 2x the seed range higher
MISMATCH = 0.05  # BN has a train/eval mismatch when its (val - train) gap exceeds LN's by >= 0.05 nats
NOISIER = 2.0  # batch statistics "fluctuate more" at batch 4 when their mean deviation is >= 2x that at 64


def final_train_loss(run: dict, last: int = 50) -> float:
    """Mean train loss (batch statistics, train mode) over the last `last` steps."""
    points = run["curves"]["train/loss"]
    end = points[-1][0]
    return statistics.fmean(v for s, v in points if s > end - last)


def bn_deviation(run: dict) -> list[tuple[int, float]]:
    """Per logged step: mean over BatchNorm sites of the RMS distance between batch and running means."""
    by_step = defaultdict(list)
    for key, points in run["curves"].items():
        if key.endswith("/bn_mean_dist"):
            for step, value in points:
                by_step[step].append(value)
    return [(s, statistics.fmean(v)) for s, v in sorted(by_step.items())]


def analyze(runs: Runs) -> tuple[dict, str]:
    batches = runs.values("batch_size")
    cells = {}
    for b in batches:
        for norm in NORMS:
            rs = runs.where(norm=norm, batch_size=b)
            val = [r["final_val_loss"] for r in rs]
            train = [final_train_loss(r) for r in rs]
            dev = [mean(v for _, v in bn_deviation(r)[len(bn_deviation(r)) // 2:]) for r in rs]
            cells[(norm, b)] = {"val": mean(val), "val_range": spread(val), "train": mean(train),
                                "gap": mean(v - t for v, t in zip(val, train, strict=True)),
                                "bn_dev": mean(dev), "runs": len(rs)}
    rows = [[norm, b, c["val"], c["val_range"], c["train"], c["gap"], c["bn_dev"]]
            for (norm, b), c in cells.items()]
    main = table(["norm", "batch", "val loss (eval mode)", "seed range", "train loss (last 50 steps)",
                  "val - train", "batch vs running mean distance (2nd half)"], rows)
    checks = []
    for b in batches:
        bn, ln = cells[("batchnorm", b)], cells[("layernorm", b)]
        diff, noise = bn["val"] - ln["val"], max(bn["val_range"] or 0, ln["val_range"] or 0)
        checks.append([f"BN worse than LN at batch {b}", diff, noise, diff >= GAP and diff >= 2 * noise])
        checks.append([f"BN train/eval mismatch beyond LN's at batch {b}", bn["gap"] - ln["gap"], None,
                       bn["gap"] - ln["gap"] >= MISMATCH])
    small, large = min(batches), max(batches)
    ratio = cells[("batchnorm", small)]["bn_dev"] / cells[("batchnorm", large)]["bn_dev"]
    checks.append([f"batch statistics deviate more at batch {small} than {large} (ratio)", ratio, None,
                   ratio >= NOISIER])
    rms = [abs(cells[("rmsnorm", b)]["val"] - cells[("layernorm", b)]["val"]) for b in batches]
    checks.append(["RMSNorm within seed noise of LayerNorm (max |diff| over batches)", max(rms), None, None])
    md = (f"Machine: {machine()}. {len(runs)} runs ({len(runs.values('seed'))} seeds per cell), means over "
          f"seeds.\n\n{main}\n\n### Checks (thresholds fixed before the runs)\n\n"
          f"{table(['check', 'value', 'seed range', 'holds'], checks)}\n")
    return {"cells": [{"norm": n, "batch_size": b, **c} for (n, b), c in cells.items()], "checks": checks,
            "machine": machine()}, md


def plot(runs: Runs) -> None:
    batches = runs.values("batch_size")
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    width = 0.8 / len(NORMS)
    for i, norm in enumerate(NORMS):
        for j, b in enumerate(batches):
            vals = [r["final_val_loss"] for r in runs.where(norm=norm, batch_size=b)]
            axes[0].bar(j + i * width, mean(vals), width, color=f"C{i}", label=norm if j == 0 else None)
            axes[0].scatter([j + i * width] * len(vals), vals, color="k", s=8, zorder=3)
    axes[0].set(xticks=[j + width for j in range(len(batches))], xticklabels=[f"batch {b}" for b in batches],
                ylabel="val loss, eval mode (nats/char)", ylim=(1.5, None), title="final val loss per seed")
    axes[0].legend()
    for j, b in enumerate(batches):
        for k, r in enumerate(runs.where(norm="batchnorm", batch_size=b)):
            steps, values = zip(*bn_deviation(r), strict=True)
            axes[1].plot(steps, values, color=f"C{j + 3}", alpha=0.8, label=f"batch {b}" if k == 0 else None)
    axes[1].set(yscale="log", xlabel="step", ylabel="RMS(batch mean - running mean)",
                title="BatchNorm: batch statistics vs running statistics")
    axes[1].legend()
    fig.tight_layout()
    fig.savefig(HERE / "batchnorm.png", dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    runs = load(HERE, sys.argv[1:], lambda k: k in ("train/loss", "val/loss") or k.endswith("/bn_mean_dist"))
    results, md = analyze(runs)
    write(HERE, results, md)
    plot(runs)
