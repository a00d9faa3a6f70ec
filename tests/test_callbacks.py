"""Stability instrumentation, divergence as a result, run summary (minillm/callbacks/)."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
import warnings
from datetime import datetime, timedelta
from pathlib import Path
from types import SimpleNamespace

import lightning as L
import pytest
import torch
from helpers import EAGER_NORMS, ROOT, compose_cfg, logged, read_rows
from hydra.utils import instantiate
from lightning.pytorch.loggers.logger import Logger
from lightning.pytorch.plugins import MixedPrecision
from omegaconf import open_dict

import minillm.train as train_script
from minillm.callbacks import (
    ActivationProbe,
    Checkpoint,
    DivergenceGuard,
    LossSpikeDetector,
    RunTotals,
    StabilityMonitor,
    bn_sampling_null,
    bn_stat_distance,
    spike_scores,
)
from minillm.model import PLACEMENTS, ModelConfig, Transformer, apply_rope
from minillm.norms import BatchNorm
from minillm.report import write_report
from minillm.run.build import model_config

SUMMARY_FIELDS = {  # config
    "name", "norm", "placement", "lr", "warmup_steps", "precision", "precision_used", "seed", "dim",
    "n_layers", "n_heads", "n_kv_heads", "qk_norm", "vocab_size", "max_seq_len", "batch_size", "seq_len",
    "max_steps", "grad_clip", "n_params", "loss_init", "unigram_loss",
} | {  # results
    "status", "steps", "final_val_loss", "best_val_loss", "best_val_step", "test_loss", "test_weights", "diverged",
    "diverged_step", "diverged_reason", "stopped_early", "failed", "max_grad_norm", "nonfinite_grad_steps",
    "spike_count", "max_attn_logit", "max_abs_h", "max_log_z", "skipped_steps", "tokens", "tokens_per_s",
    "train_time_s", "wall_time_s", "started_at", "written_at",
}


class MemoryLogger(Logger):
    """Keeps log_metrics calls in memory."""

    def __init__(self):
        super().__init__()
        self.rows: list[tuple[int, dict]] = []

    @property
    def name(self) -> str:
        return "memory"

    @property
    def version(self) -> int:
        return 0

    def log_metrics(self, metrics, step=None) -> None:
        self.rows.append((step, dict(metrics)))

    def log_hyperparams(self, params, *args, **kwargs) -> None:
        pass

    def series(self, key: str) -> dict[int, float]:
        return {step: m[key] for step, m in self.rows if key in m}


class PoisonGrad(L.Callback):
    """Sets a gradient to ``value`` after the backward of step ``at_step`` (a forced NaN / overflow)."""

    def __init__(self, at_step: int, value: float = float("nan")):
        self.at_step, self.value = at_step, value

    def on_after_backward(self, trainer, pl_module) -> None:
        if trainer.global_step == self.at_step:
            pl_module.model.layers[0].ffn.w1.weight.grad[0, 0] = self.value


class CrashAt(L.Callback):
    """Raises at the start of step ``at_step``: a crash (OOM, a bug), not a divergence."""

    def __init__(self, at_step: int):
        self.at_step = at_step

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_step == self.at_step:
            raise RuntimeError("simulated crash")


# --- unit level ---------------------------------------------------------------------------------------------


def test_loss_spike_detection_on_a_synthetic_series():
    series = [3.0 - 0.01 * i + 0.02 * (-1) ** i for i in range(40)]  # slow decrease with alternating noise
    series[25] += 1.0  # a spike
    series[32] = float("nan")  # divergence is not a spike
    scores, spikes = spike_scores(series, window=20, k=4.0, min_history=10)
    assert [i for i, s in enumerate(spikes) if s] == [25]
    assert all(math.isnan(s) for s in scores[:10]) and math.isnan(scores[32])
    window = series[5:25]
    mean = sum(window) / 20
    std = math.sqrt(sum((v - mean) ** 2 for v in window) / 20)
    assert scores[25] == pytest.approx((series[25] - mean) / std)
    det = LossSpikeDetector(window=5, k=3.0, min_history=3)
    for v in [2.0, 2.0, 2.0, 2.0005, 2.5]:  # flat history: std floored at min_std, tiny wiggles are no spikes
        det.update(v)
    assert det.count == 1


def brute_force_max_logit(attn, x, cos, sin) -> float:
    """Loops over (batch, head, query t, key s <= t) with explicit dot products in float64."""
    B, T, _ = x.shape
    H, Hkv, D = attn.n_heads, attn.n_kv_heads, attn.head_dim
    q = apply_rope(attn.q_norm(attn.wq(x).view(B, T, H, D)), cos, sin).double()  # (B, T, H, D)
    k = apply_rope(attn.k_norm(attn.wk(x).view(B, T, Hkv, D)), cos, sin).double()  # (B, T, Hkv, D)
    best = -math.inf
    for b in range(B):
        for h in range(H):
            for t in range(T):
                for s in range(t + 1):
                    best = max(best, float(q[b, t, h] @ k[b, s, h // (H // Hkv)]) / math.sqrt(D))
    return best


@torch.no_grad()
def test_max_attention_logit_matches_brute_force_on_the_probe_batch():
    torch.manual_seed(0)
    model = Transformer(ModelConfig(vocab_size=17, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, max_seq_len=8,
                                    qk_norm="layernorm", init_std=0.3))
    idx = torch.randint(0, 17, (3, 7))
    inputs = {}
    for i, block in enumerate(model.layers):  # what attention sees: (x, cos, sin)
        block.attn.register_forward_pre_hook(lambda m, args, i=i: inputs.setdefault(i, args))
    probe = ActivationProbe(model, probe_batch=2)
    probe.attach(attention=True)
    model(idx)
    probe.detach()
    stats = probe.collect()
    for i, block in enumerate(model.layers):
        x, cos, sin = inputs[i]
        expected = brute_force_max_logit(block.attn, x[:2], cos, sin)  # the probe batch: first 2 sequences
        assert stats[f"layer/{i}/attn_logit_max"] == pytest.approx(expected, rel=1e-5)
    assert not probe.attached and all(not b._forward_hooks for b in model.layers)


@torch.no_grad()
@pytest.mark.parametrize("stats", ["position", "pooled"])
def test_bn_stat_distance_is_zero_after_a_step_with_momentum_one(stats):
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=17, dim=16, n_layers=2, n_heads=2, max_seq_len=8, norm="batchnorm",
                      norm_options={"momentum": 1.0, "stats": stats})
    model = Transformer(cfg).train()
    probe = ActivationProbe(model)
    probe.attach()
    model(torch.randint(0, 17, (4, 6)))
    probe.detach()
    out = probe.collect()
    dists = {k: v for k, v in out.items() if k.endswith(("bn_mean_dist", "bn_var_dist", "bn_mean_z", "bn_var_z"))}
    assert len(dists) == 4 * (2 * 2 + 1) and all(v == 0.0 for v in dists.values())  # 5 BN sites
    # with momentum m the running stats move a fraction m of the way: distance = (1 - m) * |batch - old|
    bn = model.norm
    bn.momentum = 0.25
    x = torch.randn(4, 6, 16) * 3 + 1
    old_mean = bn.running_mean.clone()
    mu, _ = bn.batch_stats(x)
    bn(x)
    rows = slice(0, 6) if stats == "position" else slice(None)
    d_mu, _, z_mu, _ = bn_stat_distance(bn, x)
    assert float(d_mu) == pytest.approx(0.75 * float((mu - old_mean[rows]).pow(2).mean().sqrt()), rel=1e-5)
    z = 0.75 * (mu - old_mean[rows]) / (bn.running_var[rows] + bn.eps).sqrt()
    assert float(z_mu) == pytest.approx(float(z.pow(2).mean().sqrt()), rel=1e-5)


@torch.no_grad()
@pytest.mark.parametrize(("batch", "momentum"), [(4, 0.1), (64, 0.1), (16, 0.3)])
def test_bn_sampling_null_is_what_iid_gaussian_batches_give(batch, momentum):
    """The S4 fluctuation metric's floor: i.i.d. Gaussian inputs (any mean and scale) give z = the formula."""
    torch.manual_seed(0)
    bn = BatchNorm(32, momentum=momentum, max_seq_len=8).train()
    z_mu, z_var = [], []
    for step in range(400):
        x = torch.randn(batch, 8, 32) * 2.5 + 3.0
        bn(x)
        if step >= 100:  # the running statistics have forgotten their init
            _, _, zm, zv = bn_stat_distance(bn, x)
            z_mu.append(float(zm) ** 2)
            z_var.append(float(zv) ** 2)
    null_mu, null_var = bn_sampling_null(batch, momentum)
    assert math.sqrt(sum(z_mu) / len(z_mu)) == pytest.approx(null_mu, rel=0.05)
    assert math.sqrt(sum(z_var) / len(z_var)) == pytest.approx(null_var, rel=0.10)  # first order: 7% low at B=4


