"""experiments/: a package of studies (studies/sNN_name/rK_name/) and benchmarks (benchmarks/<name>/), found on disk
by experiments.common.layout; every analysis regenerates its committed results from the committed runs, the index
of experiments/README.md is generated from the finding.json files, and the reference loop is built from configs/.
Each round's rules on made-up runs: its folder's test_rules.py."""

from __future__ import annotations

import importlib
import json
import math
import pkgutil
import re
import runpy
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

import experiments
from experiments import index
from experiments.common import claims, layout, reference
from experiments.common.machine import machine, run_kernels, runs_commits, runs_machine

ROOT, EXPERIMENTS, STUDIES, BENCHMARKS = layout.ROOT, layout.EXPERIMENTS, layout.STUDIES, layout.BENCHMARKS
ANALYSES = layout.analyses()  # every round that re-analyzes committed runs, found on disk
TEXTS = [*EXPERIMENTS.rglob("*.md"), *EXPERIMENTS.rglob("*.py"), *EXPERIMENTS.rglob("*.sh"),
         *EXPERIMENTS.glob("*.yaml"), ROOT / "README.md", *ROOT.glob("docs/*.md"), *ROOT.glob("configs/experiment/*")]
DOCUMENTS = [p for p in TEXTS if p.suffix != ".py" and not re.fullmatch(r"(results|verdicts|overflow)\w*\.md", p.name)]


def modules() -> list[str]:
    return sorted(m.name for m in pkgutil.walk_packages(experiments.__path__, "experiments."))


def test_experiments_is_a_package_of_studies_and_benchmarks():
    """studies/ holds only sNN_name/ folders, each a README.md and rK_name/ rounds numbered 1, 2, ...; benchmarks/
    only folders with a README.md; every folder with Python code is a package; every round and benchmark has its
    finding.json."""
    names = modules()
    assert "experiments.common.reference" in names and "experiments.common.study" in names
    assert {p.parent for p in EXPERIMENTS.rglob("*.py")} <= {p.parent for p in EXPERIMENTS.rglob("__init__.py")}
    folders = lambda p: {q.name for q in p.iterdir() if q.is_dir() and q.name != "__pycache__"}  # noqa: E731
    studies = layout.studies()
    assert studies and folders(STUDIES) == {s.name for s in studies}
    assert len({layout.STUDY.fullmatch(s.name).group(1) for s in studies}) == len(studies)  # one study per number
    for study in studies:
        rounds = layout.rounds(study)
        assert [int(layout.ROUND.fullmatch(r.name).group(1)) for r in rounds] == list(range(1, len(rounds) + 1))
        assert folders(study) == {r.name for r in rounds} and (study / "README.md").exists(), study.name
        assert {p.name for p in study.iterdir() if p.is_file()} <= {"README.md", "__init__.py"}, study.name
    assert folders(BENCHMARKS) == {b.name for b in layout.benchmarks()}
    for folder in [*(r for s in studies for r in layout.rounds(s)), *layout.benchmarks()]:
        finding = json.loads((folder / "finding.json").read_text())
        assert claims.KEYS <= set(finding) <= claims.KEYS | claims.OPTIONAL, folder
        assert all(finding[k] for k in claims.KEYS), folder


def test_discovery_finds_a_study_added_later(tmp_path):
    """A new study folder is found without editing a list: studies in the order of their number, rounds in theirs,
    and a round with analyze.py, runs.jsonl and results.json is an analysis the slow test re-runs."""
    for rel in ("s10_b/r1_x", "s2_a/r1_x", "s2_a/r2_y", "s11_new/r10_late", "s11_new/r2_more", "notes"):
        (tmp_path / rel).mkdir(parents=True)
    for name in ("analyze.py", "runs.jsonl", "results.json"):
        (tmp_path / "s11_new" / "r2_more" / name).write_text("")
    (tmp_path / "s2_a" / "r1_x" / "analyze.py").write_text("")  # no committed runs: not an analysis
    assert [p.name for p in layout.studies(tmp_path)] == ["s2_a", "s10_b", "s11_new"]
    assert [p.name for p in layout.rounds(tmp_path / "s11_new")] == ["r2_more", "r10_late"]
    assert layout.analyses(tmp_path) == [tmp_path / "s11_new" / "r2_more"]
    assert layout.module(STUDIES / "s2_warmup" / "r2_xavier" / "analyze.py") == (
        "experiments.studies.s2_warmup.r2_xavier.analyze")


