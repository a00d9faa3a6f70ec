"""S13 round 1 (pre-registered): does nGPT reach Pre-LN RMSNorm's loss in fewer steps? Loshchilov et al. 2025
("nGPT: Normalized Transformer with Representation Learning on the Hypersphere", ICLR 2025) train GPT and nGPT
(0.5B and 1B parameters, OpenWebText, context 1k-8k) for several budgets, each run with its own full schedule, and
report that nGPT's validation loss after N tokens matches GPT's after 4N (context 1k) to 20N (8k): "4 to 20 times
fewer steps". This round asks the same question of the CPU studies' model, with the same design: separate runs at
three budgets, not a point read off one long run. The rules below are committed before any run; the data commit
cites this one.

Setting: configs/experiment/s13_ngpt.yaml (the CPU studies' model: dim 64, 4 layers, 4 heads, context 64, batch 16,
Shakespeare characters, AdamW, cosine schedule to 0.1x, no clipping; ~0.23M parameters). Baseline: Pre-LN RMSNorm,
warmup 40, weight decay 0.1, 400 steps (410k tokens, 1.8 tokens per parameter). nGPT: model.ngpt=true, norm=none,
no weight decay and no warmup (the paper's training), at 100, 200 and 400 steps (each its own cosine schedule).
Not the paper's scale (1,000-4,000x the parameters, 10^5x the tokens) or context (64 against 1k-8k: the paper's
speed-up grows with context, so its smallest, 4x, is the one to expect here).

Learning rates, chosen on other seeds than the ones judged (a speed-up over an untuned baseline is no speed-up):
a pilot runs both arms at 400 steps over LRS with seeds PILOT_SEEDS; each arm's lr is the grid point with the lower
mean final val loss over the pilot seeds (a failed run counted at ln V, minillm.outcome.loss_for_comparison),
written to lr_choice.json (`--choose-lr`); the judged runs (SEEDS) use it at every budget.

    bash experiments/studies/s13_ngpt/r1_budgets/run.sh        # pilot, lr choice, judged runs, analysis

Compute: 24 pilot runs + 5 baseline runs + 15 nGPT runs (5 x 100, 200, 400 steps), ~38 runs of 400 steps'
worth; ~8,000 tokens/s per process on the 2-core VM: ~15 min with two processes.

Precondition (the gate, read first): both arms are tuned: each arm's chosen lr lies inside LRS, not at its edge
(an lr at the edge says the grid did not find the arm's best). Absent: every hypothesis reads "premise absent at
this scale".
Hypotheses (5 judged seeds, paired by seed, final val loss, failed runs at ln V; each read with its 95% interval,
Holm across F4, F2, F1):
  F4 (the paper's 4x): nGPT after 100 steps - baseline after 400 steps at most +PARITY.
  F2 (2x): nGPT after 200 steps - baseline after 400 steps at most +PARITY.
  F1 (at the same budget nGPT is better): nGPT after 400 steps - baseline after 400 at most -BETTER.
  Each: "confirmed" when its interval clears the threshold, "not at this scale" when it lies wholly on the other
  side, "unresolved" when it crosses it.
Reported, not tested: per seed, the first validated step (every 50) at which nGPT's 400-step run reaches the
baseline's final val loss; the pilot's loss-vs-lr curves of both arms.
Beside the rules: verdicts.json, minillm.analysis.compare's default verdicts of each nGPT budget against the
baseline.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path

from experiments.common import precondition as pre
from experiments.common import prereg
from experiments.common.machine import runs_machine
from experiments.common.plots import pyplot, save, xy
from experiments.common.study import Runs, analysis_main, mean, table
from minillm.analysis.compare import compare
from minillm.analysis.rules import REGISTERED_V2
from minillm.analysis.runs import find_runs
from minillm.metrics import VAL_LOSS
from minillm.outcome import loss_for_comparison

HERE = Path(__file__).parent
LR_FILE = HERE / "lr_choice.json"
# --- fixed before the runs ---------------------------------------------------------------------------------
STEPS, BUDGETS = 400, (100, 200, 400)
LRS = (1e-3, 3e-3, 1e-2, 3e-2, 1e-1, 3e-1)
PILOT_SEEDS, SEEDS = (0, 1), (2, 3, 4, 5, 6)
PARITY = 0.03  # nats: S8's parity threshold (a loss this close is "the same loss")
BETTER = 0.01  # nats: "better" by at least this
ARMS = ("baseline", "ngpt")
TAG = "ngpt_steps"


def arm(run: dict) -> str:
    return "ngpt" if ((run.get("settings") or {}).get("model") or {}).get("ngpt") else "baseline"


def _ours(runs: Runs) -> Runs:
    return Runs(r for r in runs if TAG in (r.get("tags") or []))


def choose_lr(runs: Runs) -> dict:
    """Each arm's lr from the pilot (400 steps, PILOT_SEEDS): the grid point of lower mean loss, failures at ln V."""
    out = {}
    for a in ARMS:
        means = {}
        for lr in LRS:
            vals = [loss_for_comparison(r) for r in _ours(runs) if arm(r) == a and r["seed"] in PILOT_SEEDS
                    and r["max_steps"] == STEPS and math.isclose(r["lr"], lr)]
            means[lr] = mean(vals) if len(vals) == len(PILOT_SEEDS) else None
        done = {lr: m for lr, m in means.items() if m is not None}
        if not done:
            raise SystemExit(f"no complete pilot for {a}: {len(PILOT_SEEDS)} seeds at {STEPS} steps per lr")
        best = min(done, key=done.__getitem__)
        out[a] = {"lr": best, "edge": best in (LRS[0], LRS[-1]), "pilot": {f"{lr:g}": m for lr, m in means.items()}}
    return out


