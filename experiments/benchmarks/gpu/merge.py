"""Merge what the four steps of plan.sh brought back into experiments/benchmarks/gpu/results/<device>.{json,md,png}.

    python -m experiments.benchmarks.gpu.merge DIR [DIR ...]  # the $OUT folder(s) brought back from the GPU machine
    python -m experiments.benchmarks.gpu.merge /tmp/minillm-gpu/* --results /tmp/minillm-gpu-results  # the dry run's

Reads, in any of the folders and their subfolders: the kernel benchmark reports (<device>.json with a "meta"
section; merged by key with experiments/benchmarks/kernels/report.py, so the tests step's --tune rows, the kernels
step and the train step make one report), throughput-*.json (experiments/benchmarks/throughput, section c),
preset.json (experiments/benchmarks/gpu/preset.py), tests.log / tests.xml (pytest), compile_check.txt and env.txt.
Runs on any machine with the checkout: the standard library, matplotlib for the plot, and minillm.metrics for the
metric names. Judges the targets (report.judge) and adds the preset's MFU target. Every step records the device it
ran on; folders from two devices (an H100 step and an H200 step) are refused, to be merged one device at a time.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from experiments.benchmarks.gpu.preset import markdown as preset_markdown
from experiments.benchmarks.kernels import report as R
from minillm.metrics import MFU

HERE = Path(__file__).resolve().parent


def _json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def collect(dirs: list[Path]) -> dict:
    """Everything the steps wrote, merged: kernel report sections by key, the rest as found."""
    kernel, devices = {}, {}
    out = {"throughput": [], "preset": [], "preset_meta": {}, "tests": [], "compile_check": [], "env": []}
    for d in dirs:
        for path in sorted(d.rglob("*")):
            if not path.is_file():
                continue
            data = _json(path) if path.suffix == ".json" else None
            if data and (data.get("device") or (data.get("meta") or {}).get("device")):
                device = data.get("device") or data["meta"]["device"]
                device = "cpu" if device.lower().startswith("cpu") else device  # a dry run's steps, however named
                devices.setdefault(device, []).append(str(path))
            if data and "meta" in data and any(k in data for k in R.KEYS):
                for section in R.KEYS:
                    kernel[section] = R.merge(kernel.get(section, []), data.get(section, []), section)
                if isinstance(data.get("compile_check"), list):
                    kernel["compile_check"] = data["compile_check"]
                kernel.setdefault("meta", {}).update({k: v for k, v in data["meta"].items() if v is not None})
                kernel["meta"].setdefault("runs", []).append(
                    {k: data["meta"].get(k) for k in ("date", "copy_gbps", "torch", "triton", "liger", "run")})
            elif path.name.startswith("throughput-") and data:
                out["throughput"] += data.get("c") if isinstance(data.get("c"), list) else []
            elif path.name == "preset.json" and data:
                out["preset"] += data.get("runs", [])
                out["preset_meta"] = data.get("meta", {})
            elif path.name == "tests.log":
                tail = path.read_text(errors="replace").strip().splitlines()[-40:]
                out["tests"].append("\n".join(tail))
            elif path.name in ("compile_check.txt", "env.txt"):
                out[path.stem].append(path.read_text(errors="replace").strip())
    if len(devices) > 1:
        ran = "; ".join(f"{d}: {', '.join(paths)}" for d, paths in sorted(devices.items()))
        raise SystemExit(f"merge: error: the folders hold steps of {len(devices)} devices ({ran}); "
                         "merge each device's folders on their own")
    return {"kernel": kernel, "device": next(iter(devices), None), **out}


def relative_paths(text: str) -> str:
    """The GPU machine's absolute paths in logs, as a reader can follow them: Python's packages from
    site-packages/, the checkout's files from the repository root (its source folders and train.py), temporary
    folders as $TMPDIR/. Only whole absolute paths are rewritten (not URLs or relative paths)."""
    start, part = r"(?<![\w.:/\\~-])/", r"[^\s:'\"()\\]"
    text = re.sub(start + part + r"*?/(?:site|dist)-packages/", "site-packages/", text)
    source = r"(?:minillm|experiments|tests|scripts)/[\w/.-]*\.(?:py|sh)\b|train\.py(?=[\s'\":]|$)"
    text = re.sub(start + part + r"*?/(?=" + source + ")", "", text, flags=re.M)  # the checkout's files
    return re.sub(start + r"tmp/", "$TMPDIR/", text)


def _relative_everywhere(obj):
    """relative_paths on every string of a merged report (before it is written: the JSON and the markdown agree)."""
    if isinstance(obj, str):
        return relative_paths(obj)
    if isinstance(obj, dict):
        return {k: _relative_everywhere(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_relative_everywhere(v) for v in obj]
    return obj


def preset_targets(runs: list[dict]) -> list[dict]:
    checks = []
    for r in runs:
        if not r.get("compiled"):
            continue
        mfu = r.get(MFU)
        target = (f"default GPU preset, compiled, stability {'on' if r['stability'] else 'off'}: "
                  f"MFU (FlopCounterMode's full count) >= {R.MFU_TARGET:.0%}")
        ok = None if mfu is None else mfu >= R.MFU_TARGET
        checks.append(dict(target=target, M="-", hidden="-", value="missing" if mfu is None else f"MFU {mfu:.1%}",
                           margin="" if mfu is None else f"{(mfu - R.MFU_TARGET) * 100:+.1f} pts",
                           result="n/a" if ok is None else "PASS" if ok else "FAIL"))
    return checks


def markdown(merged: dict) -> str:
    kernel = merged["kernel"]
    lines = [f"# First GPU contact: {merged['device'] or 'unknown device'}", "",
             "Merged by experiments/benchmarks/gpu/merge.py from the steps of experiments/benchmarks/gpu/plan.sh.", ""]
    for title, key in (("Environment", "env"), ("GPU tests (pytest)", "tests"), ("sm_90 compile", "compile_check")):
        if merged[key]:
            lines += [f"## {title}", "", "```", *merged[key], "```", ""]
    if merged["throughput"]:
        lines += ["## Train step, experiments/benchmarks/throughput section (c) (gpt125m-like, 32K vocab, "
                  "batch 16 x 1024)", "",
                  "| norm | compiled | tokens/s | MFU | peak GiB |", "|---|---|---|---|---|"]
        for r in merged["throughput"]:
            if "error" in r:
                lines.append(f"| {r['norm']} | {r['compiled']} | FAIL: {r['error']} | | |")
            else:
                mfu = "n/a" if r.get("mfu") is None else f"{r['mfu']:.1%}"
                mem = "" if r.get("peak_mem_gib") is None else f"{r['peak_mem_gib']:.1f}"
                lines.append(f"| {r['norm']} | {r['compiled']} | {r['tokens_per_s']:.0f} | {mfu} | {mem} |")
        lines.append("")
    if merged["preset"]:
        lines += ["#" + preset_markdown(merged["preset"], merged["preset_meta"]), ""]
    if kernel:
        lines += ["## Kernel benchmark", "", *R.markdown(kernel).splitlines()[1:]]
    checks = merged.get("targets", [])
    lines += ["", "## All targets: " + ", ".join(f"{sum(c['result'] == k for c in checks)} {k}"
                                                for k in ("PASS", "FAIL", "n/a")), "",
              "The kernel and train-step targets are in the tables above; the preset's:", "",
              "| target | value | margin | result |", "|---|---|---|---|"]
    lines += [f"| {c['target']} | {c['value']} | {c['margin']} | {c['result']} |"
              for c in preset_targets(merged["preset"])]
    return "\n".join(lines) + "\n"


def judged(merged: dict) -> dict:
    """The merged report with its targets judged again on its rows (the kernel benchmark's and the preset's)."""
    kernel = merged["kernel"]
    kernel["targets"] = R.judge(kernel) if kernel else []
    merged["targets"] = kernel["targets"] + preset_targets(merged["preset"])
    return merged


def page(merged: dict) -> str:
    """The report's markdown, without runs of blank lines."""
    return re.sub(r"\n{3,}", "\n\n", markdown(merged))