PROBE_CASES = [(norm, "peri") for norm in EAGER_NORMS]  # peri: the most sites (registry-driven)
PROBE_CASES += [("rmsnorm", placement) for placement in PLACEMENTS if placement != "peri"]


@torch.no_grad()
@pytest.mark.parametrize("norm, placement", PROBE_CASES)  # fused_rmsnorm: RMSNorm's module with a kernel
def test_probe_sees_every_norm_site_of_every_norm_and_placement(norm, placement):
    model = Transformer(ModelConfig(vocab_size=11, dim=16, n_layers=2, n_heads=2, max_seq_len=8, norm=norm,
                                    placement=placement, mix_fraction=0.5)).train()
    probe = ActivationProbe(model)
    probe.attach(attention=True)
    model(torch.randint(0, 11, (2, 5)))
    probe.detach()
    stats = probe.collect()
    sites = list(probe.sites)
    per_block = 4 if placement == "peri" else 2  # peri: input and output norm around each sublayer
    final = placement not in ("post", "deepnorm")  # those blocks end normalized: no final norm
    assert len(sites) == (0 if norm == "none" else 2 * per_block + final), sites
    for site in sites:
        assert f"norm/{site}/in_rms" in stats and f"norm/{site}/in_max_fp16" in stats
        if getattr(model.get_submodule(site), "weight", None) is not None:
            assert f"norm/{site}/gain_mean" in stats
    layer_keys = ("resid_rms", "resid_max", "attn_logit_max")
    assert all(f"layer/{i}/{k}" in stats for i in range(2) for k in layer_keys)
    assert all(math.isfinite(v) for v in stats.values())
    if norm == "dyt":
        assert stats["norm/norm/alpha"] == pytest.approx(model.norm.alpha0)


