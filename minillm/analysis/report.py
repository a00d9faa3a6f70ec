"""Sweep report from disk (no W&B): every ``<run>/summary.json`` and ``<run>/csv/metrics.csv`` under the folders.

    python -m minillm.analysis.report logs/<name>/multiruns/<time> [MORE_SWEEPS ...] [--out DIR]    # minillm-report
    python -m minillm.analysis.report <sweep> --compare norm --baseline layernorm    # + verdicts (verdict_files)
    python -m minillm.analysis.plans PLAN.yaml --sweep NAME                           # pre-register (minillm-plan)

Writes ``report.md`` (one row per norm x placement x lr, plus any other setting that varies across the sweep,
settings.* included, seeds pooled, with the val and test losses; then LR sensitivity per norm x placement),
``report.json`` (the same rows) and PNGs:
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
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from minillm import schema
from minillm.analysis import branches, verdict_cli, verdict_files
from minillm.analysis.runs import Run, RunsError, distinct_runs, flat_settings, group_runs, load_runs, unfinished
from minillm.analysis.strata import NEVER_SPLIT
from minillm.analysis.sweep_plots import PLOTS, plot_all
from minillm.errors import ArgumentParser
from minillm.outcome import loss_for_comparison, numbers

GROUP_KEYS = ("norm", "placement", "lr")
# config keys that split rows when they vary across the sweep (seed never does: seeds are pooled)
EXTRA_KEYS = ("optimizer", "adamw_lr", "warmup_steps", "precision", "n_layers", "dim", "n_heads", "n_kv_heads",
              "qk_norm", "batch_size", "seq_len", "max_steps", "grad_clip", "weight_decay", "z_loss", "norm_options",
              "attn_norm_options", "name")


def _key(value: Any) -> str:
    return json.dumps(value, sort_keys=True)


def with_settings(runs: Sequence[Run]) -> list[Run]:
    """The runs with their ``settings`` also as dotted keys (settings.model.branch_scale), so that a setting stored
    only there (a model option, an optimizer or schedule argument) can split rows like a top-level key."""
    return [Run(r.dir, {**r.summary, **flat_settings(r.get("settings"))}, r._curves) for r in runs]


def varying_keys(runs: Sequence[Run]) -> list[str]:
    """The EXTRA_KEYS that take several values within one norm x placement x lr group (so they split rows;
    norm_options, which follows the norm, does not count unless an option varies for the same norm), then each
    ``settings.*`` key (runs of with_settings) that still varies once those keys are fixed (so
    settings.model.n_layers does not repeat n_layers; the seed's keys never count: seeds are pooled)."""
    groups = group_runs(runs, GROUP_KEYS).values()
    chosen = [k for k in EXTRA_KEYS if any(len({_key(r.get(k)) for r in members}) > 1 for members in groups)]
    for key in sorted({k for r in runs for k in r.summary if k.startswith("settings.")} - set(NEVER_SPLIT)):
        if any(len({_key(r.get(key)) for r in members}) > 1
               for members in group_runs(runs, [*GROUP_KEYS, *chosen]).values()):
            chosen.append(key)
    return chosen


def header_of(key: str) -> str:
    """A row key as the table's header writes it (settings.model.branch_scale: model.branch_scale)."""
    return key.removeprefix("settings.")


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


def _cell(column: Column, value: Any) -> Any:
    return column.fmt.format(value) if column.fmt and value is not None else value


def _max(values: Iterable[Any]) -> float | None:
    values = numbers(values)
    return max(values) if values else None


@dataclass(frozen=True)
class Column:
    """A column of the report's main table: its header, the summary.json field it reads (minillm.schema), how a
    row's runs combine into one cell, and the key of that cell in report.json."""

    header: str
    field: str
    combine: Callable[[Sequence[Run], str], Any]
    key: str = ""  # the cell's key in report.json (default: the field)
    fmt: str = ""  # the cell's format in report.md (default: _fmt)

    @property
    def row_key(self) -> str:
        return self.key or self.field


def _survivors_mean_std(runs: Sequence[Run], field: str) -> str:  # a diverged run's validations do not count
    return _mean_std(numbers(r.get(field) for r in runs if not r.get(schema.DIVERGED)))


def _fraction(runs: Sequence[Run], field: str) -> float:
    return sum(bool(r.get(field)) for r in runs) / len(runs)


def _largest(runs: Sequence[Run], field: str) -> float | None:
    return _max(r.get(field) for r in runs)


def _total(runs: Sequence[Run], field: str) -> int:
    return sum(int(r.get(field) or 0) for r in runs)


def _mean(runs: Sequence[Run], field: str) -> float:
    return statistics.fmean(numbers(r.get(field) for r in runs) or [math.nan])


# the main table after the group keys and the run count: adding a run-level number to the report is one line here
COLUMNS = (
    Column("best val loss (mean ± std)", schema.BEST_VAL_LOSS, _survivors_mean_std),
    Column("final val loss", schema.FINAL_VAL_LOSS, _survivors_mean_std),
    Column("test loss", schema.TEST_LOSS, _survivors_mean_std),
    Column("diverged", schema.DIVERGED, _fraction, "diverged_fraction", "{:.2f}"),
    Column("failed", schema.FAILED, _fraction, "failed_fraction", "{:.2f}"),
    Column("max attn logit", "max_attn_logit", _largest),
    Column("max abs h", "max_abs_h", _largest),
    Column("max grad norm", schema.MAX_GRAD_NORM, _largest),
    Column("max update ratio", "max_update_ratio", _largest),
    Column("spikes", schema.SPIKE_COUNT, _total),
    Column("skipped", "skipped_steps", _total),
    Column("tokens/s", schema.TOKENS_PER_S, _mean),
)


def summarize(runs: Sequence[Run]) -> dict[str, Any]:
    """Rows of the main table (COLUMNS) and of the LR-sensitivity table, as plain data."""
    runs = with_settings(runs)
    extra = varying_keys(runs)
    rows = []
    for key, members in group_runs(runs, [*GROUP_KEYS, *extra]).items():
        best = numbers(r.get(schema.BEST_VAL_LOSS) for r in members if not r.get(schema.DIVERGED))
        rows.append({
            **dict(zip([*GROUP_KEYS, *extra], key, strict=True)),
            "runs": len(members), "seeds": sorted(numbers(r.get("seed") for r in members)),
            "best_val_loss_mean": statistics.fmean(best) if best else None,
            "best_val_loss_std": statistics.stdev(best) if len(best) > 1 else None,
            **{c.row_key: c.combine(members, c.field) for c in COLUMNS},
        })
    sens_rows = []
    for key, members in group_runs(runs, ["norm", "placement", *extra]).items():
        by_lr = group_runs(members, ["lr"])
        loss_init = _max(r.get(schema.LOSS_INIT) for r in members)
        loss_by_lr = {lr: statistics.fmean(clipped_loss(r, loss_init) for r in rs)
                      for (lr,), rs in by_lr.items()}
        stable = [lr for (lr,), rs in by_lr.items() if not any(r.get("diverged") for r in rs)]
        best_lr = min(loss_by_lr, key=loss_by_lr.get)
        sens_rows.append({
            **dict(zip(["norm", "placement", *extra], key, strict=True)),
            "lr_grid": list(loss_by_lr), "loss_by_lr": list(loss_by_lr.values()),  # sorted by group_runs
            schema.LOSS_INIT: loss_init, "lr_sensitivity": lr_sensitivity(loss_by_lr),
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
    main = _table([*GROUP_KEYS, *map(header_of, extra), "runs", *(c.header for c in COLUMNS)],
                  ([*(r[k] for k in (*GROUP_KEYS, *extra)), r["runs"], *(_cell(c, r[c.row_key]) for c in COLUMNS)]
                   for r in data["rows"]))
    sens = _table(
        ["norm", "placement", *map(header_of, extra), "LR sensitivity", "best lr", "best loss", "highest stable lr",
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


def write_report(sweep_dir: str | Path | Sequence[str | Path], out: str | Path | None = None,
                 found: Sequence[Run] | None = None, unfinished: Sequence[str] = ()) -> Path:
    """Read the sweep(s), write report.md, report.json and the PNGs to out (default <first sweep_dir>/report)."""
    dirs = [Path(sweep_dir)] if isinstance(sweep_dir, (str, Path)) else [Path(d) for d in sweep_dir]
    found, duplicates = distinct_runs(list(found) if found is not None else load_runs(dirs))
    found = with_settings(found)
    runs = [r for r in found if r.get("status") != "preempted"]  # stopped by a signal and not resumed yet
    if not runs:
        raise FileNotFoundError(f"every run under {', '.join(map(str, dirs))} was stopped before its end (status "
                                "preempted); resume them with ckpt_path=auto")
    out = Path(out) if out else dirs[0] / "report"
    out.mkdir(parents=True, exist_ok=True)
    data = summarize(runs)
    data["incomplete"] = sorted(str(r.dir) for r in found if r.get("status") == "preempted")
    data["duplicates"], data["unfinished"] = duplicates, list(unfinished)
    data["plots"] = [p.name for p in plot_all(runs, data, out, GROUP_KEYS)]
    (out / "report.json").write_text(json.dumps(data, indent=2, default=str) + "\n")
    text = markdown(data, Path(", ".join(map(str, dirs))))
    if any(branches.is_branch(r) for r in runs):  # decay branches: loss vs tokens (minillm.analysis.branches)
        branches.plot(runs, out / branches.PLOT)
        text += "\n" + branches.markdown(runs)
    path = out / "report.md"
    path.write_text(text)
    return path


def main(argv: Sequence[str] | None = None) -> None:

    parser = ArgumentParser(
        prog="minillm-report", description=__doc__.split("\n")[0],
        epilog="minillm-plan PLAN.yaml --sweep NAME records a comparison's rules before its sweep runs "
               "(docs/comparing.md).")
    parser.add_argument("sweep_dir", type=Path, nargs="+", help="folder(s) holding run folders with summary.json")
    parser.add_argument("--out", type=Path, default=None, help="output folder (default: <first sweep_dir>/report)")
    verdict_cli.add_arguments(parser)
    parser.add_argument("--skip-bad", action="store_true", help="skip run folders whose summary.json cannot be "
                        "read (each named in a warning) instead of stopping at the first")
    args = parser.parse_args(None if argv is None else list(argv))
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
    verdicts = verdict_cli.prepare(parser, args, found, still)  # checked and computed before anything is written
    try:
        path = write_report(args.sweep_dir, args.out, found, still)
    except FileNotFoundError as err:
        parser.error(str(err))
    plots = json.loads((path.parent / "report.json").read_text())["plots"]
    print(f"wrote {path} and {len(plots)} plots")
    if verdicts is not None:
        files = verdict_files.write(verdicts, path.parent)
        counts = Counter(c["verdict"] for c in verdicts["comparisons"])
        print(f"wrote {', '.join(str(f) for f in files)}: " + (", ".join(f"{n} {v}" for v, n in sorted(
            counts.items())) or "no comparison"))
        for c in verdicts["comparisons"]:
            print("  " + verdict_files.short_line(c))
        if args.wandb:
            verdict_files.log_to_wandb(verdicts, path.parent, found)


if __name__ == "__main__":
    main()
