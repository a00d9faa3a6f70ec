#!/usr/bin/env bash
# The first run on a CUDA GPU: steps a-d, each under 9 minutes on an H100, run back to back, and e (README.md).
#
#   bash experiments/benchmarks/gpu/plan.sh next     # THE NEXT RUN, one command of at most 9 minutes: kernel, loss and
#                                                    # host-read tests on the GPU, the tune of both backward variants at
#                                                    # 4K/8K, the judged kernel shapes (every provider, 3 repeats, kernel
#                                                    # time), the 125M step with the chunked loss at 3 batch sizes;
#                                                    # at most 8 files in $OUT (README.md, "The next run")
#   bash experiments/benchmarks/gpu/plan.sh tests    # GPU tests (pytest -m gpu + the kernel suite on CUDA, its sm_90
#                                                    # compile test), one-pass backward tunables (--mode tune)
#   bash experiments/benchmarks/gpu/plan.sh kernels  # kernel sweep: fused vs eager, F.rms_norm, torch.compile, Liger
#   bash experiments/benchmarks/gpu/plan.sh train    # ~125M train step, rmsnorm vs fused_rmsnorm, eager and compiled
#   bash experiments/benchmarks/gpu/plan.sh preset   # train.py trainer=gpu model=gpt125m, stability callbacks on/off
#   bash experiments/benchmarks/gpu/plan.sh quick    # ~8.5 minutes: the judged parts of tests, kernels and train
#   bash experiments/benchmarks/gpu/plan.sh norms    # rmsnorm / layernorm / fused_rmsnorm x pre / post x 3 seeds
#                                                    # (configs/experiment/gpu_norms.yaml), verdicts (~7 min)
#   bash experiments/benchmarks/gpu/plan.sh STEP --dry-run   # the same on the CPU: tiny shapes, TRITON_INTERPRET=1
#
# Each step writes its files straight into $OUT (default /tmp/minillm-gpu/STEP; set OUT to collect all the steps
# in one folder). `kernels` and `preset` install the wheels of scripts/wheelhouse.sh from ./wheelhouse (copied
# along with the checkout) into /tmp/site. Afterwards, on any machine with the checkout:
# python -m experiments.benchmarks.gpu.merge $OUT. The scripts run as modules from the repository root.
set -uo pipefail
cd "$(dirname "$0")/../../.."
STEP=${1:?usage: plan.sh next|tests|kernels|train|preset|quick|norms [--dry-run]}
DRY=$([ "${2:-}" = "--dry-run" ] && echo 1 || true)
OUT=${OUT:-/tmp/minillm-gpu/$STEP}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 TRITON_DEFAULT_FP_FUSION=1
[ -n "$DRY" ] && export TRITON_INTERPRET=1
SMOKE=${DRY:+--smoke}
status=0
step() {  # step SECONDS LOGNAME COMMAND...: run with a time limit, log to $OUT, remember a failure
  local limit=$1 name=$2; shift 2
  [ -z "$DRY" ] || limit=$((limit * 4))  # the dry run checks the plumbing on a slow CPU interpreter, not the time
  echo "== $(date +%T) $* (limit ${limit}s)" | tee -a "$OUT/$name.log"
  timeout "$limit" "$@" 2>&1 | tee -a "$OUT/$name.log"
  local rc=${PIPESTATUS[0]}
  [ "$rc" = 0 ] || { echo "== exit $rc: $*" | tee -a "$OUT/$name.log"; status=1; }
}
wheels() {  # the wheelhouse copied with the checkout into /tmp/site (the machine's Python stays untouched)
  [ -z "$DRY" ] || { echo "dry run: the wheelhouse is not installed (this Python has what it needs)"; return; }
  [ -d wheelhouse ] || { echo "no ./wheelhouse: run scripts/wheelhouse.sh on a machine with network and copy ./wheelhouse here" | tee -a "$OUT/$STEP.log"; return; }
  TARGET=/tmp/site PYTHON=$PY bash scripts/setup.sh --offline wheelhouse > "$OUT/wheels.log" 2>&1
  local rc=$?  # the whole install log comes back; its end is shown, and a failure counts
  tail -12 "$OUT/wheels.log" | tee -a "$OUT/$STEP.log"
  [ "$rc" = 0 ] || { echo "== exit $rc: wheelhouse install (see wheels.log)" | tee -a "$OUT/$STEP.log"; status=1; }
  export PYTHONPATH="/tmp/site:$PYTHONPATH"
}

environment() {  # the machine, the versions, the whole pip list
  { date; nvidia-smi 2>&1 | head -20; echo "host: $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo || lscpu | grep -m1 'Model name')"; $PY -c "import sys, torch, triton; print(sys.version); print('torch',
torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__, 'gpu', torch.cuda.is_available()
and torch.cuda.get_device_name())"; echo "pip list:"; $PY -m pip list 2>/dev/null; } > "$OUT/env.txt" 2>&1
}
kernel_tests() {  # SECONDS LOGNAME [pytest options]: the kernel suites on CUDA, the gpu tests, the sm_90 compile report
  local limit=$1 name=$2; shift 2
  step "$limit" "$name" $PY -m pytest tests/test_kernels.py tests/test_add_rmsnorm.py -m "gpu or not slow" -q -rfEs \
    -p no:cacheprovider --junitxml="$OUT/tests.xml" "$@"
}

