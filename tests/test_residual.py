"""The residual stream's options (minillm/placements.py, model.Block, model.Transformer): the residual-branch scalars
(ReZero / SkipInit, LayerScale, a per-layer output scalar) with every placement and norm, the double norm, the
final-norm toggle, the embedding norm and the embedding scale; each against its formula."""

import math

import pytest
import torch
import torch.nn.functional as F
from helpers import EAGER_NORMS, V, tiny, tokens

from minillm.model import PLACEMENTS, Transformer
from minillm.placements import PLACEMENTS as LAYER_PLACEMENTS
from minillm.placements import layerscale_init


def block_io(model: Transformer, layer: int = 0, T: int = 12):
    """(block, h, cos, sin): a block and a non-trivial input for it."""
    h = model.tok_emb(tokens(T=T)) * 10
    return model.layers[layer], h, model.rope_cos[:T], model.rope_sin[:T]


def set_gains(block, value) -> None:
    with torch.no_grad():
        block.attn_gain.weight.fill_(value) if isinstance(value, float) else block.attn_gain.weight.copy_(value)
        block.ffn_gain.weight.fill_(value) if isinstance(value, float) else block.ffn_gain.weight.copy_(value)


@pytest.mark.parametrize("norm", ["none", "rmsnorm"])
def test_rezero_starts_every_pre_block_as_the_identity(norm):
    """ReZero (Bachlechner et al. 2020) / SkipInit (De & Smith 2020): x + a f(x), a = 0 at init, so the model at init
    is the embedding, the final norm and the head."""
    torch.manual_seed(0)
    model = Transformer(tiny(norm=norm, branch_scale="rezero"))
    block, h, cos, sin = block_io(model)
    assert block.attn_gain.weight.shape == (1,) and block.attn_gain.weight.item() == 0.0
    torch.testing.assert_close(block(h, cos, sin), h, rtol=0, atol=0)
    idx = tokens()
    torch.testing.assert_close(model(idx), model.lm_head(model.norm(model.tok_emb(idx))))
    model(idx).logsumexp(-1).mean().backward()
    assert block.attn_gain.weight.grad.abs() > 0  # the gain learns first


@pytest.mark.parametrize("placement", list(LAYER_PLACEMENTS))
def test_branch_gain_multiplies_what_each_placements_branch_ends_in(placement):
    """x + g * f(norm(x)) (pre), norm(x + g * f(x)) (post), x + g * norm_out(f(norm(x))) (peri), x + g * norm(f(x))
    (branch), norm(a x + g * f(x)) (deepnorm), norm_out(x + g * f(norm(x))) (double): the gain scales the branch's
    contribution, never inside a norm that would cancel it."""
    torch.manual_seed(0)
    model = Transformer(tiny(placement=placement, branch_scale="layerscale"))
    block, h, cos, sin = block_io(model)
    gain = torch.rand(model.cfg.dim) + 0.5
    set_gains(block, gain)
    attn = lambda x: block.attn(x, cos, sin)  # noqa: E731
    a = block.alpha
    rules = {"pre": lambda x, f, n, o: x + gain * f(n(x)), "post": lambda x, f, n, o: n(x + gain * f(x)),
             "peri": lambda x, f, n, o: x + gain * o(f(n(x))), "branch": lambda x, f, n, o: x + gain * n(f(x)),
             "deepnorm": lambda x, f, n, o: n(a * x + gain * f(x)),
             "double": lambda x, f, n, o: o(x + gain * f(n(x)))}
    x = rules[placement](h, attn, block.attn_norm, block.attn_out_norm)
    expected = rules[placement](x, block.ffn, block.ffn_norm, block.ffn_out_norm)
    torch.testing.assert_close(block(h, cos, sin), expected)


def test_layerscale_is_a_vector_initialized_by_depth_as_cait():
    assert [layerscale_init(n) for n in (2, 18, 24, 36)] == [0.1, 0.1, 1e-5, 1e-6]
    model = Transformer(tiny(branch_scale="layerscale"))
    assert model.layers[1].ffn_gain.weight.shape == (model.cfg.dim,)
    assert torch.all(model.layers[1].ffn_gain.weight == 0.1)
    model = Transformer(tiny(branch_scale="rezero", branch_scale_init=0.5))
    with torch.no_grad():
        model.layers[0].attn_gain.weight.fill_(3.0)
    model.init_weights()
    assert model.layers[0].attn_gain.weight.item() == 0.5


def test_layer_output_scale_multiplies_each_layers_output():
    torch.manual_seed(0)
    model = Transformer(tiny(layer_output_scale=True))
    block, h, cos, sin = block_io(model)
    assert block.out_scale.item() == 1.0
    with torch.no_grad():
        block.out_scale.fill_(0.7)
    torch.testing.assert_close(block(h, cos, sin), 0.7 * block.sublayers(h, cos, sin))


