"""The chunked linear + cross entropy (minillm/training/loss.py) against the plain loss on the whole batch's logits:
loss and
gradients in fp32 and bf16, with z-loss and the output soft-cap, compiled, and without ever making a tensor the
size of the whole batch's logits."""

import functools

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from minillm.errors import ConfigError
from minillm.model import ModelConfig
from minillm.training import loss as L
from minillm.training.lit_module import LitLM


def _inputs(n=300, c=64, v=1000, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(n, c, generator=g).to(dtype)
    w = (0.05 * torch.randn(v, c, generator=g)).to(dtype)
    return h, w, torch.randint(v, (n,), generator=g)


def _run(impl, h, w, y, autocast=False, **kw):
    """(loss, ce, dh, dw) of one implementation on fresh leaves."""
    h, w = h.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        loss, ce = L.linear_cross_entropy(h, w, y, impl, **kw)
    loss.backward()
    return loss.detach(), ce.detach(), h.grad, w.grad


CASES = [dict(), dict(z_loss=1e-3), dict(softcap=5.0), dict(z_loss=1e-3, softcap=5.0)]
IDS = ["ce", "z-loss", "softcap", "z-loss+softcap"]


@pytest.mark.parametrize("kw", CASES, ids=IDS)
@pytest.mark.parametrize("chunk_rows", [64, 7, 300, 1000])
def test_chunked_matches_plain_in_fp32(kw, chunk_rows):
    h, w, y = _inputs()
    plain, chunked = _run("plain", h, w, y, **kw), _run("chunked", h, w, y, chunk_rows=chunk_rows, **kw)
    for name, a, b in zip(("loss", "ce", "dh", "dw"), plain, chunked, strict=True):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6, msg=lambda m, n=name: f"{n}: {m}")
    assert chunked[0] > chunked[1] if kw.get("z_loss") else torch.equal(chunked[0], chunked[1])


@pytest.mark.parametrize("kw", CASES, ids=IDS)
def test_chunked_matches_plain_under_bf16_autocast(kw):
    """bf16-mixed: fp32 weights, the matmuls in bf16 (as the model's lm_head under autocast), the softmax in fp32."""
    h, w, y = _inputs()
    plain, chunked = _run("plain", h, w, y, autocast=True, **kw), _run("chunked", h, w, y, True, chunk_rows=64, **kw)
    torch.testing.assert_close(chunked[0], plain[0], rtol=2e-3, atol=2e-3)
    for name, a, b in zip(("dh", "dw"), plain[2:], chunked[2:], strict=True):
        assert a.dtype == b.dtype == torch.float32
        torch.testing.assert_close(b, a, rtol=2e-2, atol=2e-2 * a.abs().max().item(), msg=lambda m, n=name: f"{n}: {m}")


def test_chunked_matches_plain_in_bf16():
    """bf16-true: h and the weight in bf16, their gradients bf16."""
    h, w, y = _inputs(dtype=torch.bfloat16)
    plain, chunked = _run("plain", h, w, y, z_loss=1e-3), _run("chunked", h, w, y, chunk_rows=64, z_loss=1e-3)
    torch.testing.assert_close(chunked[0], plain[0], rtol=2e-3, atol=2e-3)
    for a, b in zip(plain[2:], chunked[2:], strict=True):
        assert a.dtype == b.dtype == torch.bfloat16
        torch.testing.assert_close(b.float(), a.float(), rtol=2e-2, atol=2e-2 * a.abs().max().item())


def test_batch_dimensions_and_the_gradient_of_the_loss_scale():
    """(B, T, C) hidden states, and a backward from 3 * loss: the saved gradients scale with the incoming one."""
    h, w, y = _inputs(n=120)
    h3, y3 = h.view(4, 30, -1), y.view(4, 30)
    out = []
    for impl in ("plain", "chunked"):
        hh, ww = h3.clone().requires_grad_(), w.clone().requires_grad_()
        loss, _ = L.linear_cross_entropy(hh, ww, y3, impl, chunk_rows=50)
        (3 * loss).backward()
        out.append((hh.grad, ww.grad))
    for a, b in zip(*out, strict=True):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)