def test_divergence_guard_loss_ceiling_and_checkpoint_freeze():
    totals = RunTotals()
    trainer = SimpleNamespace(global_step=0, should_stop=False, world_size=1, callbacks=[totals], loggers=[])
    module = torch.nn.Linear(2, 2)
    guard = DivergenceGuard(max_loss=6.0, patience=3)
    for step, loss in enumerate([5.0, 9.0, 9.0, 4.0, 9.0, 9.0, 9.0, 9.0]):
        trainer.global_step = step
        guard.on_train_batch_start(trainer, module, None, step)
        guard.on_train_batch_end(trainer, module, {"loss": torch.tensor(loss)}, None, step)
        if guard.diverged:
            break
    assert (guard.diverged, guard.step, trainer.should_stop) == (True, 6, True)
    assert "above 6 for 3 consecutive steps" in guard.reason
    assert totals.values() == {"stopped_early": True, "diverged_step": 6, "diverged_reason": guard.reason}
    assert Checkpoint()._diverged(trainer)  # minillm's ModelCheckpoint writes nothing from now on
    guard = DivergenceGuard(max_loss=None, max_loss_factor=None)
    guard.on_train_batch_end(trainer, module, {"loss": torch.tensor(1e30)}, None, 0)
    assert not guard.diverged  # no ceiling: only non-finite values stop
    guard.on_train_batch_end(trainer, module, {"loss": torch.tensor(float("inf"))}, None, 0)
    assert guard.diverged and "non-finite train loss" in guard.reason


