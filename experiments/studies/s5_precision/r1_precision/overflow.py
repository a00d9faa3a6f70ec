"""S5, unit level: a norm that reduces in fp16 overflows once some |x| > ~256 (x^2 > 65504): the mean square
becomes inf and x / inf silently turns the whole row into zeros. minillm's norms, which reduce in fp32 whatever
the input dtype, match the exact computation within fp16 rounding.

    # seconds; writes overflow.json and overflow.md here
    python -m experiments.studies.s5_precision.r1_precision.overflow
    python -m experiments.studies.s5_precision.r1_precision.overflow --out DIR   # into DIR
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

import torch

from experiments.common.machine import machine
from experiments.common.study import table
from minillm.norms import build_norm

HERE = Path(__file__).parent
SCALES = (1.0, 30.0, 50.0, 60.0, 70.0, 100.0, 1000.0)
FP16_EPS = 2.0**-10  # fp16's relative rounding step
C = 256


def naive_rmsnorm(x):
    """LLaMA's RMSNorm formula computed in the input dtype (no upcast), as a textbook writes it."""
    return x / torch.sqrt(torch.mean(x**2, dim=-1, keepdim=True) + 1e-5)


def naive_layernorm(x):
    mu = x.mean(-1, keepdim=True)
    return (x - mu) / torch.sqrt(((x - mu) ** 2).mean(-1, keepdim=True) + 1e-5)


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=HERE, help="folder for overflow.json / .md (default: %(default)s)")
    out = p.parse_args(argv).out
    out.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(0)
    base = torch.randn(8, 16, C, generator=g)
    rows, results = [], []
    for name, naive in (("rmsnorm", naive_rmsnorm), ("layernorm", naive_layernorm)):
        norm = build_norm(name, C)
        for scale in SCALES:
            x16 = (base * scale).half()  # every value representable in fp16 (|x| < 65504)
            ref = naive(x16.double()).float()  # exact reference on the same fp16 inputs
            out_naive, out_minillm = naive(x16).float(), norm(x16).float()
            rel = {k: ((v - ref).abs().max() / ref.abs().max()).item() if v.isfinite().all() else float("inf")
                   for k, v in (("naive", out_naive), ("minillm", out_minillm))}
            row_err = ((out_naive - ref).abs().amax(-1) / ref.abs().amax(-1)).nan_to_num(float("inf"))  # (8, 16)
            destroyed = (row_err > 0.5).float().mean().item()  # rows turned into zeros (or inf / NaN)
            overflowing = ((x16.float() ** 2).amax(-1) > 65504).float().mean().item()  # rows with some x^2 > max
            results.append({"norm": name, "scale": scale, "max_abs_x": x16.abs().max().item(),
                            "rows_with_overflowing_square": overflowing, "naive_fp16_rows_destroyed": destroyed,
                            "naive_fp16_rel_err": rel["naive"], "minillm_fp16_rel_err": rel["minillm"]})
            rows.append([name, scale, x16.abs().max().item(), f"{overflowing:.0%}", f"{destroyed:.0%}",
                         rel["naive"], rel["minillm"], rel["minillm"] <= 2 * FP16_EPS])
    md = (f"Machine: {machine()}. Input (8, 16, {C}) standard normal times the scale, cast to fp16; reference: "
          "the same formula in float64 on those fp16 values.\n\n"
          + table(["norm", "scale", "max abs x", "rows with some x^2 > 65504", "naive fp16: rows destroyed",
                   "naive fp16: max rel. error",
                   "minillm (fp32 reduction): max rel. error", "minillm within 2 fp16 ulps"], rows, digits=4) + "\n")
    (out / "overflow.json").write_text(json.dumps({"machine": machine(), "rows": results}, indent=1) + "\n")
    (out / "overflow.md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
