"""Cost of the stability callbacks: train-step time with and without them, in one run.

    python -m experiments.benchmarks.instrumentation_cost.bench                 # default model and batch, 400 steps
    python -m experiments.benchmarks.instrumentation_cost.bench --threads 1      # shared machine: see below
    python -m experiments.benchmarks.instrumentation_cost.bench --blocks 6 --batch 4   # a quick code check

One Lightning run trains the default model (configs/model/default.yaml, batch data.batch_size, composed with
Hydra) on random tokens (fp32, gradient clipping 1.0, log_every_n_steps 10, CSV logger, no validation, no
checkpoints, no progress bar). The callbacks of configs/callbacks/stability.yaml with their defaults
(StabilityMonitor every 10 steps with the attention probe every 100, DivergenceGuard, RunSummary) are
switched on and off in alternating blocks of ``--block`` steps, so a change of machine load hits both arms
alike. With blocks of 10 steps every on block holds exactly one measured step (1 in 10, as by default) and
the probe steps (multiples of 100) fall in on blocks: 3 probes in ~200 on steps, not 2 (an overestimate).

Three estimates of the ratio (instrumented step time) / (plain step time):
  direct     the time spent inside the callbacks' per-step hooks and the probe's forward hooks, summed over
             the on steps: step / (step - instrumentation). Small intervals, timed precisely: the estimate
             to trust on a shared machine (it leaves out only the cost of having hooks registered at all).
  cpu_time   mean step time, on blocks vs off blocks, in CPU time of the main thread (with --threads 1
             all of torch's work runs on it, so waiting for a core is not counted).
  wall_time  the same in wall time.
Means, not medians: the cost sits on the measured steps. The first ``--skip`` steps are left out (warm-up).

``--wandb`` adds minillm's W&B logger (offline, as by default; ``configs/logger/wandb.yaml``) next to the CSV
logger and times its per-step work (``log_metrics``, with the depth-profile tables every 100 steps) the same
direct way, over the on steps, where every metric is logged: ``wandb`` in the result.
"""

from __future__ import annotations

import argparse
import functools
import json
import platform
import statistics
import tempfile
import time
from pathlib import Path

import lightning as L
import torch
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from lightning.pytorch.loggers import CSVLogger
from torch.utils.data import DataLoader, Dataset

from experiments.common.machine import machine
from minillm.training.callbacks import ActivationProbe
from minillm.training.run.build import model_config
from minillm.training.run.hydra import config_dir

HERE = Path(__file__).resolve().parent

VOCAB = 65
GATED_HOOKS = ("on_train_batch_start", "on_before_optimizer_step", "on_train_batch_end")


class RandomTokens(Dataset):
    """(x, y) windows of random tokens; the content does not matter for the step time."""

    def __init__(self, seq_len: int, n: int = 1 << 20):
        self.seq_len, self.n = seq_len, n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        w = torch.randint(0, VOCAB, (self.seq_len + 1,), generator=torch.Generator().manual_seed(i))
        return w[:-1], w[1:]


class Stopwatch:
    """CPU time (main thread) and wall time spent inside wrapped functions."""

    def __init__(self):
        self.cpu = self.wall = 0.0

    def wrap(self, fn):
        @functools.wraps(fn)
        def timed(*args, **kwargs):
            c, w = time.thread_time(), time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.cpu += time.thread_time() - c
                self.wall += time.perf_counter() - w

        return timed


WATCH = Stopwatch()  # the callbacks' hooks and the probe's forward hooks
WANDB = Stopwatch()  # the W&B logger's per-step calls
PROBE_HOOKS = ("_block_hook", "_norm_hook", "_head_hook", "_attn_hook")  # the forward hooks of the probe


def watch_probe_hooks() -> None:
    """Time the probe's forward hooks with WATCH (patches ActivationProbe in this process: done by main only)."""
    for name in PROBE_HOOKS:
        setattr(ActivationProbe, name, WATCH.wrap(getattr(ActivationProbe, name)))


