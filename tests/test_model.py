"""The decoder (minillm/model.py): shapes, causality in train mode, attention and RoPE, placements, init, config
errors, generation. The tests over "every norm" read the registry (helpers.EAGER_NORMS)."""

import math

import pytest
import torch
import torch.nn.functional as F
from helpers import EAGER_NORMS, V, randn, tiny, tokens

from minillm.model import PLACEMENTS, Block, ModelConfig, Transformer, apply_rope, rope_tables
from minillm.norms import NORMS, DyT, LayerNorm, RMSNorm


def test_logits_shape_and_param_count():
    torch.manual_seed(0)
    model = Transformer(tiny())
    assert model(tokens()).shape == (3, 12, V)
    assert model.num_params() == sum(p.numel() for p in model.parameters())
    assert model.num_params(non_embedding=True) == model.num_params() - V * 32


@pytest.mark.parametrize("placement", PLACEMENTS)
@pytest.mark.parametrize("norm", EAGER_NORMS)
def test_loss_at_init_is_about_ln_vocab(norm, placement):
    torch.manual_seed(0)
    logits = Transformer(tiny(norm=norm, placement=placement))(tokens())
    loss = F.cross_entropy(logits.flatten(0, 1), tokens(seed=1).flatten())
    assert abs(loss.item() - math.log(V)) < 0.15


@pytest.mark.parametrize("placement", PLACEMENTS)
@pytest.mark.parametrize("norm", EAGER_NORMS)
def test_causal_in_train_mode(norm, placement):
    """Changing token t leaves the logits at positions < t unchanged, with batch statistics active."""
    torch.manual_seed(0)
    model = Transformer(tiny(norm=norm, placement=placement)).train()
    idx, t = tokens(), 7
    changed = idx.clone()
    changed[:, t] = (changed[:, t] + 1) % V
    state = {k: v.clone() for k, v in model.state_dict().items()}  # powernorm's forward reads running stats
    a = model(idx)
    model.load_state_dict(state)
    b = model(changed)
    torch.testing.assert_close(a[:, :t], b[:, :t], atol=1e-6, rtol=0)
    assert not torch.allclose(a[:, t:], b[:, t:])


def test_pooled_batchnorm_leaks_the_future_in_train_mode():
    torch.manual_seed(0)
    with pytest.warns(UserWarning, match="sees later tokens"):
        model = Transformer(tiny(norm="batchnorm", norm_options={"stats": "pooled"})).train()
    idx = tokens()
    changed = idx.clone()
    changed[:, -1] = (changed[:, -1] + 1) % V
    leak = (model(idx)[:, :-1] - model(changed)[:, :-1]).abs().max()
    assert leak > 1e-4  # earlier positions saw the last token through the pooled statistics
    model.eval()  # running statistics are fixed: no leak in eval mode
    torch.testing.assert_close(model(idx)[:, :-1], model(changed)[:, :-1], atol=1e-6, rtol=0)


# Where the defaults do not fit (documented in minillm/norms/): DyT as Post-LN with alpha0 = 0.5 halves the
# residual stream at every sublayer (tanh(x / 2) ~ x / 2), and PowerNorm's Algorithm 1 alone diverges on
# branch outputs (peri, branch) unless the authors' per-token group scaling comes first.
OVERFIT_OPTIONS = {("dyt", "post"): {"alpha0": 1.0}, ("powernorm", "peri"): {"group_scaling": 1},
                   ("powernorm", "branch"): {"group_scaling": 1}}


@pytest.mark.parametrize("placement", PLACEMENTS)
@pytest.mark.parametrize("norm", EAGER_NORMS)
def test_tiny_model_overfits_one_batch(norm, placement):
    torch.manual_seed(0)
    options = OVERFIT_OPTIONS.get((norm, placement), {})
    model = Transformer(tiny(norm=norm, placement=placement, norm_options=options))
    idx = tokens(B=4, T=16, seed=3)
    x, y = idx[:, :-1], idx[:, 1:]
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0)
    first = None
    for _ in range(60):
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        first = first if first is not None else loss.item()
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.25 * first, (first, loss.item())


