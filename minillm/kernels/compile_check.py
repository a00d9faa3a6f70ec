"""Compile the RMSNorm kernels for a GPU without one (sm_90 by default) and report what the hardware would run.

Each kernel is compiled as the runtime launches it: bf16 tensors, fp32 rstd and dW partials, and Triton's
16-byte alignment hint (``tt.divisibility=16``) on every pointer and on every integer divisible by 16 (row
strides, hidden, M), the specialization Triton applies at launch to torch's 256-byte aligned allocations. For
each (kernel, hidden) it reads from ptxas (the one Triton ships) the registers per thread and the spill bytes,
and from the PTX the widths of the global loads and stores: 128-bit accesses are ``ld.global.v4.b32`` /
``st.global.v4.b32`` (8 bf16), or 16-byte ``cp.async`` copies into shared memory when a loop is pipelined.

    python -m minillm.kernels.compile_check            # table for sm_90 (needs no GPU, TRITON_INTERPRET unset)
    python -m minillm.kernels.compile_check --json     # the same as JSON (tests/test_kernels.py reads it)
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import tempfile

if os.environ.get("TRITON_INTERPRET") == "1":
    raise SystemExit("compile_check needs the real Triton compiler: unset TRITON_INTERPRET")

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from minillm.kernels import rmsnorm as K  # noqa: E402

POINTERS = {"X": "bf16", "R": "bf16", "Y": "bf16", "H": "bf16", "DY": "bf16", "DH": "bf16", "DX": "bf16", "W": "bf16",
            "RSTD": "fp32", "PARTIAL": "fp32"}
FLOATS = ("eps", "offset")
M = 16384  # rows (divisible by 16, as in the benchmark)
HIDDEN = (1024, 2048, 4096, 8192, 16384, 32768)  # one-pass and wide-row kernels (the default test)
ALL_HIDDEN = (256, 512, *HIDDEN)
H100_SMS = 132  # for the wide-row dW grid
TWO_KERNEL_ALSO = (16384,)  # widths also compiled on the two-kernel path: the fallback of MAX_ONEPASS_HIDDEN = 8192


def cases(hidden=HIDDEN) -> list[tuple]:
    """(name, kernel, hidden, constexprs, num_warps, integer arguments) as the launchers in rmsnorm.py pass them;
    the fused residual add's variants (RESIDUAL) are named add_*."""
    out = []
    for n in hidden:
        ints = dict(stride_x=n, stride_r=n, stride_y=n, stride_dy=n, stride_dh=n, stride_dx=n, N=n, M=M)
        block, looped = K._row_block(n)
        for residual in (False, True):
            add = "add_" * residual
            fwd = K._fwd_loop_kernel if looped else K._fwd_kernel
            out.append((f"{add}fwd" + "_loop" * looped, fwd, n, dict(BLOCK=block, RESIDUAL=residual),
                        K._num_warps(block), ints))
            if n <= K.MAX_ONEPASS_HIDDEN:
                rows, warps, _per_sm, stages = K.bwd_config(n, residual)
                out.append((f"{add}bwd", K._bwd_kernel, n, dict(BLOCK=triton.next_power_of_2(n), ROWS=rows,
                                                                 STAGES=stages, RESIDUAL=residual), warps, ints))
            if n > K.MAX_ONEPASS_HIDDEN or n in TWO_KERNEL_ALSO:
                dx = K._bwd_dx_loop_kernel if looped else K._bwd_dx_kernel
                out.append((f"{add}bwd_dx" + "_loop" * looped, dx, n, dict(BLOCK=block, RESIDUAL=residual),
                            K._num_warps(block), ints))
        if n > K.MAX_ONEPASS_HIDDEN or n in TWO_KERNEL_ALSO:
            rows_per_program = K._dw_grid(M, n, H100_SMS)[1]
            out.append(("bwd_dw", K._bwd_dw_kernel, n, dict(BLOCK_ROWS=K.DW_BLOCK_ROWS, BLOCK_COLS=K.DW_BLOCK_COLS),
                        4, {**ints, "rows_per_program": rows_per_program}))
    return out


def _signature(fn, constexprs: dict, ints: dict) -> tuple[dict, dict]:
    sig, attrs = {}, {}
    for i, name in enumerate(fn.arg_names):
        if name in constexprs:
            sig[name] = "constexpr"
        elif name in POINTERS:
            sig[name], attrs[(i,)] = "*" + POINTERS[name], [["tt.divisibility", 16]]
        elif name in FLOATS:
            sig[name] = "fp32"
        else:
            sig[name] = "i32"
            if ints[name] % 16 == 0:
                attrs[(i,)] = [["tt.divisibility", 16]]
    return sig, attrs


