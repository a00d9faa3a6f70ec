#!/usr/bin/env bash
# S7 round 5's runs, from the repository root (rules: analyze.py beside this file). One process at a time; on a
# quiet machine (load < 2) run with JOBS=2.
set -euo pipefail
PY=${PY:-.venv/bin/python}
J=(${JOBS:+hydra/launcher=joblib hydra.launcher.n_jobs=$JOBS threads=1})
S=(experiment=s7_depth model.n_layers=48 model.branch_scale=none,rezero,layerscale seed=20,21,22,23,24,25,26,27,28,29
   callbacks.stability.every_n_steps=10 'tags=[residual_scalars]')
"$PY" train.py -m "${S[@]}" placement=post hydra.sweep.dir=logs/s7_depth/multiruns/scalars_post "${J[@]}"
"$PY" train.py -m "${S[@]}" norm=none placement=pre hydra.sweep.dir=logs/s7_depth/multiruns/scalars_none "${J[@]}"
"$PY" -m experiments.studies.s7_depth.r5_residual_scalars.analyze logs/s7_depth/multiruns/scalars_*
