"""The comparison options of ``minillm-report`` (``--compare FACTOR --baseline VALUE`` and the rules; docs/comparing.md)
and the comparison they ask for, computed before any file is written (minillm.analysis.verdict_files writes them).
``--plan`` grades the sweep by a recorded plan (minillm.analysis.plans).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from minillm.analysis import plans
from minillm.analysis.compare import compare
from minillm.analysis.rules import ADJUSTS, EQUIVALENCE, FAILURES, INTERVALS, LR_CHOICES, OPTIONS, CompareError, Rules
from minillm.analysis.runs import label, records_of

DEFAULT = Rules()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("comparison: a verdict for each arm (docs/comparing.md)")
    g.add_argument("--compare", dest="factor", metavar="FACTOR", help="the summary.json key whose values are compared "
                   "(norm, placement, init, qk_norm, precision, ...)")
    g.add_argument("--baseline", metavar="VALUE", help="the value of FACTOR every other value is compared with")
    g.add_argument("--metric", help=f"the summary.json number compared (default {DEFAULT.metric}: test_loss where "
                   "every run that trained has one, else final_val_loss); lower is better")
    g.add_argument("--higher-is-better", action="store_const", const=True, help="the metric is better when higher")
    g.add_argument("--margin", type=float, help=f"equivalence margin in the metric's units (default {DEFAULT.margin})")
    g.add_argument("--alpha", type=float, help=f"the family-wise error of the words; intervals at 1 - alpha "
                   f"(default {DEFAULT.alpha})")
    g.add_argument("--lr", help="tuned (default: each arm at its own best lr), common (the one lr all arms ran, "
                   "best on average), or a learning rate")
    g.add_argument("--lr-choice", choices=LR_CHOICES, help="the data a tuned or common lr is chosen on (default auto: "
                   "the validation loss where the verdict reads the test loss, else the judging runs, with a "
                   "warning; crossfit: each half of the seeds judged at the lr the other half chose; these words are "
                   "exploratory); selection-aware: each arm's best lr against the baseline's over the whole grid, "
                   "the choice in the test")
    g.add_argument("--failures", choices=FAILURES, help="penalize (default: a failed run counts at ln V, every pair "
                   "stays) or drop (survivors only, labelled so)")
    g.add_argument("--no-adjust", dest="adjust", action="store_const", const=ADJUSTS[1], help="words at alpha for "
                   "each comparison alone (one planned comparison); default: adjusted for the report's family")
    g.add_argument("--equivalence", choices=EQUIVALENCE, help="tost (default: two one-sided tests at alpha) or "
                   "interval (the 1 - alpha interval inside the margin: stricter)")
    g.add_argument("--paired-by", choices=["seed", "none"], help="pair runs by seed (the default when arms share "
                   "seeds) or not (Welch's interval)")
    g.add_argument("--interval", choices=INTERVALS, help="the interval the verdict uses: t (default) or bootstrap "
                   "(BCa, from 8 pairs; below that, t)")
    g.add_argument("--window-error", action="store_const", const=True, help="add the sampling error of the "
                   "evaluation windows to each interval (from the runs' val_windows.npy / test_windows.npy)")
    g.add_argument("--stability", action="store_const", const=True, help="also the stability verdict over the lr "
                   "grid: lr sensitivity, trainable lr range, failure rate, and loss_vs_lr.png")
    g.add_argument("--tolerance", type=float, help=f"nats above the best loss that count as trainable, for the lr "
                   f"range (default {DEFAULT.tolerance})")
    g.add_argument("--range-margin", type=float, help=f"equivalence margin of the lr range, in decades (default "
                   f"{DEFAULT.range_margin})")
    g.add_argument("--rate-margin", type=float, help=f"equivalence margin of the failure rate (default "
                   f"{DEFAULT.rate_margin})")
    g.add_argument("--rules-version", dest="version", type=int, help=f"the rules that decide (default "
                   f"{DEFAULT.version}; 3: the stability verdict read around the best lr of the seeds' mean; 2: the "
                   "rules the studies registered 2026-11-28 to 2026-12-01 pin)")
    g.add_argument("--plan", nargs="?", const="auto", metavar="PATH", help="grade by a recorded plan (plan.json, "
                   "default: found in or above the sweep folder); its rules replace the options above")
    g.add_argument("--wandb", action="store_true", help="log the verdicts and the forest plot to a W&B run "
                   "(job_type report, the sweep's group; offline unless WANDB_MODE=online)")


def _lr(parser: argparse.ArgumentParser, value: str) -> str | float:
    if value in ("tuned", "common"):
        return value
    try:
        return float(value)
    except ValueError:
        parser.error(f"--lr: {value} is invalid; allowed: tuned, common or a learning rate > 0")


def prepare(parser: argparse.ArgumentParser, args: argparse.Namespace, runs: Sequence[Any],
            unfinished: Sequence[str] = ()) -> dict | None:
    """The verdicts the command line asks for (None when it asks for none), computed before anything is written;
    a request the runs cannot answer is parser.error (one line, exit 2)."""
    given = {k: getattr(args, k) for k in OPTIONS if getattr(args, k, None) is not None}
    if args.plan is None and not given:
        if args.wandb:
            parser.error("--wandb: logs the verdicts; it needs --compare FACTOR --baseline VALUE (or --plan)")
        return None
    records = records_of(runs)
    if "lr" in given:
        given["lr"] = _lr(parser, given["lr"])
    check = info = None
    try:
        if args.plan is not None:
            path = plans.find_record(args.sweep_dir, args.plan)
            rules, records, check, info = plans.grade(plans.read_record(path), records, path)
            for key, value in given.items():
                if value != rules[key]:
                    print(f"note: {OPTIONS[key]} {label(value)} ignored: the plan {path} fixes "
                          f"{key}={label(rules[key])}")
        else:
            missing = [OPTIONS[k] for k in ("factor", "baseline") if k not in given]
            if missing:
                parser.error(f"{' and '.join(missing)} missing: a comparison needs --compare FACTOR --baseline VALUE")
            rules = given
        result = compare(records, rules=Rules(**rules), run_check=check, unfinished=unfinished)
    except (CompareError, plans.PlanError) as err:
        parser.error(str(err))
    return plans.apply(result, info) if info else result