def test_every_round_with_committed_runs_is_an_analysis():
    """Discovery cannot miss a round: every committed runs.jsonl sits beside an analyze.py and its results."""
    saved = {p.parent for p in STUDIES.rglob("runs.jsonl")}
    pieces = {p for p in saved if p.parent.name == layout.PARTS}
    assert ANALYSES and saved - pieces == set(ANALYSES)
    for piece in pieces:  # a round's pieces only until its own runs are committed, and only in a round that analyses
        round_ = piece.parent.parent
        assert (round_ / "analyze.py").exists() and not (round_ / "runs.jsonl").exists(), piece
    assert {layout.module(a / "analyze.py") for a in ANALYSES} <= set(modules())


def test_every_study_module_imports():
    for name in modules():
        importlib.import_module(name)


def test_no_sys_path_manipulation_in_experiments():
    offenders = [str(p.relative_to(ROOT)) for p in EXPERIMENTS.rglob("*.py") if "sys.path" in p.read_text()]
    assert not offenders


def test_index_in_the_readme_is_the_generated_one():
    """experiments/README.md's table is what python -m experiments.index writes from the finding.json files: one
    line per study (every round's finding in it) and one per benchmark."""
    readme = (EXPERIMENTS / "README.md").read_text()
    assert index.current(readme) == index.table(), "run: python -m experiments.index"
    table = index.table()
    for folder in [*layout.studies(), *layout.benchmarks()]:  # one line each
        assert table.count(f"]({folder.relative_to(EXPERIMENTS)}/)") == 1, folder.name
    assert index.update(readme) == readme


# A headline's numbers: what experiments.common.claims reads as a number in a finding's text (its question, finding
# and headline), with the digits written.
_written_numbers, _value, _rounds_to, _SCALE = claims.written_numbers, claims.value, claims.rounds_to, claims.SCALE


def _numbers_of(data) -> list[float]:
    """Every number in a parsed JSON value or a text (its keys and strings read as text)."""
    if isinstance(data, bool) or data is None:
        return []
    if isinstance(data, (int, float)):
        return [float(data)] if math.isfinite(data) else []
    if isinstance(data, str):
        return [_value(m) for m in _written_numbers(data)]
    items = data.items() if isinstance(data, dict) else enumerate(data)
    return [n for k, v in items for n in (_numbers_of(k) if isinstance(k, str) else []) + _numbers_of(v)]


def _result_numbers(folder: Path) -> list[float]:
    """A round's numbers: its result files (every .json / .md it commits but its finding, its runs' curves and S1's
    raw gradients) and what experiments.studies.headlines computes for it."""
    from experiments.studies import headlines

    files = [p for p in sorted(folder.rglob("*")) if p.suffix in (".json", ".md")
             and p.name not in ("finding.json", "curves.json", "raw.json")]
    found = [n for p in files for n in _numbers_of(json.loads(p.read_text()) if p.suffix == ".json" else p.read_text())]
    return found + [v for values in headlines.numbers(folder).values() for v in values]


def _unfounded(text: str, numbers: list[float]) -> list[str]:
    """The numbers written in ``text`` that no number of ``numbers`` rounds to."""
    return [m[0] for m in _written_numbers(text)
            if not any(_rounds_to(m, s * _SCALE.get(m[5], 1.0)) or _rounds_to(m, s) for s in numbers)]


