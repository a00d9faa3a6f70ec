"""Every use of a library's private API, in one place, each with a test in tests/test_compat.py that fails
loudly when the library changes (instead of a guard that would turn an upgrade into a silent no-op).

Lightning, torch, W&B and datasets are pinned to tested ranges in pyproject.toml; these are what an upgrade must
re-check. No Lightning import at module level: the model's code (minillm/distributed.py, generation.py) uses
this module too.
"""

from __future__ import annotations

import sys
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

if TYPE_CHECKING:
    import lightning as L


def all_reduce_sum_differentiable(t: Tensor) -> Tensor:
    """Sum over the default process group with an autograd rule (backward: the sum of the gradients) that
    torch.compile can trace: torch's functional collectives (private module, torch >= 2.10)."""
    import torch.distributed as dist
    from torch.distributed import _functional_collectives as funcol

    return funcol.wait_tensor(funcol.all_reduce(t.contiguous(), "sum", dist.group.WORLD))


def eager_stance() -> AbstractContextManager:
    """Run compiled modules eagerly inside the block (``torch.compiler.set_stance``). Only a process that imported
    the compiler (``torch._dynamo`` in sys.modules; importing it costs ~2 s) can hold a compiled module, so
    elsewhere this is a no-op that imports nothing."""
    if "torch._dynamo" not in sys.modules:
        return nullcontext()
    return torch.compiler.set_stance("force_eager")


def grad_scaler_scale(scaler: torch.amp.GradScaler) -> Tensor | None:
    """The GradScaler's current scale as the tensor it keeps on the device (``get_scale()`` would copy it to
    the host, a device sync every step); None before its first step."""
    return scaler._scale


def validation_due(trainer: L.Trainer) -> bool:
    """Whether Lightning will run a validation after the training batch that just ended (its own rule:
    ``_should_check_val_fx``, which also covers epoch ends, time intervals and early stops)."""
    return bool(trainer.fit_loop.epoch_loop._should_check_val_fx(trainer.fit_loop._data_fetcher))


def request_stop(trainer: L.Trainer) -> None:
    """Set the flag Lightning's SIGTERM handler sets: its loops stop after the current step (raising
    SIGTERMException). Set directly, because another library may own the SIGTERM handler (submitit does)."""
    trainer._signal_connector.received_sigterm = True


def in_forked_worker(trainer: L.Trainer) -> bool:
    """Whether this process is one of those Lightning's fork/spawn launcher started (trainer=ddp_cpu): there the
    fit runs without Lightning's exception handling (no on_exception hooks; a SIGTERMException would end the
    process with code 0 while the launching process waits for its results forever)."""
    from lightning.pytorch.strategies.launchers.multiprocessing import _MultiProcessingLauncher

    return isinstance(trainer.strategy.launcher, _MultiProcessingLauncher)


def interrupt(trainer: L.Trainer, exception: BaseException) -> None:
    """What Lightning does with an exception raised during fit (every callback's on_exception, the
    datamodule's and the strategy's, loggers finalized), for the processes where it does not (see above)."""
    from lightning.pytorch.trainer.call import _interrupt

    _interrupt(trainer, exception)


def as_saved_at_the_end_of_the_step(checkpoint: dict) -> None:
    """A checkpoint saved when the next step has fetched its batch but not started: record that batch as never
    fetched, so Lightning resumes it as a checkpoint saved when the previous step ended (it resets only the
    current epoch's counters on resume, and a total count one ahead would shift its validation schedule)."""
    progress = checkpoint["loops"]["fit_loop"]["epoch_loop.batch_progress"]
    for counts in (progress["total"], progress["current"]):
        counts["ready"] = counts["started"]


def dump_checkpoint(trainer: L.Trainer) -> dict:
    """The checkpoint Lightning would save now, as a dict (``_checkpoint_connector.dump_checkpoint``): model, loops,
    optimizers, schedulers, callbacks' and the data module's states. Its tensors are the live ones (not copies)."""
    return trainer._checkpoint_connector.dump_checkpoint(weights_only=False)


