"""S5 round 4 (pre-registered): Peri-LN at the budget where Pre-LN's stream outgrows sqrt(L), in two stages.
Round 3 ran Peri-LN in its paper's init (every weight N(0, 0.02), no depth scaling) at 1,000 steps, where Pre-LN's
stream grew only 0.52-0.67x sqrt(L): the premise absent, predictably, since S10 round 4 had measured it present
(1.10-1.47x sqrt(L)) in the same model only at 6,700 steps (~20 tokens per parameter). This round runs that budget,
over a wider lr grid (round 3's chosen lr was the top of its two-point grid), with the lr chosen by a pilot seed and
the placements judged on disjoint seeds (a chosen lr's luck does not enter the judged loss). The rules below are
committed before any run; the data commit cites this one.

Setting: configs/experiment/s10_mixln.yaml (RMSNorm, last checkpoint) with dim 48, 12 layers,
model.depth_scaled_init=false, STEPS steps (warmup 100, cosine), model.compile=true, logging every 50 steps (the
residual stream's RMS, max and median |h| after every block); run.sh beside this file. Not the paper's scale
(400M-3.2B parameters, 30B tokens) or data.

    bash experiments/studies/s5_precision/r4_peri_budget/run.sh

Stage 1, the pilot (seed PILOT_SEED): placement {pre, peri} x lr LRS, 6 runs. Each placement's lr: the grid point of
its lower pilot val loss (a failed run counts as no loss). The gate is read on the pilot first: Pre-LN's
(r_L / r_1) / sqrt(L) at its chosen lr at least 1 (experiments.common.precondition stream_growth); when absent,
stage 2 is not run and every part reads "premise absent at this scale" with the pilot's number.
Stage 2, the judged runs (seeds JUDGED_SEEDS, disjoint from the pilot's): each placement at its pilot-chosen lr only,
6 runs; a judged run at another lr stops the analysis. The gate again on the judged Pre-LN runs: present in every
seed, or the parts read "premise absent at this scale".
Compute estimate (measured before the runs: ~10k tokens/s per compiled process, two side by side): 6.9M tokens a
run, ~12 min, 12 runs in 6 pairs, ~75 min on the 2-core machine.

Measures per run: final val loss (minillm.outcome.final_loss); depth growth r_L / r_1 (the residual RMS after the
last block over that after the first, at the last logged step); the largest max |h| / median |h| over the blocks at
the last logged step (experiments.common.precondition massive_activations on Pre-LN: reported beside the gate,
decides nothing: S10 round 4 did not log the median, so no round has seen it present here).
Hypotheses (3 judged seeds, paired by seed, each placement at its pilot-chosen lr):
  P1 (Peri-LN keeps the stream from growing): Peri / Pre depth growth at most BOUNDS (a ratio, log scale).
  P2 (Peri-LN trains at least as well): Peri - Pre val loss at most MARGIN.
  Each word comes from its 95% interval: "confirmed" when the interval clears the threshold, "not at this scale"
  when it lies wholly on the other side, "unresolved" when it crosses it; the Holm-adjusted one-sided p over the
  two parts is reported beside each and decides nothing.
Reported, not tested: every pilot cell; each placement's max / median |h| per block.

Corrections, committed after four of the six pilot runs had ended (the two Pre-LN ones' gate numbers read) and
before any judged run, towards the text above; none changes a threshold or the design: the parts are gated on the
pilot's gate as well as the judged one (the code read only the judged one when judged runs existed); a diverged run
gives no depth growth (its last logged RMS could predate the divergence); a placement with no trained pilot run, a
gate with nothing recorded, or a judged seed missing stops the analysis; a judged run that failed makes both parts
"unresolved" (the text said nothing of judged failures; a failure is evidence against neither part's threshold
that a loss could weigh).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from pathlib import Path

from experiments.common import precondition as pre
from experiments.common import prereg
from experiments.common.machine import runs_commits, runs_machine
from experiments.common.study import Runs, analysis_main, load, mean, table
from experiments.studies.s10_mixln.r2_lns import analyze as lns
from minillm.metrics import parse_metric
from minillm.outcome import final_loss

HERE = Path(__file__).parent
# --- fixed before the runs ---------------------------------------------------------------------------------
DEPTH, DIM, STEPS = 12, 48, 6700
LRS, PLACEMENTS = (3e-3, 1e-2, 3e-2), ("pre", "peri")
PILOT_SEED, JUDGED_SEEDS = 0, (10, 11, 12)
BOUNDS = 0.5  # Peri's depth growth at most half of Pre-LN's (round 3's rule)
MARGIN = 0.02  # nats: the project's equivalence margin
TAG = "peri_budget"
KEPT = ("resid_rms", "resid_max", "resid_median")
NOT_RUN_STAGE2 = "stage 2 not run: the pilot's gate is absent"


def metric(key: str) -> bool:
    parsed = parse_metric(key)
    return parsed is not None and parsed[0] == "layer" and parsed[2] in KEPT


def _last(run: dict, i: int, name: str) -> float | None:
    pts = run["curves"].get(f"layer/{i}/{name}")
    return pts[-1][1] if pts else None


def massive_ratio(run: dict) -> float | None:
    """The largest max |h| / median |h| over the blocks, at the last logged step."""
    ratios = [m / d for i in range(run["n_layers"]) if (m := _last(run, i, "resid_max")) is not None
              and (d := _last(run, i, "resid_median"))]
    return max(ratios) if ratios else None


def depth_growth(run: dict) -> float | None:
    """r_L / r_1 at the last logged step; None for a run that diverged (its last finite RMS may predate it)."""
    return None if run.get("diverged") else lns.depth_growth(run)


def _cell(runs: Runs, placement: str, lr: float, seeds: Sequence[int], value) -> dict[int, float]:
    return prereg.by_seed([r for r in runs if r["placement"] == placement and r["lr"] == lr and r["seed"] in seeds],
                          value)


def pilot_choice(runs: Runs) -> tuple[dict[str, float], dict]:
    """Each placement's lr chosen on the pilot seed, and the gate's block on Pre-LN's pilot run at its lr."""
    pilot = Runs(r for r in runs if r["seed"] == PILOT_SEED)
    missing = [(p, lr) for p in PLACEMENTS for lr in LRS if not any(r["placement"] == p and r["lr"] == lr
                                                                    for r in pilot)]
    if missing:
        raise SystemExit(f"the pilot lacks {', '.join(f'{p} at lr {lr:g}' for p, lr in missing)} (seed {PILOT_SEED})")
    loss = {(p, lr): _cell(pilot, p, lr, (PILOT_SEED,), final_loss).get(PILOT_SEED, math.inf)
            for p in PLACEMENTS for lr in LRS}
    if untrained := [p for p in PLACEMENTS if all(math.isinf(loss[p, lr]) for lr in LRS)]:
        raise SystemExit(f"no pilot run of {', '.join(untrained)} trained: the pilot chooses no lr")
    chosen = {p: min(LRS, key=lambda lr, p=p: loss[p, lr]) for p in PLACEMENTS}
    growth = _cell(pilot, "pre", chosen["pre"], (PILOT_SEED,), depth_growth)
    gate = pre.measure("stream_growth", {f"L={DEPTH}": [g / math.sqrt(DEPTH) for g in growth.values()]},
                       f"layer/<i>/resid_rms at the last logged step, Pre-LN's pilot run (seed {PILOT_SEED}) at its lr")
    if gate["status"] == "not recorded":
        raise SystemExit("the pilot's gate recorded nothing: Pre-LN's pilot run at its lr has no residual RMS")
    return chosen, gate


