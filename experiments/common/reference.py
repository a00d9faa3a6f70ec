"""The reference loop: what ``python train.py <overrides>`` trains, trained by a plain PyTorch loop instead of
Lightning's (no Trainer, no callbacks, no loggers). The calibration study checks the two agree.

Nothing about the run is written out here: the model and its norm options, the optimizer and its parameter
groups, the schedule, clipping, the data and its sample stream come from composing configs/train.yaml with the
overrides (Hydra's compose API, as tests/helpers.py does) and from minillm's own functions
(``minillm.training.run.build.model_config``, ``minillm.training.optim.param_groups``, the config's optimizer and
scheduler partials,
``minillm.training.data``'s windows). The loop itself is the only thing written by hand:
  - python, numpy and torch seeded with ``seed`` before the data and the model (as lightning.seed_everything)
  - training sample i starts at ``window_starts(data.seed, [i], N - T)``; step s uses samples s*B .. s*B+B-1
  - cross entropy in fp32, backward, ``clip_grad_norm_`` at ``trainer.gradient_clip_val``, optimizer step, then
    the (per-step) scheduler step
  - validation every ``trainer.val_check_interval`` steps and after the last, on the windows
    ``eval_starts(N_val, T, data.val_windows)`` in batches of ``data.batch_size``, averaged over tokens
It covers fp32 training without z-loss or gradient accumulation and refuses a config that asks for more.
Hydra, omegaconf and ``datasets`` are imported only when a config is composed (the GPU image has none of them).

    python -m experiments.common.reference norm=layernorm trainer.max_steps=300 trainer.val_check_interval=150
    python -m experiments.common.reference norm=layernorm trainer.max_steps=300 --stop-after 20   # first steps
"""

from __future__ import annotations

import argparse
import json
import math
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from minillm.model import ModelConfig, Transformer

_TOKENS: dict[str, tuple[np.ndarray, np.ndarray, int]] = {}


def compose(*overrides: str, hydra: bool = False) -> Any:
    """configs/train.yaml composed with ``overrides`` (the job config train.py gets, without Hydra's runtime), and
    with Hydra's own node (cfg.hydra: the sweeper's params, a sweep's subdir) when ``hydra``."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from minillm.training.run.hydra import config_dir  # also registers minillm's resolvers (minillm.min, ...)

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=config_dir(), version_base="1.3"):
        return hydra_compose("train", overrides=list(overrides), return_hydra_config=hydra)


@dataclass(frozen=True)
class Loop:
    """The loop's settings, read from a composed config."""

    seed: int
    data_seed: int
    max_steps: int
    batch_size: int
    seq_len: int
    val_every: int
    val_windows: int | None
    clip: float | None

    @classmethod
    def of(cls, cfg: Any) -> Loop:
        checks = {"trainer.precision": (str(cfg.trainer.precision), ("32-true", "32")),
                       "module.z_loss": (cfg.module.z_loss, (0, 0.0)),
                       "trainer.accumulate_grad_batches": (cfg.trainer.get("accumulate_grad_batches", 1), (1,)),
                       "trainer.gradient_clip_algorithm": (cfg.trainer.get("gradient_clip_algorithm"), (None, "norm"))}
        for key, (value, allowed) in checks.items():
            if value not in allowed:
                raise ValueError(f"the reference loop does not do {key}={value} (it does: {allowed})")
        val_every = cfg.trainer.val_check_interval
        if not isinstance(val_every, int):
            raise ValueError(f"the reference loop validates every N steps; trainer.val_check_interval={val_every}")
        return cls(seed=int(cfg.seed), data_seed=int(cfg.data.seed), max_steps=int(cfg.trainer.max_steps),
                   batch_size=int(cfg.data.batch_size), seq_len=int(cfg.data.seq_len), val_every=val_every,
                   val_windows=cfg.data.val_windows, clip=cfg.trainer.gradient_clip_val or None)


def tokens(cfg: Any) -> tuple[np.ndarray, np.ndarray, int]:
    """(train ids, val ids, vocab size) of the config's corpus and tokenizer (read once per process)."""
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    data = OmegaConf.to_container(cfg.data, resolve=True)
    key = json.dumps({k: v for k, v in data.items() if k not in ("batch_size", "seq_len", "seed", "val_windows",
                                                                  "train_samples", "num_workers")}, sort_keys=True)
    if key not in _TOKENS:
        dm = instantiate(cfg.data)
        dm.prepare_data()
        _TOKENS[key] = (dm.train_tokens.astype(np.int64), dm.val_tokens.astype(np.int64), dm.vocab_size)
    return _TOKENS[key]


def model_config(cfg: Any, vocab_size: int) -> ModelConfig:
    """The ModelConfig train.py builds from cfg.model (minillm.training.run.build.model_config)."""
    from minillm.training.run.build import model_config as from_config

    return from_config(cfg, vocab_size)


def param_groups(cfg: Any, model: Transformer) -> list[dict]:
    """minillm's optimizer groups, with the config's module.decay_norms / decay_embeddings."""
    from minillm.training.optim import param_groups as minillm_groups

    return minillm_groups(model, bool(cfg.module.decay_norms), bool(cfg.module.decay_embeddings))


