#!/usr/bin/env bash
# S3 round 7's runs, from the repository root (rules: analyze.py beside this file). One process at a time; on a
# quiet machine (load < 2) run with JOBS=2.
set -euo pipefail
PY=${PY:-.venv/bin/python}
J=(${JOBS:+hydra/launcher=joblib hydra.launcher.n_jobs=$JOBS threads=1})
D=logs/s3_lr_sensitivity/multiruns/qk_forms
"$PY" train.py -m experiment=s3_qk_forms model.qk_norm=none,rmsnorm hydra.sweep.dir=$D/none_head "${J[@]}"
"$PY" train.py -m experiment=s3_qk_forms model.qk_norm=rmsnorm model.qk_norm_axis=flat hydra.sweep.dir=$D/flat "${J[@]}"
"$PY" train.py -m experiment=s3_qk_forms model.qk_norm=l2 hydra.sweep.dir=$D/l2 "${J[@]}"
"$PY" -m experiments.studies.s3_lr_sensitivity.r7_qk_forms.analyze $D/*
