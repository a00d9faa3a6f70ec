"""nGPT (minillm/ngpt.py, model.ngpt=true, experiment=ngpt): the forward against the formulas of NVIDIA's reference
implementation (github.com/NVIDIA/ngpt, model.py with use_nGPT=1, and train.py's normalize_matrices), the unit
sphere at init and after every optimizer step (AdamW, Muon, resumed runs, a compiled model), and its config."""

import math
import time
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from helpers import ROOT, V, compose_cfg, logged, read_rows, tiny, tokens
from processes import cli, ok

import minillm.training.train as train_script
from minillm.model import Transformer, apply_rope
from minillm.tools.hub import load_checkpoint

# (parameter, the axis of size C along which nGPT keeps it at unit norm), as normalize_matrices does
C_AXIS = {"tok_emb.weight": 1, "lm_head.weight": 1, "attn.wq.weight": 1, "attn.wk.weight": 1, "attn.wv.weight": 1,
          "attn.wo.weight": 0, "ffn.w1.weight": 1, "ffn.w3.weight": 1, "ffn.w2.weight": 0}


def matrices(model: Transformer):
    """(name, weight, C axis) of every matrix nGPT normalizes."""
    for name, p in model.named_parameters():
        key = name.split(".", 2)[-1] if name.startswith("layers.") else name
        if key in C_AXIS:
            yield name, p, C_AXIS[key]


def assert_on_the_sphere(model: Transformer, atol: float = 1e-5) -> None:
    found = list(matrices(model))
    assert len(found) == 2 + 7 * model.cfg.n_layers
    for name, w, axis in found:
        norms = w.detach().norm(dim=axis)
        assert torch.allclose(norms, torch.ones_like(norms), atol=atol), (name, (norms - 1).abs().max().item())


def reference_logits(model: Transformer, idx: torch.Tensor) -> torch.Tensor:
    """NVIDIA's nGPT forward, from its formulas, on minillm's parameters (its c_fc is [w3; w1]: u, then the gate v;
    its RoPE is minillm's here). Each scale is stored s and used as s * (init_value / init_scaling)."""
    cfg = model.cfg
    C, H, D, base = cfg.dim, cfg.n_heads, cfg.head_dim, cfg.dim**-0.5
    B, T = idx.shape
    justnorm = lambda x: x / x.norm(p=2, dim=-1, keepdim=True)  # noqa: E731
    cos, sin = model.rope_cos[:T], model.rope_sin[:T]
    h = model.tok_emb.weight[idx]
    for block in model.layers:
        a, f = block.attn, block.ffn
        q, k, v = ((h @ w.weight.T).view(B, T, H, D) for w in (a.wq, a.wk, a.wv))
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        sqk = (a.s_qk.weight * (1.0 / base)).view(1, 1, H, D)
        q, k = sqk * justnorm(q), sqk * justnorm(k)
        scores = q.transpose(1, 2) @ k.transpose(1, 2).transpose(-2, -1) * D**0.5  # softmax_scale = sqrt(D)
        scores = scores.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
        y = (scores.softmax(-1) @ v.transpose(1, 2)).transpose(1, 2).reshape(B, T, C)
        h_att = y @ a.wo.weight.T
        lr = torch.abs(block.attn_step.alpha.weight * (0.05 / base))
        A, B_ = justnorm(h), justnorm(h_att)
        h = justnorm(A + lr * (B_ - A))
        uv = h @ torch.cat([f.w3.weight, f.w1.weight]).T
        suv = torch.cat([f.s_u.weight, f.s_v.weight]) * (1.0 / 1.0 * C**0.5)
        u, gate = torch.chunk(suv * uv, 2, dim=-1)
        h_mlp = (u * F.silu(gate)) @ f.w2.weight.T
        lr = torch.abs(block.ffn_step.alpha.weight * (0.05 / base))
        A, B_ = justnorm(h), justnorm(h_mlp)
        h = justnorm(A + lr * (B_ - A))
    return (h @ model.lm_head.weight.T) * (model.logit_scale.weight * (1.0 / base))


def ngpt(**kw) -> Transformer:
    return Transformer(tiny(norm="none", ngpt=True, n_kv_heads=None, **kw))


def test_the_forward_is_nvidias_ngpt():
    torch.manual_seed(0)
    model = ngpt()
    with torch.no_grad():  # the scales away from their init, so each one's formula matters
        for p in model.parameters():
            if p.ndim == 1:
                p.mul_(torch.rand_like(p) + 0.5)
    idx = tokens()
    torch.testing.assert_close(model(idx), reference_logits(model, idx), atol=1e-5, rtol=1e-5)


