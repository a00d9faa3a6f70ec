#!/usr/bin/env bash
# S12 round 1's runs, from the repository root: the standard arm first (the premise), then the muP arms, then
# muP LayerNorm (left out if the budget runs out). One process at a time (one torch thread each); with a quiet
# machine (uptime's load < 2) add hydra/launcher=joblib hydra.launcher.n_jobs=2 to each sweep.
set -euo pipefail
PY=${PY:-.venv/bin/python}
GRID=(model.dim=32,64,128 optimizer.lr=1e-3,3e-3,1e-2,3e-2,1e-1 seed=0,1,2 module.z_loss=0)
MUP=(model.parametrization=mup model.mup_base_width=32)
sweep() { "$PY" train.py -m experiment=s12_mup "${GRID[@]}" "$@"; }
sweep norm=rmsnorm model.qk_norm=none hydra.sweep.dir=logs/s12_mup/multiruns/standard
sweep norm=rmsnorm model.qk_norm=none,layernorm "${MUP[@]}" hydra.sweep.dir=logs/s12_mup/multiruns/mup
sweep norm=layernorm model.qk_norm=none "${MUP[@]}" hydra.sweep.dir=logs/s12_mup/multiruns/mup_ln
"$PY" -m experiments.studies.s12_mup_transfer.r1_transfer.analyze logs/s12_mup/multiruns/*