def test_every_headline_number_is_in_its_round_results():
    """Each round's finding.json (its question, finding and headline: the index line and the README's headline) writes
    only numbers its round's result
    files hold or experiments.studies.headlines computes from the committed runs (scale, labelled re-analyses)."""
    unfounded = {}
    for folder in [r for s in layout.studies() for r in layout.rounds(s)]:
        if missing := _unfounded(" ".join(claims.texts(index.finding(folder))), _result_numbers(folder)):
            unfounded[str(folder.relative_to(STUDIES))] = missing
    assert not unfounded, "\n".join(f"{name}: {', '.join(missing)}" for name, missing in unfounded.items())


def test_a_headline_number_no_result_holds_is_found(tmp_path):
    """The check of the test above: a number typed with other digits than the results', or one they do not hold,
    is found, whatever its form (signed, an interval, a range, a percentage, an exponent, a ratio)."""
    (tmp_path / "results.json").write_text(json.dumps({"diff": 0.0763, "ci": [0.0702, 0.0831], "share": [0.439, 0.70],
                                                       "logit": 104711.4, "ratio": 0.4128, "n_params": 341424}))
    numbers = _numbers_of(json.loads((tmp_path / "results.json").read_text()))
    held = ("+0.076 nats, 95% CI [+0.070, +0.083] (S7, GPT-2, fp16, E2, Xiong et al. 2020, pre-registered 7c4bede)"
            "; 44-70% saturated; logits 1e5 (1.05e5); 0.41x; 0.34M parameters; round 4")
    assert _unfounded(held, numbers) == []
    for typo in ("+0.077 nats", "[+0.070, +0.084]", "-0.076", "45-70%", "2e5", "0.42x", "0.35M", "0.0763 and 3.5"):
        assert _unfounded(typo, numbers), typo


def test_every_finding_holds_its_claims():
    """Each finding.json's claims are its numbers' result keys: every claim's text is in the finding, its estimate and
    interval are the numbers its keys hold, every interval the finding writes is a claim's, and a round whose runs
    are committed is not called not yet run."""
    folders = [*(r for s in layout.studies() for r in layout.rounds(s)), *layout.benchmarks()]
    wrong = {str(f.relative_to(EXPERIMENTS)): found for f in folders if (found := claims.problems(f))}
    assert not wrong, "\n".join(f"{name}: {'; '.join(found)}" for name, found in wrong.items())


def test_every_headline_and_restated_round_has_structured_claims():
    """A finding that the README's headlines quote, or that re-reads its round, ties its numbers to result keys."""
    bare = [str(r.relative_to(STUDIES)) for s in layout.studies() for r in layout.rounds(s)
            if ({"headline", "re_reading"} & set(f := index.finding(r))) and not f.get("claims")]
    assert not bare


def _made_up_round(tmp_path: Path, finding: dict) -> Path:
    folder = tmp_path / "r1_made_up"
    folder.mkdir(parents=True)
    (folder / "results.json").write_text(json.dumps({"holm": {"parts": {
        "P1": {"mean": 1.4562, "ci_low": 0.8731, "ci_high": 2.4288},
        "P2": {"mean": 0.1091, "ci_low": 0.0882, "ci_high": 0.1303}}}, "steps": {"0": 300, "1": 400}}))
    (folder / "runs.jsonl").write_text("{}\n")
    (folder / "finding.json").write_text(json.dumps(finding))
    return folder


def _claim(name: str, written: str) -> dict:
    key = f"results.json:holm/parts/{name}/"
    return {"claim": name, "units": "nats", "written": written, "estimate": key + "mean",
            "interval": [key + "ci_low", key + "ci_high"]}


