"""S10 round 4 (pre-registered): LayerNorm Scaling where its paper's setting holds. Rounds 2-3 ran LNS
with GPT-2's depth-scaled init, which Sun et al. (footnote 1) say removes its benefit, at ~1.8 tokens per
parameter and 2 seeds, with a Pre-LN baseline whose deep layers were not idle. This round: the plain init
(model.depth_scaled_init=false, every linear N(0, 0.02)), ~20 tokens per parameter, 5 seeds, Pre-LN vs LNS vs
Mix-LN, and the precondition gate fixed before the runs. The rules below are committed before any run; the data
commit cites this one.

Model: RMSNorm, dim 48, 12 layers, 4 heads, context 64, ~0.34M parameters (vocabulary 88); batch 16, lr 1e-3
(S10's), warmup 100 then cosine, STEPS = 6,700 steps = 6.9M tokens, 20 tokens per parameter. Character Shakespeare
holds ~1.0M training characters, so this is ~7 passes over the train split (disclosed: the val loss also measures
how each variant overfits).

    S="python train.py -m experiment=s10_mixln model.dim=48 model.n_layers=12 model.depth_scaled_init=false \\
       trainer.max_steps=6700 trainer.val_check_interval=500 scheduler.warmup_steps=100 seed=0,1,2,3,4 \\
       hydra/launcher=joblib hydra.launcher.n_jobs=2"
    $S placement=pre,mix 'tags=[plain]' hydra.sweep.dir=logs/s10_mixln/multiruns/budget_main        # 10 runs
    $S placement=pre model.layernorm_scaling=true 'tags=[lns,plain]' \\
       hydra.sweep.dir=logs/s10_mixln/multiruns/budget_lns                                            # 5 runs
    python -m experiments.studies.s10_mixln.r4_lns_budget.analyze logs/s10_mixln/multiruns/budget_*

Compute estimate (2-core CPU, two runs side by side): S10's dim-64, 12-layer runs trained at ~6,000 tokens/s per
process; at dim 48 about 7,000 is expected: 15 runs x 6.9M tokens, 8 pairs of ~16 min, ~2.2 h, plus the layer-drop
evaluation of 15 checkpoints (13 evaluations of 512 windows each, ~1 min a checkpoint): ~2.5 h in all.

Measures per run: the final val loss (minillm.outcome.final_loss); the layer drop from the last checkpoint (S10's:
the val loss on 512 windows with one block replaced by the identity, minus the intact model's; layer_drop.json);
the depth growth r_L / r_1 from layer/<i>/resid_rms at the last logged step.
Precondition (experiments.common.precondition, fixed before the runs): idle_deep_layers on the Pre-LN runs (deep /
early mean block drop <= 0.25), per seed: the gate of B1-B3; stream_growth on the Pre-LN runs ((r_L / r_1) /
sqrt(L) >= 1): reported beside it, not a gate (Sun et al. derive the idleness from the growth; the idleness is
what LNS is claimed to fix).
Hypotheses (5 seeds, paired by seed; each read with its 95% interval, precondition.parts, Holm across the three):
  B1 (LNS trains better than Pre-LN): Pre - LNS val loss at least GAP.
  B2 (LNS trains better than Mix-LN): Mix - LNS val loss at least GAP.
  B3 (LNS's deep layers matter more): LNS / Pre deep-half layer drop at least MATTER (on the log scale).
  Each: "confirmed" when its interval clears the threshold, "not at this scale" when it lies wholly on the other
  side, "unresolved" when it crosses it; with the premise absent, "premise absent at this scale".
  Overall: "k of 3 parts, Holm-adjusted". Reported, not tested: Pre - Mix (S10's M3 at this budget).
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Sequence
from pathlib import Path

from experiments.common import precondition as pre
from experiments.common import prereg
from experiments.common.study import Runs, load, mean, table, write
from experiments.studies.s10_mixln.r1_mixln import analyze as s10
from experiments.studies.s10_mixln.r2_lns import analyze as lns
from minillm.outcome import final_loss

HERE = Path(__file__).parent
# --- fixed before the runs ---------------------------------------------------------------------------------
DEPTH, DIM, STEPS, SEEDS = 12, 48, 6700, (0, 1, 2, 3, 4)
GAP = 0.02  # nats, S10's
MATTER = 1.5  # S10's
VARIANTS = ("pre", "mix", "pre+LNS")


def metric(key: str) -> bool:
    return lns.resid_layer(key) is not None


def analyze(runs: Runs) -> tuple[dict, str]:
    runs = Runs(r for r in runs if r["n_layers"] == DEPTH and "plain" in (r.get("tags") or []))
    prereg.require(runs, "the layer drop of their last checkpoint", lambda r: bool(r.get("layer_drop")))
    of = {v: [r for r in runs if lns.variant(r) == v] for v in VARIANTS}
    val = {v: prereg.by_seed(of[v], final_loss) for v in VARIANTS}
    deep = {v: prereg.by_seed(of[v], lambda r: s10.second_half(r["layer_drop"]["drop"])) for v in VARIANTS}
    growth = {v: prereg.by_seed(of[v], lns.depth_growth) for v in VARIANTS}
    idle = s10.idleness(Runs(r for r in runs if lns.variant(r) == "pre"), "layer_drop.json: this round's Pre-LN "
                        "checkpoints", depths=(DEPTH,))
    stream = pre.measure("stream_growth", {f"L={DEPTH}": [growth["pre"][s] / math.sqrt(DEPTH)
                                                         for s in sorted(growth["pre"])]},
                         "layer/<i>/resid_rms at the last logged step, this round's Pre-LN runs")
    parts = pre.parts({"B1": (prereg.diffs(val["pre"], val["pre+LNS"]), GAP, "at least"),
                       "B2": (prereg.diffs(val["mix"], val["pre+LNS"]), GAP, "at least"),
                       "B3": (prereg.ratios(deep["pre+LNS"], deep["pre"]), MATTER, "at least", True)})
    texts = {"B1": "Pre - LNS val loss", "B2": "Mix - LNS val loss", "B3": "LNS / Pre deep-half layer drop"}
    verdicts = {}
    for name, text in texts.items():
        w, why = prereg.verdict_line(name, parts["parts"][name], text)
        verdicts[name] = (pre.gate(w, idle), why)
    verdicts["overall"] = (pre.gate(f"{parts['holm']} of {parts['n']} parts", idle), parts["text"])
    pre_mix = prereg.diffs(val["pre"], val["mix"])
    rows = [[v, len(of[v]), mean(val[v].values()), mean(deep[v].values()), mean(growth[v].values())]
            for v in VARIANTS]
    tab = table(["variant", "runs", "val loss", "layer-drop loss, 2nd half", "depth growth r_L / r_1"], rows)
    vt = table(["hypothesis", "verdict", "numbers"], [[k, w, why] for k, (w, why) in verdicts.items()])
    md = (f"L = {DEPTH}, dim {DIM}, plain init, {STEPS} steps "
          f"({prereg.tokens_per_parameter(STEPS, max((r.get('n_params') or 1) for r in runs)):.1f} tokens per "
          f"parameter), seed means.\n\n{tab}\n\n{pre.line(idle)}\n\n{pre.line(stream)}\n\n### Verdicts (rules "
          f"fixed before the runs)\n\n{vt}\n\nReported, not tested: Pre - Mix val loss per seed "
          f"{' / '.join(f'{d:+.3f}' for d in pre_mix)}.\n")
    return {"cells": {v: {"runs": len(of[v]), "val": val[v], "deep_drop": deep[v], "growth": growth[v]}
                      for v in VARIANTS},
            "verdicts": verdicts, "precondition": [idle, stream], "holm": parts}, md


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("sweeps", nargs="*", help="this round's sweep folders; none: the committed runs")
    p.add_argument("--out", type=Path, default=HERE)
    args = p.parse_args(argv)
    runs = load(HERE, args.sweeps, metric, args.out)
    drops_file = args.out / "layer_drop.json"
    if args.sweeps:
        drops = {s10.key(r) + "_" + lns.variant(r): s10.layer_drop(Path(r["run_dir"]) / "checkpoints" / "last.ckpt")
                 for r in runs}
        drops_file.write_text(json.dumps(drops, indent=1) + "\n")
    drops = json.loads((drops_file if drops_file.exists() else HERE / "layer_drop.json").read_text())
    for r in runs:
        r["layer_drop"] = drops.get(s10.key(r) + "_" + lns.variant(r))
    write(args.out, *analyze(runs))


if __name__ == "__main__":
    main()
