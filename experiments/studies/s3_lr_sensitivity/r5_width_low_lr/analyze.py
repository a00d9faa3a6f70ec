"""S3 round 5 (pre-registered): round 4 with the learning-rate grid extended down to 3e-4.

Why: in round 4 the best lr at width 256 was the lowest grid point, 1e-3, in every (width 256, seed) cell, so its
lr* there is a grid edge (round 4's precondition "the best lr lies inside the grid" mixed) and its slopes are
truncated. This round adds the missing point and reads round 4's rules unchanged: the same analysis code
(round 4's analyze.analyze, run on the six-point grid), the same precondition and thresholds (MOVES 0.1, SAME 0.1
decades per doubling), the same Holm family (T1 layernorm, T1 rmsnorm, T2). Decided after round 4's data and said
so: the extension was chosen because of what round 4 showed; its thresholds were not.

Setting: round 4's (configs/experiment/s3_lr_sensitivity.yaml: 4 layers, 4 heads, 400 steps, z-loss 0, no
QK-norm) at lr 3e-4, width {32, 64, 128, 256} x norm {layernorm, rmsnorm} x seeds {0, 1, 2}: 24 runs, analysed with
round 4's 120.

    python train.py -m experiment=s3_lr_sensitivity model.dim=32,64,128,256 model.qk_norm=none module.z_loss=0 \\
        optimizer.lr=3e-4 seed=0,1,2 hydra/launcher=joblib hydra.launcher.n_jobs=2 \\
        hydra.sweep.dir=logs/s3_lr_sensitivity/multiruns/width_low
    python -m experiments.studies.s3_lr_sensitivity.r5_width_low_lr.analyze \\
        logs/s3_lr_sensitivity/multiruns/width logs/s3_lr_sensitivity/multiruns/width_low

Compute estimate (2-core CPU, two runs side by side, round 4's wall times: 11 s, 18 s, 38 s and 120 s a run at
widths 32-256): ~10 min.

Measures, precondition and hypotheses: round 4's (r4_width_transfer/analyze.py), on the grid
{3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1}.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from experiments.common.study import Runs, analysis_main
from experiments.studies.s3_lr_sensitivity.r4_width_transfer import analyze as r4

HERE = Path(__file__).parent
# --- fixed before the runs ---------------------------------------------------------------------------------
LRS = (3e-4, *r4.LRS)


@contextmanager
def six_point_grid() -> Iterator[None]:
    """Round 4's analysis reads its grid from its module: the extended grid while it runs."""
    saved, r4.LRS = r4.LRS, LRS
    try:
        yield
    finally:
        r4.LRS = saved


def analyze(runs: Runs) -> tuple[dict, str]:
    with six_point_grid():
        res, md = r4.analyze(runs)
    grid = ", ".join(f"{lr:g}" for lr in LRS)
    return {**res, "lrs": list(LRS)}, f"lr grid: {grid} (round 4's and this round's runs).\n\n{md}"


def main(argv: Sequence[str] | None = None) -> None:
    analysis_main(__doc__, HERE, lambda k: False, analyze, None, argv)


if __name__ == "__main__":
    main()
