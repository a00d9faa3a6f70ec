"""Where things are in experiments/, found on disk, never listed by hand.

    studies/sNN_name/              a study: README.md (every round) and one folder per round
    studies/sNN_name/rK_name/      a round: its script(s), its committed data and results, its finding.json
    studies/sNN_name/rK_name/parts/<piece>/
                                   a round that runs in pieces: each piece's saved runs (runs.jsonl, curves.json),
                                   read by its analysis, removed once the round's own runs.jsonl is committed
    benchmarks/<name>/             a measurement of minillm itself: script(s), results, README.md, finding.json

A round whose folder holds ``analyze.py``, the committed runs (``runs.jsonl``) and ``results.json`` is an
*analysis*: ``python -m <its module> --out DIR`` re-analyzes the committed runs into DIR, and the results must
come back unchanged (the slow test of tests/test_experiments.py runs every analysis found here).
Imports only the standard library (the GPU benchmarks import it on a bare CUDA image).
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the repository
EXPERIMENTS = ROOT / "experiments"
STUDIES = EXPERIMENTS / "studies"
BENCHMARKS = EXPERIMENTS / "benchmarks"
STUDY = re.compile(r"s(\d+)_[a-z0-9_]+")
ROUND = re.compile(r"r(\d+)_[a-z0-9_]+")
PARTS = "parts"  # a round's folder of pieces (saved runs of a round that runs in pieces)


def _numbered(folder: Path, pattern: re.Pattern) -> list[Path]:
    found = [p for p in folder.iterdir() if p.is_dir() and pattern.fullmatch(p.name)]
    return sorted(found, key=lambda p: int(pattern.fullmatch(p.name).group(1)))


def studies(root: Path = STUDIES) -> list[Path]:
    """Every study folder, in the order of its number (s0, s1, ..., s10)."""
    return _numbered(root, STUDY)


def rounds(study: Path) -> list[Path]:
    """A study's round folders, in order (r1, r2, ...)."""
    return _numbered(study, ROUND)


def benchmarks() -> list[Path]:
    """Every benchmark folder (a package with a README.md), by name."""
    return sorted(p for p in BENCHMARKS.iterdir() if (p / "README.md").exists())


def analyses(root: Path = STUDIES) -> list[Path]:
    """The rounds that re-analyze committed runs: ``analyze.py`` beside ``runs.jsonl`` and ``results.json``."""
    return [r for s in studies(root) for r in rounds(s)
            if all((r / name).exists() for name in ("analyze.py", "runs.jsonl", "results.json"))]


def module(path: Path) -> str:
    """The dotted module of a file or package under the repository: experiments/studies/s2_warmup/r2_xavier/analyze.py
    -> experiments.studies.s2_warmup.r2_xavier.analyze."""
    rel = path.resolve().relative_to(ROOT)
    return ".".join(rel.with_suffix("").parts if rel.suffix == ".py" else rel.parts)
