#!/usr/bin/env bash
# S4 round 5's runs, from the repository root (rules: analyze.py beside this file): PowerNorm's parts in the released
# recipe (pooled statistics, one group, unclipped), clipping at 1.0 as a second factor at batch 4. Two runs side by
# side of one torch thread each (on a busy machine drop the two launcher overrides).
set -euo pipefail
PY=${PY:-.venv/bin/python}
S=(experiment=s4_batchnorm threads=1 hydra/launcher=joblib hydra.launcher.n_jobs=2)
B4=(data.batch_size=4 seed=0,1,2,3,4)
B64=(data.batch_size=64 seed=0,1,2 trainer.gradient_clip_val=null)
PN=(norm=powernorm model.norm_options.group_scaling=1 model.norm_options.stats=pooled)
ARMS=("model.norm_options.warmup_steps=0"                                            # PN-G
      "model.norm_options.warmup_steps=400"                                          # GS+batch
      "model.norm_options.alpha_fwd=1.0 model.norm_options.alpha_bwd=1.0")            # GS
L=logs/s4_r5/multiruns
"$PY" train.py -m "${S[@]}" "${B4[@]}" norm=batchnorm,layernorm trainer.gradient_clip_val=null hydra.sweep.dir=$L/b4_ref
"$PY" train.py -m "${S[@]}" "${B4[@]}" norm=batchnorm trainer.gradient_clip_val=1.0 hydra.sweep.dir=$L/b4_bn_clip
for i in 0 1 2; do
  # shellcheck disable=SC2086  # each arm's options are separate overrides
  "$PY" train.py -m "${S[@]}" "${B4[@]}" "${PN[@]}" ${ARMS[$i]} trainer.gradient_clip_val=null,1.0 \
      hydra.sweep.dir=$L/b4_pn_$i
done
"$PY" train.py -m "${S[@]}" "${B64[@]}" norm=batchnorm,layernorm hydra.sweep.dir=$L/b64_ref
for i in 0 1 2; do
  # shellcheck disable=SC2086
  "$PY" train.py -m "${S[@]}" "${B64[@]}" "${PN[@]}" ${ARMS[$i]} hydra.sweep.dir=$L/b64_pn_$i
done
"$PY" -m experiments.studies.s4_batchnorm.r5_powernorm_parts.analyze $L/*