def test_attention_matches_explicit_softmax_with_grouped_heads():
    torch.manual_seed(0)
    cfg = tiny(n_heads=4, n_kv_heads=2)
    attn = Transformer(cfg).layers[0].attn
    x = torch.randn(2, 9, cfg.dim)
    cos, sin = rope_tables(cfg.head_dim, 9, cfg.rope_theta)
    q, k = attn.qk(x, cos, sin)  # (B, 4, T, D), (B, 2, T, D)
    v = attn.wv(x).view(2, 9, 2, cfg.head_dim).transpose(1, 2)
    k, v = k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1)  # each kv head serves 2 q heads
    scores = q @ k.transpose(-1, -2) / math.sqrt(cfg.head_dim)
    scores = scores.masked_fill(torch.ones(9, 9, dtype=torch.bool).triu(1), float("-inf"))
    y = (scores.softmax(-1) @ v).transpose(1, 2).reshape(2, 9, cfg.dim)
    torch.testing.assert_close(attn(x, cos, sin), attn.wo(y), atol=1e-5, rtol=1e-5)


def test_rope_scores_depend_only_on_relative_position():
    cos, sin = rope_tables(8, 32, 10000.0)
    q, k = torch.randn(8), torch.randn(8)
    at = lambda v, p: apply_rope(v.view(1, 1, 1, 8).expand(1, 32, 1, 8), cos, sin)[0, p, 0]  # noqa: E731
    s1 = at(q, 10) @ at(k, 7)
    s2 = at(q, 20) @ at(k, 17)
    torch.testing.assert_close(s1, s2, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(at(q, 0), q)  # position 0 is not rotated
    assert not torch.allclose(at(q, 10) @ at(k, 7), at(q, 10) @ at(k, 4))


def test_block_placement_wiring_matches_its_diagram():
    torch.manual_seed(0)
    cfg = tiny(norm="layernorm")
    x = torch.randn(2, 5, cfg.dim)
    cos, sin = rope_tables(cfg.head_dim, 5, cfg.rope_theta)
    for placement in ("pre", "post", "peri", "branch", "deepnorm"):
        b = Block(cfg, placement, "layernorm")
        for p in b.parameters():  # non-trivial norms
            if p.ndim == 1:
                p.data.uniform_(0.5, 1.5)
        attn = lambda h, b=b: b.attn(h, cos, sin)  # noqa: E731
        h = x
        if placement == "pre":
            h = h + attn(b.attn_norm(h))
            h = h + b.ffn(b.ffn_norm(h))
        elif placement == "post":
            h = b.attn_norm(h + attn(h))
            h = b.ffn_norm(h + b.ffn(h))
        elif placement == "peri":
            h = h + b.attn_out_norm(attn(b.attn_norm(h)))
            h = h + b.ffn_out_norm(b.ffn(b.ffn_norm(h)))
        elif placement == "branch":
            h = h + b.attn_norm(attn(h))
            h = h + b.ffn_norm(b.ffn(h))
        else:
            a = (2 * cfg.n_layers) ** 0.25
            h = b.attn_norm(a * h + attn(h))
            h = b.ffn_norm(a * h + b.ffn(h))
        torch.testing.assert_close(b(x, cos, sin), h)


def test_final_norm_only_when_the_last_block_does_not_end_normalized():
    assert isinstance(Transformer(tiny(placement="post")).norm, torch.nn.Identity)
    assert isinstance(Transformer(tiny(placement="deepnorm")).norm, torch.nn.Identity)
    for p in ("pre", "peri", "branch", "mix"):
        assert not isinstance(Transformer(tiny(placement=p)).norm, torch.nn.Identity)


def test_mix_puts_post_ln_in_exactly_the_first_layers():
    cfg = tiny(n_layers=8, placement="mix", mix_fraction=0.25)
    assert [b.placement for b in Transformer(cfg).layers] == ["post"] * 2 + ["pre"] * 6
    assert [b.placement for b in Transformer(tiny(placement="mix")).layers] == ["post", "pre"]
    # floor(alpha * L) as Mix-LN: 6 layers x 0.25 = 1.5 -> 1 Post-LN layer; 10 x 0.3 = 3 exactly
    assert [p for p, _ in tiny(n_layers=6, placement="mix", mix_fraction=0.25).layer_specs()] == [
        "post"] + ["pre"] * 5
    assert [p for p, _ in tiny(n_layers=10, placement="mix", mix_fraction=0.3).layer_specs()].count("post") == 3


@pytest.mark.parametrize("fraction", [0.25, 1.0])
def test_mix_that_is_all_pre_or_all_post_is_an_error(fraction):
    with pytest.raises(ValueError, match=r"model.mix_fraction=.* is invalid; allowed: .* between 1 and 1 Post-LN "
                                         r"layers .*here [02]\)"):
        tiny(placement="mix", mix_fraction=fraction)


def test_mix_with_per_layer_overrides_resolves_mix_for_the_other_layers():
    """Regression: layers without a placement used to get the literal 'mix' and run as DeepNorm."""
    cfg = tiny(n_layers=4, placement="mix", mix_fraction=0.5,
               layers=[{"norm": "layernorm"}, {}, {"placement": "peri"}, {}])
    model = Transformer(cfg)
    assert [b.placement for b in model.layers] == ["post", "post", "peri", "pre"]
    assert type(model.layers[0].attn_norm).__name__ == "LayerNorm"
    with pytest.raises(ValueError, match="block placement 'mix' is invalid"):
        Block(tiny(), "mix", "rmsnorm")


def test_per_layer_override_sets_placement_and_norm():
    layers = [{"placement": "post", "norm": "layernorm"}, {"norm": "batchnorm"}]
    model = Transformer(tiny(layers=layers, placement="pre", norm="rmsnorm"))
    b0, b1 = model.layers
    assert (b0.placement, type(b0.attn_norm).__name__) == ("post", "LayerNorm")
    assert (b1.placement, type(b1.attn_norm).__name__) == ("pre", "BatchNorm")


def test_init_scales_residual_projections_by_depth():
    torch.manual_seed(0)
    cfg = tiny(dim=128, n_layers=8, n_heads=4, n_kv_heads=4)
    m = Transformer(cfg)
    std = lambda w: w.weight.std().item()  # noqa: E731
    assert abs(std(m.layers[0].attn.wq) - 0.02) < 0.002
    assert abs(std(m.layers[0].attn.wo) - 0.02 / math.sqrt(16)) < 0.0006
    assert abs(std(m.layers[3].ffn.w2) - 0.02 / math.sqrt(16)) < 0.0006
    assert all(torch.all(b.attn_norm.weight == 1) for b in m.layers)


def test_deepnorm_alpha_and_beta_for_depth():
    torch.manual_seed(0)
    L = 6
    m = Transformer(tiny(dim=128, n_layers=L, n_heads=4, n_kv_heads=4, placement="deepnorm"))
    b = m.layers[2]
    assert b.alpha == pytest.approx((2 * L) ** 0.25)
    beta = (8 * L) ** -0.25
    xavier = lambda w: math.sqrt(2 / sum(w.weight.shape))  # noqa: E731
    for w in (b.attn.wv, b.attn.wo, b.ffn.w1, b.ffn.w2):
        assert w.weight.std().item() == pytest.approx(beta * xavier(w), rel=0.08)
    assert b.attn.wq.weight.std().item() == pytest.approx(xavier(b.attn.wq), rel=0.08)


def test_tied_embeddings_share_one_matrix():
    m = Transformer(tiny(tie_embeddings=True))
    assert m.lm_head.weight is m.tok_emb.weight
    assert m.num_params() == Transformer(tiny()).num_params() - V * 32


@pytest.mark.parametrize("qk_norm", ["rmsnorm", "layernorm"])
def test_qk_norm_is_applied_per_head_before_rope(qk_norm):
    """q = rope(q_norm(wq x)), not q_norm(rope(wq x)): the two differ once the gain is not uniform."""
    torch.manual_seed(0)
    cfg = tiny(qk_norm=qk_norm)
    attn = Transformer(cfg).layers[0].attn
    with torch.no_grad():
        for norm in (attn.q_norm, attn.k_norm):
            norm.weight.uniform_(0.5, 2.0)
    x = torch.randn(2, 5, cfg.dim)
    cos, sin = rope_tables(cfg.head_dim, 5, cfg.rope_theta)
    q, k = attn.qk(x, cos, sin)  # (B, H, T, D), (B, Hkv, T, D)
    heads = attn.wq(x).view(2, 5, cfg.n_heads, cfg.head_dim)  # (B, T, H, D)
    torch.testing.assert_close(q, apply_rope(attn.q_norm(heads), cos, sin).transpose(1, 2))
    kv = attn.wk(x).view(2, 5, cfg.n_kv_heads, cfg.head_dim)
    torch.testing.assert_close(k, apply_rope(attn.k_norm(kv), cos, sin).transpose(1, 2))
    after = attn.q_norm(apply_rope(heads, cos, sin)).transpose(1, 2)
    assert (q - after).abs().max() > 1e-2


@pytest.mark.parametrize("qk_norm", ["rmsnorm", "layernorm"])
def test_qk_norm_normalizes_each_head_before_rope(qk_norm):
    torch.manual_seed(0)
    cfg = tiny(qk_norm=qk_norm)
    attn = Transformer(cfg).layers[0].attn
    x = torch.randn(2, 5, cfg.dim) * 30
    cos, sin = torch.ones(5, cfg.head_dim // 2), torch.zeros(5, cfg.head_dim // 2)  # RoPE off
    q, k = attn.qk(x, cos, sin)
    rms = q.pow(2).mean(-1).sqrt()
    torch.testing.assert_close(rms, torch.ones_like(rms), atol=1e-3, rtol=1e-3)
    assert k.shape == (2, cfg.n_kv_heads, 5, cfg.head_dim)


def test_greedy_generation_is_deterministic_and_extends():
    torch.manual_seed(0)
    m = Transformer(tiny()).eval()
    a = m.generate(tokens(B=1, T=3), 20, temperature=0)
    assert a.shape == (1, 23) and torch.equal(a, m.generate(tokens(B=1, T=3), 20, temperature=0))
    s = m.generate(tokens(B=2, T=3), 5, temperature=1.0, top_k=5, generator=torch.Generator().manual_seed(0))
    assert s.shape == (2, 8)


def test_too_long_input_is_an_error():
    with pytest.raises(ValueError, match="exceeds model.max_seq_len=16"):
        Transformer(tiny())(tokens(T=17))


@pytest.mark.parametrize(
    "kw, message",
    [
        (dict(dim=30, n_heads=4), r"model.dim=30 is invalid; allowed: a multiple of n_heads=4"),
        (dict(dim=12, n_heads=4), r"model.dim=12 is invalid; allowed: an even head dim .*here 3"),
        (dict(n_heads=4, n_kv_heads=3), r"model.n_kv_heads=3 is invalid; allowed: a divisor of n_heads=4"),
        (dict(norm="groupnorm"), r"model.norm='groupnorm' is invalid; allowed: batchnorm, .*layernorm"),
        (dict(placement="middle"), r"model.placement='middle' is invalid; allowed: pre, post"),
        (dict(vocab_size=0), r"model.vocab_size=0 is invalid; allowed: an integer >= 1$"),
        (dict(norm_eps="abc"), r"model.norm_eps='abc' is invalid; allowed: a finite number >= 0$"),
        (dict(n_kv_heads="abc"), r"model.n_kv_heads='abc' is invalid; allowed: an integer >= 1 or null$"),
        (dict(mix_fraction="abc"), r"model.mix_fraction='abc' is invalid; allowed: a finite number >= 0 and <= 1$"),
        (dict(tie_embeddings="yes"), r"model.tie_embeddings='yes' is invalid; allowed: true or false$"),
        (dict(rope_theta=0), r"model.rope_theta=0 is invalid; allowed: a finite number > 0$"),
        (dict(qk_norm="l3"), r"model.qk_norm='l3' is invalid"),
        (dict(mix_fraction=1.5), r"model.mix_fraction=1.5 is invalid"),
        (dict(layers=[{}]), r"model.layers=.* is invalid; allowed: one entry per layer \(n_layers=2\)"),
        (dict(layers=[{"placement": "mix"}, {}]), r"model.layers\[0\].placement='mix' is invalid"),
        (dict(layernorm_scaling="yes"), r"model.layernorm_scaling='yes' is invalid; allowed: true or false$"),
        (dict(layernorm_scaling=True, placement="post"),
         r"model.layernorm_scaling=True is invalid; allowed: false when no layer has an input norm"),
    ],
)
def test_config_errors_name_field_value_and_what_is_allowed(kw, message):
    with pytest.raises(ValueError, match=message):
        tiny(**kw)


def test_norm_options_reach_every_norm():
    m = Transformer(tiny(norm="layernorm", norm_options={"eps_mode": "outside", "bias": False}))
    norms = [m.norm] + [n for b in m.layers for n in (b.attn_norm, b.ffn_norm)]
    assert all(n.eps_mode == "outside" and n.bias is None for n in norms)
    with pytest.raises(ValueError, match="does not take option"):
        Transformer(tiny(norm="rmsnorm", norm_options={"momentum": 0.1}))


def test_depth_scaled_init_off_keeps_init_std_on_residual_projections():
    torch.manual_seed(0)
    m = Transformer(tiny(dim=128, n_layers=8, n_heads=4, n_kv_heads=4, depth_scaled_init=False))
    for w in (m.layers[0].attn.wo, m.layers[5].ffn.w2, m.layers[2].attn.wq):
        assert abs(w.weight.std().item() - 0.02) < 0.002
    assert "depth_scaled_init" in m.cfg.to_dict()


# --- KV cache -------------------------------------------------------------------------------------------

CACHE_CASES = [  # (norm, placement, qk_norm, n_kv_heads): norms with running statistics, QK-norm, GQA
    ("rmsnorm", "pre", "none", 2),
    ("layernorm", "post", "rmsnorm", 1),
    ("batchnorm", "peri", "layernorm", 2),
    ("powernorm", "mix", "none", 4),
    ("dyt", "deepnorm", "rmsnorm", 2),
]


def cache_model(norm, placement, qk_norm, n_kv_heads) -> Transformer:
    """A tiny model whose running statistics (BatchNorm, PowerNorm) are not their initial values."""
    torch.manual_seed(0)
    m = Transformer(tiny(norm=norm, placement=placement, qk_norm=qk_norm, n_kv_heads=n_kv_heads)).train()
    with torch.no_grad():
        for p in m.parameters():  # non-trivial gains and biases
            if p.ndim == 1:
                p.add_(0.3 * torch.randn_like(p))
        for seed in range(3):
            m(tokens(B=4, T=16, seed=seed))
    return m.eval()


@pytest.mark.parametrize("case", CACHE_CASES, ids=lambda c: "-".join(map(str, c)))
def test_cached_logits_match_the_full_forward(case):
    """Prefill, one-token steps and a multi-token chunk after a prefix (explicit causal mask) at their positions."""
    m = cache_model(*case)
    x = tokens(B=2, T=16, seed=5)
    cache = m.new_cache()
    chunks = [m(x[:, :5], cache), m(x[:, 5:6], cache), m(x[:, 6:7], cache), m(x[:, 7:12], cache), m(x[:, 12:], cache)]
    assert [c.length for c in cache] == [16, 16]
    torch.testing.assert_close(torch.cat(chunks, 1), m(x), atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="sequence length 17 exceeds model.max_seq_len=16"):
        m(x[:, :1], cache)


@pytest.mark.parametrize("case", CACHE_CASES, ids=lambda c: "-".join(map(str, c)))
def test_cached_generation_gives_the_uncached_tokens(case):
    """Greedy and seeded sampling, 30 new tokens after a 5-token prompt: the 16-token window slides."""
    m = cache_model(*case)
    prompt = tokens(B=2, T=5, seed=7)
    greedy = m.generate(prompt, 30, temperature=0)
    assert torch.equal(greedy, m.generate(prompt, 30, temperature=0, use_cache=False))
    sample = lambda use_cache: m.generate(prompt, 30, temperature=1.0, top_k=8, use_cache=use_cache,  # noqa: E731
                                          generator=torch.Generator().manual_seed(3))
    sampled = sample(True)
    assert torch.equal(sampled, sample(False)) and not torch.equal(sampled, greedy)
    assert greedy.shape == (2, 35) and torch.equal(greedy[:, :5], prompt)


def test_generation_runs_one_token_per_step_until_the_window_slides():
    """What the embedding sees: the prompt once, then single tokens; once 16 positions are cached the window
    slides and every step rebuilds the cache from the last 16 tokens."""
    m = Transformer(tiny()).eval()
    lengths = []
    m.tok_emb.register_forward_pre_hook(lambda mod, args: lengths.append(args[0].shape[1]))
    m.generate(tokens(B=1, T=5), 14, temperature=0)
    assert lengths == [5] + [1] * 11 + [16, 16]  # 14 tokens: 1 after the prompt, 11 steps, 2 slides
    lengths.clear()
    m.generate(tokens(B=1, T=20), 2, temperature=0)  # a prompt longer than the window: its last 16 tokens
    assert lengths == [16, 16]
    lengths.clear()
    m.generate(tokens(B=1, T=5), 3, temperature=0, use_cache=False)
    assert lengths == [5, 6, 7]


def test_generate_uses_eval_mode_and_restores_train_mode():
    m = cache_model("batchnorm", "pre", "none", 2).train()
    state = {k: v.clone() for k, v in m.state_dict().items()}
    m.generate(tokens(B=2, T=4), 6, temperature=0)
    assert m.training and all(torch.equal(v, m.state_dict()[k]) for k, v in state.items())  # stats untouched
    with pytest.raises(RuntimeError, match="call model.eval"):
        m(tokens(B=1, T=3), m.new_cache())


def test_a_compiled_model_generates_eagerly_without_recompiling_per_cache_length():
    torch.manual_seed(0)
    m = Transformer(tiny()).eval()
    expected = m.generate(tokens(B=1, T=4), 14, temperature=0)
    m.compile(backend="eager")
    torch._dynamo.reset()
    counters = torch._dynamo.utils.counters
    counters.clear()
    assert torch.equal(m.generate(tokens(B=1, T=4), 14, temperature=0), expected)
    assert counters["stats"]["unique_graphs"] == 0
    m(tokens(B=1, T=4))  # outside generate the model is still compiled
    assert counters["stats"]["unique_graphs"] == 1


# --- placements and norms inside the model ---------------------------------------------------------------


def test_dyt_alpha0_reaches_every_dyt_of_the_model():
    m = Transformer(tiny(norm="dyt", norm_options={"alpha0": 0.25}))
    dyts = [mod for mod in m.modules() if isinstance(mod, DyT)]
    assert len(dyts) == 2 * 2 + 1 and all(d.alpha.item() == 0.25 for d in dyts)


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



def test_attn_norm_options_set_the_attention_sublayers_norm_only():
    """DyT's per-site alpha0: attn_norm_options over norm_options in each block's attn_norm; the FFN norms, Peri's
    output norms and the final norm keep norm_options; the same parameters in the same order."""
    for placement in ("pre", "peri", "post"):
        m = Transformer(tiny(norm="dyt", placement=placement, norm_options={"alpha0": 0.25},
                             attn_norm_options={"alpha0": 2.0}))
        alphas = {n: float(p.detach().flatten()[0]) for n, p in m.named_parameters() if n.endswith("alpha")}
        assert alphas and all(v == (2.0 if ".attn_norm." in n else 0.25) for n, v in alphas.items()), alphas
        assert list(m.state_dict()) == list(Transformer(tiny(norm="dyt", placement=placement)).state_dict())
    # a layer with another norm gets only the options it takes (as with norm_options)
    m = Transformer(tiny(norm="dyt", layers=[{"norm": "rmsnorm"}, {}], attn_norm_options={"alpha0": 2.0}))
    assert type(m.layers[0].attn_norm) is RMSNorm and float(m.layers[1].attn_norm.alpha.flatten()[0]) == 2.0


@pytest.mark.parametrize("kw, message", [
    (dict(attn_norm_options={"alpha0": 2.0}), r"model.attn_norm_options \(rmsnorm\): .*does not take option"),
    (dict(norm="dyt", attn_norm_options={"alpha0": -1.0}), r"model.attn_norm_options \(dyt\): alpha0=-1.0 is invalid"),
    (dict(norm="dyt", norm_options={"alpha0": -1.0}, attn_norm_options={"alpha0": 1.0}),
     r"model.norm_options \(dyt\): alpha0=-1.0 is invalid"),
    (dict(attn_norm_options=5), r"model.attn_norm_options=5 is invalid; allowed: a mapping"),
    (dict(norm_options=[1]), r"model.norm_options=\[1\] is invalid; allowed: a mapping"),
])
def test_norm_option_errors_name_the_field_at_fault(kw, message):
    with pytest.raises(ValueError, match=message):
        Transformer(tiny(**kw))


def test_qk_norm_takes_its_own_options_not_the_main_norms():
    """norm_options are the main norm's: norm_options.bias=false must not strip the QK LayerNorm's bias."""
    m = Transformer(tiny(norm="layernorm", norm_options={"bias": False}, qk_norm="layernorm"))
    assert m.layers[0].attn_norm.bias is None and m.layers[0].attn.q_norm.bias is not None
    m = Transformer(tiny(qk_norm="rmsnorm", qk_norm_options={"zero_centered": True}))
    assert m.layers[0].attn.q_norm.zero_centered and not m.layers[0].attn_norm.zero_centered
    with pytest.raises(ValueError, match=r"model.qk_norm_options \(rmsnorm\): .*does not take option"):
        Transformer(tiny(qk_norm="rmsnorm", qk_norm_options={"bias": True}))


# --- initialization schemes (model.init) ---------------------------------------------------------------------


def init_std(init: str, placement: str = "pre", **kw) -> dict[str, float]:
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=512, dim=256, n_layers=4, n_heads=4, max_seq_len=16, init=init,
                      placement=placement, **kw)
    m = Transformer(cfg)
    b = m.layers[1]
    return {"emb": m.tok_emb.weight.std().item(), "head": m.lm_head.weight.std().item(),
            "wq": b.attn.wq.weight.std().item(), "wv": b.attn.wv.weight.std().item(),
            "wo": b.attn.wo.weight.std().item(), "w1": b.ffn.w1.weight.std().item(),
            "w2": b.ffn.w2.weight.std().item(), "hidden": cfg.ffn_hidden}


@pytest.mark.parametrize("init, placement", [("gpt2", "pre"), ("auto", "pre"), ("xavier", "post"), ("small", "pre"),
                                             ("deepnet", "post"), ("auto", "deepnorm"), ("gpt2", "deepnorm")])
def test_each_init_scheme_gives_its_weight_statistics(init, placement):
    s = init_std(init, placement)
    d, h, v = 256, s.pop("hidden"), 512
    xavier = lambda fan_in, fan_out: math.sqrt(2 / (fan_in + fan_out))  # noqa: E731
    beta = (8 * 4) ** -0.25
    scheme = "deepnet" if (init, placement) == ("auto", "deepnorm") else "gpt2" if init == "auto" else init
    expected = {
        "gpt2": {"emb": 0.02, "head": 0.02, "wq": 0.02, "wv": 0.02, "wo": 0.02 / math.sqrt(8), "w1": 0.02,
                 "w2": 0.02 / math.sqrt(8)},
        "xavier": {"emb": 1.0, "head": xavier(d, v), "wq": xavier(d, d), "wv": xavier(d, d), "wo": xavier(d, d),
                   "w1": xavier(d, h), "w2": xavier(h, d)},
        "small": dict.fromkeys(("emb", "head", "wq", "wv", "wo", "w1", "w2"), math.sqrt(2 / (5 * d))),
        "deepnet": {"emb": 0.02, "head": 0.02, "wq": xavier(d, d), "wv": beta * xavier(d, d),
                    "wo": beta * xavier(d, d), "w1": beta * xavier(d, h), "w2": beta * xavier(h, d)},
    }[scheme]
    assert s == pytest.approx(expected, rel=0.05), (init, placement)


def test_unknown_init_is_a_config_error():
    with pytest.raises(ValueError, match="model.init='kaiming' is invalid; allowed: auto, gpt2, xavier"):
        ModelConfig(init="kaiming")


@pytest.mark.parametrize("placement", ["pre", "peri", "mix"])
def test_layernorm_scaling_is_the_input_norm_gain_times_one_over_sqrt_depth(placement):
    """LayerNorm Scaling (Sun et al. 2025) with RMSNorm = the plain model whose input norms of layer l (1-based,
    Pre-LN and Peri-LN layers only) have their gain divided by sqrt(l): same function, same gradients."""
    torch.manual_seed(0)
    cfg = dict(n_layers=4, placement=placement, mix_fraction=0.25)
    scaled, plain = Transformer(tiny(layernorm_scaling=True, **cfg)), Transformer(tiny(**cfg))
    plain.load_state_dict(scaled.state_dict())
    with torch.no_grad():
        for i, block in enumerate(plain.layers):
            if block.placement in ("pre", "peri"):
                for norm in (block.attn_norm, block.ffn_norm):
                    norm.weight /= math.sqrt(i + 1)
    assert [b.norm_scale for b in scaled.layers] == [
        1 / math.sqrt(i + 1) if b.placement in ("pre", "peri") else 1.0 for i, b in enumerate(scaled.layers)]
    idx = tokens(2, 8)
    torch.testing.assert_close(scaled(idx), plain(idx), rtol=1e-5, atol=1e-6)
    unscaled = Transformer(tiny(**cfg))
    unscaled.load_state_dict(scaled.state_dict())
    assert not torch.allclose(scaled(idx), unscaled(idx), atol=1e-4)  # the scaling changes the function


def test_attention_softcap_caps_the_scores_before_the_softmax():
    """model.attn_logit_softcap=c: softmax(c tanh(s / c)) v, grouped heads and the KV cache alike; a cap far above the
    scores changes nothing, a small one flattens the attention."""
    torch.manual_seed(0)
    cfg = tiny(n_heads=4, n_kv_heads=2, attn_logit_softcap=0.5, init_std=0.5)
    attn = Transformer(cfg).layers[0].attn
    x = torch.randn(2, 9, cfg.dim)
    cos, sin = rope_tables(cfg.head_dim, 9, cfg.rope_theta)
    q, k = attn.qk(x, cos, sin)
    v = attn.wv(x).view(2, 9, 2, cfg.head_dim).transpose(1, 2)
    k, v = k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1)
    scores = q @ k.transpose(-1, -2) / math.sqrt(cfg.head_dim)
    assert scores.abs().amax() > 2  # the cap bites
    capped = (0.5 * torch.tanh(scores / 0.5)).masked_fill(torch.ones(9, 9, dtype=torch.bool).triu(1), float("-inf"))
    y = (capped.softmax(-1) @ v).transpose(1, 2).reshape(2, 9, cfg.dim)
    torch.testing.assert_close(attn(x, cos, sin), attn.wo(y), atol=1e-5, rtol=1e-5)
    attn.softcap = 1e6  # far above every score: plain attention (SDPA's result)
    out = attn(x, cos, sin)
    attn.softcap = None
    torch.testing.assert_close(out, attn(x, cos, sin), atol=1e-5, rtol=1e-5)


