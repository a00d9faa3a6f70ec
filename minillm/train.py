"""Train from the Hydra config in configs/: check it, build data, model, callbacks, loggers and trainer, fit,
then evaluate on the held-out split. ``python train.py`` (the checkout) and ``minillm-train`` run ``main``.

    python train.py                                   # default run on the embedded Shakespeare corpus
    python train.py norm=layernorm placement=post optimizer.lr=1e-3 trainer.precision=bf16-mixed seed=1
    python train.py -m norm=layernorm,rmsnorm,batchnorm placement=pre,post   # sweep
"""

from __future__ import annotations

import errno
import logging
import math
import os
import signal
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import hydra
import lightning as L
import torch
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf, open_dict
from torch.multiprocessing import ProcessExitedException

from minillm import rundir
from minillm.checkpointing import check_resume, find_resume_checkpoint, read_checkpoint_header
from minillm.errors import (
    ConfigError,
    check_bool,
    check_choice,
    check_int,
    check_name,
    check_number,
    invalid,
)
from minillm.model import PLACEMENTS, ModelConfig
from minillm.norms import batch_statistics, norm_options
from minillm.optim import lr_lambda, schedule_settings
from minillm.run.folder import RunFolderLock, discard_start
from minillm.run.hydra import config_dir, config_errors, one_line
from minillm.version import provenance

log = logging.getLogger("minillm")
PRECISIONS = ("32-true", "32", "bf16-mixed", "bf16", "16-mixed", "16", "bf16-true", "16-true", "64-true", "64")
TEST_WEIGHTS = ("final", "best")
# Lightning's advertisements for its cloud logger and checkpoint service, printed at every start
logging.getLogger("lightning.pytorch.utilities.rank_zero").addFilter(
    lambda r: not any(s in r.getMessage() for s in ("litlogger", "litmodels")))
warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)")  # Lightning vs torch 2.13
rundir.register_resolvers()


# --- checks of what no component owns ----------------------------------------------------------------------


def check_config(cfg: DictConfig) -> None:
    """Top-level keys, the trainer, the optimizer and the schedule, and the rules across groups."""
    c = OmegaConf.to_container(cfg, resolve=True)
    check_int("seed", c.get("seed"), low=0, high=2**32 - 1)  # numpy's seed range
    check_name("name", c.get("name"))
    check_name("run_id", c.get("run_id"), optional=True)
    for key in ("train", "test"):
        check_bool(key, c.get(key))
    check_choice("test_weights", c.get("test_weights", "final"), TEST_WEIGHTS)
    check_int("threads", c.get("threads"), low=1, optional=True)
    if not isinstance(c.get("tags") or [], list) or not all(isinstance(t, str) for t in c.get("tags") or []):
        raise invalid("tags", c.get("tags"), "a list of strings, e.g. tags=[baseline,v2]")
    check_choice("placement", c.get("placement"), PLACEMENTS)
    check_trainer(c.get("trainer") or {})
    check_optimizer(c.get("optimizer") or {})
    if c.get("scheduler"):
        kw = {k: v for k, v in c["scheduler"].items() if not k.startswith("_")}
        lr_lambda(**kw)  # the schedule checks its own arguments
    check_across(c)
    check_fused_norm(c)


def check_trainer(t: dict) -> None:
    precision = str(t.get("precision"))
    if precision not in PRECISIONS:
        raise invalid("trainer.precision", precision, ", ".join(PRECISIONS))
    check_int("trainer.max_steps", t.get("max_steps"), low=1)
    interval = t.get("val_check_interval")
    if isinstance(interval, float):
        check_number("trainer.val_check_interval", interval, low=0.0, high=1.0, low_open=True)
    else:
        check_int("trainer.val_check_interval", interval, low=1, optional=True)
    check_int("trainer.log_every_n_steps", t.get("log_every_n_steps", 50), low=1)
    check_int("trainer.accumulate_grad_batches", t.get("accumulate_grad_batches", 1), low=1)
    check_number("trainer.gradient_clip_val", t.get("gradient_clip_val"), low=0.0, optional=True)
    check_choice("trainer.gradient_clip_algorithm", t.get("gradient_clip_algorithm"), (None, "norm", "value"))
    check_int("trainer.num_nodes", t.get("num_nodes", 1), low=1)
    check_int("trainer.check_val_every_n_epoch", t.get("check_val_every_n_epoch"), low=1, optional=True)
    check_int("trainer.num_sanity_val_steps", t.get("num_sanity_val_steps", 0), low=-1)
    devices = t.get("devices", "auto")
    if not (devices == "auto" or isinstance(devices, (list, str)) or (
            isinstance(devices, int) and not isinstance(devices, bool) and (devices >= 1 or devices == -1))):
        raise invalid("trainer.devices", devices, "an integer >= 1, -1 (all), auto, or a list of device ids")