class _Sizes(TorchDispatchMode):
    """The largest number of elements of any tensor an op returns."""

    largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


@pytest.mark.parametrize("impl", ["plain", "chunked"])
def test_no_tensor_the_size_of_the_whole_batchs_logits(impl):
    """Forward and backward of the chunked loss make nothing near N x V elements (the plain loss does: the check
    can fail); a chunk's logits are what it holds."""
    h, w, y = _inputs(n=2048, c=32, v=512)
    h.requires_grad_(), w.requires_grad_()
    with _Sizes() as sizes:
        loss, _ = L.linear_cross_entropy(h, w, y, impl, chunk_rows=256)
        loss.backward()
    if impl == "plain":
        assert sizes.largest >= 2048 * 512
    else:
        assert sizes.largest <= 256 * 512


def test_the_compiled_chunked_loss_is_one_graph_and_matches_eager():
    h, w, y = _inputs(n=96, c=32, v=200)
    compiled = torch.compile(functools.partial(L.linear_cross_entropy, impl="chunked", z_loss=1e-3, softcap=5.0,
                                               chunk_rows=40), fullgraph=True, backend="aot_eager")
    eager = _run("chunked", h, w, y, z_loss=1e-3, softcap=5.0, chunk_rows=40)
    hh, ww = h.clone().requires_grad_(), w.clone().requires_grad_()
    loss, ce = compiled(hh, ww, y)
    loss.backward()
    for a, b in zip(eager, (loss.detach(), ce, hh.grad, ww.grad), strict=True):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)


def test_without_gradients_the_chunks_give_the_plain_loss():
    h, w, y = _inputs(n=130)
    with torch.no_grad():
        got = L.linear_cross_entropy(h, w, y, "chunked", z_loss=1e-3, chunk_rows=50)
        want = L.linear_cross_entropy(h, w, y, "plain", z_loss=1e-3)
    for a, b in zip(want, got, strict=True):
        torch.testing.assert_close(b, a, rtol=1e-6, atol=1e-6)


def test_default_chunk_rows():
    assert L.default_chunk_rows(32000, 8192) == 1024 and L.default_chunk_rows(65, 2048) == 2048
    assert L.default_chunk_rows(10**9, 8192) == 64


def test_bad_loss_settings_fail_in_one_line():
    with pytest.raises(ConfigError, match=r"module.loss_impl='fast' is invalid; allowed: auto, plain, chunked, liger"):
        LitLM(ModelConfig(vocab_size=16, dim=16, n_layers=1, n_heads=2), loss_impl="fast")
    with pytest.raises(ConfigError, match="module.loss_chunk_rows=0 is invalid"):
        LitLM(ModelConfig(vocab_size=16, dim=16, n_layers=1, n_heads=2), loss_chunk_rows=0)
    try:
        import liger_kernel.transformers.functional  # noqa: F401
    except ImportError:
        with pytest.raises(ConfigError, match="module.loss_impl=liger needs Liger-Kernel") as err:
            LitLM(ModelConfig(vocab_size=16, dim=16, n_layers=1, n_heads=2), loss_impl="liger")
        assert "\n" not in str(err.value)


