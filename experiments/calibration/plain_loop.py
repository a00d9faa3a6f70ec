"""A plain-PyTorch training loop (no Lightning, no Hydra) for minillm's Transformer.

Reproduces what ``python train.py`` does with the default config, written out by hand:
  - seed: python, numpy and torch seeded with ``seed`` before the data and the model are built (as
    ``lightning.seed_everything``), so the model init is the same
  - data: minillm.data's tokenized splits (same cache); training sample i of the run starts at
    ``window_starts(seed, [i], N - T)`` (step s uses samples s*B .. s*B+B-1); validation on the
    ``eval_starts(n_val, T, val_windows)`` windows, averaged over tokens
  - AdamW(lr 3e-3, betas (0.9, 0.95), eps 1e-8, wd 0.1) on two groups: matrices decayed, 0-D/1-D
    parameters and the token embedding not
  - per-step LambdaLR: linear warmup 100, cosine to 0.1 x lr over max_steps (``minillm.lit_module.lr_lambda``)
  - gradient clipping at global norm 1.0, fp32

Other studies import ``train`` and ``evaluate`` from here (it is the cheap in-process way to train).

    .venv/bin/python experiments/calibration/plain_loop.py --max-steps 600 --norm layernorm
"""

from __future__ import annotations

import argparse
import json
import math
import random
import time
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

from minillm.lit_module import lr_lambda
from minillm.model import ModelConfig, Transformer


@dataclass
class RunConfig:
    """The default config of configs/ (model, norm, optimizer, scheduler and trainer groups)."""

    norm: str = "rmsnorm"
    norm_options: dict = field(default_factory=dict)
    placement: str = "pre"
    dim: int = 128
    n_layers: int = 4
    n_heads: int = 4
    seq_len: int = 64
    batch_size: int = 32
    seed: int = 1337
    lr: float = 3e-3
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8
    weight_decay: float = 0.1
    warmup_steps: int = 100
    min_lr_ratio: float = 0.1
    max_steps: int = 2000
    clip: float | None = 1.0
    val_every: int = 500
    val_windows: int | None = 256


# the norm options of configs/norm/<name>.yaml (as train.py passes them)
NORM_OPTIONS = {
    "layernorm": dict(eps_mode="inside", affine=True, bias=True, zero_centered=False),
    "rmsnorm": dict(eps_mode="inside", affine=True, zero_centered=False, cast="llama"),
    "batchnorm": dict(
        eps_mode="inside", affine=True, bias=True, zero_centered=False, momentum=0.1, stats="position"
    ),
    "none": {},
}

_DATA: dict = {}


def tokens(seq_len: int) -> tuple[np.ndarray, np.ndarray, int]:
    """(train ids, val ids, vocab size) of the default Shakespeare char corpus (cached)."""
    if "train" not in _DATA:
        from minillm.data import TextDataModule  # imported when used: minillm.data needs `datasets`

        dm = TextDataModule(source="shakespeare", seq_len=seq_len, batch_size=1)
        dm.prepare_data()
        _DATA.update(
            train=dm.train_tokens.astype(np.int64), val=dm.val_tokens.astype(np.int64), vocab=dm.vocab_size
        )
    return _DATA["train"], _DATA["val"], _DATA["vocab"]