def check_optimizer(o: dict) -> None:
    check_number("optimizer.lr", o.get("lr"), low=0.0, low_open=True)
    if "betas" in o:
        betas = o["betas"]
        if not (isinstance(betas, list) and len(betas) == 2 and all(
                isinstance(b, (int, float)) and not isinstance(b, bool) and 0 <= b < 1 for b in betas)):
            raise invalid("optimizer.betas", betas, "two numbers in [0, 1), e.g. [0.9,0.95]")
    if "eps" in o:
        check_number("optimizer.eps", o["eps"], low=0.0, low_open=True)
    if "weight_decay" in o:
        check_number("optimizer.weight_decay", o["weight_decay"], low=0.0)


def check_across(c: dict) -> None:
    data, model, trainer = c.get("data") or {}, c.get("model") or {}, c.get("trainer") or {}
    seq_len, max_seq_len = data.get("seq_len"), model.get("max_seq_len")
    if isinstance(seq_len, int) and isinstance(max_seq_len, int) and seq_len > max_seq_len:
        raise ConfigError(f"data.seq_len={seq_len} is invalid; allowed: <= model.max_seq_len={max_seq_len} "
                          "(the model has no positions beyond it)")
    interval, max_steps = trainer.get("val_check_interval"), trainer.get("max_steps")
    if isinstance(interval, int) and not isinstance(interval, bool) and interval > max_steps:
        raise ConfigError(f"trainer.val_check_interval={interval} is invalid; allowed: <= trainer.max_steps="
                          f"{max_steps} (a run must validate at least once)")
    if c.get("ckpt_path") == "auto" and not c.get("train", True):
        raise ConfigError("ckpt_path=auto resumes training; with train=false give the checkpoint's path")
    if not c.get("train", True) and not c.get("ckpt_path"):
        raise ConfigError("train=false evaluates a checkpoint: give ckpt_path=<run>/checkpoints/<file>.ckpt "
                          "(without it the weights would be random)")
    batch = data.get("batch_size")
    names = {model.get("norm"), *((s or {}).get("norm") for s in model.get("layers") or [])}
    options = model.get("norm_options") or {}
    for name in sorted(n for n in names if isinstance(n, str) and batch_statistics(n, options)):
        if batch == 1 and not (options.get("sync") and trainer.get("devices") not in (1, None)):
            raise ConfigError(f"data.batch_size=1 is invalid for norm={name} with per-position batch statistics: "
                              "the variance over a batch of one is 0, so the norm outputs only its bias and the "
                              "model learns nothing; allowed: data.batch_size >= 2, or "
                              "model.norm_options.stats=pooled")


def check_vocab_size(cfg: DictConfig, vocab_size: int) -> None:
    """model.vocab_size, when given, must be the tokenizer's (which decides it)."""
    given = cfg.model.get("vocab_size")
    if given is not None and given != vocab_size:
        raise ConfigError(f"model.vocab_size={given} is invalid; allowed: {vocab_size}, the vocabulary of "
                          f"data.tokenizer={cfg.data.get('tokenizer')!r} on this corpus (leave model.vocab_size out: "
                          "the tokenizer decides it)")


def check_fused_norm(c: dict) -> None:
    """norm=fused_rmsnorm where its kernel cannot run is a config error, not a traceback from inside a layer."""
    model = c.get("model") or {}
    names = {model.get("norm"), model.get("qk_norm"), *((s or {}).get("norm") for s in model.get("layers") or [])}
    if "fused_rmsnorm" in names:
        from minillm.kernels.rmsnorm import require_fused

        try:
            require_fused()
        except RuntimeError as err:
            raise ConfigError(f"norm=fused_rmsnorm: {err}") from None


# --- building ----------------------------------------------------------------------------------------------


