#!/usr/bin/env bash
# S7 round 6's runs, from the repository root (rules: analyze.py beside this file): Post-LN without and with each
# residual scalar, and DeepNorm, at L = 48 and 10 fresh seeds, one lr per call (40 runs, ~2.8 h on the 2-core VM), so
# the halves can run apart; the analysis reads both. Two compiled processes of one thread side by side.
#   bash experiments/studies/s7_depth/r6_scalars_budget/run.sh 3e-3
#   bash experiments/studies/s7_depth/r6_scalars_budget/run.sh 1e-2     # then the analysis runs
set -euo pipefail
LR=${1:?give the lr of this half: 3e-3 or 1e-2}
case "$LR" in 3e-3|1e-2) ;; *) echo "lr must be 3e-3 or 1e-2, not $LR" >&2; exit 2 ;; esac
PY=${PY:-.venv/bin/python}
L=logs/s7_depth/multiruns
S=(experiment=s7_depth model.n_layers=48 trainer.max_steps=900 model.compile=true callbacks.stability.every_n_steps=50
   optimizer.lr="$LR" seed=30,31,32,33,34,35,36,37,38,39 threads=1 'tags=[scalars_budget]'
   hydra/launcher=joblib hydra.launcher.n_jobs=2)
"$PY" train.py -m "${S[@]}" placement=post model.branch_scale=none,rezero,layerscale hydra.sweep.dir=$L/budget_"$LR"_post
"$PY" train.py -m "${S[@]}" placement=deepnorm hydra.sweep.dir=$L/budget_"$LR"_deepnorm
if compgen -G "$L/budget_3e-3_*" > /dev/null && compgen -G "$L/budget_1e-2_*" > /dev/null; then
  "$PY" -m experiments.studies.s7_depth.r6_scalars_budget.analyze $L/budget_*
fi
