"""TextSample: generate text from a prompt at each validation and when training ends."""

from __future__ import annotations

import logging
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.loggers import WandbLogger
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import rank_zero_warn

from minillm.errors import check_bool, check_int, check_number, invalid
from minillm.training.callbacks.common import Observer, last_step
from minillm.training.callbacks.divergence import params_finite

log = logging.getLogger("minillm")


class TextSample(Observer):
    """Generate text from ``prompt`` after each validation (``every_validation``) and when training ends: logged
    (console and train.log), appended to samples.txt, and in W&B a ``samples`` table with a row per sample.
    ``prompt=None`` takes the corpus's own (``data.sample_prompt``: "ROMEO:" for Shakespeare; else the held-out
    split's first line), so a user's own data never gets a prompt from outside its vocabulary.
    The sampling has its own generator (``seed``) and runs in eval mode: training is not changed by it."""

    def __init__(self, prompt: str | None = None, max_new_tokens: int = 300, temperature: float = 0.8,
                 top_k: int | None = None, seed: int = 0, every_validation: bool = True):
        if prompt is not None and not isinstance(prompt, str):
            raise invalid("callbacks.text_sample.prompt", prompt, "a string or null")
        check_int("callbacks.text_sample.max_new_tokens", max_new_tokens, low=0)
        check_number("callbacks.text_sample.temperature", temperature, low=0.0)  # 0: greedy
        check_int("callbacks.text_sample.top_k", top_k, low=1, optional=True)
        check_int("callbacks.text_sample.seed", seed)
        check_bool("callbacks.text_sample.every_validation", every_validation)
        self.prompt, self.max_new_tokens = prompt, max_new_tokens
        self.temperature, self.top_k, self.seed = temperature, top_k, seed
        self.every_validation = every_validation
        self.rows: list[list] = []  # [step, text] of every sample so far (kept in checkpoints)
        self._ended = False  # the end-of-training sample of this fit was made (or found made)

    def state_dict(self) -> dict:
        return {"rows": [list(r) for r in self.rows]}

    def load_state_dict(self, state: dict) -> None:
        self.rows = [list(r) for r in state.get("rows", [])]

    def prompt_ids(self, tokenizer, prompt: str | None = None) -> list[int]:
        """The prompt's token ids; characters the tokenizer does not know are dropped with a warning."""
        prompt = self.prompt if prompt is None else prompt
        try:
            return [int(i) for i in tokenizer.encode(prompt)]
        except ValueError:
            ids = []
            for ch in prompt:
                try:
                    ids += [int(i) for i in tokenizer.encode(ch)]
                except ValueError:
                    pass
            rank_zero_warn(f"text_sample: prompt {prompt!r} has characters outside the vocabulary; "
                           f"sampling from the known ones ({len(ids)} tokens)")
            return ids or [0]

    def sample(self, pl_module: L.LightningModule, tokenizer, prompt: str | None = None) -> str:
        ids = torch.tensor([self.prompt_ids(tokenizer, prompt)], dtype=torch.long, device=pl_module.device)
        gen = torch.Generator(device=pl_module.device).manual_seed(self.seed)
        was_training = pl_module.training
        pl_module.eval()
        out = pl_module.model.generate(ids, self.max_new_tokens, self.temperature, self.top_k, gen)
        pl_module.train(was_training)
        return tokenizer.decode(out[0].tolist())

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.every_validation and not trainer.sanity_checking and trainer.state.fn == TrainerFn.FITTING:
            self._record(trainer, pl_module)

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._ended = False

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._end_sample(trainer, pl_module)

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._end_sample(trainer, pl_module)  # a run resumed at its last step trains no step: no on_train_end

    def _end_sample(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """The sample at the end of training, once per fit (unless the last validation made it)."""
        if self._ended:
            return
        self._ended = True
        if not self.rows or self.rows[-1][0] != trainer.global_step:
            self._record(trainer, pl_module)

    def _record(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Every process generates (a sharded model needs all of them in each forward); rank 0 reports."""
        tokenizer = getattr(trainer.datamodule, "tokenizer", None)
        if tokenizer is None or self.max_new_tokens <= 0:
            return
        finite = trainer.strategy.reduce_boolean_decision(params_finite(pl_module), all=True)
        if not finite:  # a diverged model cannot be sampled (NaN probabilities)
            if trainer.is_global_zero:
                log.info(f"no sample after {trainer.global_step} steps: non-finite weights")
            return
        prompt = self.prompt if self.prompt is not None else getattr(trainer.datamodule, "sample_prompt", "\n")
        text = self.sample(pl_module, tokenizer, prompt)
        self.rows.append([trainer.global_step, text])
        if not trainer.is_global_zero:
            return
        log.info(f"sample after {trainer.global_step} steps:\n{text}\n---")
        Path(trainer.default_root_dir).mkdir(parents=True, exist_ok=True)
        with open(Path(trainer.default_root_dir) / "samples.txt", "a") as f:
            f.write(f"step {trainer.global_step}:\n{text}\n\n")
        for logger in trainer.loggers:
            if isinstance(logger, WandbLogger):  # the whole table again: W&B shows its latest version
                logger.log_text("samples", columns=["step", "text"], data=self.rows, step=last_step(trainer))
