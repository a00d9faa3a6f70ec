"""The comparison matrix (issue 6): DyT, PowerNorm, ScaleNorm, each norm x placement through Hydra, z-loss."""

from __future__ import annotations

import inspect
import math
import warnings

import pytest
import torch
import torch.nn.functional as F
from helpers import CONFIGS, compose_cfg
from hydra.utils import instantiate
from omegaconf import OmegaConf
from torch import nn

import minillm.train as train_script
from minillm.lit_module import LitLM
from minillm.model import PLACEMENTS, ModelConfig, Transformer
from minillm.norms import NORMS, BatchNorm, DyT, LayerNorm, PowerNorm, RMSNorm, ScaleNorm, build_norm
from minillm.norms import norm_options as accepted_options

NEW = ["dyt", "powernorm", "scalenorm"]
CORPUS_CHARS = 3000
NORM_FILES = sorted(p.stem for p in (CONFIGS / "norm").glob("*.yaml"))
V = 37


def randn(*shape, scale=1.0, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * scale + 0.3).to(dtype)


def randomize(norm: nn.Module, seed: int = 1) -> nn.Module:
    """Non-trivial gains and biases (alpha of DyT excluded)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in norm.named_parameters():
            if name in ("weight", "bias"):
                p.copy_(torch.randn(p.shape, generator=g) * 0.5 + (1.0 if name == "weight" else 0.0))
    return norm


def kw(name: str, T: int = 8) -> dict:
    return {"max_seq_len": T} if getattr(NORMS[name], "uses_positions", False) else {}


def tiny(**k) -> ModelConfig:
    # mix_fraction 0.5: placement="mix" makes layer 0 Post-LN and layer 1 Pre-LN (a real mix at 2 layers)
    base = dict(vocab_size=V, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, max_seq_len=16, mix_fraction=0.5)
    return ModelConfig(**{**base, **k})


# --- the one interface ------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", NEW)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_new_norms_keep_shape_and_dtype_and_reset(name, dtype):
    norm = build_norm(name, 16, **kw(name))
    assert {n for n, _ in norm.named_parameters()} <= {"weight", "bias", "alpha"}
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


@pytest.mark.parametrize("name", ["powernorm", "scalenorm", "dyt"])
def test_fp16_large_activations_reduce_in_fp32(name):
    x16 = randn(4, 6, 32, scale=1000.0).half()
    assert torch.isinf(x16.pow(2).sum(-1)).all()
    norm = randomize(build_norm(name, 32, **kw(name, 6))).eval()
    y16, y32 = norm(x16), norm(x16.float())
    assert torch.isfinite(y16).all()
    torch.testing.assert_close(y16.float(), y32, atol=4e-3, rtol=2e-3)


@pytest.mark.parametrize(
    "name, options, message",
    [
        ("dyt", {"alpha0": 0.0}, "alpha0=0.0 must be a finite number > 0"),
        ("powernorm", {"alpha_fwd": 1.5, "max_seq_len": 4}, r"alpha_fwd=1.5 must be in \[0, 1\]"),
        ("powernorm", {"warmup_steps": -1, "max_seq_len": 4}, "warmup_steps=-1 must be an integer >= 0"),
        ("powernorm", {}, "needs max_seq_len"),
        ("powernorm", {"stats": "token", "max_seq_len": 4}, "stats='token' is not valid; allowed: position"),
        ("powernorm", {"group_scaling": 3, "max_seq_len": 4}, "group_scaling=3 must be 0 .* dim=8"),
        ("scalenorm", {"bias": True}, r"'scalenorm' does not take option\(s\) \['bias'\]"),
    ],
)
def test_bad_options_are_clear_errors(name, options, message):
    with pytest.raises(ValueError, match=message):
        build_norm(name, 8, **options)


# --- DyT ------------------------------------------------------------------------------------------------


def test_dyt_is_gamma_tanh_alpha_x_plus_beta_and_bounded():
    norm = randomize(DyT(16, alpha0=0.7))
    x = randn(4, 5, 16, scale=3.0)
    torch.testing.assert_close(norm(x), norm.weight * torch.tanh(0.7 * x) + norm.bias)
    huge = randn(4, 5, 16, scale=1e4, seed=3)
    bound = (norm.weight.abs() + norm.bias.abs()).detach()
    y = norm(huge)
    assert torch.all(y.abs() <= bound + 1e-6)
    assert torch.allclose(y.abs().amax((0, 1)), bound, rtol=0.2)  # the bound is reached by saturated inputs


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


def test_dyt_alpha0_reaches_every_dyt_of_the_model():
    m = Transformer(tiny(norm="dyt", norm_options={"alpha0": 0.25}))
    dyts = [mod for mod in m.modules() if isinstance(mod, DyT)]
    assert len(dyts) == 2 * 2 + 1 and all(d.alpha.item() == 0.25 for d in dyts)


# --- ScaleNorm ------------------------------------------------------------------------------------------


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


# --- PowerNorm -----------------------------------------------------------------------------------------


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


# --- the model: loss at init, overfit ---------------------------------------------------------------------


@pytest.mark.parametrize("placement", PLACEMENTS)
@pytest.mark.parametrize("norm", NEW)
def test_loss_at_init_is_about_ln_vocab(norm, placement):
    torch.manual_seed(0)
    idx = torch.randint(0, V, (3, 12), generator=torch.Generator().manual_seed(0))
    logits = Transformer(tiny(norm=norm, placement=placement))(idx)
    loss = F.cross_entropy(logits.flatten(0, 1), idx.roll(1, 1).flatten())
    assert abs(loss.item() - math.log(V)) < 0.15


# Where the defaults do not fit (documented in minillm/norms.py): DyT as Post-LN with alpha0 = 0.5 halves the
# residual stream at every sublayer (tanh(x / 2) ~ x / 2), and PowerNorm's Algorithm 1 alone diverges on
# branch outputs (peri, branch) unless the authors' per-token group scaling comes first.
OVERFIT_OPTIONS = {("dyt", "post"): {"alpha0": 1.0}, ("powernorm", "peri"): {"group_scaling": 1},
                   ("powernorm", "branch"): {"group_scaling": 1}}


@pytest.mark.parametrize("placement", PLACEMENTS)
@pytest.mark.parametrize("norm", NEW)
def test_tiny_model_overfits_one_batch(norm, placement):
    torch.manual_seed(0)
    options = OVERFIT_OPTIONS.get((norm, placement), {})
    model = Transformer(tiny(norm=norm, placement=placement, norm_options=options))
    idx = torch.randint(0, V, (4, 16), generator=torch.Generator().manual_seed(3))
    x, y = idx[:, :-1], idx[:, 1:]
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0)
    losses = []
    for _ in range(60):
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        losses.append(loss.item())
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert losses[-1] < 0.25 * losses[0], losses[::10]


# --- placements: defining properties not covered in test_model.py -------------------------------------------


@pytest.mark.parametrize("placement, bounded", [("peri", True), ("branch", True), ("pre", False)])
def test_peri_and_branch_normalize_the_branch_output(placement, bounded):
    """x + norm(f(...)): each sublayer adds a unit-RMS increment (gain 1), however large f's output is."""
    torch.manual_seed(0)
    model = Transformer(tiny(norm="rmsnorm", placement=placement))
    block, C = model.layers[0], 32
    with torch.no_grad():
        for w in (block.attn.wo, block.ffn.w2):
            w.weight.mul_(1000.0)
    x = randn(2, 6, C)
    cos, sin = model.rope_cos[:6], model.rope_sin[:6]
    increment = (block(x, cos, sin) - x).norm(dim=-1)  # (B, T): two sublayers, each adding norm sqrt(C)
    assert bool(torch.all(increment <= 2 * math.sqrt(C) + 1e-4)) == bounded
    if bounded:
        peri = placement == "peri"  # branch: no input norm, attn_norm sits on the output
        out_norm = block.attn_out_norm if peri else block.attn_norm
        h = x + out_norm(block.attn(block.attn_norm(x) if peri else x, cos, sin))
        torch.testing.assert_close((h - x).pow(2).mean(-1), torch.ones(2, 6), atol=1e-4, rtol=1e-4)


