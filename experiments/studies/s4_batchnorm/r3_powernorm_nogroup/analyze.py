"""S4 round 3 (pre-registered): PowerNorm without its group scaling. Round 2 ran PowerNorm as the
authors' code does, with a group scaling that first divides each token by its own RMS (a per-token RMS norm). That
alone has no train/eval mismatch, so round 2's "PowerNorm removes BatchNorm's failure" could not fail and was
restated as an observation. This round separates the two: PowerNorm's running quadratic mean with and without the
group scaling, beside BatchNorm and LayerNorm, fresh runs of one commit. The rules below are committed before any
run; the data commit cites this one.

Setting: configs/experiment/s4_batchnorm.yaml (Pre-LN, dim 64, 4 layers, 400 steps), batch {4, 64}, seeds 0-4;
PowerNorm with warmup_steps 40 as in round 2, group_scaling 1 ("PN-G") or 0 ("PN"), per-position statistics.

    S="python train.py -m experiment=s4_batchnorm data.batch_size=4,64 seed=0,1,2,3,4 hydra/launcher=joblib \\
       hydra.launcher.n_jobs=2"
    $S norm=batchnorm,layernorm hydra.sweep.dir=logs/s4_batchnorm/multiruns/round3_bn_ln                  # 20 runs
    $S norm=powernorm model.norm_options.warmup_steps=40 model.norm_options.group_scaling=0,1 \\
       hydra.sweep.dir=logs/s4_batchnorm/multiruns/round3_pn                                              # 20 runs
    python -m experiments.studies.s4_batchnorm.r3_powernorm_nogroup.analyze logs/s4_batchnorm/multiruns/round3_*

Compute estimate (2-core CPU, two runs side by side; round 2's timings): a batch-4 run ~10-13 s, a batch-64 run
~65-95 s: 20 batch-64 runs in 10 pairs ~15 min, 20 batch-4 runs ~2 min: ~20 min in all.

Precondition (fixed before the runs; the problem PowerNorm answers): BatchNorm fails at batch 4 (minillm.outcome's
rule, eval mode), reported: present when >= 3 of 5 BatchNorm runs fail there, absent when none does, mixed between.
Q1 and Q2 read "premise absent at this scale" where it is absent.
Hypotheses (Shen et al. 2020: PowerNorm's running quadratic mean, not a per-token norm, is what fixes BatchNorm):
  Q1 (PowerNorm without group scaling removes the failure): at batch 4, no PN run fails and PN - LN val loss, paired
     by seed, is at most MARGIN with its 95% interval ("holds"). Confirmed: both; partly: no failure but the
     interval does not hold; not at this scale: a PN run fails.
  Q2 (the group scaling is not what does it): at batch 4, PN - PN-G val loss at most MARGIN with its interval:
     confirmed ("holds"), not at this scale ("fails": PN-G is better by more than the margin), unresolved.
  Q3 (PowerNorm matches LayerNorm at batch 64, round 2's P1 without group scaling): PN - LN at most MARGIN, read
     the same way.
  Holm across Q1's gap, Q2 and Q3 (precondition.parts).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from experiments.common import precondition as pre
from experiments.common import prereg
from experiments.common.study import Runs, analysis_main, mean, table
from minillm.outcome import failed_of, final_loss

HERE = Path(__file__).parent
# --- fixed before the runs ---------------------------------------------------------------------------------
SEEDS = (0, 1, 2, 3, 4)
MARGIN = 0.05  # nats, round 2's tolerance
PREMISE_FAILS = 3  # of 5 BatchNorm runs at batch 4
ARMS = ("batchnorm", "layernorm", "PN", "PN-G")


def arm(run: dict) -> str:
    if run.get("norm") != "powernorm":
        return run.get("norm")
    return "PN-G" if (run.get("norm_options") or {}).get("group_scaling") else "PN"


def analyze(runs: Runs) -> tuple[dict, str]:
    cell = {(a, b): [r for r in runs if arm(r) == a and r.get("batch_size") == b] for a in ARMS for b in (4, 64)}
    val = {k: prereg.by_seed(rs, final_loss) for k, rs in cell.items()}
    fails = {k: sum(failed_of(r) for r in rs) for k, rs in cell.items()}
    bn = fails["batchnorm", 4]
    status = "present" if bn >= PREMISE_FAILS else "absent" if bn == 0 else "mixed"
    gate = pre.reported("BatchNorm fails at small batch (PowerNorm's problem; Shen et al. 2020)",
                        "BatchNorm runs at batch 4 that fail in eval mode", f"at least {PREMISE_FAILS} of 5",
                        {"batch 4": f"{bn}/{len(cell['batchnorm', 4])}"}, status, "this round's BatchNorm runs")
    parts = pre.parts({"Q1": (prereg.diffs(val["PN", 4], val["layernorm", 4]), MARGIN, "at most"),
                       "Q2": (prereg.diffs(val["PN", 4], val["PN-G", 4]), MARGIN, "at most"),
                       "Q3": (prereg.diffs(val["PN", 64], val["layernorm", 64]), MARGIN, "at most")})
    q1_gap = parts["parts"]["Q1"]
    q1 = ("not at this scale" if fails["PN", 4] else "confirmed" if q1_gap["reading"] == "holds" else "partly")
    verdicts = {"Q1": (pre.gate(q1, gate), f"{fails['PN', 4]} PN run(s) failed at batch 4; " +
                       prereg.verdict_line("Q1", q1_gap, "PN - LN at batch 4")[1])}
    for name, text in (("Q2", "PN - PN-G at batch 4"), ("Q3", "PN - LN at batch 64")):
        w, why = prereg.verdict_line(name, parts["parts"][name], text)
        verdicts[name] = (pre.gate(w, gate) if name == "Q2" else w, why)
    rows = [[a, b, len(cell[a, b]), mean(val[a, b].values()), fails[a, b]] for a in ARMS for b in (4, 64)]
    tab = table(["norm", "batch", "runs", "val loss (not diverged)", "failed"], rows)
    vt = table(["hypothesis", "verdict", "numbers"], [[k, w, why] for k, (w, why) in verdicts.items()])
    md = (f"{tab}\n\n{pre.line(gate)}\n\n### Verdicts (rules fixed before the runs; {parts['text']})\n\n{vt}\n")
    return {"cells": [{"norm": a, "batch": b, "val": val[a, b], "failed": fails[a, b]} for a in ARMS for b in (4, 64)],
            "verdicts": verdicts, "precondition": [gate], "holm": parts}, md


def main(argv: Sequence[str] | None = None) -> None:
    analysis_main(__doc__, HERE, lambda k: False, analyze, None, argv)


if __name__ == "__main__":
    main()
