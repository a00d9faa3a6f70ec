"""DivergenceGuard (minillm/training/callbacks/divergence.py) and the checkpoint callback that stops saving after a
divergence
(checkpoint.py)."""


from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from helpers import ROOT, compose_cfg, logged, read_rows

import minillm.training.train as train_script
from minillm.analysis.report import write_report
from minillm.training.callbacks import Checkpoint, DivergenceGuard, RunTotals, params_finite
from minillm.training.callbacks.divergence import weights_norm
from minillm.training.callbacks.reads import DeviceReads


def test_divergence_guard_loss_ceiling_and_checkpoint_freeze():
    totals = RunTotals()
    trainer = SimpleNamespace(global_step=0, should_stop=False, world_size=1, callbacks=[totals], loggers=[])
    module = torch.nn.Linear(2, 2)
    guard, reads = DivergenceGuard(max_loss=6.0, patience=3), DeviceReads.of(trainer)
    for step, loss in enumerate([5.0, 9.0, 9.0, 4.0, 9.0, 9.0, 9.0, 9.0]):
        trainer.global_step = step
        guard.on_train_batch_start(trainer, module, None, step)
        guard.on_train_batch_end(trainer, module, {"loss": torch.tensor(loss)}, None, step)
        reads.read(trainer)  # every step logs here: each is judged at its end
        if guard.diverged:
            break
    assert (guard.diverged, guard.step, trainer.should_stop) == (True, 6, True)
    assert "above 6 for 3 consecutive steps" in guard.reason
    assert totals.values() == {"stopped_early": True, "diverged_step": 6, "diverged_reason": guard.reason}
    assert Checkpoint()._diverged(trainer)  # minillm's ModelCheckpoint writes nothing from now on
    guard = DivergenceGuard(max_loss=None, max_loss_factor=None)
    guard.on_train_batch_end(trainer, module, {"loss": torch.tensor(1e30)}, None, 0)
    reads.read(trainer)
    assert not guard.diverged  # no ceiling: only non-finite values stop
    guard.on_train_batch_end(trainer, module, {"loss": torch.tensor(float("inf"))}, None, 1)
    assert not guard.diverged  # read at the next logging step, then judged
    reads.read(trainer)
    assert guard.diverged and "non-finite train loss" in guard.reason


def test_forced_nan_ends_the_run_as_diverged_and_keeps_the_last_good_checkpoint(tmp_path, corpus):
    cfg = compose_cfg(tmp_path, corpus, "trainer.max_steps=8", "trainer.val_check_interval=2",
                      "+callbacks.poison={_target_:helpers.PoisonGrad,at_step:3}")
    metrics = train_script.train(cfg)  # returns normally
    run = Path(cfg.paths.output_dir)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["diverged"] is True and summary["stopped_early"] is True
    assert summary["status"] == "diverged"
    assert summary["diverged_step"] == 3 and "non-finite weights" in summary["diverged_reason"]
    vals = logged(read_rows(run), "val/loss")  # the validation after step 2 is at index 1, as in the CSV
    assert summary["steps"] == 4 and summary["best_val_step"] == 1 == min(vals, key=vals.get)
    assert summary["best_val_loss"] == pytest.approx(vals[1])
    assert summary["nonfinite_grad_steps"] == 1 and "test/loss" in metrics
    assert summary["failed"] is True
    assert logged(read_rows(run), "stab/diverged") == {3: 1.0}
    for name in ("last.ckpt", "best.ckpt"):  # written at step 2, never overwritten by the NaN weights
        ckpt = torch.load(run / "checkpoints" / name, map_location="cpu", weights_only=False)
        assert ckpt["global_step"] == 2
        assert all(t.isfinite().all() for t in ckpt["state_dict"].values() if t.is_floating_point())
    samples = (run / "samples.txt").read_text()  # the step-2 validation's sample; none from NaN weights, no crash
    assert re.findall(r"^step (\d+):$", samples, flags=re.M) == ["2"]