def test_a_number_attached_to_the_wrong_claim_is_rejected(tmp_path):
    """The check of the test above, on a made-up round: its finding as written passes; two intervals swapped in the
    text, or in the text and the claims, a key naming the other claim's number, a range over seeds read off the wrong
    keys, an interval no claim holds, or a round that ran called not yet run: each is found, in the finding as in a
    headline (a correct headline does not cover a swap in the finding)."""
    good = {"question": "q?", "finding": "P2 +0.109 nats [+0.088, +0.130]; P1 ratio 1.456 [0.873, 2.429]; "
                                         "reached at step 300-400",
            "claims": [_claim("P2", "+0.109 nats [+0.088, +0.130]"), _claim("P1", "1.456 [0.873, 2.429]"),
                       {"claim": "steps", "units": "steps", "written": "step 300-400", "interval": None,
                        "estimate": ["results.json:steps/0", "results.json:steps/1"]}]}
    assert claims.problems(_made_up_round(tmp_path / "good", good)) == []
    swapped_text = {**good, "finding": "P2 +0.109 nats [0.873, 2.429]; P1 ratio 1.456 [+0.088, +0.130]; "
                                       "reached at step 300-400"}
    swapped_both = {**swapped_text, "claims": [_claim("P2", "+0.109 nats [0.873, 2.429]"),
                                               _claim("P1", "1.456 [+0.088, +0.130]"), good["claims"][2]]}
    wrong_key = {**good, "claims": [_claim("P1", "+0.109 nats [+0.088, +0.130]"), *good["claims"][1:]]}
    wrong_range = {**good, "claims": [*good["claims"][:2], {**good["claims"][2], "estimate": [
        "results.json:steps/1", "results.json:steps/0"]}]}
    swapped_beside_a_headline = {**swapped_text, "headline": {"group": "shown", "text": good["finding"]}}
    no_claim = {**good, "finding": good["finding"] + "; P3 +0.02 [+0.01, +0.03]"}
    not_run = {**good, "finding": "**pre-registered, not yet run** " + good["finding"]}
    assert claims.problems(_made_up_round(tmp_path / "headline", {**good, "headline": {
        "group": "shown", "text": good["finding"]}})) == []
    for name, bad in [("swapped_text", swapped_text), ("swapped_beside_a_headline", swapped_beside_a_headline),
                      ("swapped_both", swapped_both), ("wrong_key", wrong_key),
                      ("wrong_range", wrong_range), ("no_claim", no_claim), ("not_run", not_run)]:
        assert claims.problems(_made_up_round(tmp_path / name, bad)), name


def test_headlines_in_the_readme_are_the_generated_ones():
    """experiments/README.md's headlines are what python -m experiments.index writes from the findings: each
    round's headline in its group, the re-readings and observations by name, and the rounds not yet run exactly
    those whose finding says so (none of them with committed runs)."""
    readme = (EXPERIMENTS / "README.md").read_text()
    assert index.current_headlines(readme) == index.headlines(), "run: python -m experiments.index"
    waiting = [line for line in index.headlines().split("\n- ") if line.lstrip("- ").startswith(index.NOT_RUN_WORDS)]
    ran = {index.round_name(r) for r in ANALYSES}
    assert not [name for line in waiting for name in ran if re.search(rf"\b{name}\b", line)]


def test_documented_commands_name_modules_that_exist():
    """Every command in experiments/, README.md, docs/ and configs/experiment/ runs a module (python -m
    experiments.x.y) that exists, never a path."""
    texts = {p: p.read_text() for p in TEXTS}
    by_path = [f"{p.relative_to(ROOT)}: {m}" for p, t in texts.items()
               for m in re.findall(r"(?:python3?|\$PY)\s+experiments/\S+\.py", t)]
    assert not by_path
    named = {m for t in texts.values() for m in re.findall(r"-m (experiments(?:\.\w+)+)", t)}
    assert named and not [m for m in named if importlib.util.find_spec(m) is None]


