"""S10 round 3: why does LayerNorm Scaling lose here? Round 2 (r2_lns) found LNS's deep layers almost idle and LNS
0.16 nats behind Pre-LN at L = 24. Two untested explanations, each a change round 2's README names: minillm's
GPT-2 init already shrinks the residual projections by 1/sqrt(2L), so LNS's deep blocks start doubly damped; and
400 steps at lr 1e-3 do not let the input norms' gains grow back the 1/sqrt(l) that LNS takes away (under AdamW an
update's size does not follow its gradient's scale, so a block whose input is scaled by c learns ~c times as
fast in function space). Pre-registered: the rules below were committed before any run of this round (the README
names the commit). Results go to this round's folder.

    S="python train.py -m experiment=s10_mixln placement=pre model.n_layers=24 seed=0,1 hydra/launcher=joblib \\
       hydra.launcher.n_jobs=2"
    $S model.depth_scaled_init=false 'tags=[unscaled]' hydra.sweep.dir=logs/s10_mixln/multiruns/why_pre_unscaled
    $S model.depth_scaled_init=false model.layernorm_scaling=true 'tags=[lns,unscaled]' \\
       hydra.sweep.dir=logs/s10_mixln/multiruns/why_lns_unscaled
    $S trainer.max_steps=1600 'tags=[long]' hydra.sweep.dir=logs/s10_mixln/multiruns/why_pre_long
    $S trainer.max_steps=1600 model.layernorm_scaling=true 'tags=[lns,long]' \\
       hydra.sweep.dir=logs/s10_mixln/multiruns/why_lns_long          # 8 runs in all, ~25 min on 2 cores
    # the sweep folder(s) below, or no argument: the committed runs
    python -m experiments.studies.s10_mixln.r3_lns_why.analyze logs/s10_mixln/multiruns/why_*

Round 2's runs come from its committed r2_lns/runs.jsonl; their measures from the checkpoints in the run folders
those records name (run round 2 first, with r2_lns/analyze.py's commands).

Arms, each Pre-LN and Pre-LN + LNS at L = 24, seeds {0, 1}, S10's setting otherwise (RMSNorm, dim 64, lr 1e-3,
warmup 40): "round 2" (its committed runs: GPT-2 init, 400 steps), "unscaled" (model.depth_scaled_init=false:
residual projections N(0, 0.02) like every other linear, 400 steps), "long" (GPT-2 init, 1,600 steps).
Measures per run, from its last checkpoint where needed:
  val loss          the final val loss (minillm.outcome.final_loss)
  deep drop         S10's layer drop, mean over the second half of the blocks
  deep input scale  the RMS of each input norm's gain times the block's LNS factor (1 without LNS), mean over
                    the attention and FFN norms of the second half of the blocks: how large the normalized
                    input the deep sublayers see is
Hypotheses (seed means):
  R1 (the init): in arm "unscaled", LNS - Pre val loss <= CLOSED and LNS / Pre deep drop >= DEEP_MATTERS.
     Confirmed: both; partly: one; not at this scale: neither.
  R2 (the budget): in arm "long", LNS - Pre val loss <= half of arm "round 2"'s. Confirmed / not at this scale.
  R3 (the gains do not grow back): LNS / Pre deep input scale <= SMALL at the end of arm "round 2" and of arm
     "long". Confirmed: both; partly: one; not at this scale: neither.
Beside R1's and R2's rules, not part of them: the 95% paired t interval of each arm's LNS - Pre val loss over the
seeds (minillm.analysis.stats.paired_t).

Added after the data (experiments.common.precondition; the rules above are unchanged):
  R3 could not fail: AdamW moves a gain by about lr per step at most, so over the schedule an input norm's gain
     grows by at most the sum of the lrs (ADAM_BOUND): LNS's deep input scale cannot exceed 0.235 x (1 + that
     sum) while Pre-LN's stays near 1, under SMALL at both budgets. R3 is restated as an OBSERVATION.
  precondition  idle_deep_layers on each arm's Pre-LN runs (S10's layer-drop ratio, per seed); the residual
     stream's growth was not logged by this round's runs. R1 and R2 read PREMISE_ABSENT in an arm where it is absent.
  intervals  each part of R1 and R2 read against its threshold given its 95% interval (a seed mean over two seeds
     is not a number to compare with a threshold alone): "holds", "fails" or "unresolved"; Holm across the parts.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

import torch

from experiments.common import precondition as pre
from experiments.common.machine import runs_machine
from experiments.common.plots import pyplot, save
from experiments.common.study import Runs, by_seed, ci, load, mean, paired, table, write
from experiments.studies.s10_mixln.r1_mixln import analyze as s10
from experiments.studies.s10_mixln.r2_lns import analyze as lns
from minillm.outcome import final_loss

HERE = Path(__file__).parent
# --- fixed before the runs ---------------------------------------------------------------------------------
DEPTH = 24
CLOSED = 0.05  # nats: "LNS no longer loses"
DEEP_MATTERS = 0.5  # LNS's deep blocks matter at least half as much as Pre-LN's
SMALL = 0.5  # LNS's deep blocks see at most half Pre-LN's input scale
ARMS = ("round 2", "unscaled", "long")
VARIANTS = ("pre", "pre+LNS")
STEPS = {"round 2": 400, "unscaled": 400, "long": 1600}
LR, WARMUP, MIN_LR = 1e-3, 40, 0.1  # S10's schedule: warmup 40, cosine to 0.1 x lr


def adam_bound(steps: int) -> float:
    """The most an input norm's gain can grow over the schedule if each AdamW step moves it by at most lr: the sum
    of the lrs, ADAM_BOUND's 1 + sum, as a factor on its initial value."""
    from minillm.training.optim import lr_lambda

    factor = lr_lambda("cosine", WARMUP, steps, MIN_LR)
    return 1.0 + LR * sum(factor(t) for t in range(steps))