def precision_plugins(cfg: DictConfig) -> list[DictConfig]:
    """The precision plugins among trainer.plugins (trainer=cpu_fp16 has one)."""
    return [p for p in cfg.trainer.get("plugins") or [] if "Precision" in str(p.get("_target_", ""))]


def warn_about_precision(cfg: DictConfig) -> None:
    precision, accelerator = str(cfg.trainer.get("precision")), cfg.trainer.get("accelerator")
    on_cpu = accelerator == "cpu" or (accelerator == "auto" and not torch.cuda.is_available())
    if precision in ("16-mixed", "16") and on_cpu and not precision_plugins(cfg):
        warnings.warn("trainer.precision=16-mixed on a CPU: Lightning runs bf16-mixed instead (no GradScaler); "
                      "trainer=cpu_fp16 gives real fp16 autocast with a GradScaler on the CPU (slow), or use a "
                      "GPU.", UserWarning, stacklevel=2)


def build_trainer(cfg: DictConfig, callbacks: list, loggers: list) -> L.Trainer:
    """lightning.Trainer from cfg.trainer. A precision plugin replaces the precision flag (Lightning refuses
    both), which then only names the run: trainer=cpu_fp16 keeps precision=16-mixed in names and summaries.
    trainer.val_check_interval counts optimizer steps, as every step count in minillm does; Lightning's counts
    batches, so with gradient accumulation it gets the interval times accumulate_grad_batches."""
    overrides: dict[str, Any] = {"precision": None} if precision_plugins(cfg) else {}
    interval, accumulate = cfg.trainer.get("val_check_interval"), cfg.trainer.get("accumulate_grad_batches", 1)
    if isinstance(interval, int) and not isinstance(interval, bool) and accumulate > 1:
        overrides["val_check_interval"] = interval * accumulate
    return instantiate(cfg.trainer, callbacks=callbacks, logger=loggers or False, **overrides)


def in_multirun() -> bool:
    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def group_sweeps(cfg: DictConfig) -> None:
    """In a Hydra multirun, make the W&B group name + the sweep's folder name: one group per sweep; name the
    W&B run by run_name unless the config names it."""
    wandb = (cfg.get("logger") or {}).get("wandb")
    if wandb is None:
        return
    with open_dict(cfg):
        if in_multirun():
            wandb.group = f"{cfg.name}-{Path(HydraConfig.get().sweep.dir).name}"
        if not wandb.get("name"):
            wandb.name = run_name(cfg)


NAMED = ("norm", "placement", "model.n_layers", "model.dim", "model.qk_norm", "optimizer.lr",
         "scheduler.warmup_steps", "trainer.precision", "seed")  # what run_name always shows (when not default)
UNNAMED = ("paths", "hydra", "logger", "callbacks", "name", "run_id", "ckpt_path", "tags", "experiment", "data.files",
           "train", "test", "threads")  # overrides a sweep job's name leaves out: these keys and the ones under them


def unnamed(key: str) -> bool:
    """``key`` is one of UNNAMED or under one (``trainer.max_steps`` is not under ``train``)."""
    return any(key == u or key.startswith((u + ".", u + "/")) for u in UNNAMED)


def run_name(cfg: DictConfig) -> str:
    """``<norm>-<placement>[-L<layers>][-d<dim>][-qk<qk_norm>]-lr<lr>[-wu<warmup>][-<precision>]-s<seed>``
    (L, d, wu and the precision when they differ from the defaults 4, 128, 100 and 32-true), and in a sweep
    every other override of the job as ``-<last key part>=<value>``: the sweep's jobs get distinct names."""
    model, warmup = cfg.model, OmegaConf.select(cfg, "scheduler.warmup_steps")
    parts = [str(model.norm), str(cfg.placement)]
    parts += [f"L{model.n_layers}"] if model.n_layers != 4 else []
    parts += [f"d{model.dim}"] if model.dim != 128 else []
    parts += [f"qk{model.qk_norm}"] if model.qk_norm != "none" else []
    parts += [f"lr{cfg.optimizer.lr:g}"] + ([f"wu{warmup}"] if warmup not in (None, 100) else [])
    parts += [str(cfg.trainer.precision)] if str(cfg.trainer.precision) != "32-true" else []
    parts += [f"s{cfg.seed}"]
    if in_multirun():
        for override in HydraConfig.get().overrides.task:
            key, _, value = override.lstrip("+~").partition("=")
            if key not in NAMED and not unnamed(key):
                parts.append(f"{key.rsplit('.', 1)[-1]}={value}")
    return "-".join(parts)


