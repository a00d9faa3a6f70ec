"""Shared plumbing of the sweep studies' analysis scripts (S2-S5, S7).

A study runs ``python train.py -m experiment=<study>``; the runs land in ``logs/<study>/multiruns/<time>/``.
Its ``analyze.py`` reads them from disk with :func:`load`, computes the study's table, and writes, next to
itself, the compact artefacts that are committed: ``runs.jsonl`` (every run's summary.json), ``curves.json``
(only the logged curves its plots use), ``results.json`` and ``results.md``, and PNGs. With no sweep folder
given it re-analyzes the committed ``runs.jsonl`` / ``curves.json``, so tables and plots can be regenerated
without rerunning the sweep.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from minillm.report import find_runs

ROOT = Path(__file__).resolve().parents[1]


def machine() -> str:
    """CPU model and core count, torch version: what every committed result names."""
    import torch

    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        cpu = next(line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name"))
    except (OSError, StopIteration):
        cpu = platform.processor() or "unknown CPU"
    return f"{cpu}, {os.cpu_count()} cores, no GPU, torch {torch.__version__}"


class Runs(list):
    """Run records: dicts with the summary.json fields plus ``curves`` (metric -> [(step, value)])."""

    def where(self, **kw: Any) -> Runs:
        return Runs(r for r in self if all(r.get(k) == v for k, v in kw.items()))

    def values(self, key: str) -> list[Any]:
        return sorted({r.get(key) for r in self}, key=lambda v: (v is None, v))


def load(folder: Path, sweep_dirs: Sequence[str], metrics: Callable[[str], bool]) -> Runs:
    """Runs of the given sweep folders (read and saved compactly in ``folder``), or of the saved copy."""
    runs_file, curves_file = folder / "runs.jsonl", folder / "curves.json"
    if sweep_dirs:
        records = []
        for d in sweep_dirs:
            for run in find_runs(d):
                curves = {k: v for k, v in run.curves.items() if metrics(k)}
                records.append({**run.summary, "curves": curves})
        if not records:
            sys.exit(f"no summary.json under {', '.join(sweep_dirs)}")
        records.sort(key=lambda r: r.get("run_dir") or "")
        with open(runs_file, "w") as f:
            for r in records:
                f.write(json.dumps({k: v for k, v in r.items() if k != "curves"}) + "\n")
        curves_file.write_text(json.dumps([r["curves"] for r in records], separators=(",", ":")))
        return Runs(records)
    if not runs_file.exists():
        sys.exit(f"give the sweep folder(s) to analyze; {runs_file} does not exist yet")
    summaries = [json.loads(line) for line in runs_file.read_text().splitlines() if line.strip()]
    curves = json.loads(curves_file.read_text())
    return Runs({**s, "curves": {k: [tuple(p) for p in v] for k, v in c.items()}}
                for s, c in zip(summaries, curves, strict=True))


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
    (folder / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    (folder / "results.md").write_text(markdown.rstrip() + "\n")
    print(markdown)