def arm(run: dict) -> str:
    tags = run.get("tags") or []
    return "unscaled" if "unscaled" in tags else "long" if "long" in tags else "round 2"


def key(run: dict) -> str:
    return f"{arm(run).replace(' ', '')}_{lns.variant(run)}_seed{run['seed']}"


def deep_input_scale(model: torch.nn.Module) -> float:
    """Mean over the second half of the blocks and both sublayers of RMS(input norm's gain) x the LNS factor."""
    blocks = list(model.layers)
    values = [float(norm.weight.detach().float().pow(2).mean().sqrt()) * block.norm_scale
              for block in blocks[len(blocks) // 2:] for norm in (block.attn_norm, block.ffn_norm)]
    return sum(values) / len(values)


def checkpoint_measures(ckpt: Path) -> dict:
    from minillm.tools.hub import load_checkpoint

    model, _, _ = load_checkpoint(ckpt)
    return {**s10.layer_drop(ckpt), "deep_input_scale": deep_input_scale(model)}


SCALE_AT_INIT = 0.235  # LNS's deep input scale at L = 24 before any step: the mean of 1/sqrt(l), l = 13..24


def analyze(runs: Runs) -> tuple[dict, str]:
    def of(a: str, v: str) -> list[dict]:
        return [r for r in runs if arm(r) == a and lns.variant(r) == v and r["n_layers"] == DEPTH]

    def per_seed_gap(a: str) -> list[float]:
        by = {v: {r["seed"]: final_loss(r) for r in of(a, v)} for v in VARIANTS}
        return [by["pre+LNS"][s] - by["pre"][s] for s in sorted(by["pre"]) if s in by["pre+LNS"]]

    def per_seed_ratio(a: str, measure: str) -> list[float]:
        by = {v: {r["seed"]: r["measures"] for r in of(a, v) if r.get("measures")} for v in VARIANTS}
        value = (lambda m: s10.second_half(m["drop"])) if measure == "deep_drop" else (lambda m: m[measure])
        return [value(by["pre+LNS"][s]) / value(by["pre"][s]) for s in sorted(by["pre"]) if s in by["pre+LNS"]]

    cells = {}
    for a in ARMS:
        for v in VARIANTS:
            rs = [r for r in runs if arm(r) == a and lns.variant(r) == v and r["n_layers"] == DEPTH]
            cells[a, v] = {"runs": len(rs), "val": mean(final_loss(r) for r in rs),
                           "deep_drop": mean(s10.second_half(r["measures"]["drop"]) for r in rs if r.get("measures")),
                           "deep_input_scale": mean(r["measures"]["deep_input_scale"] for r in rs
                                                    if r.get("measures"))}

    def gap(a: str) -> float | None:
        x, y = cells[a, "pre+LNS"]["val"], cells[a, "pre"]["val"]
        return x - y if x is not None and y is not None else None

    def gap_ci(a: str) -> str:
        return ci(paired(*(by_seed((r for r in runs if arm(r) == a and lns.variant(r) == v and r["n_layers"] == DEPTH),
                                   final_loss) for v in ("pre+LNS", "pre"))))

    def ratio(a: str, measure: str) -> float | None:
        x, y = cells[a, "pre+LNS"][measure], cells[a, "pre"][measure]
        return x / y if x is not None and y else None

    def graded(hits: int, of: int) -> str:
        return "confirmed" if hits == of else "partly" if hits else "not at this scale"

    fmt = lambda v: "-" if v is None else f"{v:.3f}"  # noqa: E731
    g_un, drop_un = gap("unscaled"), ratio("unscaled", "deep_drop")
    r1 = [g_un is not None and g_un <= CLOSED, drop_un is not None and drop_un >= DEEP_MATTERS]
    g_r2, g_long = gap("round 2"), gap("long")
    r2 = g_long is not None and g_r2 is not None and g_long <= g_r2 / 2
    s_r2, s_long = ratio("round 2", "deep_input_scale"), ratio("long", "deep_input_scale")
    r3 = [s is not None and s <= SMALL for s in (s_r2, s_long)]
    idle = pre.measure("idle_deep_layers", {a: [s10.idle_ratio(r["measures"]["drop"]) for r in
                                                sorted(of(a, "pre"), key=lambda r: r["seed"]) if r.get("measures")]
                                            for a in ARMS}, "measures.json: each arm's Pre-LN checkpoints")
    gates = [idle, pre.not_recorded("stream_growth", "this round's runs logged no residual RMS; round 2's Pre-LN "
                                    "runs at L = 24 (arm 'round 2') give 0.83 / 1.02 of sqrt(L): mixed")]
    parts = pre.parts({"R1 gap": (per_seed_gap("unscaled"), CLOSED, "at most"),
                       "R1 drop": (per_seed_ratio("unscaled", "deep_drop"), DEEP_MATTERS, "at least", True),
                       "R2": (per_seed_gap("long"), (g_r2 or 0.0) / 2, "at most")})
    readings = {k: r["reading"] for k, r in parts["parts"].items()}
    bounds = {steps: SCALE_AT_INIT * adam_bound(steps) for steps in sorted(set(STEPS.values()))}
    r1_word, r2_word = graded(sum(r1), 2), "confirmed" if r2 else "not at this scale"
    verdicts = {
        "R1": (pre.gate(r1_word, pre.cell(idle, "unscaled")),
               f"by its rule: {r1_word}; unscaled init: LNS - Pre val loss {fmt(g_un)} {gap_ci('unscaled')} "
               f"({readings['R1 gap']} against {CLOSED:g}), LNS / Pre deep drop {fmt(drop_un)} ({readings['R1 drop']} "
               f"against {DEEP_MATTERS:g}); {pre.count(parts, 'R1')}"),
        "R2": (pre.gate(r2_word, pre.cell(idle, "long"), pre.cell(idle, "round 2")),
               f"by its rule: {r2_word}; LNS - Pre val loss at 1,600 steps {fmt(g_long)} {gap_ci('long')} vs 400 "
               f"steps {fmt(g_r2)} {gap_ci('round 2')}; threshold {(g_r2 or 0.0) / 2:.4f} ({readings['R2']})"),
        "R3": (pre.OBSERVATION,
               f"could not fail: with each AdamW step moving a gain by at most ~lr, LNS's deep input scale can reach "
               f"at most {SCALE_AT_INIT:.3f} x (1 + sum of lrs) = " +
               ", ".join(f"{b:.2f} at {n:,} steps" for n, b in bounds.items()) +
               f" (SMALL {SMALL:g}); by its rule: {graded(sum(r3), 2)}; LNS / Pre deep input scale at 400 steps "
               f"{fmt(s_r2)}, at 1,600 steps {fmt(s_long)}"),
    }
    rows = [[a, v, c["val"], c["deep_drop"], c["deep_input_scale"], c["runs"]] for (a, v), c in cells.items()]
    tab = table(["arm", "variant", "val loss", "layer-drop loss, 2nd half", "deep input scale", "runs"], rows)
    vt = table(["hypothesis", "verdict", "numbers"], [[k, v, why] for k, (v, why) in verdicts.items()])
    lines = "\n\n".join(pre.line(g) for g in gates)
    md = (f"Machine: {runs_machine(runs)}. "
          f"L = {DEPTH}, seed means.\n\n{tab}\n\n{lines}\n\n### Verdicts (rules fixed before "
          f"the runs; R3's restatement, the precondition gate and the interval readings added after the data)"
          f"\n\n{vt}\n\nBeside R1's and R2's rules, not part of them: each val loss difference's 95% paired t "
          f"interval over the seeds (minillm.analysis.stats), in brackets.\n")
    return {"cells": [{"arm": a, "variant": v, **c} for (a, v), c in cells.items()], "verdicts": verdicts,
            "precondition": gates, "parts": parts, "adam_bound": {str(k): v for k, v in bounds.items()},
            "machine": runs_machine(runs)}, md


def plot(runs: Runs, out: Path) -> None:
    """why.png, per arm: each seed's val loss, deep-half layer drop and deep input scale, Pre-LN and Pre-LN + LNS."""
    plt = pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.4))
    measures = (("val loss", final_loss), ("layer-drop loss, 2nd half (log)",
                                           lambda r: max(s10.second_half(r["measures"]["drop"]), 1e-5)),
                ("deep input scale", lambda r: r["measures"]["deep_input_scale"]))
    for ax, (title, value) in zip(axes, measures, strict=True):
        for k, a in enumerate(ARMS):
            for j, v in enumerate(VARIANTS):
                ys = [value(r) for r in runs if arm(r) == a and lns.variant(r) == v and r["n_layers"] == DEPTH
                      and r.get("measures")]
                ax.scatter([k + (j - 0.5) * 0.25] * len(ys), ys, color=("tab:blue", "tab:red")[j], s=18,
                           label=v if k == 0 else None)
        ax.set(title=title, xticks=range(len(ARMS)), xticklabels=[f"{a}\n({STEPS[a]} steps)" for a in ARMS])
        if "log" in title:
            ax.set_yscale("log")
    axes[0].legend(fontsize=8)
    save(fig, out / "why.png")


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("sweeps", nargs="*", help="this round's sweep folders; none: the committed runs and measures")
    p.add_argument("--out", type=Path, help="folder for the results (default: %(default)s)", default=HERE)
    args = p.parse_args(argv)
    new = load(HERE, args.sweeps, lambda k: False, args.out)
    old = Runs(r for r in load(lns.HERE, [], lambda k: False)  # round 2's committed runs (arm "round 2")
               if r["n_layers"] == DEPTH and lns.variant(r) in VARIANTS)
    runs = Runs([*old, *new])
    if args.sweeps:  # from the checkpoints: this round's, and round 2's in the run folders its records name
        measures = {key(r): checkpoint_measures(Path(r["run_dir"]) / "checkpoints" / "last.ckpt") for r in runs}
        (args.out / "measures.json").write_text(json.dumps(measures, indent=1) + "\n")
    folder = args.out if (args.out / "measures.json").exists() else HERE
    measures = json.loads((folder / "measures.json").read_text())
    for r in runs:
        r["measures"] = measures.get(key(r))
    write(args.out, *analyze(runs))
    plot(runs, args.out)


if __name__ == "__main__":
    main()
