"""Scale and speed: DDP on CPU (gloo), synchronized batch statistics, torch.compile, throughput metrics."""

from __future__ import annotations

import csv
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from helpers import ROOT, compose_cfg, logged, read_rows

from minillm.model import ModelConfig
from minillm.norms import build_norm
from minillm.training.lit_module import LitLM

WORLD = 2
B, T, C = 3, 5, 6  # per-process batch
SYNC_CASES = [  # (norm, options): both statistics modes; PowerNorm's warmup step (exact grad) and Algorithm 1
    ("batchnorm", {"stats": "position"}),
    ("batchnorm", {"stats": "pooled"}),
    ("powernorm", {"stats": "position", "warmup_steps": 1}),
    ("powernorm", {"stats": "pooled"}),
]
STEPS = 2


def _data(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The global batch (WORLD * B, T, C) of a step and a fixed upstream gradient for it."""
    g = torch.Generator().manual_seed(100 + step)
    x = torch.randn(WORLD * B, T, C, generator=g) * 2.0 + 0.5
    return x, torch.randn(WORLD * B, T, C, generator=g)


def _run(norm: torch.nn.Module, rows: slice) -> list[dict]:
    """STEPS train steps on rows of the global batches: output, input grad, param grads, buffers per step."""
    out = []
    for step in range(STEPS):
        x, g = _data(step)
        x = x[rows].clone().requires_grad_(True)
        norm.zero_grad(set_to_none=True)
        y = norm(x)
        (y * g[rows]).sum().backward()  # loss = sum over the batch: per-process losses add up to the global one
        grads = {n: p.grad.clone() for n, p in norm.named_parameters()}
        if dist.is_initialized():  # what DDP's gradient all-reduce does (sum; DDP then divides by WORLD)
            for v in grads.values():
                dist.all_reduce(v)
        out.append({"y": y.detach(), "x_grad": x.grad, "grads": grads,
                    "buffers": {n: b.clone() for n, b in norm.named_buffers()}})
    return out


def _sync_worker(rank: int, init_file: str, out_dir: str) -> None:
    torch.set_num_threads(1)  # forked: keep OpenMP out of the child
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    try:
        results = []
        for name, options in SYNC_CASES:
            torch.manual_seed(0)
            norm = build_norm(name, C, max_seq_len=8, sync=True, **options)
            with torch.no_grad():  # non-trivial affine parameters
                norm.weight.add_(0.1 * torch.arange(C))
                norm.bias.add_(0.05 * torch.arange(C))
            results.append(_run(norm, slice(rank * B, (rank + 1) * B)))
        torch.save(results, Path(out_dir) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def test_synced_batch_stats_match_one_process_on_the_concatenated_batch(tmp_path):
    """2-process DDP-style run (gloo) with sync=True == one process on both batches: outputs, running
    statistics, input gradients and (summed) parameter gradients, for BatchNorm and PowerNorm, both modes."""
    mp.start_processes(_sync_worker, args=(str(tmp_path / "init"), str(tmp_path)), nprocs=WORLD, join=True,
                       start_method="fork")
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(WORLD)]
    for i, (name, options) in enumerate(SYNC_CASES):
        torch.manual_seed(0)
        ref_norm = build_norm(name, C, max_seq_len=8, sync=True, **options)  # sync is a no-op: one process
        with torch.no_grad():
            ref_norm.weight.add_(0.1 * torch.arange(C))
            ref_norm.bias.add_(0.05 * torch.arange(C))
        ref = _run(ref_norm, slice(None))
        for step in range(STEPS):
            msg = f"{name} {options} step {step}"
            for r in range(WORLD):
                got, want, rows = ranks[r][i][step], ref[step], slice(r * B, (r + 1) * B)
                torch.testing.assert_close(got["y"], want["y"][rows], rtol=1e-5, atol=1e-5, msg=msg)
                torch.testing.assert_close(got["x_grad"], want["x_grad"][rows], rtol=1e-5, atol=1e-5, msg=msg)
                for k, v in want["grads"].items():
                    torch.testing.assert_close(got["grads"][k], v, rtol=1e-5, atol=1e-5, msg=f"{msg} {k}")
                for k, v in want["buffers"].items():
                    torch.testing.assert_close(got["buffers"][k], v, rtol=1e-5, atol=1e-5, msg=f"{msg} {k}")


def test_without_sync_a_shard_is_normalized_by_its_own_batch(tmp_path):
    """Control for the test above: without sync each process normalizes by its own batch only."""
    x, _ = _data(0)
    norm = build_norm("batchnorm", C, max_seq_len=8)
    assert not torch.allclose(norm(x[:B]), norm(x)[:B], atol=1e-3)


# --- DDP through train.py ------------------------------------------------------------------------------------


@pytest.mark.slow  # DDP with loggers on runs in test_journey
def test_ddp_cpu_fast_dev_run_pre_post_x_rmsnorm_batchnorm(tmp_path, corpus):
    """trainer=ddp_cpu (2 forked gloo ranks) in one Hydra multirun over placement x norm, synced BatchNorm."""
    sweep = tmp_path / "sweep"
    cmd = [sys.executable, str(ROOT / "train.py"), "-m", "trainer=ddp_cpu", "debug=fast_dev_run", "model=tiny",
           "data=files", f"data.files=[{corpus}]", "data.batch_size=4", "data.val_windows=4", "callbacks=none",
           "trainer.sync_batchnorm=true", f"paths.cache_dir={tmp_path / 'cache'}", f"hydra.sweep.dir={sweep}",
           "norm=rmsnorm,batchnorm", "placement=pre,post"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=tmp_path,
                         env={**__import__("os").environ, "OMP_NUM_THREADS": "1"})
    log = out.stdout + out.stderr
    assert out.returncode == 0, log[-3000:]
    assert log.count("Starting with 2 processes") == 4, log[-3000:]
    assert len([p for p in sweep.iterdir() if p.is_dir() and p.name.isdigit()]) == 4


DDP_FAST = ["callbacks=preemption", "test=false", "trainer.max_steps=6", "trainer.val_check_interval=3",
            "scheduler.total_steps=6", "+trainer.enable_progress_bar=false", "+trainer.enable_checkpointing=false"]


def test_two_processes_train_like_one_process_with_twice_the_batch(tmp_path, corpus):
    """trainer=ddp_cpu with batch B = one process with batch 2B: the same windows (StreamSampler), the same
    averaged gradient, so the same validation losses; every val window is counted once (no padding)."""
    import minillm.training.train as train_script

    two = compose_cfg(tmp_path / "two", corpus, *DDP_FAST, "trainer=ddp_cpu", "data.batch_size=4",
                      "data.val_windows=7")
    one = compose_cfg(tmp_path / "one", corpus, *DDP_FAST, "trainer=cpu", "data.batch_size=8", "data.val_windows=7")
    for cfg in (two, one):
        train_script.train(cfg)
    a, b = (logged(read_rows(Path(c.paths.output_dir)), "val/loss") for c in (two, one))
    assert sorted(a) == sorted(b) == [2, 5]
    assert [a[s] for s in (2, 5)] == pytest.approx([b[s] for s in (2, 5)], rel=1e-5)
    assert logged(read_rows(Path(two.paths.output_dir)), "train/tokens")[5] == 6 * 8 * 32


@pytest.mark.slow  # long (end to end); `-m slow` runs it
@pytest.mark.parametrize("signalled, stopped", [(2, 3), (4, 5)])  # 2: the next step validates: stop after that
def test_sigterm_to_one_process_stops_both_at_one_step_and_resumes_exactly(signalled, stopped, tmp_path, corpus):
    """Under trainer=ddp_cpu only rank 0 gets SIGTERM, after step `signalled` (its hooks for that step have run):
    both processes stop after the same step (the next one; after its validation when it has one), save one
    checkpoint and end with status 143; the resumed run continues the full run's curves exactly."""
    import minillm.training.train as train_script

    ddp = [*DDP_FAST, "trainer=ddp_cpu", "data.batch_size=4"]
    full = compose_cfg(tmp_path / "full", corpus, *ddp)
    train_script.train(full)
    cfg = compose_cfg(tmp_path / "run", corpus, *ddp, "+callbacks.signal._target_=helpers.SignalAt",
                      f"+callbacks.signal.signum={int(signal.SIGTERM)}", f"+callbacks.signal.step={signalled}")
    with pytest.raises(SystemExit) as stop:
        train_script.train(cfg)
    assert stop.value.code == 128 + signal.SIGTERM
    ckpt = Path(cfg.paths.output_dir) / "checkpoints" / "preempted.ckpt"
    from minillm.training.checkpointing import read_checkpoint_header

    assert read_checkpoint_header(ckpt)["global_step"] == stopped
    train_script.train(compose_cfg(tmp_path / "run", corpus, *ddp, "ckpt_path=auto"))
    for key in ("train/loss", "val/loss"):
        assert logged(read_rows(Path(cfg.paths.output_dir)), key) == logged(read_rows(Path(full.paths.output_dir)),
                                                                             key), key


def test_sync_batchnorm_switch_reaches_minillm_norms(tmp_path, corpus, monkeypatch):
    """trainer.sync_batchnorm=true (Lightning converts only torch's BatchNorm) turns on minillm's sync option."""
    import minillm.model_config
    import minillm.training.train as train_script

    built = []
    real = minillm.model_config.build_norm
    monkeypatch.setattr(minillm.model_config, "build_norm", lambda *a, **kw: built.append(real(*a, **kw)) or built[-1])
    for norm, switch in (("batchnorm", "true"), ("powernorm", "true"), ("batchnorm", "false")):
        built.clear()
        train_script.prepare(compose_cfg(tmp_path, corpus, f"norm={norm}", f"+trainer.sync_batchnorm={switch}",
                                         "test=false"))  # built, not trained
        assert built and all(m.sync == (switch == "true") for m in built), (norm, switch)


# --- torch.compile ---------------------------------------------------------------------------------------------


def _train_steps(norm: str, compile: bool, backend: str, steps: int = 3) -> list[float]:
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=17, dim=32, n_layers=2, n_heads=2, max_seq_len=16, norm=norm,
                      placement="pre" if norm != "batchnorm" else "post")
    module = LitLM(cfg, compile=compile, compile_backend=backend)
    opt = torch.optim.AdamW(module.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(steps):
        x = torch.randint(0, 17, (4, 16), generator=g)
        loss, _ = module.loss(module(x), x.roll(-1, dims=1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("norm", ["rmsnorm", pytest.param("layernorm", marks=pytest.mark.slow),
                                  pytest.param("batchnorm", marks=pytest.mark.slow)])
def test_compiled_model_trains_like_eager(norm):
    """model.compile=true: the compiled model (dynamo graph + AOT autograd, no codegen) matches eager."""
    torch._dynamo.reset()
    counters = torch._dynamo.utils.counters
    counters.clear()
    eager = _train_steps(norm, compile=False, backend="inductor")
    assert counters["stats"]["unique_graphs"] == 0
    compiled = _train_steps(norm, compile=True, backend="aot_eager")
    assert counters["stats"]["unique_graphs"] >= 1 and not counters["graph_break"]  # really compiled, whole
    assert compiled == pytest.approx(eager, rel=1e-5, abs=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("norm", ["layernorm", "rmsnorm", "batchnorm"])
def test_inductor_compiled_model_trains_like_eager(norm):
    torch._dynamo.reset()
    eager = _train_steps(norm, compile=False, backend="inductor")
    compiled = _train_steps(norm, compile=True, backend="inductor")
    assert compiled == pytest.approx(eager, rel=1e-4, abs=1e-4)


# --- throughput metrics ------------------------------------------------------------------------------------


def test_perf_metrics_logged_in_a_tiny_run(tmp_path, corpus):
    """tokens/s, FLOP/s, data-wait fraction (and MFU against a configured peak) land in the CSV log."""
    import minillm.training.train as train_script

    cfg = compose_cfg(tmp_path, corpus, "callbacks=perf", "+callbacks.perf.peak_flops=1e12", "test=false")
    train_script.train(cfg)
    with open(Path(cfg.paths.output_dir) / "csv" / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    for key in ("perf/tokens_per_s", "perf/tokens_per_s_device", "perf/flops_per_s_device", "perf/mfu",
                "perf/data_wait_frac"):
        values = [float(r[key]) for r in rows if r.get(key)]
        assert values, key
        assert all(v > 0 for v in values) if key != "perf/data_wait_frac" else all(0 <= v < 1 for v in values)
    tps = [float(r["perf/tokens_per_s"]) for r in rows if r.get("perf/tokens_per_s")]
    fps = [float(r["perf/flops_per_s_device"]) for r in rows if r.get("perf/flops_per_s_device")]
    from minillm.training.callbacks.perf import analytic_flops_per_token
    per_token = analytic_flops_per_token(ModelConfig(vocab_size=64, dim=32, n_layers=2, n_heads=2,
                                                     max_seq_len=32), 32)
    assert fps[-1] / tps[-1] == pytest.approx(per_token, rel=0.05)  # vocab differs slightly from the corpus's


def test_measured_flops_match_the_analytic_count():
    from minillm.training.callbacks.perf import analytic_flops_per_token, measured_flops_per_batch

    cfg = ModelConfig(vocab_size=65, dim=64, n_layers=2, n_heads=4, max_seq_len=32)
    assert measured_flops_per_batch(cfg, 3, 32) == 3 * 32 * analytic_flops_per_token(cfg, 32)


def test_the_causal_count_keeps_the_keys_the_mask_keeps():
    """Causal attention does (T + 1) / 2 of the full count's attention work per token: at 125M shape (C 768,
    L 12, T 1024) that is ~7% fewer FLOPs per token than the full count MFU uses."""
    from minillm.training.callbacks.perf import analytic_flops_per_token

    cfg = ModelConfig(vocab_size=65, dim=64, n_layers=2, n_heads=4, max_seq_len=32)
    full, causal = analytic_flops_per_token(cfg, 32), analytic_flops_per_token(cfg, 32, causal=True)
    assert full - causal == 12 * 2 * 64 * 32 - 6 * 2 * 64 * 33
