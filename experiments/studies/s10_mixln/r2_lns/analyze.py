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
(minillm.analysis.stats.paired_t).

Added after the data (experiments.common.precondition; the rules above are unchanged):
  C1 could not fail: LNS multiplies every deep sublayer's input by 1/sqrt(l), so the deep blocks add less to the
     stream by construction; it is restated as an OBSERVATION.
  precondition  stream_growth ((r_L / r_1) / sqrt(L)) and idle_deep_layers (S10's layer-drop ratio) on the Pre-LN
     runs, per depth and seed. C2 and C3 read PREMISE_ABSENT where either is absent (their rule's word in the text).
  Holm  C2 (LNS / Pre deep drop per seed, log scale) and C3 (Pre - LNS per seed) at both depths, one-sided p
     Holm-adjusted across the four parts.
  The gradient tilt of a cell is the geometric mean of its seeds' tilts, as S10 round 1 gives it (it was their
     arithmetic mean: 0.75 for Mix-LN at L = 12, where round 1 says 0.74 for the same runs).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path

from experiments.common import precondition as pre
from experiments.common.machine import runs_machine
from experiments.common.plots import pyplot, save
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
            tilts = [math.log(s10.tilt(s10.grad_profile(r))) for r in rs if s10.grad_profile(r)]
            cells[v, L] = {"runs": len(rs), "val": mean(final_loss(r) for r in rs),
                           "depth_growth": mean(depth_growth(r) for r in rs),
                           "tilt": math.exp(mean(tilts)) if tilts else None,
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

    gates = preconditions(runs)
    holm = holm_parts(runs)
    c1_word = graded(sum(v is not None and v >= GROWTH for v in c1.values()))
    c2_word = graded(sum(v is not None and v >= MATTER for v in c2.values()))
    c3_word = graded(sum(v >= GAP for v in c3.values()))
    verdicts = {
        "C1": (pre.OBSERVATION, f"could not fail (LNS scales every deep sublayer's input by 1/sqrt(l)); by its rule: "
               f"{c1_word}; Pre / LNS depth growth " + fmt(c1)),
        "C2": (pre.gate(c2_word, *gates), f"by its rule: {c2_word}; LNS / Pre deep-layer drop " + fmt(c2) +
               f"; {pre.count(holm, 'C2')}"),
        "C3": (pre.gate(c3_word, *gates), f"by its rule: {c3_word}; Pre - LNS val loss " + fmt_ci(c3, "pre") +
               "; Mix - LNS " + fmt_ci(vs_mix, "mix") + f"; {pre.count(holm, 'C3')}"),
    }
    vt = table(["hypothesis", "verdict", "numbers"], [[k, v, why] for k, (v, why) in verdicts.items()])
    lines = "\n\n".join(pre.line(g) for g in gates)
    md = (f"Machine: {runs_machine(runs)}. "
          f"{len(runs)} runs.\n\n{tab}\n\n{lines}\n\n### Verdicts (rules fixed before the runs; "
          f"C1's restatement, the precondition gate and Holm's adjustment added after the data)\n\n{vt}\n"
          f"\nBeside C3's rule, not part of it: each difference's 95% paired t interval over the seeds "
          f"(minillm.analysis.stats), in brackets.\n")
    return {"cells": [{"variant": v, "n_layers": L, **c} for (v, L), c in cells.items()], "verdicts": verdicts,
            "precondition": gates, "holm": holm, "machine": runs_machine(runs)}, md


def preconditions(runs: Runs) -> list[dict]:
    """stream_growth and idle_deep_layers on this round's Pre-LN runs, per depth and seed."""
    plain = Runs(r for r in runs if variant(r) == "pre")
    growth = {f"L={L}": [depth_growth(r) / math.sqrt(L) for r in sorted(plain.where(n_layers=L),
                                                                         key=lambda r: r["seed"]) if depth_growth(r)]
              for L in s10.DEPTHS}
    return [pre.measure("stream_growth", growth, "layer/<i>/resid_rms at the last logged step, this round's runs"),
            s10.idleness(Runs(r for r in plain if r.get("layer_drop")), "layer_drop.json: this round's checkpoints")]


def holm_parts(runs: Runs) -> dict:
    """C2 and C3 at both depths as thresholds on per-seed values, Holm-adjusted together."""
    named = {}
    for L in s10.DEPTHS:
        by = {v: {r["seed"]: r for r in runs if variant(r) == v and r["n_layers"] == L} for v in ("pre", "pre+LNS")}
        seeds = sorted(set(by["pre"]) & set(by["pre+LNS"]))
        drops = [s10.second_half(by["pre+LNS"][s]["layer_drop"]["drop"]) / s10.second_half(
            by["pre"][s]["layer_drop"]["drop"]) for s in seeds if by["pre"][s].get("layer_drop")
            and by["pre+LNS"][s].get("layer_drop")]
        named[f"C2 L={L}"] = (drops, MATTER, "at least", True)
        named[f"C3 L={L}"] = ([final_loss(by["pre"][s]) - final_loss(by["pre+LNS"][s]) for s in seeds], GAP,
                              "at least")
    return pre.parts(named)


COLORS = {"pre": "tab:blue", "mix": "tab:green", "pre+LNS": "tab:red"}


def plot(runs: Runs, out: Path) -> None:
    """lns.png, per depth (rows): the residual RMS after each block at the end, the loss increase when each block is
    dropped (log scale), and each seed's val loss; every seed drawn, per variant."""
    plt = pyplot()
    depths = sorted({r["n_layers"] for r in runs})
    fig, axes = plt.subplots(len(depths), 3, figsize=(12, 3.2 * len(depths)))
    for row, L in zip(axes, depths, strict=True):
        for v in VARIANTS:
            rs = sorted((r for r in runs if variant(r) == v and r["n_layers"] == L), key=lambda r: r["seed"])
            for k, r in enumerate(rs):
                label = v if k == 0 else None
                last = {resid_layer(m): pts[-1][1] for m, pts in r["curves"].items() if resid_layer(m) is not None}
                if last:
                    row[0].plot([i + 1 for i in sorted(last)], [last[i] for i in sorted(last)], color=COLORS[v],
                                lw=0.9, label=label)
                if r.get("layer_drop"):
                    drops = [max(d, 1e-5) for d in r["layer_drop"]["drop"]]
                    row[1].semilogy(range(1, len(drops) + 1), drops, color=COLORS[v], lw=0.9, label=label)
                row[2].scatter([VARIANTS.index(v)], [final_loss(r)], color=COLORS[v], s=18)
        row[0].set(title=f"L = {L}: residual RMS after block i, end", xlabel="block", yscale="log")
        row[1].set(title="loss increase when block i is dropped (floor 1e-5)", xlabel="block")
        row[2].set(title="final val loss per seed", xticks=range(len(VARIANTS)), xticklabels=VARIANTS)
        row[0].legend(fontsize=8)
    save(fig, out / "lns.png")


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
    plot(runs, out)


if __name__ == "__main__":
    main()
