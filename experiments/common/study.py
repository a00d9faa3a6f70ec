"""Shared plumbing of the sweep studies' analysis scripts (S2-S5, S7-S10).

A study runs ``python train.py -m experiment=<study>``; the runs land in ``logs/<study>/multiruns/<time>/``.
Its ``analyze`` module reads them from disk with :func:`load`, computes the study's table, and writes the compact
artefacts that are committed: ``runs.jsonl`` (every run's summary.json), ``curves.json`` (only the logged curves
its plots use), ``results.json`` and ``results.md``, and PNGs, into the study's folder or ``--out DIR``. With no
sweep folder given it re-analyzes the committed ``runs.jsonl`` / ``curves.json``, so tables and plots can be
regenerated without rerunning the sweep. A run's outcome (diverged, failed, stalled, the loss compared) is
minillm.outcome's rule, read through the helpers below. Every interval, test and verdict word comes from
minillm.analysis.stats (``paired`` below pairs two arms by seed for its paired t interval) or minillm.analysis.compare
(a
study's ``verdicts.json``: what ``minillm-report --compare`` gives for the same runs), never from a copy.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import statistics
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from minillm.analysis import stats as st
from minillm.analysis import verdict_files as verdict_report
from minillm.analysis.runs import find_runs


class Runs(list):
    """Run records: dicts with the summary.json fields plus ``curves`` (metric -> [(step, value)])."""

    def where(self, **kw: Any) -> Runs:
        return Runs(r for r in self if all(r.get(k) == v for k, v in kw.items()))

    def values(self, key: str) -> list[Any]:
        return sorted({r.get(key) for r in self}, key=lambda v: (v is None, v))


Stage = tuple[str, Callable[[list[str]], None]]  # a two-stage round's step between its stages: (help, run)


def parse_args(doc: str, argv: Sequence[str] | None = None, stages: Mapping[str, Stage] | None = None
               ) -> argparse.Namespace:
    """The analysis CLI: sweep folders (none: the committed runs), ``--out DIR``, ``--collect``, and each of
    ``stages`` as ``--<name> SWEEP...`` (a step a round's run.sh takes between its stages, e.g. the pilot's lr
    choice)."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("sweeps", nargs="*", help="sweep folder(s) holding the runs' summary.json; none: the committed "
                                             "runs.jsonl / curves.json")
    p.add_argument("--out", type=Path, help="folder for results.json, results.md and the plots (and, with sweep "
                                            "folders, runs.jsonl / curves.json); default: the study's own folder")
    p.add_argument("--collect", action="store_true",
                   help="only save the sweep folders' runs.jsonl / curves.json in --out, no analysis: a part of a "
                        "round that runs in pieces, which a later analysis reads among its sweep folders")
    for flag, (text, _) in (stages or {}).items():
        if flag.lstrip("-").replace("-", "_") in ("sweeps", "out", "collect"):
            raise ValueError(f"stage {flag} would take the place of the analysis's own argument; name it otherwise")
        p.add_argument(flag, nargs="+", metavar="SWEEP", help=text)
    args = p.parse_args(argv)
    if args.collect and not (args.sweeps and args.out):
        p.error("--collect needs sweep folder(s) and --out DIR")
    return args


def analysis_main(doc: str, folder: Path, metrics: Callable[[str], bool],
                  analyze: Callable[[Runs], tuple[dict, str]], plot: Callable[[Runs, Path], None] | None,
                  argv: Sequence[str] | None = None, engine: Callable[[Runs], dict] | None = None,
                  stages: Mapping[str, Stage] | None = None) -> None:
    """A study's analysis CLI: its runs (sweep folders, or the committed copy in ``folder``), keeping the curves
    ``metrics`` selects; ``analyze`` gives results.json's dict and results.md's text; ``plot`` draws from the runs;
    ``engine`` gives verdicts.json's dict (minillm.analysis.compare.compare on the runs); ``stages``: the steps
    between a two-stage round's stages, each run on its own sweep folders instead of the analysis."""
    args = parse_args(doc, argv, stages)
    for flag, (_, run) in (stages or {}).items():
        if (sweeps := getattr(args, flag.lstrip("-").replace("-", "_"))) is not None:
            return run(sweeps)
    out = args.out or folder
    runs = load(folder, args.sweeps, metrics, out)
    if args.collect:
        print(f"saved {len(runs)} runs in {out}")
        return
    write(out, *analyze(runs))
    if engine is not None:
        write_verdicts(out, engine(runs))
    if plot is not None:
        plot(runs, out)


def printed_sweeps(main: Callable[[Sequence[str]], None], stage: str) -> dict[str, list[str]]:
    """The sweeps a two-stage round's analysis prints for a stage (``--print-sweeps STAGE``), split as its run.sh
    reads them: each sweep's folder and its overrides."""
    out, sweeps = io.StringIO(), {}
    with contextlib.redirect_stdout(out):
        main(["--print-sweeps", stage])
    for folder, *overrides in (line.split() for line in out.getvalue().splitlines() if line.strip()):
        if folder in sweeps:
            raise ValueError(f"--print-sweeps {stage} prints the folder {folder} twice: its runs would share it")
        sweeps[folder] = overrides
    return sweeps


