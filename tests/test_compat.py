"""minillm/_compat.py: each private API minillm relies on, checked against the installed library, so an upgrade
that changes one fails here by name instead of turning a feature into a silent no-op."""

from __future__ import annotations

import signal
import subprocess
import sys

import lightning as L
import pytest
import torch
from lightning.pytorch.utilities.exceptions import SIGTERMException

from minillm import _compat


class Tiny(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)

    def training_step(self, batch, batch_idx):
        return self.layer(batch[0]).pow(2).mean()

    def validation_step(self, batch, batch_idx):
        pass

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def loader():
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(64, 2)), batch_size=4)


class Probe(L.Callback):
    def __init__(self, stop_at: int | None = None):
        self.due, self.validated, self.stop_at = {}, [], stop_at

    def on_train_batch_end(self, trainer, *args):
        self.due[trainer.global_step] = _compat.validation_due(trainer)
        if trainer.global_step == self.stop_at:
            _compat.request_stop(trainer)

    def on_validation_end(self, trainer, *args):
        if not trainer.sanity_checking:
            self.validated.append(trainer.global_step)


def trainer(callbacks, **kw) -> L.Trainer:
    return L.Trainer(accelerator="cpu", max_steps=7, val_check_interval=3, check_val_every_n_epoch=None,
                     logger=False, enable_checkpointing=False, enable_progress_bar=False,
                     enable_model_summary=False, num_sanity_val_steps=0, callbacks=callbacks, **kw)


def test_validation_due_is_lightnings_own_decision():
    probe = Probe()
    trainer([probe]).fit(Tiny(), loader(), loader())
    assert probe.validated == [3, 6]
    assert [s for s, due in probe.due.items() if due] == probe.validated


def test_request_stop_ends_fit_after_the_current_step_with_lightnings_exception():
    probe = Probe(stop_at=2)
    t = trainer([probe])
    with pytest.raises(SIGTERMException):
        t.fit(Tiny(), loader(), loader())
    assert t.global_step == 2


def test_interrupt_runs_every_callbacks_exception_hook():
    seen = []

    class Hook(L.Callback):
        def on_exception(self, trainer, pl_module, exception):
            seen.append(type(exception).__name__)

    t = trainer([Hook()])
    t.fit(Tiny(), loader(), loader())
    _compat.interrupt(t, SIGTERMException(128 + signal.SIGTERM))
    assert seen == ["SIGTERMException"]


def test_checkpoint_layout_the_preemption_fixes_rely_on(tmp_path):
    t = trainer([])
    t.fit(Tiny(), loader(), loader())
    t.save_checkpoint(tmp_path / "x.ckpt")
    ckpt = torch.load(tmp_path / "x.ckpt", weights_only=False)
    _compat.log_at_step(t, 7)
    assert t.fit_loop.epoch_loop.on_save_checkpoint()["_batches_that_stepped"] == 7
    progress = ckpt["loops"]["fit_loop"]["epoch_loop.batch_progress"]
    progress["total"]["ready"] += 1
    _compat.as_saved_at_the_end_of_the_step(ckpt)
    assert progress["total"]["ready"] == progress["total"]["started"]


def test_hydras_command_line_parser_is_the_one_hydra_main_uses():
    args = _compat.hydra_args_parser().parse_args(["-m", "seed=1,2", "--cfg", "job"])
    assert args.multirun and args.overrides == ["seed=1,2"] and args.cfg == "job"


def test_forked_worker_is_recognized_by_the_launcher():
    assert not _compat.in_forked_worker(trainer([]))
    t = L.Trainer(accelerator="cpu", devices=2, strategy="ddp_fork", logger=False)
    assert _compat.in_forked_worker(t)


def test_functional_all_reduce_is_differentiable(tmp_path):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        x = torch.arange(3.0, requires_grad=True)
        y = _compat.all_reduce_sum_differentiable(x * 2)
        torch.testing.assert_close(y, torch.tensor([0.0, 2.0, 4.0]))
        y.sum().backward()
        torch.testing.assert_close(x.grad, torch.full((3,), 2.0))
    finally:
        dist.destroy_process_group()


def test_grad_scaler_keeps_its_scale_as_a_tensor():
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
    assert _compat.grad_scaler_scale(scaler) is None  # before its first use
    scaler.scale(torch.ones(()))
    scale = _compat.grad_scaler_scale(scaler)
    assert isinstance(scale, torch.Tensor) and float(scale) == scaler.get_scale() == 2.0**10


def test_lightning_still_has_what_minillm_overrides_or_reads(tmp_path):
    from lightning.fabric.loggers.csv_logs import _ExperimentWriter as FabricWriter
    from lightning.pytorch.callbacks import RichProgressBar
    from lightning.pytorch.loggers import CSVLogger, WandbLogger
    from lightning.pytorch.loggers.csv_logs import ExperimentWriter

    assert callable(vars(RichProgressBar).get("_get_train_description"))  # label_training_by_steps
    assert callable(FabricWriter._check_log_dir_exists)  # keep_existing_log_dir
    assert callable(ExperimentWriter._rewrite_with_new_header)  # rewrite_csv_header
    logger = WandbLogger(offline=True, save_dir=str(tmp_path))
    assert isinstance(_compat.wandb_init_kwargs(logger), dict) and _compat.logger_experiment(logger) is None
    assert _compat.wandb_offline(logger)
    _compat.wandb_go_offline(logger)
    assert _compat.wandb_init_kwargs(logger)["mode"] == "offline"
    csv = CSVLogger(str(tmp_path))
    assert _compat.logger_fs(csv).isdir(str(tmp_path)) and _compat.logger_experiment(csv) is None


def test_a_selection_of_rows_is_seen_in_a_dataset():
    import datasets

    ds = datasets.Dataset.from_dict({"text": ["a", "b", "c"]})
    assert not _compat.selects_rows(ds) and _compat.selects_rows(ds.select([2, 0]))


def test_the_eager_stance_imports_no_compiler_unless_one_is_loaded():
    code = ("import sys; from minillm import _compat\n"
            "with _compat.eager_stance(): pass\n"
            "assert 'torch._dynamo' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_lm_evals_command_line_parses_and_executes():
    pytest.importorskip("lm_eval")
    cli = _compat.lm_eval_cli()
    assert callable(cli.parse_args) and callable(cli.execute)


def test_lightning_precisions_are_the_values_lightning_accepts():
    precisions = _compat.lightning_precisions()
    assert {"32-true", "32", "bf16-mixed", "bf16", "16-mixed", "16", "bf16-true", "16-true", "64-true", "64"} == \
        set(precisions)