def test_grad_scaler_scale_and_skipped_steps_under_16_mixed(tmp_path, corpus):
    """A real fp16 GradScaler on the CPU (Lightning's MixedPrecision plugin): an inf gradient at step 1 is
    skipped by the scaler (scale halves), counted, and is not a divergence."""
    cfg = compose_cfg(tmp_path, corpus)
    dm = instantiate(cfg.data)
    dm.prepare_data()
    dm.setup("fit")
    module = instantiate(cfg.module, _partial_=True)(
        model=model_config(cfg, dm.vocab_size), optimizer=instantiate(cfg.optimizer))
    monitor = StabilityMonitor(every_n_steps=1, probe_every_n_steps=None, output_change=True)
    guard, logger = DivergenceGuard(), MemoryLogger()
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
    trainer = L.Trainer(accelerator="cpu", max_steps=3, logger=logger, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0,
                        plugins=[MixedPrecision("16-mixed", "cpu", scaler=scaler)],
                        callbacks=[PoisonGrad(at_step=1, value=float("inf")), monitor, guard])
    trainer.fit(module, datamodule=dm)
    assert logger.series("stab/amp_scale") == {0: 1024.0, 1: 512.0, 2: 512.0}
    assert logger.series("stab/amp_skipped_steps") == {0: 0.0, 1: 1.0, 2: 1.0}
    assert logger.series("stab/grad_nonfinite")[1] >= 1 and logger.series("stab/grad_nonfinite")[0] == 0
    assert logger.series("stab/update_ratio")[1] == 0.0  # the skipped step changed nothing
    assert logger.series("stab/output_change")[1] == 0.0 < min(logger.series("stab/output_change")[s] for s in (0, 2))
    assert RunTotals.of(trainer).get("skipped_steps") == 1 and not guard.diverged


# --- training runs ------------------------------------------------------------------------------------------


def expected_metrics(n_layers: int, bn_layers: set[int]) -> set[str]:
    keys = {f"stab/{k}" for k in ("grad_norm", "grad_nonfinite", "update_ratio", "max_abs_h", "log_z_mean",
                                  "log_z_max", "max_attn_logit", "loss_spike_score", "loss_spikes")}
    for i in range(n_layers):
        keys |= {f"layer/{i}/{k}" for k in ("grad_norm", "update_ratio", "resid_rms", "resid_max",
                                            "attn_logit_max")}
        for site in ("attn_norm", "ffn_norm", "attn.q_norm", "attn.k_norm"):
            keys |= {f"norm/layers.{i}.{site}/{k}" for k in ("in_rms", "in_max_fp16", "gain_mean",
                                                             "gain_std")}
        if i in bn_layers:
            keys |= {f"norm/layers.{i}.{s}/bn_{k}_dist" for s in ("attn_norm", "ffn_norm")
                     for k in ("mean", "var")}
    return keys | {f"norm/norm/{k}" for k in ("in_rms", "in_max_fp16", "gain_mean", "gain_std")}


