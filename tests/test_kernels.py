"""Fused Triton RMSNorm against a float64 reference: forward, dx and dW, odd shapes, strides, dtypes, ops.

Without a GPU the kernels run on Triton's CPU interpreter (conftest.py sets TRITON_INTERPRET=1), so the
default shapes are tiny; bigger shapes and bf16 on real hardware are under the `gpu` marker.
"""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from minillm.kernels import rmsnorm as K
from minillm.norms import NORMS, RMSNorm, build_norm


def _can_run() -> bool:
    try:
        K.require_fused()
    except RuntimeError:
        return False
    return True


CAN_RUN = _can_run()
DEV = "cuda" if CAN_RUN and not K._interpreting() else "cpu"
kernel = pytest.mark.skipif(not CAN_RUN, reason="fused kernel cannot run here (see require_fused())")


def gpu(fn):
    """Needs a real CUDA GPU: deselected by default, skipped without CUDA."""
    return pytest.mark.gpu(pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")(fn))


DTYPES = [torch.float32, torch.bfloat16, torch.float16]
# (rtol, atol as a fraction of max(|expected|, 1)) against the float64 reference
TOL = {torch.float32: (1e-5, 1e-5), torch.bfloat16: (2e-2, 1e-2), torch.float16: (3e-3, 2e-3)}


def _randn(*shape, dtype=torch.float32, scale=1.0, device=DEV) -> torch.Tensor:
    return (torch.randn(*shape, dtype=torch.float32, device=device) * scale).to(dtype)


def _weight(n: int, offset: float, dtype=torch.float32, device=DEV) -> torch.Tensor:
    """A random gain around 1 (stored as w - offset), never all ones."""
    return (1.0 - offset + 0.5 * torch.randn(n, device=device)).to(dtype)


def _fwd_bwd(fn, x, w, dy):
    """(y, dx, dw) of fn(x, w) with upstream gradient dy; x and w are fresh leaves."""
    x = x.detach().clone().requires_grad_()
    w = w.detach().clone().requires_grad_()
    y = fn(x, w)
    y.backward(dy)
    return y.detach(), x.grad, w.grad


def _check(x, w, dy, eps=1e-5, offset=0.0, cast="fp32", dtype=None):
    """Fused forward, dx and dW against the float64 reference, with the tolerance of x's dtype."""
    dtype = dtype or x.dtype
    got = _fwd_bwd(lambda a, b: K.fused_rms_norm(a, b, eps, offset, cast), x, w, dy)
    ref = _fwd_bwd(lambda a, b: K.reference_rms_norm(a, b, eps, offset, cast), x.double(), w.double(),
                   dy.double())
    rtol, atol = TOL[dtype]
    for name, g, r in zip(("y", "dx", "dw"), got, ref, strict=True):
        scale = max(r.abs().max().item(), 1.0)
        torch.testing.assert_close(g.double(), r, rtol=rtol, atol=atol * scale,
                                   msg=lambda m, name=name: f"{name}: {m}")
    y, dx, dw = got
    assert y.dtype == x.dtype and dx.dtype == x.dtype and dw.dtype == w.dtype
    assert y.shape == x.shape and dx.shape == x.shape and dw.shape == w.shape
    return got


# ---------------------------------------------------------------------------------------------------------
# correctness


@kernel
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cast", K.CASTS)
@pytest.mark.parametrize("offset", [0.0, 1.0])
def test_forward_dx_dw_match_float64_reference(dtype, cast, offset):
    torch.manual_seed(0)
    x = _randn(3, 7, 123, dtype=dtype, scale=2.0)  # odd rows, hidden not a power of two
    w = _weight(123, offset)
    dy = _randn(3, 7, 123, dtype=dtype)
    _check(x, w, dy, offset=offset, cast=cast)


@kernel
@pytest.mark.parametrize("shape", [(1, 64), (4, 1), (2, 3, 5, 33), (37, 200), (2, 16)],
                         ids=["one-row", "hidden-1", "4d", "rows-37-hidden-200", "pow2"])
def test_odd_shapes(shape):
    torch.manual_seed(1)
    _check(_randn(*shape), _weight(shape[-1], 0.0), _randn(*shape), cast="llama")


@kernel
@pytest.mark.parametrize("dtype", DTYPES)
def test_5x123x123(dtype):  # an odd 3-D shape: ~5 s per dtype under the interpreter, so it runs in CI
    torch.manual_seed(2)
    _check(_randn(5, 123, 123, dtype=dtype), _weight(123, 0.0), _randn(5, 123, 123, dtype=dtype))


@kernel
def test_widest_one_pass_backward():
    """Hidden 16384, the widest row of the one-pass backward (32 warps, one program per SM; the GPU benchmark's
    tune also checks it against the two-kernel path), against the float64 reference."""
    torch.manual_seed(9)
    assert K.MAX_ONEPASS_HIDDEN == 16384
    _check(_randn(3, 16384), _weight(16384, 0.0), _randn(3, 16384))


@kernel
def test_eps_is_used_in_fp32():
    torch.manual_seed(3)
    x = _randn(4, 32, scale=1e-3)  # mean(x^2) ~ 1e-6, comparable to eps
    _check(x, _weight(32, 0.0), _randn(4, 32), eps=1e-5)
    _check(x, _weight(32, 0.0), _randn(4, 32), eps=1e-2)


@kernel
def test_rstd_is_saved_in_fp32_per_row():
    torch.manual_seed(4)
    x = _randn(2, 3, 40, dtype=torch.bfloat16)
    y, rstd = torch.ops.minillm.rms_norm_fwd(x, _weight(40, 0.0), 1e-5, 0.0, "fp32")
    assert rstd.shape == (2, 3) and rstd.dtype == torch.float32
    expected = torch.rsqrt(x.double().pow(2).mean(-1) + 1e-5)
    torch.testing.assert_close(rstd.double(), expected, rtol=1e-5, atol=0)


@kernel
@pytest.mark.parametrize("layout", ["permuted", "transposed-last-dim", "sliced-rows"])
def test_non_contiguous_x_and_dy(layout):
    torch.manual_seed(5)
    if layout == "permuted":  # last dim contiguous, rows not evenly strided -> copied
        base, view = _randn(7, 3, 40), lambda t: t.permute(1, 0, 2)
    elif layout == "transposed-last-dim":  # last dim stride 7 -> copied
        base, view = _randn(3, 40, 7), lambda t: t.transpose(1, 2)
    else:  # rows of stride 64, read in place through the row stride
        base, view = _randn(3, 7, 64), lambda t: t[..., :40]
    w = _weight(40, 1.0)
    dy = view(_randn(*base.shape))
    assert not view(base).is_contiguous() and not dy.is_contiguous()
    dy_before = dy.clone()

    def grads(fn, b, w, dy):
        b = b.detach().clone().requires_grad_()
        w = w.detach().clone().requires_grad_()
        y = fn(view(b), w)
        y.backward(dy)
        return y.detach(), b.grad, w.grad

    got = grads(lambda a, b: K.fused_rms_norm(a, b, 1e-5, 1.0, "fp32"), base, w, dy)
    ref = grads(lambda a, b: K.reference_rms_norm(a, b, 1e-5, 1.0, "fp32"), base.double(), w.double(),
                dy.double())
    for g, r in zip(got, ref, strict=True):
        torch.testing.assert_close(g.double(), r, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(dy, dy_before, rtol=0, atol=0)  # dx is written out of place


@kernel
def test_sum_backward_expanded_dy():
    """y.sum().backward() hands the op a zero-stride dy."""
    torch.manual_seed(6)
    x = _randn(5, 24).requires_grad_()
    w = _weight(24, 0.0).requires_grad_()
    K.fused_rms_norm(x, w, 1e-5).sum().backward()
    xr, wr = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    K.reference_rms_norm(xr, wr, 1e-5).sum().backward()
    torch.testing.assert_close(x.grad.double(), xr.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(w.grad.double(), wr.grad, rtol=1e-5, atol=1e-5)


@kernel
@pytest.mark.parametrize("w_dtype", [torch.float32, torch.bfloat16])
def test_bf16_x_with_fp32_or_bf16_weight(w_dtype):
    torch.manual_seed(7)
    x, dy = _randn(6, 48, dtype=torch.bfloat16), _randn(6, 48, dtype=torch.bfloat16)
    y, dx, dw = _check(x, _weight(48, 0.0, dtype=w_dtype), dy, cast="llama", dtype=torch.bfloat16)
    assert y.dtype == torch.bfloat16 and dw.dtype == w_dtype


@kernel
@pytest.mark.parametrize("cast", K.CASTS)
def test_looped_kernels_for_wide_rows(monkeypatch, cast):
    """Rows wider than MAX_FUSED_HIDDEN take the chunked two-pass kernels (shrunk here to stay fast)."""
    monkeypatch.setattr(K, "MAX_FUSED_HIDDEN", 64)
    monkeypatch.setattr(K, "MAX_ONEPASS_HIDDEN", 64)
    monkeypatch.setattr(K, "LOOP_BLOCK", 32)
    assert K._row_block(100) == (32, True)
    torch.manual_seed(8)
    for dtype in (torch.float32, torch.bfloat16):
        _check(_randn(3, 5, 100, dtype=dtype), _weight(100, 1.0), _randn(3, 5, 100, dtype=dtype),
               offset=1.0, cast=cast)


@kernel
@pytest.mark.slow
def test_looped_kernels_at_the_real_limit():
    n = K.MAX_FUSED_HIDDEN + 1000
    assert K._row_block(n)[1]
    torch.manual_seed(9)
    _check(_randn(3, n), _weight(n, 0.0), _randn(3, n))


@kernel
def test_dw_with_many_groups(monkeypatch):
    """Wide-row path (dx kernel + dW kernel), with small dW tiles forcing several row groups, so the fp32
    partials are really summed across programs."""
    monkeypatch.setattr(K, "MAX_ONEPASS_HIDDEN", 32)
    monkeypatch.setattr(K, "DW_BLOCK_ROWS", 4)
    monkeypatch.setattr(K, "DW_BLOCK_COLS", 16)
    assert K._dw_grid(21, 40, K._num_sms(torch.device(DEV)))[0] > 1
    torch.manual_seed(10)
    _check(_randn(21, 40, dtype=torch.bfloat16), _weight(40, 0.0), _randn(21, 40, dtype=torch.bfloat16),
           cast="llama")


@kernel
def test_dw_partials_every_row_written():
    """Wide-row dW: groups with no rows must still write zeros: the buffer comes from torch.empty (trap 2)."""
    torch.manual_seed(11)
    x, dy = _randn(10, 40), _randn(10, 40)
    rstd = torch.rsqrt(x.pow(2).mean(-1) + 1e-5)  # (10,)
    partial = torch.full((5, 40), float("nan"), device=DEV)  # 5 groups of 32 rows: 4 have no rows
    K._launch_dw(dy, x, rstd, partial, rows_per_program=32, llama=False)
    assert not partial.isnan().any()
    assert partial[1:].abs().max() == 0
    torch.testing.assert_close(partial.sum(0), (dy * x * rstd[:, None]).sum(0), rtol=1e-5, atol=1e-5)


@kernel
@pytest.mark.parametrize("config", [(1, 4, 1, 1), (4, 4, 2, 2), (8, 2, 4, 1), (2, 4, 1, 3), (4, 1, 3, 1)],
                         ids=["1-row", "4-rows-2-stages", "8-rows-4-per-sm", "3-stages", "4-rows-1-warp"])
def test_one_pass_backward_configs(monkeypatch, config):
    """The one-pass backward with other tunables: rows per iteration that do not divide M, several
    programs per SM, pipelined loops (STAGES > 1)."""
    monkeypatch.setattr(K, "BWD_CONFIGS", ((64, *config),))
    assert K.bwd_config(40) == config
    torch.manual_seed(16)
    for dtype in (torch.float32, torch.bfloat16):
        _check(_randn(37, 40, dtype=dtype), _weight(40, 1.0), _randn(37, 40, dtype=dtype), offset=1.0,
               cast="llama")


@kernel
def test_one_pass_partials_every_row_written():
    """More programs than row blocks: the idle ones write zero rows (trap 2), dx is still complete."""
    torch.manual_seed(17)
    x, dy, w = _randn(5, 24), _randn(5, 24), _weight(24, 0.0)
    rstd = torch.rsqrt(x.pow(2).mean(-1) + 1e-5)  # (5,)
    dx = torch.full_like(x, float("nan"))
    partial = torch.full((6, 24), float("nan"), device=DEV)  # 6 programs, 3 blocks of 2 rows
    K._launch_bwd(dy, x, w, rstd, dx, partial, 0.0, False, (2, 4, 1, 1))
    assert not partial.isnan().any() and not dx.isnan().any()
    assert partial[3:].abs().max() == 0
    torch.testing.assert_close(partial.sum(0), (dy * x * rstd[:, None]).sum(0), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("residual", [False, True], ids=["plain", "fused-add"])
def test_bwd_config_table(residual):
    """Each variant's table covers every row width up to MAX_ONEPASS_HIDDEN; each thread holds 4-32 elements of x
    and dy."""
    if not K.HAS_TRITON:
        pytest.skip("needs triton")
    table = K.ADD_BWD_CONFIGS if residual else K.BWD_CONFIGS
    blocks = [b for b, *_ in table]
    assert blocks == sorted(blocks) and blocks[-1] == K.MAX_ONEPASS_HIDDEN
    for n in (1, 100, 256, 257, 1000, 2048, 3000, 4096, 8192):
        block = max(16, 1 << (n - 1).bit_length())
        rows, warps, per_sm, stages = K.bwd_config(n, residual)
        if block >= 256:
            assert 4 <= rows * block / (32 * warps) <= 32, (n, rows, warps)
        assert 1 <= per_sm <= 4 and stages >= 1
    with pytest.raises(ValueError, match="no one-pass backward config"):
        K.bwd_config(K.MAX_ONEPASS_HIDDEN + 1, residual)


@kernel
def test_the_fused_adds_backward_runs_on_its_own_configs(monkeypatch):
    """The add's backward takes ADD_BWD_CONFIGS and the plain one BWD_CONFIGS: each variant's tuned config is the
    one launched (a config tuned on one variant must not silently move the other)."""
    launched = []
    original = K._launch_bwd
    monkeypatch.setattr(K, "_launch_bwd", lambda *a, **kw: launched.append((a[8], a[10] is not None)) or original(
        *a, **kw))
    monkeypatch.setattr(K, "BWD_CONFIGS", ((64, 1, 4, 1, 1),))
    monkeypatch.setattr(K, "ADD_BWD_CONFIGS", ((64, 4, 2, 2, 2),))
    torch.manual_seed(3)
    (x, dy, dh), w = (_randn(37, 40) for _ in range(3)), _weight(40, 0.0)
    K._bwd(dy, x, w, torch.rsqrt(x.pow(2).mean(-1) + 1e-5), 0.0, "fp32", K._direct)
    K._bwd(dy, x, w, torch.rsqrt(x.pow(2).mean(-1) + 1e-5), 0.0, "fp32", K._direct, dh=dh)
    assert launched == [((1, 4, 1, 1), False), ((4, 2, 2, 2), True)]


@kernel
def test_empty_batch():
    x = torch.empty(0, 16, device=DEV, requires_grad=True)
    w = _weight(16, 0.0).requires_grad_()
    y = K.fused_rms_norm(x, w, 1e-5)
    y.sum().backward()
    assert y.shape == (0, 16) and w.grad.abs().max() == 0


@kernel
def test_bad_arguments_are_rejected():
    x = _randn(2, 8)
    with pytest.raises(ValueError, match="cast='bf16' is invalid; allowed: fp32, llama"):
        K.fused_rms_norm(x, _weight(8, 0.0), 1e-5, cast="bf16")
    with pytest.raises(ValueError, match="does not match the last dim"):
        K.fused_rms_norm(x, _weight(9, 0.0), 1e-5)
    with pytest.raises(ValueError, match="cast="):
        K.reference_rms_norm(x, _weight(8, 0.0), 1e-5, cast="x")


@kernel
@pytest.mark.parametrize("cast", K.CASTS)
def test_eager_path_and_custom_op_agree(monkeypatch, cast):
    """Eager calls take the autograd.Function (no dispatcher); torch.compile takes the custom ops: same
    kernels, bit-identical outputs and gradients."""
    torch.manual_seed(18)
    x, w, dy = _randn(3, 5, 40, dtype=torch.bfloat16), _weight(40, 1.0), _randn(3, 5, 40, dtype=torch.bfloat16)
    fn = lambda a, b: K.fused_rms_norm(a, b, 1e-5, 1.0, cast)  # noqa: E731
    xe, we = x.clone().requires_grad_(), w.clone().requires_grad_()
    ye = fn(xe, we)
    assert type(ye.grad_fn).__name__ == "_FusedRMSNormFunctionBackward"
    ye.backward(dy)
    monkeypatch.setattr(K, "_eager_ok", lambda *t: False)
    xo, wo = x.clone().requires_grad_(), w.clone().requires_grad_()
    yo = fn(xo, wo)
    assert "FusedRMSNormFunction" not in type(yo.grad_fn).__name__
    yo.backward(dy)
    for a, b in ((ye, yo), (xe.grad, xo.grad), (we.grad, wo.grad)):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    monkeypatch.undo()
    with torch.no_grad():  # no autograd at all: the forward kernel alone
        torch.testing.assert_close(fn(x, w), ye.detach(), rtol=0, atol=0)


# ---------------------------------------------------------------------------------------------------------
# the norm module: same state_dict as rmsnorm, same outputs


@kernel
@pytest.mark.parametrize("cast", K.CASTS)
@pytest.mark.parametrize("zero_centered", [False, True])
def test_state_dict_interchange_with_rmsnorm(cast, zero_centered):
    torch.manual_seed(12)
    eager = build_norm("rmsnorm", 48, 1e-5, cast=cast, zero_centered=zero_centered).to(DEV)
    with torch.no_grad():
        eager.weight.normal_(0.0 if zero_centered else 1.0, 0.5)
    fused = build_norm("fused_rmsnorm", 48, 1e-5, cast=cast, zero_centered=zero_centered).to(DEV)
    assert isinstance(fused, NORMS["fused_rmsnorm"]) and isinstance(fused, RMSNorm)
    assert fused.state_dict().keys() == eager.state_dict().keys() == {"weight"}
    fused.load_state_dict(eager.state_dict())

    x = _randn(2, 5, 48, dtype=torch.bfloat16, scale=3.0)
    dy = _randn(2, 5, 48, dtype=torch.bfloat16)
    outs = []
    for norm in (eager, fused):
        norm.zero_grad()
        xi = x.clone().requires_grad_()
        y = norm(xi)
        y.backward(dy)
        outs.append((y.detach().float(), xi.grad.float(), norm.weight.grad.clone()))
    for e, f in zip(*outs, strict=True):  # eager llama-mode dW is reduced in bf16: compare at bf16 scale
        torch.testing.assert_close(f, e, rtol=2e-2, atol=2e-2 * max(e.abs().max().item(), 1.0))

    back = RMSNorm(48, 1e-5, cast=cast, zero_centered=zero_centered).to(DEV)
    back.load_state_dict(fused.state_dict())
    torch.testing.assert_close(back.weight, eager.weight, rtol=0, atol=0)
    torch.testing.assert_close(back(x), eager(x), rtol=0, atol=0)


@kernel
def test_module_rejects_eps_outside():
    with pytest.raises(ValueError, match="eps_mode='inside'"):
        build_norm("fused_rmsnorm", 16, eps_mode="outside")


# ---------------------------------------------------------------------------------------------------------
# no silent fallback


def test_require_fused_without_triton(monkeypatch):
    monkeypatch.setattr(K, "HAS_TRITON", False)
    with pytest.raises(RuntimeError, match="pip install triton"):
        K.require_fused()
    with pytest.raises(RuntimeError, match="pip install triton"):
        build_norm("fused_rmsnorm", 16)


def test_require_fused_without_cuda_or_interpreter(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    if not K.HAS_TRITON:
        pytest.skip("triton not installed: covered by test_require_fused_without_triton")
    for build in (K.require_fused, lambda: build_norm("fused_rmsnorm", 16)):
        with pytest.raises(RuntimeError, match="set TRITON_INTERPRET=1 .* or use norm=rmsnorm"):
            build()


def test_module_imports_without_triton(monkeypatch):
    """minillm.kernels.rmsnorm imports with triton missing; only require_fused() complains."""
    monkeypatch.setitem(sys.modules, "triton", None)  # makes `import triton` raise ImportError
    monkeypatch.setitem(sys.modules, "triton.language", None)
    monkeypatch.delitem(sys.modules, "minillm.kernels.rmsnorm_triton")  # imported again, without triton
    spec = importlib.util.spec_from_file_location("_rmsnorm_without_triton", K.__file__)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert not mod.HAS_TRITON
    x, w = torch.randn(2, 8), torch.randn(8)
    torch.testing.assert_close(mod.reference_rms_norm(x, w, 1e-5), K.reference_rms_norm(x, w, 1e-5))
    with pytest.raises(RuntimeError, match="pip install triton"):
        mod.fused_rms_norm(x, w, 1e-5)


def test_minillm_imports_without_triton():
    code = ("import sys; sys.modules['triton'] = None; sys.modules['triton.language'] = None\n"
            "import minillm, minillm.norms, minillm.kernels.rmsnorm as k\n"
            "assert not k.HAS_TRITON and 'triton' not in [m for m in sys.modules if sys.modules[m]]\n"
            "try:\n    minillm.build_norm('fused_rmsnorm', 8)\nexcept RuntimeError as e:\n"
            "    assert 'pip install triton' in str(e)\nelse:\n    raise AssertionError('no error')\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


@kernel
def test_interpreter_set_after_triton_was_imported(monkeypatch):
    """TRITON_INTERPRET=1 set after `import triton` leaves Triton's own helpers (tl.sum's) compiled for the
    GPU: a clear error, not an obscure one inside the first kernel."""
    if not K._interpreting():
        pytest.skip("the interpreter's check (on a GPU require_fused() returns before it)")
    monkeypatch.setattr(K, "_TRITON_INTERPRETED", False)
    with pytest.raises(RuntimeError, match="before anything imports triton"):
        K.require_fused()


@kernel
def test_cpu_tensors_need_the_interpreter(monkeypatch):
    monkeypatch.setattr(K, "_INTERPRETED", False)
    with pytest.raises(ValueError, match="runs on CUDA tensors"):
        K.fused_rms_norm(torch.randn(2, 8), torch.randn(8), 1e-5)


ROOT = Path(__file__).resolve().parents[1]


def test_kernels_compile_for_sm90():
    """Compile the real kernels for sm_90 offline, with the 16-byte alignment hints of a real launch (no GPU
    needed; minillm/kernels/compile_check.py): no register spills, 128-bit global loads and stores of the bf16
    rows (ld.global.v4.b32, or 16-byte cp.async when the loop is pipelined). The interpreter is lenient: this
    also catches what only the GPU compiler rejects."""
    pytest.importorskip("triton.backends.nvidia.compiler")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    res = subprocess.run([sys.executable, "-m", "minillm.kernels.compile_check", "--json"], env=env, cwd=ROOT,
                         timeout=300, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-3000:]
    rows = json.loads(res.stdout.splitlines()[-1])
    assert {r["kernel"] for r in rows} >= {"fwd", "bwd", "bwd_dx", "bwd_dx_loop", "bwd_dw", "add_fwd", "add_bwd",
                                           "add_bwd_dx", "add_bwd_dx_loop"}
    for r in rows:
        kind = r["kernel"].removeprefix("add_")  # the fused residual add's variants are checked as the plain ones
        print(f"{r['kernel']:>7} hidden {r['hidden']:>5}: {r['registers']:>3} registers, {r['num_warps']:>2} warps, "
              f"accesses {r['accesses']}")
        where = f"{r['kernel']} at hidden {r['hidden']}: {r}"
        if not (kind == "bwd" and r["hidden"] == 16384):  # the one spill allowed: measured faster (BWD_CONFIGS)
            assert r["spill_bytes"] == 0 and not r["local_memory"], f"spills in {where}"
        acc = r["accesses"]
        assert acc.get("ld128", 0) + acc.get("cp.async128", 0) >= 1, f"no 128-bit loads in {where}"
        assert not any(k in acc for k in ("ld8", "ld16", "st8", "st16")), f"sub-word accesses in {where}"
        if r["kernel"] != "bwd_dw":  # dW writes one fp32 row per program, the others write bf16 rows
            assert acc.get("st128", 0) >= 1, f"no 128-bit stores in {where}"
        if kind == "fwd":  # the gain (and the residual) are loaded with the row, not after the sum of squares
            assert r["loads_before_reduction"], f"a load after the reduction in {where}"
        if kind == "bwd":
            per_sm = K.bwd_config(r["hidden"], r["kernel"].startswith("add_"))[2]
            assert r["registers"] * 32 * r["num_warps"] * per_sm <= 65536, f"{per_sm} per SM do not fit: {where}"


# ---------------------------------------------------------------------------------------------------------
# registration: opcheck and torch.compile


@kernel
def test_custom_ops_launch_through_wrap_triton_where_this_torch_allows():
    """On a GPU the custom ops are triton_ops whose kernels launch through wrap_triton; under the interpreter that
    launch is rehearsed where this torch wraps interpreted kernels (2.13 does, 2.11 does not: there the opaque
    custom ops call the kernels directly, and the skip says so)."""
    if K._interpreting() and not K._wraps_interpreted_kernels():
        assert K._op_launch is K._direct
        pytest.skip(f"torch {torch.__version__} cannot wrap interpreted kernels: the custom ops call them directly; "
                    "the wrap_triton launch runs only on a GPU")
    assert K._op_launch is K._traced and K._OP_LAUNCH_TRACED


@kernel
@pytest.mark.parametrize("cast", K.CASTS)
def test_opcheck(cast):
    torch.manual_seed(13)
    x, w = _randn(2, 3, 40, dtype=torch.bfloat16), _weight(40, 1.0)
    torch.library.opcheck(torch.ops.minillm.rms_norm_fwd, (x, w, 1e-5, 1.0, cast))
    _, rstd = torch.ops.minillm.rms_norm_fwd(x, w, 1e-5, 1.0, cast)
    torch.library.opcheck(torch.ops.minillm.rms_norm_bwd, (torch.randn_like(x), x, w, rstd, 1.0, cast))


def _compiled_matches_eager(backend: str, dynamic: bool | None = None) -> None:
    torch.manual_seed(14)
    norm = build_norm("fused_rmsnorm", 32, 1e-5, cast="llama").to(DEV)
    lin = torch.nn.Linear(32, 32).to(DEV)
    f = lambda x: lin(norm(x)).square().mean()  # noqa: E731
    x = _randn(2, 3, 32)
    grads = []
    for fn in (f, torch.compile(f, backend=backend, fullgraph=True, dynamic=dynamic)):
        norm.zero_grad()
        xi = x.clone().requires_grad_()
        fn(xi).backward()
        grads.append((xi.grad, norm.weight.grad.clone()))
    for e, c in zip(*grads, strict=True):
        torch.testing.assert_close(c, e, rtol=1e-5, atol=1e-6)


@kernel
def test_compile_fullgraph_aot_eager():
    """No graph break: the ops and their autograd trace with fake tensors."""
    torch._dynamo.reset()
    _compiled_matches_eager("aot_eager")


@kernel
@pytest.mark.slow
def test_compile_fullgraph_inductor():
    torch._dynamo.reset()
    _compiled_matches_eager("inductor")


@pytest.mark.slow
def test_benchmark_smoke(tmp_path):
    """The kernel benchmark's --smoke runs end to end on the CPU (kernels, tune, train) into a chosen folder; a second
    run merges by key instead of overwriting."""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    run = lambda *a: subprocess.run([sys.executable, "-m", "experiments.benchmarks.kernels.bench", "--smoke",  # noqa: E731
                                     "--no-compile", "--out", str(tmp_path), *a], check=True, timeout=900, env=env,
                                    cwd=ROOT)
    run()
    run("--mode", "tune")
    run("--mode", "kernels", "--providers", "fused", "--hidden", "32", "--use-tuned")
    assert {p.suffix for p in tmp_path.glob("cpu-interpreter-smoke.*")} >= {".json", ".md", ".png"}
    report = json.loads((tmp_path / "cpu-interpreter-smoke.json").read_text())
    assert len(report["kernels"]) == 8 and len(report["train_step"]) == 6 and report["tune"]
    assert {r["provider"] for r in report["add_kernels"]} >= {"fused_add", "add+fused", "add+eager"}
    assert all(r.get("fwdbwd_ms") for r in report["add_kernels"])
    assert {(r["norm"], r["precision"]) for r in report["train_step"]} == {
        (n, p) for n in ("rmsnorm", "fused_rmsnorm", "layernorm") for p in ("bf16-mixed", "bf16-true")}
    assert all(r.get("fwd_ms") and r.get("bwd_ms") and r.get("fwdbwd_ms") for r in report["kernels"])
    assert all(len(r["window_ms"]) == 4 and min(r["window_ms"]) <= r["step_ms"] <= max(r["window_ms"])
               for r in report["train_step"])  # windows synchronized at their ends, the median reported
    one_pass = [r for r in report["tune"] if r["config"] != "two-kernel"]  # each compared with the two-kernel path
    assert one_pass and all(r["dx_vs_two_kernel"] < 0.01 and r["dw_vs_two_kernel"] < 0.01 for r in one_pass)
    assert any(r["current"] for r in report["tune"]) and any(r["add_current"] for r in report["tune"])
    text = (tmp_path / "cpu-interpreter-smoke.md").read_text()
    assert "| fwd matches eager" in text and "Best per hidden (add)" in text
    rows = [r for section in ("kernels", "add_kernels", "tune", "train_step") for r in report[section]]
    assert all(r["run"]["kernel_code"] and r["run"]["command"].startswith("python -m") for r in rows)
    assert all(len(r["fwd_repeats"]) == 3 for r in report["kernels"] + report["add_kernels"])  # --repeats 3
    tuned = [r for r in report["kernels"] if r["run"]["kernel_code"].endswith("+tuned")]  # the third run's rows
    assert tuned and all(r["provider"] == "fused" and r["hidden"] == 32 for r in tuned)
    assert "| R3 |" in text and "+tuned" in text  # three runs, each named in the report


def test_the_tune_picks_each_variants_best_and_use_tuned_launches_it(monkeypatch):
    """Each backward variant takes its own fastest config from the tune rows of this kernel code (not the
    two-kernel path, not rows of other code or without the agreement check), in its own table only."""
    from experiments.benchmarks.kernels import tune

    def row(config, plain, add, code="c0de", agreed=True):
        return dict(config=config, M=32768, hidden=4096, bwd_ms=plain, add_bwd_ms=add, run={"id": "r", "kernel_code":
                    code}, **({"dx_vs_two_kernel": 1e-3, "dw_vs_two_kernel": 1e-3} if agreed else {}))

    rows = [row("(1, 8, 2, 1)", 1.0, 2.0), row("(1, 8, 2, 2)", 1.2, 1.5), row("two-kernel", 0.5, 0.5, agreed=False),
            row("(2, 8, 2, 1)", 0.1, 0.1, code="other"), row("(4, 16, 1, 1)", 0.1, 0.1, agreed=False)]
    monkeypatch.setattr(K, "BWD_CONFIGS", K.BWD_CONFIGS)  # restored after the test
    monkeypatch.setattr(K, "ADD_BWD_CONFIGS", K.ADD_BWD_CONFIGS)
    before = K.bwd_config(2048), K.bwd_config(2048, True)
    used = tune.use_tuned({"tune": rows}, "c0de")
    assert K.bwd_config(4096) == (1, 8, 2, 1) and K.bwd_config(4096, True) == (1, 8, 2, 2)
    assert (K.bwd_config(2048), K.bwd_config(2048, True)) == before
    assert [4096, 1, 8, 2, 1] in used["bwd_configs"] and [4096, 1, 8, 2, 2] in used["add_bwd_configs"]


def test_tune_candidates_keep_rows_in_flight_and_fit_an_sm():
    from experiments.benchmarks.kernels.tune import tune_candidates

    for n in (1024, 2048, 4096, 8192):
        cands = tune_candidates(n)
        assert any(rows > 1 for rows, *_ in cands), n  # more than one row in flight per program
        assert {stages for *_, stages in cands} == {1, 2}
        assert all(8 <= per_sm * warps <= 64 for _, warps, per_sm, _ in cands)
    assert K.bwd_config(4096) in tune_candidates(4096) and K.bwd_config(8192, True) in tune_candidates(8192)


def test_benchmark_gate_counts_bf16_steps_across_binade_edges():
    """The forward gate's distance counts the representable bf16 values between two outputs: one step between
    neighbours, of either sign and across a binade edge, where a ulp-of-the-reference count would say 3 for 2."""
    from experiments.benchmarks.kernels.bench import bf16_order

    bits = torch.arange(0, 0x7F80, dtype=torch.int32)  # every finite non-negative bf16, in increasing order
    values = bits.to(torch.int16).view(torch.bfloat16)
    assert torch.equal(bf16_order(values), bits) and torch.equal(bf16_order(-values[1:]), -bits[1:])
    edge = bf16_order(torch.tensor([2 - 2**-7, 2 + 2**-6], dtype=torch.bfloat16))
    assert (edge[1] - edge[0]).item() == 2


@pytest.mark.slow  # long (end to end); `-m slow` runs it
def test_benchmarks_import_without_hydra_datasets_wandb():
    """The GPU image has no hydra, omegaconf, datasets or wandb: the benchmark scripts import without them."""
    code = ("import sys, importlib.util\n"
            "for m in ('datasets', 'hydra', 'omegaconf', 'wandb'):\n    sys.modules[m] = None\n"
            "for path in sys.argv[1:]:\n"
            "    spec = importlib.util.spec_from_file_location(path.replace('/', '_')[:-3], path)\n"
            "    spec.loader.exec_module(importlib.util.module_from_spec(spec))\n"
            "assert not [m for m in ('datasets', 'hydra', 'omegaconf', 'wandb') if sys.modules.get(m)]\n")
    scripts = [f"experiments/benchmarks/{s}.py" for s in ("kernels/bench", "kernels/report", "throughput/bench",
                                                          "gpu/merge", "gpu/preset", "gpu/summary")]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    res = subprocess.run([sys.executable, "-c", code, *scripts], cwd=ROOT, env=env, timeout=300,
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-3000:]


# ---------------------------------------------------------------------------------------------------------
# real GPU: bigger shapes, bf16, the triton_op path (run with -m gpu on a CUDA machine)


@gpu
@pytest.mark.parametrize("shape", [(4, 1024, 4096), (8192, 1000), (2048, 8192), (512, 16384), (16, 20000)],
                         ids=["4k", "odd", "8k-pipelined", "16k-one-pass", "looped"])
@pytest.mark.parametrize("cast", K.CASTS)
def test_gpu_bf16_large(shape, cast):
    torch.manual_seed(15)
    x = _randn(*shape, dtype=torch.bfloat16, scale=2.0, device="cuda")
    dy = _randn(*shape, dtype=torch.bfloat16, device="cuda")
    _check(x, _weight(shape[-1], 1.0, device="cuda"), dy, offset=1.0, cast=cast)


@gpu
def test_gpu_16k_two_kernel_fallback(monkeypatch):
    """Hidden 16384 on the two-kernel path (dx, then dW), where MAX_ONEPASS_HIDDEN is lowered to 8192 on a GPU
    that runs the spilling one-pass kernel slower."""
    monkeypatch.setattr(K, "MAX_ONEPASS_HIDDEN", 8192)
    torch.manual_seed(16)
    x = _randn(512, 16384, dtype=torch.bfloat16, scale=2.0, device="cuda")
    dy = _randn(512, 16384, dtype=torch.bfloat16, device="cuda")
    _check(x, _weight(16384, 1.0, device="cuda"), dy, offset=1.0, cast="llama")


@gpu
def test_gpu_opcheck_and_inductor():
    assert not K._interpreting()
    x, w = _randn(64, 256, dtype=torch.bfloat16, device="cuda"), _weight(256, 0.0, device="cuda")
    torch.library.opcheck(torch.ops.minillm.rms_norm_fwd, (x, w, 1e-5, 0.0, "llama"))
    _, rstd = torch.ops.minillm.rms_norm_fwd(x, w, 1e-5, 0.0, "llama")
    torch.library.opcheck(torch.ops.minillm.rms_norm_bwd, (torch.randn_like(x), x, w, rstd, 0.0, "llama"))
    for dynamic in (False, True):
        torch._dynamo.reset()
        _compiled_matches_eager("inductor", dynamic=dynamic)


@gpu
@pytest.mark.parametrize("n", [1024, 2048, 4096, 8192])
def test_gpu_one_pass_backward_has_no_spills_as_launched(n):
    """The one-pass backward as really launched on this GPU and Triton: registers fit bwd_config's programs per
    SM, no spills (the offline sm_90 check uses the CPU machine's Triton, this one the GPU's)."""
    x = _randn(4096, n, dtype=torch.bfloat16, device="cuda")
    w = _weight(n, 0.0, dtype=torch.bfloat16, device="cuda")
    rstd = torch.rsqrt(x.float().pow(2).mean(-1) + 1e-5)
    config = K.bwd_config(n)
    partial = torch.empty(config[2] * K._num_sms(x.device), n, device="cuda")
    compiled = K._launch_bwd(torch.randn_like(x), x, w, rstd, torch.empty_like(x), partial, 0.0, True, config)
    print(f"hidden {n}: {compiled.n_regs} registers, {compiled.n_spills} spills, config {config}")
    assert compiled.n_spills == 0
    assert compiled.n_regs * 32 * config[1] * config[2] <= 65536


@gpu
@pytest.mark.slow
def test_gpu_64bit_row_offsets():
    """More than 2^31 elements: the last rows are only right with 64-bit row offsets."""
    n = 4096
    m = (2**31) // n + 8
    x = torch.randn(m, n, dtype=torch.bfloat16, device="cuda")
    w = _weight(n, 0.0, device="cuda")
    y = K.fused_rms_norm(x, w, 1e-5)
    torch.testing.assert_close(y[-8:].float(), K.reference_rms_norm(x[-8:], w, 1e-5).float(),
                               rtol=2e-2, atol=2e-2)
