"""Re-analyses of a round's committed runs by rules added after the round ran (labelled as such in the study's
README; a round's pre-registered verdicts never change): the engine's stability verdict, written into
``<round>/stability/`` as ``minillm-report <sweep> --compare FACTOR --baseline VALUE --stability`` writes it."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from minillm.analysis import verdict_files as verdict_report
from minillm.analysis.compare import compare
from minillm.analysis.rules import REGISTERED_V2


def stability(round_folder: Path, factor: str, baseline: str) -> dict:
    """The stability verdict (and the loss verdicts) of the round's runs.jsonl, by the rules of version 2 (frozen)."""
    runs = [json.loads(line) for line in (round_folder / "runs.jsonl").read_text().splitlines() if line]
    return compare(runs, factor, baseline, stability=True, **REGISTERED_V2)


def main(round_folder: Path, factor: str, baseline: str, argv: list[str] | None = None) -> None:
    """``python -m <round>.stability [--out DIR]``: write the files to DIR (default <round>/stability)."""
    parser = argparse.ArgumentParser(description=f"the stability verdict of {round_folder.name}'s runs, {factor} "
                                                 f"against {baseline} (a re-analysis)")
    parser.add_argument("--out", type=Path, default=round_folder / "stability")
    args = parser.parse_args(argv)
    files = verdict_report.write(stability(round_folder, factor, baseline), args.out)
    print(f"wrote {', '.join(f.name for f in files)} in {args.out}")
