"""ActivationProbe (minillm/training/callbacks/probe.py): attention logits and entropy, the outlier ratio and kurtosis
of norm
inputs, BatchNorm's batch-vs-running distances and their sampling null, every norm site of every norm and placement."""


from __future__ import annotations

import math

import pytest
import torch
from helpers import EAGER_NORMS

from minillm.model import PLACEMENTS, ModelConfig, Transformer, apply_rope
from minillm.norms import BatchNorm
from minillm.placements import PLACEMENTS as LAYER_PLACEMENTS
from minillm.training.callbacks import (
    ActivationProbe,
    bn_sampling_null,
    bn_stat_distance,
    feature_kurtosis,
)


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


def probe_attention(model: Transformer, idx: torch.Tensor) -> tuple[dict, dict, ActivationProbe]:
    """One forward with the attention probe on (probe batch: the first 2 sequences): what each block's attention
    saw, (x, cos, sin) by layer, the probe's statistics, and the probe."""
    inputs = {}
    for i, block in enumerate(model.layers):
        block.attn.register_forward_pre_hook(lambda m, args, i=i: inputs.setdefault(i, args))
    probe = ActivationProbe(model, probe_batch=2)
    probe.attach(attention=True)
    model(idx)
    probe.detach()
    return inputs, probe.collect(), probe


@torch.no_grad()
def test_max_attention_logit_matches_brute_force_on_the_probe_batch():
    torch.manual_seed(0)
    model = Transformer(ModelConfig(vocab_size=17, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, max_seq_len=8,
                                    qk_norm="layernorm", init_std=0.3))
    idx = torch.randint(0, 17, (3, 7))
    inputs, stats, probe = probe_attention(model, idx)
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
    kinds = [LAYER_PLACEMENTS[p] for p, _ in model.cfg.layer_specs()]
    per_block = 4 if kinds[0].out_norm else 2  # peri, double: two norms around each sublayer
    final = not kinds[-1].ends_normed  # post, deepnorm, double: no final norm
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


