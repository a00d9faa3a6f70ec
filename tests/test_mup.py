"""muP (minillm/mup.py, model.parametrization=mup): the coordinate check, the rules against the ``mup`` package's,
the config errors, resuming, loading and export."""

from __future__ import annotations

import functools
import math

import numpy as np
import pytest
import torch
from helpers import ROOT, compose_cfg, logged, read_rows
from processes import cli, ok

import minillm.mup as mup
from minillm.errors import ConfigError
from minillm.model import ModelConfig, Transformer
from minillm.tools.hub import load_checkpoint
from minillm.training.lit_module import LitLM
from minillm.training.optim import MuonWithAdamW, scale_group_lrs
from minillm.training.run.naming import run_name

WIDTHS = (32, 64, 128, 256, 512)
BASE = 32
SCALINGS = ("hidden_init_mult", "attention_scale", "readout_mult", "hidden_lr_mult")  # each muP rule of minillm.mup
LEFT_OUT = {"hidden_init_mult": lambda cfg: 1.0, "attention_scale": lambda cfg: None,
            "readout_mult": lambda cfg: 1.0, "hidden_lr_mult": lambda cfg, *a, **k: 1.0}  # each as in standard
FLAT = 0.2  # |exponent| of width allowed for a scale that muP keeps constant (measured: < 0.1)
GROWS = 0.35  # the exponent that counts as growth (measured under standard: 0.5 to 1.0)


def config(width: int, parametrization: str = "mup", **kw) -> ModelConfig:
    base = BASE if parametrization == "mup" else None
    return ModelConfig(vocab_size=64, dim=width, n_layers=2, n_heads=4, max_seq_len=32,
                       parametrization=parametrization, mup_base_width=base, **kw)


