"""Fused residual add + RMSNorm (minillm/kernels/add_rmsnorm.py) against the two ops it replaces: the sum and the
norm, and the gradients of x, residual and the gain, with a gradient reaching the sum along the residual stream.
Under the Triton interpreter on a CPU (tests/conftest.py), as tests/test_kernels.py."""

import importlib

import pytest
import torch
from test_kernels import DEV, DTYPES, TOL, _randn, _weight, gpu, kernel

from minillm.kernels import add_rmsnorm as A
from minillm.kernels import rmsnorm as K
from minillm.model import ModelConfig, Transformer


def _grads(fn, x, r, w, dy, dh):
    """(y, h, dx, dr, dw) of (y, h) = fn(x, r, w) with upstream gradients dy, dh (None: that output unused)."""
    x, r, w = (t.detach().clone().requires_grad_() for t in (x, r, w))
    y, h = fn(x, r, w)
    outs, grads = zip(*[(o, g) for o, g in ((y, dy), (h, dh)) if g is not None], strict=True)
    torch.autograd.backward(outs, grads)
    return y.detach(), h.detach(), x.grad, r.grad, w.grad  # w.grad None when y is unused


def _sum_as_the_kernel_rounds(x, r):
    """torch's x + r (fp32 sum, rounded to nearest even), except that Triton's CPU interpreter rounds fp32 to bf16
    toward zero (the GPU rounds to nearest even, as torch)."""
    s = x + r
    if not (K._interpreting() and s.dtype == torch.bfloat16):
        return s
    exact = x.float() + r.float()
    return (exact.view(torch.int32) & ~0xFFFF).view(torch.float32).to(torch.bfloat16)


def _check(x, r, w, dy, dh, offset=0.0, cast="fp32", eps=1e-5):
    """Fused against the two ops in float64, with the tolerance of the output's dtype; h exactly torch's add."""
    got = _grads(lambda a, b, c: A.fused_add_rms_norm(a, b, c, eps, offset, cast), x, r, w, dy, dh)
    ref = _grads(lambda a, b, c: A.reference_add_rms_norm(a, b, c, eps, offset, cast), x.double(), r.double(),
                 w.double(), None if dy is None else dy.double(), None if dh is None else dh.double())
    h_tol = TOL[torch.promote_types(x.dtype, r.dtype)]
    for name, g, e in zip(("y", "h", "dx", "dresidual", "dw"), got, ref, strict=True):
        if e is None:
            assert g is None, f"{name}: a gradient where the two ops give none"
            continue
        rtol, atol = max(h_tol, TOL[g.dtype])  # the sum's precision, or the output's when coarser (a bf16 gradient)
        scale = max(e.abs().max().item(), 1.0)
        torch.testing.assert_close(g.double(), e, rtol=rtol, atol=atol * scale, msg=lambda m, n=name: f"{n}: {m}")
    y, h, dx, dr, dw = got
    torch.testing.assert_close(h, _sum_as_the_kernel_rounds(x, r), rtol=0, atol=0)  # the sum, rounded once
    assert (y.dtype, h.dtype) == (h.dtype, torch.promote_types(x.dtype, r.dtype))
    assert (dx.dtype, dr.dtype) == (x.dtype, r.dtype) and (dw is None or dw.dtype == w.dtype)
    return got


@kernel
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cast", K.CASTS)
@pytest.mark.parametrize("offset", [0.0, 1.0])
def test_matches_add_then_norm(dtype, cast, offset):
    torch.manual_seed(0)
    shape = (3, 7, 123)  # odd rows, hidden not a power of two
    _check(_randn(*shape, dtype=dtype, scale=2.0), _randn(*shape, dtype=dtype), _weight(123, offset),
           _randn(*shape, dtype=dtype), _randn(*shape, dtype=dtype), offset, cast)


@kernel
def test_fp32_stream_plus_bf16_branch():
    """Under bf16 autocast the residual stream is fp32 and the sublayer's output bf16: the sum is fp32, as torch's
    add promotes it, and each input gets its gradient in its own dtype."""
    torch.manual_seed(1)
    x, r = _randn(4, 5, 64), _randn(4, 5, 64, dtype=torch.bfloat16)
    _check(x, r, _weight(64, 0.0), _randn(4, 5, 64), _randn(4, 5, 64), cast="llama")


