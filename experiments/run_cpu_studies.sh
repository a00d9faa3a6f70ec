#!/usr/bin/env bash
# Runs round 1 of the CPU sweep studies S2, S3, S4, S5 and S7 (and S7's rounds 2 and 3) and their analyses, as
# committed. Each sweep (`python train.py -m experiment=<study>`, see the study's README) is split into two shards
# run at once, one per core (one thread each), by seed, batch size or precision. About 3.5 hours on 2 cores. Later
# rounds give their commands in their README and in their analyze.py's docstring.
#   bash experiments/run_cpu_studies.sh            # all five
#   bash experiments/run_cpu_studies.sh s4 s7      # some
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
export OMP_NUM_THREADS=1
STAMP=$(date +%Y-%m-%d_%H-%M-%S)
mkdir -p logs

sweep() {  # sweep <study> <part> <overrides...>: one Hydra multirun into logs/<study>/<stamp>/<part>
  local study=$1 part=$2
  shift 2
  $PY train.py -m experiment="$study" "$@" hydra.sweep.dir="logs/$study/$STAMP/$part" \
    > "logs/$study-$STAMP-$part.log" 2>&1
}

join() { wait "$1"; wait "$2"; }  # both shards, failing if either failed

studies=("$@")
[ ${#studies[@]} -gt 0 ] || studies=(s2 s3 s4 s5 s7)
for study in "${studies[@]}"; do
  case $study in
    s2) sweep s2_warmup a seed=0 & a=$!; sweep s2_warmup b seed=1 & join $a $!
        $PY -m experiments.studies.s2_warmup.r1_grid.analyze "logs/s2_warmup/$STAMP" ;;
    s3) sweep s3_lr_sensitivity a seed=0 & a=$!; sweep s3_lr_sensitivity b seed=1 & join $a $!
        $PY -m experiments.studies.s3_lr_sensitivity.r1_grid.analyze "logs/s3_lr_sensitivity/$STAMP" ;;
    s4) sweep s4_batchnorm a data.batch_size=64 seed=0,1 & a=$!
        (sweep s4_batchnorm b data.batch_size=64 seed=2 && sweep s4_batchnorm c data.batch_size=4) & join $a $!
        $PY -m experiments.studies.s4_batchnorm.r1_grid.analyze "logs/s4_batchnorm/$STAMP" ;;
    s5) $PY -m experiments.studies.s5_precision.r1_precision.overflow
        (sweep s5_precision a trainer.precision=32-true,bf16-mixed && sweep s5_precision b trainer=cpu_fp16 seed=0) &
        a=$!; sweep s5_precision c trainer=cpu_fp16 seed=1 & join $a $!
        $PY -m experiments.studies.s5_precision.r1_precision.analyze "logs/s5_precision/$STAMP" ;;
    s7) sweep s7_depth a seed=0 & a=$!; sweep s7_depth b seed=1 & join $a $!
        # follow-up: eight more seeds of Post-LN and DeepNorm at the deepest L
        sweep s7_depth c placement=post,deepnorm model.n_layers=48 seed=2,3,4,5 & a=$!
        sweep s7_depth d placement=post,deepnorm model.n_layers=48 seed=6,7,8,9 & join $a $!
        $PY -m experiments.studies.s7_depth.r1_ladder.analyze "logs/s7_depth/$STAMP"
        # mechanism: the first 100 steps of the L=48 Post-LN / DeepNorm runs again, output change logged
        mech() {
          $PY train.py -m experiment=s7_depth placement=post,deepnorm model.n_layers=48 "seed=$2" \
            trainer.max_steps=100 scheduler.total_steps=300 callbacks.stability.output_change=true \
            hydra.sweep.dir="logs/s7_output/$STAMP/$1" > "logs/s7_output-$STAMP-$1.log" 2>&1
        }
        mech a 0,1,2,3,4 & a=$!; mech b 5,6,7,8,9 & join $a $!
        $PY -m experiments.studies.s7_depth.r2_output_change.analyze "logs/s7_output/$STAMP"
        # warmup: the L=48 Post-LN runs again with a 120-step warmup
        warm() {
          $PY train.py -m experiment=s7_depth placement=post model.n_layers=48 scheduler.warmup_steps=120 \
            "seed=$2" hydra.sweep.dir="logs/s7_warmup/$STAMP/$1" > "logs/s7_warmup-$STAMP-$1.log" 2>&1
        }
        warm a 0,1,2,3,4 & a=$!; warm b 5,6,7,8,9 & join $a $!
        $PY -m experiments.studies.s7_depth.r3_warmup.analyze "logs/s7_warmup/$STAMP" ;;
    *) echo "unknown study $study (s2 s3 s4 s5 s7)" >&2; exit 2 ;;
  esac
done
