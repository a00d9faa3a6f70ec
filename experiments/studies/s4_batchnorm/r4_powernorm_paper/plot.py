"""S4 round 4's figure, from the committed runs, drawn as round 3's (each run's final val loss per norm at batch 4
and 64, a failed run in red), apart from the pre-registered analysis, whose file stays as committed before the runs.

    python -m experiments.studies.s4_batchnorm.r4_powernorm_paper.plot     # writes powernorm.png here
"""

from __future__ import annotations

from pathlib import Path

from experiments.studies.s4_batchnorm.r3_powernorm_nogroup import plot as r3_plot

HERE = Path(__file__).parent


def main() -> Path:
    return r3_plot.main(HERE, ", every arm clipped at 1.0")


if __name__ == "__main__":
    print(main())