def batch(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """8 sequences of 32 tokens whose second half repeats the first (attention has something to learn), of 8
    distinct tokens: the queries of the first layer come back often enough for their update to align with them
    within 3 steps, as it does at any batch in the infinite-width limit (with 64 distinct tokens the scores' change
    is still dominated by its uncorrelated part, ~width^-1/2, at these widths: measured)."""
    half = torch.randint(0, 8, (8, 17), generator=torch.Generator().manual_seed(seed))
    seq = torch.cat((half, half), dim=1)  # (8, 34)
    return seq[:, :32], seq[:, 1:33]


def record(model: Transformer, x: torch.Tensor) -> dict[str, torch.Tensor]:
    """The output of each site: embedding, each block's attention and feed-forward outputs and residual stream,
    each block's attention scores (q.k times the model's scale), the logits."""
    out: dict[str, torch.Tensor] = {}
    hooks = [model.tok_emb.register_forward_hook(lambda m, i, o: out.__setitem__("embed", o.detach().clone()))]
    for n, block in enumerate(model.layers):
        def scores(attn, args, n=n):
            q, k = attn.qk(*args)  # (B, H, T, D) each
            scale = attn.scale if attn.scale is not None else attn.head_dim ** -0.5
            out[f"scores{n}"] = (q @ k.transpose(-2, -1) * scale).detach()
        hooks.append(block.attn.register_forward_pre_hook(scores))
        for site, module in (("attn", block.attn), ("ffn", block.ffn), ("block", block)):
            hooks.append(module.register_forward_hook(
                lambda m, i, o, key=f"{site}{n}": out.__setitem__(key, o.detach().clone())))
    with torch.no_grad():
        out["logits"] = model(x)
    for h in hooks:
        h.remove()
    return out


def rms(t: torch.Tensor) -> float:
    return t.float().pow(2).mean().sqrt().item()


def coordinates(width: int, parametrization: str = "mup", optimizer: str = "adamw", steps: int = 3,
                seed: int = 0) -> dict[str, float]:
    """Per site: ``init:<site>``, the RMS of its output at init, and ``update:<site>``, the RMS of its change after
    ``steps`` steps on one batch (the optimizer's groups as LitLM makes them, muP's lrs included)."""
    torch.manual_seed(seed)
    cfg = config(width, parametrization)
    factory = (functools.partial(torch.optim.AdamW, lr=1e-2, weight_decay=0.0) if optimizer == "adamw" else
               functools.partial(MuonWithAdamW, lr=0.02, adamw_lr=1e-2, weight_decay=0.0, adamw_weight_decay=0.0))
    module = LitLM(cfg, optimizer=factory)
    model = module.model
    opt = factory(module.param_groups())
    scale_group_lrs(opt)
    x, y = batch()
    before = record(model, x)
    for _ in range(steps):
        loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
    after = record(model, x)
    return {**{f"init:{k}": rms(v) for k, v in before.items()},
            **{f"update:{k}": rms(after[k] - v) for k, v in before.items()}}


def exponents(widths=WIDTHS, **kw) -> dict[str, float]:
    """Per measured scale, the slope of log(scale) against log(width) (least squares over the widths)."""
    rows = [coordinates(w, **kw) for w in widths]
    logw = np.log(widths)
    return {k: float(np.polyfit(logw, np.log([r[k] for r in rows]), 1)[0]) for k in rows[0]}


def growing(slopes: dict[str, float], above: float = GROWS) -> dict[str, float]:
    return {k: round(v, 2) for k, v in slopes.items() if v > above}


# --- the coordinate check ---------------------------------------------------------------------------------


@pytest.mark.parametrize("optimizer", ["adamw", pytest.param("muon", marks=pytest.mark.slow)])  # Muon: ~6 min on a CPU
def test_coordinate_check_flat_under_mup_and_growing_under_standard(optimizer):
    """After 3 steps, every activation's change keeps its size across widths 32..512 under muP (|exponent| <
    FLAT; the second layer's attention scores may still shrink, their update not yet aligned with their queries)
    and nothing grows, at init or after; under standard parametrization the changes grow with width."""
    mup_slopes = exponents(optimizer=optimizer)
    assert not growing(mup_slopes, FLAT), growing(mup_slopes, FLAT)
    updates = {k: round(v, 2) for k, v in mup_slopes.items()
               if k.startswith("update:") and k != "update:scores1" and abs(v) > FLAT}
    assert not updates, updates
    standard = growing(exponents(parametrization="standard", optimizer=optimizer))
    assert {"update:attn0", "update:ffn0", "update:logits"} <= set(standard), standard


@pytest.mark.parametrize("scaling", SCALINGS)
def test_the_coordinate_check_fails_when_any_one_scaling_is_left_out(scaling, monkeypatch):
    """Each rule of minillm.mup replaced by its standard value makes some scale grow with width (so the check above
    can fail for every rule); widths 32, 128, 512."""
    monkeypatch.setattr(mup, scaling, LEFT_OUT[scaling])
    grown = growing(exponents(widths=(32, 128, 512)))
    expected = {"hidden_init_mult": "init:attn0", "attention_scale": "update:scores0", "readout_mult": "update:logits",
                "hidden_lr_mult": "update:ffn0"}[scaling]
    assert expected in grown, grown


# --- the rules, against the mup package's -----------------------------------------------------------------


def test_lr_multipliers_and_init_scales_match_the_mup_package():
    """On the same model, mup.set_base_shapes + MuAdamW give each parameter the lr and weight decay minillm gives
    it, and mup's constant-std init the same std ratio as minillm's init (within sampling error)."""
    mup_pkg = pytest.importorskip("mup")
    width, lr, wd = 128, 1e-2, 0.1

    def ffn_fixed(w: int, parametrization: str = "mup") -> ModelConfig:  # ffn hidden exactly 3 * dim at every width
        return config(w, parametrization, ffn_hidden=3 * w)

    def with_readout(cfg: ModelConfig) -> Transformer:  # the head as mup's MuReadout (mup refuses a plain Linear)
        model = Transformer(cfg)
        model.lm_head = mup_pkg.MuReadout(cfg.dim, cfg.vocab_size, bias=False)
        return model

    model = with_readout(ffn_fixed(width, "standard"))
    base, delta = with_readout(ffn_fixed(BASE, "standard")), with_readout(ffn_fixed(2 * BASE, "standard"))
    mup_pkg.set_base_shapes(model, base, delta=delta, rescale_params=False)
    theirs = mup_pkg.MuAdamW([p for p in model.parameters()], lr=lr, weight_decay=wd)
    their_lr = {id(p): (g["lr"], g["weight_decay"]) for g in theirs.param_groups for p in g["params"]}

    ours_module = LitLM(ffn_fixed(width), optimizer=functools.partial(torch.optim.AdamW, lr=lr, weight_decay=wd))
    ours = ours_module.optimizer_factory(ours_module.param_groups())
    scale_group_lrs(ours)
    our_lr = {name: (g["lr"], g["weight_decay"]) for g in ours.param_groups for p in g["params"]
              for name, q in ours_module.model.named_parameters() if q is p}
    for name, p in model.named_parameters():
        their_lr_p, their_wd = their_lr[id(p)]
        our_lr_p, our_wd = our_lr[name]
        assert math.isclose(our_lr_p, their_lr_p), name
        if our_wd:  # minillm's gains, biases and embedding are not decayed (module.decay_norms/embeddings)
            assert math.isclose(our_wd, their_wd), name
        # init: mup's normal_(std) draws std / sqrt(width_mult) for a matrix-like parameter, std otherwise
        expected = (p.infshape.width_mult() ** -0.5 if p.infshape.ninf() == 2 else 1.0)
        if p.ndim == 2 and not name.startswith("lm_head"):  # MuReadout's own init is torch's, not the model's
            ratio = ours_module.model.state_dict()[name].std().item() / p.std().item()
            assert ratio == pytest.approx(expected, rel=0.1), name
    assert 1 / model.lm_head.width_mult() == mup.readout_mult(ffn_fixed(width))  # the readout multiplier


def test_at_the_base_width_mup_is_the_standard_model():
    x, _ = batch()
    torch.manual_seed(0)
    standard = Transformer(config(BASE, "standard"))
    torch.manual_seed(0)
    mupped = Transformer(config(BASE))
    with torch.no_grad():
        assert torch.equal(standard(x), mupped(x))


# --- options, errors, checkpoints, export ------------------------------------------------------------------


@pytest.mark.parametrize("kw, field", [
    (dict(parametrization="mu-p"), "model.parametrization"),
    (dict(parametrization="mup"), "model.mup_base_width"),
    (dict(parametrization="mup", mup_base_width=0), "model.mup_base_width"),
    (dict(parametrization="mup", mup_base_width=30), "model.mup_base_width"),  # not a multiple of n_heads=4
    (dict(mup_base_width=32), "model.mup_base_width"),  # standard
    (dict(parametrization="mup", mup_base_width=32, tie_embeddings=True), "model.tie_embeddings"),
    (dict(parametrization="mup", mup_base_width=32, init="xavier"), "model.init"),
    (dict(parametrization="mup", mup_base_width=32, placement="deepnorm"), "model.placement"),
])
def test_bad_mup_settings_are_one_line_errors_naming_the_field(kw, field):
    with pytest.raises(ConfigError) as err:
        ModelConfig(vocab_size=64, dim=64, n_layers=2, n_heads=4, **kw)
    assert str(err.value).startswith(field) and "\n" not in str(err.value), str(err.value)


@pytest.mark.parametrize("factory, field", [
    (functools.partial(torch.optim.SGD, lr=0.1), "optimizer SGD"),
    (functools.partial(MuonWithAdamW, adjust_lr_fn="match_rms_adamw"), "optimizer.adjust_lr_fn"),
])
def test_an_optimizer_without_a_mup_rule_is_refused(factory, field):
    module = LitLM(config(64), optimizer=factory)
    with pytest.raises(ConfigError) as err:
        module.param_groups()
    assert str(err.value).startswith(field) and "\n" not in str(err.value), str(err.value)


def test_standard_groups_are_unchanged_and_mup_groups_carry_the_multiplier():
    standard = LitLM(config(64, "standard"), optimizer=functools.partial(torch.optim.AdamW, lr=1e-3))
    assert [set(g) for g in standard.param_groups()] == [{"params"}, {"params", "weight_decay"}]
    module = LitLM(config(128), optimizer=functools.partial(torch.optim.AdamW, lr=1e-3, weight_decay=0.1))
    opt = module.optimizer_factory(module.param_groups())
    scale_group_lrs(opt)
    assert [(g["lr"], g["weight_decay"]) for g in opt.param_groups] == [(1e-3, 0.1), (1e-3, 0.0), (2.5e-4, 0.4)]
    assert opt.param_groups[2]["lr_mult"] == 0.25


@pytest.mark.slow  # long (end to end); `-m slow` runs it
def test_a_mup_run_resumes_exactly_and_its_checkpoint_loads_as_trained(tmp_path, shared_cache, corpus):
    """train.py with model.parametrization=mup: a run stopped by SIGTERM at step 3 and resumed with
    ckpt_path=auto logs the uninterrupted run's losses (the scaled lrs come back from the checkpoint, not scaled
    again); its checkpoint loads (minillm.tools.hub.load_checkpoint) into a muP model giving the trained module's
    logits;
    the run's hidden group trained at optimizer.lr / 2 (dim 32, base width 16)."""
    args = [str(ROOT / "train.py"), "model=tiny", "data=files", f"data.files=[{corpus}]", "data.batch_size=4",
            "data.val_windows=4", "trainer.max_steps=6", "trainer.val_check_interval=3", "trainer.log_every_n_steps=1",
            "test=false", "callbacks.text_sample.max_new_tokens=8", "scheduler.warmup_steps=1", "name=mup",
            "model.parametrization=mup", "model.mup_base_width=16"]
    ok(cli([*args, "run_id=full"], tmp_path, shared_cache))
    stop = ["+callbacks.signal._target_=helpers.SignalAt", "+callbacks.signal.signum=15", "+callbacks.signal.step=3"]
    assert cli([*args, "run_id=cut", *stop], tmp_path, shared_cache).returncode == 143
    ok(cli([*args, "run_id=cut", "ckpt_path=auto"], tmp_path, shared_cache))
    runs = tmp_path / "logs" / "mup" / "runs"
    losses = logged(read_rows(runs / "full"), "train/loss")
    assert logged(read_rows(runs / "cut"), "train/loss") == losses and len(losses) == 6
    (ckpt,) = (runs / "cut").rglob("last.ckpt")
    saved = torch.load(ckpt, map_location="cpu", weights_only=True)
    groups = saved["optimizer_states"][0]["param_groups"]
    assert [g.get("lr_mult") for g in groups] == [None, None, 0.5]
    assert groups[2]["initial_lr"] == groups[0]["initial_lr"] / 2
    model, _, meta = load_checkpoint(ckpt)
    assert (model.cfg.parametrization, model.cfg.mup_base_width, meta["model"]["dim"]) == ("mup", 16, 32)
    module = LitLM(model.cfg)
    module.load_state_dict(saved["state_dict"])
    x = torch.randint(0, model.cfg.vocab_size, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(model(x), module.model(x))


def test_a_mup_run_is_named_by_its_base_width(tmp_path, corpus):
    cfg = compose_cfg(tmp_path, corpus, "model.parametrization=mup", "model.mup_base_width=16")
    assert run_name(cfg) == "rmsnorm-pre-L2-d32-mup16-lr0.003-wu1-s1337"
