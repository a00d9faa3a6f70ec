"""S10: Mix-LN (Li et al. 2024) against Pre-LN and Post-LN: where do the gradients go, which layers matter, and
does mixing help? Pre-registered: the rules below were committed before any run of this study (the README names
the commit).

    python train.py -m experiment=s10_mixln hydra/launcher=joblib hydra.launcher.n_jobs=2   # 12 runs, ~15 min
    # the sweep folder(s) below, or no argument: the committed runs
    python -m experiments.studies.s10_mixln.r1_mixln.analyze logs/s10_mixln/multiruns/<t>

Setting (configs/experiment/s10_mixln.yaml): RMSNorm, dim 64, lr 1e-3, 400 steps, warmup 40, no clipping;
placement {pre, post, mix} x L {12, 24} x seeds {0, 1}. Mix-LN: Post-LN in the first floor(0.25 L) layers, Pre-LN
after (the paper's alpha = 0.25).

Measures, per run:
  gradient tilt    mean gradient norm of the first quarter of the blocks / that of the last quarter
                   (layer/<i>/grad_norm, mean over the logged steps of the last 100)
  layer drop       the val loss (DROP_WINDOWS windows) with block i replaced by the identity, minus the intact
                   model's: how much block i matters (computed here from each run's last checkpoint; the
                   committed layer_drop.json keeps the numbers)
Hypotheses (Li et al. 2024, "Mix-LN: Unleashing the Power of Deeper Layers by Combining Pre-LN and Post-LN"):
  M1 Pre-LN's deep layers get smaller gradients (tilt >= TILT) and Post-LN's early layers do (tilt <= 1 / TILT),
     while Mix-LN's |log tilt| is the smallest of the three. Confirmed: all three parts at both depths (seed
     means); partly: some; not at this scale: none.
  M2 Mix-LN's deep layers matter more than Pre-LN's: mean layer-drop loss over the second half of the blocks,
     Mix / Pre >= MATTER (seed means). Confirmed: at both depths; partly: one; not at this scale: neither.
  M3 Mix-LN trains better than Pre-LN: mean val loss lower by >= GAP. Confirmed: at both depths; partly: one;
     not at this scale: neither. (Against Post-LN: reported.)
Beside M3's rule, not part of it: the 95% paired t interval of each difference over the seeds
(minillm.analysis.stats.paired_t), and verdicts.json (.md, .png): minillm.analysis.compare's verdicts, each placement
against Pre-LN
per depth, margin GAP (what `minillm-report <sweep> --compare placement --baseline pre` gives).

Added after the data (the precondition gate, experiments.common.precondition; the rules above are unchanged):
  precondition  idle_deep_layers on the Pre-LN runs: per seed, the mean layer-drop loss of the second half of the
                blocks over that of the first half. Where it is absent, M2 and M3 (which ask whether Mix-LN gives
                idle deep layers work) read PREMISE_ABSENT instead of their rule's word (given in their text).
  Holm          each part of M1, M2, M3 as "the seed mean of the per-seed values is <direction> <threshold>" (M1's
                tilts and M2's ratios on the log scale; M1's Mix-LN part as min(|log pre|, |log post|) - |log mix|
                >= 0 per seed), the one-sided p Holm-adjusted across the round's parts: M1 is graded by the parts
                that hold after the adjustment ("k of n parts, Holm-adjusted"), the seed-mean count beside it.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import nn

from experiments.common import precondition as pre
from experiments.common.machine import runs_machine
from experiments.common.plots import pyplot, save
from experiments.common.study import Runs, by_seed, ci, load, mean, paired, parse_args, table, write, write_verdicts
from minillm.analysis.compare import compare
from minillm.analysis.rules import REGISTERED_BEFORE
from minillm.metrics import VAL_LOSS, parse_metric
from minillm.outcome import final_loss

HERE = Path(__file__).parent
# --- fixed before the runs ---------------------------------------------------------------------------------
PLACEMENTS = ("pre", "post", "mix")
DEPTHS = (12, 24)
TILT = 2.0
MATTER = 1.5
GAP = 0.02  # nats
LAST = 100  # steps: the window of the gradient-norm means
DROP_WINDOWS = 512


def grad_layer(key: str) -> int | None:
    parsed = parse_metric(key)
    return int(parsed[1]) if parsed and parsed[0] == "layer" and parsed[2] == "grad_norm" else None


def grad_profile(run: dict) -> list[float]:
    """Mean gradient norm per block over the logged steps of the last LAST steps."""
    out = {}
    for key, pts in run["curves"].items():
        i = grad_layer(key)
        if i is not None:
            end = pts[-1][0]
            out[i] = statistics.fmean(v for s, v in pts if s > end - LAST and math.isfinite(v))
    return [out[i] for i in sorted(out)]


def tilt(profile: Sequence[float]) -> float:
    q = max(1, len(profile) // 4)
    return statistics.fmean(profile[:q]) / statistics.fmean(profile[-q:])


class Skip(nn.Module):
    """A block replaced by the identity (same call signature as minillm.model.Block)."""

    def forward(self, x: torch.Tensor, *args: object, **kwargs: object) -> torch.Tensor:
        return x


def layer_drop(ckpt: Path) -> dict:
    """Val loss of the checkpoint's model intact and with each block skipped in turn."""
    from experiments.common import reference
    from minillm.tools.hub import load_checkpoint

    model, _, meta = load_checkpoint(ckpt)
    cfg = reference.compose()
    _, val, _ = reference.tokens(cfg)
    seq_len = meta["model"]["max_seq_len"]
    base = reference.evaluate(model, val, seq_len, val_windows=DROP_WINDOWS)
    drops = []
    for i, block in enumerate(list(model.layers)):
        model.layers[i] = Skip()
        drops.append(reference.evaluate(model, val, seq_len, val_windows=DROP_WINDOWS) - base)
        model.layers[i] = block
    return {"loss": base, "drop": drops}