def _ptxas() -> str:
    from triton import knobs
    from triton.backends.nvidia import compiler as nv

    try:
        return nv.get_ptxas(90).path  # Triton >= 3.5 picks its ptxas by architecture
    except (AttributeError, TypeError):
        return knobs.nvidia.ptxas.path


def _registers_and_spills(ptx: str, arch: str) -> tuple[int, int]:
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "k.ptx")
        with open(src, "w") as f:
            f.write(ptx)
        log = subprocess.run([_ptxas(), "-v", f"--gpu-name={arch}", src, "-o", os.path.join(tmp, "k.o")],
                             capture_output=True, text=True, check=True).stderr
    regs = int(re.search(r"Used (\d+) registers", log).group(1))
    spills = sum(int(b) for b in re.findall(r"(\d+) bytes spill (?:stores|loads)", log))
    return regs, spills


def _accesses(ptx: str) -> dict[str, int]:
    """Counts of global memory instructions by kind and width (in bits)."""
    out: dict[str, int] = {}
    for op, vec, ty in re.findall(r"\b(ld|st)\.global(?:\.\w+)*?(?:\.v(\d))?\.[bfus](\d+)\b", ptx):
        key = f"{op}{int(vec or 1) * int(ty)}"
        out[key] = out.get(key, 0) + 1
    for nbytes in re.findall(r"cp\.async\.\w+\.shared\.global\s*\[[^]]*\],\s*\[[^]]*\],\s*(0x[0-9a-f]+|\d+)", ptx):
        key = f"cp.async{int(nbytes, 0) * 8}"
        out[key] = out.get(key, 0) + 1
    return out


def _loads_before_reduction(ptx: str) -> bool | None:
    """Whether every global load comes before the first warp shuffle (the start of a row reduction) in the PTX,
    so that no load waits for the sum; None for a kernel without a shuffle."""
    first_shuffle = ptx.find("shfl.sync")
    return None if first_shuffle < 0 else ptx.rfind("ld.global") < first_shuffle


def check(capability: int = 90, hidden=HIDDEN, llama: bool = True) -> list[dict]:
    """Compile every case for sm_<capability>; one dict per (kernel, hidden)."""
    arch = f"sm_{capability}a" if capability >= 90 else f"sm_{capability}"
    rows = []
    for name, fn, n, constexprs, warps, ints in cases(hidden):
        constexprs = {"LLAMA": llama, **constexprs}
        sig, attrs = _signature(fn, constexprs, ints)
        src = ASTSource(fn=fn, signature=sig, constexprs=constexprs, attrs=attrs)
        k = triton.compile(src, target=GPUTarget("cuda", capability, 32), options={"num_warps": warps})
        ptx = k.asm["ptx"]
        regs, spills = _registers_and_spills(ptx, arch)
        acc = _accesses(ptx)
        rows.append(dict(kernel=name, hidden=n, num_warps=warps, **{k: v for k, v in constexprs.items()},
                         registers=regs, spill_bytes=spills, local_memory=".local" in ptx, accesses=acc,
                         shared_bytes=k.metadata.shared, triton=triton.__version__,
                         loads_before_reduction=_loads_before_reduction(ptx)))
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", action="store_true")
    p.add_argument("--all", action="store_true", help=f"hidden {ALL_HIDDEN} instead of {HIDDEN}")
    p.add_argument("--capability", type=int, default=90)
    a = p.parse_args()
    rows = check(a.capability, ALL_HIDDEN if a.all else HIDDEN)
    if a.json:
        print(json.dumps(rows))
        return
    print(f"Triton {triton.__version__}, sm_{a.capability}, bf16, 16-byte alignment hints")
    for r in rows:
        cfg = ", ".join(f"{k}={r[k]}" for k in ("BLOCK", "ROWS", "STAGES", "BLOCK_ROWS", "BLOCK_COLS") if k in r)
        print(f"{r['kernel']:>11} hidden {r['hidden']:>5}: {r['registers']:>3} registers, {r['spill_bytes']} spill "
              f"bytes, {r['num_warps']:>2} warps, {cfg}; accesses {r['accesses']}")


if __name__ == "__main__":
    main()