def analyze(runs: Runs) -> tuple[dict, str]:
    runs = Runs(r for r in runs if TAG in (r.get("tags") or []) and r["n_layers"] == DEPTH)
    prereg.require(runs, "the residual RMS per block (layer/<i>/resid_rms)", lambda r: lns.depth_growth(r) is not None)
    prereg.require(runs, "the median |h| per block (layer/<i>/resid_median)", lambda r: massive_ratio(r) is not None)
    chosen, pilot_gate = pilot_choice(runs)
    judged = Runs(r for r in runs if r["seed"] in JUDGED_SEEDS)
    if off := [r for r in judged if r["lr"] != chosen[r["placement"]]]:
        raise SystemExit(f"{len(off)} judged run(s) not at the pilot's lr ({chosen}): "
                         + ", ".join(f"{r['placement']} lr {r['lr']:g} seed {r['seed']}" for r in off))
    if judged and (missing := [(p, s) for p in PLACEMENTS for s in JUDGED_SEEDS
                               if not any(r["placement"] == p and r["seed"] == s for r in judged)]):
        raise SystemExit("judged runs missing: " + ", ".join(f"{p} seed {s}" for p, s in missing))
    if other := [r for r in runs if r["seed"] not in (PILOT_SEED, *JUDGED_SEEDS)]:
        raise SystemExit(f"{len(other)} run(s) of seeds neither the pilot's nor the judged ones")
    pilot_rows = [[p, lr, fmt_or(_cell(runs, p, lr, (PILOT_SEED,), final_loss)),
                   fmt_or(_cell(runs, p, lr, (PILOT_SEED,), depth_growth)),
                   fmt_or(_cell(runs, p, lr, (PILOT_SEED,), massive_ratio)), "chosen" if chosen[p] == lr else ""]
                  for p in PLACEMENTS for lr in LRS]
    md = (f"Machine: {runs_machine(runs)} (commit {runs_commits(runs)}).\n\n"
          f"L = {DEPTH}, dim {DIM}, plain init, {STEPS} steps.\n\n### Stage 1: the pilot (seed {PILOT_SEED})\n\n"
          + table(["placement", "lr", "val loss", "depth growth r_L / r_1", "max / median |h|", "lr"], pilot_rows)
          + f"\n\nGate on the pilot: {pre.line(pilot_gate)}\n\n")
    results = {"chosen_lr": chosen, "pilot_gate": pilot_gate, "precondition": [pilot_gate]}
    if pilot_gate["status"] != "present" and not judged:
        verdicts = {k: (pre.PREMISE_ABSENT, NOT_RUN_STAGE2) for k in ("P1", "P2")}
        return {**results, "verdicts": verdicts}, md + _verdict_table(verdicts, NOT_RUN_STAGE2)
    if not judged:
        raise SystemExit(f"the pilot's gate is present: stage 2's judged runs (seeds {JUDGED_SEEDS}) are missing")
    val = {p: _cell(judged, p, chosen[p], JUDGED_SEEDS, final_loss) for p in PLACEMENTS}
    growth = {p: _cell(judged, p, chosen[p], JUDGED_SEEDS, depth_growth) for p in PLACEMENTS}
    massive = {p: _cell(judged, p, chosen[p], JUDGED_SEEDS, massive_ratio) for p in PLACEMENTS}
    stream = pre.measure("stream_growth", {f"L={DEPTH}": [g / math.sqrt(DEPTH) for g in growth["pre"].values()]},
                         "layer/<i>/resid_rms at the last logged step, the judged Pre-LN runs at the pilot's lr")
    spikes = pre.measure("massive_activations", {f"L={DEPTH}": list(massive["pre"].values())},
                         "layer/<i>/resid_max / resid_median at the last logged step, the judged Pre-LN runs "
                         "(reported, decides nothing)", log=True)
    parts = pre.parts({"P1": (prereg.ratios(growth["peri"], growth["pre"]), BOUNDS, "at most", True),
                       "P2": (prereg.diffs(val["peri"], val["pre"]), MARGIN, "at most")})
    failed = [r for r in judged if final_loss(r) is None]
    verdicts = {}
    for name, text in (("P1", "Peri / Pre depth growth"), ("P2", "Peri - Pre val loss")):
        if failed:
            word, why = "unresolved", (f"{name}: {len(failed)} judged run(s) failed ("
                                       + ", ".join(f"{r['placement']} seed {r['seed']}" for r in failed) + ")")
        else:
            word, why = prereg.verdict_line(name, parts["parts"][name], text)
        gates = [{"status": "absent" if g["status"] != "present" else "present"} for g in (pilot_gate, stream)]
        verdicts[name] = (pre.gate(word, *gates), why)
    rows = [[p, chosen[p], len(val[p]), mean(val[p].values()), mean(growth[p].values()), mean(massive[p].values())]
            for p in PLACEMENTS]
    md += (f"### Stage 2: the judged runs (seeds {', '.join(map(str, JUDGED_SEEDS))}), seed means\n\n"
           + table(["placement", "lr (pilot's)", "runs", "val loss", "depth growth r_L / r_1", "max / median |h|"],
                   rows)
           + f"\n\n{pre.line(stream)}\n\n{pre.line(spikes)}\n\n" + _verdict_table(verdicts, parts["text"]))
    return {**results, "judged": {p: {"val": val[p], "growth": growth[p], "massive": massive[p]} for p in PLACEMENTS},
            "precondition": [pilot_gate, stream, spikes], "verdicts": verdicts, "holm": parts}, md


