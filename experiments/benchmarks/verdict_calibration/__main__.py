"""Measure the comparison engine's error rates on simulated sweeps (simulate.py): the family-wise rate of a false
better / worse / equivalent, the coverage of the intervals, the power to call a planted effect, and whether a
sweep of seeds_needed decides as planned. Writes results.json, results.md and calibration.png.

    python -m experiments.benchmarks.verdict_calibration                 # ~1,000 sweeps per cell (see README)
    python -m experiments.benchmarks.verdict_calibration --reps 50 --out /tmp/cal   # a quick look
"""

from __future__ import annotations

import argparse
import json
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from experiments.benchmarks.verdict_calibration import simulate as sim
from experiments.common.machine import machine, this_checkout

HERE = Path(__file__).parent


def run_cell(args: tuple[int, sim.Scenario, str, int]) -> dict:
    index, scenario, rule, reps = args
    return {**sim.replicate(scenario, rule, reps, seed=1000 + index), "question": scenario.question}


def fmt(cell: dict, key: str) -> str:
    entry = cell[key]
    if entry["rate"] is None:
        return "-"
    return f"{100 * entry['rate']:.1f} ± {100 * 2 * entry['mc_se']:.1f}"


def markdown(result: dict) -> str:
    lines = [f"# Verdict calibration: {result['reps']} simulated sweeps per cell", "",
             f"Machine: {result['machine']}; commit {result['commit']}; {result['seconds']:.0f} s; alpha "
             f"{sim.ALPHA}, margin {sim.MARGIN}. Rates in % ± twice their Monte Carlo standard error.", "",
             "| scenario | rule | any false word | false better | coverage | power (right word) | decided | words |",
             "|---|---|---|---|---|---|---|---|"]
    for c in result["cells"]:
        words = ", ".join(f"{w} {n}" for w, n in c["words"].items())
        lines.append(f"| {c['scenario']} | {c['rule']} | {fmt(c, 'family_false')} | {fmt(c, 'false_better')} | "
                     f"{fmt(c, 'coverage')} | {fmt(c, 'power')} | {fmt(c, 'decided')} | {words} |")
    lines += ["", "seeds_needed as a plan (default rules): a pilot that stayed inconclusive, then a new sweep of the "
                  "size it named.", "", "| pilot seeds | planted effect | inconclusive pilots | median seeds needed | "
                  "new sweep decided |", "|---|---|---|---|---|"]
    for p in result["plans"]:
        lines.append(f"| {p['pilot_seeds']} | {p['effect']:+g} | {p['pilots_inconclusive']} | "
                     f"{p['median_seeds_needed']} | {fmt(p, 'decided')} |")
    return "\n".join(lines) + "\n"


def figure(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = result["cells"]
    rules = list(dict.fromkeys(c["rule"] for c in cells))
    names = list(dict.fromkeys(c["scenario"] for c in cells))
    colors = dict(zip(rules, ("tab:gray", "tab:orange", "tab:purple", "tab:green", "tab:blue"), strict=False))
    fig, axes = plt.subplots(1, 2, figsize=(13, 0.42 * len(names) + 1.8), sharey=True)
    for ax, key, title in ((axes[0], "family_false", "any false word in the report (%)"),
                           (axes[1], "coverage", "coverage of the 95% intervals (%)")):
        for i, rule in enumerate(rules):
            for c in cells:
                if c["rule"] != rule or c[key]["rate"] is None:
                    continue
                y = names.index(c["scenario"]) + (i - (len(rules) - 1) / 2) * 0.16
                rate, err = 100 * c[key]["rate"], 200 * c[key]["mc_se"]
                ax.errorbar(rate, y, xerr=err, fmt="o", color=colors[rule], ms=4,
                            label=rule if c is next(x for x in cells if x["rule"] == rule) else None)
        ax.axvline(100 * sim.ALPHA if key == "family_false" else 100 * (1 - sim.ALPHA), color="black", lw=1, ls="--")
        ax.set_title(title, fontsize=9)
    axes[0].set_yticks(range(len(names)))
    axes[0].set_yticklabels(names, fontsize=7)
    axes[0].invert_yaxis()
    axes[0].legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=1000, help="simulated sweeps per scenario and rule")
    parser.add_argument("--jobs", type=int, default=2, help="worker processes")
    parser.add_argument("--out", type=Path, default=HERE, help="where results.json/.md and the figure go")
    args = parser.parse_args(argv)
    if args.reps < 10 or args.jobs < 1:
        parser.error(f"--reps {args.reps} / --jobs {args.jobs}: allowed: --reps >= 10, --jobs >= 1")
    start = time.time()
    work = [(i, s, rule, args.reps) for i, s in enumerate(sim.scenarios()) for rule in s.rules]
    with ProcessPoolExecutor(args.jobs) as pool:
        cells = list(pool.map(run_cell, work))
        plans = list(pool.map(_plan, [(4, 0.012), (4, 0.008), (8, 0.006)], [args.reps // 2] * 3))
    result = {"reps": args.reps, "alpha": sim.ALPHA, "margin": sim.MARGIN, "machine": machine(),
              "commit": this_checkout(), "seconds": time.time() - start,
              "command": f"python -m experiments.benchmarks.verdict_calibration --reps {args.reps}",
              "scenarios": [sim.as_dict(s) for s in sim.scenarios()], "cells": cells, "plans": plans}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(result, indent=1) + "\n")
    (args.out / "results.md").write_text(markdown(result))
    figure(result, args.out / "calibration.png")
    print(f"wrote {args.out / 'results.md'} ({result['seconds']:.0f} s)")


def _plan(pilot_and_effect: tuple[int, float], reps: int) -> dict:
    pilot, effect = pilot_and_effect
    return sim.plan_check(pilot, effect, reps, seed=7 + pilot)


if __name__ == "__main__":
    main()