def build(cfg: Any, vocab_size: int) -> tuple[Transformer, torch.optim.Optimizer, Any]:
    """Model, optimizer (the config's partial on minillm's groups) and its per-step scheduler (or None)."""
    from hydra.utils import instantiate

    model = Transformer(model_config(cfg, vocab_size))
    optimizer = instantiate(cfg.optimizer)(param_groups(cfg, model))
    scheduler = instantiate(cfg.scheduler)(optimizer) if cfg.get("scheduler") else None
    return model, optimizer, scheduler


def gather(toks: np.ndarray, starts: np.ndarray, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    w = torch.from_numpy(toks[starts[:, None] + np.arange(seq_len + 1)])  # (B, T + 1)
    return w[:, :-1], w[:, 1:]


def train_batch(toks: np.ndarray, seed: int, step: int, batch_size: int, seq_len: int):
    """The batch of training step ``step``: samples step*B .. step*B+B-1 of the seeded window stream."""
    from minillm.training.data import window_starts

    idx = np.arange(step * batch_size, (step + 1) * batch_size)
    return gather(toks, window_starts(seed, idx, len(toks) - seq_len), seq_len)


def step(model: Transformer, optimizer: torch.optim.Optimizer, scheduler: Any, x: torch.Tensor, y: torch.Tensor,
         clip: float | None) -> torch.Tensor:
    """One training step; returns the loss (fp32 cross entropy)."""
    loss = F.cross_entropy(model(x).float().flatten(0, 1), y.flatten())
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    if clip:
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
    optimizer.step()
    if scheduler is not None:
        scheduler.step()
    return loss


@torch.no_grad()
def evaluate(model: Transformer, val: np.ndarray, seq_len: int, batch_size: int = 32,
             val_windows: int | None = 256, train_mode: bool = False) -> float:
    """Mean next-token loss over the eval windows (eval mode unless train_mode: batch statistics)."""
    from minillm.training.data import eval_starts

    was = model.training
    model.train(train_mode)
    starts = eval_starts(len(val), seq_len, val_windows)
    total, n = 0.0, 0
    for i in range(0, len(starts), batch_size):
        x, y = gather(val, starts[i:i + batch_size], seq_len)
        total += F.cross_entropy(model(x).float().flatten(0, 1), y.flatten(), reduction="sum").item()
        n += y.numel()
    model.train(was)
    return total / n


def train(cfg: Any, log_every: int = 0, stop_after: int | None = None) -> dict:
    """Train from scratch; returns the history, the final val loss, tokens/s and the model. ``stop_after``: only
    the first steps (the schedule still spans trainer.max_steps)."""
    loop = Loop.of(cfg)
    random.seed(loop.seed)
    np.random.seed(loop.seed)
    torch.manual_seed(loop.seed)
    tr, val, vocab = tokens(cfg)
    model, optimizer, scheduler = build(cfg, vocab)
    steps = min(loop.max_steps, stop_after or loop.max_steps)
    hist: dict[str, list] = {"step": [], "train_loss": [], "val_step": [], "val_loss": []}
    t_train, t0 = 0.0, time.perf_counter()
    model.train()
    for s in range(steps):
        ts = time.perf_counter()
        x, y = train_batch(tr, loop.data_seed, s, loop.batch_size, loop.seq_len)
        loss = step(model, optimizer, scheduler, x, y, loop.clip)
        t_train += time.perf_counter() - ts
        hist["step"].append(s + 1)
        hist["train_loss"].append(loss.item())
        if log_every and (s + 1) % log_every == 0:
            print(f"step {s + 1} loss {loss.item():.4f} ({time.perf_counter() - t0:.0f}s)", flush=True)
        if (s + 1) % loop.val_every == 0 or s + 1 == loop.max_steps:
            hist["val_step"].append(s + 1)
            hist["val_loss"].append(evaluate(model, val, loop.seq_len, loop.batch_size, loop.val_windows))
    if not math.isfinite(hist["train_loss"][-1]):
        print("warning: non-finite loss")
    return dict(history=hist, final_val_loss=hist["val_loss"][-1] if hist["val_loss"] else None,
                train_seconds=t_train, tokens_per_s=steps * loop.batch_size * loop.seq_len / t_train,
                wall_seconds=time.perf_counter() - t0, model=model)


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("overrides", nargs="*", help="Hydra overrides of configs/train.yaml, as for train.py")
    ap.add_argument("--stop-after", type=int, help="train only the first N steps")
    ap.add_argument("--log-every", type=int, default=100)
    ap.add_argument("--out", help="write the result (without the model) as JSON here")
    a = ap.parse_args(argv)
    torch.set_num_threads(1)  # 1, not 2: on the shared 2-core CPU 2 threads ran 6-8x slower (measured)
    r = train(compose(*a.overrides), log_every=a.log_every, stop_after=a.stop_after)
    r.pop("model")
    print(json.dumps({k: v for k, v in r.items() if k != "history"}, indent=1))
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"overrides": a.overrides, **r}, f)


if __name__ == "__main__":
    main()
