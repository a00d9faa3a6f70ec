"""The attention's QK- and V-norms and its scale (minillm/norms/qk.py, model.Attention): each variant against its
source's formula, through the model (loss at init, causality, one batch overfit, cache), and its config errors."""

import math

import pytest
import torch
import torch.nn.functional as F
from helpers import V, tiny, tokens

from minillm.model import Transformer, apply_rope
from minillm.norms.qk import QK_AXES, QK_NORMS, henry_temperature

# every QK-norm form the model offers: (qk_norm, axis, gains, on), and the value norm and the scale
VARIANTS = [dict(qk_norm=n, qk_norm_axis=a) for n in QK_NORMS[1:] for a in QK_AXES if not (n == "l2" and a == "flat")]
VARIANTS += [dict(qk_norm="rmsnorm", qk_norm_gains="per_head"), dict(qk_norm="layernorm", qk_norm_gains="per_head"),
             dict(qk_norm="rmsnorm", qk_norm_on="k"), dict(v_norm=True), dict(attn_scale=0.05),
             dict(qk_norm="rmsnorm", qk_norm_axis="flat", attn_logit_softcap=5.0)]
IDS = ["-".join(f"{v}" for v in kw.values()) for kw in VARIANTS]


def block_input(model: Transformer, idx: torch.Tensor):
    """(h, cos, sin): the first attention's input for idx."""
    T = idx.shape[1]
    return model.layers[0].attn_norm(model.tok_emb(idx)), model.rope_cos[:T], model.rope_sin[:T]


