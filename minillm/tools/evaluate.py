"""Evaluate a checkpoint on the held-out split of a dataset: loss (nats/token), perplexity, bits per char/byte; or
on multiple-choice task files: accuracy with its exact binomial interval, and bits per byte of the right answers.

    minillm-eval CKPT [data overrides ...] [--json FILE]
    python -m minillm.tools.evaluate logs/default/runs/<id>/checkpoints/last.ckpt
    python -m minillm.tools.evaluate CKPT data=files 'data.files=[/path/book.txt]'
    minillm-eval CKPT --tasks my_task.jsonl [more.jsonl ...]    # minillm.tools.scoring: the file format

The data config is the run's (its .hydra/overrides.yaml when the checkpoint sits in a run folder) with the
overrides given here on top; the held-out split is evaluated whole, as train.py's test pass does, so for the
run's own data the numbers are the run's test/* numbers. The tokenizer must be the checkpoint's (a char
vocabulary built from another corpus is refused). Bad input: one line on stderr, exit code 2.
"""

from __future__ import annotations

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

from minillm.errors import ArgumentParser
from minillm.training.checkpointing import check_model_config, read_checkpoint_header
from minillm.training.lit_module import LitLM
from minillm.training.run.hydra import config_dir, config_errors, one_line


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
    header = read_checkpoint_header(ckpt, field="CKPT")
    saved = (header.get("hyper_parameters") or {}).get("model")
    check_model_config(saved, saved or {}, f"checkpoint {str(ckpt)!r}")  # a checkpoint of another model: before data
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=config_dir(), version_base="1.3"):
        cfg = compose("train", overrides=[*run_overrides(ckpt), *overrides])
    with config_errors():
        datamodule = instantiate(cfg.data)
        datamodule.prepare_data()
        datamodule.setup("test")
        datamodule.load_state_dict(header.get(type(datamodule).__qualname__) or {})  # the checkpoint's tokenizer
        check_model_config(saved, {**saved, "vocab_size": datamodule.vocab_size}, f"checkpoint {str(ckpt)!r}")
    module = LitLM(saved)
    trainer = L.Trainer(accelerator="auto", devices=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False)
    trainer.test(module, datamodule=datamodule, ckpt_path=str(ckpt), verbose=False)
    return {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("test/")}


def evaluate_tasks(ckpt: str | Path, tasks: list[Path], batch_size: int = 16, device: str = "cpu") -> dict:
    """Per task file (by its stem): n, acc, acc_low, acc_high (95% Clopper-Pearson), acc_norm, chance, bpb."""
    from minillm.tools.hub import load_checkpoint
    from minillm.tools.scoring import Scorer, multiple_choice, read_task

    items = {Path(t).stem: read_task(t) for t in tasks}  # every file checked before the model is loaded
    model, tokenizer, _ = load_checkpoint(ckpt, device=device)
    scorer = Scorer(model, tokenizer, batch_size, device)
    return {name: multiple_choice(scorer, task) for name, task in items.items()}


def main(argv: list[str] | None = None) -> None:
    parser = ArgumentParser(prog="minillm-eval", description=__doc__.split("\n")[0])
    parser.add_argument("ckpt", type=Path, help="a checkpoint written by train.py (or minillm-import)")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides of the data config, e.g. data=files")
    parser.add_argument("--json", type=Path, default=None, help="also write the metrics to this JSON file")
    parser.add_argument("--tasks", type=Path, nargs="+", default=None, help="multiple-choice task files (JSONL: "
                        '{"context", "choices", "answer"} per line) instead of the held-out split')
    parser.add_argument("--batch-size", type=int, default=16, help="--tasks: sequences per forward")
    parser.add_argument("--device", default="cpu", help="--tasks: cpu, cuda, ...")
    args = parser.parse_args(argv)
    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)  # no banner around the numbers
    warnings.filterwarnings("ignore", message=r".*callbacks used to create the checkpoint.*")
    if args.tasks is not None:
        if args.overrides:
            parser.error(f"--tasks scores task files: data overrides ({' '.join(args.overrides)}) are not used")
        try:
            results = evaluate_tasks(args.ckpt, args.tasks, args.batch_size, args.device)
        except ValueError as err:  # a bad task file or checkpoint (CheckpointError is a ValueError)
            parser.exit(2, f"{parser.prog}: error: {err}\n")
        for name, r in results.items():
            print(f"{name}: acc {r['acc']:.4f} (95% CI {r['acc_low']:.4f}-{r['acc_high']:.4f}, n {r['n']}, chance "
                  f"{r['chance']:.4f}), acc_norm {r['acc_norm']:.4f}, bpb {r['bpb']:.4f} (bits per byte of the "
                  "right answers)")
        if args.json:
            args.json.write_text(json.dumps(results, indent=1) + "\n")
        return
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


def lm_eval_main(argv: list[str] | None = None) -> int:
    """minillm-lm-eval: lm-evaluation-harness's command line with the model ``minillm`` registered
    (minillm.tools.harness); one line when lm-eval is not installed."""
    try:
        import lm_eval  # noqa: F401
    except ImportError:
        print("minillm-lm-eval: error: lm-eval is not installed; allowed: pip install 'minillm[eval]' (or "
              "pip install lm-eval), or minillm-eval CKPT --tasks FILE.jsonl without it", file=sys.stderr)
        return 2
    from minillm.tools.harness import main as harness_main

    return harness_main(argv)