def gather(toks: np.ndarray, starts: np.ndarray, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    w = torch.from_numpy(toks[starts[:, None] + np.arange(seq_len + 1)])  # (B, T + 1)
    return w[:, :-1], w[:, 1:]


def train_batch(toks: np.ndarray, seed: int, step: int, batch_size: int, seq_len: int):
    from minillm.data import window_starts

    idx = np.arange(step * batch_size, (step + 1) * batch_size)
    return gather(toks, window_starts(seed, idx, len(toks) - seq_len), seq_len)


def model_config(rc: RunConfig, vocab: int, **extra) -> ModelConfig:
    opts = {**NORM_OPTIONS.get(rc.norm, {}), **rc.norm_options}
    return ModelConfig(
        vocab_size=vocab,
        dim=rc.dim,
        n_layers=rc.n_layers,
        n_heads=rc.n_heads,
        max_seq_len=rc.seq_len,
        norm=rc.norm,
        norm_options=opts,
        placement=rc.placement,
        **extra,
    )


def param_groups(model: Transformer) -> list[dict]:
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        (no_decay if p.ndim < 2 or name.startswith("tok_emb.") else decay).append(p)
    return [{"params": decay}, {"params": no_decay, "weight_decay": 0.0}]


@torch.no_grad()
def evaluate(
    model: Transformer,
    val: np.ndarray,
    seq_len: int,
    batch_size: int = 32,
    val_windows: int | None = 256,
    train_mode: bool = False,
) -> float:
    """Mean next-token loss over the eval windows (eval mode unless train_mode: batch statistics)."""
    from minillm.data import eval_starts

    was = model.training
    model.train(train_mode)
    starts = eval_starts(len(val), seq_len, val_windows)
    total, n = 0.0, 0
    for i in range(0, len(starts), batch_size):
        x, y = gather(val, starts[i : i + batch_size], seq_len)
        total += F.cross_entropy(model(x).float().flatten(0, 1), y.flatten(), reduction="sum").item()
        n += y.numel()
    model.train(was)
    return total / n


def train(rc: RunConfig, log_every: int = 0, **model_extra) -> dict:
    """Train from scratch; returns the history, the final val loss, tokens/s and the model."""
    random.seed(rc.seed)
    np.random.seed(rc.seed)
    torch.manual_seed(rc.seed)
    tr, val, vocab = tokens(rc.seq_len)
    model = Transformer(model_config(rc, vocab, **model_extra))
    opt = torch.optim.AdamW(
        param_groups(model), lr=rc.lr, betas=rc.betas, eps=rc.eps, weight_decay=rc.weight_decay
    )
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lr_lambda("cosine", rc.warmup_steps, rc.max_steps, rc.min_lr_ratio)
    )
    hist = {"step": [], "train_loss": [], "val_step": [], "val_loss": []}
    t_train, t0 = 0.0, time.perf_counter()
    model.train()
    for step in range(rc.max_steps):
        ts = time.perf_counter()
        x, y = train_batch(tr, rc.seed, step, rc.batch_size, rc.seq_len)
        loss = F.cross_entropy(model(x).float().flatten(0, 1), y.flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if rc.clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), rc.clip)
        opt.step()
        sched.step()
        t_train += time.perf_counter() - ts
        hist["step"].append(step + 1)
        hist["train_loss"].append(loss.item())
        if log_every and (step + 1) % log_every == 0:
            print(f"step {step + 1} loss {loss.item():.4f} ({time.perf_counter() - t0:.0f}s)", flush=True)
        if (step + 1) % rc.val_every == 0 or step + 1 == rc.max_steps:
            hist["val_step"].append(step + 1)
            hist["val_loss"].append(evaluate(model, val, rc.seq_len, rc.batch_size, rc.val_windows))
    if not math.isfinite(hist["train_loss"][-1]):
        print("warning: non-finite loss")
    return dict(
        history=hist,
        final_val_loss=hist["val_loss"][-1],
        train_seconds=t_train,
        tokens_per_s=rc.max_steps * rc.batch_size * rc.seq_len / t_train,
        wall_seconds=time.perf_counter() - t0,
        model=model,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--max-steps", type=int, default=2000)
    ap.add_argument("--val-every", type=int, default=500)
    ap.add_argument("--norm", default="rmsnorm")
    ap.add_argument("--seed", type=int, default=1337)
    ap.add_argument("--out", default=None, help="write the result (without the model) as JSON here")
    a = ap.parse_args()
    torch.set_num_threads(1)  # 1, not 2: on the shared 2-core CPU 2 threads ran 6-8x slower (measured)
    rc = RunConfig(norm=a.norm, seed=a.seed, max_steps=a.max_steps, val_every=a.val_every)
    r = train(rc, log_every=100)
    r.pop("model")
    print(json.dumps({k: v for k, v in r.items() if k != "history"}, indent=1))
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"config": rc.__dict__, **r}, f)


if __name__ == "__main__":
    main()
