"""Building a run (minillm/run/build.py): the validation cadence in optimizer steps."""


from __future__ import annotations

from helpers import compose_cfg, read_rows

import minillm.train as train_script


def test_validation_counts_optimizer_steps_under_gradient_accumulation(tmp_path, corpus):
    """val_check_interval=4 with 3 micro-batches per step: validations after steps 4 and 8 (Lightning alone
    counts batches and validates after steps 1, 2 and 4)."""
    cfg = compose_cfg(tmp_path, corpus, "trainer.max_steps=8", "trainer.val_check_interval=4",
                      "trainer.accumulate_grad_batches=3", "test=false")
    train_script.train(cfg)
    rows = read_rows(cfg.paths.output_dir)
    assert sorted(int(r["step"]) for r in rows if r.get("val/loss")) == [3, 7]  # step indices of steps 4 and 8
