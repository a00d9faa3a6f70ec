"""Checkpoint files (minillm/training/checkpointing.py): atomic saves, unreadable and foreign files, another model
config."""


from __future__ import annotations

import io
import re
from pathlib import Path

import pytest
import torch
from helpers import (
    FAST,
    compose_cfg,
)
from hydra.utils import instantiate

import minillm.training.train as train_script
from minillm.errors import ConfigError
from minillm.model import ModelConfig
from minillm.training.checkpointing import (
    AtomicCheckpointIO,
    CheckpointError,
    check_model_config,
    model_config_diff,
    read_checkpoint_header,
)
from minillm.training.lit_module import LitLM
from minillm.training.run.build import build_trainer, model_config
from minillm.training.run.resume import Resume

CORPUS_CHARS = 8000  # the corpus fixture's size for this module


def test_trainer_config_uses_the_atomic_checkpoint_io(tmp_path, corpus):
    trainer = build_trainer(compose_cfg(tmp_path, corpus), [], [])
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
    message = f"checkpoint {re.escape(repr(str(path)))} is truncated: its zip archive has no end"
    with pytest.raises(ConfigError, match=message):
        train_script.train(compose_cfg(tmp_path, corpus, *FAST, f"ckpt_path={path}"))


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
