"""The sweep report's plots (minillm.analysis.report): train loss per norm and per placement with the seeds'
spread, gradient norms, residual growth by layer, and loss against lr."""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from minillm import schema
from minillm.analysis.runs import Run, group_runs
from minillm.metrics import GRAD_NORM, MAX_ABS_H, TRAIN_LOSS, layer_metric
from minillm.outcome import numbers

PLOTS = ("loss_by_norm.png", "loss_by_placement.png", "grad_norm.png", "residual_growth.png",
         "lr_sensitivity.png")


def _mean_curve(runs: Sequence[Run], metric: str) -> tuple[list[int], list[float]]:
    """Mean over runs at each logged step (NaN / inf dropped)."""
    steps, mean, _, _ = _spread_curve(runs, metric)
    return steps, mean


def _spread_curve(runs: Sequence[Run], metric: str) -> tuple[list[int], list[float], list[float], list[float]]:
    """(steps, mean, min, max) over the runs (seeds) at each logged step, NaN / inf dropped."""
    by_step: dict[int, list[float]] = defaultdict(list)
    for r in runs:
        for step, value in r.curves.get(metric, []):
            if math.isfinite(value):
                by_step[step].append(value)
    steps = sorted(by_step)
    return (steps, [statistics.fmean(by_step[s]) for s in steps], [min(by_step[s]) for s in steps],
            [max(by_step[s]) for s in steps])


def _label(keys: Sequence[str], values: Sequence[Any]) -> str:
    return " ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}"
                    for k, v in zip(keys, values, strict=True))


def zoomed(values: Sequence[Sequence[float]], skip: float = 0.1) -> tuple[float, float] | None:
    """y limits that show the curves after their first ``skip`` of steps (the fall from ln V), padded 5%: a
    difference of a hundredth of a nat stays visible."""
    shown = [v for curve in values for v in curve[int(skip * len(curve)):] if math.isfinite(v)]
    if not shown:
        return None
    low, high = min(shown), max(shown)
    pad = 0.05 * (high - low or abs(high) or 1.0)
    return low - pad, high + pad


def _curve_grid(runs: Sequence[Run], panel_key: str, line_keys: Sequence[str], metric: str, path: Path,
                ylabel: str, log_y: bool = False, zoom: bool = False) -> bool:
    """One panel per value of panel_key, one line per value of line_keys overlaid in it: the seeds' mean with their
    range shaded. Drawn only when some panel compares (holds two lines or more); returns whether it was."""
    import matplotlib.pyplot as plt

    panels = group_runs(runs, [panel_key])
    lines = {panel: group_runs(members, line_keys) for (panel,), members in panels.items()}
    if not any(len(groups) > 1 for groups in lines.values()):
        return False
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 3.8), squeeze=False, sharey=True)
    drawn = []
    for ax, (panel, groups) in zip(axes[0], lines.items(), strict=True):
        for key, rs in groups.items():
            steps, values, low, high = _spread_curve(rs, metric)
            if steps:
                n = len({r.get("seed") for r in rs})
                line, = ax.plot(steps, values, label=_label(line_keys, key) + (f" ({n} seeds)" if n > 1 else ""),
                                lw=1.2)
                if n > 1:
                    ax.fill_between(steps, low, high, color=line.get_color(), alpha=0.15, lw=0)
                drawn += [values, low, high] if n > 1 else [values]
        ax.set_title(f"{panel_key}={panel}")
        ax.set_xlabel("step")
        ax.set_yscale("log" if log_y else "linear")
        if ax.lines:
            ax.legend(fontsize=7)
    if zoom and (limits := zoomed(drawn)):
        axes[0][0].set_ylim(*limits)
    axes[0][0].set_ylabel(ylabel + (" (seeds' range shaded)" if zoom else ""))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def _last(run: Run, metric: str) -> float:
    values = run.curves.get(metric)
    return values[-1][1] if values else math.nan


def _residual_plot(runs: Sequence[Run], keys: Sequence[str], path: Path) -> None:
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 3.8))
    for key, rs in group_runs(runs, keys).items():
        label = _label(keys, key)
        steps, values = _mean_curve(rs, MAX_ABS_H)
        if steps:
            ax1.plot(steps, values, label=label, lw=1.2)
        layers = sorted({int(m.split("/")[1]) for r in rs for m in r.curves if m.startswith("layer/")
                         and m.endswith("/resid_rms")})
        last = [statistics.fmean(numbers(_last(r, layer_metric(i, "resid_rms")) for r in rs) or [math.nan])
                for i in layers]
        if layers:
            ax2.plot(layers, last, marker="o", label=label, lw=1.2)
    ax1.set(xlabel="step", ylabel="max |h| over blocks", yscale="log", title="residual growth over training")
    ax2.set(xlabel="layer", ylabel="residual RMS (last logged step)", yscale="log",
            title="residual growth by depth")
    ax2.xaxis.set_major_locator(MaxNLocator(integer=True))
    for ax in (ax1, ax2):
        if ax.lines:
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _sensitivity_plot(data: dict[str, Any], path: Path) -> None:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    extra = data["extra_keys"]
    inits = set()
    for r in data["sensitivity"]:
        label = _label(["norm", "placement", *extra], [r["norm"], r["placement"], *(r[k] for k in extra)])
        ax.plot(r["lr_grid"], r["loss_by_lr"], marker="o", label=f"{label} (S={r['lr_sensitivity']:.3f})")
        inits.add(r[schema.LOSS_INIT])
    for v in inits - {None}:
        ax.axhline(v, color="gray", ls="--", lw=0.8)
    ax.set(xscale="log", xlabel="learning rate", ylabel="min(final val loss, ln V)", title="LR sensitivity")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_all(runs: Sequence[Run], data: dict[str, Any], out: Path, group_keys: Sequence[str]) -> list[Path]:
    """The plots that compare something in this sweep (PLOTS, in order); a plot whose panels hold one line each,
    or an lr plot of a sweep with one lr per row, is not drawn (a stale one from an earlier report is removed).
    ``group_keys``: the keys of the report's rows (the residual plot draws one line per row)."""
    import matplotlib

    matplotlib.use("Agg")
    extra = data["extra_keys"]
    drawn = {}
    for i, (panel, other) in enumerate((("norm", "placement"), ("placement", "norm"))):
        drawn[PLOTS[i]] = _curve_grid(runs, panel, [other, "lr", *extra], TRAIN_LOSS, out / PLOTS[i], "train loss",
                                      zoom=True)
    drawn[PLOTS[2]] = _curve_grid(runs, "norm", ["placement", "lr", *extra], GRAD_NORM, out / PLOTS[2],
                                  "grad norm", log_y=True)
    _residual_plot(runs, [*group_keys, *extra], out / PLOTS[3])
    drawn[PLOTS[3]] = True
    drawn[PLOTS[4]] = any(len(r["lr_grid"]) > 1 for r in data["sensitivity"])
    if drawn[PLOTS[4]]:
        _sensitivity_plot(data, out / PLOTS[4])
    for name, made in drawn.items():
        if not made:
            (out / name).unlink(missing_ok=True)
    return [out / p for p in PLOTS if drawn[p]]