def load(folder: Path, sweep_dirs: Sequence[str], metrics: Callable[[str], bool], out: Path | None = None) -> Runs:
    """Runs of the given sweep folders (saved compactly in ``out``, default ``folder``), or the copy in ``folder``.
    A sweep folder holding a runs.jsonl is a saved copy (``--collect``, or a round's folder): its records are read
    as saved."""
    if sweep_dirs:
        records = []
        for d in sweep_dirs:
            if (Path(d) / "runs.jsonl").exists():
                records += saved(Path(d))
                continue
            for run in find_runs(d):
                curves = {k: v for k, v in run.curves.items() if metrics(k)}
                records.append({**run.summary, "curves": curves})
        if not records:
            sys.exit(f"no summary.json under {', '.join(sweep_dirs)}")
        records.sort(key=lambda r: r.get("run_dir") or "")
        dirs = [r["run_dir"] for r in records if r.get("run_dir")]
        if len(set(dirs)) < len(dirs):
            sys.exit(f"a run is given twice (a saved copy and its sweep folder?): "
                     f"{sorted({d for d in dirs if dirs.count(d) > 1})[0]}")
        out = out or folder
        out.mkdir(parents=True, exist_ok=True)
        with open(out / "runs.jsonl", "w") as f:
            for r in records:
                f.write(json.dumps({k: v for k, v in r.items() if k != "curves"}) + "\n")
        (out / "curves.json").write_text(json.dumps([r["curves"] for r in records], separators=(",", ":")))
        return Runs(records)
    if not (folder / "runs.jsonl").exists():
        sys.exit(f"give the sweep folder(s) to analyze; {folder / 'runs.jsonl'} does not exist yet")
    return Runs(saved(folder))


def saved(folder: Path) -> list[dict]:
    """The run records a folder's runs.jsonl / curves.json hold (what :func:`load` saved there)."""
    summaries = [json.loads(line) for line in (folder / "runs.jsonl").read_text().splitlines() if line.strip()]
    curves = json.loads((folder / "curves.json").read_text())
    return [{**s, "curves": {k: [tuple(p) for p in v] for k, v in c.items()}}
            for s, c in zip(summaries, curves, strict=True)]


# --- comparisons, by minillm.analysis.stats ------------------------------------------------------------------------


def paired(arm: Mapping[Any, float | None], baseline: Mapping[Any, float | None], alpha: float = 0.05) -> dict:
    """minillm.analysis.stats.paired_t of arm[seed] - baseline[seed] over the seeds both hold a number for (in seed
    order), with ``seeds`` added: {diff, ci_low, ci_high, p, sd, n, method, seeds}. The interval a study gives a
    difference of seed means; with fewer than 2 pairs its ends are None."""
    seeds = sorted(s for s in arm if s in baseline and arm[s] is not None and baseline[s] is not None)
    return {**st.paired_t([arm[s] for s in seeds], [baseline[s] for s in seeds], alpha), "seeds": seeds}


def by_seed(runs: Iterable[dict], value: Callable[[dict], float | None]) -> dict[Any, float | None]:
    """seed -> value(run) of the runs of one arm."""
    return {r["seed"]: value(r) for r in runs}


def ci(result: Mapping[str, Any], digits: int = 3) -> str:
    """A paired_t / welch_t result's interval as "[-0.011, +0.033]" ("-" without one)."""
    low, high = result.get("ci_low"), result.get("ci_high")
    return "-" if low is None or high is None else f"[{low:+.{digits}f}, {high:+.{digits}f}]"


def rate_ci(k: int, n: int, digits: int = 2) -> str:
    """k/n with the Clopper-Pearson 95% interval of the rate (minillm.analysis.stats.exact_ci): "6/10 [0.26, 0.88]"."""
    interval = st.exact_ci(k, n)
    return f"{k}/{n}" + ("" if interval is None else f" [{interval[0]:.{digits}f}, {interval[1]:.{digits}f}]")


def write_verdicts(folder: Path, verdicts: dict[str, Any]) -> None:
    """verdicts.json, verdicts.md and verdicts.png of minillm.analysis.compare's dict for the study's runs, written as
    ``minillm-report --compare`` writes them (minillm.analysis.verdict_files)."""
    verdict_report.write(verdicts, folder)


# --- tables ------------------------------------------------------------------------------------------------


def mean(values: Iterable[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.fmean(vals) if vals else None


def spread(values: Iterable[float | None]) -> float | None:
    """max - min of the non-missing values (the seed range)."""
    vals = [v for v in values if v is not None]
    return max(vals) - min(vals) if len(vals) > 1 else None


def fmt(value: Any, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.{digits}f}" if abs(value) < 1e4 else f"{value:.3g}"
    return str(value)


def table(header: Sequence[str], rows: Iterable[Sequence[Any]], digits: int = 3) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(fmt(v, digits) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def write(folder: Path, results: dict[str, Any], markdown: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    (folder / "results.md").write_text(markdown.rstrip() + "\n")
    print(markdown)
