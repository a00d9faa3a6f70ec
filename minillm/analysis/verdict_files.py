"""The verdict files of ``minillm-report ... --compare FACTOR --baseline VALUE`` (its options and the comparison
they ask for: minillm.analysis.verdict_cli).

Writes ``verdicts.json`` (minillm.analysis.compare.compare's dict), ``verdicts.md`` (one sentence per arm, the table,
the rules), ``verdicts.png`` (a forest plot: each arm's difference with its interval, the margin band, the baseline
at 0) and with ``--stability`` ``loss_vs_lr.png`` (minillm.analysis.lr_curves); with ``--wandb`` logs the table and
the plot to a W&B run of job_type ``report`` in the sweep's group (offline unless WANDB_MODE=online).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from minillm.analysis import design_check, family, lr_curves
from minillm.analysis.compare import some
from minillm.analysis.runs import label
from minillm.analysis.stats import PLAN_POWER, VERDICT_RULES, VERDICTS
from minillm.analysis.verdict_text import MEANING_V3, failure_cell, family_text, p_text, sentence_v3, v2
from minillm.paths import config_dir, sweep_group

log = logging.getLogger("minillm")
FILES = ("verdicts.json", "verdicts.md", "verdicts.png")
STABILITY_PLOT = "loss_vs_lr.png"
TABLE = ("arm", "baseline", "stratum", "arm_lr", "baseline_lr", "n_pairs", "diff", "ci_low", "ci_high", "ci_method",
         "p", "p_adjusted", "significant", "verdict", "fail_arm", "fail_baseline", "n_arm", "n_baseline", "fisher_p",
         "seeds_needed", "informative", "warnings")


def _fmt(value: Any, digits: int = 4) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:+.{digits}f}" if abs(value) < 100 else f"{value:.3g}"
    return label(value)


def _stratum(c: dict) -> str:
    return ", ".join(f"{k}={label(v)}" for k, v in c["stratum"].items()) or "-"


def _lr_text(value: Any) -> str:
    return " | ".join(map(label, value)) if isinstance(value, list) else label(value)


def _lrs(c: dict) -> str:
    same = c["arm_lr"] == c["baseline_lr"]
    return _lr_text(c["arm_lr"]) if same else f"{_lr_text(c['arm_lr'])} (baseline {_lr_text(c['baseline_lr'])})"


def legacy(result: dict) -> bool:
    """Words from the unadjusted interval, failed runs dropped: the rules registered before 2026-11-28."""
    return result.get("equivalence") == "interval" and result.get("adjust") == "none"


def sentence(c: dict, result: dict) -> str:
    """One sentence a reader can act on: the word, the difference and its interval, the failures."""
    arm, base, word = label(c["arm"]), label(c["baseline"]), c["verdict"]
    where = f" ({_stratum(c)})" if c["stratum"] else ""
    head = {"better": f"**{arm} is better than {base}**", "worse": f"**{arm} is worse than {base}**",
            "equivalent": f"**{arm} is equivalent to {base}** (within ±{result['margin']:g})",
            "inconclusive": f"**{arm} against {base}: inconclusive**"}[word]
    n = f"{c['n_pairs']} pairs" if c["n_pairs"] is not None else f"{c['n_arm']} / {c['n_baseline']} runs, unpaired"
    adjusted = ("" if result.get("family", 1) == 1 or c.get("p_adjusted") is None else
                f", p adjusted for {result['family']} comparisons {p_text(c['p_adjusted'])}" if v2(result) else
                f", p adjusted for the report's {result['family']} tests {p_text(c['p_adjusted'])}")
    diff = ("no difference to show" if c["diff"] is None else
            f"{result['metric']} {c['diff']:+.4f} [{_fmt(c['ci_low'])}, {_fmt(c['ci_high'])}] ({c['ci_method']}, "
            f"{n}{adjusted})")
    estimand = f" ({c['estimand']})" if c.get("estimand") else ""
    text = f"{head}{where}{estimand}: {diff}"
    fails = c["fail_arm"] or c["fail_baseline"]
    if not v2(result):
        return sentence_v3(c, result, text)[:-1] + _breach(c) + "."
    if fails and result["failures_rule"] == "penalize":
        text += (f"; it failed in {c['fail_arm']} of {c['n_arm']} runs (baseline {c['fail_baseline']} of "
                 f"{c['n_baseline']}, Fisher p {p_text(c['fisher_p'])}), each counted at ln V")
        if c.get("diff_trained") is not None and c["trained_pairs"] < (c["n_pairs"] or 0):
            text += f"; among the {c['trained_pairs']} pairs that trained the difference is {c['diff_trained']:+.4f}"
    elif fails:
        text += (f"; failed runs left out ({c['fail_arm']} of {c['n_arm']}, baseline {c['fail_baseline']} of "
                 f"{c['n_baseline']}, Fisher p {p_text(c['fisher_p'])})")
    if c.get("p_improvement") is not None:
        text += f"; better in {100 * c['p_improvement']:.0f}% of the pairs"
    if word == "inconclusive" and c["seeds_needed"]:
        power = "" if legacy(result) else f" with {100 * PLAN_POWER:.0f}% power"
        text += f"; about {c['seeds_needed']} pairs would decide{power}"
    if not c["informative"]:
        text += " (not informative: see the warnings)"
    return text + _breach(c) + "."


def _breach(c: dict) -> str:
    return (" (**not pre-registered**: the runs breach the frozen design, see the warnings)"
            if c.get("preregistered") is False else "")


def short_line(c: dict) -> str:
    """One stdout line per comparison: arm, stratum, word, difference, failures, and whether it is informative."""
    where = f" ({_stratum(c)})" if c["stratum"] else ""
    diff = "-" if c["diff"] is None else f"{c['diff']:+.4f}"
    return (f"{label(c['arm'])}{where}: {c['verdict']} ({diff}; failed {c['fail_arm']}/{c['n_arm']} vs "
            f"{c['fail_baseline']}/{c['n_baseline']})" + ("" if c["informative"] else " (not informative)")
            + (" (not pre-registered)" if c.get("preregistered") is False else ""))


def rules_text(result: dict) -> list[str]:
    """How this report's verdicts were made, in the words of its rules."""
    lines = []
    if legacy(result):
        lines.append("Rules registered before 2026-11-28: failed runs left out of the difference, the lr chosen on "
                     "the runs that judge it, and each word read from its unadjusted interval.")
    fam = result.get("family", 1)
    lines.append(
        f"Metric `{result['metric']}` ({'higher' if result['higher_is_better'] else 'lower'} is better); difference "
        f"= arm - baseline; margin ±{result['margin']:g}; {100 * (1 - result['alpha']):g}% intervals; lr "
        f"{label(result['lr_rule'])}; {result['n_runs']} runs. Failed runs (diverged, crashed, not trained, stalled "
        "at the unigram loss): " + {"penalize": "counted at ln V, the loss of a uniform guess, so every seed pair "
                                   "stays and an arm that fails more is worse",
                                   "drop": "left out (survivors only, --failures drop)",
                                   "drop (not a loss)": "left out (the metric has no penalty value)"}
        [result["failures_rule"]] + ("; failure rates compared by Fisher's exact test. " if v2(result) else
                                     "; failure counts compared by Boschloo's exact test, a word of their own. ")
        + (family_text(result) if not v2(result) else
           f"The words keep the family-wise error at {result['alpha']:g} over the {fam} comparisons "
           "(step-down over the tests of no difference and of equivalence)." if fam > 1 else
           "The words are read at alpha for each comparison alone." if legacy(result) or result.get("adjust") == "none"
           else "One comparison: the words at alpha."))
    return lines