def fmt_or(cell: dict[int, float]) -> float | str:
    return next(iter(cell.values())) if cell else "failed"


def _verdict_table(verdicts: dict, how: str) -> str:
    vt = table(["hypothesis", "verdict", "numbers"], [[k, w, why] for k, (w, why) in verdicts.items()])
    return (f"### Verdicts (rules fixed before the runs; words from the 95% intervals; {how})\n\n{vt}\n")


def print_stage2(sweeps: list[str]) -> None:
    """The pilot's choice for run.sh: "pre=<lr> peri=<lr>" on stdout, or exit 3 with the gate's line."""
    copied = load(Path(sweeps[0]), sweeps, metric, Path(sweeps[0]) / "pilot_copy")
    runs = Runs(r for r in copied if TAG in (r.get("tags") or []))
    chosen, gate = pilot_choice(runs)
    if gate["status"] != "present":
        print(f"{NOT_RUN_STAGE2}: {pre.line(gate)}", file=sys.stderr)
        raise SystemExit(3)
    print(" ".join(f"{p}={lr:g}" for p, lr in chosen.items()))


def main(argv: Sequence[str] | None = None) -> None:
    analysis_main(__doc__, HERE, metric, analyze, None, argv,
                  stages={"--pilot": ("the pilot's sweep folder: 'pre=<lr> peri=<lr>' on stdout (run.sh's stage 2 "
                                      "reads it), or exit 3 with the gate's line", print_stage2)})


if __name__ == "__main__":
    main()