def write(path: Path, merged: dict, plot: bool = True) -> None:
    path.write_text(json.dumps(merged, indent=1, default=str) + "\n")
    path.with_suffix(".md").write_text(page(merged))
    if plot and merged["kernel"].get("kernels"):
        R.plot(path.with_suffix(".png"), merged["kernel"])


def main(argv=None) -> Path:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("dirs", nargs="*", type=Path)
    p.add_argument("--results", type=Path, default=HERE / "results", help="where <device>.{json,md,png} go")
    p.add_argument("--render", type=Path, metavar="REPORT.json",
                   help="judge a merged report's rows again and rewrite its targets and .md (rows and plot untouched)")
    a = p.parse_args(argv)
    if a.render:
        write(a.render, judged(json.loads(a.render.read_text())), plot=False)
        print(f"rewrote {a.render.with_suffix('.md')} and the targets of {a.render}")
        return a.render
    if not a.dirs:
        p.error("give the folders to merge, or --render REPORT.json")
    merged = judged(_relative_everywhere(collect(a.dirs)))
    device = merged["device"] or "unknown-device"
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", device).strip("-")
    a.results.mkdir(parents=True, exist_ok=True)
    path = a.results / f"{slug}.json"
    write(path, merged)
    print(f"wrote {path.with_suffix('')}.{{json,md{',png' if merged['kernel'].get('kernels') else ''}}}")
    return path


if __name__ == "__main__":
    main()