def explicit_attention(q, k, v, scale):
    """softmax(q k^T * scale + causal mask) v for (B, H, T, D) each (grouped heads repeated)."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    s = q @ k.transpose(-2, -1) * scale
    mask = torch.ones(s.shape[-2:], dtype=torch.bool).tril()
    return s.masked_fill(~mask, float("-inf")).softmax(-1) @ v


def rms(x, eps):
    return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def randomize_gains(model: Transformer) -> None:
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "q_norm" in name or "k_norm" in name:
                p.add_(torch.randn_like(p) * 0.3)


def test_flat_qk_norm_is_olmo2s_rmsnorm_over_all_heads_before_the_split():
    """OLMo 2 (OLMo-core's use_head_qk_norm=False, HF Olmo2): q = RMSNorm_{H*D}(W_q x).view(H, D), gains H*D."""
    torch.manual_seed(0)
    model = Transformer(tiny(qk_norm="rmsnorm", qk_norm_axis="flat"))
    randomize_gains(model)
    attn, cfg = model.layers[0].attn, model.cfg
    assert attn.q_norm.weight.shape == (cfg.n_heads * cfg.head_dim,)
    assert attn.k_norm.weight.shape == (cfg.n_kv_heads * cfg.head_dim,)
    h, cos, sin = block_input(model, tokens())
    B, T, _ = h.shape
    q = (rms(attn.wq(h), cfg.norm_eps) * attn.q_norm.weight).view(B, T, cfg.n_heads, cfg.head_dim)
    k = (rms(attn.wk(h), cfg.norm_eps) * attn.k_norm.weight).view(B, T, cfg.n_kv_heads, cfg.head_dim)
    got_q, got_k = attn.qk(h, cos, sin)
    torch.testing.assert_close(got_q, apply_rope(q, cos, sin).transpose(1, 2))
    torch.testing.assert_close(got_k, apply_rope(k, cos, sin).transpose(1, 2))
    per_head = rms(attn.wq(h).view(B, T, cfg.n_heads, cfg.head_dim), cfg.norm_eps)
    assert not torch.allclose(q / attn.q_norm.weight.view(cfg.n_heads, cfg.head_dim), per_head, atol=1e-3)


def test_per_head_gains_give_each_head_its_own_gain_and_bias():
    torch.manual_seed(0)
    model = Transformer(tiny(qk_norm="layernorm", qk_norm_gains="per_head"))
    randomize_gains(model)
    attn, cfg = model.layers[0].attn, model.cfg
    assert attn.q_norm.weight.shape == attn.q_norm.bias.shape == (cfg.n_heads, cfg.head_dim)
    h, cos, sin = block_input(model, tokens())
    B, T, _ = h.shape
    x = attn.wq(h).view(B, T, cfg.n_heads, cfg.head_dim)
    q = F.layer_norm(x, (cfg.head_dim,), eps=cfg.norm_eps) * attn.q_norm.weight + attn.q_norm.bias
    torch.testing.assert_close(attn.qk(h, cos, sin)[0], apply_rope(q, cos, sin).transpose(1, 2))
    shared = Transformer(tiny(qk_norm="layernorm"))
    assert shared.layers[0].attn.q_norm.weight.shape == (cfg.head_dim,)  # the default: one gain for all heads


def test_keys_only_normalizes_the_keys_and_leaves_the_queries():
    torch.manual_seed(0)
    model = Transformer(tiny(qk_norm="rmsnorm", qk_norm_on="k"))
    attn, cfg = model.layers[0].attn, model.cfg
    assert isinstance(attn.q_norm, torch.nn.Identity) and attn.k_norm.weight.shape == (cfg.head_dim,)
    h, cos, sin = block_input(model, tokens())
    B, T, _ = h.shape
    q, k = attn.qk(h, cos, sin)
    torch.testing.assert_close(q, apply_rope(attn.wq(h).view(B, T, -1, cfg.head_dim), cos, sin).transpose(1, 2))
    torch.testing.assert_close(k.norm(dim=-1), torch.full_like(k.norm(dim=-1), math.sqrt(cfg.head_dim)), rtol=1e-2,
                               atol=0)


@pytest.mark.parametrize("softcap", [None, 50.0])
def test_henrys_qk_norm_is_l2_with_a_learned_temperature_and_no_sqrt_d(softcap):
    """Henry et al. 2020: softmax(g * q^ . k^) v with q^ = q / ||q||, k^ = k / ||k|| per head and g one learned
    scalar per layer, initialized at log2(L^2 - L)."""
    torch.manual_seed(0)
    model = Transformer(tiny(qk_norm="l2", attn_logit_softcap=softcap))
    attn, cfg = model.layers[0].attn, model.cfg
    g0 = math.log2(cfg.max_seq_len**2 - cfg.max_seq_len)
    assert attn.temperature.shape == (1,) and attn.temperature.item() == pytest.approx(g0)
    assert henry_temperature(cfg.max_seq_len) == pytest.approx(g0)
    assert not [n for n, _ in attn.named_parameters() if "q_norm" in n or "k_norm" in n]  # no gains
    with torch.no_grad():
        attn.temperature.fill_(3.0)
    h, cos, sin = block_input(model, tokens())
    B, T, _ = h.shape
    unit = lambda x: x / x.norm(dim=-1, keepdim=True)  # noqa: E731
    q = apply_rope(unit(attn.wq(h).view(B, T, cfg.n_heads, -1)), cos, sin).transpose(1, 2)
    k = apply_rope(unit(attn.wk(h).view(B, T, cfg.n_kv_heads, -1)), cos, sin).transpose(1, 2)
    v = attn.wv(h).view(B, T, cfg.n_kv_heads, -1).transpose(1, 2)
    if softcap is None:
        y = explicit_attention(q, k, v, 3.0)
    else:  # the cap applies to g q^.k^
        group = cfg.n_heads // cfg.n_kv_heads
        s = softcap * torch.tanh(3.0 * q @ k.repeat_interleave(group, 1).transpose(-2, -1) / softcap)
        s = s.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
        y = s.softmax(-1) @ v.repeat_interleave(group, 1)
    torch.testing.assert_close(attn(h, cos, sin), attn.wo(y.transpose(1, 2).reshape(B, T, -1)))
    model(tokens()).logsumexp(-1).mean().backward()
    assert attn.temperature.grad is not None and attn.temperature.grad.abs() > 0


def test_value_norm_divides_each_heads_values_by_their_rms_without_a_gain():
    torch.manual_seed(0)
    model = Transformer(tiny(v_norm=True))
    attn, cfg = model.layers[0].attn, model.cfg
    assert not list(attn.v_norm.parameters())
    h, cos, sin = block_input(model, tokens())
    B, T, _ = h.shape
    q, k = attn.qk(h, cos, sin)
    v = rms(attn.wv(h).view(B, T, cfg.n_kv_heads, -1), cfg.norm_eps).transpose(1, 2)
    y = explicit_attention(q, k, v, cfg.head_dim**-0.5)
    torch.testing.assert_close(attn(h, cos, sin), attn.wo(y.transpose(1, 2).reshape(B, T, -1)))


@pytest.mark.parametrize("softcap", [None, 1e6])
def test_attn_scale_replaces_one_over_sqrt_d_in_sdpa_and_the_capped_path(softcap):
    torch.manual_seed(0)
    model = Transformer(tiny(attn_scale=0.05, attn_logit_softcap=softcap))
    attn = model.layers[0].attn
    h, cos, sin = block_input(model, tokens())
    B, T, _ = h.shape
    q, k = attn.qk(h, cos, sin)
    v = attn.wv(h).view(B, T, model.cfg.n_kv_heads, -1).transpose(1, 2)
    y = explicit_attention(q, k, v, 0.05)
    torch.testing.assert_close(attn(h, cos, sin), attn.wo(y.transpose(1, 2).reshape(B, T, -1)))


@pytest.mark.parametrize("kw", VARIANTS, ids=IDS)
def test_every_variant_starts_at_ln_vocab_stays_causal_and_fits_one_batch(kw):
    torch.manual_seed(0)
    model = Transformer(tiny(**kw))
    idx = tokens(B=4, T=16, seed=3)
    logits = model(idx)
    assert abs(F.cross_entropy(logits.flatten(0, 1), idx.flatten()).item() - math.log(V)) < 0.15
    changed = idx.clone()
    changed[:, 7] = (changed[:, 7] + 1) % V
    torch.testing.assert_close(model(changed)[:, :7], logits[:, :7], atol=1e-6, rtol=0)
    x, y = idx[:, :-1], idx[:, 1:]
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0)
    first = None
    for _ in range(40):
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        first = first if first is not None else loss.item()
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.35 * first, (first, loss.item())
    model.eval()  # the KV cache gives the full forward's logits
    cache = model.new_cache()
    stepped = torch.cat([model(idx[:, t:t + 1], cache=cache) for t in range(8)], dim=1)
    torch.testing.assert_close(stepped, model(idx[:, :8]), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kw, message", [
    (dict(qk_norm_axis="both"), r"model.qk_norm_axis='both' is invalid; allowed: head, flat$"),
    (dict(qk_norm_gains="per_token"), r"model.qk_norm_gains='per_token' is invalid; allowed: shared, per_head, None"),
    (dict(qk_norm_on="q"), r"model.qk_norm_on='q' is invalid; allowed: qk, k$"),
    (dict(qk_norm="l2", qk_norm_axis="flat"), r"model.qk_norm_axis='flat' is invalid; allowed: 'head' with qk_norm=l2"),
    (dict(qk_norm="l2", attn_scale=0.1), r"model.attn_scale=0.1 is invalid; allowed: None with qk_norm=l2"),
    (dict(qk_norm="rmsnorm", qk_norm_axis="flat", qk_norm_gains="shared"),
     r"model.qk_norm_gains='shared' is invalid; allowed: per_head or null with qk_norm_axis=flat"),
    (dict(attn_scale=0), r"model.attn_scale=0 is invalid; allowed: a finite number > 0 or null$"),
    (dict(v_norm="yes"), r"model.v_norm='yes' is invalid; allowed: true or false$"),
])
def test_qk_option_errors_name_the_field_and_the_allowed_values(kw, message):
    with pytest.raises(ValueError, match=message):
        tiny(**kw)


