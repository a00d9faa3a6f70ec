#!/usr/bin/env bash
# S12 round 3's runs of one piece, from the repository root (rules: analyze.py beside this file): the muP arm in S3
# rounds 4-5's setting at widths 32-256 over a quarter-decade lr grid (the standard arm is S3's committed runs),
# width 32 first (the reuse gate: muP at its base width is the standard model), two runs side by side of one torch
# thread each. The seeds of a piece are its argument: `run.sh 0,1,2,3`, `run.sh 4,5,6,7`, `run.sh 8,9,10,11`; each
# piece is saved by --collect into parts/seeds<first>-<last>/, and once every piece is in:
#   python -m experiments.studies.s12_mup_transfer.r3_fine_grid.analyze \
#       experiments/studies/s12_mup_transfer/r3_fine_grid/parts/*
# Every run has its own folder, named by its lr and seed, and a checkpoint when a signal stops it (ckpt_path=auto),
# so the same command again continues: a run stopped by a signal resumes, the runs that ended (or crashed: the
# analysis reads them as they ended) are left as they are, the runs not yet run run. A signal stops run.sh.
set -euo pipefail
PY=${PY:-.venv/bin/python}
SEEDS=${1:?give the seeds of a piece, e.g. 0,1,2,3}
for s in ${SEEDS//,/ }; do
  case $s in 0|1|2|3|4|5|6|7|8|9|10|11) ;; *) echo "seed $s is not one of this round's (0-11)" >&2; exit 2 ;; esac
done
PIECE=seeds${SEEDS%%,*}-${SEEDS##*,}
R=experiments.studies.s12_mup_transfer.r3_fine_grid.analyze
ARM=(experiment=s3_lr_sensitivity norm=rmsnorm model.qk_norm=none module.z_loss=0
     model.parametrization=mup model.mup_base_width=32
     optimizer.lr=0.00178,0.00316,0.00562,0.01,0.0178,0.0316,0.0562 seed=$SEEDS
     threads=1 hydra/launcher=joblib hydra.launcher.n_jobs=2
     'callbacks=[stability,preemption]' ckpt_path=auto 'hydra.sweep.subdir=lr${optimizer.lr}_seed${seed}')
for width in 32 64 128 256; do
  rc=0
  "$PY" train.py -m "${ARM[@]}" model.dim=$width hydra.sweep.dir=logs/s12_r3/multiruns/${PIECE}_mup_$width || rc=$?
  if [ "$rc" -ge 128 ]; then exit "$rc"; fi
  if [ "$rc" -ne 0 ]; then echo "a run at width $width ended with an error (exit $rc); going on" >&2; fi
done
"$PY" -m $R --collect --out experiments/studies/s12_mup_transfer/r3_fine_grid/parts/$PIECE \
    logs/s12_r3/multiruns/${PIECE}_mup_*
