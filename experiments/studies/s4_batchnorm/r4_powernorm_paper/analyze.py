"""S4 round 4 (pre-registered): PowerNorm as its paper runs it, with gradient clipping, and the arm
that isolates what removes BatchNorm's small-batch failure. Round 3 ran PowerNorm without its group scaling (PN)
unclipped: it failed at batch 64 too, where BatchNorm trains, and its gradients exploded at both batch sizes (max
grad norm 1.7e5 to 1.8e19), so no arm isolated a cause. Shen et al. 2020 train with gradient clipping (fairseq's
--clip-norm); this round clips every arm, BatchNorm included, so that clipping is held fixed and the norm is the
only difference. The rules below are committed before any run; the data commit cites this one.

Setting: configs/experiment/s4_batchnorm.yaml (Pre-LN, dim 64, 4 layers, 400 steps, warmup 40), gradient clipping
at norm CLIP on every run, batch {4, 64}, seeds 0-4; BatchNorm, LayerNorm, PowerNorm with its running statistics
(alpha_fwd = alpha_bwd = 0.9, the authors' code; warmup_steps 40 as rounds 2-3) with group_scaling 0 (PN) or 1
(PN-G): 40 runs, one commit, run.sh beside this file:

    bash experiments/studies/s4_batchnorm/r4_powernorm_paper/run.sh

Compute estimate (round 3: 40 runs of this setting in 12 min with two processes side by side): ~25 min on one
core.

Gates (read first; experiments.common.precondition):
  G1 (PN trains where BatchNorm trains, round 3's missing premise): at batch 64 no PN run fails (minillm.outcome's
    rule) and PN's seed-mean val loss is within TRAINS nats of LayerNorm's. Absent: nothing at batch 4 is read
    (R1, R2 and the isolation read "premise absent at this scale").
  G2 (BatchNorm's failure survives clipping): at batch 4 at least PREMISE_FAILS of 5 clipped BatchNorm runs fail.
    Absent (none fails): clipping alone removes the failure, which C reports; R1 and R2 read premise absent.
Hypotheses (5 seeds, paired by seed; interval readings Holm-adjusted across R1's gap, R2 and R3):
  C  (clipping alone does not remove BatchNorm's failure): reported as G2's count.
  R1 (PowerNorm's running statistics remove the failure, clipping held fixed): at batch 4 no PN run fails and
     PN - LN val loss at most MARGIN by its 95% interval (confirmed); partly when no run fails but the interval does
     not hold; not at this scale when a PN run fails.
  R2 (the group scaling is not what does it): at batch 4 PN - PN-G at most MARGIN (confirmed / not at this scale /
     unresolved by its interval).
  R3 (PowerNorm matches LayerNorm at batch 64, clipped): PN - LN at most MARGIN, read the same way; not gated.
  Isolation (said only when G1 and G2 are present and R1 is confirmed): with the same clipping and the same
  per-position running statistics at inference, the running quadratic mean used in training (PowerNorm) trains at
  batch 4 where the batch's own mean and variance (BatchNorm) fail: that difference is what removes the failure.
Reported, not tested: each cell's max grad norm (before clipping).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from experiments.common import precondition as pre
from experiments.common import prereg
from experiments.common.study import Runs, analysis_main, mean, table
from experiments.studies.s4_batchnorm.r3_powernorm_nogroup.analyze import ARMS, arm
from minillm.outcome import failed_of, final_loss

HERE = Path(__file__).parent
# --- fixed before the runs ---------------------------------------------------------------------------------
SEEDS = (0, 1, 2, 3, 4)
CLIP = 1.0  # gradient-norm clipping on every run
MARGIN = 0.05  # nats, rounds 2-3's tolerance
TRAINS = 0.1  # nats: PN "trains" at batch 64 when its seed mean is within this of LayerNorm's (2x MARGIN)
PREMISE_FAILS = 3  # of 5 BatchNorm runs at batch 4
BATCHES = (4, 64)


def analyze(runs: Runs) -> tuple[dict, str]:
    runs = Runs(r for r in runs if r.get("grad_clip") == CLIP)
    if not runs:
        raise SystemExit(f"no run clipped at {CLIP:g} (summary grad_clip): this round's runs clip every arm")
    prereg.require(runs, "the max grad norm (summary max_grad_norm)", lambda r: "max_grad_norm" in r)
    cell = {(a, b): [r for r in runs if arm(r) == a and r.get("batch_size") == b] for a in ARMS for b in BATCHES}
    val = {k: prereg.by_seed(rs, final_loss) for k, rs in cell.items()}
    fails = {k: sum(failed_of(r) for r in rs) for k, rs in cell.items()}
    pn64, ln64 = mean(val["PN", 64].values()), mean(val["layernorm", 64].values())
    trains = not fails["PN", 64] and pn64 is not None and ln64 is not None and pn64 - ln64 <= TRAINS
    g1 = pre.reported("PowerNorm without group scaling trains at batch 64 (where BatchNorm trains)",
                      "PN runs failed at batch 64; PN - LN seed-mean val loss", f"none, and at most {TRAINS:g}",
                      {"failed": f"{fails['PN', 64]}/{len(cell['PN', 64])}",
                       "PN - LN": None if pn64 is None or ln64 is None else pn64 - ln64},
                      "present" if trains else "absent", "this round's runs")
    bn = fails["batchnorm", 4]
    g2 = pre.reported("BatchNorm fails at batch 4 with clipping (the problem, clipping held fixed)",
                      "clipped BatchNorm runs at batch 4 that fail in eval mode", f"at least {PREMISE_FAILS} of 5",
                      {"batch 4": f"{bn}/{len(cell['batchnorm', 4])}"},
                      "present" if bn >= PREMISE_FAILS else "absent" if bn == 0 else "mixed", "this round's runs")
    parts = pre.parts({"R1": (prereg.diffs(val["PN", 4], val["layernorm", 4]), MARGIN, "at most"),
                       "R2": (prereg.diffs(val["PN", 4], val["PN-G", 4]), MARGIN, "at most"),
                       "R3": (prereg.diffs(val["PN", 64], val["layernorm", 64]), MARGIN, "at most")})
    r1_gap = parts["parts"]["R1"]
    r1 = "not at this scale" if fails["PN", 4] else "confirmed" if r1_gap["reading"] == "holds" else "partly"
    verdicts = {"C": ("clipping does not remove it" if g2["status"] == "present" else
                      "clipping removes it" if g2["status"] == "absent" else "mixed",
                      f"{bn} of {len(cell['batchnorm', 4])} clipped BatchNorm runs fail at batch 4"),
                "R1": (pre.gate(r1, g1, g2), f"{fails['PN', 4]} PN run(s) failed at batch 4; " +
                       prereg.verdict_line("R1", r1_gap, "PN - LN at batch 4")[1])}
    for name, text in (("R2", "PN - PN-G at batch 4"), ("R3", "PN - LN at batch 64")):
        word, why = prereg.verdict_line(name, parts["parts"][name], text)
        verdicts[name] = (pre.gate(word, g1, g2) if name == "R2" else word, why)
    isolated = g1["status"] == g2["status"] == "present" and verdicts["R1"][0] == "confirmed"
    verdicts["isolation"] = ("isolated" if isolated else "not isolated",
                             "PowerNorm's running quadratic mean in training, against BatchNorm's batch statistics, "
                             "same clipping" if isolated else "an arm that isolates a cause needs G1, G2 and R1")
    grad = {k: max((r.get("max_grad_norm") or 0.0 for r in rs), default=None) for k, rs in cell.items()}
    rows = [[a, b, len(cell[a, b]), mean(val[a, b].values()), fails[a, b], grad[a, b]] for a in ARMS for b in BATCHES]
    tab = table(["norm", "batch", "runs", "val loss (not diverged)", "failed", "max grad norm"], rows)
    vt = table(["hypothesis", "verdict", "numbers"], [[k, w, why] for k, (w, why) in verdicts.items()])
    md = (f"Gradient clipping at {CLIP:g} on every run.\n\n{tab}\n\n{pre.line(g1)}\n\n{pre.line(g2)}\n\n"
          f"### Verdicts (rules fixed before the runs; {parts['text']})\n\n{vt}\n")
    return {"cells": [{"norm": a, "batch": b, "val": val[a, b], "failed": fails[a, b], "max_grad_norm": grad[a, b]}
                      for a in ARMS for b in BATCHES],
            "verdicts": verdicts, "precondition": [g1, g2], "holm": parts}, md


def main(argv: Sequence[str] | None = None) -> None:
    analysis_main(__doc__, HERE, lambda k: False, analyze, None, argv)


if __name__ == "__main__":
    main()