def test_init_puts_every_matrix_on_the_sphere_and_the_scales_at_their_inits():
    torch.manual_seed(0)
    model = ngpt()
    assert_on_the_sphere(model)
    block, base = model.layers[0], model.cfg.dim**-0.5
    assert torch.allclose(block.attn_step.alpha.weight, torch.full((model.cfg.dim,), base))  # stored at 1/sqrt(C)
    assert torch.allclose(block.attn_step.alpha(), torch.full((model.cfg.dim,), 0.05))
    assert torch.allclose(block.attn.s_qk(), torch.ones(model.cfg.dim)) and torch.allclose(model.logit_scale(),
                                                                                            torch.ones(V))
    assert torch.all(block.ffn.s_u.weight == 1.0) and isinstance(model.norm, torch.nn.Identity)
    assert not [n for n, _ in model.named_parameters() if "norm" in n]  # no norm layers
    with torch.no_grad():
        model.lm_head.weight.mul_(3.0)
    model.renormalize_()
    assert_on_the_sphere(model)


def test_the_hidden_states_stay_on_the_sphere():
    torch.manual_seed(0)
    model = ngpt()
    h = model.hidden(tokens())
    torch.testing.assert_close(h.norm(dim=-1), torch.ones(h.shape[:2]))


@pytest.mark.slow  # long (end to end); `-m slow` runs it
@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_every_optimizer_step_ends_on_the_sphere_and_a_resumed_run_stays_there(optimizer, tmp_path, corpus):
    """Lightning's step, then renormalize_ (LitLM.optimizer_step): after 4 steps, and after resuming to 6."""
    first = compose_cfg(tmp_path / "first", corpus, "experiment=ngpt", f"optimizer={optimizer}",
                        "trainer.max_steps=4", "trainer.val_check_interval=4", "scheduler.total_steps=6")
    train_script.train(first)
    ckpt = Path(first.paths.output_dir) / "checkpoints" / "last.ckpt"
    model, _, _ = load_checkpoint(str(ckpt))
    assert model.cfg.ngpt
    assert_on_the_sphere(model)
    time.sleep(1.1)
    resumed = compose_cfg(tmp_path / "resumed", corpus, "experiment=ngpt", f"optimizer={optimizer}",
                          "trainer.max_steps=6", "trainer.val_check_interval=2", f"ckpt_path={ckpt}")
    train_script.train(resumed)
    model, _, _ = load_checkpoint(str(Path(resumed.paths.output_dir) / "checkpoints" / "last.ckpt"))
    assert_on_the_sphere(model)
    losses = logged(read_rows(Path(resumed.paths.output_dir)), "train/loss")
    assert sorted(losses) == [4, 5] and all(math.isfinite(v) for v in losses.values())


@pytest.mark.slow
def test_a_compiled_ngpt_run_matches_the_eager_run_and_stays_on_the_sphere(tmp_path, corpus):
    runs = {}
    for compiled in (False, True):
        cfg = compose_cfg(tmp_path / str(compiled), corpus, "experiment=ngpt", "trainer.max_steps=4",
                          f"model.compile={str(compiled).lower()}")
        train_script.train(cfg)
        model, _, _ = load_checkpoint(str(Path(cfg.paths.output_dir) / "checkpoints" / "last.ckpt"))
        assert_on_the_sphere(model)
        runs[compiled] = logged(read_rows(Path(cfg.paths.output_dir)), "train/loss")
    assert runs[True].keys() == runs[False].keys()
    assert all(runs[True][s] == pytest.approx(runs[False][s], rel=1e-4) for s in runs[True])


@pytest.mark.slow
def test_a_ddp_ngpt_run_ends_on_the_sphere(tmp_path, shared_cache, corpus):
    """trainer=ddp_cpu: each process renormalizes its copy after the same all-reduced step, so the copies agree."""
    ok(cli([str(ROOT / "train.py"), "trainer=ddp_cpu", "experiment=ngpt", "trainer.max_steps=4", "model=tiny",
            "data=files", f"data.files=[{corpus}]", "data.batch_size=4", "data.val_windows=8", "logger=csv",
            "name=ddp_ngpt"], tmp_path, shared_cache))
    (ckpt,) = (tmp_path / "logs" / "ddp_ngpt" / "runs").glob("*/checkpoints/last.ckpt")
    model, _, _ = load_checkpoint(str(ckpt))
    assert model.cfg.ngpt
    assert_on_the_sphere(model)


@pytest.mark.parametrize("kw, message", [
    (dict(norm="rmsnorm"), r"model.norm='rmsnorm' is invalid; allowed: 'none' with model.ngpt=true"),
    (dict(norm="none", placement="post"), r"model.placement='post' is invalid; allowed: 'pre' with model.ngpt=true"),
    (dict(norm="none", n_kv_heads=2), r"model.n_kv_heads=2 is invalid; allowed: 4 with model.ngpt=true"),
    (dict(norm="none", qk_norm="rmsnorm"), r"model.qk_norm='rmsnorm' is invalid; allowed: 'none' with model.ngpt"),
    (dict(norm="none", branch_scale="rezero"), r"model.branch_scale='rezero' is invalid; allowed: 'none' with "),
    (dict(ngpt="yes"), r"model.ngpt='yes' is invalid; allowed: true or false$"),
])
def test_ngpt_refuses_what_it_replaces(kw, message):
    with pytest.raises(ValueError, match=message):
        tiny(**{"ngpt": True, **kw})