@kernel
@pytest.mark.parametrize("unused", ["h", "y"])
def test_one_output_unused(unused):
    """Without a gradient for h the residual path adds nothing; without one for y the norm adds nothing."""
    torch.manual_seed(2)
    x, r, dy, dh = (_randn(6, 40) for _ in range(4))
    got = _check(x, r, _weight(40, 0.0), None if unused == "y" else dy, None if unused == "h" else dh)
    if unused == "y":  # no norm backward at all: dh is the gradient of both inputs, the gain gets none
        torch.testing.assert_close(got[2], dh, rtol=0, atol=0)
        assert got[4] is None


@kernel
@pytest.mark.parametrize("onepass", [True, False], ids=["one-pass-backward", "dx-and-dw-kernels"])
def test_looped_and_wide_row_kernels(monkeypatch, onepass):
    """Rows wider than MAX_FUSED_HIDDEN (shrunk here) take the chunked forward, which adds the residual in both
    passes; above MAX_ONEPASS_HIDDEN the backward is the dx kernel (looped) and the dW kernel."""
    monkeypatch.setattr(K, "MAX_FUSED_HIDDEN", 64)
    monkeypatch.setattr(K, "MAX_ONEPASS_HIDDEN", 128 if onepass else 64)
    monkeypatch.setattr(K, "LOOP_BLOCK", 32)
    torch.manual_seed(3)
    for dtype in (torch.float32, torch.bfloat16):
        args = [_randn(3, 5, 100, dtype=dtype) for _ in range(4)]
        _check(args[0], args[1], _weight(100, 1.0), args[2], args[3], offset=1.0, cast="llama")


@kernel
@pytest.mark.parametrize("config", [(4, 4, 2, 2), (2, 1, 3, 1)], ids=["4-rows-2-stages", "2-rows-1-warp"])
def test_own_backward_configs_with_several_rows_in_flight(monkeypatch, config):
    """The add's backward on its own table (ADD_BWD_CONFIGS) with more than one row per iteration, rows that do not
    divide M, pipelined: dx, dresidual and dW against the two ops (the dW partial is one [BLOCK] row per program)."""
    monkeypatch.setattr(K, "ADD_BWD_CONFIGS", ((64, *config),))
    torch.manual_seed(5)
    for dtype in (torch.float32, torch.bfloat16):
        x, r, dy, dh = (_randn(37, 40, dtype=dtype) for _ in range(4))
        _check(x, r, _weight(40, 0.0), dy, dh, cast="llama")


@kernel
def test_non_contiguous_inputs_and_gradients_left_intact():
    torch.manual_seed(4)
    x, r = _randn(7, 3, 40).permute(1, 0, 2), _randn(3, 7, 64)[..., :40]
    dy, dh = _randn(7, 3, 40).permute(1, 0, 2), _randn(3, 40, 7).transpose(1, 2)
    assert not any(t.is_contiguous() for t in (x, r, dy, dh))
    before = dy.clone(), dh.clone()
    _check(x, r, _weight(40, 0.0), dy, dh)
    for t, b in zip((dy, dh), before, strict=True):
        torch.testing.assert_close(t, b, rtol=0, atol=0)  # gradients written out of place


@kernel
def test_bad_arguments_are_rejected():
    x, w = _randn(2, 8), _weight(8, 0.0)
    with pytest.raises(ValueError, match=r"residual of shape \(1, 8\) does not match x \(2, 8\)"):
        A.fused_add_rms_norm(x, _randn(1, 8), w, 1e-5)
    with pytest.raises(ValueError, match="residual must be a floating-point tensor"):
        A.fused_add_rms_norm(x, torch.ones(2, 8, dtype=torch.long, device=DEV), w, 1e-5)
    with pytest.raises(ValueError, match="cast='bf16' is invalid"):
        A.fused_add_rms_norm(x, x, w, 1e-5, cast="bf16")


