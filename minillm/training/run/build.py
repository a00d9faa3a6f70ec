"""Building a run's objects from its checked config: the model config, the trainer, the thread count."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import lightning as L
import torch
from hydra.core.hydra_config import HydraConfig
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from minillm.model import ModelConfig
from minillm.norms import norm_options


def model_config(cfg: DictConfig, vocab_size: int) -> ModelConfig:
    """ModelConfig from cfg.model; model.compile is a training switch, read by the LightningModule instead.
    trainer.sync_batchnorm (Lightning's switch converts only torch's BatchNorm) turns on minillm's sync option."""
    node = OmegaConf.to_container(cfg.model, resolve=True)
    node.pop("compile", None)
    model = instantiate(node, vocab_size=vocab_size)
    if cfg.trainer.get("sync_batchnorm") and "sync" in norm_options(model.norm):
        model.norm_options["sync"] = True
    return model


def precision_plugins(cfg: DictConfig) -> list[DictConfig]:
    """The precision plugins among trainer.plugins (trainer=cpu_fp16 has one)."""
    return [p for p in cfg.trainer.get("plugins") or [] if "Precision" in str(p.get("_target_", ""))]


def trains_on_cpu(trainer: Mapping) -> bool:
    """Whether a run of this trainer config trains on the CPU: accelerator cpu, or auto on a machine without CUDA
    or Apple's MPS."""
    accelerator = trainer.get("accelerator", "auto")
    gpu = torch.cuda.is_available() or torch.backends.mps.is_available()
    return accelerator == "cpu" or (accelerator == "auto" and not gpu)


def build_trainer(cfg: DictConfig, callbacks: list, loggers: list) -> L.Trainer:
    """lightning.Trainer from cfg.trainer. A precision plugin replaces the precision flag (Lightning refuses
    both), which then only names the run: trainer=cpu_fp16 keeps precision=16-mixed in names and summaries.
    trainer.val_check_interval counts optimizer steps, as every step count in minillm does; Lightning's counts
    batches, so with gradient accumulation it gets the interval times accumulate_grad_batches.
    trainer.deterministic=auto is true on the CPU, where it costs nothing measurable and keeps compiled runs
    bit-identical (Inductor's CPU kernels otherwise sum the embedding's gradient with atomic adds, in an order
    that changes from run to run), and false on a GPU, where deterministic kernels cost speed."""
    overrides: dict[str, Any] = {"precision": None} if precision_plugins(cfg) else {}
    if cfg.trainer.get("deterministic", "auto") == "auto":
        overrides["deterministic"] = trains_on_cpu(cfg.trainer)
    interval, accumulate = cfg.trainer.get("val_check_interval"), cfg.trainer.get("accumulate_grad_batches", 1)
    if isinstance(interval, int) and not isinstance(interval, bool) and accumulate > 1:
        overrides["val_check_interval"] = interval * accumulate
    return instantiate(cfg.trainer, callbacks=callbacks, logger=loggers or False, **overrides)


def set_threads(cfg: DictConfig) -> None:
    """torch's intra-op threads: ``threads``, else one per job under the joblib launcher (jobs share the cores), else
    the CPUs SLURM gave each task (``--cpus-per-task``; torch would take every core of the node) less the task's
    DataLoader workers, which run beside its threads on those CPUs (at least one thread)."""
    threads = cfg.get("threads")
    if threads is None and HydraConfig.initialized():
        launcher = str(OmegaConf.select(HydraConfig.get(), "launcher._target_", default=""))
        threads = 1 if "Joblib" in launcher else None
    if threads is None and os.environ.get("SLURM_CPUS_PER_TASK", "").isdigit():
        workers = OmegaConf.select(cfg, "data.num_workers", default=0)
        workers = workers if isinstance(workers, int) and not isinstance(workers, bool) and workers > 0 else 0
        threads = max(1, int(os.environ["SLURM_CPUS_PER_TASK"]) - workers)
    if threads:
        torch.set_num_threads(int(threads))


def instantiate_group(cfg: DictConfig, group: str) -> list:
    """The objects of a config group of several entries (callbacks, logger): each entry with a _target_."""
    return [instantiate(c) for c in (cfg.get(group) or {}).values() if c and "_target_" in c]


def build_module(cfg: DictConfig, model: ModelConfig, run_settings: dict) -> L.LightningModule:
    """The LightningModule of cfg.module with the model config, the optimizer and the schedule."""
    scheduler = instantiate(cfg.scheduler) if cfg.get("scheduler") else None
    return instantiate(cfg.module, _partial_=True)(model=model, optimizer=instantiate(cfg.optimizer),
                                                   scheduler=scheduler, run_settings=run_settings)