def exploratory_text(result: dict) -> list[str]:
    """The paragraph saying which words the report's promise does not cover (rules version 3)."""
    found = [c for c in result["comparisons"] if c.get("exploratory")]
    if not found:
        return []
    return ["", f"**Exploratory**: {len(found)} of the {len(result['comparisons'])} words come from an lr chosen on "
                "the runs they judge (" + "; ".join(sorted({c["exploratory_reason"] for c in found}))
            + "). Such a choice favours an arm with a flat loss-vs-lr curve, so the promise above (the chance of any "
              "false word at most alpha) does not cover these words: confirm them at fixed lrs on fresh seeds, or "
              "test the whole grid with --lr-choice selection-aware."]


def _lr_choice_text(c: dict) -> str:
    how = c.get("lr_choice") or {}
    return how.get("how", "-") + (f" ({how['chosen_on']})" if how.get("chosen_on") else "")


def markdown(result: dict) -> str:
    lines = [f"# Verdicts: {result['factor']} against {label(result['baseline'])}", ""]
    lines += [f"- {sentence(c, result)}" + (" *Exploratory*: the lr was chosen on the judged runs."
                                            if c.get("exploratory") else "")
              for c in result["comparisons"]] or ["- nothing compared"]
    if result.get("unfinished"):
        lines += ["", f"**{len(result['unfinished'])} run(s) of the sweep have not ended** (no summary.json yet, or "
                      f"the run's lock is held): {some(result['unfinished'])}. The verdicts may change."]
    lines += [""] + rules_text(result) + exploratory_text(result)
    plan = result.get("plan")
    if plan:
        lines += ["", f"**Pre-registered**: plan {plan['path']}, sha256 {plan['plan_hash'][:12]}, recorded "
                      f"{plan['recorded_at']}" + (f" ({plan['question']})" if plan.get("question") else "") + ". "
                  f"Plan file changed since: {_fmt(plan['plan_file_changed'])}; plan record intact: "
                  f"{_fmt(plan['plan_record_intact'])}; runs started before the plan: "
                  f"{len(plan['runs_before_plan'])}" + (f" ({some(plan['runs_before_plan'])})"
                                                         if plan["runs_before_plan"] else "")
                  + f"; runs of unplanned seeds left out: {len(plan['unplanned_runs'])}."
                  + design_check.report_text(plan)]
    header = ["arm", "stratum", "lr (arm / baseline)", "lr chosen", "pairs", "diff", "interval",
              "p (adjusted)" if not legacy(result) else "p (Holm)", "verdict",
              "failed (arm / baseline, Fisher p)" if v2(result) else "failed (arm / baseline, Boschloo p adjusted)",
              "seeds needed"] + (["expected"] if plan else [])
    lines += ["", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for c in result["comparisons"]:
        interval = (f"[{_fmt(c['ci_low'])}, {_fmt(c['ci_high'])}] {c['ci_method']}" if c["ci_low"] is not None
                    else f"- ({c['ci_method']})")
        ruling = (f"**{c['verdict']}**" + ("" if c["informative"] else " (not informative)")
                  + (" (exploratory)" if c.get("exploratory") else "")
                  + (" (not pre-registered)" if c.get("preregistered") is False else ""))
        adjusted = c["p_holm"] if legacy(result) else c.get("p_adjusted")
        row = [label(c["arm"]), _stratum(c), f"{_lr_text(c['arm_lr'])} / {_lr_text(c['baseline_lr'])}",
               _lr_choice_text(c), _fmt(c["n_pairs"]) if c["n_pairs"] is not None else "unpaired", _fmt(c["diff"]),
               interval, f"{p_text(c['p'])} ({p_text(adjusted)})", ruling,
               f"{c['fail_arm']}/{c['n_arm']} / {c['fail_baseline']}/{c['n_baseline']}, {p_text(c['fisher_p'])}"
               if v2(result) else failure_cell(c), _fmt(c["seeds_needed"])]
        if plan:
            row.append(f"{c['expected'] or '-'}" + ("" if c["as_expected"] is None else
                                                     " (met)" if c["as_expected"] else " (not met)"))
        lines.append("| " + " | ".join(row) + " |")
    if "stability_verdict" in result:
        lines += stability_markdown(result)
    warned = [(c, w) for c in result["comparisons"] for w in c["warnings"]]
    if warned or result["notes"] or result["left_out"] or result.get("duplicates"):
        lines += ["", "## Warnings", ""]
        lines += [f"- {label(c['arm'])} ({_stratum(c)}): {w}" for c, w in warned]
        lines += [f"- {n}" for n in result["notes"]]
        lines += [f"- left out, stopped by a signal and not resumed: {d}" for d in result["left_out"]]
        lines += [f"- left out, listed twice (the same run): {d}" for d in result.get("duplicates", [])]
    lines += ["", "## What the verdicts mean", ""]
    words = VERDICTS if legacy(result) else VERDICT_RULES if v2(result) else family.VERDICT_RULES
    lines += [f"- **{word}**: {meaning}." for word, meaning in words.items()]
    lines += MEANING_V3 if not v2(result) else (
        ["- **significant** (verdicts.json): the interval excludes 0; p (Holm) adjusts p across the report's "
               "comparisons. **seeds needed**: for an inconclusive arm, the pairs a paired t interval would need to "
               "decide at the observed mean and spread."] if legacy(result) else
              ["- **p (adjusted)**: the test of no difference after the family-wise adjustment; the interval shown "
               "is the unadjusted 1 - alpha one. **seeds needed**: for an inconclusive arm, the pairs a new sweep "
               f"needs to decide with {100 * PLAN_POWER:.0f}% power if the difference is the observed one and the "
               "spread its upper 80% confidence bound (a planning number, not a promise). **lr chosen**: the data "
               "the lr was chosen on (cross-fit: each half of the seeds judged at the lr the other half chose)."])
    lines += ["", "![forest plot](verdicts.png)", ""]
    if "stability_verdict" in result:
        lines += [f"![loss against lr]({STABILITY_PLOT})", ""]
    return "\n".join(lines)


def stability_markdown(result: dict) -> list[str]:
    stab = result["stability_verdict"]
    lines = ["", "## Stability over the lr grid", "",
             f"Per seed, over the lrs both arms ran (a failed run at ln V): lr sensitivity (mean loss minus the best, "
             f"nats), the trainable lr range (decades within {stab['tolerance']:g} nats of the best) and the failure "
             + (f"rate; paired by seed; words adjusted over the {stab['family']} tests of this table."
                if v2(result) else
                "rate; " + ("each arm's curve read around its own best lr" if result.get("version") == 3 else
                            "each seed pair read around each run's own best lr (rules version 4)")
                + "; the sensitivity over the lrs where both runs of "
                "a pair trained (paired t), the range by the sign test, the failure rate by the exact test stratified "
                f"by seed; words adjusted in the report's one family of {stab['family']} tests."), "",
             "| arm | stratum | seeds | measure | arm | baseline | diff [interval] | p (adjusted) | verdict |",
             "|---|---|---|---|---|---|---|---|---|"]
    for c in stab["comparisons"]:
        for m, e in c["measures"].items():
            interval = f"{_fmt(e['diff'])} [{_fmt(e['ci_low'])}, {_fmt(e['ci_high'])}]"
            lines.append(f"| {label(c['arm'])} | {_stratum(c)} | {c['n_pairs']} | {m} | {_fmt(e['arm_mean'])} | "
                         f"{_fmt(e['baseline_mean'])} | {interval} | {p_text(e['p'])} ({p_text(e['p_adjusted'])}) | "
                         f"**{e['verdict']}**{'' if c['informative'] else ' (not informative)'} |")
    lines += [f"- {n}" for n in stab["notes"]]
    if not v2(result):
        lines += [f"- {label(c['arm'])} ({_stratum(c)}): {w}" for c in stab["comparisons"] for w in c["warnings"]]
    return lines


def forest_plot(result: dict, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    comps = result["comparisons"]
    colors = {"better": "tab:green", "worse": "tab:red", "equivalent": "tab:blue", "inconclusive": "tab:gray"}
    fig, ax = plt.subplots(figsize=(8, 1.5 + 0.45 * max(len(comps), 1)))
    margin = result["margin"]
    ax.axvspan(-margin, margin, color="tab:blue", alpha=0.12)
    ax.axvline(0, color="black", lw=1)
    for i, c in enumerate(comps):
        y = len(comps) - 1 - i
        if c["ci_low"] is not None:
            ax.plot([c["ci_low"], c["ci_high"]], [y, y], color=colors[c["verdict"]], lw=2)
        if c["diff"] is not None:
            ax.plot([c["diff"]], [y], "o", color=colors[c["verdict"]])
        ax.annotate(c["verdict"], (1.01, y), xycoords=("axes fraction", "data"), va="center", fontsize=8,
                    color=colors[c["verdict"]])
    ax.set_yticks(range(len(comps)))
    ax.set_yticklabels([f"{label(c['arm'])}" + (f" ({_stratum(c)})" if c["stratum"] else "") + f", lr {_lrs(c)}"
                        for c in reversed(comps)], fontsize=8)
    ax.set_ylim(-0.7, max(len(comps), 1) - 0.3)
    ax.set_xlabel(f"arm - baseline, {result['metric']} ({'higher' if result['higher_is_better'] else 'lower'} is "
                  "better)")
    ax.set_title(f"{result['factor']}: each arm against {label(result['baseline'])} (the line at 0); shaded: the "
                 f"margin ±{margin:g}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write(result: dict, out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    (out / FILES[0]).write_text(json.dumps(result, indent=2, default=str) + "\n")
    (out / FILES[1]).write_text(markdown(result))
    forest_plot(result, out / FILES[2])
    files = [out / f for f in FILES]
    if "stability_verdict" in result:
        lr_curves.plot(result["stability_verdict"], out / STABILITY_PLOT)
        files.append(out / STABILITY_PLOT)
    return files


def table_rows(result: dict) -> list[list]:
    """verdicts.json's comparisons as rows of TABLE (text for the values a W&B table cannot type)."""
    def cell(c: dict, k: str) -> Any:
        v = c.get(k)
        if k == "stratum":
            return _stratum(c)
        if k == "warnings":
            return "; ".join(v)
        if k in ("arm_lr", "baseline_lr") and isinstance(v, list):  # cross-fit halves that chose differently
            return _lr_text(v)
        return label(v) if k in ("arm", "baseline") else v
    return [[cell(c, k) for k in TABLE] for c in result["comparisons"]]


def wandb_target(runs: Sequence[Any]) -> tuple[str, str | None]:
    """(project, group) of the sweep's W&B runs, as their resolved config (csv/hparams.yaml) names them; for runs
    logged without W&B, the project of configs/logger/wandb.yaml and the group train.py would give: name, or
    <name>-<sweep folder> for a sweep's job."""
    for run in runs:
        hparams = Path(run.dir) / "csv" / "hparams.yaml"
        if hparams.is_file():
            wandb_cfg = ((yaml.safe_load(hparams.read_text()) or {}).get("logger") or {}).get("wandb")
            if wandb_cfg and wandb_cfg.get("project"):
                return wandb_cfg["project"], wandb_cfg.get("group")
    project = yaml.safe_load((Path(config_dir()) / "logger" / "wandb.yaml").read_text())["wandb"]["project"]
    first = runs[0]
    name = first.summary.get("name")
    in_sweep = Path(first.dir).parent.parent.name == "multiruns"
    return project, sweep_group(name, Path(first.dir).parent) if in_sweep and name else name


def log_to_wandb(result: dict, out: Path, runs: Sequence[Any]) -> Path:
    """Log the verdict table and the forest plot to a W&B run (job_type report) in the sweep's group; returns its
    folder. Offline unless WANDB_MODE=online; online falls back to offline when W&B cannot start."""
    import wandb

    project, group = wandb_target(runs)
    online = os.environ.get("WANDB_MODE", "").lower() in ("online", "run")
    name = f"verdicts-{result['factor']}-vs-{label(result['baseline'])}"
    config = {k: v for k, v in result.items()
              if k not in ("comparisons", "notes", "left_out", "plan", "stability_verdict")}
    kwargs = dict(project=project, group=group, job_type="report", name=name, dir=str(out), config=config,
                  settings=wandb.Settings(silent=True, init_timeout=30))
    try:
        run = wandb.init(mode="online" if online else "offline", **kwargs)
    except Exception as err:  # no network, no key: keep the report, offline
        log.warning(f"W&B could not start online ({type(err).__name__}: {err}); logging offline instead.")
        run = wandb.init(mode="offline", **kwargs)
    table = wandb.Table(columns=list(TABLE), data=table_rows(result), allow_mixed_types=True)
    run.log({"verdicts": table, "verdicts_forest_plot": wandb.Image(str(out / FILES[2]))})
    run.summary.update({f"verdict/{label(c['arm'])}" + (f" ({_stratum(c)})" if c["stratum"] else ""): c["verdict"]
                        for c in result["comparisons"]})
    folder = Path(run.dir).parent
    where = f"offline run {run.id} in {folder}; upload it with: wandb sync {folder}" if not online else run.url
    run.finish()
    print(f"W&B: {where}")
    return folder
