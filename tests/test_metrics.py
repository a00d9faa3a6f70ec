"""The names minillm logs (minillm/metrics.py): defined once, documented, parsed back."""

from __future__ import annotations

from helpers import ROOT

from minillm import metrics


def test_every_logged_name_is_documented():
    """Each name of metrics.py appears in docs/definitions.md, which says what it measures."""
    doc = (ROOT / "docs" / "definitions.md").read_text()
    names = [v for k, v in vars(metrics).items() if k.isupper() and isinstance(v, str) and "/" in v]
    assert len(names) > 25
    assert [n for n in names if n not in doc] == []
    for kind in ("layer/<i>/", "norm/<site>/"):
        assert kind in doc


def test_names_are_namespaced_and_parsed_back():
    assert metrics.eval_metric("val", "bpb") == metrics.VAL_BPB == "val/bpb"
    assert metrics.parse_metric(metrics.layer_metric(3, "grad_norm")) == ("layer", "3", "grad_norm")
    assert metrics.parse_metric(metrics.norm_metric("layers.0.attn_norm", "in_rms")) == (
        "norm", "layers.0.attn_norm", "in_rms")
    assert metrics.parse_metric(metrics.TRAIN_LOSS) is None


def test_tokens_seen_counts_every_process_and_micro_batch():
    assert metrics.tokens_seen(10, 32 * 64, world_size=2, accumulate=3) == 10 * 32 * 64 * 2 * 3
