"""Norm modules (minillm/norms/): every registered norm against its formula, in every dtype, with its
options; the seeds' formulas and worked examples; DyT, ScaleNorm and PowerNorm in detail.

Registry-driven: the tests over "every norm" read NORMS, so a new norm is tested without editing a list, and
test_every_registered_norm_has_a_reference_formula fails until its formula is written down here
(docs/extending.md, "A norm")."""

import copy
import math
import warnings

import pytest
import torch
import torch.nn.functional as F
from helpers import EAGER_NORMS, randn, randomize, tiny, tokens
from helpers import norm_kwargs as kw
from torch import nn

from minillm.model import Transformer
from minillm.norms import NORMS, BatchNorm, DyT, LayerNorm, PowerNorm, RMSNorm, ScaleNorm, build_norm, norm_options
from minillm.norms.base import Implemented

SHAPES = [(2, 5, 8), (3, 7, 33), (1, 1, 16)]
TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 2e-3}


# --- every registered norm: its formula, its interface ------------------------------------------------------

# y = norm(x) for a fresh (then randomized) module's first forward in train mode, in float64
REFERENCES = {
    "layernorm": lambda x, m: F.layer_norm(x, x.shape[-1:], m.weight.double(), m.bias.double(), m.eps),
    "rmsnorm": lambda x, m: x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + m.eps) * m.weight.double(),
    "fused_rmsnorm": lambda x, m: x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + m.eps) * m.weight.double(),
    "batchnorm": lambda x, m: ((x - x.mean(0)) / torch.sqrt(x.var(0, unbiased=False) + m.eps) * m.weight.double()
                               + m.bias.double()),  # per-position batch statistics
    "none": lambda x, m: x,
    "dyt": lambda x, m: m.weight.double() * torch.tanh(m.alpha.double() * x) + m.bias.double(),
    "derf": lambda x, m: m.weight.double() * torch.erf(m.alpha.double() * x + m.shift.double()) + m.bias.double(),
    "powernorm": lambda x, m: m.weight.double() * x / math.sqrt(1.0 + m.eps) + m.bias.double(),  # psi_0^2 = 1
    "scalenorm": lambda x, m: m.weight.double() * x / x.norm(dim=-1, keepdim=True).clamp_min(m.eps),
}


def test_every_registered_norm_has_a_reference_formula():
    assert set(REFERENCES) == set(NORMS), "write the new norm's formula into REFERENCES"


