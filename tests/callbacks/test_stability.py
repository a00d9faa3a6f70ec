"""StabilityMonitor (minillm/training/callbacks/stability.py): the spike detector, every stability metric logged, the
gradient
totals over every step, the GradScaler's skipped steps, the output-change probe."""


from __future__ import annotations

import json
import math
from datetime import datetime, timedelta
from pathlib import Path

import lightning as L
import pytest
import torch
from helpers import MemoryLogger, PoisonGrad, compose_cfg, logged, read_rows
from hydra.utils import instantiate
from lightning.pytorch.plugins import MixedPrecision

import minillm.training.train as train_script
from minillm.training.callbacks import (
    DivergenceGuard,
    LossSpikeDetector,
    RunTotals,
    StabilityMonitor,
    spike_scores,
)
from minillm.training.run.build import model_config

SUMMARY_FIELDS = {  # config
    "name", "norm", "placement", "lr", "warmup_steps", "precision", "precision_used", "seed", "dim",
    "n_layers", "n_heads", "n_kv_heads", "qk_norm", "vocab_size", "max_seq_len", "batch_size", "seq_len",
    "max_steps", "grad_clip", "n_params", "loss_init", "unigram_loss",
} | {  # results
    "status", "steps", "final_val_loss", "best_val_loss", "best_val_step", "test_loss", "test_weights", "diverged",
    "diverged_step", "diverged_reason", "stopped_early", "failed", "max_grad_norm", "nonfinite_grad_steps",
    "spike_count", "max_attn_logit", "max_abs_h", "max_log_z", "skipped_steps", "tokens", "tokens_per_s",
    "steady_tokens_per_s", "train_time_s", "wall_time_s", "started_at", "written_at",
}


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


def test_gradient_norm_spikes_are_scored_on_the_norms_own_scale():
    """The loss's floor is 0.001 nats; a gradient norm has no fixed scale, so its floor is 0.001 x its mean: a
    tripled norm of 1e-5 is a spike (an absolute 0.001 floor scored it 0.02), and at 1e4 a 0.01 wiggle is not."""
    for scale, jump, spike in ((1e-5, 3.0, True), (1e4, 1 + 1e-6, False)):
        det = StabilityMonitor().grad_spikes
        for _ in range(20):
            det.update(scale)
        score, is_spike = det.update(scale * jump)
        assert is_spike == spike, (scale, score)


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


def expected_metrics(n_layers: int, bn_layers: set[int]) -> set[str]:
    keys = {f"stab/{k}" for k in ("grad_norm", "grad_nonfinite", "update_ratio", "max_abs_h", "log_z_mean",
                                  "log_z_max", "max_attn_logit", "loss_spike_score", "loss_spikes",
                                  "grad_norm_spike_score", "grad_norm_spikes")}
    for i in range(n_layers):
        keys |= {f"layer/{i}/{k}" for k in ("grad_norm", "update_ratio", "weight_norm", "resid_rms", "resid_max",
                                            "resid_median", "attn_logit_max", "attn_entropy_min", "attn_entropy_mean")}
        for site in ("attn_norm", "ffn_norm", "attn.q_norm", "attn.k_norm"):
            keys |= {f"norm/layers.{i}.{site}/{k}" for k in ("in_rms", "in_max_fp16", "outlier_ratio", "kurtosis",
                                                             "gain_mean", "gain_std")}
        if i in bn_layers:
            keys |= {f"norm/layers.{i}.{s}/bn_{k}_dist" for s in ("attn_norm", "ffn_norm")
                     for k in ("mean", "var")}
    return keys | {f"norm/norm/{k}" for k in ("in_rms", "in_max_fp16", "outlier_ratio", "kurtosis", "gain_mean",
                                              "gain_std")}


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
    assert summary["steady_tokens_per_s"] > 0  # steps 3 and 4 of 4, over their own time
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