def key(run: dict) -> str:
    return f"{run['placement']}_L{run['n_layers']}_seed{run['seed']}"


def second_half(drops: Sequence[float]) -> float:
    return statistics.fmean(drops[len(drops) // 2:])


def idle_ratio(drops: Sequence[float]) -> float:
    """The precondition's quantity: mean layer-drop loss of the second half of the blocks / of the first half."""
    return second_half(drops) / statistics.fmean(drops[:len(drops) // 2])


def idleness(runs: Runs, source: str, depths: Sequence[int] = DEPTHS, where: dict | None = None) -> dict:
    """The idle_deep_layers block of the Pre-LN runs (with layer_drop) at each depth, per seed."""
    cells = {f"L={L}": [idle_ratio(r["layer_drop"]["drop"]) for r in sorted(runs.where(placement="pre", n_layers=L,
                                                                                          **(where or {})),
                                                                              key=lambda r: r["seed"])
                        if r.get("layer_drop")] for L in depths}
    return pre.measure("idle_deep_layers", cells, source)


def analyze(runs: Runs) -> tuple[dict, str]:
    cells = {}
    for p in PLACEMENTS:
        for L in DEPTHS:
            rs = sorted(runs.where(placement=p, n_layers=L), key=lambda r: r["seed"])
            tilts = [tilt(grad_profile(r)) for r in rs if grad_profile(r)]
            drops = [second_half(r["layer_drop"]["drop"]) for r in rs if r.get("layer_drop")]
            cells[p, L] = {"runs": len(rs), "val": mean(final_loss(r) for r in rs),
                           "tilt": math.exp(statistics.fmean(map(math.log, tilts))) if tilts else None,
                           "tilt_per_seed": tilts, "deep_drop": mean(drops), "deep_drop_per_seed": drops,
                           "diverged": sum(bool(r.get("diverged")) for r in rs)}
    rows = [[p, L, c["val"], c["tilt"], " / ".join(f"{t:.2f}" for t in c["tilt_per_seed"]), c["deep_drop"],
             " / ".join(f"{d:.3f}" for d in c["deep_drop_per_seed"]), c["diverged"]] for (p, L), c in cells.items()]
    tab = table(["placement", "L", "val loss", "gradient tilt (first / last quarter, geo. mean)", "per seed",
                 "layer-drop loss, second half (mean)", "per seed", "diverged"], rows)

    def graded(hits: int, total: int) -> str:
        return "confirmed" if hits == total else "partly" if hits else "not at this scale"

    gate = idleness(Runs(r for r in runs if r.get("layer_drop")), "layer_drop.json: this round's last checkpoints")
    holm = holm_parts(runs)
    m1 = []
    for L in DEPTHS:
        t = {p: cells[p, L]["tilt"] for p in PLACEMENTS}
        if None in t.values():
            continue
        m1 += [t["pre"] >= TILT, t["post"] <= 1 / TILT,
               abs(math.log(t["mix"])) < min(abs(math.log(t["pre"])), abs(math.log(t["post"])))]
    m2 = {L: cells["mix", L]["deep_drop"] / cells["pre", L]["deep_drop"]
          if cells["pre", L]["deep_drop"] and cells["mix", L]["deep_drop"] is not None else None for L in DEPTHS}
    m3 = {L: cells["pre", L]["val"] - cells["mix", L]["val"] for L in DEPTHS}
    m3_post = {L: cells["post", L]["val"] - cells["mix", L]["val"] for L in DEPTHS}
    m3_ci = {(p, L): ci(paired(*(by_seed(runs.where(placement=q, n_layers=L), final_loss) for q in (p, "mix"))))
             for p in ("pre", "post") for L in DEPTHS}

    def fmt(d: dict, p: str) -> str:
        return ", ".join(f"L={L}: {v:+.3f} {m3_ci[p, L]}" if v is not None else f"L={L}: -" for L, v in d.items())

    m1_holm = sum(r["significant"] for k, r in holm["parts"].items() if k.startswith("M1"))
    m2_word = graded(sum(v is not None and v >= MATTER for v in m2.values()), len(DEPTHS))
    m3_word = graded(sum(v >= GAP for v in m3.values()), len(DEPTHS))
    verdicts = {
        "M1": (graded(m1_holm, 3 * len(DEPTHS)), f"{m1_holm} of {3 * len(DEPTHS)} parts, Holm-adjusted ({sum(m1)} "
               f"of {3 * len(DEPTHS)} on the seed means); tilt " + "; ".join(
                   f"L={L}: " + ", ".join(f"{p} {cells[p, L]['tilt']:.2f}" for p in PLACEMENTS if cells[p, L]["tilt"])
                   for L in DEPTHS)),
        "M2": (pre.gate(m2_word, gate), f"by its rule: {m2_word}; Mix / Pre deep-layer drop " + ", ".join(
            f"L={L}: {v:.2f}" if v is not None else f"L={L}: -" for L, v in m2.items()) + f"; {pre.count(holm, 'M2')}"),
        "M3": (pre.gate(m3_word, gate), f"by its rule: {m3_word}; Pre - Mix val loss " + fmt(m3, "pre") +
               "; Post - Mix " + fmt(m3_post, "post") + f"; {pre.count(holm, 'M3')}"),
    }
    vt = table(["hypothesis", "verdict", "numbers"], [[k, v, why] for k, (v, why) in verdicts.items()])
    md = (f"Machine: {runs_machine(runs)}. {len(runs)} runs.\n\n{tab}\n\n{pre.line(gate)}\n\n### Verdicts (rules fixed "
          f"before the runs; the precondition gate and Holm's adjustment added after the data)\n\n{vt}\n\n"
          f"Beside M3's rule, not part of it: each difference's 95% paired t interval over the seeds "
          f"(minillm.analysis.stats), in brackets. verdicts.md: minillm.analysis.compare's verdicts.\n")
    return {"cells": [{"placement": p, "n_layers": L, **c} for (p, L), c in cells.items()], "verdicts": verdicts,
            "precondition": [gate], "holm": holm, "machine": runs_machine(runs)}, md


def holm_parts(runs: Runs) -> dict:
    """Every part of M1-M3 as a threshold on per-seed values (module docstring), Holm-adjusted together."""
    def per_seed(p: str, L: int, value) -> dict:
        return {r["seed"]: value(r) for r in runs.where(placement=p, n_layers=L)}

    def tilts(p: str, L: int) -> dict:
        return {s: v for s, v in per_seed(p, L, lambda r: tilt(grad_profile(r)) if grad_profile(r) else None).items()
                if v is not None}

    def drops(p: str, L: int) -> dict:
        return per_seed(p, L, lambda r: second_half(r["layer_drop"]["drop"]) if r.get("layer_drop") else None)

    named = {}
    for L in DEPTHS:
        t = {p: tilts(p, L) for p in PLACEMENTS}
        seeds = sorted(set.intersection(*(set(v) for v in t.values())))
        named[f"M1 pre L={L}"] = ([t["pre"][s] for s in seeds], TILT, "at least", True)
        named[f"M1 post L={L}"] = ([t["post"][s] for s in seeds], 1 / TILT, "at most", True)
        named[f"M1 mix L={L}"] = ([min(abs(math.log(t["pre"][s])), abs(math.log(t["post"][s])))
                                   - abs(math.log(t["mix"][s])) for s in seeds], 0.0, "at least")
        d = {p: drops(p, L) for p in ("pre", "mix")}
        both = sorted(s for s in d["pre"] if d["pre"][s] and d["mix"].get(s) is not None)
        named[f"M2 L={L}"] = ([d["mix"][s] / d["pre"][s] for s in both], MATTER, "at least", True)
        loss = {p: by_seed(runs.where(placement=p, n_layers=L), final_loss) for p in ("pre", "mix")}
        named[f"M3 L={L}"] = ([loss["pre"][s] - loss["mix"][s] for s in sorted(loss["pre"]) if s in loss["mix"]],
                              GAP, "at least")
    return pre.parts(named)


def plot(runs: Runs, out: Path) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(2, len(DEPTHS), figsize=(11, 7))
    for j, L in enumerate(DEPTHS):
        for i, p in enumerate(PLACEMENTS):
            for k, r in enumerate(sorted(runs.where(placement=p, n_layers=L), key=lambda r: r["seed"])):
                style = dict(color=f"C{i}", alpha=0.8, label=p if k == 0 else None)
                if grad_profile(r):
                    axes[0, j].plot(range(1, L + 1), grad_profile(r), **style)
                if r.get("layer_drop"):
                    axes[1, j].plot(range(1, L + 1), r["layer_drop"]["drop"], **style)
        axes[0, j].set(yscale="log", xlabel="block", ylabel="gradient norm (last 100 steps)", title=f"L={L}")
        axes[1, j].set(xlabel="block dropped", ylabel="val loss increase (nats)")
        axes[1, j].axhline(0, color="k", lw=0.5)
        axes[0, j].legend(fontsize=8)
    save(fig, out / "mixln.png")


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(__doc__, argv)
    out = args.out or HERE
    runs = load(HERE, args.sweeps, lambda k: k == VAL_LOSS or grad_layer(k) is not None, out)
    drop_file = out / "layer_drop.json"
    if args.sweeps:  # from the checkpoints, which are not committed
        drops = {key(r): layer_drop(Path(r["run_dir"]) / "checkpoints" / "last.ckpt") for r in runs}
        drop_file.write_text(json.dumps(drops, indent=1) + "\n")
    drops = json.loads((drop_file if drop_file.exists() else HERE / "layer_drop.json").read_text())
    for r in runs:
        r["layer_drop"] = drops.get(key(r))
    results, md = analyze(runs)
    write(out, results, md)
    write_verdicts(out, engine(runs))
    plot(runs, out)


def engine(runs: Runs) -> dict:
    """verdicts.json: minillm.analysis.compare, each placement against Pre-LN per depth, margin GAP."""
    return compare(runs, "placement", "pre", margin=GAP, **REGISTERED_BEFORE)


if __name__ == "__main__":
    main()