def test_tiny_run_logs_every_metric_and_writes_a_complete_summary(tmp_path, corpus):
    # layer 0 uses BatchNorm, layer 1 LayerNorm, both with RMSNorm QK-norm: every kind of norm site
    cfg = compose_cfg(tmp_path, corpus, "norm=layernorm", "model.qk_norm=rmsnorm",
                      "model.layers=[{norm:batchnorm},{}]", "callbacks.stability.probe_every_n_steps=2",
                      "callbacks.stability.spike_min_history=2")
    metrics = train_script.train(cfg)
    run = Path(cfg.paths.output_dir)
    rows = read_rows(run)
    present = {k for r in rows for k, v in r.items() if v}
    assert not expected_metrics(2, {0}) - present, sorted(expected_metrics(2, {0}) - present)
    assert sorted(logged(rows, "layer/0/attn_logit_max")) == [0, 2]  # probe steps only
    assert sorted(logged(rows, "stab/grad_norm")) == [0, 1, 2, 3]  # every_n_steps = log_every_n_steps = 1
    assert not any(k.startswith("stab/amp") for k in present)  # fp32: no GradScaler

    summary = json.loads((run / "summary.json").read_text())
    assert not SUMMARY_FIELDS - set(summary), sorted(SUMMARY_FIELDS - set(summary))
    assert summary["status"] == "completed"
    assert summary["diverged"] is False and summary["stopped_early"] is False
    assert (summary["norm"], summary["placement"], summary["qk_norm"]) == ("layernorm", "pre", "rmsnorm")
    assert [summary[k] for k in ("lr", "seed", "warmup_steps", "precision")] == [3e-3, 1337, 1, "32-true"]
    assert (summary["dim"], summary["n_layers"], summary["batch_size"], summary["seq_len"]) == (32, 2, 8, 32)
    assert summary["steps"] == 4 and summary["tokens"] == 4 * 8 * 32
    assert summary["test_loss"] == pytest.approx(metrics["test/loss"])
    assert summary["final_val_loss"] == pytest.approx(logged(rows, "val/loss")[3])
    assert summary["best_val_loss"] == min(logged(rows, "val/loss").values())
    assert summary["max_grad_norm"] == pytest.approx(max(logged(rows, "stab/grad_norm").values()))
    assert summary["max_attn_logit"] == pytest.approx(max(logged(rows, "stab/max_attn_logit").values()))
    assert summary["max_abs_h"] == pytest.approx(max(logged(rows, "stab/max_abs_h").values()))
    assert summary["skipped_steps"] == 0 and summary["spike_count"] == 0
    assert summary["n_params"] > 0 and summary["tokens_per_s"] > 0 and summary["wall_time_s"] > 0
    started, written = (datetime.fromisoformat(summary[k]) for k in ("started_at", "written_at"))
    assert started.utcoffset() == timedelta(0) and 0 <= (written - started).total_seconds() < 600
    assert summary["loss_init"] == pytest.approx(math.log(summary["vocab_size"]))
    assert 0 < summary["unigram_loss"] < summary["loss_init"]
    assert summary["failed"] is (summary["final_val_loss"] >= summary["unigram_loss"])


def test_max_grad_norm_covers_every_step_not_only_the_measured_ones(tmp_path, corpus):
    every = compose_cfg(tmp_path / "a", corpus, "trainer.max_steps=6", "callbacks.stability.every_n_steps=1")
    train_script.train(every)
    norms = logged(read_rows(Path(every.paths.output_dir)), "stab/grad_norm")
    assert sorted(norms) == list(range(6)) and max(norms, key=norms.get) % 4 != 0  # the max is not measured below
    sparse = compose_cfg(tmp_path / "b", corpus, "trainer.max_steps=6", "callbacks.stability.every_n_steps=4")
    train_script.train(sparse)
    summary = json.loads((Path(sparse.paths.output_dir) / "summary.json").read_text())
    assert sorted(logged(read_rows(Path(sparse.paths.output_dir)), "stab/grad_norm")) == [0, 4]
    assert summary["max_grad_norm"] == pytest.approx(max(norms.values()), rel=1e-6)  # same run, deterministic


