#!/usr/bin/env bash
# S13 round 2's runs, from the repository root (rules: analyze.py beside this file), in two stages: the pilot (seeds
# 0-1: the baseline over its lr grid at 400 steps, nGPT over its grid at each budget), each cell's lr chosen from it
# (lr_choice.json), the judged runs (seeds 20-27) at those lrs, then the analysis. Two processes of one torch thread
# side by side (JOBS=1 for one).
set -euo pipefail
PY=${PY:-.venv/bin/python}
R=experiments.studies.s13_ngpt.r2_steps_to_target.analyze
J=(hydra/launcher=joblib hydra.launcher.n_jobs=${JOBS:-2} threads=1)
D=logs/s13_ngpt/r2
T='tags=[steps_to_target]'
NGPT=(model.ngpt=true norm=none optimizer.weight_decay=0 scheduler.warmup_steps=0)
JUDGED=seed=20,21,22,23,24,25,26,27
"$PY" train.py -m experiment=s13_ngpt norm=rmsnorm optimizer.lr=1e-3,3e-3,1e-2,3e-2 seed=0,1 "$T" \
    hydra.sweep.dir=$D/pilot_baseline "${J[@]}"
"$PY" train.py -m experiment=s13_ngpt "${NGPT[@]}" optimizer.lr=3e-3,1e-2,3e-2,1e-1 \
    trainer.max_steps=200,250,300,350,400 seed=0,1 "$T" hydra.sweep.dir=$D/pilot_ngpt "${J[@]}"
CHOSEN=$("$PY" -m $R --choose-lr $D/pilot_baseline $D/pilot_ngpt)   # baseline=<lr> 200=<lr> ... 400=<lr>
echo "chosen lr: $CHOSEN"
for pair in $CHOSEN; do
  cell=${pair%%=*} lr=${pair#*=}
  if [ "$cell" = baseline ]; then
    "$PY" train.py -m experiment=s13_ngpt norm=rmsnorm optimizer.lr="$lr" $JUDGED "$T" \
        hydra.sweep.dir=$D/judged_baseline "${J[@]}"
  else
    "$PY" train.py -m experiment=s13_ngpt "${NGPT[@]}" optimizer.lr="$lr" trainer.max_steps="$cell" $JUDGED "$T" \
        hydra.sweep.dir=$D/judged_ngpt_"$cell" "${J[@]}"
  fi
done
"$PY" -m $R $D/pilot_baseline $D/pilot_ngpt $D/judged_*
