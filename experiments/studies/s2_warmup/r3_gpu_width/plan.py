"""S2 round 3, prepared for one CUDA GPU (not yet run): does Post-LN need warmup at a width where Xiong et al.'s
premise holds? Round 2 found it does in Xiong et al.'s Xavier init at width 64 (L = 12); S1 found their premise
(Post-LN's last-layer gradient at init larger than Pre-LN's) in that init and not in GPT-2's. Xiong et al. analyse
the 512-wide Transformer; this round measures the premise at width 512 first, then trains there.

    python -m experiments.studies.s2_warmup.r3_gpu_width.plan --dry-run   # any machine: the plan, built and counted
    bash experiments/studies/gpu_round.sh                                # on the GPU, with S10 round 5 (9 min)

Model: RMSNorm, Post-LN, model.init=xavier, dim 512, 12 layers, 8 heads, context 256, batch 32 x 256 characters,
lr 1e-3 (round 2's), STEPS steps (the early phase where warmup acts; ~0.09 tokens per parameter), bf16, eager.
Stages (this part's budget: BUDGET_S of the command's 540 s):
  premise  no training: S1's measurement at init, the last layer's feed-forward gradient norm of Post-LN over
           Pre-LN, averaged over 4 batches, at this width. Gate: at least 1. Absent: nothing else runs.
  main     Post-LN without warmup (scheduler.warmup_steps=0) and with 100 steps, seeds 0 and 1: 4 runs.
Why 4 runs: a run of 3.3M tokens takes ~40 s with its start-up at the assumed TOKENS_PER_S, so 4 runs fill the
part's 200 s after the premise; round 2's effect (+0.77 nats without warmup) is large enough for 2 seeds to
show its sign, not to give it an interval: observations, per seed.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from pathlib import Path

from experiments.common import gpu_plan
from experiments.common.reference import compose

HERE = Path(__file__).parent
DIM, DEPTH, STEPS = 512, 12, 400
TOKENS_PER_S = 200_000  # assumed for a 38M-parameter model in bf16, eager, on an H100 (unmeasured)
BUDGET_S = 200
BASE = ["experiment=s2_warmup", "trainer=gpu", "norm=rmsnorm", "placement=post", "model.init=xavier",
        f"model.dim={DIM}", f"model.n_layers={DEPTH}", "model.n_heads=8", "model.max_seq_len=256",
        "data.batch_size=32", f"trainer.max_steps={STEPS}", "trainer.val_check_interval=200", "optimizer.lr=1e-3",
        "callbacks.progress_bar.interval_s=60"]


def premise(folder: Path) -> dict:
    """Post-LN / Pre-LN last-layer gradient norm at init (S1's measure), Xavier init, this round's model."""
    import torch
    import torch.nn.functional as F

    from minillm.model import Transformer
    from minillm.training.data import TextDataModule
    from minillm.training.run.build import model_config

    dm = TextDataModule(source="shakespeare", seq_len=256, batch_size=8, seed=1337)
    dm.prepare_data()
    dm.setup("fit")
    batches = [b for _, b in zip(range(4), dm.train_dataloader(), strict=False)]
    norms = {}
    for placement in ("post", "pre"):
        torch.manual_seed(0)
        model = Transformer(model_config(compose(*BASE, f"placement={placement}"), dm.vocab_size))
        grads = []
        for x, y in batches:
            model.zero_grad(set_to_none=True)
            F.cross_entropy(model(x).flatten(0, 1), y.flatten()).backward()
            grads.append(model.layers[-1].ffn.w2.weight.grad.norm().item())
        norms[placement] = statistics.fmean(grads)
    ratio = norms["post"] / norms["pre"]
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "grad_at_init.json").write_text(json.dumps({**norms, "ratio": ratio}) + "\n")
    return {"status": "present" if ratio >= 1 else "absent", "post_over_pre": ratio, "rule": "at least 1"}


STAGES = [
    gpu_plan.Stage("premise", [], 30, TOKENS_PER_S, premise),
    gpu_plan.Stage("main", [[*BASE, f"scheduler.warmup_steps={w}", f"seed={s}"] for w in (0, 100) for s in (0, 1)],
                   170, TOKENS_PER_S),
]


def analyze(out: Path) -> dict:
    """Each finished run's final val loss and status, per warmup and seed (observations: 2 seeds)."""
    rows = [{"warmup": s.get("warmup_steps"), "seed": s.get("seed"), "final_val_loss": s.get("final_val_loss"),
             "status": s.get("status")}
            for s in (json.loads(p.read_text()) for p in sorted(out.glob("main/*/summary.json")))]
    return {"runs": rows}


def main(argv: Sequence[str] | None = None) -> int:
    return gpu_plan.main(__doc__, HERE, STAGES, analyze, argv, BUDGET_S)


if __name__ == "__main__":
    raise SystemExit(main())