def test_output_change_leaves_training_untouched(tmp_path, corpus):
    """stab/output_change runs two extra forwards per measured step: with BatchNorm (running statistics) the
    train and val losses must be exactly those of a run without it. (A step that changes no weight changes
    no output: the GradScaler test.)"""
    base = ["norm=batchnorm", "trainer.max_steps=4", "trainer.val_check_interval=4",
            "callbacks.stability.every_n_steps=1"]
    runs = {}
    for name, extra in {"off": [], "on": ["callbacks.stability.output_change=true"]}.items():
        cfg = compose_cfg(tmp_path / name, corpus, *base, *extra)
        train_script.train(cfg)
        runs[name] = read_rows(Path(cfg.paths.output_dir))
    for key in ("train/loss", "val/loss"):
        assert logged(runs["on"], key) == logged(runs["off"], key)
    change = logged(runs["on"], "stab/output_change")
    assert sorted(change) == [0, 1, 2, 3] and min(change.values()) > 1e-4
    assert not logged(runs["off"], "stab/output_change")


def test_forced_nan_ends_the_run_as_diverged_and_keeps_the_last_good_checkpoint(tmp_path, corpus):
    cfg = compose_cfg(tmp_path, corpus, "trainer.max_steps=8", "trainer.val_check_interval=2",
                      "+callbacks.poison={_target_:test_callbacks.PoisonGrad,at_step:3}")
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


def test_a_crashed_run_is_failed_in_its_summary_even_with_a_good_validation(tmp_path, corpus):
    cfg = compose_cfg(tmp_path, corpus, "trainer.max_steps=8", "trainer.val_check_interval=2",
                      "+callbacks.crash={_target_:test_callbacks.CrashAt,at_step:3}")
    with pytest.raises(RuntimeError, match="simulated crash"):
        train_script.train(cfg)
    summary = json.loads((Path(cfg.paths.output_dir) / "summary.json").read_text())
    assert summary["status"] == "failed" and "simulated crash" in summary["error"]
    assert summary["diverged"] is False and math.isfinite(summary["final_val_loss"])  # a validation at step 2
    assert summary["failed"] is True  # so no analysis counts its partial loss as a result