@pytest.mark.parametrize("compile", [False, True], ids=["eager", "compiled"])
def test_a_training_step_with_the_chunked_loss_gives_the_plain_steps_gradients(compile):
    """LitLM's step: the chunked loss from model.hidden against the plain loss on model(x), z-loss and the final
    soft-cap on, eager and compiled (aot_eager); and while a callback needs the model eager, the plain path runs
    (the model's forward, where hooks see the logits)."""
    cfg = ModelConfig(vocab_size=97, dim=32, n_layers=2, n_heads=2, max_seq_len=16, final_logit_softcap=30.0)
    x = torch.randint(97, (3, 16), generator=torch.Generator().manual_seed(1))
    y = torch.roll(x, -1, dims=1)
    grads = {}
    for impl in ("plain", "chunked"):
        torch.manual_seed(0)
        module = LitLM(cfg, z_loss=1e-3, compile=compile, compile_backend="aot_eager", loss_impl=impl,
                       loss_chunk_rows=10)
        loss, ce = module.compiled_step_loss(x, y) if compile else module.step_loss(x, y)
        loss.backward()
        grads[impl] = (loss.detach(), {n: p.grad for n, p in module.model.named_parameters()})
    torch.testing.assert_close(grads["chunked"][0], grads["plain"][0], rtol=1e-5, atol=1e-6)
    for name, g in grads["plain"][1].items():
        torch.testing.assert_close(grads["chunked"][1][name], g, rtol=1e-4, atol=1e-6,
                                   msg=lambda m, n=name: f"{n}: {m}")
    module.run_eagerly("probe", True)
    seen = []
    module.model.register_forward_hook(lambda *a: seen.append(a[2].shape))
    module.step_loss(x, y)
    assert seen == [(3, 16, 97)]  # the model's forward ran and returned the logits


def test_loss_impl_auto_is_chunked_on_a_gpu_and_plain_elsewhere(monkeypatch):
    module = LitLM(ModelConfig(vocab_size=16, dim=16, n_layers=1, n_heads=2))
    assert module.hparams.loss_impl == "auto" and module.loss_impl == "plain"
    monkeypatch.setattr(LitLM, "device", property(lambda self: torch.device("cuda", 0)))
    assert module.loss_impl == "chunked"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("impl", ["chunked", "liger"])
def test_gpu_bf16_parity_with_the_plain_loss(impl):
    """On a GPU, bf16 autocast, the 125M shape's vocabulary: chunked (and Liger's where it imports) against plain."""
    if impl == "liger":
        pytest.importorskip("liger_kernel.transformers.functional")
    g = torch.Generator("cuda").manual_seed(0)
    h = torch.randn(4096, 768, device="cuda", generator=g)
    w = 0.02 * torch.randn(32000, 768, device="cuda", generator=g)
    y = torch.randint(32000, (4096,), device="cuda", generator=g)
    out = {}
    for name in ("plain", impl):
        hh, ww = h.clone().requires_grad_(), w.clone().requires_grad_()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss, _ = L.linear_cross_entropy(hh, ww, y, name, z_loss=1e-4, softcap=30.0 if name != "liger" else None)
        loss.backward()
        out[name] = (loss.detach(), hh.grad, ww.grad)
    torch.testing.assert_close(out[impl][0], out["plain"][0], rtol=2e-3, atol=2e-3)
    for a, b in zip(out["plain"][1:], out[impl][1:], strict=True):
        torch.testing.assert_close(b.float(), a.float(), rtol=2e-2, atol=2e-2 * a.abs().max().item())


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_compiled_training_step_with_the_chunked_loss():
    """LitLM's compiled step (Inductor) on a GPU under bf16 autocast: the chunked loss, the default there, against the
    plain one: loss and gradients agree to bf16 rounding."""
    cfg = ModelConfig(vocab_size=4096, dim=128, n_layers=2, n_heads=4, max_seq_len=128)
    x = torch.randint(4096, (8, 128), device="cuda", generator=torch.Generator("cuda").manual_seed(1))
    y = torch.roll(x, -1, dims=1)
    out = {}
    for impl in ("plain", "auto"):
        torch.manual_seed(0)
        module = LitLM(cfg, compile=True, loss_impl=impl).cuda()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss, _ = module.compiled_step_loss(x, y)
        loss.backward()
        out[module.loss_impl] = (loss.detach(), [p.grad.float() for p in module.model.parameters()])
    torch.testing.assert_close(out["chunked"][0], out["plain"][0], rtol=2e-3, atol=2e-3)
    for a, b in zip(out["plain"][1], out["chunked"][1], strict=True):
        torch.testing.assert_close(b, a, rtol=5e-2, atol=5e-2 * a.abs().max().item())