def analyze(runs: Runs) -> tuple[dict, str]:
    runs = _ours(runs)
    chosen = choose_lr(runs)
    judged = Runs(r for r in runs if r["seed"] in SEEDS)
    prereg.require(judged, "the arm's chosen lr", lambda r: math.isclose(r["lr"], chosen[arm(r)]["lr"]))
    val = {(a, b): prereg.by_seed([r for r in judged if arm(r) == a and r["max_steps"] == b], loss_for_comparison)
           for a in ARMS for b in BUDGETS}
    gate = pre.reported("a tuned baseline and a tuned nGPT (the claim compares the two at their best lrs)",
                        "the pilot's best lr (2 seeds, 400 steps)", f"inside the grid {LRS[0]:g}-{LRS[-1]:g}",
                        {a: chosen[a]["lr"] for a in ARMS},
                        "absent" if any(chosen[a]["edge"] for a in ARMS) else "present",
                        "the pilot runs (seeds 0-1), lr_choice rule of this file")
    base = val["baseline", STEPS]
    parts = pre.parts({"F4": (prereg.diffs(val["ngpt", 100], base), PARITY, "at most"),
                       "F2": (prereg.diffs(val["ngpt", 200], base), PARITY, "at most"),
                       "F1": (prereg.diffs(val["ngpt", 400], base), -BETTER, "at most")})
    texts = {"F4": "nGPT at 100 steps - baseline at 400", "F2": "nGPT at 200 steps - baseline at 400",
             "F1": "nGPT at 400 steps - baseline at 400"}
    verdicts = {}
    for name, text in texts.items():
        w, why = prereg.verdict_line(name, parts["parts"][name], text)
        verdicts[name] = (pre.gate(w, gate), why)
    reach = steps_to_target(judged, base)
    reached = ", ".join(f"seed {s}: {v or 'not reached'}" for s, v in reach.items())
    rows = [[a, b, len(val[a, b]), mean(val[a, b].values()),
             " / ".join(f"{v:.3f}" for _, v in sorted(val[a, b].items()))]
            for a in ARMS for b in BUDGETS if val[a, b] or a == "ngpt"]
    pilot = table(["lr", *ARMS], [[f"{lr:g}", *(chosen[a]["pilot"][f"{lr:g}"] for a in ARMS)] for lr in LRS])
    vt = table(["hypothesis", "verdict", "numbers"], [[k, w, why] for k, (w, why) in verdicts.items()])
    md = (f"Machine: {runs_machine(runs)}. "
          f"{len(runs)} runs (pilot seeds {PILOT_SEEDS[0]}-{PILOT_SEEDS[-1]}, judged seeds "
          f"{SEEDS[0]}-{SEEDS[-1]}).\n\n### Pilot: mean final val loss at {STEPS} steps (failures at ln V)\n\n"
          f"{pilot}\n\nChosen lr: baseline {chosen['baseline']['lr']:g}, nGPT {chosen['ngpt']['lr']:g}.\n\n"
          f"{pre.line(gate)}\n\n### Judged runs: final val loss\n\n"
          f"{table(['arm', 'steps', 'runs', 'val loss (mean)', 'per seed'], rows)}\n\n"
          f"First validated step at which nGPT's {STEPS}-step run reaches the seed's baseline final loss "
          f"(reported, not tested): {reached}"
          f".\n\n### Verdicts (rules fixed before the runs; {parts['text']})\n\n{vt}\n\n"
          f"verdicts.md: minillm.analysis.compare's default verdicts, each nGPT budget against the baseline.\n")
    return {"lr_choice": chosen, "val": {f"{a}@{b}": val[a, b] for a in ARMS for b in BUDGETS},
            "steps_to_target": reach, "verdicts": verdicts, "precondition": [gate], "holm": parts,
            "machine": runs_machine(runs)}, md