@pytest.mark.parametrize("name", sorted(NORMS))
def test_every_registered_norm_matches_its_formula(name):
    norm = randomize(build_norm(name, 16, **kw(name)))
    x = randn(4, 5, 16, scale=2.0)
    torch.testing.assert_close(norm.train()(x).double(), REFERENCES[name](x.double(), norm), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", EAGER_NORMS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_every_norm_keeps_shape_and_dtype_and_resets(name, dtype):
    norm = build_norm(name, 16, **kw(name))
    assert {n for n, _ in norm.named_parameters()} <= {"weight", "bias", "alpha", "shift"}  # scalars: DyT, Derf
    x = randn(3, 8, 16, dtype=dtype)
    for mode in (True, False):
        y = norm.train(mode)(x)
        assert y.shape == x.shape and y.dtype == dtype and torch.isfinite(y).all()
    fresh = build_norm(name, 16, **kw(name))
    with torch.no_grad():
        for p in norm.parameters():
            p.add_(0.37)
    norm.reset_parameters()
    for (k, a), b in zip(norm.state_dict().items(), fresh.state_dict().values(), strict=True):
        torch.testing.assert_close(a, b, msg=k)


@pytest.mark.parametrize("name", EAGER_NORMS)
def test_fp16_large_activations_reduce_in_fp32(name):
    """|x| ~ 1e3 in fp16: x**2 overflows 65504 in fp16, but every norm reduces in fp32."""
    x16 = randn(4, 6, 32, scale=1000.0).half()
    assert torch.isinf(x16.pow(2).sum(-1)).all()  # what a norm without the upcast would hit
    norm = randomize(build_norm(name, 32, **kw(name, 6))).train(name != "powernorm")
    y16, y32 = norm(x16), norm(x16.float())
    assert torch.isfinite(y16).all()
    torch.testing.assert_close(y16.float(), y32, atol=4e-3, rtol=2e-3)


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
    with pytest.raises(ValueError, match="eps_mode='sqrt'.*inside, outside"):
        build_norm(name, 8, eps_mode="sqrt", **kw(name))


def test_every_norm_takes_eps_mode_where_it_normalizes():
    for name in ("layernorm", "rmsnorm", "batchnorm", "fused_rmsnorm"):
        assert "eps_mode" in norm_options(name)


def test_parameter_counts_per_norm():
    H = 64
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    assert count(build_norm("layernorm", H)) == 2 * H
    assert count(build_norm("rmsnorm", H)) == H
    bn = build_norm("batchnorm", H, max_seq_len=10)
    assert count(bn) == 2 * H
    assert {k for k, _ in bn.named_buffers()} == {"running_mean", "running_var", "num_batches_tracked"}
    assert count(build_norm("none", H)) == 0


# --- LayerNorm ----------------------------------------------------------------------------------------


def test_layernorm_worked_example_by_hand():
    x = torch.tensor([[1.0, 2.0, 3.0, 4.0], [-1.0, -2.0, -3.0, -4.0]])
    y = build_norm("layernorm", 4, eps=0.0)(x[None])[0]
    expected = torch.tensor([[-1.342, -0.447, 0.447, 1.342], [1.342, 0.447, -0.447, -1.342]])
    torch.testing.assert_close(y, expected, atol=5e-4, rtol=0)


def test_layernorm_uses_the_biased_variance():
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


def test_layernorm_gain_and_bias_gradients_by_hand():
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


def test_rmsnorm_is_the_llama_formula():
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
def test_eps_outside_divides_by_std_plus_eps(name):
    eps, x = 0.1, randn(4, 3, 8) * 0.2
    norm = build_norm(name, 8, eps=eps, eps_mode="outside", **({"max_seq_len": 3} if name == "batchnorm" else {}))
    dims = {"layernorm": -1, "rmsnorm": -1, "batchnorm": 0}[name]
    mu = 0 if name == "rmsnorm" else x.mean(dims, keepdim=True)
    std = ((x - mu) ** 2).mean(dims, keepdim=True).sqrt()
    torch.testing.assert_close(norm(x), (x - mu) / (std + eps))
    inside = build_norm(name, 8, eps=eps, **({"max_seq_len": 3} if name == "batchnorm" else {}))
    assert not torch.allclose(norm(x), inside(x), atol=1e-3)


@pytest.mark.parametrize("name", EAGER_NORMS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_matches_fp32_within_rounding(name, dtype):
    norm = randomize(build_norm(name, 24, **kw(name, 5)))
    norm.train(name != "powernorm")  # powernorm's train-mode forward moves the running statistics it reads
    x = randn(3, 5, 24, dtype=dtype)
    torch.testing.assert_close(norm(x).float(), norm(x.float()), atol=TOL[dtype] * 4, rtol=TOL[dtype])


@pytest.mark.parametrize("name", EAGER_NORMS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_backward_matches_fp32(name, dtype):
    """Input and parameter gradients of a bf16/fp16 input (fp32 parameters, as under autocast) match the
    fp32 computation on the same values, in train mode (batch statistics, PowerNorm's approximate backward)."""
    norm = randomize(build_norm(name, 24, **kw(name, 5))).train()
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


def reference_batchnorm_step(x, rm, rv, momentum, eps):
    """A from-scratch BatchNorm training step (running statistics, biased variance), rows = samples."""
    mean, var = x.mean(0), x.var(0, unbiased=False)
    rm = (1 - momentum) * rm + momentum * mean
    rv = (1 - momentum) * rv + momentum * var
    return (x - mean) / torch.sqrt(var + eps), rm, rv


def test_pooled_batchnorm_is_a_from_scratch_batchnorm_and_warns():
    with pytest.warns(UserWarning, match="sees later tokens"):
        bn = BatchNorm(6, stats="pooled", momentum=0.2)
    rm, rv = torch.zeros(6), torch.ones(6)
    for k in range(4):
        x = randn(8, 1, 6, seed=k) * (k + 1)
        ref, rm, rv = reference_batchnorm_step(x[:, 0], rm, rv, 0.2, bn.eps)
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
    n = 4 * 7  # torch keeps the unbiased running variance; ours keeps the biased one
    torch.testing.assert_close(ours.running_var, 0.9 + (ref.running_var - 0.9) * (n - 1) / n)


def test_position_batchnorm_statistics_are_per_position():
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
def test_batchnorm_input_gradient_formula(stats):
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


# --- options, DyT, ScaleNorm, PowerNorm ------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, options, message",
    [
        ("dyt", {"alpha0": 0.0}, r"alpha0=0.0 is invalid; allowed: a finite number > 0$"),
        ("powernorm", {"alpha_fwd": 1.5, "max_seq_len": 4}, r"alpha_fwd=1.5 is invalid; allowed: a finite number >= 0 "
                                                            r"and <= 1$"),
        ("powernorm", {"warmup_steps": -1, "max_seq_len": 4}, "warmup_steps=-1 is invalid; allowed: an integer >= 0$"),
        ("powernorm", {}, "needs max_seq_len"),
        ("powernorm", {"stats": "token", "max_seq_len": 4}, "stats='token' is invalid; allowed: position, pooled$"),
        ("powernorm", {"group_scaling": 3, "max_seq_len": 4}, "group_scaling=3 is invalid; allowed: 0 .* dim=8$"),
        ("scalenorm", {"bias": True}, r"'scalenorm' does not take option\(s\) \['bias'\]"),
    ],
)
def test_bad_options_are_clear_errors(name, options, message):
    with pytest.raises(ValueError, match=message):
        build_norm(name, 8, **options)


def test_dyt_is_gamma_tanh_alpha_x_plus_beta_and_bounded():
    norm = randomize(DyT(16, alpha0=0.7))
    x = randn(4, 5, 16, scale=3.0)
    torch.testing.assert_close(norm(x), norm.weight * torch.tanh(0.7 * x) + norm.bias)
    huge = randn(4, 5, 16, scale=1e4, seed=3)
    bound = (norm.weight.abs() + norm.bias.abs()).detach()
    y = norm(huge)
    assert torch.all(y.abs() <= bound + 1e-6)
    assert torch.allclose(y.abs().amax((0, 1)), bound, rtol=0.2)  # the bound is reached by saturated inputs


def test_derf_is_gamma_erf_alpha_x_plus_s_plus_beta_with_a_learnable_shift():
    """Chen et al. 2025: Derf(x) = gamma * erf(alpha x + s) + beta; alpha and s learnable scalars (s from 0)."""
    norm = randomize(build_norm("derf", 8, alpha0=0.7))
    assert norm.alpha.item() == pytest.approx(0.7) and norm.shift.item() == 0.0
    assert sum(p.numel() for p in norm.parameters()) == 2 * 8 + 2
    with torch.no_grad():
        norm.shift.fill_(0.3)
    x, dy = randn(2, 3, 8, scale=2.0), randn(2, 3, 8, seed=2)
    y = norm(x)
    torch.testing.assert_close(y, norm.weight * torch.erf(0.7 * x + 0.3) + norm.bias)
    (y * dy).sum().backward()
    d_erf = 2 / math.sqrt(math.pi) * torch.exp(-(0.7 * x + 0.3) ** 2)  # erf'(u) = 2/sqrt(pi) exp(-u^2)
    torch.testing.assert_close(norm.shift.grad, (dy * norm.weight * d_erf).sum().detach().view(1))
    torch.testing.assert_close(norm.alpha.grad, (dy * norm.weight * d_erf * x).sum().detach().view(1))
    bound = (norm.weight.abs() + norm.bias.abs()).detach()
    assert torch.all(norm(randn(4, 5, 8, scale=1e4, seed=3)).abs() <= bound + 1e-6)
    norm.reset_parameters()
    assert norm.shift.item() == 0.0 and norm.alpha.item() == pytest.approx(0.7)


def test_dyt_alpha_is_one_learnable_scalar_with_alpha0():
    assert build_norm("dyt", 8).alpha.item() == 0.5  # the paper's default
    norm = build_norm("dyt", 8, alpha0=0.8)
    assert norm.alpha.numel() == 1 and norm.alpha.requires_grad and norm.alpha.item() == pytest.approx(0.8)
    assert sum(p.numel() for p in norm.parameters()) == 2 * 8 + 1
    assert sum(p.numel() for p in build_norm("dyt", 8, bias=False).parameters()) == 8 + 1
    x, dy = randn(2, 3, 8), randn(2, 3, 8, seed=2)
    (norm(x) * dy).sum().backward()
    expected = (dy * norm.weight * x / torch.cosh(0.8 * x) ** 2).sum()  # d tanh(a x)/da = x sech^2(a x)
    torch.testing.assert_close(norm.alpha.grad, expected.detach().view(1))
    with torch.no_grad():
        norm.alpha.fill_(3.0)
    norm.reset_parameters()
    assert norm.alpha.item() == pytest.approx(0.8)


def test_scalenorm_output_norm_is_g_at_every_position():
    norm = ScaleNorm(24)
    assert [n for n, _ in norm.named_parameters()] == ["weight"] and norm.weight.numel() == 1
    assert norm.weight.item() == pytest.approx(math.sqrt(24))
    scales = torch.logspace(-3, 3, 7).view(1, 7, 1)  # positions of very different sizes
    x = randn(3, 7, 24) * scales
    for g in (math.sqrt(24), -2.5, 0.3):
        with torch.no_grad():
            norm.weight.fill_(g)
        y = norm(x)
        torch.testing.assert_close(y.norm(dim=-1), torch.full((3, 7), abs(g)), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(y, g * x / x.norm(dim=-1, keepdim=True))
        torch.testing.assert_close(norm(5.0 * x), y)  # scale invariant


def test_scalenorm_clamps_the_norm_at_eps():
    norm = ScaleNorm(4, eps=1e-2)
    x = torch.zeros(1, 2, 4)
    x[0, 1] = 1e-4
    y = norm(x)
    torch.testing.assert_close(y, 2.0 * x / 1e-2)  # sqrt(4) * x / max(||x||, eps)
    x.requires_grad_()
    norm(x).sum().backward()
    assert torch.isfinite(x.grad).all()


def pn_step(x, dy, psi2, nu, w, b, a_fwd, a_bwd, eps, dims):
    """Algorithm 1 of Shen et al. 2020 written out: forward with psi_{t-1}, approximate backward, updates."""
    inv = 1.0 / torch.sqrt(psi2 + eps)
    x_hat = x * inv
    g = w * dy  # dL/dx_hat
    dx = (g - nu * x_hat) * inv
    nu_new = nu * (1 - (1 - a_bwd) * (x_hat * x_hat).mean(dims)) + (1 - a_bwd) * (g * x_hat).mean(dims)
    psi2_new = a_fwd * psi2 + (1 - a_fwd) * (x * x).mean(dims)
    return w * x_hat + b, dx, (dy * x_hat).sum((0, 1)), dy.sum((0, 1)), x_hat, psi2_new, nu_new


@pytest.mark.parametrize("stats", ["position", "pooled"])
def test_powernorm_forward_backward_and_running_stats_follow_algorithm_1(stats):
    T, L = 5, 7  # rows T..L-1 of the per-position buffers are never touched
    pn = randomize(PowerNorm(6, stats=stats, max_seq_len=L, alpha_fwd=0.8, alpha_bwd=0.7))
    dims, shape = ((0,), (T, 6)) if stats == "position" else ((0, 1), (6,))
    psi2, nu = torch.ones(shape), torch.zeros(shape)
    w, b = pn.weight.detach().clone(), pn.bias.detach().clone()
    rows = slice(0, T) if stats == "position" else slice(None)
    for k in range(4):
        x = randn(8, T, 6, seed=k, scale=k + 1.0).requires_grad_()
        dy = randn(8, T, 6, seed=10 + k)
        pn.zero_grad()
        y = pn.train()(x)
        (y * dy).sum().backward()
        ref = pn_step(x.detach(), dy, psi2, nu, w, b, 0.8, 0.7, pn.eps, dims)
        y_ref, dx, dw, db, x_hat, psi2_new, nu_new = ref
        torch.testing.assert_close(y, y_ref)
        torch.testing.assert_close(x.grad, dx, atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(pn.weight.grad, dw, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(pn.bias.grad, db)
        # plain autograd of the same forward treats psi_{t-1} as a constant: it lacks -nu_{t-1} x_hat / psi
        plain = w * dy / torch.sqrt(psi2 + pn.eps)
        correction = -nu * x_hat / torch.sqrt(psi2 + pn.eps)
        torch.testing.assert_close(x.grad - plain, correction, atol=1e-6, rtol=1e-5)
        assert torch.allclose(x.grad, plain) == (k == 0)  # nu_0 = 0: only the first step agrees
        psi2, nu = psi2_new, nu_new
        torch.testing.assert_close(pn.running_psi2[rows], psi2)
        torch.testing.assert_close(pn.running_nu[rows], nu)
    if stats == "position":
        assert torch.all(pn.running_psi2[T:] == 1) and torch.all(pn.running_nu[T:] == 0)
    assert pn.num_batches_tracked == 4
    x = randn(8, T, 6, seed=42)
    before = pn.running_psi2.clone()
    torch.testing.assert_close(pn.eval()(x), w * x / torch.sqrt(psi2 + pn.eps) + b)  # eval: psi_T
    assert torch.equal(pn.running_psi2, before)


def test_powernorm_approximate_backward_is_exact_at_a_fixed_point_of_the_running_statistics():
    """With psi^2 already at this batch's quadratic mean, the second step's approximate gradient equals the
    exact gradient of x / sqrt(a psi^2 + (1 - a) mean_batch(x^2) + eps): nu carries the (1 - a) term."""
    a = 0.9
    pn = PowerNorm(6, max_seq_len=5, alpha_fwd=a, alpha_bwd=a, affine=False)
    x, dy = randn(8, 5, 6, scale=2.0), randn(8, 5, 6, seed=1)
    m = x.pow(2).mean(0)
    with torch.no_grad():
        pn.running_psi2.copy_(m)
    for _ in range(2):
        xa = x.clone().requires_grad_()
        (pn.train()(xa) * dy).sum().backward()
    torch.testing.assert_close(pn.running_psi2, m)  # a fixed point
    xe = x.clone().requires_grad_()
    (xe / torch.sqrt(a * m + (1 - a) * xe.pow(2).mean(0) + pn.eps) * dy).sum().backward()
    torch.testing.assert_close(xa.grad, xe.grad, atol=1e-6, rtol=1e-5)
    assert not torch.allclose(xa.grad, dy / torch.sqrt(m + pn.eps), atol=1e-4)  # psi-as-constant gradient


def test_powernorm_does_not_center_unlike_batchnorm():
    x, c = randn(8, 5, 6), 3.0
    bn = BatchNorm(6, max_seq_len=5)
    torch.testing.assert_close(bn.train()(x + c), bn.train()(x), atol=1e-5, rtol=1e-5)  # BN removes a shift
    pnv = PowerNorm(6, max_seq_len=5, warmup_steps=100)  # batch quadratic mean (PN-V)
    y = pnv.train()(x)
    torch.testing.assert_close(y, x / torch.sqrt(x.pow(2).mean(0) + pnv.eps))
    assert not torch.allclose(pnv.train()(x + c), y, atol=1e-2)
    pn = PowerNorm(6, max_seq_len=5).eval()  # Algorithm 1: the shift passes through, scaled by 1/psi
    torch.testing.assert_close(pn(x + c) - pn(x), torch.full_like(x, c / math.sqrt(1 + pn.eps)))


def test_powernorm_warmup_uses_batch_statistics_then_their_average():
    pn = PowerNorm(4, max_seq_len=3, warmup_steps=3, alpha_fwd=0.5)
    xs = [randn(6, 3, 4, seed=k, scale=k + 1.0) for k in range(4)]
    for x in xs[:3]:
        torch.testing.assert_close(pn.train()(x), x / torch.sqrt(x.pow(2).mean(0) + pn.eps))
    avg = torch.stack([x.pow(2).mean(0) for x in xs[:3]]).mean(0)
    torch.testing.assert_close(pn.running_psi2, avg)
    torch.testing.assert_close(pn.train()(xs[3]), xs[3] / torch.sqrt(avg + pn.eps))  # Algorithm 1 from here
    torch.testing.assert_close(pn.running_psi2, 0.5 * avg + 0.5 * xs[3].pow(2).mean(0))


@pytest.mark.parametrize("stats, warmup, causal", [("position", 0, True), ("position", 5, True),
                                                   ("pooled", 0, True), ("pooled", 5, False)])
def test_powernorm_train_mode_causality(stats, warmup, causal):
    """Running statistics in the forward never mix positions; only a pooled warmup (batch statistics over
    time) lets position t see later tokens, and only that case warns."""
    with pytest.warns(UserWarning, match="sees later tokens") if not causal else warnings.catch_warnings():
        if causal:
            warnings.simplefilter("error")
        pn = PowerNorm(8, stats=stats, warmup_steps=warmup, max_seq_len=6)
    x = randn(4, 6, 8)
    later = x.clone()
    later[:, 4:] += randn(4, 2, 8, seed=5, scale=3.0)
    state = {k: v.clone() for k, v in pn.state_dict().items()}
    a = pn.train()(x)
    pn.load_state_dict(state)
    b = pn.train()(later)
    assert torch.allclose(a[:, :4], b[:, :4], atol=1e-6, rtol=0) == causal


def test_powernorm_group_scaling_divides_each_token_by_its_group_rms_first():
    pn, ref = PowerNorm(8, max_seq_len=3, group_scaling=2), PowerNorm(8, max_seq_len=3)
    x = randn(5, 3, 8, scale=4.0)
    xg = x.view(5, 3, 2, 4)
    scaled = (xg / torch.sqrt(xg.pow(2).mean(-1, keepdim=True) + pn.eps)).view(5, 3, 8)
    for _ in range(3):
        torch.testing.assert_close(pn.train()(x), ref.train()(scaled))
    torch.testing.assert_close(pn.running_psi2, ref.running_psi2)
    torch.testing.assert_close(pn.eval()(100.0 * x), ref.eval()(scaled), atol=1e-5, rtol=1e-5)  # scale-free


def test_powernorm_skips_a_non_finite_backward_term_and_keeps_its_state_in_the_state_dict():
    pn = PowerNorm(4, max_seq_len=3)
    x = randn(5, 3, 4).requires_grad_()
    dy = randn(5, 3, 4, seed=1)
    dy[0, 0, 0] = float("inf")  # an overflowed fp16 step
    (pn.train()(x) * dy).sum().backward()
    assert torch.isfinite(pn.running_nu).all() and pn.running_nu[0, 0] == 0 and pn.running_nu[1, 0] != 0
    assert {k for k, _ in pn.named_buffers()} == {"running_psi2", "running_nu", "num_batches_tracked"}
    fresh = PowerNorm(4, max_seq_len=3)
    fresh.load_state_dict(pn.state_dict())
    x2 = randn(5, 3, 4, seed=7)
    torch.testing.assert_close(fresh.eval()(x2), pn.eval()(x2))



# --- implementations (minillm/norms/impl.py) -----------------------------------------------------------------

IMPLEMENTED = [name for name in EAGER_NORMS if issubclass(NORMS[name], Implemented)]


def _run_impl(name: str, impl: str, x: torch.Tensor, **options) -> tuple[list[torch.Tensor], torch.nn.Module]:
    """Output, input gradient and parameter gradients of the norm under an implementation."""
    norm = randomize(build_norm(name, x.shape[-1], impl=impl, **kw(name), **options))
    xi = x.clone().requires_grad_(True)
    y = norm(xi)
    grads = torch.autograd.grad((y.float() * torch.linspace(-1, 1, y.numel()).view_as(y)).sum(),
                                [xi, *norm.parameters()])
    return [y, *grads], norm


@pytest.mark.parametrize("name", IMPLEMENTED)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_torch_implementation_matches_the_reference(name, dtype):
    x = randn(3, 7, 24, scale=2.0, dtype=dtype)
    ref, _ = _run_impl(name, "reference", x)
    got, norm = _run_impl(name, "torch", x)
    assert norm.impl_used == ("torch" if name in ("layernorm", "rmsnorm") else "reference")  # fused where torch has one
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)
    for a, b in zip(got, ref, strict=True):
        assert a.dtype == b.dtype
        torch.testing.assert_close(a.float(), b.float(), **tol)


def test_compiled_implementation_matches_the_reference():
    """One compiled graph per norm function, shared by its modules; outputs and gradients as the reference."""
    x = randn(2, 5, 16, scale=2.0)
    for name in IMPLEMENTED:
        ref, _ = _run_impl(name, "reference", x)
        got, norm = _run_impl(name, "compiled", x)
        assert norm.impl_used == "compiled"
        for a, b in zip(got, ref, strict=True):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name, options", [("layernorm", {"eps_mode": "outside"}), ("rmsnorm", {"eps_mode": "outside"}),
                                           ("rmsnorm", {"zero_centered": True, "cast": "fp32"})])
def test_an_implementation_honours_the_options_or_the_reference_runs(name, options):
    x = randn(2, 5, 16, scale=2.0)
    ref, _ = _run_impl(name, "reference", x, **options)
    got, norm = _run_impl(name, "torch", x, **options)
    assert norm.impl_used == ("reference" if options.get("eps_mode") == "outside" else "torch")
    for a, b in zip(got, ref, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_auto_takes_torchs_fused_layernorm_on_the_cpu_and_every_impl_has_the_same_state_dict(monkeypatch):
    x = randn(2, 5, 16)
    auto = build_norm("layernorm", 16, impl="auto")
    auto(x)
    assert auto.impl_used == "torch"
    rms = build_norm("rmsnorm", 16, impl="auto")
    rms(x)
    assert rms.impl_used == "reference"  # torch has no fused CPU RMSNorm; compiled is asked for, not auto
    states = [build_norm("rmsnorm", 16, impl=i).state_dict() for i in ("reference", "torch", "compiled", "auto")]
    assert all(s.keys() == states[0].keys() for s in states)
    with pytest.raises(ValueError, match=r"model.norm_impl='fast' is invalid; allowed: auto, reference, torch"):
        build_norm("rmsnorm", 16, impl="fast")


def test_the_model_records_each_norms_implementation():
    from minillm.norms import impls_used

    model = Transformer(tiny(norm="layernorm", qk_norm="rmsnorm", norm_impl="torch"))
    assert impls_used(model) == {}  # nothing ran yet
    model(tokens())
    assert impls_used(model) == {"layernorm": "torch", "rmsnorm": "torch"}
