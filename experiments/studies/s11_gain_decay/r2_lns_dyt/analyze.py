"""S11 round 2 (pre-registered): weight decay on the norm parameters of LayerNorm Scaling and of DyT.
Round 1 found decay harmless on standard RMSNorm gains (within the 0.02-nat margin) although it shrank them to
0.62-0.81x. Two norms could depend on those parameters more: LayerNorm Scaling multiplies the input norm of layer
l by 1/sqrt(l), so decay shrinks what is already scaled down; DyT's tanh(alpha x) has one scalar alpha per site
that sets how much of the input the tanh keeps linear, and decay pulls it toward 0. Does decay cost there? The rules
below are committed before any run; the data commit cites this one.

Setting: round 1's (configs/experiment/s8_dyt.yaml: Pre-LN, dim 64, 4 layers, context 64, batch 16, AdamW weight
decay 0.1, warmup 40 + cosine, 1,600 steps, the last checkpoint kept), with two arms: "lns" (norm=rmsnorm,
model.layernorm_scaling=true) and "dyt" (norm=dyt, S8's default alpha0 0.5); module.decay_norms {false, true} x lr
{3e-3, 1e-2} x seeds 0-4: 40 runs, from one commit.

    K='{_target_:minillm.training.callbacks.Checkpoint,dirpath:${paths.output_dir}/checkpoints,save_top_k:0,save_last:true}'
    C="trainer.enable_checkpointing=true +callbacks.last_checkpoint=$K"
    S="python train.py -m experiment=s8_dyt trainer.max_steps=1600 optimizer.lr=3e-3,1e-2 seed=0,1,2,3,4 \\
       hydra/launcher=joblib hydra.launcher.n_jobs=2 $C"
    L="norm=rmsnorm model.layernorm_scaling=true"
    $S $L module.decay_norms=false 'tags=[decay2,lns]' hydra.sweep.dir=logs/s11_gain_decay/multiruns/lns       # 10
    $S $L module.decay_norms=true 'tags=[decay2,lns,decay]' hydra.sweep.dir=logs/s11_gain_decay/multiruns/lns_d # 10
    $S norm=dyt module.decay_norms=false 'tags=[decay2,dyt]' hydra.sweep.dir=logs/s11_gain_decay/multiruns/dyt  # 10
    $S norm=dyt module.decay_norms=true 'tags=[decay2,dyt,decay]' hydra.sweep.dir=logs/s11_gain_decay/multiruns/dyt_d
    python -m experiments.studies.s11_gain_decay.r2_lns_dyt.analyze logs/s11_gain_decay/multiruns/{lns,dyt}*

Compute estimate (2-core CPU, two runs side by side): round 1's 40 runs of the same size took 21 minutes; ~25 min,
plus a minute for the parameters of 40 checkpoints.

Measures per run: the final val loss (minillm.outcome.final_loss); from the last checkpoint (params.json), the
decayed parameter: "lns", the effective gain RMS over every norm (round 1's measure); "dyt", the mean alpha over
every DyT site.
Precondition (per arm and lr, round 1's rule): decay moves the parameter: its seed mean with decay / without at
most SHRINKS; where absent, that arm and lr read "premise absent at this scale".
Hypotheses (5 seeds, paired by seed; each read with its 95% interval; Holm across the four parts):
  H (per arm and lr; decaying the parameter costs): decay - no decay val loss at least COST.
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
from experiments.studies.s11_gain_decay.r1_prereg import analyze as r1
from minillm.outcome import final_loss

HERE = Path(__file__).parent
# --- fixed before the runs ---------------------------------------------------------------------------------
ARMS, LRS, SEEDS, STEPS = ("lns", "dyt"), r1.LRS, r1.SEEDS, r1.STEPS
COST, SHRINKS = r1.COST, r1.SHRINKS  # 0.02 nats; decay leaves the parameter at most 0.9x its value without it
WHAT = {"lns": "effective gain RMS", "dyt": "mean DyT alpha"}


def arm(run: dict) -> str | None:
    tags = run.get("tags") or []
    return next((a for a in ARMS if a in tags), None)


def decayed(run: dict) -> bool:
    """module.decay_norms, as the sweep's tag records it (summary.json does not carry the flag)."""
    return "decay" in (run.get("tags") or [])


