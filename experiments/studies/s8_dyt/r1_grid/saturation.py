"""S8's precondition, measured where it can be: the fraction of DyT's inputs outside tanh's linear range
(experiments.common.precondition, premise tanh_saturation: |alpha x| >= 1) in the models of rounds 1 and 2 at
initialization, before any step, on the 128 val windows the runs validate on. The runs themselves logged no DyT
input statistics, so the fraction during and after training is not known; at init it is a function of the init
scheme, alpha0 and the seed alone (the model is built as train.py builds it: configs/experiment/s8_dyt.yaml).

    python -m experiments.studies.s8_dyt.r1_grid.saturation     # writes saturation_at_init.json here (~1 min)

Both rounds' analyses read the committed JSON.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

HERE = Path(__file__).parent
FILE = HERE / "saturation_at_init.json"
# the DyT cells of round 1 (GPT-2 init, alpha0 0.25-2), round 2's smaller alpha0 and its xavier arm
CELLS = {"gpt2": (0.05, 0.1, 0.25, 0.5, 1.0, 2.0), "xavier": (0.1, 0.25, 0.5, 1.0)}
SEEDS = (0, 1, 2)


def key(init: str, a0: float) -> str:
    return f"{init}/{a0:g}"


def measure() -> dict:
    import torch

    from experiments.common import reference
    from experiments.common.precondition import tanh_saturation
    from minillm.training.data import eval_starts

    out = {}
    for init, alphas in CELLS.items():
        for a0 in alphas:
            cfg = reference.compose("experiment=s8_dyt", f"model.norm_options.alpha0={a0}",
                                    *(["model.init=xavier"] if init == "xavier" else []))
            _, val, vocab = reference.tokens(cfg)
            starts = eval_starts(len(val), cfg.data.seq_len, cfg.data.val_windows)
            x, _ = reference.gather(val, starts, cfg.data.seq_len)
            values = []
            for seed in SEEDS:
                torch.manual_seed(seed)
                model, _, _ = reference.build(cfg, vocab)
                values.append(tanh_saturation(model.eval(), x))
            out[key(init, a0)] = values
    return out


def load() -> dict[str, list[float]]:
    return json.loads(FILE.read_text())


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=FILE)
    args = p.parse_args(argv)
    result = measure()
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    for k, v in result.items():
        print(k, " / ".join(f"{x:.4f}" for x in v))


if __name__ == "__main__":
    main()
