"""S10 round 2: LayerNorm Scaling (Sun et al. 2025, "The Curse of Depth in Large Language Models") as the other
remedy for Pre-LN's idle deep layers, beside S10's Pre-LN and Mix-LN runs. Pre-registered: the rules below were
committed before any run of this round (the README names the commit). Results go to this folder.

    python train.py -m experiment=s10_mixln placement=pre model.layernorm_scaling=true 'tags=[lns]' \\
        hydra/launcher=joblib hydra.launcher.n_jobs=2 hydra.sweep.dir=logs/s10_mixln/multiruns/lns   # 4 runs
    python -m experiments.studies.s10_mixln.r2_lns.analyze logs/s10_mixln/multiruns/<S10's sweep> \\
        logs/s10_mixln/multiruns/lns

Same setting as S10 (RMSNorm, dim 64, lr 1e-3, 400 steps, L in {12, 24}, seeds {0, 1}); model.layernorm_scaling
multiplies the input norm's output of layer l by 1/sqrt(l). Measures as S10 (gradient tilt, layer-drop loss of
the second half of the blocks from the last checkpoint) plus the residual stream's depth growth r_L / r_1 at the
end (layer/<i>/resid_rms, as S5's growth test).

Hypotheses (Sun et al. 2025: in Pre-LN the output variance grows with depth, so deep layers act almost as the
identity; scaling each layer's norm output by 1/sqrt(l) curbs the growth, makes deep layers contribute, and
lowers the loss):
  C1 LNS curbs the growth: Pre-LN's depth growth >= GROWTH x LNS's (seed means). Confirmed: at both depths;
     partly: one; not at this scale: neither.
  C2 LNS's deep layers matter more: layer-drop loss of the second half, LNS / Pre-LN >= MATTER (seed means).
     Graded as C1.
  C3 LNS trains better: Pre-LN's val loss - LNS's >= GAP. Graded as C1. (Against Mix-LN: reported.)
Beside C3's rule, not part of it: the 95% paired t interval of each difference over the seeds
(minillm.verdicts.paired_t).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from experiments.common.machine import machine
from experiments.common.study import Runs, by_seed, ci, load, mean, paired, parse_args, table, write
from experiments.studies.s10_mixln.r1_mixln import analyze as s10
from minillm.metrics import VAL_LOSS, parse_metric
from minillm.outcome import final_loss

HERE = Path(__file__).parent
# --- fixed before the runs ---------------------------------------------------------------------------------
GROWTH = 2.0
MATTER = s10.MATTER  # 1.5
GAP = s10.GAP  # 0.02 nats
VARIANTS = ("pre", "mix", "pre+LNS")


def variant(run: dict) -> str:
    return "pre+LNS" if "lns" in (run.get("tags") or []) else run["placement"]


def resid_layer(key: str) -> int | None:
    parsed = parse_metric(key)
    return int(parsed[1]) if parsed and parsed[0] == "layer" and parsed[2] == "resid_rms" else None


def depth_growth(run: dict) -> float | None:
    last = {resid_layer(k): pts[-1][1] for k, pts in run["curves"].items() if resid_layer(k) is not None and pts}
    return last[max(last)] / last[0] if last and last.get(0) else None


def analyze(runs: Runs) -> tuple[dict, str]:
    cells = {}
    for v in VARIANTS:
        for L in s10.DEPTHS:
            rs = [r for r in runs if variant(r) == v and r["n_layers"] == L]
            cells[v, L] = {"runs": len(rs), "val": mean(final_loss(r) for r in rs),
                           "depth_growth": mean(depth_growth(r) for r in rs),
                           "tilt": mean(s10.tilt(s10.grad_profile(r)) for r in rs if s10.grad_profile(r)),
                           "deep_drop": mean(s10.second_half(r["layer_drop"]["drop"]) for r in rs
                                             if r.get("layer_drop"))}
    rows = [[v, L, c["val"], c["depth_growth"], c["tilt"], c["deep_drop"], c["runs"]] for (v, L), c in cells.items()]
    tab = table(["variant", "L", "val loss", "depth growth r_L / r_1", "gradient tilt", "layer-drop loss, 2nd half",
                 "runs"], rows)

    def graded(hits: int) -> str:
        return "confirmed" if hits == len(s10.DEPTHS) else "partly" if hits else "not at this scale"

    def ratio(key: str, a: str, b: str, L: int) -> float | None:
        x, y = cells[a, L][key], cells[b, L][key]
        return x / y if x is not None and y else None

    c1 = {L: ratio("depth_growth", "pre", "pre+LNS", L) for L in s10.DEPTHS}
    c2 = {L: ratio("deep_drop", "pre+LNS", "pre", L) for L in s10.DEPTHS}
    c3 = {L: cells["pre", L]["val"] - cells["pre+LNS", L]["val"] for L in s10.DEPTHS}
    vs_mix = {L: cells["mix", L]["val"] - cells["pre+LNS", L]["val"] for L in s10.DEPTHS}
    c3_ci = {(v, L): ci(paired(*(by_seed((r for r in runs if variant(r) == w and r["n_layers"] == L), final_loss)
                                 for w in (v, "pre+LNS")))) for v in ("pre", "mix") for L in s10.DEPTHS}
    fmt = lambda d: ", ".join(f"L={L}: {v:.3f}" if v is not None else f"L={L}: -" for L, v in d.items())  # noqa: E731

    def fmt_ci(d: dict, v: str) -> str:
        return ", ".join(f"L={L}: {x:.3f} {c3_ci[v, L]}" if x is not None else f"L={L}: -" for L, x in d.items())

    verdicts = {
        "C1": (graded(sum(v is not None and v >= GROWTH for v in c1.values())), "Pre / LNS depth growth " + fmt(c1)),
        "C2": (graded(sum(v is not None and v >= MATTER for v in c2.values())), "LNS / Pre deep-layer drop " + fmt(c2)),
        "C3": (graded(sum(v >= GAP for v in c3.values())), "Pre - LNS val loss " + fmt_ci(c3, "pre") +
               "; Mix - LNS " + fmt_ci(vs_mix, "mix")),
    }
    vt = table(["hypothesis", "verdict", "numbers"], [[k, v, why] for k, (v, why) in verdicts.items()])
    md = (f"Machine: {machine()}. {len(runs)} runs.\n\n{tab}\n\n### Verdicts (rules fixed before the runs)\n\n{vt}\n"
          f"\nBeside C3's rule, not part of it: each difference's 95% paired t interval over the seeds "
          f"(minillm.verdicts), in brackets.\n")
    return {"cells": [{"variant": v, "n_layers": L, **c} for (v, L), c in cells.items()], "verdicts": verdicts,
            "machine": machine()}, md


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(__doc__, argv)
    out = args.out or HERE
    keep = (lambda k: k == VAL_LOSS or s10.grad_layer(k) is not None or resid_layer(k) is not None)
    runs = load(HERE, args.sweeps, keep, out)
    runs = Runs(r for r in runs if variant(r) in VARIANTS)  # S10's Post-LN runs are not compared here
    drop_file = out / "layer_drop.json"
    if args.sweeps:
        drops = {s10.key(r) + ("_lns" if variant(r) == "pre+LNS" else ""):
                 s10.layer_drop(Path(r["run_dir"]) / "checkpoints" / "last.ckpt") for r in runs}
        drop_file.write_text(json.dumps(drops, indent=1) + "\n")
    drops = json.loads((drop_file if drop_file.exists() else HERE / "layer_drop.json").read_text())
    for r in runs:
        r["layer_drop"] = drops.get(s10.key(r) + ("_lns" if variant(r) == "pre+LNS" else ""))
    results, md = analyze(runs)
    write(out, results, md)


if __name__ == "__main__":
    main()
