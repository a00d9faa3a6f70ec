"""S11 round 3 (pre-registered): weight decay on DyT's alpha, where DyT trains. Round 2's DyT arm ran
round 1's setting (GPT-2's N(0, 0.02) embeddings) and never left the unigram plateau without decay (3.262 nats in
all 10 runs; S8 round 1 met the same plateau there): it could not say whether decay costs a DyT that learns. S8
round 2 found the setting where DyT trains: unit-scale embeddings (model.init=xavier), alpha0 0.5. Does decaying
alpha cost there? The rules below are committed before any run; the data commit cites this one.

Setting: round 2's (configs/experiment/s8_dyt.yaml: Pre-LN, dim 64, 4 layers, context 64, batch 16, AdamW weight
decay 0.1, warmup 40 + cosine, 1,600 steps, the last checkpoint kept), norm=dyt (alpha0 0.5), model.init=xavier;
module.decay_norms {false, true} x lr {3e-3, 1e-2} x seeds 0-4: 20 runs, from one commit.

    K='{_target_:minillm.training.callbacks.Checkpoint,dirpath:${paths.output_dir}/checkpoints,save_top_k:0,save_last:true}'
    C="trainer.enable_checkpointing=true +callbacks.last_checkpoint=$K"
    S="python train.py -m experiment=s8_dyt norm=dyt model.init=xavier trainer.max_steps=1600 \\
       optimizer.lr=3e-3,1e-2 seed=0,1,2,3,4 hydra/launcher=joblib hydra.launcher.n_jobs=2 $C"
    $S module.decay_norms=false 'tags=[decay3,dyt]' hydra.sweep.dir=logs/s11_gain_decay/multiruns/dyt_x      # 10
    $S module.decay_norms=true 'tags=[decay3,dyt,decay]' hydra.sweep.dir=logs/s11_gain_decay/multiruns/dyt_xd # 10
    python -m experiments.studies.s11_gain_decay.r3_dyt_trained.analyze logs/s11_gain_decay/multiruns/dyt_x*

Compute estimate (2-core CPU, two runs side by side): round 2's 10 DyT runs with decay took 7 minutes: ~15 min.

Measures per run: the final val loss (minillm.outcome.final_loss); the mean alpha over every DyT site of the last
checkpoint (params.json).
Preconditions (per lr; a part whose premise is absent reads "premise absent at this scale"):
  P1 (round 2's rule) decay moves alpha: its seed mean with decay / without at most SHRINKS;
  P2 DyT trains without decay: the no-decay seed-mean val loss at least TRAINS nats under the unigram loss.
Hypotheses (5 seeds, paired by seed; each read with its 95% interval; Holm across the two parts):
  H (per lr; decaying alpha costs): decay - no decay val loss at least COST.
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
from experiments.studies.s11_gain_decay.r2_lns_dyt import analyze as r2
from minillm.outcome import final_loss

HERE = Path(__file__).parent
# --- fixed before the runs ---------------------------------------------------------------------------------
LRS, SEEDS, STEPS = r2.LRS, r2.SEEDS, r2.STEPS
COST, SHRINKS = r2.COST, r2.SHRINKS  # 0.02 nats; decay leaves alpha at most 0.9x its value without it
TRAINS = 0.3  # nats under the unigram loss: round 2's plateau sat at the unigram loss, S8 round 2's DyT 1.0 under
TAG = "decay3"
key = r2.key  # "dyt_lr{lr}_{decay|nodecay}_seed{s}"


def analyze(runs: Runs, params: dict[str, float] | None = None) -> tuple[dict, str]:
    runs = Runs(r for r in runs if TAG in (r.get("tags") or []) and r2.arm(r) == "dyt" and r.get("max_steps") == STEPS)
    params = params or {}
    prereg.require(runs, "the mean alpha of their last checkpoint", lambda r: key(r) in params)
    prereg.require(runs, "the unigram loss", lambda r: r.get("unigram_loss") is not None)

    def of(lr: float, dec: bool, value) -> dict[int, float]:
        return prereg.by_seed((r for r in runs if math.isclose(r["lr"], lr) and r2.decayed(r) == dec), value)

    alpha = lambda r: params[key(r)]  # noqa: E731
    name = {lr: f"lr={lr:g}" for lr in LRS}
    unigram = mean(r["unigram_loss"] for r in runs)
    shrink = {name[lr]: (mean(of(lr, True, alpha).values()) or math.nan) /
              (mean(of(lr, False, alpha).values()) or math.nan) for lr in LRS}
    below = {name[lr]: unigram - (mean(of(lr, False, final_loss).values()) or math.nan) for lr in LRS}
    gates = [pre.reported("decay moves alpha (what exempting it avoids)", "mean DyT alpha with decay / without, "
                          "seed means", f"at most {SHRINKS:g}", {k: round(v, 3) for k, v in shrink.items()},
                          "mixed", "params.json: this round's checkpoints"),
             pre.reported("DyT trains without decay (round 2's arm sat at the unigram loss)", "unigram loss - "
                          "no-decay val loss, seed means (nats)", f"at least {TRAINS:g}",
                          {k: round(v, 3) for k, v in below.items()}, "mixed", "runs.jsonl: this round's runs")]
    for block, values, ok in ((gates[0], shrink, lambda v: v <= SHRINKS), (gates[1], below, lambda v: v >= TRAINS)):
        for k, v in values.items():
            block["cells"][k]["status"] = "present" if ok(v) else "absent"
        block["status"] = pre.overall(c["status"] for c in block["cells"].values())
    d = {lr: prereg.diffs(of(lr, True, final_loss), of(lr, False, final_loss)) for lr in LRS}
    parts = pre.parts({f"H {name[lr]}": (d[lr], COST, "at least") for lr in LRS})
    verdicts = {}
    for lr in LRS:
        w, why = prereg.verdict_line(f"H {name[lr]}", parts["parts"][f"H {name[lr]}"], "decay - no decay val loss")
        verdicts[f"H {name[lr]}"] = (pre.gate(w, *(pre.cell(g, name[lr]) for g in gates)), why)
    rows = [[lr, "decay" if dec else "no decay", mean(of(lr, dec, final_loss).values()),
             mean(of(lr, dec, alpha).values())] for lr in LRS for dec in (False, True)]
    tab = table(["lr", "alpha", "val loss", "mean DyT alpha"], rows)
    vt = table(["hypothesis", "verdict", "numbers"], [[k, w, why] for k, (w, why) in verdicts.items()])
    md = (f"{tab}\n\nUnigram loss {unigram:.3f} nats.\n\n" + "\n\n".join(pre.line(g) for g in gates) +
          f"\n\n### Verdicts (rules fixed before the runs; {parts['text']})\n\n{vt}\n")
    return {"differences": {name[lr]: v for lr, v in d.items()}, "verdicts": verdicts, "precondition": gates,
            "holm": parts, "unigram_loss": unigram}, md


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("sweeps", nargs="*", help="this round's sweep folders; none: the committed runs")
    p.add_argument("--out", type=Path, default=HERE)
    args = p.parse_args(argv)
    runs = load(HERE, args.sweeps, lambda k: False, args.out)
    params_file = args.out / "params.json"
    if args.sweeps:
        params = {key(r): r2.decayed_parameter(Path(r["run_dir"]) / "checkpoints" / "last.ckpt", "dyt")
                  for r in runs if r2.arm(r)}
        params_file.write_text(json.dumps(params, indent=1) + "\n")
    params = json.loads((params_file if params_file.exists() else HERE / "params.json").read_text())
    write(args.out, *analyze(runs, params))


if __name__ == "__main__":
    main()
