"""The words of verdicts.md under rules version 3 (minillm.analysis.verdict_files writes the file): the sentence's
failure word, shares and what an undecided arm needs, the family the words keep alpha over, and what the words
mean. Reports made by the rules of version 2 keep their words (verdict_files)."""

from __future__ import annotations

from minillm.analysis import family
from minillm.analysis.stats import PLAN_POWER


def p_text(value: float | None) -> str:
    return "-" if value is None else f"{value:.2g}"


def v2(result: dict) -> bool:
    """Made by the rules of version 2 or before (the words of those reports stay as they were)."""
    return result.get("version", 2) < 3


def sentence_v3(c: dict, result: dict, text: str) -> str:
    """sentence()'s rest under rules version 3: the failure word, the shares, what an undecided arm needs."""
    counts = (f"{c['fail_arm']} of {c['n_arm']} runs against {c['fail_baseline']} of {c['n_baseline']}, Boschloo p "
              f"{p_text(c['failure_p'])}" + ("" if result.get("family", 1) == 1 else
                                         f", adjusted {p_text(c['failure_p_adjusted'])}"))
    failed = {"penalize": ", each counted at ln V", "drop": ", left out of the difference"}.get(
        result["failures_rule"], ", left out of the difference")
    if c["failure_verdict"] in family.FAILURE_WORDS[:2]:
        text += f"; **it {c['failure_verdict']}** ({counts}{failed})"
    elif c["fail_arm"] or c["fail_baseline"]:
        text += f"; failures: no difference shown ({counts}{failed})"
    if c.get("diff_trained") is not None and c["trained_pairs"] < (c["n_pairs"] or 0):
        text += f"; among the {c['trained_pairs']} pairs that trained the difference is {c['diff_trained']:+.4f}"
    if c.get("share_better") is not None:
        text += (f"; share of {'pairs' if c['paired_by'] == 'seed' else 'run pairs'} better "
                 f"{100 * c['share_better']:.0f}%")
    pi = c.get("prob_improvement")
    if pi is not None:
        text += (f"; probability of improvement (an arm run beats a baseline run) {pi['value']:.2f} "
                 f"[{pi['ci_low']:.2f}, {pi['ci_high']:.2f}]")
    if c["verdict"] == "inconclusive" and not c.get("no_spread"):
        text += f"; more seeds are needed to decide at the fixed margin ±{result['margin']:g}"
        if c["seeds_needed"]:
            text += f" (about {c['seeds_needed']} pairs for {100 * PLAN_POWER:.0f}% power)"
    if c.get("seeds_needed_failures"):
        text += f"; about {c['seeds_needed_failures']} runs per arm would tell the failure rates apart"
    if not c["informative"]:
        text += " (not informative: see the warnings)"
    return text + "."


def family_text(result: dict) -> str:
    """Rules version 3: the one family of the report's words, and its size."""
    fam, kinds = result.get("family", 1), result.get("family_tests", {})
    if result.get("adjust") == "none":
        return "The words are read at alpha for each test alone (--no-adjust)."
    if fam <= 1:
        return "One test: its word at alpha." if fam == 1 else "No test could be made: no word."
    parts = [f"{kinds[k]} {name}{'s' if kinds[k] > 1 else ''}" for k, name in (
        ("loss", "loss comparison"), ("failures", "failure count"), ("stability", "stability measure")) if kinds.get(k)]
    return (f"Every word of the report (loss, failures{', stability' if 'stability_verdict' in result else ''}) "
            f"keeps the family-wise error at {result['alpha']:g} over one family of {fam} tests"
            + (f" ({', '.join(parts)})" if parts else "") + ": one step-down over the tests of no difference and "
            "of equivalence.")


MEANING_V3 = [
    "- **p (adjusted)**: the test of no difference after the report's one family-wise adjustment; the interval shown "
    "is the unadjusted 1 - alpha one. **seeds needed**: for an inconclusive arm, the pairs a new sweep needs to "
    f"decide at the same margin with {100 * PLAN_POWER:.0f}% power both ways (equivalence if the arms are equal, a "
    "difference if they differ by the margin), from the spread of the pairs that trained at its upper 80% "
    "confidence bound; never from the observed difference (a planning number, not a promise). **share of pairs "
    "better**: the share of seed pairs in which the arm is better (ties half); **probability of improvement**: "
    "rliable's, the chance that an arm run beats a baseline run over all run pairs (ties half), with its percentile "
    "bootstrap interval. **lr chosen**: the data the lr was chosen on; the held-out test split contains the "
    "validation windows, so an lr chosen on the validation loss is chosen on the runs that are judged."]


def failure_cell(c: dict) -> str:
    word = f", **{c['failure_verdict']}**" if c.get("failure_verdict") in family.FAILURE_WORDS[:2] else ""
    return (f"{c['fail_arm']}/{c['n_arm']} / {c['fail_baseline']}/{c['n_baseline']}, {p_text(c['failure_p'])} "
            f"({p_text(c['failure_p_adjusted'])}){word}")