@torch.no_grad()
@pytest.mark.parametrize("softcap", [None, 0.3])
def test_attention_entropy_matches_brute_force_per_head(softcap):
    """Per head, the mean over queries t and probe sequences of -sum_{s<=t} p log p of the attention the model uses
    (soft-capped when it is); the probe logs its min and mean over heads."""
    torch.manual_seed(0)
    model = Transformer(ModelConfig(vocab_size=17, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, max_seq_len=8,
                                    init_std=0.3, attn_logit_softcap=softcap))
    idx = torch.randint(0, 17, (3, 7))
    inputs, stats, _ = probe_attention(model, idx)
    for i, block in enumerate(model.layers):
        x, cos, sin = inputs[i]
        attn, (B, T) = block.attn, (2, 7)
        q = apply_rope(attn.wq(x[:B]).view(B, T, 4, 8), cos, sin).double()
        k = apply_rope(attn.wk(x[:B]).view(B, T, 2, 8), cos, sin).double()
        per_head = []
        for h in range(4):
            total = 0.0
            for b in range(B):
                for t in range(T):
                    s = torch.stack([q[b, t, h] @ k[b, j, h // 2] for j in range(t + 1)]) / math.sqrt(8)
                    if softcap is not None:
                        s = softcap * torch.tanh(s / softcap)
                    p = s.softmax(0)
                    total += float(-(p * p.log()).sum())
            per_head.append(total / (B * T))
        assert stats[f"layer/{i}/attn_entropy_min"] == pytest.approx(min(per_head), rel=1e-4)
        assert stats[f"layer/{i}/attn_entropy_mean"] == pytest.approx(sum(per_head) / 4, rel=1e-4)
        assert 0 < min(per_head) < math.log(T)


def test_feature_kurtosis_is_one_for_equal_scales_and_c_for_one_feature():
    C = 16
    assert float(feature_kurtosis(torch.full((C,), 2.0))) == pytest.approx(1.0)
    assert float(feature_kurtosis(torch.eye(C)[3])) == pytest.approx(C)


@torch.no_grad()
def test_outlier_ratio_and_kurtosis_see_a_massive_activation_at_a_norm_input():
    """A planted outlier feature (x1000 on one channel of the embedding) shows at the first norm's input: max |x| /
    RMS and the per-feature kurtosis both jump, against the same model without it."""
    torch.manual_seed(0)
    model = Transformer(ModelConfig(vocab_size=11, dim=16, n_layers=1, n_heads=2, max_seq_len=8))
    idx = torch.randint(0, 11, (4, 8))

    def measure() -> dict[str, float]:
        probe = ActivationProbe(model)
        probe.attach(attention=False)
        model(idx)
        probe.detach()
        return probe.collect()

    before = measure()
    x = model.tok_emb(idx)
    expected = float(x.abs().amax() / x.pow(2).mean().sqrt())
    assert before["norm/layers.0.attn_norm/outlier_ratio"] == pytest.approx(expected, rel=1e-5)
    model.tok_emb.weight[:, 5] *= 1000.0
    after = measure()
    assert after["norm/layers.0.attn_norm/outlier_ratio"] > 3 * before["norm/layers.0.attn_norm/outlier_ratio"]
    assert before["norm/layers.0.attn_norm/kurtosis"] < 2 and after["norm/layers.0.attn_norm/kurtosis"] > 15


@torch.no_grad()
def test_residual_stream_max_and_median_match_the_blocks_outputs():
    """resid_max and resid_median are the max and the (lower) median of |h| over every element of each block's
    output, averaged (median) or maximised (max) over the forwards of a step; a planted massive activation moves
    the max and leaves the median."""
    torch.manual_seed(0)
    model = Transformer(ModelConfig(vocab_size=11, dim=16, n_layers=2, n_heads=2, max_seq_len=8, init_std=0.3))
    model.layers[0].register_forward_hook(lambda m, a, out: out.index_put_((torch.tensor(0), torch.tensor(1),
                                                                            torch.tensor(3)), torch.tensor(500.0)))
    outs: list[list[torch.Tensor]] = [[], []]
    for i, block in enumerate(model.layers):
        block.register_forward_hook(lambda m, a, out, i=i: outs[i].append(out.clone()))
    probe = ActivationProbe(model)
    probe.attach()
    batches = [torch.randint(0, 11, (2, 7)) for _ in range(2)]
    for idx in batches:
        model(idx)
    stats = probe.collect()
    for i in range(2):
        flat = [o.abs().flatten().sort().values for o in outs[i]]
        medians = [float(f[(f.numel() - 1) // 2]) for f in flat]
        assert stats[f"layer/{i}/resid_median"] == pytest.approx(sum(medians) / 2, rel=1e-6)
        assert stats[f"layer/{i}/resid_max"] == pytest.approx(max(float(f[-1]) for f in flat), rel=1e-6)
    assert stats["layer/0/resid_max"] == pytest.approx(500.0) and stats["layer/0/resid_median"] < 5


@torch.no_grad()
@pytest.mark.parametrize("norm", ["dyt", "derf"])
def test_probe_logs_the_fraction_of_a_pointwise_norms_input_in_its_bend(norm):
    """norm/<site>/saturation: the fraction of the site's input with |alpha x (+ shift)| >= 1, counted by hand on the
    input the site saw; RMSNorm's sites log none."""
    model = Transformer(ModelConfig(vocab_size=11, dim=16, n_layers=2, n_heads=2, max_seq_len=8, norm=norm)).train()
    site = model.get_submodule("layers.0.attn_norm")
    site.alpha.fill_(60.0)  # the embeddings start at RMS 0.02: some of them past the bend
    if norm == "derf":
        site.shift.fill_(0.5)
    seen = []
    handle = site.register_forward_hook(lambda m, args, out: seen.append(args[0].clone()))
    probe = ActivationProbe(model)
    probe.attach()
    model(torch.randint(0, 11, (2, 5)))
    probe.detach()
    handle.remove()
    stats = probe.collect()
    pre = 60.0 * seen[0] + (0.5 if norm == "derf" else 0.0)
    expected = float((pre.abs() >= 1).float().mean())
    assert 0 < expected < 1 and stats["norm/layers.0.attn_norm/saturation"] == pytest.approx(expected)
    rms = Transformer(ModelConfig(vocab_size=11, dim=16, n_layers=2, n_heads=2, max_seq_len=8, norm="rmsnorm"))
    probe = ActivationProbe(rms)
    probe.attach()
    rms(torch.randint(0, 11, (2, 5)))
    assert not any(k.endswith("/saturation") for k in probe.collect())