def test_deepnorm_scales_every_branch_weight_but_queries_and_keys():
    torch.manual_seed(0)
    L = 4
    b = Transformer(tiny(dim=128, n_layers=L, n_heads=4, n_kv_heads=4, placement="deepnorm")).layers[1]
    beta = (8 * L) ** -0.25
    xavier = lambda w: math.sqrt(2 / sum(w.weight.shape))  # noqa: E731
    for w in (b.attn.wv, b.attn.wo, b.ffn.w1, b.ffn.w2, b.ffn.w3):
        assert w.weight.std().item() == pytest.approx(beta * xavier(w), rel=0.08)
    for w in (b.attn.wq, b.attn.wk):
        assert w.weight.std().item() == pytest.approx(xavier(w), rel=0.08)


# --- Hydra: every norm x placement, every option by override ----------------------------------------------


@pytest.mark.parametrize("norm", NORM_FILES)
def test_norm_config_lists_every_option_with_the_class_default(norm):
    """So each option is reachable as model.norm_options.<option>=<value> (no '+' needed)."""
    cfg = OmegaConf.load(CONFIGS / "norm" / f"{norm}.yaml")
    params = inspect.signature(NORMS[norm].__init__).parameters
    assert cfg.norm == norm
    assert OmegaConf.to_container(cfg.norm_options) == {
        k: params[k].default for k in accepted_options(norm) if k != "max_seq_len"}  # the model passes it


