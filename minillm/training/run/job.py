"""A job from its checked config: ``prepare`` (check, resume, build data, model, callbacks, loggers and trainer)
then ``run`` (fit, then test on the held-out split). ``minillm.training.train`` runs them for ``python train.py``;
``minillm.tools.replay`` runs them from a checkpoint with its own start (a ``resume.Resume``)."""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass
from typing import Any

import lightning as L
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf
from torch.multiprocessing import ProcessExitedException

from minillm.metrics import eval_metric
from minillm.training.run import build, checks, checks_warnings, resume
from minillm.training.run.hydra import config_errors
from minillm.training.run.naming import group_sweeps
from minillm.training.run.show import show_config
from minillm.training.run.signals import STOP_CODES, StopSignals
from minillm.version import provenance

log = logging.getLogger("minillm")
# Lightning's advertisements for its cloud logger and checkpoint service, printed at every start
logging.getLogger("lightning.pytorch.utilities.rank_zero").addFilter(
    lambda r: not any(s in r.getMessage() for s in ("litlogger", "litmodels")))
warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)")  # Lightning vs torch 2.13


@dataclass
class Job:
    """Everything a run needs, built and checked; nothing has trained and no logger has written yet."""

    cfg: DictConfig
    trainer: L.Trainer
    module: L.LightningModule
    datamodule: Any
    resume: resume.Resume


def prepare(cfg: DictConfig, start: resume.Resume | None = None) -> Job:
    """Check the config, resolve resume (or take ``start``, a start decided elsewhere: a replay's), set up data,
    model, callbacks, loggers and trainer. A ConfigError raised here means nothing ran: the start is refused and what
    it wrote is removed (minillm.training.train.hydra_main)."""
    with config_errors():
        checks.check_config(cfg)
        checks.check_model_early(cfg)
        checks.warn_about_precision(cfg)
        checks_warnings.warn_about_settings(cfg)
        build.set_threads(cfg)
        if start is None:
            start = resume.resolve(cfg)  # a decay branch sets its schedule and length: before the run is named
        group_sweeps(cfg)
        L.seed_everything(cfg.seed, workers=True)
        datamodule = instantiate(cfg.data)
        callbacks = build.instantiate_group(cfg, "callbacks")
        datamodule.prepare_data()
        datamodule.setup("fit")
        datamodule.load_state_dict(start.state_of(type(datamodule).__qualname__))  # the checkpoint's tokenizer
        checks.check_vocab_size(cfg, datamodule.vocab_size)
        model_cfg = build.model_config(cfg, datamodule.vocab_size)
        start.check_model(model_cfg.to_dict())
        loggers = build.instantiate_group(cfg, "logger")
        trainer = build.build_trainer(cfg, callbacks, loggers)
        if start.branch:  # a new run: the parent's record of itself stays the parent's
            trainer.strategy.checkpoint_io = resume.TransformedCheckpointIO(resume.as_new_run)
        settings = resume.run_settings(cfg, trainer.world_size)
        if cfg.get("train", True):
            start.check_settings(settings)
            for logger in loggers if start.continues_run else []:  # rows the resumed run logs again
                if hasattr(logger, "resume_at"):
                    logger.resume_at(start.step)
        module = build.build_module(cfg, model_cfg, settings)
    show_config(cfg)  # once every check has passed: an error is never printed after the tree
    return Job(cfg, trainer, module, datamodule, start)


def run(job: Job, signals: StopSignals | None = None) -> dict[str, float]:
    """Fit, then test on the held-out split; the loggers are finished however it ends. ``signals`` (train.py's) is
    told the phase (minillm.training.run.signals: a stop signal in the fit or the test is recorded by Lightning's
    exception
    hooks, one during the final writes waits for them)."""
    cfg, trainer, module, datamodule, ckpt_path = job.cfg, job.trainer, job.module, job.datamodule, job.resume.ckpt_path
    signals = signals or StopSignals()
    n_params = module.model.num_params()
    log.info(f"model: {n_params / 1e6:.2f}M parameters, norm={module.model.cfg.norm}, "
             f"placement={module.model.cfg.placement}; run directory {cfg.paths.output_dir}")
    for logger in trainer.loggers:
        logger.log_hyperparams({**OmegaConf.to_container(cfg, resolve=True), "n_params": n_params, **provenance()})
    try:
        if cfg.get("train", True):
            signals.phase = "fit"
            fit(trainer, module, datamodule, ckpt_path)
        metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}
        if cfg.get("test", False):
            signals.phase = "test"
            metrics.update(test(cfg, trainer, module, datamodule, ckpt_path))
        signals.phase = "final writes"
        return metrics
    finally:
        for logger in trainer.loggers:  # the W&B run ends with its summary written (also for the next sweep job)
            if hasattr(logger, "finish"):
                logger.finish()


def train(cfg: DictConfig) -> dict[str, float]:
    """Check the config; set up data, model, callbacks, loggers and trainer; fit; test on the held-out split."""
    return run(prepare(cfg))


def fit(trainer: L.Trainer, module: L.LightningModule, datamodule: Any, ckpt_path: str | None) -> None:
    """trainer.fit; a run stopped by a signal in the processes of DDP's fork/spawn launcher (trainer=ddp_cpu)
    ends this process with the same status (128 + signal) as a single process would, not a traceback."""
    try:
        trainer.fit(module, datamodule=datamodule, ckpt_path=ckpt_path)
    except ProcessExitedException as err:
        if err.exit_code not in STOP_CODES:
            raise
        raise SystemExit(err.exit_code) from None


def test(cfg: DictConfig, trainer: L.Trainer, module: L.LightningModule, datamodule: Any,
         ckpt_path: str | None) -> dict[str, float]:
    """Evaluate on the whole held-out split: after fit the final weights (test_weights=final) or the best
    checkpoint (best); with train=false the checkpoint of ckpt_path."""
    if not cfg.get("train", True):
        weights, source = ckpt_path, f"the checkpoint {ckpt_path}"
    elif cfg.get("test_weights", "final") == "best" and trainer.checkpoint_callback is not None:
        weights, source = "best", "the best checkpoint (val/loss)"
    else:
        weights, source = None, "the final weights"
    trainer.test(module, datamodule=datamodule, ckpt_path=weights, verbose=False)
    metrics = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith(eval_metric("test", ""))}
    shown = ", ".join(f"{k}={v:.4f}" for k, v in sorted(metrics.items()))
    log.info(f"held-out, {source}: {shown}")
    return metrics
