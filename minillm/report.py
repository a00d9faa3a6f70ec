"""Sweep report from disk (no W&B): every ``<run>/summary.json`` and ``<run>/csv/metrics.csv`` under the folders.

    python -m minillm.report logs/norm_x_placement/multiruns/2025-01-01_12-00-00 [MORE_SWEEPS ...] [--out DIR]
    python -m minillm.report <sweep> --compare norm --baseline layernorm    # + verdicts (minillm.verdict_report)
    python -m minillm.report plan PLAN.yaml --sweep NAME                     # pre-register (minillm.plan)

Writes ``report.md`` (one row per norm x placement x lr, plus any other config key that varies across the
sweep, seeds pooled; then LR sensitivity per norm x placement), ``report.json`` (the same rows) and PNGs:
``loss_by_norm.png``, ``loss_by_placement.png``, ``grad_norm.png``, ``residual_growth.png``,
``lr_sensitivity.png``; with decay branches (runs of ``decay_from=``) ``loss_vs_tokens.png``. With ``--compare``
(or ``--plan``) also ``verdicts.json``, ``verdicts.md`` and ``verdicts.png`` (docs/comparing.md).

LR sensitivity (Wortsman et al. 2023; docs/definitions.md): with loss(lr) = the mean over seeds of
min(final val loss, loss_init) (a diverged or missing loss counts as loss_init = ln(vocab_size)),
sensitivity = mean over the LR grid of [loss(lr) - min over the grid of loss(lr)].
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from minillm import branch_report
from minillm.errors import ArgumentParser
from minillm.metrics import GRAD_NORM, MAX_ABS_H, TRAIN_LOSS, layer_metric
from minillm.outcome import loss_for_comparison
from minillm.runs import Run, RunsError, distinct_runs, group_runs, load_runs, unfinished

GROUP_KEYS = ("norm", "placement", "lr")
# config keys that split rows when they vary across the sweep (seed never does: seeds are pooled)
EXTRA_KEYS = ("optimizer", "adamw_lr", "warmup_steps", "precision", "n_layers", "dim", "n_heads", "n_kv_heads",
              "qk_norm", "batch_size", "seq_len", "max_steps", "grad_clip", "weight_decay", "z_loss", "norm_options",
              "attn_norm_options", "name")
PLOTS = ("loss_by_norm.png", "loss_by_placement.png", "grad_norm.png", "residual_growth.png",
         "lr_sensitivity.png")


def _finite(values: Iterable[Any]) -> list[float]:
    return [float(v) for v in values if isinstance(v, (int, float)) and math.isfinite(v)]


def _key(value: Any) -> str:
    return json.dumps(value, sort_keys=True)


def varying_keys(runs: Sequence[Run]) -> list[str]:
    """The EXTRA_KEYS that take several values within one norm x placement x lr group (so they split rows;
    norm_options, which follows the norm, does not count unless an option varies for the same norm)."""
    groups = group_runs(runs, GROUP_KEYS).values()
    return [k for k in EXTRA_KEYS if any(len({_key(r.get(k)) for r in members}) > 1 for members in groups)]


def clipped_loss(run: Run, loss_init: float | None) -> float:
    """min(final val loss, loss_init); a diverged run or a missing / non-finite loss counts as loss_init."""
    return loss_for_comparison(run.summary, loss_init)


def lr_sensitivity(loss_by_lr: dict[float, float]) -> float:
    """Mean over the grid of [loss(lr) - min over the grid] for already clipped losses."""
    best = min(loss_by_lr.values())
    return statistics.fmean(v - best for v in loss_by_lr.values())


def _mean_std(values: Sequence[float]) -> str:
    if not values:
        return "-"
    if len(values) == 1:
        return f"{values[0]:.4f}"
    return f"{statistics.fmean(values):.4f} ± {statistics.stdev(values):.4f}"


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3g}"
    return str(value)


def _max(values: Iterable[Any]) -> float | None:
    values = _finite(values)
    return max(values) if values else None


def summarize(runs: Sequence[Run]) -> dict[str, Any]:
    """Rows of the main table and of the LR-sensitivity table, as plain data."""
    extra = varying_keys(runs)
    rows = []
    for key, members in group_runs(runs, [*GROUP_KEYS, *extra]).items():
        ok = [r for r in members if not r.get("diverged")]  # a diverged run's earlier validations do not count
        best = _finite(r.get("best_val_loss") for r in ok)
        final = _finite(r.get("final_val_loss") for r in ok)
        rows.append({
            **dict(zip([*GROUP_KEYS, *extra], key, strict=True)),
            "runs": len(members), "seeds": sorted(_finite(r.get("seed") for r in members)),
            "best_val_loss_mean": statistics.fmean(best) if best else None,
            "best_val_loss_std": statistics.stdev(best) if len(best) > 1 else None,
            "best_val_loss": _mean_std(best), "final_val_loss": _mean_std(final),
            "diverged_fraction": sum(bool(r.get("diverged")) for r in members) / len(members),
            "failed_fraction": sum(bool(r.get("failed")) for r in members) / len(members),
            "max_attn_logit": _max(r.get("max_attn_logit") for r in members),
            "max_abs_h": _max(r.get("max_abs_h") for r in members),
            "max_grad_norm": _max(r.get("max_grad_norm") for r in members),
            "spike_count": sum(int(r.get("spike_count") or 0) for r in members),
            "skipped_steps": sum(int(r.get("skipped_steps") or 0) for r in members),
            "tokens_per_s": statistics.fmean(_finite(r.get("tokens_per_s") for r in members) or [math.nan]),
        })
    sens_rows = []
    for key, members in group_runs(runs, ["norm", "placement", *extra]).items():
        by_lr = group_runs(members, ["lr"])
        loss_init = _max(r.get("loss_init") for r in members)
        loss_by_lr = {lr: statistics.fmean(clipped_loss(r, loss_init) for r in rs)
                      for (lr,), rs in by_lr.items()}
        stable = [lr for (lr,), rs in by_lr.items() if not any(r.get("diverged") for r in rs)]
        best_lr = min(loss_by_lr, key=loss_by_lr.get)
        sens_rows.append({
            **dict(zip(["norm", "placement", *extra], key, strict=True)),
            "lr_grid": list(loss_by_lr), "loss_by_lr": list(loss_by_lr.values()),  # sorted by group_runs
            "loss_init": loss_init, "lr_sensitivity": lr_sensitivity(loss_by_lr),
            "best_lr": best_lr, "best_loss": loss_by_lr[best_lr],
            "highest_stable_lr": max(stable) if stable else None,
            "max_attn_logit_diverged": _max(r.get("max_attn_logit") for r in members if r.get("diverged")),
        })
    return {"extra_keys": extra, "rows": rows, "sensitivity": sens_rows, "n_runs": len(runs)}


def _table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_fmt(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def markdown(data: dict[str, Any], sweep_dir: Path) -> str:
    extra = data["extra_keys"]
    main = _table(
        [*GROUP_KEYS, *extra, "runs", "best val loss (mean ± std)", "final val loss", "diverged", "failed",
         "max attn logit", "max abs h", "max grad norm", "spikes", "skipped", "tokens/s"],
        ([*(r[k] for k in (*GROUP_KEYS, *extra)), r["runs"], r["best_val_loss"], r["final_val_loss"],
          f"{r['diverged_fraction']:.2f}", f"{r['failed_fraction']:.2f}", r["max_attn_logit"], r["max_abs_h"],
          r["max_grad_norm"],
          r["spike_count"], r["skipped_steps"], r["tokens_per_s"]] for r in data["rows"]))
    sens = _table(
        ["norm", "placement", *extra, "LR sensitivity", "best lr", "best loss", "highest stable lr",
         "lr grid", "max attn logit (diverged)"],
        ([r["norm"], r["placement"], *(r[k] for k in extra), f"{r['lr_sensitivity']:.4f}", r["best_lr"],
          f"{r['best_loss']:.4f}", r["highest_stable_lr"], ", ".join(_fmt(lr) for lr in r["lr_grid"]),
          r["max_attn_logit_diverged"]] for r in data["sensitivity"]))
    plots = "\n".join(f"![{p[:-4]}]({p})" for p in data.get("plots", PLOTS))
    incomplete = data.get("incomplete") or []
    left_out = (f"{len(incomplete)} run(s) stopped before their end and not resumed are left out: "
                f"{', '.join(incomplete)}.\n\n" if incomplete else "")
    if data.get("unfinished"):
        left_out += (f"**{len(data['unfinished'])} run(s) have not ended** (training now, or killed before their "
                     f"summary): {', '.join(data['unfinished'])}.\n\n")
    if data.get("duplicates"):
        left_out += f"Listed twice and counted once: {', '.join(data['duplicates'])}.\n\n"
    return (f"# Sweep report: {sweep_dir}\n\n{data['n_runs']} runs; seeds pooled per row. Diverged: "
            "non-finite loss or weights, loss above the ceiling, or final val loss >= ln(vocab).\n\n"
            f"{left_out}"
            f"## Runs by norm x placement x lr\n\n{main}\n\n## LR sensitivity (Wortsman et al. 2023)\n\n"
            "mean over the LR grid of [min(final val loss, ln V) - best on the grid]; lower is more "
            "robust.\n\n"
            f"{sens}\n\n## Plots\n\n{plots}\n")


# --- plots ------------------------------------------------------------------------------------------------


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
        last = [statistics.fmean(_finite(_last(r, layer_metric(i, "resid_rms")) for r in rs) or [math.nan])
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
        inits.add(r["loss_init"])
    for v in inits - {None}:
        ax.axhline(v, color="gray", ls="--", lw=0.8)
    ax.set(xscale="log", xlabel="learning rate", ylabel="min(final val loss, ln V)", title="LR sensitivity")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_all(runs: Sequence[Run], data: dict[str, Any], out: Path) -> list[Path]:
    """The plots that compare something in this sweep (PLOTS, in order); a plot whose panels hold one line each,
    or an lr plot of a sweep with one lr per row, is not drawn (a stale one from an earlier report is removed)."""
    import matplotlib

    matplotlib.use("Agg")
    extra = data["extra_keys"]
    drawn = {}
    for i, (panel, other) in enumerate((("norm", "placement"), ("placement", "norm"))):
        drawn[PLOTS[i]] = _curve_grid(runs, panel, [other, "lr", *extra], TRAIN_LOSS, out / PLOTS[i], "train loss",
                                      zoom=True)
    drawn[PLOTS[2]] = _curve_grid(runs, "norm", ["placement", "lr", *extra], GRAD_NORM, out / PLOTS[2],
                                  "grad norm", log_y=True)
    _residual_plot(runs, [*GROUP_KEYS, *extra], out / PLOTS[3])
    drawn[PLOTS[3]] = True
    drawn[PLOTS[4]] = any(len(r["lr_grid"]) > 1 for r in data["sensitivity"])
    if drawn[PLOTS[4]]:
        _sensitivity_plot(data, out / PLOTS[4])
    for name, made in drawn.items():
        if not made:
            (out / name).unlink(missing_ok=True)
    return [out / p for p in PLOTS if drawn[p]]


def write_report(sweep_dir: str | Path | Sequence[str | Path], out: str | Path | None = None,
                 found: Sequence[Run] | None = None, unfinished: Sequence[str] = ()) -> Path:
    """Read the sweep(s), write report.md, report.json and the PNGs to out (default <first sweep_dir>/report)."""
    dirs = [Path(sweep_dir)] if isinstance(sweep_dir, (str, Path)) else [Path(d) for d in sweep_dir]
    found, duplicates = distinct_runs(list(found) if found is not None else load_runs(dirs))
    runs = [r for r in found if r.get("status") != "preempted"]  # stopped by a signal and not resumed yet
    if not runs:
        raise FileNotFoundError(f"every run under {', '.join(map(str, dirs))} was stopped before its end (status "
                                "preempted); resume them with ckpt_path=auto")
    out = Path(out) if out else dirs[0] / "report"
    out.mkdir(parents=True, exist_ok=True)
    data = summarize(runs)
    data["incomplete"] = sorted(str(r.dir) for r in found if r.get("status") == "preempted")
    data["duplicates"], data["unfinished"] = duplicates, list(unfinished)
    data["plots"] = [p.name for p in plot_all(runs, data, out)]
    (out / "report.json").write_text(json.dumps(data, indent=2, default=str) + "\n")
    text = markdown(data, Path(", ".join(map(str, dirs))))
    if any(branch_report.is_branch(r) for r in runs):  # decay branches: loss vs tokens (minillm.branch_report)
        branch_report.plot(runs, out / branch_report.PLOT)
        text += "\n" + branch_report.markdown(runs)
    path = out / "report.md"
    path.write_text(text)
    return path


def main(argv: Sequence[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["plan"]:
        from minillm.plan import main as plan_main

        plan_main(argv[1:])
        return
    from minillm import verdict_report

    parser = ArgumentParser(
        prog="minillm-report", description=__doc__.split("\n")[0],
        epilog="minillm-report plan PLAN.yaml --sweep NAME records a comparison's rules before its sweep runs "
               "(docs/comparing.md).")
    parser.add_argument("sweep_dir", type=Path, nargs="+", help="folder(s) holding run folders with summary.json")
    parser.add_argument("--out", type=Path, default=None, help="output folder (default: <first sweep_dir>/report)")
    verdict_report.add_arguments(parser)
    parser.add_argument("--skip-bad", action="store_true", help="skip run folders whose summary.json cannot be "
                        "read (each named in a warning) instead of stopping at the first")
    args = parser.parse_args(argv)
    bad: list[str] | None = [] if args.skip_bad else None
    for folder in args.sweep_dir:
        if not folder.is_dir():
            parser.error(f"{folder} {'is a file, not a folder' if folder.exists() else 'does not exist'}; allowed: a "
                         "folder holding run folders (a sweep's, logs/<name>, a run's)")
    try:
        found = load_runs(args.sweep_dir, bad=bad)
    except FileNotFoundError as err:
        parser.error(str(err))
    except RunsError as err:
        parser.error(f"{err}; fix or remove it, or pass --skip-bad to leave it out")
    for message in bad or []:
        print(f"warning: skipped {message}", file=sys.stderr)
    still = unfinished(args.sweep_dir)
    if still:
        print(f"warning: {len(still)} run(s) have not ended (training now, or killed before their summary): "
              f"{', '.join(still[:3])}{' ...' if len(still) > 3 else ''}; the report covers the runs that ended",
              file=sys.stderr)
    verdicts = verdict_report.prepare(parser, args, found, still)  # checked and computed before anything is written
    try:
        path = write_report(args.sweep_dir, args.out, found, still)
    except FileNotFoundError as err:
        parser.error(str(err))
    plots = json.loads((path.parent / "report.json").read_text())["plots"]
    print(f"wrote {path} and {len(plots)} plots")
    if verdicts is not None:
        files = verdict_report.write(verdicts, path.parent)
        counts = Counter(c["verdict"] for c in verdicts["comparisons"])
        print(f"wrote {', '.join(str(f) for f in files)}: " + (", ".join(f"{n} {v}" for v, n in sorted(
            counts.items())) or "no comparison"))
        for c in verdicts["comparisons"]:
            print("  " + verdict_report.short_line(c))
        if args.wandb:
            verdict_report.log_to_wandb(verdicts, path.parent, found)


if __name__ == "__main__":
    main()