def test_multirun_with_a_diverging_member_finishes_every_run_and_reports(tmp_path, corpus):
    sweep = tmp_path / "sweep"
    cmd = [sys.executable, str(ROOT / "train.py"), "-m", "model=tiny", "data=files", f"data.files=[{corpus}]",
           "data.batch_size=4", "data.val_windows=4", "trainer=cpu", "trainer.max_steps=8",
           "trainer.val_check_interval=4", "scheduler.warmup_steps=1", "logger=csv", "callbacks=stability",
           "callbacks.divergence.patience=2", "test=false", f"paths.cache_dir={tmp_path / 'cache'}",
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


def test_progress_bar_labels_step_based_runs_without_a_negative_epoch_count():
    from types import SimpleNamespace

    from minillm.callbacks import RichBar

    bar = RichBar()
    bar._trainer = SimpleNamespace(max_epochs=-1)  # training by steps (trainer.max_epochs=-1)
    assert bar._get_train_description(0).strip() == "Epoch 0"
    bar._trainer = SimpleNamespace(max_epochs=3)
    assert bar._get_train_description(1).strip() == "Epoch 1/2"


# --- what a user's run throws at the callbacks ----------------------------------------------------------------


@pytest.mark.parametrize("values", [
    torch.ones(64),  # a gain that has not moved yet
    1.0 + torch.arange(64) * 1e-8,  # a gain moved by a tiny lr: a float32 step or two apart
    torch.tensor([1.0, float("inf"), -float("inf"), float("nan"), 2.0]),  # a diverging run
])
def test_histograms_of_constant_or_non_finite_values(values):
    import wandb

    from minillm.callbacks.histograms import histogram

    counts, edges = histogram(values)
    finite = values[values.isfinite()]
    assert counts.sum() == finite.numel() and edges[0] <= finite.min() <= finite.max() <= edges[-1]
    assert wandb.Histogram(np_histogram=(counts, edges)).histogram == counts.tolist()


def test_a_histogram_of_nothing_finite_is_none():
    from minillm.callbacks.histograms import histogram

    assert histogram(torch.tensor([float("nan"), float("inf")])) is None


def test_validation_counts_optimizer_steps_under_gradient_accumulation(tmp_path, corpus):
    """val_check_interval=4 with 3 micro-batches per step: validations after steps 4 and 8 (Lightning alone
    counts batches and validates after steps 1, 2 and 4)."""
    cfg = compose_cfg(tmp_path, corpus, "trainer.max_steps=8", "trainer.val_check_interval=4",
                      "trainer.accumulate_grad_batches=3", "test=false")
    train_script.train(cfg)
    rows = read_rows(cfg.paths.output_dir)
    assert sorted(int(r["step"]) for r in rows if r.get("val/loss")) == [3, 7]  # step indices of steps 4 and 8


def test_the_rich_bar_counts_the_steps_of_the_whole_run_after_a_resume(tmp_path, corpus):
    """Resumed mid-epoch at step 3 of 6: the bar reads 6/6 at the end (Lightning's reads batches of this epoch
    against the steps left: 6/3)."""
    from minillm.callbacks.progress import RichBar

    first = compose_cfg(tmp_path, corpus, "trainer.max_steps=3", "scheduler=constant", "test=false")
    train_script.train(first)
    ckpt = Path(first.paths.output_dir) / "checkpoints" / "last.ckpt"
    cfg = compose_cfg(tmp_path, corpus, "trainer.max_steps=6", "scheduler=constant", "test=false",
                      f"ckpt_path={ckpt}", "callbacks.progress_bar.mode=rich")
    with open_dict(cfg):
        cfg.callbacks.look = {"_target_": "test_callbacks.LookAtTheBar"}
    train_script.train(cfg)
    assert LookAtTheBar.seen == {"kind": RichBar, "total": 6, "completed": 6}


class LookAtTheBar(L.Callback):
    seen: dict = {}

    def on_train_end(self, trainer, pl_module) -> None:
        bar = trainer.progress_bar_callback
        task = bar.progress.tasks[bar.train_progress_bar_id]
        LookAtTheBar.seen = {"kind": type(bar), "total": task.total, "completed": task.completed}


def test_log_lines_print_above_the_rich_bar(monkeypatch):
    """A console handler made before the bar writes to whatever sys.stdout is when it logs (rich's proxy while
    the bar is live), not into the bar's line through the stream it was made with."""
    import io
    import logging

    from minillm.callbacks.progress import follow_console

    logger = logging.getLogger("test-follow-console")
    handler = logging.StreamHandler(sys.stdout)
    logger.addHandler(handler)
    try:
        follow_console(logger)
        live = io.StringIO()
        monkeypatch.setattr(sys, "stdout", live)
        logger.warning("a line")
        assert live.getvalue() == "a line\n"
    finally:
        logger.removeHandler(handler)


def test_the_model_the_perf_monitor_counts_on_gives_no_second_warning():
    """The pooled-BatchNorm warning comes from the run's model (its norms: one location, so Python shows it
    once); the meta-device copy PerfMonitor counts FLOPs on must not repeat it."""
    from minillm.callbacks.perf import meta_model

    cfg = ModelConfig(vocab_size=11, dim=16, n_layers=2, n_heads=2, norm="batchnorm",
                      norm_options={"stats": "pooled"})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        meta_model(cfg)
    assert caught == []


def test_samples_of_a_users_corpus_start_from_its_own_text(tmp_path, corpus):
    """data=files: the prompt is the held-out split's first line, which the corpus's tokenizer can encode."""
    cfg = compose_cfg(tmp_path, corpus, "callbacks=default", "logger=csv", "test=false")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        train_script.train(cfg)
    assert not [w for w in caught if "outside the vocabulary" in str(w.message)]
    text = (Path(cfg.paths.output_dir) / "samples.txt").read_text()
    first = text.split("\n")[1]
    assert len(first) > 8 and first[:8] in corpus.read_text()  # the sample starts with the corpus's own text
