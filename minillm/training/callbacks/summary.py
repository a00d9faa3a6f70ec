"""RunSummary: the run in one JSON object (summary.json), after fit, after test and on a crash."""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_only
from lightning.pytorch.utilities.exceptions import SIGTERMException
from torch import Tensor
from torch.multiprocessing import ProcessExitedException

from minillm import schema
from minillm.errors import writing
from minillm.files import json_safe, write_json
from minillm.metrics import TEST_LOSS, VAL_LOSS, tokens_seen
from minillm.norms import impls_used
from minillm.outcome import is_diverged, is_failed, is_not_trained
from minillm.training.callbacks.common import Observer, last_step
from minillm.training.callbacks.run_totals import TOTALS, RunTotals
from minillm.version import provenance


class RunSummary(L.Callback):
    """Writes ``summary.json`` to ``trainer.default_root_dir`` after fit, after test, and on a crash.

    One flat JSON object (non-finite numbers written as null) whose fields, their types and meanings are
    minillm.schema's (docs/definitions.md prints the table; a test checks a real run's file against it).
    A resumed run (``ckpt_path``) continues the totals of the run it resumes: the three callbacks keep them
    in the checkpoint (state_dict), so the summary covers the whole run, not only its last segment.
    Steps: ``steps`` counts optimizer steps; ``diverged_step`` and ``best_val_step`` are 0-based step
    indices, as the ``step`` column of csv/metrics.csv (a validation after k steps is at index k - 1).
    diverged, not_trained and failed are minillm.outcome's rules: diverged = DivergenceGuard stopped the run,
    or the final val loss is not finite, or >= ln V after a validation below ln V; not_trained = a final val
    loss still >= ln V that never was below it; failed = diverged, not trained, crashed (status failed), never
    validated, or a final val loss >= unigram_loss.
    max_grad_norm and nonfinite_grad_steps cover every step; the other StabilityMonitor maxima its measured
    steps. ``config`` (from the YAML, e.g.
    ``seed: ${seed}``) is written as given; the rest is read from the module, the trainer's optimizer and
    the other callbacks.
    """

    def __init__(self, filename: str = "summary.json", config: dict | None = None):
        self.filename, self.config = filename, dict(config or {})
        self._t0 = time.time()
        self._started_at = _utc_now()
        self._fit_seen = False
        self.val_history: list[tuple[int, float]] = []
        self.batch_shape: tuple[int, ...] | None = None
        self._t_train: float | None = None  # when this process started training
        self._val_t: float | None = None  # when the running validation started (None outside one)
        self._val_time = 0.0  # validation seconds since _t_train
        self._before = {"train_time": 0.0, "wall_time": 0.0}  # earlier segments of a resumed run
        self._mark: tuple[int, float] | None = None  # (step, train time) where this segment's steady window began
        self._steady_before = (0, 0.0)  # (steps, seconds) of the steady windows of earlier segments
        self._last_step = 0  # the optimizer step at the last batch end
        self._timed_before: int | None = 0  # steps trained in earlier segments (None: an older checkpoint's, unknown)
        self._segment_start: int | None = None  # the step this process's segment started training at
        self.test_loss: float | None = None
        self.test_weights: str | None = None  # the checkpoint the test pass loaded, or "final" (the trained weights)

    def train_time(self) -> float:
        """Seconds spent training (validation excluded), over every segment of the run."""
        if self._t_train is None:
            return self._before["train_time"]
        now = time.time()
        running_val = now - self._val_t if self._val_t is not None else 0.0
        return self._before["train_time"] + now - self._t_train - self._val_time - running_val

    def state_dict(self) -> dict[str, Any]:
        """What a resumed run needs to summarize the whole run (plain values for weights_only loading)."""
        return {"val_history": [list(v) for v in self.val_history],
                "batch_shape": list(self.batch_shape) if self.batch_shape else None,
                "train_time": self.train_time(), "wall_time": self._before["wall_time"] + time.time() - self._t0,
                "started_at": self._started_at, "steady": list(self.steady(self._last_step)),
                "trained_steps": self.trained_steps(self._last_step)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.val_history = [(int(s), float(v)) for s, v in state["val_history"]]
        self.batch_shape = tuple(state["batch_shape"]) if state["batch_shape"] else None
        self._before = {"train_time": state["train_time"], "wall_time": state["wall_time"]}
        self._started_at = state.get("started_at", self._started_at)  # older checkpoints lack it
        self._timed_before = state.get("trained_steps")  # None in older checkpoints: resolved at the train start
        steps, seconds = state.get("steady") or (0, 0.0)  # older checkpoints lack it too
        self._steady_before, self._mark = (int(steps), float(seconds)), None  # this segment marks its own start

    def trained_steps(self, step: int) -> int:
        """Optimizer steps this summary timed, over every segment of its run, up to ``step``: the steps of a run
        that started from another's checkpoint (a decay branch, a replay) are its own."""
        own = step - self._segment_start if self._segment_start is not None else 0
        return (self._timed_before or 0) + max(own, 0)

    def steady(self, step: int) -> tuple[int, float]:
        """(optimizer steps, training seconds) in the steady windows up to ``step``: from half of max_steps, and
        in a resumed segment from its first completed step (its recompile left out)."""
        steps, seconds = self._steady_before
        if self._mark is not None and step > self._mark[0]:
            steps, seconds = steps + step - self._mark[0], seconds + self.train_time() - self._mark[1]
        return steps, seconds

    # timing and counting
    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._fit_seen = True  # this process fits (also a run resumed at its last step, which trains no step)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._t_train, self._val_time = time.time(), 0.0
        self._segment_start = trainer.global_step
        if self._timed_before is None:  # an older checkpoint: its steps were all timed
            self._timed_before = trainer.global_step

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        x = batch[0] if isinstance(batch, (tuple, list)) else batch
        if isinstance(x, Tensor) and self.batch_shape is None:
            self.batch_shape = tuple(x.shape)
        self._last_step = trainer.global_step
        if self._mark is None and trainer.max_steps > 1 and trainer.global_step >= trainer.max_steps // 2:
            self._mark = (trainer.global_step, self.train_time())

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.sanity_checking and self._t_train is not None:
            self._val_t = time.time()

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._val_t is not None:
            self._val_time += time.time() - self._val_t
            self._val_t = None
        if trainer.sanity_checking:
            return
        value = trainer.callback_metrics.get(VAL_LOSS)
        if value is not None:
            self.val_history.append((last_step(trainer), float(value)))

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._before["train_time"], self._t_train = self.train_time(), None  # training is over: freeze

    # writing
    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.write(trainer, pl_module, "completed")

    def on_test_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        value = trainer.callback_metrics.get(TEST_LOSS)
        self.test_loss = float(value) if value is not None else None
        self.test_weights = str(trainer.ckpt_path) if trainer.ckpt_path else "final"
        self.write(trainer, pl_module, "completed")

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule,
                     exception: BaseException) -> None:
        if isinstance(exception, SIGTERMException):  # stopped by a signal, resumable: not an outcome yet
            self.write(trainer, pl_module, "preempted")
        elif isinstance(exception, ProcessExitedException) and not self._fit_seen:
            pass  # DDP's fork/spawn launcher reporting a stopped process, which wrote its own summary
        else:
            self.write(trainer, pl_module, "failed", error=f"{type(exception).__name__}: {exception}")

    @rank_zero_only
    def write(self, trainer: L.Trainer, pl_module: L.LightningModule, status: str,
              error: str | None = None) -> Path:
        path = Path(trainer.default_root_dir) / self.filename
        summary = self.build(trainer, pl_module, status, error)
        if not self._fit_seen and path.exists():
            # a test pass that did not see the fit (train=false, or the fit ran in other processes: DDP's fork
            # and spawn launchers) adds its result to the fit's summary and changes nothing else
            new = {schema.TEST_LOSS: summary[schema.TEST_LOSS], "test_weights": summary["test_weights"],
                   **({"test_error": error} if error else {})}
            summary = {**json.loads(path.read_text()), **new}
        summary = json_safe(summary)
        with writing(path):  # written whole, then renamed: never half a summary (a full disk leaves the previous one)
            write_json(path, summary)
        for logger in trainer.loggers:  # W&B's run summary shows the same numbers (minillm.training.loggers)
            if hasattr(logger, "record_summary"):
                logger.record_summary(summary)
        return path

    def build(self, trainer: L.Trainer, pl_module: L.LightningModule, status: str,
              error: str | None = None) -> dict[str, Any]:
        """The summary as a flat dict (fields in the class docstring)."""
        model = getattr(pl_module, "model", pl_module)
        cfg = getattr(model, "cfg", None)
        hp = getattr(pl_module, "hparams", {})
        optimizer = trainer.optimizers[0] if trainer.optimizers else None
        group = optimizer.param_groups[0] if optimizer is not None else {}
        opt_kw = {"lr": group.get("initial_lr", group.get("lr")), "weight_decay": group.get("weight_decay")}
        lrs = optimizer.lrs() if hasattr(optimizer, "lrs") else {}  # MuonWithAdamW: each optimizer's lr
        vocab = getattr(cfg, "vocab_size", None)
        loss_init = math.log(vocab) if vocab else None
        s: dict[str, Any] = {
            "name": None, "norm": getattr(cfg, "norm", None), "placement": getattr(cfg, "placement", None),
            "lr": opt_kw.get("lr"), "warmup_steps": None, "precision": str(trainer.precision), "seed": None,
        }
        s.update(self.config)
        s["precision_used"] = str(trainer.precision)
        s["deterministic"] = torch.are_deterministic_algorithms_enabled()  # trainer.deterministic as it ran
        for key in ("dim", "n_layers", "n_heads", "n_kv_heads", "qk_norm", "init", "vocab_size", "max_seq_len",
                    "norm_eps", "tie_embeddings", "parametrization", "mup_base_width"):
            s[key] = getattr(cfg, key, None)
        s.update({
            "norm_options": dict(getattr(cfg, "norm_options", None) or {}),
            **({"attn_norm_options": dict(attn)} if (attn := getattr(cfg, "attn_norm_options", None)) else {}),
            "weight_decay": opt_kw.get("weight_decay"), "z_loss": hp.get("z_loss"),
            "optimizer": type(optimizer).__name__ if optimizer is not None else None, "adamw_lr": lrs.get("adamw"),
            "grad_clip": trainer.gradient_clip_val, "max_steps": trainer.max_steps,
            "batch_size": self.batch_shape[0] if self.batch_shape else None,
            "seq_len": self.batch_shape[1] if self.batch_shape and len(self.batch_shape) > 1 else None,
            "norm_impl": impls_used(model) or None,
            "n_params": model.num_params() if hasattr(model, "num_params") else
            sum(p.numel() for p in model.parameters()),
            schema.LOSS_INIT: loss_init,
            schema.UNIGRAM_LOSS: getattr(trainer.datamodule, schema.UNIGRAM_LOSS, None) if trainer.datamodule else None,
        })
        finite_vals = [(st, v) for st, v in self.val_history if math.isfinite(v)]
        best = min(finite_vals, key=lambda sv: sv[1]) if finite_vals else (None, None)
        final_val = self.val_history[-1][1] if self.val_history else None
        totals = {**dict.fromkeys(TOTALS), **RunTotals.of(trainer).values()}
        tripped = bool(totals.pop(schema.STOPPED_EARLY, None))
        diverged = is_diverged(tripped, final_val, loss_init, best[1])
        step, reason = totals.pop(schema.DIVERGED_STEP, None), totals.pop("diverged_reason", None)
        if diverged and not tripped:
            step, reason = last_step(trainer), (f"final val loss {final_val:.4g} >= ln(vocab_size) = {loss_init:.4g}"
                                                f" after {best[1]:.4g} at step {best[0]}" if math.isfinite(final_val)
                                                else f"final val loss {final_val}")
        if status == "completed" and diverged:
            status = "diverged"
        elif status == "completed" and is_not_trained(diverged, final_val, loss_init):
            status = "not_trained"
        train_time = self.train_time()
        batch_tokens = math.prod(self.batch_shape) if self.batch_shape else 0
        tokens = tokens_seen(trainer.global_step, batch_tokens, trainer.world_size, trainer.accumulate_grad_batches)
        steady_steps, steady_seconds = self.steady(trainer.global_step)
        steady = (tokens_seen(steady_steps, batch_tokens, trainer.world_size, trainer.accumulate_grad_batches)
                  / steady_seconds if steady_steps and steady_seconds > 0 else None)
        s.update({
            "status": status,
            "error": error,
            "steps": trainer.global_step,
            schema.FINAL_VAL_LOSS: final_val, schema.BEST_VAL_LOSS: best[1], schema.BEST_VAL_STEP: best[0],
            schema.TEST_LOSS: self.test_loss, "test_weights": self.test_weights,
            "diverged": diverged, schema.DIVERGED_STEP: step, "diverged_reason": reason,
            schema.STOPPED_EARLY: tripped,
            "failed": (diverged or status == "failed") if "replay" in s and status != "preempted" else
            is_failed(status, diverged, final_val, s[schema.UNIGRAM_LOSS]),  # a replay never validates: its training
            **totals,  # RunTotals: max_grad_norm, nonfinite_grad_steps, spike_count, max_attn_logit, ...
            "tokens": tokens,
            "train_time_s": round(train_time, 3),
            schema.TOKENS_PER_S: tokens_seen(self.trained_steps(trainer.global_step), batch_tokens, trainer.world_size,
                                        trainer.accumulate_grad_batches) / train_time if train_time > 0 else None,
            "steady_tokens_per_s": steady,
            "wall_time_s": round(self._before["wall_time"] + time.time() - self._t0, 3),
            "run_dir": str(trainer.default_root_dir),
            "callback_errors": {type(c).__name__: c.failure for c in trainer.callbacks if isinstance(c, Observer)
                                and c.failure} or None,
            "started_at": self._started_at, "written_at": _utc_now(),
            "settings": run_settings_of(hp, cfg),
            **provenance(),
        })
        return s


def run_settings_of(hparams: Mapping, cfg: Any) -> dict[str, Any] | None:
    """Every setting a user can sweep, nested as the config is: what a resume must keep (the module's run_settings:
    optimizer and its lrs, schedule, data set and tokenizer, loss options, trainer math) and the model config."""
    settings = dict(hparams.get("run_settings") or {})
    if dataclasses.is_dataclass(cfg):
        settings["model"] = dataclasses.asdict(cfg)
    return settings or None


def _utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


