# ruff: noqa: E501  (markdown table rows)
"""Print the markdown tables of the S6 README (and S0's parameter and cost table) from bench.json and quality.json.

    python -m experiments.studies.s6_cost.r1_cost.report
"""

from __future__ import annotations

import json
from pathlib import Path

from experiments.common.layout import STUDIES

OUT = Path(__file__).parent


def main() -> None:
    b = json.loads((OUT / "bench.json").read_text())
    ops = b["op_level"]
    print(f"machine: {b['machine']}, torch {b['torch']}, threads {b['threads']}, {b['seconds']} s\n")
    print(
        "| shape (tokens x hidden) | dtype | op | fwd ms | fwd+bwd ms | fwd / layernorm | fwd+bwd / layernorm |"
    )
    print("|---|---|---|---|---|---|---|")
    for r in ops:
        print(
            f"| {r['tokens']}x{r['hidden']} | {r['dtype']} | {r['op']} | {r['fwd_ms']:.3f} | {r['fwd_bwd_ms']:.3f} "
            f"| {r['fwd_vs_layernorm']:.2f} | {r['fwd_bwd_vs_layernorm']:.2f} |"
        )
    e = b["end_to_end"]
    print("\n| norm | train step ms (median) | tokens/s |")
    print("|---|---|---|")
    for k in e["step_ms"]:
        print(f"| {k} | {e['step_ms'][k]:.1f} | {e['tokens_per_s'][k]:.0f} |")
    print(f"\nrmsnorm speedup end to end: {e['rmsnorm_speedup_pct']:+.1f}%")
    q = OUT / "quality.json"
    if q.exists():
        q = json.loads(q.read_text())
        print("\n| norm | " + " | ".join(f"seed {s}" for s in q["seeds"]) + " | mean |")
        print("|---|" + "---|" * (len(q["seeds"]) + 1))
        for n, m in q["mean"].items():
            vals = [r["final_val_loss"] for r in q["runs"] if r["norm"] == n]
            print(f"| {n} | " + " | ".join(f"{v:.4f}" for v in vals) + f" | {m:.4f} |")
        print(
            f"\ndiff rms - ln {q['diff_rms_minus_ln']:+.4f}, paired {[round(d, 4) for d in q['paired_diffs']]}, "
            f"seed range {q['seed_range']:.4f}, parity {q['parity']}"
        )
    seeds = STUDIES / "s0_textbook_claims" / "r1_claims" / "results.json"
    if seeds.exists() and "table" in json.loads(seeds.read_text()):
        t = json.loads(seeds.read_text())["table"]
        print(
            "\n| norm | parameters (H = 128) | formula | float buffers | fwd ms 2048x128 | fwd+bwd ms 2048x128 "
            "| fwd / LN at 4096x1024 | fwd+bwd / LN at 4096x1024 | norm params in the default model |"
        )
        print("|---|---|---|---|---|---|---|---|---|")
        key = {"BatchNorm": "batchnorm", "LayerNorm": "layernorm", "RMSNorm": "rmsnorm"}
        for r in t["rows"]:
            print(
                f"| {r['norm']} | {r['params']} | {r['params_formula']} | {r['float_buffers']} | {r['fwd_ms_2048x128']:.3f} "
                f"| {r['fwd_bwd_ms_2048x128']:.3f} | {r['fwd_vs_ln_4096x1024']:.2f} | {r['fwd_bwd_vs_ln_4096x1024']:.2f} "
                f"| {t['norm_params_in_default_model'][key[r['norm']]]} |"
            )


if __name__ == "__main__":
    main()
