#!/usr/bin/env bash
# S8 round 5's runs, from the repository root (rules, grids and seeds: analyze.py beside this file, which prints each
# stage's sweeps), in two stages: the pilot (seeds 0-1, every arm over its lr x alpha0 grid), each arm's cell chosen
# from it (choice.json; a cell at its grid's edge stops here, before any judged run), the judged runs (seeds 20-27)
# at those cells, then the analysis. Two processes of one torch thread side by side (JOBS=1 for one).
# Every run has its own folder, named by its lr, alpha0 and seed, and a checkpoint when a signal stops it
# (ckpt_path=auto), so the same command again continues: a run stopped by a signal resumes, the runs that ended are
# left as they are (a crashed one too: it counts at ln V), the runs not yet run run. A crash does not stop the
# stages; the analysis decides (it stops on a missing run or one that has not ended). A signal stops run.sh.
set -euo pipefail
PY=${PY:-.venv/bin/python}
R=experiments.studies.s8_dyt.r5_recipe.analyze
D=logs/s8_dyt/r5
sweep() {  # sweep FOLDER OVERRIDES...
  local dir=$1 rc=0
  shift
  "$PY" train.py -m experiment=s8_dyt model.init=gpt2 'tags=[dyt_recipe]' "$@" \
      hydra/launcher=joblib hydra.launcher.n_jobs="${JOBS:-2}" threads=1 \
      'callbacks=[stability,preemption]' callbacks.stability.every_n_steps=25 ckpt_path=auto \
      hydra.sweep.dir="$D/$dir" \
      'hydra.sweep.subdir=lr${optimizer.lr}_alpha${oc.select:model.norm_options.alpha0,none}_seed${seed}' || rc=$?
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
stage pilot
rc=0; CHOSEN=$("$PY" -m $R --choose $D/pilot_*) || rc=$?   # choice.json; a cell at its grid's edge stops here
echo "chosen: $CHOSEN"
if [ "$rc" -ne 0 ]; then exit "$rc"; fi
stage judged
"$PY" -m $R $D/pilot_* $D/judged_*
