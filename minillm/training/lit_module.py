"""LightningModule: next-token loss, metrics, and the optimizer and schedule of minillm.training.optim."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import lightning as L
import numpy as np
import torch
import torch.nn.functional as F
from lightning.pytorch.loggers import WandbLogger
from lightning.pytorch.plugins.precision import Precision
from lightning.pytorch.utilities import GradClipAlgorithmType
from torch import Tensor
from torchmetrics import MeanMetric, SumMetric

from minillm import _compat, mup
from minillm.errors import ConfigError, check_bool, check_choice, check_int, check_number, invalid
from minillm.metrics import TRAIN_LOSS, TRAIN_LOSS_WITH_Z, TRAIN_LR, TRAIN_TOKENS, eval_metric, tokens_seen
from minillm.model import ModelConfig, Transformer
from minillm.training import loss as losses
from minillm.training.callbacks.common import log_metrics
from minillm.training.callbacks.reads import DeviceReads, logging_step, step_ended
from minillm.training.checkpointing import check_model_config
from minillm.training.optim import (
    BARE_MUON,
    check_fused,
    is_bare_muon,
    optimizer_kind,
    param_groups,
    scale_group_lrs,
    with_fused,
)
from minillm.version import provenance

COMPILE_MODES = (None, "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
LOSS_IMPLS = ("auto", *losses.IMPLS)


class LitLM(L.LightningModule):
    """Trains ``Transformer(model)`` on (x, y) token windows.

    Weight decay applies to the matrices of linear layers; norm gains/biases (every 0-D and 1-D
    parameter) and the token embedding get it only when ``decay_norms`` / ``decay_embeddings`` say so.
    The training loss comes from the last hidden states by ``loss_impl`` (minillm.training.loss): ``chunked`` never
    makes
    the fp32 logits of the whole batch, ``plain`` does, ``liger`` is Liger-Kernel's fused linear cross entropy;
    ``auto`` takes chunked on a CUDA GPU and plain elsewhere (where the logits are small and the plain loss keeps
    runs bit-identical with earlier versions). With ``compile``, the whole training step's forward and loss run as
    ``torch.compile(step_loss)`` (and validation as ``torch.compile(model.forward)``); ``run_eagerly(requester,
    True)`` runs the model uncompiled, with the plain loss, instead (StabilityMonitor asks for it on the steps it
    measures, so its forward hooks fire and see the logits: hooks added to a compiled model are not seen).
    ``run_settings`` (plain values: optimizer, schedule, data, ...) is stored in checkpoints, so a resumed run can be
    checked against the settings it was trained with.
    With ``eval_windows_dir`` (train.py: the run folder), each validation and test pass also saves the mean loss of
    every evaluated window, in the windows' order, as ``val_windows.npy`` / ``test_windows.npy`` there (float64;
    each validation replaces the one before, so the file holds the final one; its mean is val/loss): what an
    interval needs to include the sampling error of the evaluation windows (minillm.analysis.stats.window_se,
    docs/comparing.md).
    """

    def __init__(self, model: ModelConfig | dict, optimizer: Callable | None = None,
                 scheduler: Callable | None = None, decay_norms: bool = False, decay_embeddings: bool = False,
                 z_loss: float = 0.0, compile: bool = False, compile_backend: str = "inductor",
                 compile_mode: str | None = None, run_settings: dict | None = None,
                 eval_windows_dir: str | None = None, loss_impl: str = "auto", loss_chunk_rows: int | None = None):
        super().__init__()
        check_choice("module.loss_impl", loss_impl, LOSS_IMPLS)
        check_int("module.loss_chunk_rows", loss_chunk_rows, low=1, optional=True)
        if loss_impl == "liger":
            losses.check_impl(loss_impl)
        check_fused(optimizer)
        check_bool("module.decay_norms", decay_norms)
        check_bool("module.decay_embeddings", decay_embeddings)
        check_number("module.z_loss", z_loss, low=0.0)
        check_bool("model.compile", compile)
        if compile:
            if compile_backend not in torch.compiler.list_backends(exclude_tags=()):
                raise invalid("module.compile_backend", compile_backend, ", ".join(torch.compiler.list_backends()))
            check_choice("module.compile_mode", compile_mode, COMPILE_MODES)
        model = ModelConfig(**model) if isinstance(model, dict) else model
        # plain values only, so checkpoints load with torch.load(weights_only=True)
        self.save_hyperparameters(ignore=["model", "optimizer", "scheduler"], logger=False)
        self.hparams["model"] = model.to_dict()
        self.optimizer_factory, self.scheduler_factory = optimizer, scheduler
        self.model = Transformer(model)
        def compiled(fn: Callable) -> Callable | None:  # a function, not a module: the state_dict keeps its keys
            return torch.compile(fn, backend=compile_backend, mode=compile_mode) if compile else None

        self.compiled_forward, self.compiled_step_loss = compiled(self.model.forward), compiled(self.step_loss)
        self._eager_for: set[int] = set()  # the callbacks that need the model uncompiled now (run_eagerly)
        self.bits_per_token: float | None = None  # bits/char per nats/token, for the char tokenizer (setup())
        self.token_bytes: Tensor | None = None  # (V,) UTF-8 bytes of each token, from the tokenizer (setup())
        # token-weighted mean cross entropy of the current val/test pass; nats and UTF-8 bytes of the evaluated targets
        # (fp64 sums, synced over processes like eval_ce); the NaN losses seen. torchmetrics leaves NaNs out of its
        # sums and means, so a pass that saw one reports NaN for every metric (never the mean of the rest, or a bpb of
        # 0 from a sum without them)
        self.eval_ce = MeanMetric(nan_strategy="ignore")
        self.eval_nats = SumMetric(nan_strategy="ignore").set_dtype(torch.float64)
        self.eval_bytes = SumMetric(nan_strategy="ignore").set_dtype(torch.float64)
        self.eval_nans = SumMetric()
        self._window_losses: list[Tensor] = []  # per-window mean losses of the running pass (eval_windows_dir)
        self._first_batch = True  # of this fit (on_train_batch_start aligns the logged step once)
        self._step_losses: list[Tensor] = []  # (ce, loss) of each micro-batch of the optimizer step in progress
        self._train_metrics: dict[str, float] = {}  # the logging step's train metrics, read with the callbacks' values

    def setup(self, stage: str) -> None:
        try:
            datamodule = self.trainer.datamodule
        except RuntimeError:  # not attached to a Trainer
            datamodule = None
        tokenizer = getattr(datamodule, "tokenizer", None)
        is_char = getattr(tokenizer, "unit", None) == "char"
        self.bits_per_token = getattr(tokenizer, "bits_per_char_factor", None) if is_char else None
        table = getattr(tokenizer, "token_bytes", None)
        self.token_bytes = torch.as_tensor(table, dtype=torch.float64) if table is not None else None

    def forward(self, idx: Tensor) -> Tensor:
        if self.compiled_forward is not None and not self._eager_for:
            return self.compiled_forward(idx)
        return self.model(idx)

    def loss(self, logits: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        """Cross entropy in fp32 (+ optional z-loss, coefficient * mean(log Z ** 2)); returns (loss, ce)."""
        logits = logits.float().flatten(0, 1)  # (B*T, V)
        ce = F.cross_entropy(logits, y.flatten())
        if not self.hparams.z_loss:
            return ce, ce
        log_z = torch.logsumexp(logits, dim=-1)  # (B*T,)
        return ce + self.hparams.z_loss * log_z.pow(2).mean(), ce

    @property
    def loss_impl(self) -> str:
        """The training loss's implementation: module.loss_impl, auto resolved by the device (class docstring)."""
        impl = self.hparams.loss_impl
        return impl if impl != "auto" else "chunked" if self.device.type == "cuda" else "plain"

    def step_loss(self, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        """(loss, ce) of a batch: the model and the loss of loss_impl (the plain loss on the model's logits while a
        callback needs the model eager: its hooks read the logits)."""
        impl = self.loss_impl
        if impl == "plain" or self._eager_for:
            return self.loss(self.model(x), y)
        model = self.model
        return losses.linear_cross_entropy(model.hidden(x), model.head_weight(), y, impl, self.hparams.z_loss,
                                           model.cfg.final_logit_softcap, self.hparams.loss_chunk_rows)

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> dict[str, Tensor]:
        """The loss to minimize (cross entropy, plus z-loss when on) and ``ce``, train/loss, which the callbacks
        read (Lightning hands them ``loss`` divided by the accumulated micro-batches, ``ce`` as given). The train
        metrics are read from the device only on the steps that log them, with the callbacks' values (DeviceReads):
        a step that logs nothing waits for nothing."""
        x, y = batch  # (B, T) each
        compiled = self.compiled_step_loss is not None and not self._eager_for
        loss, ce = (self.compiled_step_loss if compiled else self.step_loss)(x, y)
        trainer = self.trainer
        self._step_losses.append(torch.stack([ce.detach(), loss.detach()]))  # this optimizer step's micro-batches
        if step_ended(trainer, batch_idx):
            means, self._step_losses = torch.stack(self._step_losses).mean(0), []  # (2,): ce, loss
            if logging_step(trainer, batch_idx, stepped=False):
                self._put_train_metrics(trainer, means, x.numel())
        return {"loss": loss, "ce": ce.detach()}

    def on_train_start(self) -> None:
        self._first_batch = True

    def on_train_batch_start(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        """At a fit's first batch, the step Lightning logs at is this step's index: Lightning's own count after a
        restore depends on where the checkpoint was saved (in a step, at a validation, at the end of a fit)."""
        if self._first_batch:
            self._first_batch = False
            _compat.log_at_step(self.trainer, self.global_step)

    def _put_train_metrics(self, trainer: L.Trainer, means: Tensor, tokens: int) -> None:
        """This logging step's train metrics: its mean losses go to the step's one device read, then to the loggers
        at the step's index, and (on_train_batch_end) to the callback metrics."""
        step = trainer.global_step  # 0-based, the row of csv/metrics.csv
        host = {TRAIN_TOKENS: float(tokens_seen(step + 1, tokens, trainer.world_size, trainer.accumulate_grad_batches)),
                TRAIN_LR: self.optimizers().param_groups[0]["lr"], "epoch": float(trainer.current_epoch)}

        def receive(values) -> None:
            self._train_metrics.update({TRAIN_LOSS: float(values[0]), **host})
            if self.hparams.z_loss:
                self._train_metrics[TRAIN_LOSS_WITH_Z] = float(values[1])

        reads = DeviceReads.of(trainer)
        reads.put(means, receive)
        reads.after_read(lambda: log_metrics(trainer, self._train_metrics, step))

    def on_train_batch_end(self, outputs: dict, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        """The train metrics just read, as the trainer's callback metrics (host tensors: nothing is read again).
        The last step validates: stopping the fit there makes Lightning validate (its rule for a fit that stops
        early), also when the interval does not divide trainer.max_steps or a resumed run starts off its grid."""
        metrics, self._train_metrics = self._train_metrics, {}
        for name, value in metrics.items():
            if name != "epoch":
                self.log(name, torch.tensor(value), logger=False)
        max_steps = self.trainer.max_steps
        if max_steps and max_steps > 0 and self.global_step >= max_steps:
            self.trainer.should_stop = True

    def run_eagerly(self, requester: object, on: bool) -> None:
        """Run the model uncompiled while any requester wants it (a callback whose forward hooks a compiled model
        would never call); each callback turns only its own request off."""
        (self._eager_for.add if on else self._eager_for.discard)(id(requester))

    def _eval_step(self, batch: tuple[Tensor, Tensor]) -> None:
        x, y = batch
        nats = F.cross_entropy(self(x).float().flatten(0, 1), y.flatten(), reduction="none")  # (B*T,), once
        self.eval_ce.update(nats.mean(), weight=y.numel())
        self.eval_nans.update(nats.isnan().sum())
        if self.hparams.eval_windows_dir:
            self._window_losses.append(nats.detach().double().view(y.shape).mean(dim=1).cpu())  # (B,)
        if self.token_bytes is not None:
            if self.token_bytes.device != y.device:
                self.token_bytes = self.token_bytes.to(y.device)
            nbytes = self.token_bytes[y.flatten()]  # (B*T,) 0 for special tokens (end of document)
            self.eval_nats.update((nats.double() * (nbytes > 0)).sum())
            self.eval_bytes.update(nbytes.sum())

    def _eval_epoch_end(self, stage: str) -> None:
        """Metrics of one val/test pass over every evaluated token of every process:
        loss = mean cross entropy (nats/token); ppl = exp(loss);
        bpb = sum of the targets' nats / ln 2 / sum of the targets' UTF-8 bytes (targets that are special tokens,
        0 bytes, count in neither sum), comparable across tokenizers;
        bpc (char tokenizer only) = loss / ln 2, bits per character."""
        nan = self.eval_nans.compute() > 0  # summed over processes
        ce = torch.where(nan, torch.nan, self.eval_ce.compute())
        self.eval_ce.reset()
        self.eval_nans.reset()
        # ce is already the mean over every process (MeanMetric syncs); sync_dist only confirms it to Lightning
        self.log(eval_metric(stage, "loss"), ce, prog_bar=stage == "val", sync_dist=True)
        self.log(eval_metric(stage, "ppl"), ce.exp(), sync_dist=True)
        if self.bits_per_token:
            self.log(eval_metric(stage, "bpc"), ce * self.bits_per_token, sync_dist=True)
        if self.token_bytes is not None:
            nats, nbytes = self.eval_nats.compute(), self.eval_bytes.compute()  # summed over processes
            self.eval_nats.reset()
            self.eval_bytes.reset()
            bpb = torch.where(nan, torch.nan, nats / math.log(2) / nbytes.clamp(min=1))
            self.log(eval_metric(stage, "bpb"), bpb.float(), sync_dist=True)
        if self.hparams.eval_windows_dir:
            self._save_windows(stage)

    def _save_windows(self, stage: str) -> None:
        """Write this pass's per-window losses, every process's share in rank order (each holds a contiguous
        share of the windows), to <eval_windows_dir>/<stage>_windows.npy; nothing during the sanity check."""
        mine = torch.cat(self._window_losses) if self._window_losses else torch.zeros(0, dtype=torch.float64)
        self._window_losses = []
        trainer = self.trainer
        if trainer.sanity_checking:
            return
        shares = [mine]
        if trainer.world_size > 1 and torch.distributed.is_available() and torch.distributed.is_initialized():
            shares = [None] * trainer.world_size
            torch.distributed.all_gather_object(shares, mine)
        if trainer.is_global_zero:
            folder = Path(self.hparams.eval_windows_dir)
            folder.mkdir(parents=True, exist_ok=True)
            np.save(folder / f"{stage}_windows.npy", torch.cat(shares).numpy())

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        """Refuse a checkpoint of another model config (placement or eps differ without any state_dict error)."""
        check_model_config((checkpoint.get("hyper_parameters") or {}).get("model"), self.hparams["model"])

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        """Also record the W&B run id (a resumed run continues the same W&B run), minillm's version and commit."""
        wandb_id = next((lg.version for lg in self.trainer.loggers if isinstance(lg, WandbLogger)), None)
        checkpoint["minillm"] = {"wandb_run_id": wandb_id, **provenance()}

    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        self._eval_step(batch)

    def on_validation_epoch_end(self) -> None:
        self._eval_epoch_end("val")

    def test_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        self._eval_step(batch)

    def on_test_epoch_end(self) -> None:
        self._eval_epoch_end("test")

    def param_groups(self) -> list[dict]:
        """The optimizer's groups; an optimizer that splits off the hidden matrices (MuonWithAdamW) gets them first;
        under muP the hidden matrices' lr multiplier is the optimizer's (minillm.mup.hidden_lr_mult)."""
        kind = optimizer_kind(self.optimizer_factory)
        adjust = getattr(self.optimizer_factory, "keywords", {}).get("adjust_lr_fn")
        mult = mup.hidden_lr_mult(self.model.cfg, kind, adjust)
        return param_groups(self.model, self.hparams.decay_norms, self.hparams.decay_embeddings,
                            split_hidden=kind == "muon", hidden_lr_mult=mult)

    def optimizer_step(self, *args, **kwargs) -> None:
        """Lightning's optimizer step, then the model's renormalize_ (nGPT's matrices back on the unit sphere, on
        every process alike; nothing for the other models)."""
        super().optimizer_step(*args, **kwargs)
        self.model.renormalize_()

    def configure_gradient_clipping(self, optimizer: torch.optim.Optimizer, gradient_clip_val: float | None = None,
                                    gradient_clip_algorithm: str | None = None) -> None:
        """Lightning's clipping, except that Lightning refuses any optimizer that could unscale gradients in its
        step (fused AdamW) under mixed precision, even in bf16 where nothing is scaled: without a GradScaler the
        gradients are what they are, so they are clipped as Lightning clips them otherwise."""
        plugin = self.trainer.precision_plugin
        if gradient_clip_val and getattr(plugin, "scaler", None) is None and getattr(
                optimizer, "_step_supports_amp_scaling", False):
            Precision.clip_gradients(plugin, optimizer, gradient_clip_val,
                                     GradClipAlgorithmType(gradient_clip_algorithm or "norm"))
            return
        super().configure_gradient_clipping(optimizer, gradient_clip_val, gradient_clip_algorithm)

    def configure_optimizers(self):
        if self.optimizer_factory is None:
            raise ConfigError("LitLM needs an optimizer factory to train, "
                             "e.g. functools.partial(torch.optim.AdamW, lr=1e-3)")
        if is_bare_muon(getattr(self.optimizer_factory, "func", self.optimizer_factory)):
            raise ConfigError(BARE_MUON)
        scaled = getattr(self.trainer.precision_plugin, "scaler", None) is not None
        optimizer = with_fused(self.optimizer_factory, self.device, scaled)(self.param_groups())
        scale_group_lrs(optimizer)  # muP's per-group lrs (a no-op in standard parametrization)
        if self.scheduler_factory is None:
            return optimizer
        scheduler = self.scheduler_factory(optimizer)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}