@pytest.mark.slow  # long (end to end); `-m slow` runs it
def test_multirun_with_a_diverging_member_finishes_every_run_and_reports(tmp_path, corpus):
    sweep = tmp_path / "sweep"
    cmd = [sys.executable, str(ROOT / "train.py"), "-m", "model=tiny", "data=files", f"data.files=[{corpus}]",
           "data.batch_size=4", "data.val_windows=4", "trainer=cpu", "trainer.max_steps=8",
           "trainer.val_check_interval=4", "scheduler.warmup_steps=1", "logger=csv", "callbacks=stability",
           "callbacks.divergence.patience=2", "callbacks.divergence.every_n_steps=1", "test=false",
           f"paths.cache_dir={tmp_path / 'cache'}",
           f"hydra.sweep.dir={sweep}", "optimizer.lr=1e-2,1e3"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    summaries = [json.loads(p.read_text()) for p in sorted(sweep.glob("*/summary.json"))]
    summaries = {s["lr"]: s for s in summaries}
    assert sorted(summaries) == [1e-2, 1e3]
    assert summaries[1e3]["diverged"] is True and summaries[1e3]["stopped_early"] is True
    assert summaries[1e3]["steps"] < 8 and summaries[1e3]["diverged_reason"]
    assert summaries[1e-2]["diverged"] is False and summaries[1e-2]["steps"] == 8  # the next run went on

    report = write_report(sweep).read_text()
    assert "| rmsnorm | pre | 1e+03 |" in report and "| 1.00 |" in report and "| 0.00 |" in report
    assert all((sweep / "report" / p).stat().st_size > 0 for p in ("loss_by_norm.png", "lr_sensitivity.png"))


def test_weight_check_is_exact_and_reads_the_device_once_a_step_with_the_loss(monkeypatch):
    """Non-finite weights are found at the step they appear (a NaN, an inf), a huge but finite weight whose square
    overflows the fused norm is not a divergence, and a step's loss and weight check cost no host read until the
    read of a logging step, which takes them in one transfer."""
    module = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
    assert params_finite(module)
    reads = []
    for name in ("tolist", "item", "__float__", "__bool__"):
        original = getattr(torch.Tensor, name)
        monkeypatch.setattr(torch.Tensor, name, lambda self, *a, _o=original, _n=name, **k: (reads.append(_n),
                                                                                                _o(self, *a, **k))[1])
    totals = RunTotals()
    trainer = SimpleNamespace(global_step=0, should_stop=False, world_size=1, callbacks=[totals], loggers=[])
    guard, device = DivergenceGuard(), DeviceReads.of(trainer)
    for step, (where, value) in enumerate([(None, None), (module[1].weight, 1e30), (module[0].bias, float("nan"))]):
        trainer.global_step = step
        if where is not None:
            with torch.no_grad():
                where.view(-1)[0] = value
        guard.on_train_batch_start(trainer, module, None, step)
        reads.clear()
        guard.on_train_batch_end(trainer, module, {"loss": torch.tensor(2.0)}, None, step)
        assert reads == []  # nothing read during the step
        device.read(trainer)
        if step == 0:
            assert reads == ["tolist"]  # the loss and the weights' norm together
        if step == 1:  # finite, though its square overflows the fused norm: confirmed element-wise, not diverged
            assert not math.isfinite(float(weights_norm(module))) and not guard.diverged
    assert (guard.step, guard.reason) == (2, "non-finite weights after the optimizer step")


def test_the_steps_are_judged_at_the_next_logging_step_and_stop_the_run_there(tmp_path, corpus):
    """A NaN at step 3 (logging every 5 steps): no step reads the device before step 4, whose read judges steps 0-4
    in order; the run stops there, summary.json names step 3. With every_n_steps=1 it stops at step 3 itself."""
    for every, stopped in ((None, 5), (1, 4)):
        cfg = compose_cfg(tmp_path / str(every), corpus, "trainer.max_steps=12", "trainer.val_check_interval=12",
                          "trainer.log_every_n_steps=5", f"callbacks.divergence.every_n_steps={every or 'null'}",
                          "+callbacks.poison={_target_:helpers.PoisonGrad,at_step:3}")
        train_script.train(cfg)
        summary = json.loads((Path(cfg.paths.output_dir) / "summary.json").read_text())
        assert (summary["status"], summary["diverged_step"], summary["steps"]) == ("diverged", 3, stopped)


def test_a_step_checkpoint_after_an_unread_divergence_is_not_written(tmp_path, corpus):
    """Step checkpoints every 2 steps, logging every 10, a NaN at step 3: the step-4 checkpoint reads the pending
    steps first, finds the divergence and is not written; step 2's is kept."""
    cfg = compose_cfg(tmp_path, corpus, "trainer.max_steps=8", "trainer.val_check_interval=8",
                      "trainer.log_every_n_steps=10", "callbacks.step_checkpoints.every_n_train_steps=2",
                      "+callbacks.poison={_target_:helpers.PoisonGrad,at_step:3}")
    train_script.train(cfg)
    run = Path(cfg.paths.output_dir)
    assert json.loads((run / "summary.json").read_text())["diverged_step"] == 3
    assert sorted(p.name for p in (run / "checkpoints").glob("step-*.ckpt")) == ["step-2.ckpt"]


def test_the_loss_ceiling_reads_the_models_loss_under_gradient_accumulation(tmp_path, corpus):
    """Lightning hands on_train_batch_end the loss divided by accumulate_grad_batches; the guard multiplies it back,
    so a ceiling under the real loss (~ln V at the start) stops the run with 4 micro-batches a step too (before:
    it saw a quarter of the loss and trained on)."""
    cfg = compose_cfg(tmp_path, corpus, "trainer.accumulate_grad_batches=4", "callbacks.divergence.max_loss=2.0",
                      "callbacks.divergence.patience=1", "trainer.max_steps=3")
    train_script.train(cfg)
    summary = json.loads((Path(cfg.paths.output_dir) / "summary.json").read_text())
    assert summary["status"] == "diverged" and "train loss above 2 for 1 consecutive" in summary["diverged_reason"]


def test_the_loss_ceiling_reads_train_loss_not_the_z_loss_objective(tmp_path, corpus):
    """The ceiling is on train/loss (the cross entropy): a large z-loss coefficient (1.0, so the objective at
    init is ~ln V + (ln V)^2) does not trip a ceiling that the cross entropy (~ln V) stays under."""
    cfg = compose_cfg(tmp_path, corpus, "module.z_loss=1.0", "callbacks.divergence.max_loss=5.0",
                      "callbacks.divergence.patience=1", "trainer.max_steps=2")
    train_script.train(cfg)
    summary = json.loads((Path(cfg.paths.output_dir) / "summary.json").read_text())
    assert summary["status"] == "completed", summary.get("diverged_reason")


def test_patience_counts_optimizer_steps_under_gradient_accumulation(tmp_path, corpus):
    """With 4 micro-batches a step the ceiling's patience counts steps, each judged on its micro-batches' mean loss:
    patience 2 stops the run at step 1 (before: at step 0, after two micro-batches)."""
    cfg = compose_cfg(tmp_path, corpus, "trainer.accumulate_grad_batches=4", "callbacks.divergence.max_loss=2.0",
                      "callbacks.divergence.patience=2", "trainer.max_steps=3")
    train_script.train(cfg)
    summary = json.loads((Path(cfg.paths.output_dir) / "summary.json").read_text())
    assert (summary["status"], summary["diverged_step"]) == ("diverged", 1), summary["diverged_reason"]
    assert "for 2 consecutive steps" in summary["diverged_reason"]
