"""S10 round 5, prepared for one CUDA GPU (not yet run): the curse of depth at L = 24 with the plain init, Pre-LN vs
LayerNorm Scaling vs Mix-LN, gated on a one-seed pilot that shows Pre-LN's deep layers idle. Round 4 ran this
question on the CPU at 20 tokens per parameter but only at L = 12 and width 48, where Pre-LN's deep layers were not
idle (premise absent); Sun et al. 2025 report the idleness growing with depth. On a GPU the same 9-minute command
reaches L = 24 at width 128.

    python -m experiments.studies.s10_mixln.r5_gpu_depth.plan --dry-run   # any machine: the plan, built and counted
    bash experiments/studies/gpu_round.sh                                # on the GPU, with S2 round 3 (9 min)

Model: RMSNorm, dim 128, 24 layers, 4 heads, context 256, model.depth_scaled_init=false (every linear N(0, 0.02),
the init Sun et al. say LNS needs), lr 1e-3 (S10's), warmup 100 then cosine, batch 64 x 256 characters, STEPS
steps: 16.4M tokens, ~3.4 tokens per parameter (the dry run prints both), bf16, eager.
Stages (this part's budget: BUDGET_S of the command's 540 s):
  pilot  Pre-LN, seed 0, its last checkpoint kept. Gate: S10's idle_deep_layers on it (the mean layer-drop loss of
         the deep half over that of the early half, at most 0.25). Absent: nothing else runs, and the round reads
         "premise absent at this scale" at L = 24 too.
  main   Pre-LN seed 1, LNS and Mix-LN seeds 0 and 1: 5 runs.
Why 6 runs: at the assumed TOKENS_PER_S a run of 16.4M tokens takes ~45 s with its start-up, so the pilot and its
gate (90 s, the layer drop after it) and 5 main runs (~240 s) fill this part's 330 s; a second seed
per arm is the least that gives a difference a spread, and 2 seeds give intervals too wide to confirm anything: the
losses are reported per seed as observations, the gate is the finding.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from experiments.common import gpu_plan
from experiments.studies.s10_mixln.r1_mixln import analyze as s10

HERE = Path(__file__).parent
DEPTH, DIM, STEPS = 24, 128, 1000
TOKENS_PER_S = 500_000  # assumed for a 4.7M-parameter, 24-layer model in bf16, eager, on an H100 (unmeasured)
BUDGET_S = 330
IDLE = 0.25  # S10's precondition: deep / early mean block drop at most this
BASE = ["experiment=s10_mixln", "trainer=gpu", f"model.dim={DIM}", f"model.n_layers={DEPTH}", "model.max_seq_len=256",
        "model.depth_scaled_init=false", "data.batch_size=64", f"trainer.max_steps={STEPS}",
        "trainer.val_check_interval=500", "scheduler.warmup_steps=100", "callbacks.progress_bar.interval_s=60"]
ARMS = {"pre": ["placement=pre"], "lns": ["placement=pre", "model.layernorm_scaling=true"], "mix": ["placement=mix"]}


def pilot_gate(folder: Path) -> dict:
    """S10's idleness on the pilot's last checkpoint (layer drop on the GPU machine's CPU)."""
    ckpt = folder / "0" / "checkpoints" / "last.ckpt"
    if not ckpt.exists():
        return {"status": "not recorded", "why": f"no checkpoint {ckpt}"}
    drop = s10.layer_drop(ckpt)
    ratio = s10.idle_ratio(drop["drop"])
    (folder / "layer_drop.json").write_text(json.dumps(drop) + "\n")
    return {"status": "present" if ratio <= IDLE else "absent", "idle_ratio": ratio, "rule": f"at most {IDLE:g}"}


STAGES = [
    gpu_plan.Stage("pilot", [[*BASE, *ARMS["pre"], "seed=0"]], 90, TOKENS_PER_S, pilot_gate),
    gpu_plan.Stage("main", [[*BASE, *ARMS["pre"], "seed=1"]] + [[*BASE, *ARMS[a], f"seed={s}"] for a in ("lns", "mix")
                                                               for s in (0, 1)], 240, TOKENS_PER_S),
]


def analyze(out: Path) -> dict:
    """Each finished run's final val loss and status, per arm and seed (observations: 2 seeds)."""
    rows = []
    for summary in sorted(out.glob("*/*/summary.json")):
        s = json.loads(summary.read_text())
        arm = "lns" if "layernorm_scaling=true" in (summary.parent / ".hydra" / "overrides.yaml").read_text() \
            else s.get("placement")
        rows.append({"stage": summary.parent.parent.name, "arm": arm, "seed": s.get("seed"),
                     "final_val_loss": s.get("final_val_loss"), "status": s.get("status")})
    return {"runs": rows}


def main(argv: Sequence[str] | None = None) -> int:
    return gpu_plan.main(__doc__, HERE, STAGES, analyze, argv, BUDGET_S)


if __name__ == "__main__":
    raise SystemExit(main())
