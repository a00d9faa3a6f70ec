"""The LightningModule (minillm/training/lit_module.py): the loss and z-loss, eval metrics over tokens, weight-decay
groups, learning-rate schedules."""

from __future__ import annotations

import math

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from helpers import V, compose_cfg, randn
from hydra.utils import instantiate

from minillm.model import ModelConfig
from minillm.training.lit_module import LitLM
from minillm.training.optim import lr_lambda
from minillm.training.run.build import model_config


def test_z_loss_is_ce_plus_coef_mean_log_z_squared_and_pulls_log_z_to_zero():
    coef = 1e-2
    module = LitLM(ModelConfig(vocab_size=V, dim=16, n_layers=1, n_heads=2, max_seq_len=8), z_loss=coef)
    offsets = torch.tensor([6.0, -12.0]).repeat(5).view(2, 5, 1)  # rows with log Z > 0 and < 0
    logits, y = randn(2, 5, V, scale=2.0) + offsets, torch.randint(0, V, (2, 5))
    log_z = torch.logsumexp(logits, -1)  # (2, 5)
    assert (log_z > 1).any() and (log_z < -1).any()
    loss, ce = module.loss(logits, y)
    torch.testing.assert_close(ce, F.cross_entropy(logits.flatten(0, 1), y.flatten()))
    torch.testing.assert_close(loss, ce + coef * log_z.pow(2).mean())
    plain = LitLM(ModelConfig(vocab_size=V, dim=16, n_layers=1, n_heads=2, max_seq_len=8))
    plain_loss, plain_ce = plain.loss(logits, y)
    assert plain_loss is plain_ce  # z_loss=0: the cross entropy alone
    # shifting every logit of a row leaves ce unchanged: along that direction only the z-term acts, with
    # slope 2 * coef * log Z / N, so gradient descent drives log Z towards 0 from either side
    shift = torch.zeros(2, 5, 1, requires_grad=True)
    (g,) = torch.autograd.grad(module.loss(logits + shift, y)[0], shift)
    torch.testing.assert_close(g[..., 0], 2 * coef * log_z / log_z.numel())
    for _ in range(30):
        (g,) = torch.autograd.grad(module.loss(logits + shift, y)[0], shift)
        shift = (shift - 100.0 * g).detach().requires_grad_()
    after_loss, after_ce = module.loss(logits + shift, y)
    assert torch.logsumexp(logits + shift, -1).abs().max() < 1e-2 * log_z.abs().max()
    torch.testing.assert_close(after_ce, ce, atol=1e-4, rtol=1e-4)
    assert after_loss < loss


def test_lr_schedules():
    cos = lr_lambda("cosine", warmup_steps=10, total_steps=110, min_lr_ratio=0.1)
    assert cos(0) == pytest.approx(0.1) and cos(9) == pytest.approx(1.0)
    assert cos(60) == pytest.approx(0.55) and cos(110) == pytest.approx(0.1) and cos(500) == pytest.approx(0.1)
    assert lr_lambda("constant", 0, 100)(57) == 1.0
    inv = lr_lambda("inverse_sqrt", 16, 100)
    assert inv(15) == 1.0 and inv(63) == pytest.approx(0.5)
    assert lr_lambda("linear", 0, 100, 0.0)(50) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="scheduler.kind='step' is invalid"):
        lr_lambda("step", 0, 10)


def test_weight_decay_groups(tmp_path, corpus):
    cfg = compose_cfg(tmp_path, corpus, "norm=layernorm")
    dm = instantiate(cfg.data)
    dm.prepare_data()
    dm.setup("fit")
    module = instantiate(cfg.module, _partial_=True)(model=model_config(cfg, dm.vocab_size),
                                                     optimizer=instantiate(cfg.optimizer))
    decay, no_decay = module.param_groups()
    names = {id(p): n for n, p in module.model.named_parameters()}
    assert all(p.ndim == 2 and not names[id(p)].startswith("tok_emb") for p in decay["params"])
    assert {names[id(p)] for p in no_decay["params"]} >= {"tok_emb.weight", "norm.weight", "norm.bias"}
    module.hparams.decay_norms = module.hparams.decay_embeddings = True
    assert len(module.param_groups()[1]["params"]) == 0