def test_documented_paths_and_links_exist():
    """Every experiments/... path a document or docstring names exists down to its round or benchmark (results
    folders a script writes later may not), and every relative markdown link resolves."""
    missing = []
    for path in TEXTS:
        text = path.read_text()
        for mention in re.findall(r"experiments/[\w./-]*\w", text):
            parts = mention.split("/")
            if not ROOT.joinpath(*parts[:4 if parts[1:2] == ["studies"] else 3]).exists():
                missing.append(f"{path.relative_to(ROOT)}: {mention}")
        if path.suffix == ".md":
            for link in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
                if not re.match(r"\w+://", link) and not (path.parent / link).exists():
                    missing.append(f"{path.relative_to(ROOT)}: ({link})")
    assert not missing


def test_experiments_cite_only_what_the_repository_holds():
    """No document of experiments/ points at notes a reader of the repository cannot open (a Markdown file the
    repository does not hold, a path above the checkout or outside it, an issue number, the "sessions" of whoever
    measured: a reader has runs and rounds), and none has runs of blank lines. Scripts are held to the paths and
    issue numbers only: the .md names they mention are files they write."""
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    held = {Path(f).name for f in tracked.split()}
    markdown = re.compile(r"(?<![\w./-])[\w./-]*?([A-Za-z][\w-]*\.md)\b")
    elsewhere = re.compile(r"(?<![\w:/.~-])/(?:work|home|root|mnt|srv|opt)/[\w./-]*|\b[Ii]ssues? #?\d+"
                           r"|\b[Ss]essions?\b")
    found = []
    for p in (p for p in TEXTS if EXPERIMENTS in p.parents):
        text = p.read_text()
        cites = [m.group(0) for m in elsewhere.finditer(text)]
        cites += [m.group(0) for m in re.finditer(r"(?<![\w.])\.\./[\w./-]+", text)
                  if not (p.parent / m.group(0)).resolve().is_relative_to(ROOT)]
        if p.suffix != ".py":
            cites += [m.group(0) for m in markdown.finditer(text) if m.group(1) not in held]
        found += [f"{p.relative_to(EXPERIMENTS)}: {c}" for c in cites]
    assert not found
    assert not [p for p in DOCUMENTS if EXPERIMENTS in p.parents and "\n\n\n" in p.read_text()]


def _same_as_committed(committed: Path, out: Path) -> None:
    """results.json and results.md, and the engine's verdicts.json / verdicts.md where the round commits them, byte
    for byte: an analysis names the machine its runs recorded, not the one it is re-run on."""
    names = ["results.json", "results.md", *(n for n in ("verdicts.json", "verdicts.md") if (committed / n).exists())]
    for name in names:
        assert (out / name).read_text() == (committed / name).read_text(), committed / name


def test_analyses_name_the_machine_their_runs_recorded():
    """No analysis describes the computer it runs on (machine()): its Machine line and results.json's "machine" are
    the runs' own records (machine.runs_machine), the same wherever the analysis is re-run."""
    import ast

    trees = {str(a.relative_to(STUDIES)): ast.parse((a / "analyze.py").read_text()) for a in ANALYSES}
    calls = [name for name, tree in trees.items() for node in ast.walk(tree)
             if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "machine"]
    assert not calls
    named = {str(a.relative_to(STUDIES)): json.loads((a / "results.json").read_text()).get("machine") for a in ANALYSES}
    assert [m for m in named.values() if m] and not [a for a, m in named.items() if m and
                                                       not m.startswith("the runs' records, ")]
    assert runs_machine([{"cpu_capability": "AVX2", "torch_version": "2.13.0+cpu"}] * 3) == (
        "the runs' records, AVX2 kernels, torch 2.13.0+cpu: 3 runs")
    recorded = [{"git_commit": "e31a8e5aa", "git_dirty": False}, {"git_commit": "3bc3281ff", "git_dirty": True},
                {"git_commit": "e31a8e5aa", "git_dirty": False}, {}]
    assert runs_commits(recorded) == "3bc3281+dirty, commit unrecorded, e31a8e5"


