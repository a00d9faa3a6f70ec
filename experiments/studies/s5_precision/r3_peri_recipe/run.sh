#!/usr/bin/env bash
# S5 round 3's runs, from the repository root (rules: analyze.py beside this file). One process at a time; on a
# quiet machine (load < 2) add hydra/launcher=joblib hydra.launcher.n_jobs=2 threads=1.
set -euo pipefail
PY=${PY:-.venv/bin/python}
"$PY" train.py -m experiment=s10_mixln model.dim=48 model.n_layers=12 model.depth_scaled_init=false \
    trainer.max_steps=1000 trainer.val_check_interval=500 scheduler.warmup_steps=100 placement=pre,peri \
    optimizer.lr=1e-3,3e-3 seed=0,1,2 'tags=[peri_recipe]' hydra.sweep.dir=logs/s5_precision/multiruns/round3_peri
"$PY" -m experiments.studies.s5_precision.r3_peri_recipe.analyze logs/s5_precision/multiruns/round3_peri