def test_final_logit_softcap_bounds_the_logits_and_the_cache_agrees():
    torch.manual_seed(0)
    model = Transformer(tiny(final_logit_softcap=2.0, attn_logit_softcap=5.0, init_std=1.0)).eval()
    plain = Transformer(tiny(init_std=1.0)).eval()
    plain.load_state_dict(model.state_dict())
    x = tokens(B=2, T=12)
    logits, raw = model(x), plain(x)
    assert raw.abs().amax() > 2 and logits.abs().amax() < 2.0  # capped: never beyond +-2
    cache = model.new_cache()
    torch.testing.assert_close(torch.cat([model(x[:, :5], cache), model(x[:, 5:6], cache), model(x[:, 6:], cache)], 1),
                               logits, atol=1e-5, rtol=0)


@pytest.mark.parametrize("field", ["attn_logit_softcap", "final_logit_softcap"])
def test_a_softcap_must_be_positive(field):
    with pytest.raises(ValueError, match=rf"model.{field}=0 is invalid; allowed: a finite number > 0 or null"):
        tiny(**{field: 0})


def test_soft_capped_attention_scores_stay_fp32_under_bf16_autocast():
    """The soft-cap's tanh saturates near the cap, where bf16 rounds scores to steps of 0.25 or more: the capped
    attention computes its scores in fp32 whatever autocast says, so its output under autocast is the fp32 one."""
    torch.manual_seed(0)
    model = Transformer(ModelConfig(vocab_size=17, dim=32, n_layers=1, n_heads=4, n_kv_heads=2, max_seq_len=8,
                                    attn_logit_softcap=50.0))
    attn = model.layers[0].attn
    q, k, v = torch.randn(2, 4, 8, 8) * 30, torch.randn(2, 2, 8, 8) * 30, torch.randn(2, 2, 8, 8)
    mask = torch.ones(8, 8, dtype=torch.bool).tril()
    expected = attn.capped_attention(q, k, v, mask)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = attn.capped_attention(q, k, v, mask)
    assert got.dtype == torch.float32 and torch.equal(got, expected)


