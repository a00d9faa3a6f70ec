"""Train a minillm model from the Hydra config in configs/ (``python train.py --help`` lists the groups).

    python train.py                                   # default run on the embedded Shakespeare corpus
    python train.py norm=layernorm placement=post optimizer.lr=1e-3 trainer.precision=bf16-mixed seed=1
    python train.py -m norm=layernorm,rmsnorm,batchnorm placement=pre,post   # sweep
"""

from __future__ import annotations

import logging
import sys
import warnings
from contextlib import contextmanager
from pathlib import Path

import hydra
import lightning as L
import torch
from hydra.core.hydra_config import HydraConfig
from hydra.errors import InstantiationException
from hydra.types import RunMode
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf, open_dict

from minillm.checkpointing import check_resume
from minillm.model import ModelConfig
from minillm.norms import norm_options

log = logging.getLogger("minillm")
PRECISIONS = ("32-true", "32", "bf16-mixed", "bf16", "16-mixed", "16", "bf16-true", "16-true", "64-true", "64")
# Lightning's advertisements for its cloud logger and checkpoint service, printed at every start
logging.getLogger("lightning.pytorch.utilities.rank_zero").addFilter(
    lambda r: not any(s in r.getMessage() for s in ("litlogger", "litmodels")))
warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)")  # Lightning vs torch 2.13


class ConfigError(ValueError):
    """A bad value in the config, reported as one line before training starts."""


@contextmanager
def config_errors():
    """Turn bad-value errors raised while setting up (also inside Hydra's instantiate) into ConfigError."""
    try:
        yield
    except InstantiationException as err:
        if isinstance(err.__cause__, (ValueError, FileNotFoundError, TypeError)):
            raise ConfigError(str(err.__cause__)) from err.__cause__
        raise
    except (ValueError, FileNotFoundError) as err:
        raise ConfigError(str(err)) from err


def check_config(cfg: DictConfig) -> None:
    """Checks that are cheap and would otherwise fail late or deep inside Lightning."""
    precision = str(cfg.trainer.get("precision"))
    if precision not in PRECISIONS:
        raise ConfigError(f"trainer.precision={precision!r} is invalid; allowed: {', '.join(PRECISIONS)}")
    lr = cfg.optimizer.get("lr")
    if not isinstance(lr, (int, float)) or lr <= 0:
        raise ConfigError(f"optimizer.lr={lr!r} is invalid: must be a number > 0")
    accelerator = cfg.trainer.get("accelerator")
    on_cpu = accelerator == "cpu" or (accelerator == "auto" and not torch.cuda.is_available())
    if precision in ("16-mixed", "16") and on_cpu and not precision_plugins(cfg):
        warnings.warn("trainer.precision=16-mixed on a CPU: Lightning runs bf16-mixed instead (no GradScaler); "
                      "trainer=cpu_fp16 gives real fp16 autocast with a GradScaler on the CPU (slow), or use a "
                      "GPU.", UserWarning, stacklevel=2)


def precision_plugins(cfg: DictConfig) -> list[DictConfig]:
    """The precision plugins among trainer.plugins (trainer=cpu_fp16 has one)."""
    return [p for p in cfg.trainer.get("plugins") or [] if "Precision" in str(p.get("_target_", ""))]


def build_trainer(cfg: DictConfig, callbacks: list, loggers: list) -> L.Trainer:
    """lightning.Trainer from cfg.trainer. A precision plugin replaces the precision flag (Lightning refuses
    both), which then only names the run: trainer=cpu_fp16 keeps precision=16-mixed in names and summaries."""
    overrides = {"precision": None} if precision_plugins(cfg) else {}
    return instantiate(cfg.trainer, callbacks=callbacks, logger=loggers or False, **overrides)


def group_sweeps(cfg: DictConfig) -> None:
    """In a Hydra multirun, make the W&B group name + the sweep's timestamp: one group per sweep."""
    if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.MULTIRUN:
        return
    wandb = (cfg.get("logger") or {}).get("wandb")
    if wandb is not None:
        with open_dict(cfg):
            wandb.group = f"{cfg.name}-{Path(HydraConfig.get().sweep.dir).name}"


def model_config(cfg: DictConfig, vocab_size: int) -> ModelConfig:
    """ModelConfig from cfg.model; model.compile is a training switch, read by the LightningModule instead."""
    node = OmegaConf.to_container(cfg.model, resolve=True)
    node.pop("compile", None)
    return instantiate(node, vocab_size=vocab_size)


def train(cfg: DictConfig) -> dict[str, float]:
    """Set up data, model, callbacks, loggers and trainer; fit; test on the whole held-out split."""
    with config_errors():
        check_config(cfg)
        group_sweeps(cfg)
        L.seed_everything(cfg.seed, workers=True)
        datamodule = instantiate(cfg.data)
        datamodule.prepare_data()
        datamodule.setup("fit")
        model_cfg = model_config(cfg, datamodule.vocab_size)
        if cfg.trainer.get("sync_batchnorm") and "sync" in norm_options(model_cfg.norm):
            model_cfg.norm_options["sync"] = True  # Lightning's switch converts only torch's BatchNorm
        if cfg.get("ckpt_path"):  # readable, and written for this model config (fails before any training)
            check_resume(cfg.ckpt_path, model_cfg.to_dict())
        scheduler = instantiate(cfg.scheduler) if cfg.get("scheduler") else None
        module = instantiate(cfg.module, _partial_=True)(
            model=model_cfg, optimizer=instantiate(cfg.optimizer), scheduler=scheduler)
        callbacks = [instantiate(c) for c in (cfg.get("callbacks") or {}).values() if c and "_target_" in c]
        loggers = [instantiate(c) for c in (cfg.get("logger") or {}).values() if c and "_target_" in c]
        trainer = build_trainer(cfg, callbacks, loggers)

    n_params = module.model.num_params()
    log.info(f"model: {n_params / 1e6:.2f}M parameters, norm={model_cfg.norm}, "
             f"placement={model_cfg.placement}")
    hparams = OmegaConf.to_container(cfg, resolve=True)
    hparams["n_params"] = n_params
    for logger in trainer.loggers:
        logger.log_hyperparams(hparams)

    if cfg.get("train", True):
        trainer.fit(module, datamodule=datamodule, ckpt_path=cfg.get("ckpt_path"))
    metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}
    if cfg.get("test", False):
        trainer.test(module, datamodule=datamodule, verbose=False)
        metrics.update({k: float(v) for k, v in trainer.callback_metrics.items()})
        held_out = (f"{k}={v:.4f}" for k, v in sorted(metrics.items()) if k.startswith("test/"))
        log.info("held-out: " + ", ".join(held_out))
    return metrics


@hydra.main(version_base="1.3", config_path="configs", config_name="train")
def main(cfg: DictConfig) -> float | None:
    try:
        metrics = train(cfg)
    except ConfigError as err:
        log.error(f"config error: {err}")
        log.debug("where it was raised (hydra.verbose=minillm shows this)", exc_info=err)
        sys.exit(2)
    return metrics.get(cfg.get("optimized_metric"))


if __name__ == "__main__":
    main()