def test_per_head_gains_refuse_the_options_that_set_gains():
    with pytest.raises(ValueError, match=r"model.qk_norm_options \['zero_centered'\] do not apply with "
                                         r"model.qk_norm_gains=per_head"):
        Transformer(tiny(qk_norm="rmsnorm", qk_norm_gains="per_head", qk_norm_options={"zero_centered": True}))


@pytest.mark.parametrize("kw", [dict(attn_scale=0.05), dict(qk_norm="l2"), dict()], ids=["scale", "l2", "default"])
def test_the_attention_probes_score_as_the_attention_does(kw):
    """The max attention logit and entropy probes (minillm.training.callbacks.probe) use the attention's own scale."""
    from minillm.training.callbacks.probe import attention_scores

    torch.manual_seed(0)
    model = Transformer(tiny(**kw))
    attn = model.layers[0].attn
    h, cos, sin = block_input(model, tokens())
    q, k = attn.qk(h, cos, sin)
    scale = kw.get("attn_scale", 1.0 if kw.get("qk_norm") == "l2" else model.cfg.head_dim**-0.5)
    expected = q[0] @ k[0].repeat_interleave(q.shape[1] // k.shape[1], 0).transpose(-2, -1) * scale
    got = next(attention_scores(attn, h, cos, sin))
    mask = torch.ones(got.shape[-2:], dtype=torch.bool).tril()
    torch.testing.assert_close(got[:, mask], expected[:, mask])