def _smallest(n: int) -> list[Path]:
    """The n analyses with the least committed data: the cheap ones the default suite regenerates."""
    return sorted(ANALYSES, key=lambda a: sum((a / f).stat().st_size for f in ("runs.jsonl", "curves.json")))[:n]


def _id(folder: Path) -> str:
    return str(folder.relative_to(STUDIES))


@pytest.mark.parametrize("folder", _smallest(2), ids=_id)
def test_analysis_regenerates_the_committed_results(folder, tmp_path, monkeypatch):
    """The cheapest analyses run as `python -m <module>` (here in-process, as runpy runs -m) from the committed
    runs: the same results.json and results.md."""
    module = layout.module(folder / "analyze.py")
    monkeypatch.setattr(sys, "argv", [module, "--out", str(tmp_path)])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # "found in sys.modules": imported by another test
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    _same_as_committed(folder, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("folder", ANALYSES, ids=_id)
def test_every_analysis_regenerates_the_committed_results(folder, tmp_path):
    subprocess.run([sys.executable, "-m", layout.module(folder / "analyze.py"), "--out", str(tmp_path)], cwd=ROOT,
                   check=True, timeout=300, capture_output=True)
    _same_as_committed(folder, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("committed", sorted(STUDIES.glob("s6_cost/r*/quality.json")), ids=lambda p: p.parent.name)
def test_s6_quality_reanalysis_regenerates_the_committed_results(committed, tmp_path):
    """S6's quality rounds keep their runs in quality.json: `quality --reanalyze` writes the same JSON and the same
    quality_verdicts/ folder."""
    subprocess.run([sys.executable, "-m", "experiments.studies.s6_cost.r1_cost.quality", "--reanalyze",
                    str(committed), "--out", str(tmp_path / "quality.json")], cwd=ROOT, check=True, timeout=300,
                   capture_output=True)
    assert (tmp_path / "quality.json").read_text() == committed.read_text()
    for file in ("verdicts.json", "verdicts.md"):
        again, before = tmp_path / "quality_verdicts" / file, committed.parent / "quality_verdicts" / file
        assert again.read_text() == before.read_text()


# Every interval, test and verdict of a study comes from minillm.analysis.stats / minillm.analysis.compare: no module
# under
# experiments/ imports a statistics library or calls a distribution or a test itself. A study that needs another
# statistic names its file here with the reason (none does: the growth exponents of S1 and S5 are numpy
# least-squares fits, and the benchmarks take medians).
STATISTICS_LIBRARIES = ("scipy", "statsmodels", "pingouin")
STATISTICS_CALLS = {"ppf", "cdf", "sf", "isf", "ttest_rel", "ttest_ind", "ttest_1samp", "fisher_exact", "binomtest",
                    "binom_test", "barnard_exact", "boschloo_exact", "proportion_ci", "mannwhitneyu", "wilcoxon",
                    "NormalDist", "comb"}
STATISTICS_ALLOWED: dict[str, str] = {}  # "experiments/<path>.py": "why it needs its own statistic"


def _statistics_of(path: Path) -> list[str]:
    """The statistics libraries a module imports and the statistical functions it calls or imports by name."""
    import ast

    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.split(".")[0] in STATISTICS_LIBRARIES]
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if module.split(".")[0] in STATISTICS_LIBRARIES:
                found.append(module)
            found += [f"{module}.{a.name}" for a in node.names if a.name in STATISTICS_CALLS]
        elif isinstance(node, ast.Attribute) and node.attr in STATISTICS_CALLS:
            found.append(f".{node.attr}")
    return found


def test_studies_take_every_statistic_from_the_engine(tmp_path):
    """No study re-implements what minillm.analysis.stats has (a t interval, a Fisher or binomial test, a hypergeometric
    sum): the statistics live in one place."""
    offenders = {str(p.relative_to(ROOT)): found for p in sorted(EXPERIMENTS.rglob("*.py"))
                 if (found := _statistics_of(p)) and str(p.relative_to(ROOT)) not in STATISTICS_ALLOWED}
    assert not offenders, offenders
    bad = tmp_path / "copy.py"  # the check sees each way a copy could come back
    bad.write_text("from scipy import stats\nimport math\nfrom statistics import NormalDist\n"
                   "h = stats.t.ppf(0.975, 3)\np = math.comb(10, 4)\n")
    assert sorted(_statistics_of(bad)) == [".comb", ".ppf", "scipy", "statistics.NormalDist"]


def test_the_instrumentation_benchmark_runs_and_times_the_callbacks(tmp_path):
    """A short run of the stability-instrumentation benchmark (its README's command, fewer steps) writes its
    estimates: the benchmark keeps working as the configs it composes grow."""
    from experiments.benchmarks.instrumentation_cost import bench

    bench.main(["--block", "10", "--blocks", "4", "--skip", "10", "--batch", "4", "--threads", "1",
                "--out", str(tmp_path)])
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["direct"]["cpu_time"]["instrumentation_ms_per_step"] > 0


def test_run_kernels_counts_what_the_runs_recorded():
    runs = [{"cpu_capability": "AVX2", "torch_version": "2.13.0+cpu"}] * 2 + [
        {"cpu_capability": "AVX512", "torch_version": "2.13.0+cpu"}, {}]
    assert run_kernels(runs) == ("AVX2 kernels, torch 2.13.0+cpu: 2 runs; AVX512 kernels, torch 2.13.0+cpu: 1 runs; "
                                 "unrecorded kernels, torch unrecorded: 1 runs")


def test_machine_names_cpu_cores_and_torch():
    desc = machine()
    assert desc.strip() and "cores" in desc and torch.__version__ in desc


def test_reference_loop_is_built_from_the_configs():
    """Model, norm options, optimizer groups and lr come from the composed config, not from copied values."""
    from minillm.training.run.build import model_config

    cfg = reference.compose("norm=batchnorm", "optimizer.lr=0.01", "module.decay_norms=true", "model.n_layers=2")
    model, optimizer, scheduler = reference.build(cfg, vocab_size=88)
    assert model.cfg.to_dict() == model_config(cfg, 88).to_dict() and model.cfg.norm_options["stats"] == "position"
    decay, no_decay = optimizer.param_groups
    assert decay["initial_lr"] == 0.01 and decay["weight_decay"] == cfg.optimizer.weight_decay
    assert no_decay["weight_decay"] == 0.0
    assert {id(p) for p in model.layers[0].attn_norm.parameters()} <= {id(p) for p in decay["params"]}
    assert id(model.tok_emb.weight) in {id(p) for p in no_decay["params"]}
    assert scheduler.lr_lambdas[0](0) == pytest.approx(1 / cfg.scheduler.warmup_steps)
    with pytest.raises(ValueError, match="z_loss"):
        reference.Loop.of(reference.compose("module.z_loss=1e-4"))


@pytest.mark.slow
def test_reference_loop_reproduces_the_committed_calibration():
    """The reference arm's first steps match the committed calibration run (python -m
    experiments.benchmarks.calibration.run --check): the loop trains the same model as when the calibration was
    measured."""
    subprocess.run([sys.executable, "-m", "experiments.benchmarks.calibration.run", "--check", "20"], cwd=ROOT,
                   check=True, timeout=600)


@pytest.mark.slow  # long (end to end); `-m slow` runs it
def test_independent_loop_imports_nothing_from_minillm_and_trains(tmp_path):
    """experiments/benchmarks/calibration/nanogpt_loop.py, as independent.py runs it (a file, not a module of the
    package): no minillm module is loaded, its first losses are near ln(vocab) and fall on a repetitive text."""
    text = tmp_path / "t.txt"
    text.write_text("to be or not to be, that is the question. " * 200)
    script = BENCHMARKS / "calibration" / "nanogpt_loop.py"
    code = (f"import runpy, sys; runpy.run_path({str(script)!r}, run_name='__main__'); "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('minillm', 'experiments')))")
    args = ["--text", str(text), "--out", str(tmp_path / "r.json"), "--steps", "30", "--eval-every", "30",
            "--eval-windows", "8", "--dim", "32", "--layers", "2", "--heads", "2", "--hidden", "64", "--seq", "16",
            "--warmup", "5", "--lr", "1e-2"]
    out = subprocess.run([sys.executable, "-c", code, *args], cwd=tmp_path, capture_output=True, text=True,
                         timeout=120, check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]"
    result = json.loads((tmp_path / "r.json").read_text())
    assert result["vocab"] == len(set(text.read_text()))
    assert result["test_loss"] < 0.8 * math.log(result["vocab"])