@kernel
def test_opcheck():
    torch.manual_seed(5)
    x, r, w = (t.requires_grad_() for t in (_randn(2, 3, 40, dtype=torch.bfloat16), _randn(2, 3, 40),
                                            _weight(40, 1.0)))
    torch.library.opcheck(torch.ops.minillm.add_rms_norm_fwd, (x, r, w, 1e-5, 1.0, "llama"))
    with torch.no_grad():
        _, h, rstd = torch.ops.minillm.add_rms_norm_fwd(x, r, w, 1e-5, 1.0, "llama")
    for dh in (torch.randn_like(h), None):
        args = (torch.randn_like(h), dh, h, w.detach(), rstd, 1.0, "llama")  # no double backward: no grad here
        torch.library.opcheck(torch.ops.minillm.add_rms_norm_bwd, args)


def _ops_in_graph(fn, *args) -> set[str]:
    """Names of the minillm ops in the graphs torch.compile (aot_eager, fullgraph) traces for fn(*args)."""
    seen: set[str] = set()

    def backend(gm, example_inputs):
        from torch._dynamo.backends.common import aot_autograd

        def record(g, _inputs):  # on a GPU, triton_ops may appear as the kernels' wrapper nodes instead
            seen.update(str(n.target) for n in g.graph.nodes if any(k in str(n.target) for k in ("minillm", "triton")))
            return g

        return aot_autograd(fw_compiler=record, bw_compiler=record)(gm, example_inputs)

    torch._dynamo.reset()
    out = torch.compile(fn, backend=backend, fullgraph=True)(*args)
    out.backward()  # the backward graph is traced at the first backward
    torch._dynamo.reset()
    return seen, out.detach()


def _tiny(norm: str, **kw) -> Transformer:
    torch.manual_seed(6)
    cfg = ModelConfig(vocab_size=32, dim=32, n_layers=2, n_heads=4, max_seq_len=16, norm=norm, **kw)
    return Transformer(cfg).to(DEV)


def _loss_and_grads(model: Transformer, idx: torch.Tensor) -> tuple[torch.Tensor, dict]:
    model.zero_grad()
    loss = model(idx).float().square().mean()
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


@kernel
@pytest.mark.parametrize("layernorm_scaling", [False, True])
def test_pre_ln_block_takes_the_fused_add_and_matches_rmsnorm(monkeypatch, layernorm_scaling):
    """A Pre-LN model with fused_rmsnorm adds each attention output and normalizes the sum in one kernel (once per
    block), and gives rmsnorm's loss and gradients from the same state_dict."""
    fused, plain = (_tiny(n, layernorm_scaling=layernorm_scaling) for n in ("fused_rmsnorm", "rmsnorm"))
    plain.load_state_dict(fused.state_dict())
    assert all(b.fused_add for b in fused.layers) and not any(b.fused_add for b in plain.layers)
    calls = []
    real = A._FusedAddRMSNormFunction.apply
    monkeypatch.setattr(A._FusedAddRMSNormFunction, "apply", lambda *a: calls.append(1) or real(*a))
    idx = torch.randint(0, 32, (2, 16), device=DEV)
    (lf, gf), (lp, gp) = _loss_and_grads(fused, idx), _loss_and_grads(plain, idx)
    assert len(calls) == 2
    torch.testing.assert_close(lf, lp, rtol=1e-5, atol=1e-6)
    for name, g in gp.items():
        torch.testing.assert_close(gf[name], g, rtol=1e-4, atol=1e-6, msg=lambda m, n=name: f"{n}: {m}")


@kernel
def test_a_hooked_norm_sees_the_sum_as_its_input(monkeypatch):
    """Forward hooks on the feed-forward norm (the stability probes', the histograms') see that norm's input, the
    sum: the block adds, then calls the norm, so hooks and outputs are those of the unfused model."""
    model = _tiny("fused_rmsnorm")
    seen = []
    model.layers[0].ffn_norm.register_forward_hook(lambda m, args, out: seen.append(args[0].detach()))
    monkeypatch.setattr(A, "fused_add_rms_norm", lambda *a: pytest.fail("fused add ran under a hook"))
    block, x = model.layers[0], _randn(2, 16, 32)
    cos, sin = model.rope_cos[:16], model.rope_sin[:16]
    out = block(x, cos, sin)
    expected = x + block.attn(block.attn_norm(x), cos, sin)
    torch.testing.assert_close(seen[0], expected, rtol=0, atol=0)
    torch.testing.assert_close(out, expected + block.ffn(block.ffn_norm(expected)), rtol=0, atol=0)