case $STEP in
  next)  # ~8.5 minutes after the wheels; 8 files: env.txt, wheels.log, tests.log, tests.xml, next.log (the other
    # parts), <device>.json/.md/.png
    wheels
    environment
    only=(-n 8); [ -z "$DRY" ] || only=(-n 2 -k "odd_shapes or chunked_matches_plain_in_fp32 or gpu")  # dry: a few
    gpu_only=(tests/test_loss.py::test_gpu_bf16_parity_with_the_plain_loss  # the loss and the sync count, on the GPU
              tests/test_loss.py::test_gpu_compiled_training_step_with_the_chunked_loss
              tests/callbacks/test_host_reads.py::test_on_a_gpu_a_step_that_logs_nothing_synchronizes_nothing)
    kernel_tests 145 tests "${gpu_only[@]}" ${only[@]+"${only[@]}"}
    judged=(--rows 16384 65536 --hidden 2048 4096 8192); [ -z "$DRY" ] || judged=()  # the dry run: tiny shapes
    tuned=(--hidden 4096 8192); [ -z "$DRY" ] || tuned=()
    step 50 next $PY -m experiments.benchmarks.kernels.bench --mode tune "${tuned[@]}" --out "$OUT" $SMOKE
    graphs=(--graphs-only); [ -z "$DRY" ] || graphs=()  # the dry run's CPU has no CUDA graphs: its eager timings
    step 120 next $PY -m experiments.benchmarks.kernels.bench --mode kernels --use-tuned "${graphs[@]}" --rep-ms 40 \
      --repeats 3 "${judged[@]}" --providers fused F.rms_norm torch.compile liger fused_add add+fused --out "$OUT" \
      $SMOKE ${DRY:+--no-compile}
    step 180 next $PY -m experiments.benchmarks.kernels.bench --mode train --train-matrix loss --train-steps 20 \
      --out "$OUT" $SMOKE ${DRY:+--no-compile} ;;
  tests)
    environment
    kernel_tests 300 tests
    step 150 tune $PY -m experiments.benchmarks.kernels.bench --mode tune --out "$OUT" $SMOKE ;;
  quick)  # ~8.5 minutes, when time is short: the judged part of tests, kernels and train (no tune, no M = 4K, no preset)
    [ -d wheelhouse ] && wheels
    environment  # after the wheels: the pip list names what the run imports
    kernel_tests 150 tests -n 8  # 110 s on an H200
    judged=(--rows 16384 65536 --hidden 2048 4096 8192); [ -z "$DRY" ] || judged=()  # the dry run: tiny shapes
    step 150 kernels $PY -m experiments.benchmarks.kernels.bench --mode kernels "${judged[@]}" --out "$OUT" $SMOKE \
      ${DRY:+--no-compile}
    step 330 train $PY -m experiments.benchmarks.kernels.bench --mode train --out "$OUT" $SMOKE ${DRY:+--no-compile} ;;
  kernels)
    wheels
    step 500 kernels $PY -m experiments.benchmarks.kernels.bench --mode kernels --out "$OUT" $SMOKE \
      ${DRY:+--no-compile} ;;
  train)
    step 480 train $PY -m experiments.benchmarks.kernels.bench --mode train --out "$OUT" $SMOKE ${DRY:+--no-compile} ;;
  preset)
    wheels
    step 480 preset $PY -m experiments.benchmarks.gpu.preset --out "$OUT" ${DRY:+--dry-run} ;;
  norms)  # the norm comparison of configs/experiment/gpu_norms.yaml (18 runs), then its verdicts: loss and speed
    wheels
    environment
    tiny=(trainer=cpu model.dim=32 model.n_layers=2 model.n_heads=2 model.max_seq_len=32 model.compile=false
          data.batch_size=4 data.val_windows=8 trainer.max_steps=4 trainer.val_check_interval=4 scheduler.warmup_steps=2)
    [ -n "$DRY" ] || tiny=()  # the dry run: the same sweep and reports, a tiny model on the CPU
    step 450 norms $PY train.py -m experiment=gpu_norms "paths.log_dir=$OUT/logs" ${tiny[@]+"${tiny[@]}"}
    sweep=$(ls -d "$OUT"/logs/gpu_norms/multiruns/*/ 2>/dev/null | tail -1)  # this step's sweep: $OUT starts empty
    if [ -z "$sweep" ]; then
      echo "== no sweep folder under $OUT/logs/gpu_norms/multiruns: no verdicts" | tee -a "$OUT/norms.log"; status=1
    else  # the speed margin: 2% of rmsnorm's median steady rate (a relative margin, fixed here before the data)
      margin=$($PY -c "import json, statistics, sys; from pathlib import Path
runs = [json.loads(p.read_text()) for p in Path(sys.argv[1]).glob('*/summary.json')]
rates = [r['steady_tokens_per_s'] for r in runs if r.get('norm') == 'rmsnorm' and r.get('steady_tokens_per_s')]
print(0.02 * statistics.median(rates) if rates else 'none')" "$sweep")
      step 60 verdicts $PY -m minillm.analysis.report "$sweep" --compare norm --baseline rmsnorm --margin 0.02 \
        --out "$OUT/norms_loss"
      if [ "$margin" = none ]; then
        echo "== no rmsnorm run with a steady rate: no speed verdict" | tee -a "$OUT/verdicts.log"; status=1
      else
        step 60 verdicts $PY -m minillm.analysis.report "$sweep" --compare norm --baseline rmsnorm \
          --metric steady_tokens_per_s --higher-is-better --margin "$margin" --out "$OUT/norms_speed"
      fi
    fi ;;
  *) echo "unknown step $STEP: next | tests | kernels | train | preset | quick | norms" >&2; exit 2 ;;
esac
echo "== $STEP done (status $status); files in $OUT:"; ls -la "$OUT"
exit $status
