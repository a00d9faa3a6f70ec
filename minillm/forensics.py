"""Which signal moved first before a loss spike: lead-lag of the per-step stability signals (pure functions).

Given the per-step metrics of the steps up to a spike (a spike file's ring buffer, or a replay's metrics.csv, where
the probes ran on every step), each signal's onset is the first step of its move into the spike: the run of
consecutive steps at ``threshold`` robust z-scores or more from its own baseline (the first half of the window) that
reaches the spike's step or the step before it. A move that faded before then (a gradient norm that doubled for a step
and came back) is not part of the spike, however early it was. The z-scores are taken on log(value) for a signal
that is positive (every one but a few logits: a move is a factor, whatever the signal's units), on the value
otherwise: z = (x - median) / scale, with scale = max(1.4826 * MAD, ``floor``) over the baseline; the floor (0.2 in
log units: a factor of about 1.22 per unit of z, so an onset at z = 5 is a move of 3x or more) keeps a signal that
barely varied in its baseline from counting noise as a move. Signals are ranked by onset, earliest first, then by the
size of the move at onset. ``lead`` is how many steps an onset came before the spike. The signals (docs/definitions.md):

    per layer     layer/<i>/update_ratio, grad_norm, weight_norm, attn_logit_max, attn_entropy_min, resid_rms
    per norm site norm/<site>/in_rms, outlier_ratio, kurtosis   (attributed to the layer of the site)
    the model     stab/log_z_max (the output logits' log Z), stab/grad_norm, train/loss
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from minillm.metrics import GRAD_NORM, LOG_Z_MAX, TRAIN_LOSS, parse_metric

LAYER_SIGNALS = ("update_ratio", "grad_norm", "weight_norm", "attn_logit_max", "attn_entropy_min", "resid_rms")
SITE_SIGNALS = ("in_rms", "outlier_ratio", "kurtosis")
MODEL_SIGNALS = (LOG_Z_MAX, GRAD_NORM, TRAIN_LOSS)
Series = dict[str, list[tuple[int, float]]]  # metric -> [(step, value)] (analysis.runs.read_curves)


def is_signal(key: str) -> bool:
    parsed = parse_metric(key)
    if parsed is None:
        return key in MODEL_SIGNALS
    kind, _, name = parsed
    return name in (LAYER_SIGNALS if kind == "layer" else SITE_SIGNALS)


def layer_of(key: str) -> int | str | None:
    """The layer a signal belongs to: ``layer/<i>/...`` and ``norm/layers.<i>.<site>/...`` -> i; the final norm ->
    "final"; a model-wide signal -> None."""
    parsed = parse_metric(key)
    if parsed is None:
        return None
    kind, name, _ = parsed
    if kind == "layer":
        return int(name) if name.isdigit() else name
    parts = name.split(".")
    return int(parts[1]) if parts[0] == "layers" and len(parts) > 1 and parts[1].isdigit() else "final"


def series_of(rows: Iterable[tuple[int, Mapping[str, Any]]]) -> Series:
    """Rows (step, {metric: value}) -> the signals' series (NaN left out; an infinite value is kept: an overflow is the
    largest move a signal can make)."""
    out: Series = {}
    for step, metrics in rows:
        for key, value in metrics.items():
            if is_signal(key) and isinstance(value, (int, float)) and not math.isnan(value):
                out.setdefault(key, []).append((int(step), float(value)))
    return out


def _zscores(points: list[tuple[int, float]], floor: float, min_baseline: int) -> tuple[list[tuple[int, float]], int]:
    """Robust z-scores of a series against its first half (log scale when every value is positive); returns them and
    the baseline's length."""
    n_base = max(min_baseline, len(points) // 2)
    log = all(v > 0 for _, v in points)
    xs = [math.log(v) if log else v for _, v in points]
    base = [x for x in xs[:n_base] if math.isfinite(x)] or [0.0]
    median = statistics.median(base)
    scale = max(1.4826 * statistics.median(abs(x - median) for x in base), floor if log else floor * abs(median),
                1e-12)
    return [(s, (x - median) / scale) for (s, _), x in zip(points, xs, strict=True)], n_base


def _onset(zs: list[tuple[int, float]], spike_step: int, threshold: float) -> tuple[int, float] | None:
    """(step, z) where the move into the spike began: the start of the first run of consecutive |z| >= threshold that
    reaches step spike_step - 1 (an update at the step before shows in the spike's loss) or the spike's step."""
    start = None
    for step, z in zs:
        start = (start or (step, z)) if abs(z) >= threshold else None
        if start is not None and step >= spike_step - 1:
            return start
    return None


def lead_lag(series: Series, spike_step: int, threshold: float = 5.0, floor: float = 0.2,
             min_baseline: int = 3) -> list[dict[str, Any]]:
    """Every signal with at least ``min_baseline`` + 1 values at or before ``spike_step``, ranked: those that moved
    (an onset) by onset step, then by |z| at onset; then those that did not. Each entry: signal, layer, onset_step,
    lead (spike_step - onset_step), z_onset, z_peak (the largest |z| up to the spike, signed), peak_ratio (the value
    at the peak / the baseline's median), baseline (that median)."""
    entries = []
    for key, points in series.items():
        points = sorted((s, v) for s, v in points if s <= spike_step and not math.isnan(v))
        baseline = points[:max(min_baseline, len(points) // 2)]
        if not is_signal(key) or len(points) < min_baseline + 1 or not all(math.isfinite(v) for _, v in baseline):
            continue  # too short, or not finite in its baseline (an infinite value later is a move: z = inf)
        zs, n_base = _zscores(points, floor, min_baseline)
        onset = _onset(zs[n_base:], spike_step, threshold)
        peak = max(range(len(zs)), key=lambda i: abs(zs[i][1]))
        median = statistics.median(v for _, v in points[:n_base])
        entries.append({"signal": key, "layer": layer_of(key), "onset_step": onset[0] if onset else None,
                        "lead": spike_step - onset[0] if onset else None, "z_onset": onset[1] if onset else None,
                        "z_peak": zs[peak][1], "peak_ratio": points[peak][1] / median if median else None,
                        "baseline": median})
    moved = sorted((e for e in entries if e["onset_step"] is not None),
                   key=lambda e: (e["onset_step"], -abs(e["z_onset"]), e["signal"]))
    still = sorted((e for e in entries if e["onset_step"] is None), key=lambda e: (-abs(e["z_peak"]), e["signal"]))
    return moved + still


def normalized(series: Series, spike_step: int, signal: str, floor: float = 0.2,
               min_baseline: int = 3) -> list[tuple[int, float]]:
    """One signal as robust z-scores against its baseline (as lead_lag computes them), at steps <= spike_step."""
    points = sorted((s, v) for s, v in series.get(signal, []) if s <= spike_step and not math.isnan(v))
    zs = _zscores(points, floor, min_baseline)[0] if len(points) > min_baseline else []
    return [(s, z) for s, z in zs if math.isfinite(z)]


def describe(entry: Mapping[str, Any]) -> str:
    """One line: ``layer/1/update_ratio moved first: at step 24, 1 step before the spike, z = 310 (x 95)``."""
    if entry.get("onset_step") is None:
        return f"{entry['signal']}: no onset (largest |z| {abs(entry['z_peak']):.3g})"
    ratio = f", at its peak x {entry['peak_ratio']:.3g} its baseline" if entry.get("peak_ratio") is not None else ""
    steps = "step" if entry["lead"] == 1 else "steps"
    return (f"{entry['signal']}: at step {entry['onset_step']}, {entry['lead']} {steps} before the spike, "
            f"z = {entry['z_onset']:.3g}{ratio}")


def report(record: Mapping[str, Any], top: int = 12) -> str:
    """A spike record (the spike file's content) as markdown: what happened, the lead-lag table, how to replay."""
    lines = [f"# {record['kind'].replace('_', ' ')} at step {record['step']}", ""]
    loss, z = record.get("loss"), record.get("loss_z")
    finite = isinstance(loss, float) and math.isfinite(loss)
    lines.append(f"- train loss {loss:.4g}" if finite else f"- train loss {loss}")
    if z is not None:
        lines.append(f"- loss z-score {z:.3g} (against the previous losses of the spike detector's window)")
    if record.get("reason"):
        lines.append(f"- {record['reason']}")
    ckpt = record.get("checkpoint") or {}
    if ckpt.get("path"):
        lines.append(f"- checkpoint `{ckpt['path']}` at step {ckpt['step']}; replay: `{record.get('replay')}`")
    lines += ["", "## Lead-lag: which signal moved first", "",
              "| rank | signal | layer | onset step | steps before | z at onset | peak z | peak / baseline |",
              "|---|---|---|---|---|---|---|---|"]
    for rank, e in enumerate(record.get("lead_lag", [])[:top], start=1):
        def num(v: Any) -> str:
            return "" if v is None else f"{v:.3g}" if isinstance(v, float) else str(v)
        lines.append(f"| {rank} | `{e['signal']}` | {num(e['layer'])} | {num(e['onset_step'])} | {num(e['lead'])} | "
                     f"{num(e['z_onset'])} | {num(e['z_peak'])} | {num(e['peak_ratio'])} |")
    return "\n".join(lines) + "\n"


def plot(series: Series, spike_step: int, entries: list[Mapping[str, Any]], path: str | Path, top: int = 8,
         title: str | None = None) -> None:
    """The steps before the spike, one line per signal (the first ``top`` movers and the loss), each normalized to
    robust z-scores against its own baseline; the x axis counts steps relative to the spike (0)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4.5))
    shown = [e["signal"] for e in entries if e["signal"] != TRAIN_LOSS][:top] + [TRAIN_LOSS]
    for signal in shown:
        z = normalized(series, spike_step, signal)
        if z:
            style = {"color": "black", "linewidth": 2.2} if signal == TRAIN_LOSS else {}
            ax.plot([s - spike_step for s, _ in z], [v for _, v in z], marker=".", label=signal, **style)
    ax.axvline(0, color="grey", linestyle=":")
    ax.set_yscale("symlog", linthresh=5)
    ax.set(xlabel="steps relative to the spike", ylabel="robust z-score vs. its baseline",
           title=title or f"the steps before the spike at step {spike_step}")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7, loc="upper left")
    else:
        ax.text(0.5, 0.5, "too few steps before the spike to normalize", transform=ax.transAxes, ha="center")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