def test_independent_loop_has_the_default_models_size():
    """The loop's default sizes are train.py's default model: the same parameter count (826,496)."""
    from experiments.benchmarks.calibration import nanogpt_loop
    from minillm.model import Transformer
    from minillm.training.run.build import model_config

    loop = nanogpt_loop.CharLM(88, 128, 4, 4, 352, 64, 1e-5, 0.02, 10000.0)
    ours = Transformer(model_config(reference.compose(), 88))
    assert sum(p.numel() for p in loop.parameters()) == sum(p.numel() for p in ours.parameters()) == 826_496


def test_calibration_judgement_comes_back_from_the_committed_runs():
    """The independent calibration's committed judgement (with Welch's interval) from its committed pairs."""
    from experiments.benchmarks.calibration import independent

    committed = json.loads(independent.RESULTS.read_text())
    assert independent.judge(committed["pairs"]) == committed["verdict"]
    assert committed["verdict"]["within_target"] and committed["verdict"]["engine_verdict"] == "equivalent"


@pytest.mark.slow
@pytest.mark.parametrize("folder", sorted(STUDIES.glob("*/r*/stability.py")), ids=lambda p: _id(p.parent))
def test_stability_reanalyses_regenerate_the_committed_files(folder, tmp_path):
    """A round's re-analysis by the stability verdict (in its study's README) writes the same verdicts from its
    committed runs."""
    subprocess.run([sys.executable, "-m", layout.module(folder), "--out", str(tmp_path)], cwd=ROOT, check=True,
                   timeout=300, capture_output=True)
    for name in ("verdicts.json", "verdicts.md"):
        assert (tmp_path / name).read_text() == (folder.parent / "stability" / name).read_text(), folder


GPU_ROUNDS = ("s10_mixln.r5_gpu_depth", "s2_warmup.r3_gpu_width")


def test_the_gpu_round_fits_its_nine_minutes():
    """The GPU command's two parts: their stages' limits sum to at most 540 s, and 10 training runs in all."""
    import importlib

    from experiments.common import gpu_plan

    plans = [importlib.import_module(f"experiments.studies.{r}.plan") for r in GPU_ROUNDS]
    assert sum(p.BUDGET_S for p in plans) <= gpu_plan.BUDGET_S
    for p in plans:
        assert sum(s.limit_s for s in p.STAGES) <= p.BUDGET_S
    assert sum(len(s.runs) for p in plans for s in p.STAGES) == 10


@pytest.mark.slow
@pytest.mark.parametrize("round_", GPU_ROUNDS)
def test_the_gpu_round_dry_run_builds_every_config(round_):
    """--dry-run on the CPU: every run's config composed and its model built, the estimates inside each limit."""
    import importlib

    plan = importlib.import_module(f"experiments.studies.{round_}.plan")
    assert plan.main(["--dry-run"]) == 0
