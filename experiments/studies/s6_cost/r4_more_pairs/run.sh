#!/usr/bin/env bash
# S6 round 4's runs, from the repository root of a clean checkout (rules: analyze.py beside this file): the plan
# recorded, the 62 runs (seed varies slowest, so the pairs complete one after another), the report, the analysis.
# One run at a time (the basic launcher), one torch thread.
set -euo pipefail
PY=${PY:-.venv/bin/python}
R=experiments/studies/s6_cost/r4_more_pairs
SWEEP=s6_r4_rms_vs_ln
"$PY" -m minillm.analysis.plans $R/plan.yaml --sweep $SWEEP
"$PY" train.py -m experiment=cpu_study threads=1 name=$SWEEP seed=$(seq -s, 200 230) norm=layernorm,rmsnorm \
    optimizer.lr=0.003
cp logs/$SWEEP/plan.json $R/plan.json
"$PY" -m minillm.analysis.report logs/$SWEEP --plan
"$PY" -m $(echo $R | tr / .).analyze logs/$SWEEP
