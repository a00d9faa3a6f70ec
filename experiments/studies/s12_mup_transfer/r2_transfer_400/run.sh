#!/usr/bin/env bash
# S12 round 2's runs, from the repository root: the muP arm in S3 rounds 4-5's setting (the standard arm is S3's
# committed runs), width 32 first (the reuse gate: muP at its base width is the standard model), two runs side by
# side of one torch thread each (on a machine busy with other work, drop the two launcher overrides).
set -euo pipefail
PY=${PY:-.venv/bin/python}
ARM=(experiment=s3_lr_sensitivity norm=rmsnorm model.qk_norm=none module.z_loss=0
     model.parametrization=mup model.mup_base_width=32 optimizer.lr=3e-4,1e-3,3e-3,1e-2,3e-2,1e-1 seed=0,1,2,3,4
     threads=1 hydra/launcher=joblib hydra.launcher.n_jobs=2)
for width in 32 64 128; do
  "$PY" train.py -m "${ARM[@]}" model.dim=$width hydra.sweep.dir=logs/s12_r2/multiruns/mup_$width
done
"$PY" -m experiments.studies.s12_mup_transfer.r2_transfer_400.analyze logs/s12_r2/multiruns/mup_*
