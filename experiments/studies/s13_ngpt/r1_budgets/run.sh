#!/usr/bin/env bash
# S13 round 1's runs, from the repository root (rules: analyze.py beside this file): the pilot over the lr grid
# (seeds 0-1, 400 steps), each arm's lr chosen from it (lr_choice.json), the judged runs (seeds 2-6) at that lr,
# then the analysis. One process at a time; on a quiet machine (load < 2) run with JOBS=2.
set -euo pipefail
PY=${PY:-.venv/bin/python}
J=(${JOBS:+hydra/launcher=joblib hydra.launcher.n_jobs=$JOBS threads=1})
D=logs/s13_ngpt/multiruns
NGPT=(model.ngpt=true norm=none optimizer.weight_decay=0 scheduler.warmup_steps=0)
LRS=optimizer.lr=1e-3,3e-3,1e-2,3e-2,1e-1,3e-1
"$PY" train.py -m experiment=s13_ngpt norm=rmsnorm $LRS seed=0,1 hydra.sweep.dir=$D/pilot_baseline "${J[@]}"
"$PY" train.py -m experiment=s13_ngpt "${NGPT[@]}" $LRS seed=0,1 hydra.sweep.dir=$D/pilot_ngpt "${J[@]}"
read -r LR_BASE LR_NGPT < <("$PY" -m experiments.studies.s13_ngpt.r1_budgets.analyze --choose-lr $D/pilot_*)
echo "chosen lr: baseline $LR_BASE, nGPT $LR_NGPT"
"$PY" train.py -m experiment=s13_ngpt norm=rmsnorm optimizer.lr=$LR_BASE seed=2,3,4,5,6 \
    hydra.sweep.dir=$D/judged_baseline "${J[@]}"
"$PY" train.py -m experiment=s13_ngpt "${NGPT[@]}" optimizer.lr=$LR_NGPT trainer.max_steps=100,200,400 \
    seed=2,3,4,5,6 hydra.sweep.dir=$D/judged_ngpt "${J[@]}"
"$PY" -m experiments.studies.s13_ngpt.r1_budgets.analyze $D/*