def key(run: dict) -> str:
    return f"{arm(run)}_lr{run['lr']:g}_{'decay' if decayed(run) else 'nodecay'}_seed{run['seed']}"


def analyze(runs: Runs, params: dict[str, float] | None = None) -> tuple[dict, str]:
    runs = Runs(r for r in runs if "decay2" in (r.get("tags") or []) and arm(r) and r.get("max_steps") == STEPS)
    params = params or {}
    prereg.require(runs, "the decayed parameter of their last checkpoint", lambda r: key(r) in params)

    def of(a: str, lr: float, dec: bool, value) -> dict[int, float]:
        return prereg.by_seed((r for r in runs if arm(r) == a and math.isclose(r["lr"], lr) and decayed(r) == dec),
                              value)

    param = lambda r: params[key(r)]  # noqa: E731
    cells = [(a, lr) for a in ARMS for lr in LRS]
    name = {c: f"{c[0]} lr={c[1]:g}" for c in cells}
    shrink = {name[a, lr]: (mean(of(a, lr, True, param).values()) or math.nan) /
              (mean(of(a, lr, False, param).values()) or math.nan) for a, lr in cells}
    gate = pre.reported("decay moves the norm parameters (what exempting them avoids)", "the decayed parameter "
                        f"({WHAT['lns']} for lns, {WHAT['dyt']} for dyt) with decay / without, seed means",
                        f"at most {SHRINKS:g}", {k: round(v, 3) for k, v in shrink.items()}, "mixed",
                        "params.json: this round's checkpoints")
    for k, v in shrink.items():
        gate["cells"][k]["status"] = "present" if v <= SHRINKS else "absent"
    gate["status"] = pre.overall(c["status"] for c in gate["cells"].values())
    d = {c: prereg.diffs(of(*c, True, final_loss), of(*c, False, final_loss)) for c in cells}
    parts = pre.parts({f"H {name[c]}": (d[c], COST, "at least") for c in cells})
    verdicts = {}
    for c in cells:
        w, why = prereg.verdict_line(f"H {name[c]}", parts["parts"][f"H {name[c]}"], "decay - no decay val loss")
        verdicts[f"H {name[c]}"] = (pre.gate(w, pre.cell(gate, name[c])), why)
    rows = [[a, lr, "decay" if dec else "no decay", mean(of(a, lr, dec, final_loss).values()),
             mean(of(a, lr, dec, param).values()), WHAT[a]] for a, lr in cells for dec in (False, True)]
    tab = table(["arm", "lr", "norm parameters", "val loss", "decayed parameter", "which"], rows)
    vt = table(["hypothesis", "verdict", "numbers"], [[k, w, why] for k, (w, why) in verdicts.items()])
    md = f"{tab}\n\n{pre.line(gate)}\n\n### Verdicts (rules fixed before the runs; {parts['text']})\n\n{vt}\n"
    return {"differences": {name[c]: v for c, v in d.items()}, "verdicts": verdicts, "precondition": [gate],
            "holm": parts}, md


def dyt_alpha(model) -> float:
    """Mean alpha over the DyT sites of a model."""
    alphas = [float(m.alpha.detach().float().mean()) for m in model.modules() if type(m).__name__ == "DyT"]
    return sum(alphas) / len(alphas)


def decayed_parameter(ckpt: Path, run_arm: str) -> float:
    from minillm.tools.hub import load_checkpoint

    model = load_checkpoint(ckpt)[0]
    return r1.gain_rms(model) if run_arm == "lns" else dyt_alpha(model)


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("sweeps", nargs="*", help="this round's sweep folders; none: the committed runs")
    p.add_argument("--out", type=Path, default=HERE)
    args = p.parse_args(argv)
    runs = load(HERE, args.sweeps, lambda k: False, args.out)
    params_file = args.out / "params.json"
    if args.sweeps:
        params = {key(r): decayed_parameter(Path(r["run_dir"]) / "checkpoints" / "last.ckpt", arm(r)) for r in runs
                  if arm(r)}
        params_file.write_text(json.dumps(params, indent=1) + "\n")
    params = json.loads((params_file if params_file.exists() else HERE / "params.json").read_text())
    write(args.out, *analyze(runs, params))


if __name__ == "__main__":
    main()
