#!/usr/bin/env bash
# The studies' GPU round: one command of at most 9 minutes on one CUDA GPU (an H100 or H200, or any CUDA machine
# where the stages' time limits cut what does not fit): S10 round 5 (curse of depth at L = 24, 330 s) and S2 round 3
# (Post-LN warmup at width 512, 200 s), each gated on its premise before it trains. Their files go to
# $OUT/r5_gpu_depth and $OUT/r3_gpu_width (default OUT=/tmp/minillm-gpu).
#   bash experiments/studies/gpu_round.sh            # on the GPU, from the repository root
#   bash experiments/studies/gpu_round.sh --dry-run  # any machine: every run's config built and counted
set -uo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
status=0
for round in s10_mixln.r5_gpu_depth s2_warmup.r3_gpu_width; do
  "$PY" -m "experiments.studies.$round.plan" "$@" || status=1
done
exit $status
