"""One family per report (rules version 3): every word of a report from one step-down, so that the chance of any false
word in it, loss, failure or stability, stays at most alpha.

The family holds, for each comparison, its loss tests (no difference; not equivalent), the exact test of its failure
counts (minillm.analysis.exact.failure_test: Boschloo's; a word of its own, "fails more often" or "fails less
often"), and with ``--stability`` the tests of each stability measure (minillm.analysis.lr_curves). They are adjusted
together by minillm.analysis.stats.step_down; a test that cannot be made (no failure in either arm; a spread that
does not vary) stays out, and the family's size is the number of comparisons with a test in it.

    assign(comparisons, stable, rules, word)   the adjusted p-values, words and seeds to plan; returns the family
"""

from __future__ import annotations

from collections.abc import Callable

from minillm.analysis import exact, stats
from minillm.analysis.lr_curves import MEASURES
from minillm.analysis.rules import Rules

FAILURE_WORDS = ("fails more often", "fails less often", "no difference shown")


def failure_word(c: dict, p_adjusted: float | None, alpha: float) -> str | None:
    """The failure word of a comparison: more / less often when the adjusted exact test rejects at alpha, else no
    difference shown; None without a test (no run of either arm failed, or every run did)."""
    if c["failure_p"] is None:
        return None
    if p_adjusted is not None and p_adjusted <= alpha:
        return FAILURE_WORDS[0] if c["fail_arm"] / c["n_arm"] > c["fail_baseline"] / c["n_baseline"] else \
            FAILURE_WORDS[1]
    return FAILURE_WORDS[2]


def _plan(c: dict, rules: Rules, size: int) -> None:
    """seeds_needed (pairs to decide the loss at the fixed margin, from the spread of the pairs that trained) and
    seeds_needed_failures (runs per arm to tell the failure rates apart), for an undecided comparison."""
    c["seeds_needed"] = c["seeds_needed_failures"] = None
    if c["verdict"] == "inconclusive" and not c["_degenerate"]:
        sd, n = c["_survivors"]
        c["seeds_needed"] = exact.pairs_for_margin(sd, n, rules.margin, rules.alpha, stats.PLAN_POWER, size)
    if c["failure_verdict"] == FAILURE_WORDS[2]:
        c["seeds_needed_failures"] = exact.seeds_for_failures(c["fail_arm"] / c["n_arm"],
                                                              c["fail_baseline"] / c["n_baseline"], rules.alpha,
                                                              stats.PLAN_POWER, size)


def assign(comparisons: list[dict], stable: dict | None, rules: Rules,
           word: Callable[[dict, float | None, float | None, int], str]) -> dict:
    """Adjust every test of the report together and set the words: each comparison's verdict (``word``: the loss word
    from its adjusted p-values, compare's rule), failure word and seeds to plan, and each stability measure's
    verdict. Returns {size, loss, failures, stability}: the family's size and how many of each kind it holds."""
    entries: list[tuple[str, dict, tuple[float | None, float | None]]] = []
    for c in comparisons:
        entries.append(("loss", c, (c["p"], c["p_equivalent"] if rules.equivalence == "tost" else None)))
    for c in comparisons:
        entries.append(("failures", c, (c["failure_p"], None)))
    for sc in (stable or {}).get("comparisons", []):
        for m in MEASURES:
            e = sc["measures"][m]
            entries.append(("stability", e, (e["p"], e["p_equivalent"])))
    tests = [t for _, _, t in entries]
    holm = rules.adjust == "holm"
    adjusted = stats.step_down(tests) if holm else tests
    counted = {kind: sum(any(p is not None for p in t) for k, _, t in entries if k == kind)
               for kind in ("loss", "failures", "stability")}
    size = sum(counted.values()) if holm else 1
    for (kind, item, _), (p_adj, p_eq_adj) in zip(entries, adjusted, strict=True):
        if kind == "loss":
            item["p_adjusted"], item["p_equivalent_adjusted"] = p_adj, p_eq_adj
        elif kind == "failures":
            item["failure_p_adjusted"] = p_adj
            item["failure_verdict"] = failure_word(item, p_adj, rules.alpha)
        else:
            item["p_adjusted"], item["p_equivalent_adjusted"] = p_adj, p_eq_adj
    for c, p_holm in zip(comparisons, stats.holm([c["p"] for c in comparisons]), strict=True):
        c["p_holm"] = p_holm
        c["verdict"] = word(c, c["p_adjusted"], c["p_equivalent_adjusted"], max(size, 1))
        c["significant"] = stats.significant(c["ci_low"], c["ci_high"])
        _plan(c, rules, max(size, 1))
    for sc in (stable or {}).get("comparisons", []):
        for m, (_, higher_is_better, _) in MEASURES.items():
            e = sc["measures"][m]
            e["verdict"] = stats.decide(e["direction"], e["p_adjusted"], e["p_equivalent_adjusted"], rules.alpha,
                                        higher_is_better)
    if stable is not None:
        stable["family"] = size
    return {"size": size, **counted}


# What each word promises under rules version 3 (verdicts.md's "What the verdicts mean")
VERDICT_RULES = {
    "equivalent": "the equivalence test (two one-sided t tests against the margin) passes at alpha after the "
                  "report's one family-wise adjustment: the (1 - 2 alpha) interval lies inside (-margin, +margin) "
                  "with room for every other test of the report",
    "better": "not equivalent, and the test of no difference rejects at alpha after the adjustment, on the better "
              "side (below 0 when lower is better)",
    "worse": "not equivalent, and the test of no difference rejects at alpha after the adjustment, on the worse side",
    "inconclusive": "neither: these runs cannot decide at the margin fixed before them; more seeds are needed "
                    "(seeds needed), at the same margin. A margin chosen after seeing the runs would make any word "
                    "reachable",
    "fails more often / fails less often": "Boschloo's exact test of the failure counts rejects at alpha after the "
                                           "same adjustment; no difference shown: it does not",
}