def set_threads(cfg: DictConfig) -> None:
    """torch's intra-op threads: ``threads``, else one per job under the joblib launcher (jobs share the cores)."""
    threads = cfg.get("threads")
    if threads is None and HydraConfig.initialized():
        launcher = str(OmegaConf.select(HydraConfig.get(), "launcher._target_", default=""))
        threads = 1 if "Joblib" in launcher else None
    if threads:
        torch.set_num_threads(int(threads))


def model_config(cfg: DictConfig, vocab_size: int) -> ModelConfig:
    """ModelConfig from cfg.model; model.compile is a training switch, read by the LightningModule instead."""
    node = OmegaConf.to_container(cfg.model, resolve=True)
    node.pop("compile", None)
    return instantiate(node, vocab_size=vocab_size)


def run_settings(cfg: DictConfig, world_size: int) -> dict[str, Any]:
    """What a resumed run must keep (stored in checkpoints, compared on resume): seed, optimizer, schedule,
    the loss options, the data stream and the trainer settings that change the math. Logging, callbacks,
    validation cadence and max_steps (with a schedule that does not read it) may change."""
    c = OmegaConf.to_container(cfg, resolve=True)
    module = {k: v for k, v in (c.get("module") or {}).items() if not k.startswith(("_", "compile"))}
    data = {k: v for k, v in (c.get("data") or {}).items() if k not in ("_target_", "_convert_", "num_workers",
                                                                       "cache_dir", "sample_prompt")}
    trainer = c.get("trainer") or {}
    return {"seed": c.get("seed"), "optimizer": c.get("optimizer"), "scheduler": schedule_settings(c.get("scheduler")),
            "module": module, "data": data, "world_size": world_size,
            "trainer": {k: trainer.get(k) for k in ("precision", "gradient_clip_val", "gradient_clip_algorithm",
                                                    "accumulate_grad_batches")}}


def resolve_resume(cfg: DictConfig) -> str | None:
    """ckpt_path as given, or for ckpt_path=auto the newest valid checkpoint of this run directory (None when
    it has none: the run starts fresh). A fresh run never writes into a directory that already holds a run."""
    ckpt, out_dir = cfg.get("ckpt_path"), Path(cfg.paths.output_dir)
    auto = ckpt == "auto"
    if auto:
        found = find_resume_checkpoint(out_dir)
        log.info(f"ckpt_path=auto: {'resuming from ' + str(found) if found else 'no checkpoint in '}"
                 f"{'' if found else str(out_dir / 'checkpoints') + ', starting fresh'}")
        ckpt = str(found) if found else None
    elif ckpt is not None:
        read_checkpoint_header(ckpt)  # a missing or unreadable file is refused before the data is prepared
    if ckpt is None and cfg.get("train", True) and (out_dir / "summary.json").exists():
        if auto:  # a run without checkpoints (trainer.enable_checkpointing=false), or one that crashed first
            raise ConfigError(f"ckpt_path=auto: the run directory {out_dir} holds a run (summary.json) but no "
                              "checkpoint to resume; give this run another run_id or name")
        raise ConfigError(f"the run directory {out_dir} already holds a run (summary.json); resume it with "
                          "ckpt_path=auto, or give this run another run_id or name")
    return ckpt


EVALUATION_FILE = "evaluation.json"  # what RunSummary writes for train=false (summary.json is a training's record)


def as_evaluation(cfg: DictConfig) -> None:
    """train=false: the run records an evaluation (its summary file, a W&B run of job_type eval), so a sweep
    report never counts it as a training run."""
    with open_dict(cfg):
        summary = (cfg.get("callbacks") or {}).get("summary")
        if summary is not None:
            summary.filename = EVALUATION_FILE
        wandb = (cfg.get("logger") or {}).get("wandb")
        if wandb is not None:
            wandb.job_type = "eval"


def resume_wandb(cfg: DictConfig, header: dict) -> None:
    """A resumed run continues the W&B run its checkpoint names (same id, resume="allow")."""
    run_id = (header.get("minillm") or {}).get("wandb_run_id")
    wandb = (cfg.get("logger") or {}).get("wandb")
    if run_id and wandb is not None:
        with open_dict(cfg):
            wandb.id, wandb.resume = run_id, "allow"


