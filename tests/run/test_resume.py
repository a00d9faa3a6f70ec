"""Resuming (minillm/training/run/resume.py): in the run's own folder, with the same settings, exactly (BatchNorm
statistics,
bf16, the GradScaler), and evaluating a checkpoint with train=false."""


from __future__ import annotations

import functools
import json
import shutil
import signal
from pathlib import Path

import lightning as L
import pytest
import torch
from helpers import (
    FAST,
    RESUMABLE,
    LossRecorder,
    compose_cfg,
    logged,
    read_rows,
    run_fast,
)
from lightning.pytorch.plugins import MixedPrecision

import minillm.training.train as train_script
from minillm.errors import ConfigError
from minillm.model import ModelConfig
from minillm.training.checkpointing import (
    AtomicCheckpointIO,
    read_checkpoint_header,
)
from minillm.training.data import TextDataModule
from minillm.training.lit_module import LitLM

CORPUS_CHARS = 8000  # the corpus fixture's size for this module


def test_interrupted_run_resumes_in_its_own_folder_with_ckpt_path_auto(tmp_path, corpus, full_run):
    """SIGTERM at step 4, then the same command with ckpt_path=auto: the run continues in its folder, which
    ends with one summary of the whole run and one metrics.csv with every step once, as the full run's."""
    signal_at = ["+callbacks.signal._target_=helpers.SignalAt",
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
    assert summary["steady_tokens_per_s"] > 0
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
    from minillm.training.checkpointing import find_resume_checkpoint

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
    full = run_fast(tmp_path / "full", corpus, *common, *every3)
    ckpt = tmp_path / "every3" / "epoch=0-step=3.ckpt"
    buffers = read_checkpoint_header(ckpt)["state_dict"]
    assert {"running_mean", "running_var"} <= {k.rsplit(".", 1)[-1] for k in buffers}
    resumed = run_fast(tmp_path / "resumed", corpus, *common, f"ckpt_path='{ckpt}'")
    a, b = logged(read_rows(full), "train/loss"), logged(read_rows(resumed), "train/loss")
    assert sorted(b) == [3, 4, 5] and all(a[s] == b[s] for s in b), (a, b)
    assert logged(read_rows(full), "val/loss")[5] == logged(read_rows(resumed), "val/loss")[5]


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
    again = run_fast(tmp_path, corpus)
    for key in ("train/loss", "val/loss"):
        assert logged(read_rows(full_run), key) == logged(read_rows(again), key), key
