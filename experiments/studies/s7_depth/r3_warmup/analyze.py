"""S7 and S2 together: the Post-LN stalls at L=48 set in at the end of the 40-step warmup. Does a 3x longer
warmup (120 steps, same peak lr 3e-3, same 300 steps) prevent them?

    python train.py -m experiment=s7_depth placement=post model.n_layers=48 scheduler.warmup_steps=120 \\
        seed=0,1,2,3,4,5,6,7,8,9
    python -m experiments.studies.s7_depth.r3_warmup.analyze logs/s7_warmup/<time>      # or no argument: committed runs
    python -m experiments.studies.s7_depth.r3_warmup.analyze --out DIR                   # results into DIR

Beside the rule, not part of it: each stall rate's Clopper-Pearson interval and the two-sided Fisher p of the
two warmups' stalls (minillm.analysis.stats.exact_ci, fisher_p).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from experiments.common import precondition as pc
from experiments.common.machine import runs_machine
from experiments.common.study import load, mean, parse_args, rate_ci, table, write
from experiments.studies.s7_depth.r1_ladder import analyze as ladder
from experiments.studies.s7_depth.r1_ladder.analyze import stalled, val_loss
from minillm.analysis import stats as st
from minillm.metrics import TRAIN_LOSS

OUT = Path(__file__).parent
# Fixed before the runs: the longer warmup "prevents the stalls" when at most PREVENTS of its 10 runs stall
# (4 of 10 stalled with the 40-step warmup).
PREVENTS = 1


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(__doc__, argv)
    out = args.out or OUT
    long = load(OUT, args.sweeps, lambda k: k == TRAIN_LOSS, out)
    deep = max(r["n_layers"] for r in long)
    short = load(ladder.HERE, [], lambda k: False).where(placement="post", n_layers=deep)
    rows, cells = [], {}
    for warmup, runs in ((short[0]["warmup_steps"], short), (long[0]["warmup_steps"], long)):
        trained = [val_loss(r) for r in runs if not stalled(r)]
        cells[warmup] = sum(map(stalled, runs))
        rows.append([warmup, rate_ci(cells[warmup], len(runs)), mean(trained),
                     ", ".join(f"{val_loss(r):.3f}" for r in sorted(runs, key=lambda r: r["seed"]))])
    holds = cells[long[0]["warmup_steps"]] <= PREVENTS
    fisher = st.fisher_p(cells[long[0]["warmup_steps"]], len(long), cells[short[0]["warmup_steps"]], len(short))
    gate = ladder.stall_premise(list(short), f"round 1's Post-LN runs with {short[0]['warmup_steps']} warmup steps")
    md = (f"{pc.line(gate)}\n\nMachine: {runs_machine([*short, *long])}. "
          f"Post-LN, L={deep}, lr 3e-3, 300 steps, seeds 0-9.\n\n"
          + table(["warmup steps", "stalled [95% CI of the rate]", "final val loss of the runs that trained (mean)",
                   "final val loss per seed (0-9)"], rows)
          + "\n\n" + table(["check (fixed before the runs)", "holds"],
                           [[f"the longer warmup prevents the stalls (at most {PREVENTS} of 10 stall)", holds]])
          + f"\n\nBeside the rule: Fisher's exact test (two-sided) of the stalls with {long[0]['warmup_steps']} "
            f"against {short[0]['warmup_steps']} warmup steps, p = {fisher:.3f} (minillm.analysis.stats).\n")
    write(out, {"rows": rows, "holds": holds,
                "machine": runs_machine([*short, *long]), "fisher_p": fisher, "precondition": [gate]}, md)


if __name__ == "__main__":
    main()
