"""Reliability: exact resume (preemption, BatchNorm, bf16), determinism, atomic and checked checkpoints, W&B
fallback (minillm/checkpointing.py, minillm/loggers.py). docs/reliability.md maps each guarantee to its test."""

from __future__ import annotations

import functools
import io
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import warnings
from pathlib import Path

import lightning as L
import pytest
import torch
import wandb
from helpers import ROOT, TINY, compose_cfg, logged, read_rows
from hydra.utils import instantiate
from lightning.pytorch.plugins import MixedPrecision

import minillm.train as train_script
from minillm.checkpointing import (
    AtomicCheckpointIO,
    CheckpointError,
    check_model_config,
    model_config_diff,
    read_checkpoint_header,
)
from minillm.data import TextDataModule
from minillm.errors import ConfigError
from minillm.lit_module import LitLM
from minillm.loggers import SafeWandbLogger
from minillm.model import ModelConfig
from minillm.run.build import model_config
from minillm.run.resume import Resume

# 6 steps, validation after steps 3 and 6, no callbacks but the preemption one, no test pass
FAST = ["callbacks=preemption", "test=false", "trainer.max_steps=6", "trainer.val_check_interval=3",
        "scheduler.total_steps=6", "+trainer.enable_progress_bar=false",
        "+trainer.enable_checkpointing=false"]
RESUMABLE = ["callbacks=default", "++trainer.enable_checkpointing=true", "++trainer.enable_progress_bar=true",
             "logger=csv"]  # callbacks and logs as a user's run has them
MARKER = "reliability-test: waiting for a signal at step"
CORPUS_CHARS = 8000


def run(tmp_path: Path, corpus: Path, *overrides: str) -> Path:
    cfg = compose_cfg(tmp_path, corpus, *FAST, *overrides)
    train_script.train(cfg)
    return Path(cfg.paths.output_dir)


@pytest.fixture(scope="module")
def full_run(tmp_path_factory, corpus) -> Path:
    """The uninterrupted run that every resumed run must reproduce."""
    return run(tmp_path_factory.mktemp("full"), corpus)


class SignalAt(L.Callback):
    """Sends `signum` to this process after a training step, during a validation, or (``during_validation="end"``)
    as the validation ends, after PreemptionCheckpoint's own hook (in-process preemption); under DDP only in the
    process of rank `rank` (the others must follow it)."""

    def __init__(self, signum: int, step: int, during_validation: bool | str = False, rank: int = 0):
        self.signum, self.step, self.during_validation, self.rank = signum, step, during_validation, rank

    def on_train_batch_end(self, trainer, *args) -> None:
        if not self.during_validation and trainer.global_step == self.step and trainer.global_rank == self.rank:
            os.kill(os.getpid(), self.signum)

    def on_validation_end(self, trainer, pl_module) -> None:
        if (self.during_validation == "end" and trainer.global_step == self.step and not trainer.sanity_checking
                and trainer.global_rank == self.rank):
            os.kill(os.getpid(), self.signum)

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, *args) -> None:
        if (self.during_validation is True and trainer.global_step == self.step and batch_idx == 0
                and trainer.global_rank == self.rank):
            os.kill(os.getpid(), self.signum)


class WaitForSignalAt(L.Callback):
    """After training step `step`, prints MARKER and waits (at most 60 s) for a signal sent from outside."""

    def __init__(self, step: int):
        self.step = step

    def on_train_batch_end(self, trainer, *args) -> None:
        if trainer.global_step == self.step:
            print(f"{MARKER} {self.step}", flush=True)
            deadline = time.time() + 60
            while not trainer.received_sigterm and time.time() < deadline:
                time.sleep(0.02)


# --- preemption and exact resume ----------------------------------------------------------------------


