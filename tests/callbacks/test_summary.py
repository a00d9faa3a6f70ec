"""RunSummary (minillm/callbacks/summary.py): a crashed run's summary."""


from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from helpers import compose_cfg

import minillm.train as train_script


def test_a_crashed_run_is_failed_in_its_summary_even_with_a_good_validation(tmp_path, corpus):
    cfg = compose_cfg(tmp_path, corpus, "trainer.max_steps=8", "trainer.val_check_interval=2",
                      "+callbacks.crash={_target_:helpers.CrashAt,at_step:3}")
    with pytest.raises(RuntimeError, match="simulated crash"):
        train_script.train(cfg)
    summary = json.loads((Path(cfg.paths.output_dir) / "summary.json").read_text())
    assert summary["status"] == "failed" and "simulated crash" in summary["error"]
    assert summary["diverged"] is False and math.isfinite(summary["final_val_loss"])  # a validation at step 2
    assert summary["failed"] is True  # so no analysis counts its partial loss as a result
