"""The checks of a run's config that no component makes: the top-level keys (seed, name, train, ...), the keys of
the components minillm does not own (Lightning's Trainer, torch's optimizer: their own errors name no field),
and the rules across groups. Each minillm component checks its own keys when it is built (ModelConfig, the
norms, the data module, the callbacks); ``check_model_early`` builds the model early (on the meta device), so its
errors and its layers' come before the data is tokenized and before anything is written.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

import torch
from hydra.utils import get_object
from omegaconf import DictConfig, OmegaConf

from minillm import _compat, mup
from minillm.errors import (
    ConfigError,
    check_betas,
    check_bool,
    check_choice,
    check_int,
    check_name,
    check_number,
    invalid,
)
from minillm.model import PLACEMENTS, Transformer
from minillm.norms import batch_statistics
from minillm.training.optim import BARE_MUON, MuonWithAdamW, is_bare_muon, lr_lambda, optimizer_kind
from minillm.training.run.build import model_config, precision_plugins, trains_on_cpu

PRECISIONS = _compat.lightning_precisions()  # Lightning's own list
TEST_WEIGHTS = ("final", "best")
CLIP_ALGORITHMS = (None, "norm", "value")  # Lightning's


def check_config(cfg: DictConfig) -> None:
    """Top-level keys, the trainer, the optimizer and the schedule, and the rules across groups."""
    c = OmegaConf.to_container(cfg, resolve=True)
    check_int("seed", c.get("seed"), low=0, high=2**32 - 1)  # numpy's seed range
    check_name("name", c.get("name"))
    check_name("run_id", c.get("run_id"), optional=True)
    for key in ("train", "test"):
        check_bool(key, c.get(key))
    check_bool("print_config", c.get("print_config", True))
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
    check_choice("trainer.gradient_clip_algorithm", t.get("gradient_clip_algorithm"), CLIP_ALGORITHMS)
    check_int("trainer.num_nodes", t.get("num_nodes", 1), low=1)
    check_int("trainer.check_val_every_n_epoch", t.get("check_val_every_n_epoch"), low=1, optional=True)
    check_int("trainer.num_sanity_val_steps", t.get("num_sanity_val_steps", 0), low=-1)
    deterministic = t.get("deterministic", "auto")
    if not (isinstance(deterministic, bool) or deterministic in ("auto", "warn")):
        raise invalid("trainer.deterministic", deterministic, "auto, true, false, warn")
    devices = t.get("devices", "auto")
    if not (devices == "auto" or isinstance(devices, (list, str)) or (
            isinstance(devices, int) and not isinstance(devices, bool) and (devices >= 1 or devices == -1))):
        raise invalid("trainer.devices", devices, "an integer >= 1, -1 (all), auto, or a list of device ids")


def check_optimizer(o: dict) -> None:
    if is_bare_muon(o.get("_target_")):
        raise ConfigError(BARE_MUON)
    if str(o.get("_target_")).endswith("MuonWithAdamW"):
        keys = ("lr", "momentum", "nesterov", "ns_steps", "weight_decay", "adjust_lr_fn", "adamw_lr", "adamw_betas",
                "adamw_eps", "adamw_weight_decay")
        MuonWithAdamW.check(**{k: o.get(k) for k in keys})
        return
    check_number("optimizer.lr", o.get("lr"), low=0.0, low_open=True)
    if "betas" in o:
        check_betas("optimizer.betas", o["betas"])
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
    if c.get("decay_from") and not c.get("train", True):
        raise ConfigError("decay_from starts a decay branch (training); with train=false give ckpt_path=<file>")
    if not c.get("train", True) and not c.get("ckpt_path"):
        raise ConfigError("train=false evaluates a checkpoint: give ckpt_path=<run>/checkpoints/<file>.ckpt "
                          "(without it the weights would be random)")
    batch = data.get("batch_size")
    names = {model.get("norm"), *((s or {}).get("norm") for s in model.get("layers") or [])}
    base, attn = (o if isinstance(o := model.get(k), Mapping) else {} for k in ("norm_options", "attn_norm_options"))
    for options in (base, {**base, **attn}):  # the norms, then the attention sublayer's
        check_batch_of_one(names, options, batch, trainer)


def check_batch_of_one(names: set, options: Mapping, batch: Any, trainer: Mapping) -> None:
    """data.batch_size=1 with a norm that takes per-position statistics over the batch: one clear line."""
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
    """norm=fused_rmsnorm or model.norm_impl=triton where the kernel cannot run is a config error, not a
    traceback from inside a layer (norm_impl=auto takes another implementation instead)."""
    model = c.get("model") or {}
    names = {model.get("norm"), model.get("qk_norm"), *((s or {}).get("norm") for s in model.get("layers") or [])}
    fused = "fused_rmsnorm" in names
    asked = "norm=fused_rmsnorm" if fused else "model.norm_impl=triton" if model.get("norm_impl") == "triton" else None
    if asked:
        from minillm.kernels import rmsnorm as kernel

        what = asked if fused else f"model.norm_impl=triton (the Triton kernel of norm={model.get('norm')})"
        instead = "norm=rmsnorm" if fused else "model.norm_impl=auto"
        try:
            kernel.require_fused(what, instead)
        except RuntimeError as err:
            raise ConfigError(str(err)) from None
        if (c.get("trainer") or {}).get("accelerator") == "cpu" and not kernel._interpreting():
            raise ConfigError(f"{what} with trainer.accelerator=cpu is invalid: the kernel runs on CUDA tensors; "
                              f"allowed: trainer=gpu (or trainer.accelerator=gpu|auto), or {instead} on the CPU")


def check_model_early(cfg: DictConfig) -> None:
    """The model's own checks before the data is prepared (a BPE may train for minutes first) and before anything
    is written: the model config's, every layer's (a norm's options: the model is built on the meta device, which
    allocates and initializes nothing) and muP's rule for the optimizer. The vocabulary comes from the tokenizer,
    so model.vocab_size may only be given when it agrees (checked later)."""
    given = cfg.model.get("vocab_size")
    if given is not None:
        check_int("model.vocab_size", given, low=1)
    model = model_config(cfg, vocab_size=given or 256)
    with torch.device("meta"):
        Transformer(model)
    optimizer = cfg.get("optimizer") or {}
    try:
        factory = get_object(str(optimizer.get("_target_")))
    except Exception:  # noqa: BLE001  (instantiating it later says what is wrong with the _target_)
        return
    mup.hidden_lr_mult(model, optimizer_kind(factory), optimizer.get("adjust_lr_fn"))


def warn_about_precision(cfg: DictConfig) -> None:
    precision = str(cfg.trainer.get("precision"))
    if precision in ("16-mixed", "16") and trains_on_cpu(cfg.trainer) and not precision_plugins(cfg):
        warnings.warn("trainer.precision=16-mixed on a CPU: Lightning runs bf16-mixed instead (no GradScaler); "
                      "trainer=cpu_fp16 gives real fp16 autocast with a GradScaler on the CPU (slow), or use a "
                      "GPU.", UserWarning, stacklevel=2)
