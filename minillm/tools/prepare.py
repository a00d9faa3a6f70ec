"""Prepare the token store of a data config before training (e.g. once, before a multi-GPU or multi-node job).

    python -m minillm.tools.prepare                                   # the default: Shakespeare, char
    python -m minillm.tools.prepare data=tinystories
    python -m minillm.tools.prepare data=files data.files='[/data/books]' data.tokenizer=bpe data.vocab_size=8192

Takes the same Hydra overrides as train.py (configs/train.yaml is composed, only `data` is built), prints the
store's folder and sizes, and exits 2 with one line for a bad config or corpus. Training later finds the store.
"""

from __future__ import annotations

import json
import logging
import sys
import time


def prepare(overrides: list[str]) -> dict:
    """Compose the configs as train.py does, build cfg.data and prepare its store; a summary of the store."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.utils import instantiate

    from minillm.training.run.hydra import config_dir, config_errors

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=config_dir(), version_base="1.3"):
        cfg = compose(config_name="train", overrides=overrides)
    start = time.perf_counter()
    with config_errors():
        dm = instantiate(cfg.data)
        dm.prepare_data()
    store = dm.store
    return {"path": str(store.path), "hit": store.hit, "tokenizer": repr(store.tokenizer),
            "train_tokens": len(store.train), "val_tokens": len(store.val), "dtype": store.meta["dtype"],
            "seconds": round(time.perf_counter() - start, 3)}


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    from minillm.training.run.hydra import one_line

    try:
        summary = prepare(sys.argv[1:] if argv is None else argv)
    except Exception as err:  # a bad config or corpus, an override that names no config or key
        line = one_line(err)
        if line is None:
            raise
        print(line, file=sys.stderr)
        return 2
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