@kernel
def test_compiled_model_traces_the_kernels_without_a_graph_break():
    """In a compiled model fused_rmsnorm stays the kernel (its custom ops in the graph), not the composite, and
    gives the eager model's loss."""
    model = _tiny("fused_rmsnorm")
    idx = torch.randint(0, 32, (2, 16), device=DEV)
    ops, out = _ops_in_graph(lambda i: model(i).float().square().mean(), idx)
    compiled = {n: p.grad.clone() for n, p in model.named_parameters()}
    eager, grads = _loss_and_grads(model, idx)
    if K._interpreting():
        assert {f"minillm.{op}.default" for op in ("rms_norm_fwd", "add_rms_norm_fwd", "rms_norm_bwd",
                                                   "add_rms_norm_bwd")} <= ops, ops
    else:  # on a GPU the triton_ops may be traced into their kernels (test_gpu_add_norm_under_inductor)
        assert ops, "no minillm op or triton kernel in the compiled graphs"
    torch.testing.assert_close(out, eager, rtol=1e-5, atol=1e-6)
    for name, g in grads.items():
        torch.testing.assert_close(compiled[name], g, rtol=1e-5, atol=1e-7, msg=lambda m, n=name: f"{n}: {m}")


@kernel
def test_stability_probe_with_attention_statistics_on_a_fused_model():
    """The probe's attention hook reads the block's call of attn (x, cos, sin): the fused block calls it the same
    way, and the probe records every site, the FFN norm's included (the hooked norm runs unfused)."""
    from minillm.training.callbacks.probe import ActivationProbe

    model = _tiny("fused_rmsnorm")
    probe = ActivationProbe(model)
    probe.attach(attention=True)
    model(torch.randint(0, 32, (2, 16), device=DEV))
    probe.detach()
    assert any("attn_entropy_min" in k for k in probe.values)
    assert any("ffn_norm" in k and k.endswith("in_rms") for k in probe.values), sorted(probe.values)


@kernel
def test_float64_is_refused_and_a_float64_model_adds_unfused():
    x = _randn(2, 8).double()
    with pytest.raises(ValueError, match="adds in fp32"):
        A.fused_add_rms_norm(x, x, _weight(8, 0.0).double(), 1e-5)
    model = _tiny("fused_rmsnorm").double()
    plain = _tiny("rmsnorm").double()
    plain.load_state_dict(model.state_dict())
    idx = torch.randint(0, 32, (2, 16), device=DEV)
    torch.testing.assert_close(model(idx), plain(idx), rtol=1e-6, atol=1e-6)


@gpu
@pytest.mark.parametrize("dynamic", [False, True])
def test_gpu_add_norm_under_inductor(dynamic):
    """On a GPU the triton_ops compile with Inductor (static and dynamic shapes): the fused model's loss and
    gradients equal eager's."""
    model = _tiny("fused_rmsnorm")
    idx = torch.randint(0, 32, (2, 16), device=DEV)
    torch._dynamo.reset()
    loss = torch.compile(lambda i: model(i).float().square().mean(), fullgraph=True, dynamic=dynamic)(idx)
    loss.backward()
    compiled = {n: p.grad.clone() for n, p in model.named_parameters()}
    eager, grads = _loss_and_grads(model, idx)
    torch.testing.assert_close(loss.detach(), eager, rtol=1e-5, atol=1e-6)
    for name, g in grads.items():
        torch.testing.assert_close(compiled[name], g, rtol=1e-4, atol=1e-6, msg=lambda m, n=name: f"{n}: {m}")


def _importable(*modules: str) -> bool:
    try:
        for module in modules:
            importlib.import_module(module)
    except Exception:  # not installed, or failing at import (a version clash) on a bare GPU image
        return False
    return True


TRAIN_PACKAGES = ("hydra", "omegaconf", "wandb", "datasets")  # a bare GPU image may lack train.py's packages


