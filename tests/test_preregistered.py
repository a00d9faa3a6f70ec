"""The rounds pre-registered and not yet run (PREREGISTERED) say so, and the helpers of a pre-registration
(experiments/common/prereg.py). Each round's rules are tested on made-up runs in its folder (test_rules.py): the
words its rules say for runs made to confirm a claim, to contradict it and to lack its premise."""

from __future__ import annotations

import json

import pytest

from experiments.common import prereg
from experiments.common.layout import STUDIES, analyses

PREREGISTERED: tuple[str, ...] = ("s7_depth/r7_own_lr", "s12_mup_transfer/r3_fine_grid")


def test_preregistered_rounds_say_so_and_are_not_analyses_yet():
    """The rounds whose finding.json says "pre-registered, not yet run" are exactly PREREGISTERED (a round run since
    leaves the list with its data commit); each has its analyze.py and no committed runs (so the slow regenerate
    test does not look for results that cannot exist yet)."""
    saying_so = {str(v.parent.relative_to(STUDIES)) for v in STUDIES.glob("*/*/finding.json")
                 if json.loads(v.read_text())["finding"].startswith(f"**{prereg.NOT_RUN}**")}
    assert saying_so == set(PREREGISTERED)
    found = {str(r.relative_to(STUDIES)) for r in analyses()}
    for name in PREREGISTERED:
        folder = STUDIES / name
        assert json.loads((folder / "finding.json").read_text())["finding"].startswith(f"**{prereg.NOT_RUN}**")
        assert (folder / "analyze.py").exists() and name not in found


def test_rounds_that_ran_do_not_say_not_yet_run():
    """A round with committed runs says nothing of not having run in its analysis's docstring (the --help text its
    users read): the data commit drops the status there as it does in finding.json."""
    stale = [str(r.relative_to(STUDIES)) for r in analyses()
             if prereg.NOT_RUN in (r / "analyze.py").read_text().split('"""')[1]]
    assert not stale


def test_prereg_helpers():
    assert prereg.steps_for(20, 341_424) == 6700
    assert prereg.tokens_per_parameter(6700, 341_424) == pytest.approx(20.1, abs=0.05)
    est = prereg.estimate(15, 6.9e6, 7000, extra_s=900)
    assert est["hours"] == pytest.approx((8 * 6.9e6 / 7000 + 900) / 3600)
    assert prereg.diffs({0: 2.0, 1: 2.1, 2: 5.0}, {0: 1.0, 1: 1.0}) == pytest.approx([1.0, 1.1])
    with pytest.raises(SystemExit, match="lack the metric"):
        prereg.require([{"seed": 0}], "the metric", lambda r: "x" in r)
