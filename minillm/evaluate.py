"""Evaluate a checkpoint on the held-out split of a dataset: loss (nats/token), perplexity, bits per char/byte.

    minillm-eval CKPT [data overrides ...] [--json FILE]
    python -m minillm.evaluate logs/default/runs/<id>/checkpoints/last.ckpt
    python -m minillm.evaluate CKPT data=files 'data.files=[/path/book.txt]'

The data config is the run's (its .hydra/overrides.yaml when the checkpoint sits in a run folder) with the
overrides given here on top; the held-out split is evaluated whole, as train.py's test pass does, so for the
run's own data the numbers are the run's test/* numbers. The tokenizer must be the checkpoint's (a char
vocabulary built from another corpus is refused). Bad input: one line on stderr, exit code 2.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import warnings
from pathlib import Path

import lightning as L
import yaml
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.utils import instantiate

from minillm.checkpointing import check_model_config, read_checkpoint_header
from minillm.lit_module import LitLM
from minillm.run.hydra import config_dir, config_errors, one_line


def run_overrides(ckpt: Path) -> list[str]:
    """The command-line overrides of the run that wrote ckpt (<run>/checkpoints/<ckpt> -> <run>/.hydra)."""
    path = ckpt.parent.parent / ".hydra" / "overrides.yaml"
    if ckpt.parent.name != "checkpoints" or not path.is_file():
        return []
    keep = ("data", "model", "norm", "placement", "seed")  # what decides the data and the model
    return [o for o in yaml.safe_load(path.read_text()) or [] if o.lstrip("+~").startswith(keep)]


def evaluate(ckpt: str | Path, overrides: list[str] = ()) -> dict[str, float]:
    """test/loss, test/ppl, test/bpc (or bpb) of the checkpoint's weights on the held-out split."""
    ckpt = Path(ckpt)
    header = read_checkpoint_header(ckpt)
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=config_dir(), version_base="1.3"):
        cfg = compose("train", overrides=[*run_overrides(ckpt), *overrides])
    with config_errors():
        datamodule = instantiate(cfg.data)
        datamodule.prepare_data()
        datamodule.setup("test")
        datamodule.load_state_dict(header.get(type(datamodule).__qualname__) or {})  # the checkpoint's tokenizer
        saved = (header.get("hyper_parameters") or {}).get("model")
        check_model_config(saved, {**saved, "vocab_size": datamodule.vocab_size}, f"checkpoint {str(ckpt)!r}")
    module = LitLM(saved)
    trainer = L.Trainer(accelerator="auto", devices=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False)
    trainer.test(module, datamodule=datamodule, ckpt_path=str(ckpt), verbose=False)
    return {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("test/")}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="minillm-eval", description=__doc__.split("\n")[0])
    parser.add_argument("ckpt", type=Path, help="a checkpoint written by train.py")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides of the data config, e.g. data=files")
    parser.add_argument("--json", type=Path, default=None, help="also write the metrics to this JSON file")
    args = parser.parse_args(argv)
    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)  # no banner around the numbers
    warnings.filterwarnings("ignore", message=r".*callbacks used to create the checkpoint.*")
    try:
        metrics = evaluate(args.ckpt, args.overrides)
    except Exception as err:  # a bad checkpoint, data or override: one line as the other tools print it
        line = one_line(err)
        if line is None:
            raise
        print(f"{parser.prog}: error: {line}", file=sys.stderr)
        raise SystemExit(2) from None
    for key, value in sorted(metrics.items()):
        print(f"{key} {value:.6f}")
    if args.json:
        args.json.write_text(json.dumps(metrics, indent=1) + "\n")


if __name__ == "__main__":
    main()
