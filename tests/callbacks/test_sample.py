"""TextSample (minillm/training/callbacks/sample.py): the prompt on a user's own corpus."""


from __future__ import annotations

import warnings
from pathlib import Path

from helpers import compose_cfg

import minillm.training.train as train_script


def test_samples_of_a_users_corpus_start_from_its_own_text(tmp_path, corpus):
    """data=files: the prompt is the held-out split's first line, which the corpus's tokenizer can encode."""
    cfg = compose_cfg(tmp_path, corpus, "callbacks=default", "logger=csv", "test=false")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        train_script.train(cfg)
    assert not [w for w in caught if "outside the vocabulary" in str(w.message)]
    text = (Path(cfg.paths.output_dir) / "samples.txt").read_text()
    first = text.split("\n")[1]
    assert len(first) > 8 and first[:8] in corpus.read_text()  # the sample starts with the corpus's own text
