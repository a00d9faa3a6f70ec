"""S8 round 3 (pre-registered): DyT with unit-scale embeddings, a per-site alpha0 and the budget the
claims are about. Round 1 ran DyT where tanh stays linear (GPT-2's N(0, 0.02) embeddings: no input saturates at
init); round 2's unit-scale embeddings (model.init=xavier) put 5% of the inputs in tanh's bent range at alpha0 0.5
and brought DyT within +0.079 nats [+0.021, +0.137] of RMSNorm, at 1.8 tokens per parameter and with one alpha0
for every site. Zhu et al. tune alpha0 per site (larger before attention) and train far longer. The rules below
are committed before any run; the data commit cites this one.

Needs, before the run, a feature minillm does not have yet: model.attn_norm_options, options of the norm before
attention that override model.norm_options there (expected name; until it exists the model config rejects the
unknown field at start, so a run without it cannot happen silently).

Setting: configs/experiment/s8_dyt.yaml (Pre-LN, dim 64, 4 layers, ~0.225M parameters), model.init=xavier, lr 3e-3
(round 2's), warmup 40 + cosine, STEPS = 4,500 steps = 4.6M tokens = 20.4 tokens per parameter, seeds 0-4, the last
checkpoint kept (for the saturation at the end). Arms: RMSNorm; DyT alpha0 0.5 everywhere (round 2's best);
DyT alpha0 1.0 before attention and 0.5 elsewhere; DyT 2.0 before attention and 0.5 elsewhere.

    K='{_target_:minillm.training.callbacks.Checkpoint,dirpath:${paths.output_dir}/checkpoints,save_top_k:0,save_last:true}'
    C="trainer.enable_checkpointing=true +callbacks.last_checkpoint=$K"
    S="python train.py -m experiment=s8_dyt model.init=xavier optimizer.lr=3e-3 trainer.max_steps=4500 \\
       trainer.val_check_interval=500 seed=0,1,2,3,4 hydra/launcher=joblib hydra.launcher.n_jobs=2"
    $S $C norm=rmsnorm 'tags=[budget]' hydra.sweep.dir=logs/s8_dyt/multiruns/budget_rmsnorm          # 5 runs
    $S $C norm=dyt model.norm_options.alpha0=0.5 'tags=[budget,uniform]' \\
       hydra.sweep.dir=logs/s8_dyt/multiruns/budget_uniform                                            # 5 runs
    $S $C norm=dyt model.norm_options.alpha0=0.5 +model.attn_norm_options.alpha0=1.0 \\
       'tags=[budget,attn1]' hydra.sweep.dir=logs/s8_dyt/multiruns/budget_attn1                        # 5 runs
    $S $C norm=dyt model.norm_options.alpha0=0.5 +model.attn_norm_options.alpha0=2.0 \\
       'tags=[budget,attn2]' hydra.sweep.dir=logs/s8_dyt/multiruns/budget_attn2                        # 5 runs
    python -m experiments.studies.s8_dyt.r3_budget_per_site.analyze logs/s8_dyt/multiruns/budget_*

Compute estimate (2-core CPU, two runs side by side): round 1's DyT runs trained at ~15,000 tokens/s per process;
20 runs x 4.6M tokens, 10 pairs of ~5 min: ~55 min, plus ~5 min for the saturation of 15 checkpoints: ~1 h.

Measures: the final val loss (minillm.outcome.final_loss); tanh saturation (experiments.common.precondition:
the fraction of the inputs of every DyT with |alpha x| >= 1) of each DyT run's last checkpoint over the 128 val
windows (saturation.json).
Precondition (fixed before the runs): tanh_saturation >= 1% at the end of training, per DyT arm and seed: a DyT arm
whose premise is absent reads "premise absent at this scale".
Hypotheses (5 seeds paired by seed; each read with its 95% interval, precondition.parts, Holm across D3-D4b):
  D3 (parity, Zhu et al.): uniform DyT - RMSNorm val loss at most PARITY (round 1's 0.03 nats).
  D4 (per-site alpha0 helps): per-site DyT - uniform DyT at most -PER_SITE, for each per-site arm (D4a: 1.0,
     D4b: 2.0 before attention).
  D5 (the regime claim, arXiv 2604.23434: DyT's cost grows with tokens): the uniform DyT - RMSNorm gap here minus
     round 2's at 400 steps (same init, alpha0, lr and seeds 0-2; paired by seed) at least GROWS: "confirmed";
     wholly below: "contradicted"; else "unresolved". Not in the Holm family (a different question).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

from experiments.common import precondition as pre
from experiments.common import prereg
from experiments.common.study import Runs, load, mean, table, write
from minillm.outcome import final_loss

HERE = Path(__file__).parent
# --- fixed before the runs ---------------------------------------------------------------------------------
STEPS, SEEDS = 4500, (0, 1, 2, 3, 4)
PARITY = 0.03  # nats
PER_SITE = 0.01  # nats: per-site alpha0 is better by at least this
GROWS = 0.02  # nats
ROUND2_GAP = {0: 0.105, 1: 0.061, 2: 0.071}  # round 2, init xavier, 400 steps: DyT (alpha0 0.5) - RMSNorm per seed
ARMS = ("rmsnorm", "uniform", "attn 1.0", "attn 2.0")


def arm(run: dict) -> str:
    tags = run.get("tags") or []
    return ("rmsnorm" if run.get("norm") != "dyt" else "attn 1.0" if "attn1" in tags else
            "attn 2.0" if "attn2" in tags else "uniform")


def analyze(runs: Runs, saturation: dict[str, float] | None = None) -> tuple[dict, str]:
    runs = Runs(r for r in runs if "budget" in (r.get("tags") or []) and r.get("max_steps") == STEPS)
    sat = saturation or {}
    dyt = [r for r in runs if arm(r) != "rmsnorm"]
    prereg.require(dyt, "the tanh saturation of their last checkpoint", lambda r: key(r) in sat)
    val = {a: prereg.by_seed((r for r in runs if arm(r) == a), final_loss) for a in ARMS}
    gate = pre.measure("tanh_saturation", {a: [sat[key(r)] for r in sorted(dyt, key=lambda r: r["seed"])
                                               if arm(r) == a] for a in ARMS[1:]},
                       "the last checkpoint of each DyT run, 128 val windows (saturation.json)")
    gap = prereg.diffs(val["uniform"], val["rmsnorm"])
    parts = pre.parts({"D3": (gap, PARITY, "at most"),
                       "D4a": (prereg.diffs(val["attn 1.0"], val["uniform"]), -PER_SITE, "at most"),
                       "D4b": (prereg.diffs(val["attn 2.0"], val["uniform"]), -PER_SITE, "at most")})
    texts = {"D3": ("uniform DyT - RMSNorm", ("uniform",)),
             "D4a": ("DyT attn 1.0 - uniform", ("attn 1.0", "uniform")),
             "D4b": ("DyT attn 2.0 - uniform", ("attn 2.0", "uniform"))}
    verdicts = {}
    for name, (text, arms) in texts.items():
        w, why = prereg.verdict_line(name, parts["parts"][name], text)
        verdicts[name] = (pre.gate(w, *(pre.cell(gate, a) for a in arms)), why)
    gap_by_seed = {s: v - val["rmsnorm"][s] for s, v in val["uniform"].items() if s in val["rmsnorm"]}
    growth = prereg.diffs(gap_by_seed, ROUND2_GAP)
    d5 = pre.against(growth, GROWS, "at least")
    d5_word = {"holds": "confirmed", "fails": "contradicted", "unresolved": "unresolved"}[d5["reading"]]
    verdicts["D5"] = (pre.gate(d5_word, pre.cell(gate, "uniform")),
                      f"gap growth from 1.8 to {prereg.tokens_per_parameter(STEPS, 225_417):.1f} tokens per parameter "
                      f"per seed {' / '.join(f'{g:+.3f}' for g in growth)} ({d5['reading']} against {GROWS:g})")
    rows = [[a, len(val[a]), mean(val[a].values())] for a in ARMS]
    vt = table(["hypothesis", "verdict", "numbers"], [[k, w, why] for k, (w, why) in verdicts.items()])
    md = (f"{STEPS} steps, init xavier, lr 3e-3, seed means.\n\n{table(['arm', 'runs', 'val loss'], rows)}\n\n"
          f"{pre.line(gate)}\n\n### Verdicts (rules fixed before the runs; {parts['text']} for D3-D4b)\n\n{vt}\n")
    return {"val": val, "verdicts": verdicts, "precondition": [gate], "holm": parts, "d5": d5}, md


def key(run: dict) -> str:
    return f"{arm(run).replace(' ', '')}_seed{run['seed']}"


def saturation_of(ckpt: Path) -> float:
    """precondition.tanh_saturation of a checkpoint's model over the 128 val windows of the run's setting."""
    from experiments.common import reference
    from experiments.common.precondition import tanh_saturation
    from minillm.tools.hub import load_checkpoint
    from minillm.training.data import eval_starts

    model, _, meta = load_checkpoint(ckpt)
    cfg = reference.compose("experiment=s8_dyt")
    _, val, _ = reference.tokens(cfg)
    x, _ = reference.gather(val, eval_starts(len(val), cfg.data.seq_len, cfg.data.val_windows), cfg.data.seq_len)
    return tanh_saturation(model.eval(), x)


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("sweeps", nargs="*", help="this round's sweep folders; none: the committed runs")
    p.add_argument("--out", type=Path, default=HERE)
    args = p.parse_args(argv)
    runs = load(HERE, args.sweeps, lambda k: False, args.out)
    sat_file = args.out / "saturation.json"
    if args.sweeps:
        sat = {key(r): saturation_of(Path(r["run_dir"]) / "checkpoints" / "last.ckpt")
               for r in runs if arm(r) != "rmsnorm"}
        sat_file.write_text(json.dumps(sat, indent=1) + "\n")
    sat = json.loads((sat_file if sat_file.exists() else HERE / "saturation.json").read_text())
    write(args.out, *analyze(runs, sat))


if __name__ == "__main__":
    main()
