#!/usr/bin/env bash
# S5 round 4's runs, from the repository root (rules: analyze.py beside this file), in two stages: the pilot (seed 0,
# both placements x 3 lrs) chooses each placement's lr and reads the gate; only with the gate present do the judged
# seeds run, each placement at its pilot's lr. Two processes of one torch thread side by side.
set -euo pipefail
PY=${PY:-.venv/bin/python}
L=logs/s5_r4/multiruns
S=(experiment=s10_mixln model.dim=48 model.n_layers=12 model.depth_scaled_init=false model.compile=true
   trainer.max_steps=6700 trainer.val_check_interval=500 trainer.log_every_n_steps=50 scheduler.warmup_steps=100
   threads=1 'tags=[peri_budget]')
R=experiments.studies.s5_precision.r4_peri_budget.analyze
"$PY" train.py -m "${S[@]}" placement=pre,peri optimizer.lr=3e-3,1e-2,3e-2 seed=0 \
    hydra/launcher=joblib hydra.launcher.n_jobs=2 hydra.sweep.dir=$L/pilot
rc=0; CHOSEN=$("$PY" -m $R --pilot $L/pilot) || rc=$?
if [ "$rc" -eq 3 ]; then                                            # the pilot's gate is absent: no stage 2
  "$PY" -m $R $L/pilot
  exit 0
elif [ "$rc" -ne 0 ]; then
  exit "$rc"
fi
pids=()
for choice in $CHOSEN; do                                           # pre=<lr> peri=<lr>: one sweep each, side by side
  "$PY" train.py -m "${S[@]}" placement="${choice%%=*}" optimizer.lr="${choice#*=}" seed=10,11,12 \
      hydra.sweep.dir=$L/judged_"${choice%%=*}" &
  pids+=($!)
done
for pid in "${pids[@]}"; do wait "$pid"; done                        # a failed sweep stops here (set -e)
"$PY" -m $R $L/pilot $L/judged_pre $L/judged_peri
