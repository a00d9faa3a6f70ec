"""A re-analysis of this round's committed runs by the stability verdict (added 2026-11-28, after the round; its
pre-registered verdicts stand): qk_norm against none per width, written into stability/.

    python -m experiments.studies.s3_lr_sensitivity.r6_qk_width.stability [--out DIR]
"""

from pathlib import Path

from experiments.common import reanalysis

if __name__ == "__main__":
    reanalysis.main(Path(__file__).parent, "qk_norm", "none")
