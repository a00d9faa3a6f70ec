"""A re-analysis of this round's committed runs by the stability verdict (added 2026-11-28, after the round; its
pre-registered verdicts stand): norm against layernorm per width, written into stability/.

    python -m experiments.studies.s3_lr_sensitivity.r5_width_low_lr.stability [--out DIR]
"""

from pathlib import Path

from experiments.common import reanalysis

if __name__ == "__main__":
    reanalysis.main(Path(__file__).parent, "norm", "layernorm")