@pytest.mark.parametrize("norm", NORM_FILES)
def test_every_norm_and_placement_round_trip_through_hydra(norm, tmp_path, corpus):
    for placement in PLACEMENTS:
        cfg = compose_cfg(tmp_path, corpus, f"norm={norm}", f"placement={placement}")
        mc = train_script.model_config(cfg, V)
        assert isinstance(mc, ModelConfig) and (mc.norm, mc.placement) == (norm, placement)
        assert mc.norm_options == OmegaConf.to_container(cfg.model.norm_options)
        if norm == "fused_rmsnorm":
            continue  # building it needs a GPU (or the slow interpreter): tests/test_kernels.py
        model = Transformer(mc)
        assert [b.placement for b in model.layers] == [p for p, _ in mc.layer_specs()]
        assert all(type(b.attn_norm) is NORMS[norm] and type(b.ffn_norm) is NORMS[norm] for b in model.layers)
        assert all((b.attn_out_norm is not None) == (placement == "peri") for b in model.layers)
        if norm == "powernorm":
            assert model.layers[0].attn_norm.alpha_fwd == 0.9 and model.layers[0].attn_norm.max_seq_len == 32


def test_matrix_options_reach_the_model_through_hydra(tmp_path, corpus):
    cfg = compose_cfg(tmp_path, corpus, "norm=rmsnorm", "placement=mix", "model.mix_fraction=0.5",
                      "model.n_layers=4", "model.qk_norm=layernorm", "model.norm_options.zero_centered=true",
                      "model.norm_options.cast=fp32", "module.z_loss=1e-4")
    module = instantiate(cfg.module, _partial_=True)(model=train_script.model_config(cfg, V))
    m = module.model
    assert [b.placement for b in m.layers] == ["post", "post", "pre", "pre"]
    norms = [m.norm] + [n for b in m.layers for n in (b.attn_norm, b.ffn_norm)]
    assert all(type(n) is RMSNorm and n.cast == "fp32" and n.zero_centered and torch.all(n.weight == 0)
               for n in norms)
    q = m.layers[0].attn.q_norm  # the QK-norm gets the options it shares with the main norm
    assert type(q) is LayerNorm and q.zero_centered and q.weight.shape == (16,)
    assert module.hparams.z_loss == 1e-4


def test_per_layer_override_through_hydra(tmp_path, corpus):
    cfg = compose_cfg(tmp_path, corpus, "norm=powernorm", "model.qk_norm=rmsnorm",
                      "model.layers=[{placement:post,norm:layernorm},{placement:peri,norm:dyt}]")
    mc = train_script.model_config(cfg, V)
    assert mc.layers == [{"placement": "post", "norm": "layernorm"}, {"placement": "peri", "norm": "dyt"}]
    m = Transformer(mc)
    b0, b1 = m.layers
    assert (b0.placement, type(b0.attn_norm), type(b0.ffn_norm)) == ("post", LayerNorm, LayerNorm)
    assert (b1.placement, type(b1.attn_norm), type(b1.attn_out_norm)) == ("peri", DyT, DyT)
    assert type(m.norm) is DyT  # the final norm follows the last layer
    assert type(b0.attn.q_norm) is RMSNorm  # powernorm's options (alpha_fwd, stats) are not passed to it
    assert m(torch.zeros(2, 5, dtype=torch.long)).shape == (2, 5, V)


def test_experiment_presets(tmp_path, corpus):
    cfg = compose_cfg(tmp_path, corpus, "experiment=olmo2")
    m = Transformer(train_script.model_config(cfg, V))
    assert {b.placement for b in m.layers} == {"branch"} and type(m.layers[0].attn_norm) is RMSNorm
    assert type(m.layers[1].attn.k_norm) is RMSNorm and cfg.module.z_loss == 1e-5
    cfg = compose_cfg(tmp_path, corpus, "experiment=deepnet")
    m = Transformer(train_script.model_config(cfg, V))
    assert {b.placement for b in m.layers} == {"deepnorm"} and type(m.layers[0].attn_norm) is LayerNorm
    assert m.layers[0].alpha == pytest.approx((2 * cfg.model.n_layers) ** 0.25)


@pytest.mark.parametrize("overrides", [
    ("norm=dyt",), ("norm=scalenorm", "placement=deepnorm"), ("experiment=olmo2",),
    ("norm=powernorm", "placement=peri", "model.norm_options.group_scaling=1"),
])
def test_fast_dev_run_through_train_py(overrides, tmp_path, corpus):
    metrics = train_script.train(compose_cfg(tmp_path, corpus, "debug=fast_dev_run", "callbacks=stability",
                                             *overrides))
    assert math.isfinite(metrics["train/loss"]) and metrics["train/loss"] > 0


# --- z-loss --------------------------------------------------------------------------------------------


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


def test_qk_norm_and_per_layer_norms_work_with_a_batch_statistics_main_norm():
    """Regression: the main norm's options (momentum, stats, alpha_fwd) used to reach the QK-norm."""
    for norm, options in (("batchnorm", {"momentum": 0.2}), ("powernorm", {"alpha_fwd": 0.5}),
                          ("dyt", {"alpha0": 1.0})):
        m = Transformer(tiny(norm=norm, norm_options=options, qk_norm="rmsnorm",
                             layers=[{"norm": "layernorm"}, {}]))
        assert type(m.layers[0].attn.q_norm) is RMSNorm and type(m.layers[0].attn_norm) is LayerNorm
        assert type(m.layers[1].attn_norm) is NORMS[norm]
    with pytest.raises(ValueError, match="does not take option"):  # still an error for the main norm itself
        Transformer(tiny(norm="dyt", norm_options={"momentum": 0.1}))

