#!/usr/bin/env bash
# S13 round 2's runs, from the repository root (rules: analyze.py beside this file), in two stages: the pilot (seeds
# 0-1: the baseline over its lr grid at 400 steps, nGPT over its grid at each budget), each cell's lr chosen from it
# (lr_choice.json; a chosen lr at its grid's edge stops here, before any judged run), the judged runs (seeds 20-27)
# at those lrs, then the analysis. Two processes of one torch thread side by side (JOBS=1 for one).
# Every run has its own folder, named by its lr, steps and seed, and a checkpoint when a signal stops it
# (ckpt_path=auto), so the same command again continues: a run stopped by a signal resumes, the runs that ended are
# left as they are (a crashed one too: it counts at ln V), the runs not yet run run. A crash does not stop the
# stages; the analysis decides (it stops on a missing run or one that has not ended). A signal stops run.sh.
set -euo pipefail
PY=${PY:-.venv/bin/python}
R=experiments.studies.s13_ngpt.r2_steps_to_target.analyze
D=logs/s13_ngpt/r2
T='tags=[steps_to_target]'
NGPT=(model.ngpt=true norm=none optimizer.weight_decay=0 scheduler.warmup_steps=0)
JUDGED=seed=20,21,22,23,24,25,26,27
sweep() {  # sweep FOLDER OVERRIDES...
  local dir=$1 rc=0
  shift
  "$PY" train.py -m experiment=s13_ngpt "$T" "$@" hydra/launcher=joblib hydra.launcher.n_jobs="${JOBS:-2}" threads=1 \
      'callbacks=[stability,preemption]' ckpt_path=auto hydra.sweep.dir="$D/$dir" \
      'hydra.sweep.subdir=lr${optimizer.lr}_steps${trainer.max_steps}_seed${seed}' || rc=$?
  if [ "$rc" -ge 128 ]; then exit "$rc"; fi
  if [ "$rc" -ne 0 ]; then echo "a run in $D/$dir ended with an error (exit $rc); going on" >&2; fi
}
sweep pilot_baseline norm=rmsnorm optimizer.lr=1e-3,2e-3,3e-3,5e-3,1e-2,2e-2 seed=0,1
sweep pilot_ngpt "${NGPT[@]}" optimizer.lr=5e-3,1e-2,2e-2,3e-2,5e-2,1e-1 trainer.max_steps=200,250,300,350,400 seed=0,1
CHOSEN=$("$PY" -m $R --choose-lr $D/pilot_baseline $D/pilot_ngpt)   # baseline=<lr> 200=<lr> ... 400=<lr>
echo "chosen lr: $CHOSEN"
for pair in $CHOSEN; do
  cell=${pair%%=*} lr=${pair#*=}
  if [ "$cell" = baseline ]; then
    sweep judged_baseline norm=rmsnorm optimizer.lr="$lr" $JUDGED
  else
    sweep judged_ngpt_"$cell" "${NGPT[@]}" optimizer.lr="$lr" trainer.max_steps="$cell" $JUDGED
  fi
done
"$PY" -m $R $D/pilot_baseline $D/pilot_ngpt $D/judged_*