def test_eval_loss_is_the_mean_over_tokens_and_ppl_its_exp(tmp_path, corpus):
    cfg = compose_cfg(tmp_path, corpus, "data.val_windows=13", "data.batch_size=5")  # batches of 5, 5, 3
    dm = instantiate(cfg.data)
    dm.prepare_data()
    dm.setup("fit")
    torch.manual_seed(0)
    module = instantiate(cfg.module, _partial_=True)(model=model_config(cfg, dm.vocab_size))
    trainer = L.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_checkpointing=False,
                        enable_model_summary=False)
    out = trainer.validate(module, datamodule=dm, verbose=False)[0]
    with torch.no_grad():
        total = sum(F.cross_entropy(module(x).flatten(0, 1), y.flatten(), reduction="sum")
                    for x, y in dm.val_dataloader())
    mean = float(total) / (13 * dm.seq_len)
    assert out["val/loss"] == pytest.approx(mean, rel=1e-5)
    assert out["val/ppl"] == pytest.approx(math.exp(mean), rel=1e-5)  # exp of the mean, not a mean of exps
    assert out["val/bpc"] == pytest.approx(mean / math.log(2), rel=1e-5)



def test_a_nan_loss_in_one_window_makes_every_eval_metric_nan(tmp_path, corpus):
    """torchmetrics leaves NaNs out of its means and sums: the pass's loss was the other windows' mean, and its bpb
    finite. A pass that met a NaN reports NaN for loss, ppl, bpc and bpb."""
    cfg = compose_cfg(tmp_path, corpus, "data.val_windows=13", "data.batch_size=5")
    dm = instantiate(cfg.data)
    dm.prepare_data()
    dm.setup("fit")
    module = instantiate(cfg.module, _partial_=True)(model=model_config(cfg, dm.vocab_size))
    forward = module.model.forward
    module.model.forward = lambda idx: forward(idx).index_put((torch.tensor([0]),), torch.tensor(math.nan))
    trainer = L.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_checkpointing=False,
                        enable_model_summary=False)
    out = trainer.validate(module, datamodule=dm, verbose=False)[0]  # each batch's first window is NaN
    assert {k for k, v in out.items() if math.isnan(v)} == {"val/loss", "val/ppl", "val/bpc", "val/bpb"}, out


def test_per_window_losses_are_saved_in_order_and_average_to_the_loss(tmp_path, corpus):
    """eval_windows_dir: val_windows.npy holds each evaluated window's mean loss in the windows' order (their mean
    is val/loss), test_windows.npy the test pass's; nothing is written during the sanity check or without it."""
    import numpy as np

    cfg = compose_cfg(tmp_path, corpus, "data.val_windows=13", "data.batch_size=5")
    dm = instantiate(cfg.data)
    dm.prepare_data()
    dm.setup("fit")
    torch.manual_seed(0)
    folder = tmp_path / "windows"
    module = instantiate(cfg.module, _partial_=True)(model=model_config(cfg, dm.vocab_size),
                                                     optimizer=instantiate(cfg.optimizer), eval_windows_dir=str(folder))
    trainer = L.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_checkpointing=False,
                        enable_model_summary=False, default_root_dir=tmp_path)
    out = trainer.validate(module, datamodule=dm, verbose=False)[0]
    saved = np.load(folder / "val_windows.npy")
    with torch.no_grad():
        each = [float(F.cross_entropy(module(x).flatten(0, 1), y.flatten())) for x, y in
                ((x[None], y[None]) for x, y in dm.val_set)]
    assert saved.shape == (13,) and saved == pytest.approx(each, rel=1e-5)
    assert saved.mean() == pytest.approx(out["val/loss"], rel=1e-6)
    trainer.test(module, datamodule=dm, verbose=False)
    assert len(np.load(folder / "test_windows.npy")) == len(dm.test_set)
    (folder / "val_windows.npy").unlink()
    module = instantiate(cfg.module, _partial_=True)(model=model_config(cfg, dm.vocab_size),
                                                     optimizer=instantiate(cfg.optimizer), eval_windows_dir=str(folder))
    trainer = L.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_checkpointing=False,
                        enable_model_summary=False, default_root_dir=tmp_path, max_steps=1, limit_train_batches=1,
                        num_sanity_val_steps=1, limit_val_batches=1, check_val_every_n_epoch=2)
    trainer.fit(module, datamodule=dm)  # only the sanity check validates
    assert not (folder / "val_windows.npy").exists()
    plain = instantiate(cfg.module, _partial_=True)(model=model_config(cfg, dm.vocab_size), eval_windows_dir=None)
    L.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_checkpointing=False,
              enable_model_summary=False, default_root_dir=tmp_path / "plain").validate(plain, datamodule=dm,
                                                                                         verbose=False)
    assert not list(tmp_path.rglob("plain/*.npy"))