class Gate(L.Callback):
    """Passes the per-step hooks to ``inner`` only in the "on" blocks (timed); every other hook always."""

    def __init__(self, inner: L.Callback, block: int):
        self.inner, self.block, self._on = inner, block, False
        for name in dir(L.Callback):
            if name.startswith(("on_", "setup", "teardown")) and name not in GATED_HOOKS:
                setattr(self, name, getattr(inner, name))
        self.hooks = {name: WATCH.wrap(getattr(inner, name)) for name in GATED_HOOKS}

    def is_on(self, step: int) -> bool:
        return (step // self.block) % 2 == 0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._on = self.is_on(trainer.global_step)
        if self._on:
            self.hooks["on_train_batch_start"](trainer, pl_module, batch, batch_idx)

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        if self._on:
            self.hooks["on_before_optimizer_step"](trainer, pl_module, optimizer)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self._on:
            self.hooks["on_train_batch_end"](trainer, pl_module, outputs, batch, batch_idx)


class StepTimer(L.Callback):
    """Wall time, main-thread CPU time and the instrumentation's own time at the start of every batch."""

    def __init__(self):
        self.wall: list[float] = []
        self.cpu: list[float] = []
        self.inside: list[tuple[float, float]] = []
        self.wandb: list[tuple[float, float]] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.wall.append(time.perf_counter())
        self.cpu.append(time.thread_time())
        self.inside.append((WATCH.cpu, WATCH.wall))
        self.wandb.append((WANDB.cpu, WANDB.wall))


def direct(timer: StepTimer, first: int, steps: int, block: int) -> dict:
    """Time spent inside the callbacks' hooks and the probe's forward hooks, over the on steps."""
    on = [s for s in range(first, steps) if (s // block) % 2 == 0]
    out = {}
    for i, clock in enumerate(("cpu_time", "wall_time")):
        starts = timer.cpu if i == 0 else timer.wall
        inside = sum(timer.inside[s + 1][i] - timer.inside[s][i] for s in on)
        total = sum(starts[s + 1] - starts[s] for s in on)
        out[clock] = {"instrumentation_ms_per_step": 1e3 * inside / len(on),
                      "step_ms": 1e3 * total / len(on),
                      "ratio_step_over_step_without": total / (total - inside),
                      "overhead_percent": 100 * inside / (total - inside)}
    return out


def direct_wandb(timer: StepTimer, first: int, steps: int, block: int) -> dict:
    """Time spent inside the W&B logger's calls over the on steps, against the step without it and without the
    instrumentation (which would not log these metrics either)."""
    on = [s for s in range(first, steps) if (s // block) % 2 == 0]
    out = {}
    for i, clock in enumerate(("cpu_time", "wall_time")):
        starts = timer.cpu if i == 0 else timer.wall
        wandb = sum(timer.wandb[s + 1][i] - timer.wandb[s][i] for s in on)
        inside = sum(timer.inside[s + 1][i] - timer.inside[s][i] for s in on)
        total = sum(starts[s + 1] - starts[s] for s in on)
        out[clock] = {"wandb_ms_per_step": 1e3 * wandb / len(on), "step_ms": 1e3 * total / len(on),
                      "overhead_percent": 100 * wandb / (total - inside - wandb)}
    return out


def wandb_logger(cfg, folder: str):
    """minillm's W&B logger as configured, offline in ``folder``, its per-step calls timed with WANDB."""
    logger = instantiate(cfg.logger.wandb, name="instrumentation-cost", group=None, tags=[], run_tags=[],
                         save_dir=folder, offline=True)
    logger.log_metrics = WANDB.wrap(logger.log_metrics)
    return logger


def compare(starts: list[float], first: int, steps: int, block: int, every: int) -> dict:
    """Mean step time in the on and off blocks of one clock's readings."""
    dt = {s: starts[s + 1] - starts[s] for s in range(first, steps)}
    on = {s: v for s, v in dt.items() if (s // block) % 2 == 0}
    off = {s: v for s, v in dt.items() if (s // block) % 2 == 1}
    pairs = [statistics.fmean(v for s, v in on.items() if s // block == b)
             / statistics.fmean(v for s, v in off.items() if s // block == b + 1)
             for b in range(0, steps // block - 1, 2) if any(s // block == b for s in on)]
    mean_off, mean_on = statistics.fmean(off.values()), statistics.fmean(on.values())
    return {
        "ratio_on_over_off": mean_on / mean_off,
        "overhead_percent": 100 * (mean_on / mean_off - 1),
        "ratio_block_pairs": {"median": statistics.median(pairs), "min": min(pairs), "max": max(pairs),
                              "n": len(pairs)},
        "mean_step_ms": {"off": 1e3 * mean_off, "on": 1e3 * mean_on},
        "median_step_ms": {"off": 1e3 * statistics.median(off.values()),
                           "on": 1e3 * statistics.median(on.values())},
        "on_blocks_mean_ms": {
            "measured_steps": 1e3 * statistics.fmean(v for s, v in on.items() if s % every == 0),
            "other_steps": 1e3 * statistics.fmean(v for s, v in on.items() if s % every)},
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--block", type=int, default=10, help="steps per on / off block")
    p.add_argument("--blocks", type=int, default=40, help="number of blocks (even: as many on as off)")
    p.add_argument("--skip", type=int, default=20, help="warm-up steps left out (whole blocks)")
    p.add_argument("--batch", type=int, default=None, help="sequences per step (default: data.batch_size)")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    p.add_argument("--wandb", action="store_true", help="also log to W&B (offline) and time its logger")
    p.add_argument("--out", type=Path, default=HERE / "results", help="folder for result.json")
    args = p.parse_args(argv)

    watch_probe_hooks()
    if args.threads:
        torch.set_num_threads(args.threads)
    with initialize_config_dir(config_dir=config_dir(), version_base="1.3"):
        cfg = compose("train", overrides=["callbacks=stability", "trainer=cpu", "logger=wandb",
                                          "module.eval_windows_dir=null"])  # no validation here
    args.batch = args.batch or cfg.data.batch_size
    L.seed_everything(0, workers=False, verbose=False)
    module = instantiate(cfg.module, _partial_=True)(model=model_config(cfg, VOCAB),
                                                     optimizer=instantiate(cfg.optimizer),
                                                     scheduler=instantiate(cfg.scheduler))
    timer = StepTimer()
    gated = [Gate(instantiate(c), args.block) for c in cfg.callbacks.values()]
    steps = args.block * args.blocks
    with tempfile.TemporaryDirectory() as tmp:
        trainer = L.Trainer(accelerator="cpu", devices=1, precision=cfg.trainer.precision,
                            max_steps=steps + 1,
                            gradient_clip_val=cfg.trainer.gradient_clip_val,
                            log_every_n_steps=cfg.trainer.log_every_n_steps, limit_val_batches=0,
                            logger=[CSVLogger(tmp, name="csv", version=""),
                                    *([wandb_logger(cfg, tmp)] if args.wandb else [])],
                            callbacks=[timer, *gated],
                            enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                            default_root_dir=tmp)
        loader = DataLoader(RandomTokens(cfg.model.max_seq_len), batch_size=args.batch, num_workers=0)
        trainer.fit(module, loader)
    every = cfg.callbacks.stability.every_n_steps
    result = {
        "direct": direct(timer, args.skip, steps, args.block),
        "cpu_time": compare(timer.cpu, args.skip, steps, args.block, every),
        "wall_time": compare(timer.wall, args.skip, steps, args.block, every),
        **({"wandb": direct_wandb(timer, args.skip, steps, args.block)} if args.wandb else {}),
        "settings": {"block": args.block, "blocks": args.blocks, "skip": args.skip, "batch": args.batch,
                     "seq_len": cfg.model.max_seq_len, "dim": cfg.model.dim, "n_layers": cfg.model.n_layers,
                     "n_heads": cfg.model.n_heads, "norm": cfg.model.norm, "placement": cfg.model.placement,
                     "precision": cfg.trainer.precision, "every_n_steps": every,
                     "probe_every_n_steps": cfg.callbacks.stability.probe_every_n_steps, "wandb": args.wandb},
        "machine": machine(),
        "conditions": {"platform": platform.platform(), "lightning": L.__version__,
                       "torch_threads": torch.get_num_threads(), "load_average_after": _loadavg()},
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "result.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in ("direct", "cpu_time", "wall_time", "wandb") if k in result}, indent=2))


def _loadavg() -> list[float] | None:
    try:
        return [float(v) for v in Path("/proc/loadavg").read_text().split()[:3]]
    except OSError:
        return None


if __name__ == "__main__":
    main()
