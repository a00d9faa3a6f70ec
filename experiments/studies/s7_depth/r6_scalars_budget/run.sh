#!/usr/bin/env bash
# S7 round 6's runs, from the repository root (rules: analyze.py beside this file): Post-LN without and with each
# residual scalar, and DeepNorm, at L = 48 and 10 fresh seeds, one lr per call (40 runs, ~2.8 h on the 2-core VM), so
# the halves can run apart; the analysis reads both. Two compiled processes of one thread side by side.
#   bash experiments/studies/s7_depth/r6_scalars_budget/run.sh 3e-3
#   bash experiments/studies/s7_depth/r6_scalars_budget/run.sh 1e-2     # then the analysis runs
# A half may itself run in pieces, by seeds (each ~1.4 h for 5 seeds); each piece's runs are saved in
# parts/<lr>_seeds<first>-<last>/ beside this file, which the analysis reads among its sweep folders:
#   bash experiments/studies/s7_depth/r6_scalars_budget/run.sh 3e-3 30,31,32,33,34
#   python -m experiments.studies.s7_depth.r6_scalars_budget.analyze \
#       experiments/studies/s7_depth/r6_scalars_budget/parts/*         # once all 80 runs are saved there
set -euo pipefail
LR=${1:?give the lr of this half: 3e-3 or 1e-2}
case "$LR" in 3e-3|1e-2) ;; *) echo "lr must be 3e-3 or 1e-2, not $LR" >&2; exit 2 ;; esac
SEEDS=${2:-30,31,32,33,34,35,36,37,38,39}
[[ "$SEEDS" =~ ^3[0-9](,3[0-9])*$ ]] || { echo "seeds must be a comma list of 30-39, not $SEEDS" >&2; exit 2; }
PY=${PY:-.venv/bin/python}
HERE=experiments/studies/s7_depth/r6_scalars_budget
L=logs/s7_depth/multiruns
NAME=budget_"$LR"
[ -n "${2:-}" ] && NAME+="_seeds${SEEDS%%,*}-${SEEDS##*,}"
S=(experiment=s7_depth model.n_layers=48 trainer.max_steps=900 model.compile=true callbacks.stability.every_n_steps=50
   optimizer.lr="$LR" seed="$SEEDS" threads=1 'tags=[scalars_budget]'
   hydra/launcher=joblib hydra.launcher.n_jobs=2)
"$PY" train.py -m "${S[@]}" placement=post model.branch_scale=none,rezero,layerscale hydra.sweep.dir=$L/"$NAME"_post
"$PY" train.py -m "${S[@]}" placement=deepnorm hydra.sweep.dir=$L/"$NAME"_deepnorm
if [ -n "${2:-}" ]; then
  "$PY" -m "${HERE//\//.}".analyze --collect --out "$HERE/parts/${LR}_seeds${SEEDS%%,*}-${SEEDS##*,}" $L/"$NAME"_*
elif compgen -G "$L/budget_3e-3_*" > /dev/null && compgen -G "$L/budget_1e-2_*" > /dev/null; then
  "$PY" -m "${HERE//\//.}".analyze $L/budget_*
fi