def log_at_step(trainer: L.Trainer, step: int) -> None:
    """Make ``step`` the step index Lightning logs the current training step at (its count of the batches that
    stepped an optimizer, ``_batches_that_stepped``)."""
    trainer.fit_loop.epoch_loop._batches_that_stepped = step


def lightning_precisions() -> tuple[str, ...]:
    """The ``trainer.precision`` values Lightning accepts (its private ``_PRECISION_INPUT`` type), Transformer
    Engine's left out (minillm does not install it)."""
    import typing

    from lightning.fabric.connector import _PRECISION_INPUT

    values = [str(v) for literal in typing.get_args(_PRECISION_INPUT) for v in typing.get_args(literal)]
    values = list(dict.fromkeys(v for v in values if not v.startswith("transformer-engine")))
    return tuple(sorted(values, key=lambda v: (v != "32-true", "-" not in v)))  # the default, full names, aliases


# --- loggers (minillm/training/loggers.py) ---------------------------------------------------------------------------


def logger_experiment(logger: Any) -> Any:
    """The run object a Lightning logger has made so far (``_experiment``), None before its first use."""
    return logger._experiment


def set_logger_experiment(logger: Any, experiment: Any) -> None:
    logger._experiment = experiment


def logger_fs(obj: Any) -> Any:
    """The fsspec file system of Lightning's CSVLogger or of its ExperimentWriter (``_fs``)."""
    return obj._fs


def keep_existing_log_dir(writer_cls: type) -> type:
    """Class decorator for a subclass of Lightning's CSV ExperimentWriter: it keeps a log folder that holds a
    metrics.csv (Lightning's ``_check_log_dir_exists`` warns and deletes it)."""
    writer_cls._check_log_dir_exists = lambda self: None
    return writer_cls


def rewrite_csv_header(writer: Any, keys: list[str]) -> None:
    """Lightning's ExperimentWriter rewrites its metrics.csv with a wider header (``_rewrite_with_new_header``)."""
    writer._rewrite_with_new_header(keys)


def wandb_init_kwargs(logger: Any) -> dict:
    """The keyword arguments WandbLogger will pass to ``wandb.init`` (``_wandb_init``; changes take effect)."""
    return logger._wandb_init


def wandb_offline(logger: Any) -> bool:
    return bool(logger._offline)


def wandb_go_offline(logger: Any) -> None:
    """Make WandbLogger start its run again, offline (after an online start failed)."""
    logger._offline = True
    logger._experiment = None
    logger._wandb_init["mode"] = "offline"


# --- progress bar (minillm/training/callbacks/progress.py) -----------------------------------------------------------


def label_training_by_steps(bar_cls: type) -> type:
    """Class decorator for a subclass of Lightning's RichProgressBar: with max_epochs=-1 (training by steps) the
    training line says "Epoch N", not "Epoch N/-2" (Lightning's ``_get_train_description``)."""
    original = bar_cls._get_train_description

    def description(self: Any, current_epoch: int) -> str:
        if self.trainer.max_epochs is not None and self.trainer.max_epochs < 0:
            return f"{f'Epoch {current_epoch}':{len(self.validation_description)}}"
        return original(self, current_epoch)

    bar_cls._get_train_description = description
    return bar_cls


# --- Hydra (minillm/training/train.py) -------------------------------------------------------------------------------


def hydra_args_parser() -> Any:
    """The argparse parser ``hydra.main`` parses the command line with (``hydra._internal.utils.get_args_parser``)."""
    from hydra._internal.utils import get_args_parser

    return get_args_parser()


# --- lm-evaluation-harness (minillm/tools/harness.py) -------------------------------------------------------------


def lm_eval_cli() -> Any:
    """lm_eval's command line (``lm_eval._cli.HarnessCLI``, what its ``lm-eval`` command runs): ``parse_args()``
    reads sys.argv, ``execute(args)`` runs it."""
    from lm_eval._cli import HarnessCLI

    return HarnessCLI()


# --- datasets (minillm/training/data/token_files.py) --------------------------------------------------------------


def selects_rows(dataset: Any) -> bool:
    """A `datasets.Dataset` that is a selection of its Arrow files' rows (an indices mapping, ``_indices``)."""
    return dataset._indices is not None