@pytest.mark.slow  # long (end to end); `-m slow` runs it
@kernel
@pytest.mark.skipif(not _importable(*TRAIN_PACKAGES), reason=f"train.py needs {', '.join(TRAIN_PACKAGES)}")
def test_train_py_with_fused_rmsnorm_probes_histograms_and_wandb(tmp_path, corpus):
    """train.py end to end on a fused_rmsnorm model (the kernels interpreted): stability probes and the norms'
    histograms every 2 steps (so the hooked norms run unfused on those steps and fused on the others), W&B on,
    validation and the text sample (a KV-cached generation through the fused blocks); summary.json says the
    kernel ran at every norm site and the histograms cover the feed-forward norms' inputs."""
    import json
    from pathlib import Path

    from helpers import compose_cfg
    from test_loggers import check_summary_is_copied

    import minillm.training.train as train_script

    accelerator = "cpu" if K._interpreting() else "gpu"  # where the kernels run: the interpreter, or a GPU
    cfg = compose_cfg(tmp_path, corpus, "norm=fused_rmsnorm", "logger=wandb", "trainer.max_steps=3", "test=false",
                      f"trainer.accelerator={accelerator}",
                      "data.batch_size=4", "++callbacks.text_sample.max_new_tokens=4",
                      "callbacks.stability.every_n_steps=2", "callbacks.histograms.every_n_steps=2")
    train_script.train(cfg)
    summary = json.loads((Path(cfg.paths.output_dir) / "summary.json").read_text())
    assert summary["norm_impl"] == {"fused_rmsnorm": "triton"} and summary["status"] == "completed", summary
    assert summary["final_val_loss"] < summary["loss_init"]
    run = check_summary_is_copied(cfg.paths.output_dir)
    hists = [row for row in run["history"] if "hist/layers.0.ffn_norm/input/_type" in row]
    assert [row["trainer/global_step"] for row in hists] == [0, 2]


@kernel
def test_fused_norm_on_a_cpu_trainer_where_kernels_are_built_for_cuda_is_a_config_error(monkeypatch):
    """On a GPU machine, norm=fused_rmsnorm with trainer.accelerator=cpu is refused before training with one
    line (it once failed inside the first forward: the kernel takes CUDA tensors); interpreted kernels take CPU
    tensors, so there it is allowed."""
    from minillm.errors import ConfigError
    from minillm.training.run.checks import check_fused_norm

    c = {"model": {"norm": "fused_rmsnorm"}, "trainer": {"accelerator": "cpu"}}
    monkeypatch.setattr(K, "require_fused", lambda *args, **kwargs: None)  # the kernels can run
    monkeypatch.setattr(K, "_INTERPRETED", True)
    check_fused_norm(c)  # interpreted: the CPU is where the kernels run
    monkeypatch.setattr(K, "_INTERPRETED", False)  # built for CUDA
    with pytest.raises(ConfigError, match=r"^norm=fused_rmsnorm with trainer.accelerator=cpu is invalid: .*"
                                          r"allowed: trainer=gpu"):
        check_fused_norm(c)
    check_fused_norm({**c, "trainer": {"accelerator": "gpu"}})


@kernel
@pytest.mark.parametrize("built_for", ["interpreter", "cuda"])
def test_flop_count_on_meta_tensors(monkeypatch, built_for):
    """The throughput callback counts FLOPs on meta tensors: the kernels' ops give the shapes (no launch), and the
    count is rmsnorm's (the matmuls); also where the kernels are built for a GPU (there, the CUDA-only check once
    refused meta tensors)."""
    from lightning.fabric.utilities.throughput import measure_flops

    with torch.device("meta"):
        models = {norm: Transformer(ModelConfig(vocab_size=32, dim=32, n_layers=2, n_heads=4, max_seq_len=16,
                                                norm=norm)) for norm in ("fused_rmsnorm", "rmsnorm")}
        idx = torch.randint(0, 32, (2, 16))
    if built_for == "cuda":  # as on a GPU machine: the kernels can run, and are not interpreted
        monkeypatch.setattr(K, "require_fused", lambda: None)
        monkeypatch.setattr(K, "_INTERPRETED", False)

    def flops(norm: str) -> int:
        return measure_flops(models[norm], lambda: models[norm](idx), lambda y: y.float().square().mean())

    assert flops("fused_rmsnorm") == flops("rmsnorm") > 0