def test_a_placement_is_one_declaration(monkeypatch):
    """A placement registered in minillm.placements (here a double norm, norm_out(x + f(norm(x)))) builds, trains,
    initializes and gets its final norm left out with no other change to the model."""
    from minillm import placements

    double = placements.Placement("double_test", lambda x, f, norm, out, s, a: out(x + f(norm(x) * s)), "a test",
                                  out_norm=True, ends_normed=True, scales_input=True)
    monkeypatch.setitem(placements.PLACEMENTS, double.name, double)
    model = Transformer(ModelConfig(vocab_size=40, dim=32, n_layers=2, n_heads=4, placement="double_test"))
    assert isinstance(model.norm, torch.nn.Identity) and model.layers[0].attn_out_norm is not None
    x = torch.randint(0, 40, (2, 8))
    h = model.tok_emb(x)
    cos, sin = model.rope_cos[:8], model.rope_sin[:8]
    block = model.layers[0]
    a = block.attn_out_norm(h + block.attn(block.attn_norm(h), cos, sin))
    expected = block.ffn_out_norm(a + block.ffn(block.ffn_norm(a)))
    torch.testing.assert_close(block(h, cos, sin), expected, rtol=0, atol=0)
    model(x).logsumexp(-1).mean().backward()
    assert all(p.grad is not None for p in model.parameters())
    with pytest.raises(ValueError, match="model.placement"):
        ModelConfig(placement="double_tset")
