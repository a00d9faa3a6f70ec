"""S3 round 5's figure, from the committed runs (round 4's and this round's): round 4's figure on the six-point lr
grid. Drawn apart from the pre-registered analysis.

    python -m experiments.studies.s3_lr_sensitivity.r5_width_low_lr.plot     # writes width_transfer.png here
"""

from __future__ import annotations

from pathlib import Path

from experiments.studies.s3_lr_sensitivity.r4_width_transfer import plot as r4_plot
from experiments.studies.s3_lr_sensitivity.r5_width_low_lr.analyze import HERE, LRS


def main() -> Path:
    return r4_plot.main(HERE, LRS)


if __name__ == "__main__":
    print(main())
