"""S11 round 1 (pre-registered): weight decay on the norm gains. Common practice (GPT-2's and LLaMA's
training code, and minillm's default module.decay_norms=false) exempts the norm gains and biases from weight decay:
decay pulls a gain toward 0, shrinking what the normalized input can carry. Zero-centered gains (stored as w - 1,
Gemma's "1 + w"; minillm's norm_options.zero_centered) make the same decay pull the gain toward 1 instead. Does
decaying the gains cost here, and do zero-centered gains remove the cost? The rules below are committed before
any run; the data commit cites this one.

Setting: configs/experiment/s8_dyt.yaml with norm=rmsnorm (Pre-LN, dim 64, 4 layers, context 64, batch 16), AdamW
weight decay 0.1, warmup 40 + cosine, 1,600 steps (7.3 tokens per parameter; 4x the studies' 400, so that decay
acts: lr x wd x the schedule's steps shrinks an undecayed-by-gradient gain by ~e^-0.25 at lr 3e-3), the last
checkpoint kept; lr {3e-3, 1e-2} x module.decay_norms {false, true} x zero_centered {false, true} x seeds 0-4.

    K='{_target_:minillm.training.callbacks.Checkpoint,dirpath:${paths.output_dir}/checkpoints,save_top_k:0,save_last:true}'
    C="trainer.enable_checkpointing=true +callbacks.last_checkpoint=$K"
    S="python train.py -m experiment=s8_dyt norm=rmsnorm trainer.max_steps=1600 optimizer.lr=3e-3,1e-2 \\
       model.norm_options.zero_centered=false,true seed=0,1,2,3,4 hydra/launcher=joblib hydra.launcher.n_jobs=2"
    $S $C module.decay_norms=false 'tags=[gains]' hydra.sweep.dir=logs/s11_gain_decay/multiruns/no_decay   # 20 runs
    $S $C module.decay_norms=true 'tags=[gains,decay]' hydra.sweep.dir=logs/s11_gain_decay/multiruns/decay # 20 runs
    python -m experiments.studies.s11_gain_decay.r1_prereg.analyze logs/s11_gain_decay/multiruns/*

Compute estimate (2-core CPU, two runs side by side): 40 runs of 1.6M tokens at ~20,000 tokens/s each (S3's RMSNorm
runs at this size), 20 pairs of ~80 s: ~30 min, plus a minute for the gains of 40 checkpoints.

Measures per run: the final val loss (minillm.outcome.final_loss); the effective gain RMS = the RMS over every norm of
the model of its effective gain (the stored weight, plus 1 when zero-centered), from the last checkpoint (gains.json).
Precondition (fixed before the runs): decay moves the standard gains: at each lr, the seed-mean effective gain RMS
with decay / without (zero_centered false) at most SHRINKS; reported per lr; G1 and G2 at an lr where it is absent
read "premise absent at this scale".
Hypotheses (5 seeds, paired by seed; each read with its 95% interval):
  G1 (decaying standard gains costs), per lr: decay - no decay val loss (zero_centered false) at least COST; Holm
     across the two lrs.
  G2 (zero-centered gains make it harmless), per lr: decay - no decay (zero_centered true) within +-COST (both
     one-sided readings hold: confirmed; either fails: not at this scale; else unresolved).
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
from minillm.outcome import final_loss

HERE = Path(__file__).parent
# --- fixed before the runs ---------------------------------------------------------------------------------
LRS, SEEDS, STEPS = (3e-3, 1e-2), (0, 1, 2, 3, 4), 1600
COST = 0.02  # nats
SHRINKS = 0.9  # decay leaves the standard gains at most 0.9x their RMS without it


def decayed(run: dict) -> bool:
    return "decay" in (run.get("tags") or [])


def centered(run: dict) -> bool:
    return bool((run.get("norm_options") or {}).get("zero_centered"))


def key(run: dict) -> str:
    arm = f"{'decay' if decayed(run) else 'nodecay'}_{'zc' if centered(run) else 'std'}"
    return f"lr{run['lr']:g}_{arm}_seed{run['seed']}"


def analyze(runs: Runs, gains: dict[str, float] | None = None) -> tuple[dict, str]:
    runs = Runs(r for r in runs if "gains" in (r.get("tags") or []) and r.get("max_steps") == STEPS)
    gains = gains or {}
    prereg.require(runs, "the effective gain RMS of their last checkpoint", lambda r: key(r) in gains)

    def of(lr: float, dec: bool, zc: bool, value) -> dict[int, float]:
        return prereg.by_seed((r for r in runs if math.isclose(r["lr"], lr) and decayed(r) == dec and
                               centered(r) == zc), value)

    gain = lambda r: gains[key(r)]  # noqa: E731
    shrink = {f"lr={lr:g}": (mean(of(lr, True, False, gain).values()) or math.nan) /
              (mean(of(lr, False, False, gain).values()) or math.nan) for lr in LRS}
    gate = pre.reported("decay moves the norm gains (what exempting them avoids)", "effective gain RMS with decay / "
                        "without, standard gains, seed means", f"at most {SHRINKS:g}",
                        {k: round(v, 3) for k, v in shrink.items()}, "mixed", "gains.json: this round's checkpoints")
    for k, v in shrink.items():
        gate["cells"][k]["status"] = "present" if v <= SHRINKS else "absent"
    gate["status"] = pre.overall(c["status"] for c in gate["cells"].values())
    d = {(lr, zc): prereg.diffs(of(lr, True, zc, final_loss), of(lr, False, zc, final_loss))
         for lr in LRS for zc in (False, True)}
    parts = pre.parts({f"G1 lr={lr:g}": (d[lr, False], COST, "at least") for lr in LRS})
    verdicts = {}
    for lr in LRS:
        name = f"G1 lr={lr:g}"
        w, why = prereg.verdict_line(name, parts["parts"][name], "decay - no decay, standard gains")
        verdicts[name] = (pre.gate(w, pre.cell(gate, f"lr={lr:g}")), why)
    for lr in LRS:
        high, low = pre.against(d[lr, True], COST, "at most"), pre.against(d[lr, True], -COST, "at least")
        w = ("confirmed" if high["reading"] == low["reading"] == "holds" else
             "not at this scale" if "fails" in (high["reading"], low["reading"]) else "unresolved")
        verdicts[f"G2 lr={lr:g}"] = (pre.gate(w, pre.cell(gate, f"lr={lr:g}")),
                                     f"decay - no decay, zero-centered gains, seed mean {high['mean']:+.3f}, 95% CI "
                                     f"[{high['ci_low']:+.3f}, {high['ci_high']:+.3f}] against +-{COST:g}")
    rows = [[lr, "decay" if dec else "no decay", "zero-centered" if zc else "standard",
             mean(of(lr, dec, zc, final_loss).values()), mean(of(lr, dec, zc, gain).values())]
            for lr in LRS for zc in (False, True) for dec in (False, True)]
    tab = table(["lr", "gains", "gain storage", "val loss", "effective gain RMS"], rows)
    vt = table(["hypothesis", "verdict", "numbers"], [[k, w, why] for k, (w, why) in verdicts.items()])
    md = f"{tab}\n\n{pre.line(gate)}\n\n### Verdicts (rules fixed before the runs; G1: {parts['text']})\n\n{vt}\n"
    return {"differences": {f"{lr:g}/{'zc' if zc else 'std'}": v for (lr, zc), v in d.items()},
            "verdicts": verdicts, "precondition": [gate], "holm": parts}, md


def effective_gain_rms(ckpt: Path) -> float:
    """RMS over every norm's effective gain (its weight, plus 1 when stored zero-centered) of a checkpoint's model."""
    from minillm.tools.hub import load_checkpoint

    return gain_rms(load_checkpoint(ckpt)[0])


def gain_rms(model) -> float:
    """effective_gain_rms of a model."""
    values = []
    for m in model.modules():
        w = getattr(m, "weight", None)
        if w is not None and w.ndim == 1 and hasattr(m, "zero_centered"):
            values.append((w.detach().float() + (1.0 if m.zero_centered else 0.0)).pow(2).mean())
    return float(sum(values) / len(values)) ** 0.5


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("sweeps", nargs="*", help="this round's sweep folders; none: the committed runs")
    p.add_argument("--out", type=Path, default=HERE)
    args = p.parse_args(argv)
    runs = load(HERE, args.sweeps, lambda k: False, args.out)
    gains_file = args.out / "gains.json"
    if args.sweeps:
        gains = {key(r): effective_gain_rms(Path(r["run_dir"]) / "checkpoints" / "last.ckpt") for r in runs}
        gains_file.write_text(json.dumps(gains, indent=1) + "\n")
    gains = json.loads((gains_file if gains_file.exists() else HERE / "gains.json").read_text())
    write(args.out, *analyze(runs, gains))


if __name__ == "__main__":
    main()
