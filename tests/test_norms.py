"""Norm modules against torch modules, the seeds' formulas and their worked examples."""

import copy

import pytest
import torch
from torch import nn

from minillm.norms import NORMS, BatchNorm, LayerNorm, RMSNorm, build_norm, norm_options

EAGER = [n for n in NORMS if n != "fused_rmsnorm"]  # the fused kernel has its own tests
SHAPES = [(2, 5, 8), (3, 7, 33), (1, 1, 16)]
TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 2e-3}


def randn(*shape, dtype=torch.float32, scale=1.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * scale + 0.3).to(dtype)


def randomize(norm: nn.Module, seed: int = 1) -> nn.Module:
    """Non-trivial gain and bias, so parity tests exercise them."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in norm.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.5 + (1.0 if p.ndim else 0.0))
    return norm


# --- registry ---------------------------------------------------------------------------------------


def test_unknown_name_lists_valid_names():
    with pytest.raises(ValueError) as e:
        build_norm("groupnorm", 8)
    for name in NORMS:
        assert name in str(e.value)


def test_unknown_option_lists_accepted_options():
    with pytest.raises(ValueError, match=r"'rmsnorm' does not take option\(s\) \['bias'\].*eps_mode"):
        build_norm("rmsnorm", 8, bias=True)


@pytest.mark.parametrize("name", ["layernorm", "rmsnorm", "batchnorm"])
def test_bad_eps_mode_is_rejected(name):
    kw = {"max_seq_len": 8} if name == "batchnorm" else {}
    with pytest.raises(ValueError, match="eps_mode='sqrt'.*inside, outside"):
        build_norm(name, 8, eps_mode="sqrt", **kw)


def test_every_norm_takes_eps_mode_where_it_normalizes():
    for name in ("layernorm", "rmsnorm", "batchnorm", "fused_rmsnorm"):
        assert "eps_mode" in norm_options(name)


@pytest.mark.parametrize("name", EAGER)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_shape_and_dtype_kept(name, dtype):
    norm = build_norm(name, 16, **({"max_seq_len": 8} if name in ("batchnorm", "powernorm") else {}))
    x = randn(3, 8, 16, dtype=dtype)
    for mode in (True, False):
        y = norm.train(mode)(x)
        assert y.shape == x.shape and y.dtype == dtype


def test_parameter_counts_match_the_seed_table():
    H = 64
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    assert count(build_norm("layernorm", H)) == 2 * H
    assert count(build_norm("rmsnorm", H)) == H
    bn = build_norm("batchnorm", H, max_seq_len=10)
    assert count(bn) == 2 * H
    assert {k for k, _ in bn.named_buffers()} == {"running_mean", "running_var", "num_batches_tracked"}
    assert count(build_norm("none", H)) == 0


# --- LayerNorm ----------------------------------------------------------------------------------------


def test_layernorm_worked_example_seed004():
    x = torch.tensor([[1.0, 2.0, 3.0, 4.0], [-1.0, -2.0, -3.0, -4.0]])
    y = build_norm("layernorm", 4, eps=0.0)(x[None])[0]
    expected = torch.tensor([[-1.342, -0.447, 0.447, 1.342], [1.342, 0.447, -0.447, -1.342]])
    torch.testing.assert_close(y, expected, atol=5e-4, rtol=0)


def test_layernorm_uses_biased_variance_seed001():
    x = randn(2, 3, 6)
    y = build_norm("layernorm", 6, eps=0.0)(x)
    biased = (x - x.mean(-1, keepdim=True)) / x.var(-1, unbiased=False, keepdim=True).sqrt()
    unbiased = (x - x.mean(-1, keepdim=True)) / x.var(-1, keepdim=True).sqrt()  # torch.var's default
    torch.testing.assert_close(y, biased)
    assert not torch.allclose(y, unbiased, atol=1e-3)


@pytest.mark.parametrize("shape", SHAPES)
def test_layernorm_matches_torch_forward_and_backward(shape):
    C = shape[-1]
    ours, ref = randomize(LayerNorm(C, eps=1e-5)), nn.LayerNorm(C, eps=1e-5)
    ref.load_state_dict(ours.state_dict())
    x1 = randn(*shape).requires_grad_()
    x2 = x1.detach().clone().requires_grad_()
    dy = randn(*shape, seed=5)
    (ours(x1) * dy).sum().backward()
    (ref(x2) * dy).sum().backward()
    torch.testing.assert_close(ours(x1), ref(x2), atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(x1.grad, x2.grad, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ours.weight.grad, ref.weight.grad, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ours.bias.grad, ref.bias.grad, atol=1e-5, rtol=1e-5)


def test_layernorm_gamma_beta_gradients_seed001():
    """dbeta = sum(dy), dgamma = sum(dy * x_hat) over every position."""
    norm, x, dy = randomize(LayerNorm(12)), randn(4, 5, 12), randn(4, 5, 12, seed=3)
    (norm(x) * dy).sum().backward()
    x_hat = (x - x.mean(-1, keepdim=True)) / torch.sqrt(x.var(-1, unbiased=False, keepdim=True) + norm.eps)
    torch.testing.assert_close(norm.bias.grad, dy.sum((0, 1)))
    torch.testing.assert_close(norm.weight.grad, (dy * x_hat).sum((0, 1)), atol=1e-5, rtol=1e-5)


def test_layernorm_without_bias_or_affine():
    assert LayerNorm(8, bias=False).bias is None
    norm = LayerNorm(8, affine=False)
    assert list(norm.parameters()) == []
    x = randn(2, 3, 8)
    torch.testing.assert_close(norm(x), nn.functional.layer_norm(x, (8,)), atol=1e-6, rtol=1e-5)


# --- RMSNorm ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("eps", [1e-5, 1e-6])
def test_rmsnorm_matches_torch_forward_and_backward(shape, eps):
    C = shape[-1]
    ours, ref = randomize(RMSNorm(C, eps=eps)), nn.RMSNorm(C, eps=eps)
    ref.load_state_dict(ours.state_dict())
    x1 = randn(*shape).requires_grad_()
    x2 = x1.detach().clone().requires_grad_()
    dy = randn(*shape, seed=5)
    (ours(x1) * dy).sum().backward()
    (ref(x2) * dy).sum().backward()
    torch.testing.assert_close(ours(x1), ref(x2), atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(x1.grad, x2.grad, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ours.weight.grad, ref.weight.grad, atol=1e-5, rtol=1e-5)


def test_rmsnorm_is_llama_formula_seed000():
    x, norm = randn(2, 4, 10), randomize(RMSNorm(10, eps=1e-6))
    rms = torch.sqrt(torch.mean(x**2, dim=-1, keepdim=True) + 1e-6)
    torch.testing.assert_close(norm(x), x / rms * norm.weight)
    assert norm.bias is None


def test_rmsnorm_cast_orders_differ_only_by_rounding():
    x, w = randn(4, 8, 64, dtype=torch.bfloat16, scale=3.0), None
    llama, fp32 = randomize(RMSNorm(64, cast="llama")), RMSNorm(64, cast="fp32")
    fp32.load_state_dict(llama.state_dict())
    w = llama.weight.detach()
    exact = (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-5) * w)
    for norm in (llama, fp32):
        torch.testing.assert_close(norm(x).float(), exact, atol=0.05, rtol=2e-2)
    # fp32 order rounds once: never further from the exact value than LLaMA's order on average
    err = lambda n: (n(x).float() - exact).abs().mean()  # noqa: E731
    assert err(fp32) <= err(llama)
    assert not torch.equal(llama(x), fp32(x))
    x32 = x.float()
    torch.testing.assert_close(llama(x32), fp32(x32))


@pytest.mark.parametrize("name", ["layernorm", "rmsnorm"])
def test_zero_centered_gain_stores_w_minus_one(name):
    plain, zc = build_norm(name, 16), build_norm(name, 16, zero_centered=True)
    assert torch.all(zc.weight == 0) and torch.all(plain.weight == 1)
    x = randn(2, 3, 16)
    torch.testing.assert_close(plain(x), zc(x))
    with torch.no_grad():
        plain.weight.fill_(1.7)
        zc.weight.fill_(0.7)
    torch.testing.assert_close(plain(x), zc(x))


# --- eps placement, fp32 reduction --------------------------------------------------------------------


@pytest.mark.parametrize("name", ["layernorm", "rmsnorm", "batchnorm"])
def test_eps_outside_divides_by_std_plus_eps_seed002(name):
    eps, x = 0.1, randn(4, 3, 8) * 0.2
    norm = build_norm(name, 8, eps=eps, eps_mode="outside", **({"max_seq_len": 3} if name == "batchnorm" else {}))
    dims = {"layernorm": -1, "rmsnorm": -1, "batchnorm": 0}[name]
    mu = 0 if name == "rmsnorm" else x.mean(dims, keepdim=True)
    std = ((x - mu) ** 2).mean(dims, keepdim=True).sqrt()
    torch.testing.assert_close(norm(x), (x - mu) / (std + eps))
    inside = build_norm(name, 8, eps=eps, **({"max_seq_len": 3} if name == "batchnorm" else {}))
    assert not torch.allclose(norm(x), inside(x), atol=1e-3)


@pytest.mark.parametrize("name", ["layernorm", "rmsnorm", "batchnorm"])
def test_fp16_large_activations_reduce_in_fp32(name):
    """|x| ~ 1e3 in fp16: x**2 overflows 65504 in fp16, but the norm reduces in fp32."""
    x16 = randn(4, 6, 32, scale=1000.0).half()
    assert torch.isinf(x16.pow(2).sum(-1)).all()  # what a norm without the upcast would hit
    norm = build_norm(name, 32, **({"max_seq_len": 6} if name == "batchnorm" else {}))
    y16, y32 = norm(x16), norm(x16.float())
    assert torch.isfinite(y16).all()
    torch.testing.assert_close(y16.float(), y32, atol=4e-3, rtol=2e-3)


@pytest.mark.parametrize("name", EAGER)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_matches_fp32_within_rounding(name, dtype):
    kw = {"max_seq_len": 5} if name in ("batchnorm", "powernorm") else {}
    norm = randomize(build_norm(name, 24, **kw))
    norm.train(name != "powernorm")  # powernorm's train-mode forward moves the running statistics it reads
    x = randn(3, 5, 24, dtype=dtype)
    torch.testing.assert_close(norm(x).float(), norm(x.float()), atol=TOL[dtype] * 4, rtol=TOL[dtype])


@pytest.mark.parametrize("name", EAGER)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_backward_matches_fp32(name, dtype):
    """Input and parameter gradients of a bf16/fp16 input (fp32 parameters, as under autocast) match the
    fp32 computation on the same values, in train mode (batch statistics, PowerNorm's approximate backward)."""
    kw = {"max_seq_len": 5} if name in ("batchnorm", "powernorm") else {}
    norm = randomize(build_norm(name, 24, **kw)).train()
    x, dy = randn(3, 5, 24, dtype=dtype), randn(3, 5, 24, seed=7)
    grads = {}
    for dt in (dtype, torch.float32):
        module = copy.deepcopy(norm)  # the same running statistics for both passes
        xi = x.detach().to(dt).clone().requires_grad_()
        module(xi).backward(dy.to(dt))
        grads[dt] = [xi.grad] + [p.grad for p in module.parameters()]
    for low, ref in zip(grads[dtype], grads[torch.float32], strict=True):
        err = (low.float() - ref).abs().max() / ref.abs().max().clamp_min(1e-6)
        assert err < {torch.bfloat16: 4e-2, torch.float16: 1e-2}[dtype], err


# --- BatchNorm ----------------------------------------------------------------------------------------


def seed001_batchnorm_step(x, rm, rv, momentum, eps):
    """seeds/001's CustomBatchNorm (training branch), rows = samples."""
    mean, var = x.mean(0), x.var(0, unbiased=False)
    rm = (1 - momentum) * rm + momentum * mean
    rv = (1 - momentum) * rv + momentum * var
    return (x - mean) / torch.sqrt(var + eps), rm, rv


def test_pooled_batchnorm_is_seed001_custom_batchnorm_and_warns():
    with pytest.warns(UserWarning, match="sees later tokens"):
        bn = BatchNorm(6, stats="pooled", momentum=0.2)
    rm, rv = torch.zeros(6), torch.ones(6)
    for k in range(4):
        x = randn(8, 1, 6, seed=k) * (k + 1)
        ref, rm, rv = seed001_batchnorm_step(x[:, 0], rm, rv, 0.2, bn.eps)
        torch.testing.assert_close(bn.train()(x)[:, 0], ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(bn.running_mean, rm)
    torch.testing.assert_close(bn.running_var, rv)
    assert bn.num_batches_tracked == 4
    x = randn(8, 1, 6, seed=9)
    torch.testing.assert_close(bn.eval()(x)[:, 0], (x[:, 0] - rm) / torch.sqrt(rv + bn.eps))


def test_pooled_batchnorm_normalizes_like_torch_batchnorm1d():
    with pytest.warns(UserWarning):
        ours, ref = randomize(BatchNorm(6, stats="pooled")), nn.BatchNorm1d(6)
    with torch.no_grad():
        ref.weight.copy_(ours.weight)
        ref.bias.copy_(ours.bias)
    x = randn(4, 7, 6)
    torch.testing.assert_close(ours.train()(x), ref.train()(x.transpose(1, 2)).transpose(1, 2),
                               atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ours.running_mean, ref.running_mean)
    n = 4 * 7  # torch keeps the unbiased running variance; ours keeps the biased one (seeds/001)
    torch.testing.assert_close(ours.running_var, 0.9 + (ref.running_var - 0.9) * (n - 1) / n)


def test_position_batchnorm_statistics_are_per_position_seed002():
    bn = BatchNorm(5, max_seq_len=10, momentum=0.3)
    x = randn(6, 4, 5)
    mu, sigma = x.mean(0, keepdim=True), x.var(0, unbiased=False, keepdim=True)  # (1, T, C)
    torch.testing.assert_close(bn.train()(x), (x - mu) / torch.sqrt(sigma + bn.eps))
    # running stats: rows 0..T-1 follow the momentum formula, rows >= T untouched
    torch.testing.assert_close(bn.running_mean[:4], 0.3 * mu[0])
    torch.testing.assert_close(bn.running_var[:4], 0.7 + 0.3 * sigma[0])
    assert torch.all(bn.running_mean[4:] == 0) and torch.all(bn.running_var[4:] == 1)


def test_running_stats_after_k_steps_follow_momentum_formula_and_eval_uses_them():
    bn, m = BatchNorm(3, max_seq_len=5, momentum=0.1), 0.1
    rm, rv = torch.zeros(5, 3), torch.ones(5, 3)
    for k in range(5):
        x = randn(4, 5, 3, seed=k) * 2 + k
        bn.train()(x)
        rm = (1 - m) * rm + m * x.mean(0)
        rv = (1 - m) * rv + m * x.var(0, unbiased=False)
    torch.testing.assert_close(bn.running_mean, rm)
    torch.testing.assert_close(bn.running_var, rv)
    x = randn(4, 5, 3, seed=42)
    y_eval = bn.eval()(x)
    torch.testing.assert_close(y_eval, (x - rm) / torch.sqrt(rv + bn.eps))
    assert not torch.allclose(bn.train()(x), y_eval, atol=1e-3)  # train != eval
    after_train = bn.running_mean.clone()
    bn.eval()(x)
    assert torch.equal(bn.running_mean, after_train)  # eval reads the running statistics, never updates them


def test_batchnorm_running_stats_are_in_the_state_dict():
    bn = BatchNorm(4, max_seq_len=3)
    bn.train()(randn(2, 3, 4))
    sd = bn.state_dict()
    fresh = BatchNorm(4, max_seq_len=3)
    fresh.load_state_dict(sd)
    torch.testing.assert_close(fresh.running_var, bn.running_var)
    x = randn(2, 3, 4, seed=7)
    torch.testing.assert_close(fresh.eval()(x), bn.eval()(x))


@pytest.mark.parametrize("stats", ["position", "pooled"])
def test_batchnorm_input_gradient_formula_seed000(stats):
    """dx_i = g / sqrt(var + eps) * (dy_i - mean_j dy_j - x_hat_i * mean_j(dy_j x_hat_j)), j over the batch."""
    bn = randomize(BatchNorm(4, stats=stats, max_seq_len=3))
    x, dy = randn(5, 3, 4).requires_grad_(), randn(5, 3, 4, seed=2)
    (bn.train()(x) * dy).sum().backward()
    dims = (0,) if stats == "position" else (0, 1)
    xd = x.detach()
    mu, var = xd.mean(dims, keepdim=True), xd.var(dims, unbiased=False, keepdim=True)
    x_hat = (xd - mu) / torch.sqrt(var + bn.eps)
    g = bn.weight.detach()
    formula = g / torch.sqrt(var + bn.eps) * (dy - dy.mean(dims, keepdim=True)
                                              - x_hat * (dy * x_hat).mean(dims, keepdim=True))
    torch.testing.assert_close(x.grad, formula, atol=1e-5, rtol=1e-4)


def test_position_batchnorm_needs_max_seq_len_and_rejects_longer_inputs():
    with pytest.raises(ValueError, match="needs max_seq_len"):
        BatchNorm(4)
    with pytest.raises(ValueError, match="exceeds batchnorm max_seq_len=3"):
        BatchNorm(4, max_seq_len=3)(randn(2, 4, 4))


def test_none_is_identity():
    x = randn(2, 3, 4)
    assert build_norm("none", 4)(x) is x