@pytest.mark.parametrize("signum", [signal.SIGTERM, pytest.param(signal.SIGINT, marks=pytest.mark.slow)])
def test_signal_to_train_py_saves_a_checkpoint_that_resumes_exactly(signum, tmp_path, corpus, full_run):
    """A real `python train.py` gets SIGTERM / Ctrl-C from outside after step 2: it saves preempted.ckpt, logs
    how to resume and exits 128 + signal; resuming continues at step 2 with the uninterrupted run's losses."""
    run_dir = tmp_path / "first"
    cmd = [sys.executable, str(ROOT / "train.py"), *TINY, f"data.files=[{corpus}]", *FAST,
           "+callbacks.wait._target_=test_reliability.WaitForSignalAt", "+callbacks.wait.step=2",
           f"hydra.run.dir={run_dir}", f"paths.cache_dir={tmp_path / 'cache'}"]
    path = os.pathsep.join([str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path,
                            env=env, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # see sigint
    out = []
    try:
        for line in proc.stdout:
            out.append(line)
            if MARKER in line:
                proc.send_signal(signum)
                break
        out.extend(proc.stdout)
        rc = proc.wait(timeout=120)
    finally:
        proc.kill()
        proc.stdout.close()
    text = "".join(out)
    ckpt = run_dir / "checkpoints" / "preempted.ckpt"
    assert rc == 128 + signum, text[-3000:]
    assert f"{signum.name}: stopped at step 2" in text and f"ckpt_path={ckpt}" in text, text[-3000:]
    assert "Traceback" not in text
    assert read_checkpoint_header(ckpt)["global_step"] == 2

    resumed = logged(read_rows(run(tmp_path / "resumed", corpus, f"ckpt_path='{ckpt}'")), "train/loss")
    full = logged(read_rows(full_run), "train/loss")
    assert sorted(resumed) == [2, 3, 4, 5]
    assert all(full[s] == resumed[s] for s in resumed), (full, resumed)


@pytest.fixture
def sigint():
    """Sets SIGINT's handler for one test (Python's default_int_handler unless the test sets another) and
    restores the one before: pytest started as a background job of a script begins with SIGINT ignored."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


def test_first_ctrl_c_stops_after_the_step_with_a_checkpoint(tmp_path, corpus, sigint):
    """In-process Ctrl-C: the same path as SIGTERM (the subprocess test above resumes from it)."""
    cfg = compose_cfg(tmp_path, corpus, *FAST, "+callbacks.signal._target_=test_reliability.SignalAt",
                      f"+callbacks.signal.signum={int(signal.SIGINT)}", "+callbacks.signal.step=2")
    with pytest.raises(SystemExit) as exit_info:
        train_script.train(cfg)
    assert exit_info.value.code == 128 + signal.SIGINT
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # a later Ctrl-C is a plain one
    ckpt = Path(cfg.paths.output_dir) / "checkpoints" / "preempted.ckpt"
    assert read_checkpoint_header(ckpt)["global_step"] == 2


def test_a_run_started_with_ctrl_c_ignored_keeps_ignoring_it(tmp_path, corpus, sigint):
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    cfg = compose_cfg(tmp_path, corpus, *FAST, "+callbacks.signal._target_=test_reliability.SignalAt",
                      f"+callbacks.signal.signum={int(signal.SIGINT)}", "+callbacks.signal.step=2")
    train_script.train(cfg)  # no SystemExit
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    assert max(logged(read_rows(cfg.paths.output_dir), "train/loss")) == 5  # all 6 steps
    assert not (Path(cfg.paths.output_dir) / "checkpoints" / "preempted.ckpt").exists()


@pytest.mark.parametrize("step, during_validation, val_batches", [
    (3, True, 2),  # signal during a validation: held until it ends, then the run stops
    (3, False, 1),  # signal as the step before a one-batch validation ends: stops after the validation
    (3, False, 2),  # ... before a longer one (Lightning alone would cut it after its first batch and lose it)
    (3, "end", 1),  # signal as the validation ends, after this callback's hook: stops now, not a validation later
])
def test_preemption_around_validation_resumes_exactly(step, during_validation, val_batches, tmp_path, corpus,
                                                      full_run):
    val = f"data.val_windows={8 * val_batches}"  # 8 windows per batch
    cfg = compose_cfg(tmp_path / "first", corpus, *FAST, val,
                      "+callbacks.signal._target_=test_reliability.SignalAt",
                      f"+callbacks.signal.signum={int(signal.SIGTERM)}", f"+callbacks.signal.step={step}",
                      f"+callbacks.signal.during_validation={during_validation}")
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    with pytest.raises(SystemExit) as exit_info:
        train_script.train(cfg)
    assert exit_info.value.code == 128 + signal.SIGTERM
    assert {s: signal.getsignal(s) for s in before} == before  # our handlers are gone again
    ckpt = Path(cfg.paths.output_dir) / "checkpoints" / "preempted.ckpt"
    assert read_checkpoint_header(ckpt)["global_step"] == step

    resumed_dir = run(tmp_path / "resumed", corpus, f"ckpt_path={ckpt}", val)
    resumed = logged(read_rows(resumed_dir), "train/loss")
    full = logged(read_rows(full_run if val_batches == 1 else run(tmp_path / "full", corpus, val)), "train/loss")
    assert sorted(resumed) == list(range(step, 6)), resumed  # logged at the same steps, not one later
    assert all(full[s] == resumed[s] for s in resumed), (full, resumed)
    # no validation is lost: the interrupted and the resumed segment together validated at steps 3 and 6
    vals = {**logged(read_rows(cfg.paths.output_dir), "val/loss"), **logged(read_rows(resumed_dir), "val/loss")}
    assert sorted(vals) == [2, 5], vals


def test_interrupted_run_resumes_in_its_own_folder_with_ckpt_path_auto(tmp_path, corpus, full_run):
    """SIGTERM at step 4, then the same command with ckpt_path=auto: the run continues in its folder, which
    ends with one summary of the whole run and one metrics.csv with every step once, as the full run's."""
    signal_at = ["+callbacks.signal._target_=test_reliability.SignalAt",
                 f"+callbacks.signal.signum={int(signal.SIGTERM)}", "+callbacks.signal.step=4"]
    cfg = compose_cfg(tmp_path, corpus, *FAST, *RESUMABLE, *signal_at)
    with pytest.raises(SystemExit):
        train_script.train(cfg)
    folder = Path(cfg.paths.output_dir)
    assert json.loads((folder / "summary.json").read_text())["status"] == "preempted"
    assert json.loads((folder / "summary.json").read_text())["failed"] is None  # not an outcome yet
    with pytest.raises(ConfigError, match="already holds a run.*ckpt_path=auto"):
        train_script.train(compose_cfg(tmp_path, corpus, *FAST, *RESUMABLE))
    train_script.train(compose_cfg(tmp_path, corpus, *FAST, *RESUMABLE, "ckpt_path=auto"))
    rows = read_rows(folder)
    steps = [int(r["step"]) for r in rows if r.get("train/loss")]
    assert steps == list(range(6)), steps  # every step once, in order: no rows of the stopped segment repeat
    full = logged(read_rows(full_run), "train/loss")
    assert logged(rows, "train/loss") == full
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["status"] in ("completed", "diverged") and summary["steps"] == 6  # one run, whole
    shutil.rmtree(folder / "checkpoints")  # a run that kept none: auto cannot resume it, and says so
    with pytest.raises(ConfigError, match=r"^ckpt_path=auto: the run directory .* holds a run "
                                                       r"\(summary.json\) but no checkpoint to resume"):
        train_script.train(compose_cfg(tmp_path, corpus, *FAST, *RESUMABLE, "ckpt_path=auto"))
    assert isinstance(summary["failed"], bool)


def test_resume_refuses_changed_training_settings(tmp_path, corpus):
    """A resumed run keeps the settings it was trained with: one error listing each one that differs."""
    cfg = compose_cfg(tmp_path / "first", corpus, *FAST, "trainer.max_steps=3", "scheduler.total_steps=6",
                      *RESUMABLE)
    train_script.train(cfg)
    ckpt = Path(cfg.paths.output_dir) / "checkpoints" / "last.ckpt"
    changed = compose_cfg(tmp_path / "second", corpus, *FAST, f"ckpt_path={ckpt}", "optimizer.lr=1e-2",
                          "data.batch_size=4", "seed=3")
    with pytest.raises(ConfigError) as err:
        train_script.train(changed)
    message = str(err.value)
    for diff in ("optimizer.lr: checkpoint 0.003, config 0.01", "data.batch_size: checkpoint 8, config 4",
                 "seed: checkpoint 1337, config 3"):
        assert diff in message, message
    assert "\n" not in message


def test_a_constant_lr_run_may_be_extended_and_a_cosine_one_may_not(tmp_path, corpus):
    """max_steps is the cosine schedule's length (scheduler.total_steps): changing it on resume is refused; a
    constant schedule does not read it, so the run may go on for more steps."""
    base = [a for a in FAST if not a.startswith("scheduler.total_steps")] + RESUMABLE
    for kind in ("cosine", "constant"):
        cfg = compose_cfg(tmp_path / kind, corpus, *base, f"scheduler={kind}", "trainer.max_steps=3")
        train_script.train(cfg)
        ckpt = Path(cfg.paths.output_dir) / "checkpoints" / "last.ckpt"
        longer = compose_cfg(tmp_path / kind, corpus, *base, f"scheduler={kind}", "trainer.max_steps=6",
                             f"ckpt_path={ckpt}")
        if kind == "cosine":
            with pytest.raises(ConfigError, match=r"scheduler.total_steps: checkpoint 3, config 6"):
                train_script.train(longer)
        else:
            train_script.train(longer)
            summary = json.loads((Path(cfg.paths.output_dir) / "summary.json").read_text())
            assert summary["steps"] == 6


def test_ckpt_path_auto_takes_the_newest_valid_checkpoint(tmp_path):
    from minillm.checkpointing import find_resume_checkpoint

    ckpts = tmp_path / "checkpoints"
    ckpts.mkdir()
    assert find_resume_checkpoint(tmp_path) is None
    torch.save({"state_dict": {}, "global_step": 4}, ckpts / "last.ckpt")
    torch.save({"state_dict": {}, "global_step": 7}, ckpts / "preempted.ckpt")
    assert find_resume_checkpoint(tmp_path) == ckpts / "preempted.ckpt"
    (ckpts / "preempted.ckpt").write_bytes((ckpts / "preempted.ckpt").read_bytes()[:50])  # a save cut short
    assert find_resume_checkpoint(tmp_path) == ckpts / "last.ckpt"


def test_train_false_evaluates_the_checkpoints_weights(tmp_path, corpus):
    """train=false ckpt_path=<ckpt>: the held-out loss of those weights, recorded in evaluation.json; the
    training's summary.json stays as the training wrote it; test_weights=best evaluates best.ckpt after a fit.
    (Through train.py the evaluation goes to <run>/evaluations/<id>/: tests/test_journey.py.)"""
    cfg = compose_cfg(tmp_path / "run", corpus, "trainer.max_steps=6", "trainer.val_check_interval=3",
                      "test=true", "test_weights=best")
    fitted = train_script.train(cfg)
    folder = Path(cfg.paths.output_dir)
    record = (folder / "summary.json").read_text()
    assert json.loads(record)["test_weights"].endswith("best.ckpt")
    best = train_script.train(compose_cfg(tmp_path / "run", corpus, "train=false",
                                          f"ckpt_path={folder / 'checkpoints' / 'best.ckpt'}"))
    assert best["test/loss"] == fitted["test/loss"]  # test_weights=best evaluated best.ckpt
    last = train_script.train(compose_cfg(tmp_path / "run", corpus, "train=false",
                                          f"ckpt_path={folder / 'checkpoints' / 'last.ckpt'}"))
    evaluation = json.loads((folder / "evaluation.json").read_text())  # the last evaluation, and of which weights
    assert evaluation["test_loss"] == pytest.approx(last["test/loss"])
    assert evaluation["test_weights"].endswith("last.ckpt")
    assert (folder / "summary.json").read_text() == record  # the training's record is untouched
    with pytest.raises(ConfigError, match=r"^train=false evaluates a checkpoint: give ckpt_path="):
        train_script.train(compose_cfg(tmp_path / "fresh", corpus, "train=false"))  # random weights: refused


def test_batchnorm_bf16_mixed_resume_is_exact(tmp_path, corpus):
    """BatchNorm running statistics and the bf16 autocast run are restored: a run resumed from its step-3
    checkpoint logs the same train losses, and the same val loss (eval mode uses the running statistics)."""
    common = ["norm=batchnorm", "trainer.precision=bf16-mixed"]
    every3 = ["+callbacks.every3._target_=lightning.pytorch.callbacks.ModelCheckpoint",
              f"+callbacks.every3.dirpath={tmp_path / 'every3'}", "+callbacks.every3.every_n_train_steps=3",
              "+callbacks.every3.save_top_k=-1", "trainer.enable_checkpointing=true"]
    full = run(tmp_path / "full", corpus, *common, *every3)
    ckpt = tmp_path / "every3" / "epoch=0-step=3.ckpt"
    buffers = read_checkpoint_header(ckpt)["state_dict"]
    assert {"running_mean", "running_var"} <= {k.rsplit(".", 1)[-1] for k in buffers}
    resumed = run(tmp_path / "resumed", corpus, *common, f"ckpt_path='{ckpt}'")
    a, b = logged(read_rows(full), "train/loss"), logged(read_rows(resumed), "train/loss")
    assert sorted(b) == [3, 4, 5] and all(a[s] == b[s] for s in b), (a, b)
    assert logged(read_rows(full), "val/loss")[5] == logged(read_rows(resumed), "val/loss")[5]


class LossRecorder(L.Callback):
    def __init__(self):
        self.losses: dict[int, float] = {}

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.losses[trainer.global_step] = float(outputs["loss"])


def test_gradscaler_state_is_restored_on_resume(tmp_path, corpus):
    """fp16 autocast with a GradScaler (an explicit plugin: on CPU trainer.precision=16-mixed runs bf16): the
    loss scale, lowered by the overflowing first steps, comes back from the checkpoint; the losses match."""
    def fit(max_steps: int, ckpt_path: Path | None = None, save: bool = False):
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0**40)  # overflows at first: the scale drops
        recorder = LossRecorder()
        every3 = L.pytorch.callbacks.ModelCheckpoint(tmp_path / "ckpt", every_n_train_steps=3, save_top_k=-1)
        trainer = L.Trainer(accelerator="cpu", max_steps=max_steps, limit_val_batches=0, logger=False,
                            plugins=[MixedPrecision("16-mixed", "cpu", scaler=scaler), AtomicCheckpointIO()],
                            callbacks=[recorder, every3] if save else [recorder], enable_checkpointing=save,
                            enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path)
        L.seed_everything(0)
        dm = TextDataModule(source="files", files=[str(corpus)], seq_len=16, batch_size=4,
                            cache_dir=str(tmp_path / "cache"))
        dm.prepare_data()
        dm.setup("fit")
        model = ModelConfig(vocab_size=dm.vocab_size, dim=16, n_layers=1, n_heads=2, max_seq_len=16)
        module = LitLM(model, optimizer=functools.partial(torch.optim.AdamW, lr=1e-2))
        trainer.fit(module, datamodule=dm, ckpt_path=ckpt_path)
        return recorder.losses, scaler.get_scale()

    full, full_scale = fit(6, save=True)
    ckpt = tmp_path / "ckpt" / "epoch=0-step=3.ckpt"
    saved_scale = read_checkpoint_header(ckpt)["MixedPrecision"]["scale"]
    assert saved_scale < 2.0**40
    resumed, resumed_scale = fit(6, ckpt_path=ckpt)
    assert sorted(resumed) == [4, 5, 6] and all(full[s] == resumed[s] for s in resumed), (full, resumed)
    assert resumed_scale == full_scale


def test_same_seed_and_config_give_identical_curves(tmp_path, corpus, full_run):
    again = run(tmp_path, corpus)
    for key in ("train/loss", "val/loss"):
        assert logged(read_rows(full_run), key) == logged(read_rows(again), key), key


# --- checkpoint files ---------------------------------------------------------------------------------


def test_trainer_config_uses_the_atomic_checkpoint_io(tmp_path, corpus):
    trainer = instantiate(compose_cfg(tmp_path, corpus).trainer, logger=False)
    assert isinstance(trainer.strategy.checkpoint_io, AtomicCheckpointIO)


def test_crash_during_save_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    ckpt_io = AtomicCheckpointIO()
    path = tmp_path / "checkpoints" / "last.ckpt"
    ckpt_io.save_checkpoint({"state_dict": {"w": torch.ones(3)}, "global_step": 1}, path)
    real_save = torch.save

    def half_then_crash(obj, f, *args, **kwargs):
        buffer = io.BytesIO()
        real_save(obj, buffer, *args, **kwargs)
        f.write(buffer.getvalue()[: len(buffer.getvalue()) // 2])
        raise OSError("No space left on device")

    monkeypatch.setattr(torch, "save", half_then_crash)
    with pytest.raises(OSError, match="No space left"):
        ckpt_io.save_checkpoint({"state_dict": {"w": torch.zeros(3)}, "global_step": 2}, path)
    monkeypatch.undo()
    ckpt = ckpt_io.load_checkpoint(path)
    assert ckpt["global_step"] == 1 and torch.equal(ckpt["state_dict"]["w"], torch.ones(3))
    assert [p.name for p in path.parent.iterdir()] == ["last.ckpt"]  # the temp file is gone
    ckpt_io.save_checkpoint({"state_dict": {"w": torch.zeros(3)}, "global_step": 2}, path)  # and saving works
    assert ckpt_io.load_checkpoint(path)["global_step"] == 2


def _bad_checkpoint(kind: str, path: Path) -> Path:
    if kind == "truncated":
        buffer = io.BytesIO()
        torch.save({"state_dict": {"w": torch.ones(1000)}, "hyper_parameters": {}}, buffer)
        path.write_bytes(buffer.getvalue()[:2000])
    elif kind == "text":
        path.write_text("not a checkpoint\n")
    elif kind == "empty":
        path.write_bytes(b"")
    elif kind == "bare_state_dict":  # a torch file, but not a Lightning checkpoint
        torch.save({"w": torch.ones(2)}, path)
    return path


@pytest.mark.parametrize("kind", ["truncated", "text", "empty", "bare_state_dict"])
def test_unreadable_checkpoint_is_a_clear_error_naming_the_file(kind, tmp_path):
    path = _bad_checkpoint(kind, tmp_path / f"{kind}.ckpt")
    for load in (AtomicCheckpointIO().load_checkpoint, read_checkpoint_header):
        with pytest.raises(CheckpointError, match=re.escape(repr(str(path)))):
            load(path)
    with pytest.raises(FileNotFoundError, match="missing.ckpt"):
        AtomicCheckpointIO().load_checkpoint(tmp_path / "missing.ckpt")


def test_resume_from_a_truncated_checkpoint_is_a_config_error(tmp_path, corpus):
    path = _bad_checkpoint("truncated", tmp_path / "last.ckpt")
    message = f"checkpoint {re.escape(repr(str(path)))} cannot be read"
    with pytest.raises(ConfigError, match=message):
        train_script.train(compose_cfg(tmp_path, corpus, *FAST, f"ckpt_path={path}"))


# --- resuming with another model config ---------------------------------------------------------------


def test_model_config_diff_lists_fields_and_allows_fused_rmsnorm():
    saved = ModelConfig(vocab_size=65, dim=32, n_heads=2, norm="rmsnorm").to_dict()
    assert model_config_diff(saved, {**saved, "norm": "fused_rmsnorm"}) == []
    check_model_config(saved, {**saved, "norm": "fused_rmsnorm"})
    layers = [{"norm": "rmsnorm"}, {"norm": "layernorm"}]
    assert model_config_diff({**saved, "layers": layers}, {**saved, "layers": [{"norm": "fused_rmsnorm"},
                                                                               {"norm": "layernorm"}]}) == []
    other = {**saved, "norm": "layernorm", "placement": "post", "dim": 64, "vocab_size": 256}
    assert model_config_diff(saved, other) == [
        "dim: checkpoint 32, config 64", "norm: checkpoint 'rmsnorm', config 'layernorm'",
        "placement: checkpoint 'pre', config 'post'", "vocab_size: checkpoint 65, config 256"]
    with pytest.raises(CheckpointError, match="no hyper_parameters"):
        check_model_config(None, saved)
    older = {k: v for k, v in saved.items() if k != "depth_scaled_init"}  # written before the field existed
    assert model_config_diff(older, saved) == []  # its default is what the old code did
    assert model_config_diff(older, {**saved, "depth_scaled_init": False}) == [
        "depth_scaled_init: checkpoint True, config False"]


def test_resume_with_another_model_config_is_one_config_error(tmp_path, corpus):
    cfg = compose_cfg(tmp_path, corpus, *FAST, "norm=layernorm", "placement=post")
    dm = instantiate(cfg.data)
    dm.prepare_data()
    dm.setup("fit")
    saved = model_config(cfg, dm.vocab_size).to_dict()
    ckpt = tmp_path / "other.ckpt"
    other = {**saved, "norm": "rmsnorm", "dim": 64}
    torch.save({"state_dict": {}, "hyper_parameters": {"model": other}}, ckpt)
    with pytest.raises(ConfigError) as err:
        train_script.train(compose_cfg(tmp_path, corpus, *FAST, "norm=layernorm", "placement=post",
                                       f"ckpt_path='{ckpt}'"))
    message = str(err.value)
    assert "\n" not in message and str(ckpt) in message
    assert "dim: checkpoint 64, config 32" in message
    assert "norm: checkpoint 'rmsnorm', config 'layernorm'" in message
    assert not (Path(cfg.paths.output_dir) / "csv").exists()  # failed before any training


def test_sharded_checkpoint_directory_is_checked_through_its_metadata(tmp_path):
    """FSDP's sharded checkpoints are directories; their meta.pt holds the hyper_parameters."""
    model = ModelConfig(vocab_size=16, dim=16, n_layers=1, n_heads=2).to_dict()
    (tmp_path / "sharded.ckpt").mkdir()
    torch.save({"hyper_parameters": {"model": model}}, tmp_path / "sharded.ckpt" / "meta.pt")
    resume = Resume(str(tmp_path / "sharded.ckpt"), read_checkpoint_header(tmp_path / "sharded.ckpt"))
    resume.check_model(model)
    with pytest.raises(CheckpointError, match="dim: checkpoint 16, config 32"):
        resume.check_model({**model, "dim": 32})


def test_lightning_module_refuses_another_model_but_takes_fused_rmsnorm():
    """LitLM.on_load_checkpoint (Lightning calls it before loading the weights) guards trainer.fit(ckpt_path)
    outside train.py too, also where the state_dicts would match (placement, eps)."""
    model = ModelConfig(vocab_size=16, dim=16, n_layers=1, n_heads=2, max_seq_len=8, norm="rmsnorm")
    saved = LitLM(model)
    fused = {**model.to_dict(), "norm": "fused_rmsnorm"}
    hparams = {**dict(saved.hparams), "model": fused}
    checkpoint = {"state_dict": saved.state_dict(), "hyper_parameters": hparams}
    module = LitLM(model)
    module.on_load_checkpoint(checkpoint)  # a fused-RMSNorm checkpoint into a plain RMSNorm model
    module.load_state_dict(checkpoint["state_dict"])  # strict: the same keys and shapes
    for name, value in (("placement", "peri"), ("norm_eps", 1e-6), ("norm", "layernorm")):
        with pytest.raises(CheckpointError, match=f"{name}: checkpoint"):
            LitLM(ModelConfig(**{**model.to_dict(), name: value})).on_load_checkpoint(checkpoint)


# --- W&B ----------------------------------------------------------------------------------------------


@pytest.fixture
def unreachable_wandb(tmp_path, monkeypatch):
    """WANDB_MODE=online against a closed loopback port; no real key, config or netrc is read."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once the socket is
    monkeypatch.setenv("WANDB_MODE", "online")
    monkeypatch.setenv("WANDB_BASE_URL", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("WANDB_API_KEY", "f" * 40)
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    wandb.finish()  # a run an earlier test left open (Lightning's finalize does not finish it) ...
    wandb.teardown()  # ... then a fresh setup: wandb reads the environment once per process setup
    yield
    wandb.finish()
    wandb.teardown()


def test_training_runs_to_the_end_when_wandb_server_is_unreachable(unreachable_wandb, tmp_path, corpus):
    cfg = compose_cfg(tmp_path, corpus, *FAST, "logger=wandb", "logger.wandb.init_timeout=2")
    start = time.time()
    with pytest.warns(UserWarning, match="W&B could not start online .*logging offline instead"):
        metrics = train_script.train(cfg)
    assert time.time() - start < 60
    assert "train/loss" in metrics
    runs = list((Path(cfg.paths.output_dir) / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and any(runs[0].glob("*.wandb"))


def test_wandb_without_api_key_falls_back_to_offline(unreachable_wandb, tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_API_KEY")
    logger = SafeWandbLogger(project="minillm", save_dir=str(tmp_path), offline=False, init_timeout=5)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        logger.log_metrics({"train/loss": 1.0}, step=0)
    messages = [str(w.message) for w in caught]
    assert any("could not start online (UsageError: No API key" in m for m in messages), messages
    assert logger._offline
    logger.finalize("success")
    assert list((tmp_path / "wandb").glob("offline-run-*"))


def test_each_logger_in_one_process_gets_its_own_run(tmp_path, monkeypatch):
    """The jobs of an in-process Hydra sweep (plain WandbLogger logs the second into the first one's run)."""
    monkeypatch.delenv("WANDB_MODE", raising=False)
    ids = []
    for job in ("a", "b"):
        logger = SafeWandbLogger(project="minillm", name=job, save_dir=str(tmp_path / job))
        logger.log_metrics({"train/loss": 1.0}, step=0)
        ids.append(logger.experiment.id)
        assert "WANDB_MODE" not in os.environ  # WandbLogger's WANDB_MODE=dryrun does not leak to the next job
    wandb.finish()
    assert ids[0] != ids[1]
    assert list((tmp_path / "b" / "wandb").glob("offline-run-*"))
