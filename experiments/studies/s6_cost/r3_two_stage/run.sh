#!/usr/bin/env bash
# S6 round 3's runs, from the repository root of a clean checkout (rules: analyze.py beside this file): the plan
# recorded, the pilot (both norms x the lr grid x seeds 0-2), the freeze, the judged runs at the frozen lrs (the
# commands the freeze prints, read back from plan.json), the analysis. One run at a time, one torch thread
# (the basic launcher runs the jobs one after another; threads=1 is in the plan's overrides).
set -euo pipefail
PY=${PY:-.venv/bin/python}
R=experiments/studies/s6_cost/r3_two_stage
SWEEP=s6_r3_rms_vs_ln
"$PY" -m minillm.analysis.plans $R/plan.yaml --sweep $SWEEP
"$PY" train.py -m experiment=cpu_study threads=1 name=$SWEEP norm=layernorm,rmsnorm optimizer.lr=0.001,0.003,0.01 \
    seed=0,1,2
"$PY" -m minillm.analysis.plans freeze --sweep $SWEEP logs/$SWEEP
"$PY" -c "import json, sys; [print(c) for c in json.load(open(sys.argv[1]))['stages'][-1]['commands']]" \
    logs/$SWEEP/plan.json | while read -r line; do
  eval "set -- $line"; shift  # minillm-train is train.py: "$PY" train.py with the same overrides
  "$PY" train.py "$@"
done
cp logs/$SWEEP/plan.json $R/plan.json
"$PY" -m minillm.analysis.report logs/$SWEEP --plan
"$PY" -m $(echo $R | tr / .).analyze logs/$SWEEP
