#!/usr/bin/env bash
# S4 round 4's runs, from the repository root (rules: analyze.py beside this file): every arm clipped at norm 1.0,
# batch 4 and 64, seeds 0-4. One process at a time; on a quiet machine (load < 2) add
# hydra/launcher=joblib hydra.launcher.n_jobs=2 threads=1.
set -euo pipefail
PY=${PY:-.venv/bin/python}
S=(experiment=s4_batchnorm data.batch_size=4,64 seed=0,1,2,3,4 trainer.gradient_clip_val=1.0)
"$PY" train.py -m "${S[@]}" norm=batchnorm,layernorm hydra.sweep.dir=logs/s4_batchnorm/multiruns/round4_bn_ln
"$PY" train.py -m "${S[@]}" norm=powernorm model.norm_options.warmup_steps=40 model.norm_options.group_scaling=0,1 \
    hydra.sweep.dir=logs/s4_batchnorm/multiruns/round4_pn
"$PY" -m experiments.studies.s4_batchnorm.r4_powernorm_paper.analyze logs/s4_batchnorm/multiruns/round4_*
