"""A re-analysis of S3's committed runs by the comparison engine's stability verdict, added after the study's rounds
(it changes none of their pre-registered verdicts): RMSNorm against LayerNorm per width (round 5's runs) and QK-norm
against none per width (round 6's runs), each over its lr grid, paired by seed, with today's default rules.

    python -m experiments.studies.s3_lr_sensitivity.stability_reanalysis [--out DIR]

is what ``minillm-report <sweep> --compare norm --baseline layernorm --stability`` gives on those sweeps; it writes
verdicts.json / verdicts.md / verdicts.png / loss_vs_lr.png per round into stability_reanalysis/<round>/.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from minillm import verdict_report
from minillm.compare import compare

HERE = Path(__file__).parent
QUESTIONS = (("r5_width_low_lr", "norm", "layernorm"), ("r6_qk_width", "qk_norm", "none"))


def reanalyze(round_name: str, factor: str, baseline: str) -> dict:
    runs = [json.loads(line) for line in (HERE / round_name / "runs.jsonl").read_text().splitlines() if line]
    return compare(runs, factor, baseline, stability=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=HERE / "stability_reanalysis")
    args = parser.parse_args(argv)
    for round_name, factor, baseline in QUESTIONS:
        files = verdict_report.write(reanalyze(round_name, factor, baseline), args.out / round_name)
        print(f"{round_name}: wrote {', '.join(f.name for f in files)} in {args.out / round_name}")


if __name__ == "__main__":
    main()