# --- the run -----------------------------------------------------------------------------------------------


@dataclass
class Job:
    """Everything a run needs, built and checked; nothing has trained and no logger has written yet."""

    cfg: DictConfig
    trainer: L.Trainer
    module: L.LightningModule
    datamodule: Any
    ckpt_path: str | None


def check_model_early(cfg: DictConfig) -> None:
    """The model config's own checks before the data is prepared (a BPE may train for minutes first); the
    vocabulary comes from the tokenizer, so model.vocab_size may only be given when it agrees (checked later)."""
    given = cfg.model.get("vocab_size")
    if given is not None:
        check_int("model.vocab_size", given, low=1)
    model_config(cfg, vocab_size=given or 256)


def prepare(cfg: DictConfig) -> Job:
    """Check the config, resolve resume, set up data, model, callbacks, loggers and trainer. A ConfigError
    raised here means nothing ran: the start is refused and what it wrote is removed (see main)."""
    with config_errors():
        check_config(cfg)
        check_model_early(cfg)
        warn_about_precision(cfg)
        set_threads(cfg)
        group_sweeps(cfg)
        ckpt_path = resolve_resume(cfg)
        if not cfg.get("train", True):
            as_evaluation(cfg)
        L.seed_everything(cfg.seed, workers=True)
        datamodule = instantiate(cfg.data)
        callbacks = [instantiate(c) for c in (cfg.get("callbacks") or {}).values() if c and "_target_" in c]
        datamodule.prepare_data()
        datamodule.setup("fit")
        check_vocab_size(cfg, datamodule.vocab_size)
        model_cfg = model_config(cfg, datamodule.vocab_size)
        if cfg.trainer.get("sync_batchnorm") and "sync" in norm_options(model_cfg.norm):
            model_cfg.norm_options["sync"] = True  # Lightning's switch converts only torch's BatchNorm
        header = check_resume(ckpt_path, model_cfg.to_dict()) if ckpt_path else {}  # before building anything
        if header:
            datamodule.load_state_dict(header.get(type(datamodule).__qualname__) or {})  # same tokenizer
        if header and cfg.get("train", True):
            resume_wandb(cfg, header)
        loggers = [instantiate(c) for c in (cfg.get("logger") or {}).values() if c and "_target_" in c]
        trainer = build_trainer(cfg, callbacks, loggers)
        settings = run_settings(cfg, trainer.world_size)
        if ckpt_path and cfg.get("train", True):
            check_resume(ckpt_path, model_cfg.to_dict(), settings)
            for logger in loggers:  # rows the resumed run logs again (steps after the checkpoint)
                if hasattr(logger, "resume_at"):
                    logger.resume_at(int(header.get("global_step", 0)))
        scheduler = instantiate(cfg.scheduler) if cfg.get("scheduler") else None
        module = instantiate(cfg.module, _partial_=True)(
            model=model_cfg, optimizer=instantiate(cfg.optimizer), scheduler=scheduler, run_settings=settings)
    return Job(cfg, trainer, module, datamodule, ckpt_path)


def run(job: Job) -> dict[str, float]:
    """Fit, then test on the held-out split."""
    cfg, trainer, module, datamodule, ckpt_path = job.cfg, job.trainer, job.module, job.datamodule, job.ckpt_path
    n_params = module.model.num_params()
    log.info(f"model: {n_params / 1e6:.2f}M parameters, norm={module.model.cfg.norm}, "
             f"placement={module.model.cfg.placement}; run directory {cfg.paths.output_dir}")
    hparams = {**OmegaConf.to_container(cfg, resolve=True), "n_params": n_params, **provenance()}
    for logger in trainer.loggers:
        logger.log_hyperparams(hparams)
    try:
        if cfg.get("train", True):
            fit(trainer, module, datamodule, ckpt_path)
        metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}
        if cfg.get("test", False):
            metrics.update(test(cfg, trainer, module, datamodule, ckpt_path))
        return metrics
    finally:
        for logger in trainer.loggers:  # the W&B run ends with its summary written (also for the next sweep job)
            if hasattr(logger, "finish"):
                logger.finish()


def train(cfg: DictConfig) -> dict[str, float]:
    """Check the config; set up data, model, callbacks, loggers and trainer; fit; test on the held-out split."""
    return run(prepare(cfg))


