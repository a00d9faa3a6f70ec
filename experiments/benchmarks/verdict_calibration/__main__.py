"""Measure the comparison engine's error rates on simulated sweeps (cells.py, designs.py, simulate.py): per cell
and design the chance of any false word in a report (loss and stability words together), of a false better and a
false equivalent, the coverage of the intervals, the bias of the difference. Writes results.json, results.md,
calibration.png and the results table of README.md.

    python -m experiments.benchmarks.verdict_calibration                       # the committed run (see README)
    python -m experiments.benchmarks.verdict_calibration --sims 100 --cells flat-8 stability-3 --out /tmp/cal
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from experiments.benchmarks.verdict_calibration import designs
from experiments.benchmarks.verdict_calibration import simulate as sim
from experiments.benchmarks.verdict_calibration.cells import cells
from experiments.common.machine import machine, this_checkout

HERE = Path(__file__).parent
TABLE = re.compile(r"(<!-- results -->\n).*?(<!-- /results -->)", re.S)


def run_cell(work: tuple[int, sim.Scenario, int]) -> list[dict]:
    index, scenario, sims = work
    start = time.process_time()
    out = designs.replicate(scenario, sims, seed=1000 + index)
    seconds = time.process_time() - start
    return [{**c, "cpu_seconds": seconds, "ms_per_sweep": 1000 * seconds / sims} for c in out]


def pct(entry: dict | None) -> str:
    if not entry or entry["rate"] is None:
        return "-"
    return f"{100 * entry['rate']:.1f} [{100 * entry['low']:.1f}, {100 * entry['high']:.1f}]"


def table(result: dict) -> str:
    labelled = any(c.get("exploratory") for c in result["cells"])  # words outside the promise: a column of its own
    lines = ["| cell | design | sims | any false word | " + ("exploratory left out | " if labelled else "")
             + "false better | false equivalent | false stability word | false about the best lrs | "
             "pilot off the baseline's best lr | coverage | bias (nats) | decided | CPU ms per sweep |",
             "|---" * (13 + labelled) + "|"]
    for c in result["cells"]:
        if "skipped" in c:
            lines.append(f"| {c['scenario']} | {c['design']} | - | skipped: {c['skipped']} |" + " |" * (9 + labelled))
            continue
        promised = f"{pct(c['promised_false'])} | " if labelled else ""
        stab = pct(c["stability_false"]) if c["stability_words"] else "-"
        bias = f"{c['bias']:+.4f}" if c["bias"] is not None else "-"
        off = pct(c["pilot_off_best"]) if c["design"] == "two-stage" else "-"
        lines.append(f"| {c['scenario']} | {c['design']} | {c['sims']} | **{pct(c['family_false'])}** | {promised}"
                     f"{pct(c['false_better'])} | {pct(c['false_equivalent'])} | {stab} | {pct(c['false_vs_best'])} | "
                     f"{off} | {pct(c['coverage'])} | {bias} | {pct(c['decided'])} | {c['ms_per_sweep']:.1f} |")
    return "\n".join(lines) + "\n"


def header(result: dict) -> str:
    return (f"Machine: {result['machine']}; commit {result['commit']}; {result['date']}; {result['cpu_seconds']:.0f} "
            f"CPU s on 1 core. Alpha {sim.ALPHA}, margin {sim.MARGIN}. Rates in % with their 95% Monte Carlo (Wilson) "
            "interval. A two-stage word is judged at the lrs its pilot chose (and, in its column 'false about the "
            "best lrs', at the best lrs), the others at the best lrs. CPU ms per sweep: the cell's designs together.\n")


def markdown(result: dict) -> str:
    return f"# Verdict calibration: results\n\n{header(result)}\n{table(result)}"


def figure(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells_ = [c for c in result["cells"] if "skipped" not in c]
    names = list(dict.fromkeys(c["scenario"] for c in result["cells"]))
    colors = {"default": "tab:orange", "two-stage": "tab:green", "selection-aware": "tab:blue"}
    fig, ax = plt.subplots(figsize=(10, 0.36 * len(names) + 1.6))
    for i, design in enumerate(designs.DESIGNS):
        mine = [c for c in cells_ if c["design"] == design]
        for c in mine:
            y = names.index(c["scenario"]) + (i - 1) * 0.22
            rate = 100 * c["family_false"]["rate"]
            low, high = 100 * c["family_false"]["low"], 100 * c["family_false"]["high"]
            err = [[max(0.0, rate - low)], [max(0.0, high - rate)]]  # a Wilson end may round past the rate
            ax.errorbar(rate, y, xerr=err, fmt="o", color=colors[design], ms=4,
                        label=design if c is mine[0] else None)
            if design == "two-stage" and c["false_vs_best"]["rate"] != c["family_false"]["rate"]:
                ax.plot(100 * c["false_vs_best"]["rate"], y, "o", mfc="none", color=colors[design], ms=5,
                        label="two-stage, judged at the best lrs" if c is mine[0] else None)
    ax.axvline(100 * sim.ALPHA, color="black", lw=1, ls="--", label=f"alpha {sim.ALPHA:g}")
    ax.set_yticks(range(len(names)))
    ax.set_yticklabels(names, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("any false word in the report (%), 95% Monte Carlo interval", fontsize=8)
    ax.set_title(f"commit {result['commit']}, {result['date']}", fontsize=8)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.subplots_adjust(left=0.36)  # room for the longest cell name
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write(result: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(result, indent=1) + "\n")
    (out / "results.md").write_text(markdown(result))
    figure(result, out / "calibration.png")
    readme = out / "README.md"
    if readme.exists() and TABLE.search(readme.read_text()):
        text = TABLE.sub(lambda m: m.group(1) + header(result) + "\n" + table(result) + m.group(2), readme.read_text())
        readme.write_text(text)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    keys = [s.key for s, _ in cells()]
    parser.add_argument("--sims", type=int, help="simulated sweeps per cell (default: each cell's own, cells.py)")
    parser.add_argument("--cells", nargs="+", choices=keys, metavar="CELL", help=f"only these: {', '.join(keys)}")
    parser.add_argument("--jobs", type=int, default=1, help="worker processes (1: one core)")
    parser.add_argument("--out", type=Path, default=HERE, help="where results.json/.md, the figure and README go")
    args = parser.parse_args(argv)
    if (args.sims is not None and args.sims < 10) or args.jobs < 1:
        parser.error(f"--sims {args.sims} / --jobs {args.jobs}: allowed: --sims >= 10, --jobs >= 1")
    work = [(i, s, args.sims or n) for i, (s, n) in enumerate(cells()) if not args.cells or s.key in args.cells]
    start, commit = time.time(), this_checkout()  # the code that runs, before anything is written
    if args.jobs == 1:
        found = [run_cell(w) for w in work]
    else:
        with ProcessPoolExecutor(args.jobs) as pool:
            found = list(pool.map(run_cell, work))
    command = "python -m experiments.benchmarks.verdict_calibration" + (f" --sims {args.sims}" if args.sims else "") \
        + (f" --cells {' '.join(args.cells)}" if args.cells else "")
    result = {"alpha": sim.ALPHA, "margin": sim.MARGIN, "machine": machine(), "commit": commit,
              "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
              "seconds": time.time() - start, "cpu_seconds": sum(c[0]["cpu_seconds"] for c in found),
              "command": command, "scenarios": [sim.as_dict(w[1]) for w in work],
              "cells": [c for cs in found for c in cs]}
    write(result, args.out)
    print(f"wrote {args.out / 'results.md'} ({result['seconds']:.0f} s)")


if __name__ == "__main__":
    main()