@pytest.mark.parametrize("placement", PLACEMENTS)
@pytest.mark.parametrize("scale", ["rezero", "layerscale"])
def test_residual_scalars_train_with_every_placement(placement, scale):
    torch.manual_seed(0)
    model = Transformer(tiny(placement=placement, branch_scale=scale, layer_output_scale=True))
    idx = tokens(B=4, T=16, seed=3)
    assert abs(F.cross_entropy(model(idx).flatten(0, 1), idx.flatten()).item() - math.log(V)) < 0.15
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0)
    losses = []
    for _ in range(15):
        loss = F.cross_entropy(model(idx[:, :-1]).flatten(0, 1), idx[:, 1:].flatten())
        losses.append(loss.item())
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert losses[-1] < 0.8 * losses[0], losses


@pytest.mark.parametrize("norm", EAGER_NORMS)
def test_rezero_fits_one_batch_with_every_norm_and_none(norm):
    torch.manual_seed(0)
    model = Transformer(tiny(norm=norm, branch_scale="rezero"))
    idx = tokens(B=4, T=16, seed=3)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0)
    first = None
    for _ in range(50):
        loss = F.cross_entropy(model(idx[:, :-1]).flatten(0, 1), idx[:, 1:].flatten())
        first = first if first is not None else loss.item()
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.3 * first, (first, loss.item())


def test_double_norm_is_a_norm_on_the_branch_input_and_on_the_sum():
    torch.manual_seed(0)
    model = Transformer(tiny(placement="double"))
    block, h, cos, sin = block_io(model)
    assert isinstance(model.norm, torch.nn.Identity)  # the block ends normalized
    a = block.attn_out_norm(h + block.attn(block.attn_norm(h), cos, sin))
    torch.testing.assert_close(block(h, cos, sin), block.ffn_out_norm(a + block.ffn(block.ffn_norm(a))),
                               rtol=0, atol=0)


@pytest.mark.parametrize("placement, final", [("pre", False), ("post", True), ("double", True), ("peri", None)])
def test_final_norm_toggle_overrides_the_placements_choice(placement, final):
    torch.manual_seed(0)
    model = Transformer(tiny(placement=placement, final_norm=final))
    want = final if final is not None else not LAYER_PLACEMENTS[placement].ends_normed
    assert isinstance(model.norm, torch.nn.Identity) is (not want)
    idx = tokens()
    h = model.tok_emb(idx)
    cos, sin = model.rope_cos[:12], model.rope_sin[:12]
    for block in model.layers:
        h = block(h, cos, sin)
    torch.testing.assert_close(model(idx), model.lm_head(model.norm(h) if want else h))


@pytest.mark.parametrize("norm", ["rmsnorm", "layernorm", "dyt"])
def test_embedding_norm_and_scale_come_before_the_first_block(norm):
    """BLOOM's embedding norm, and DyT's / Derf's language-model embedding scale (a learnable scalar, init sqrt(C))."""
    torch.manual_seed(0)
    model = Transformer(tiny(norm=norm, embed_norm=True, embed_scale=True))
    assert model.emb_scale.item() == pytest.approx(math.sqrt(model.cfg.dim))
    assert type(model.emb_norm) is type(model.layers[0].attn_norm)
    idx = tokens()
    captured = []
    model.layers[0].register_forward_pre_hook(lambda m, args, kwargs: captured.append(args[0]), with_kwargs=True)
    model(idx)
    torch.testing.assert_close(captured[0], model.emb_norm(model.tok_emb(idx) * math.sqrt(model.cfg.dim)))
    with torch.no_grad():
        model.emb_scale.fill_(1.0)
    model.init_weights()
    assert model.emb_scale.item() == pytest.approx(math.sqrt(model.cfg.dim))


@pytest.mark.parametrize("kw, message", [
    (dict(branch_scale="fixup"), r"model.branch_scale='fixup' is invalid; allowed: none, rezero, layerscale$"),
    (dict(branch_scale_init="small"), r"model.branch_scale_init='small' is invalid"),
    (dict(final_norm="yes"), r"model.final_norm='yes' is invalid; allowed: true or false$"),
    (dict(embed_scale=1), r"model.embed_scale=1 is invalid; allowed: true or false$"),
    (dict(layer_output_scale=None), r"model.layer_output_scale=null is invalid; allowed: true or false$"),
])
def test_residual_option_errors_name_the_field(kw, message):
    with pytest.raises(ValueError, match=message):
        tiny(**kw)