STOP_CODES = {128 + s for s in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR2)}  # see PreemptionCheckpoint


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
        weights, source = ckpt_path, f"the checkpoint {ckpt_path}" if ckpt_path else "freshly initialized weights"
    elif cfg.get("test_weights", "final") == "best" and trainer.checkpoint_callback is not None:
        weights, source = "best", "the best checkpoint (val/loss)"
    else:
        weights, source = None, "the final weights"
    trainer.test(module, datamodule=datamodule, ckpt_path=weights, verbose=False)
    metrics = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("test/")}
    shown = ", ".join(f"{k}={v:.4f}" for k, v in sorted(metrics.items()) if math.isfinite(v))
    log.info(f"held-out, {source}: {shown}")
    return metrics


def route_library_logs() -> None:
    """Lightning's log lines and Python warnings go through the root logger Hydra set up, so train.log (the
    run's console log) holds them too; Lightning adds its own console handler when imported before that."""
    for name in ("lightning", "lightning.pytorch", "lightning.fabric", "torchmetrics"):
        logger = logging.getLogger(name)
        logger.handlers.clear()
        logger.propagate = True
    logging.captureWarnings(True)


DISK_ERRORS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOTDIR, errno.EEXIST}


def disk_error(err: BaseException) -> str | None:
    """``disk error: ...`` for a file the run cannot write (a full disk, a read-only or forbidden folder, a path
    that is a file), None for anything else."""
    while err is not None:
        if isinstance(err, OSError) and err.errno in DISK_ERRORS:
            where = f" {err.filename}" if err.filename else ""
            return (f"disk error: cannot write{where} ({os.strerror(err.errno)}); free space or choose a writable "
                    "folder (paths.log_dir for run folders, data.cache_dir for token stores)")
        err = err.__cause__ or err.__context__
    return None


def refuse(cfg: DictConfig, line: str, lock: RunFolderLock) -> None:
    """A start that cannot go on: one line, exit 2, and nothing left of it (a fresh run folder goes; in a
    folder that holds a run, only this start's Hydra files; in a folder another run holds, nothing of its)."""
    log.error(line)
    out_dir = Path(cfg.paths.output_dir)
    subdir = rundir.hydra_subdir(str(out_dir))
    if lock.held or subdir != ".hydra":
        discard_start(out_dir, subdir, fresh=lock.held and subdir == ".hydra", log_dir=cfg.paths.log_dir)
    sys.exit(2)


@hydra.main(version_base="1.3", config_path=config_dir(), config_name="train")
def hydra_main(cfg: DictConfig) -> float | None:
    """One run (or one job of a sweep) in its folder, which it holds locked from start to end."""
    route_library_logs()
    with RunFolderLock(cfg.paths.output_dir) as lock:
        try:
            lock.acquire()
            job = prepare(cfg)
        except ConfigError as err:
            log.debug("where it was raised (hydra.verbose=minillm shows this)", exc_info=err)
            refuse(cfg, f"{err.what}: {err}", lock)
        except OSError as err:
            line = disk_error(err)
            if line is None:
                raise
            refuse(cfg, line, lock)
        try:
            metrics = run(job)
        except ConfigError as err:  # found while training, e.g. a token store corrupted on disk
            log.error(f"{err.what}: {err}")
            sys.exit(2)
        except OSError as err:
            line = disk_error(err)
            if line is None:
                raise
            log.error(line)
            sys.exit(2)
    return metrics.get(cfg.get("optimized_metric"))


def main() -> float | None:
    """``python train.py`` and ``minillm-train``: Hydra's run, with Hydra's own errors (an unknown option, a
    misspelt key, an override it cannot parse, a folder it cannot make) as one line and exit code 2."""
    previous = os.environ.get("HYDRA_FULL_ERROR")
    os.environ["HYDRA_FULL_ERROR"] = "1"  # Hydra raises instead of printing its report and exiting 1
    try:
        return hydra_main()
    except Exception as err:
        line = one_line(err) or disk_error(err)
        if line is None:
            raise
        print(line, file=sys.stderr)
        sys.exit(2)
    finally:
        if previous is None:
            os.environ.pop("HYDRA_FULL_ERROR", None)
        else:
            os.environ["HYDRA_FULL_ERROR"] = previous
