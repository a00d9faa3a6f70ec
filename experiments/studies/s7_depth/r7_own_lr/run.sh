#!/usr/bin/env bash
# S7 round 7's runs, from the repository root (rules, lr grid and seeds: analyze.py beside this file, which prints
# each stage's sweeps), in two stages that may run apart, from the same commit:
#   bash experiments/studies/s7_depth/r7_own_lr/run.sh pilot    # seeds 40-41, every arm at every lr (36 runs, ~2.6 h),
#                                                               # then each arm's lr into choice.json
#   bash experiments/studies/s7_depth/r7_own_lr/run.sh judged   # each arm's lr chosen again from the pilot's runs,
#                                                               # seeds 50-57 at it (24 runs, ~1.7 h), the analysis
#   bash experiments/studies/s7_depth/r7_own_lr/run.sh          # both, one after the other
# A chosen lr at its grid's edge stops run.sh with one line (exit 1) before any judged run. Two compiled processes of
# one torch thread side by side (JOBS=1 for one). Every run has its own folder, named by its lr and seed, and a
# checkpoint when a signal stops it (ckpt_path=auto), so the same command again continues: a run stopped by a signal
# resumes, the runs that ended are left as they are (a crashed one too: it counts at ln V), the runs not yet run run.
# A crash does not stop the stages; the analysis decides (it stops on a missing run or one that has not ended). A
# signal stops run.sh.
set -euo pipefail
STAGE=${1:-both}
case "$STAGE" in
  pilot|judged|both) ;;
  *) echo "the stage must be pilot or judged (none: both), not $STAGE" >&2; exit 2 ;;
esac
PY=${PY:-.venv/bin/python}
R=experiments.studies.s7_depth.r7_own_lr.analyze
D=logs/s7_depth/r7
sweep() {  # sweep FOLDER OVERRIDES...
  local dir=$1 rc=0
  shift
  "$PY" train.py -m experiment=s7_depth model.n_layers=48 trainer.max_steps=900 model.compile=true 'tags=[own_lr]' \
      "$@" hydra/launcher=joblib hydra.launcher.n_jobs="${JOBS:-2}" threads=1 \
      'callbacks=[stability,preemption]' callbacks.stability.every_n_steps=50 ckpt_path=auto \
      hydra.sweep.dir="$D/$dir" 'hydra.sweep.subdir=lr${optimizer.lr}_seed${seed}' || rc=$?
  if [ "$rc" -ge 128 ]; then exit "$rc"; fi
  if [ "$rc" -ne 0 ]; then echo "a run in $D/$dir ended with an error (exit $rc); going on" >&2; fi
}
stage() {  # stage pilot|judged: each sweep analyze.py prints for it
  local lines
  lines=$("$PY" -m $R --print-sweeps "$1")
  while read -r dir overrides; do
    read -ra args <<< "$overrides"
    sweep "$dir" "${args[@]}" < /dev/null
  done <<< "$lines"
}
choose() {  # each arm's lr from the pilot's runs into choice.json; an lr at its grid's edge stops here
  local rc=0 chosen
  chosen=$("$PY" -m $R --choose $D/pilot_*) || rc=$?
  echo "chosen: $chosen"
  if [ "$rc" -ne 0 ]; then exit "$rc"; fi
}
if [ "$STAGE" != judged ]; then stage pilot; fi
choose
if [ "$STAGE" != pilot ]; then
  stage judged
  "$PY" -m $R $D/pilot_* $D/judged_*
fi