def steps_to_target(judged: Runs, base: dict[int, float]) -> dict[int, int | None]:
    out = {}
    for r in judged:
        if arm(r) == "ngpt" and r["max_steps"] == STEPS and r["seed"] in base:
            hit = [step for step, v in r["curves"].get(VAL_LOSS) or [] if v <= base[r["seed"]]]
            out[r["seed"]] = int(min(hit)) + 1 if hit else None
    return dict(sorted(out.items()))


def engine(runs: Runs) -> dict:
    """verdicts.json: minillm.analysis.compare with its default rules, each nGPT budget against the baseline."""
    judged = [{**r, "arm": f"{arm(r)}@{r['max_steps']}"} for r in _ours(runs) if r["seed"] in SEEDS]
    return compare(judged, "arm", f"baseline@{STEPS}", **REGISTERED_V2)


def plot(runs: Runs, out: Path) -> None:
    plt = pyplot()
    runs = _ours(runs)
    chosen = choose_lr(runs)
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    for i, a in enumerate(ARMS):
        for s in PILOT_SEEDS:
            pts = sorted((r["lr"], loss_for_comparison(r)) for r in runs
                         if arm(r) == a and r["seed"] == s and r["max_steps"] == STEPS)
            axes[0].plot(*zip(*pts, strict=True), "o-", color=f"C{i}", alpha=0.7,
                         label=f"{a} (pilot seeds)" if s == PILOT_SEEDS[0] else None)
    axes[0].set(xscale="log", xlabel="lr", ylabel="final val loss (failed: ln V)",
                title=f"pilot, {STEPS} steps: lr chosen {chosen['baseline']['lr']:g} / {chosen['ngpt']['lr']:g}")
    axes[0].legend(fontsize=8)
    for r in runs:
        if r["seed"] in SEEDS and (arm(r) == "ngpt" or r["max_steps"] == STEPS):
            i, k = ARMS.index(arm(r)), BUDGETS.index(r["max_steps"])
            pts = r["curves"].get(VAL_LOSS) or []
            if pts:
                axes[1].plot(*xy(pts), color=f"C{i}", alpha=0.5, ls=("-", "--", ":")[2 - k],
                             label=f"{arm(r)}, {r['max_steps']} steps" if r["seed"] == SEEDS[0] else None)
    axes[1].set(xlabel="step", ylabel="val loss", title=f"judged runs, seeds {SEEDS[0]}-{SEEDS[-1]}", ylim=(1.5, 3.0))
    axes[1].legend(fontsize=8)
    save(fig, out / "budgets.png")


def write_lr_choice(sweeps: list[str]) -> None:
    """The pilot's lr of each arm from its sweep folders, into lr_choice.json, and "<baseline lr> <nGPT lr>" on
    stdout (what run.sh reads)."""
    chosen = choose_lr(Runs(run.summary for folder in sweeps for run in find_runs(folder)))
    LR_FILE.write_text(json.dumps(chosen, indent=1) + "\n")
    print(chosen["baseline"]["lr"], chosen["ngpt"]["lr"])


def main(argv: Sequence[str] | None = None) -> None:
    analysis_main(__doc__, HERE, lambda k: k == VAL_LOSS, analyze, plot, argv, engine=engine,
                  stages={"--choose-lr": ("the pilot's sweep folders: each arm's lr into lr_choice.json, and "
                                          "'<baseline lr> <nGPT lr>' on stdout (run.sh's stage 2 reads it)",
                                          write_lr_choice)})


if __name__ == "__main__":
    main()
