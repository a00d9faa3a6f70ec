"""The GPU steps' tools: what the steps bring back becomes one report per device, and a failed row keeps its cause."""

import json
from pathlib import Path

import pytest
from helpers import compose_cfg

import minillm.training.train as train_script
from experiments.benchmarks.gpu import merge, preset
from experiments.common.failure import TRACEBACK_LINES, failure
from minillm.metrics import MFU, TOKENS_PER_S


def _step(folder: Path, device: str, tokens_per_s: float = 1000.0) -> Path:
    """A preset step's and a train step's result files, as the steps write them on `device`."""
    folder.mkdir(parents=True)
    run = {"compiled": True, "stability": True, TOKENS_PER_S: tokens_per_s, MFU: 0.4, "wall_s": 60.0}
    (folder / "preset.json").write_text(json.dumps({"meta": {"what": "x", "date": "d", "steps": 10,
                                                             "device": device}, "runs": [run]}))
    (folder / f"throughput-{device}.json").write_text(json.dumps({"device": device, "c": [
        {"norm": "rmsnorm", "compiled": False, "tokens_per_s": tokens_per_s, "mfu": 0.3}]}))
    return folder


def test_steps_of_one_device_merge_into_that_devices_report(tmp_path):
    a, b = _step(tmp_path / "a", "NVIDIA H100 80GB HBM3"), _step(tmp_path / "b", "NVIDIA H100 80GB HBM3")
    path = merge.main([str(a), str(b), "--results", str(tmp_path / "results")])
    assert path.name == "NVIDIA-H100-80GB-HBM3.json"
    merged = json.loads(path.read_text())
    assert merged["device"] == "NVIDIA H100 80GB HBM3" and len(merged["throughput"]) == 2
    assert path.with_suffix(".md").read_text().startswith("# First GPU contact: NVIDIA H100 80GB HBM3")


def test_the_report_gives_the_gpu_machines_paths_relative(tmp_path):
    """Logs name the GPU machine's files by absolute paths a reader cannot open: the report gives Python's packages
    from site-packages/ and the checkout's files from the repository root."""
    a = _step(tmp_path / "a", "NVIDIA H200")
    (a / "tests.log").write_text("/opt/venv/lib/python3.12/site-packages/torch/_inductor/compile_fx.py:322: Warn\n"
                                 'File "/srv/checkout/minillm/kernels/rmsnorm.py", line 3, in check_args\n'
                                 "see https://github.com/o/minillm/blob/main/tests/t.py and minillm/tests/x.py\n"
                                 "/srv/checkout/train.py trainer=gpu hydra.run.dir=/tmp/minillm_preset_x1/run\n")
    path = merge.main([str(a), "--results", str(tmp_path / "results")])
    text = path.with_suffix(".md").read_text()
    assert "site-packages/torch/_inductor/compile_fx.py:322" in text and '"minillm/kernels/rmsnorm.py"' in text
    assert "train.py trainer=gpu hydra.run.dir=$TMPDIR/minillm_preset_x1/run" in text
    assert "/opt/" not in text and "/srv/" not in text and "/opt/" not in path.read_text()
    assert "https://github.com/o/minillm/blob/main/tests/t.py and minillm/tests/x.py" in text  # untouched


def test_steps_of_two_devices_are_refused_with_one_line(tmp_path):
    a, b = _step(tmp_path / "a", "NVIDIA H100 80GB HBM3"), _step(tmp_path / "b", "NVIDIA H200")
    with pytest.raises(SystemExit) as err:
        merge.main([str(a), str(b), "--results", str(tmp_path / "results")])
    message = str(err.value)
    assert message.startswith("merge: error: the folders hold steps of 2 devices") and "\n" not in message
    assert "NVIDIA H200: " in message and "merge each device's folders on their own" in message
    assert not (tmp_path / "results").exists()  # nothing half-written


def test_a_failed_row_keeps_the_root_cause_and_the_traceback():
    def compile_step():
        try:
            {}["triton"]
        except KeyError as e:
            raise RuntimeError("backend='inductor' raised:") from e

    try:
        compile_step()
    except RuntimeError as e:
        row = failure(e)
    assert row["error"] == "RuntimeError: backend='inductor' raised: <- KeyError: 'triton'"
    assert "compile_step" in row["traceback"] and len(row["traceback"].splitlines()) <= TRACEBACK_LINES


@pytest.mark.parametrize("stability", [True, False])
def test_the_presets_overrides_train_with_the_default_callbacks(tmp_path, corpus, stability):
    """The preset step's config (its overrides over the default callbacks, the dry run's model) trains and logs
    tokens/s: a callback added to the defaults later (e.g. a second checkpoint callback, which Lightning refuses
    with enable_checkpointing=false) must not break the one GPU run."""
    cfg = compose_cfg(tmp_path, corpus, *preset.DRY, *preset.COMMON, "trainer.max_steps=4",
                      "trainer.log_every_n_steps=2", *([] if stability else preset.NO_STABILITY))
    train_script.train(cfg)
    metrics = preset.read_metrics(Path(cfg.paths.output_dir) / "csv" / "metrics.csv")
    assert metrics[TOKENS_PER_S] > 0


def test_a_failed_preset_run_keeps_the_end_of_both_streams(tmp_path, monkeypatch):
    monkeypatch.setattr(preset, "ROOT", tmp_path)  # no train.py there: python exits 2 with its message on stderr
    row = preset.run_one(compiled=False, stability=True, steps=2, dry=True, workdir=tmp_path, timeout=60)
    assert row["error"].startswith("exit 2: ") and "train.py" in row["error"]
    assert "No such file or directory" in row["stderr_tail"] and "stdout_tail" in row


def test_a_step_whose_runs_all_failed_exits_non_zero_and_keeps_its_rows(tmp_path, monkeypatch):
    monkeypatch.setattr(preset, "ROOT", tmp_path)  # every train.py run fails at once
    with pytest.raises(SystemExit, match="4 of 4 runs failed"):
        preset.main(["--out", str(tmp_path / "out"), "--dry-run", "--timeout", "60"])
    rows = json.loads((tmp_path / "out" / "preset.json").read_text())["runs"]
    assert len(rows) == 4 and all(r["error"].startswith("exit 2: ") for r in rows)


def test_the_gpu_norm_comparison_composes_each_of_its_jobs(tmp_path):
    """configs/experiment/gpu_norms.yaml as a GPU run composes it (no test overrides): every job of its sweep passes
    the config checks (its fused_rmsnorm arm here under the interpreter), on the GPU trainer, BPE data, the model
    size its header states, and a stability monitor that leaves the compiled steps alone after step 0."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import open_dict

    from minillm.model import Transformer
    from minillm.training.run.checks import check_config, model_config

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(Path(__file__).resolve().parents[1] / "configs"), version_base="1.3"):
        for norm in ("rmsnorm", "layernorm", "fused_rmsnorm"):
            for placement in ("pre", "post"):
                cfg = compose("train", overrides=["experiment=gpu_norms", f"norm={norm}", f"placement={placement}",
                                                  f"paths.log_dir={tmp_path}"], return_hydra_config=True)
                HydraConfig.instance().set_config(cfg)  # as @hydra.main does: the run folder resolves
                with open_dict(cfg):
                    del cfg["hydra"]
                check_config(cfg)
    GlobalHydra.instance().clear()
    assert (cfg.trainer.accelerator, cfg.trainer.precision, cfg.model.compile) == ("gpu", "bf16-mixed", True)
    assert (cfg.data.tokenizer, cfg.data.vocab_size, cfg.trainer.max_steps) == ("bpe", 4096, 600)
    assert cfg.callbacks.stability.every_n_steps > cfg.trainer.max_steps
    assert cfg.callbacks.stability.probe_every_n_steps is None
    params = Transformer(model_config(cfg, 4096)).num_params()  # the 4096-token BPE
    assert 25e6 < params < 33e6, params  # "a ~29M-parameter model"


@pytest.mark.slow
def test_the_norm_comparison_step_runs_its_sweep_and_both_verdicts(tmp_path):
    """plan.sh norms --dry-run: the 18 jobs of the GPU norm comparison (tiny, on the CPU), then the loss and the
    speed verdicts of each norm against rmsnorm, per placement, as the GPU run writes them."""
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "OUT": str(tmp_path), "PYTHON": sys.executable, "WANDB_MODE": "offline"}
    res = subprocess.run(["bash", "experiments/benchmarks/gpu/plan.sh", "norms", "--dry-run"], cwd=root, env=env,
                         capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert len(list((tmp_path / "logs" / "gpu_norms" / "multiruns").glob("*/*/summary.json"))) == 18
    for folder, metric in (("norms_loss", "final_val_loss"), ("norms_speed", "steady_tokens_per_s")):
        verdicts = json.loads((tmp_path / folder / "verdicts.json").read_text())
        comparisons = verdicts["comparisons"]
        assert sorted((c["arm"], c["stratum"]["placement"]) for c in comparisons) == sorted(
            (arm, p) for arm in ("layernorm", "fused_rmsnorm") for p in ("pre", "post"))
        assert verdicts["metric"] == metric


@pytest.mark.slow
def test_the_next_run_is_one_command_with_at_most_eight_files(tmp_path):
    """plan.sh next --dry-run: the whole next GPU run on the CPU (interpreter, tiny shapes, a few tests): every part
    exits 0, at most 8 files in one folder, the tune times both variants, the judged kernels are timed in 3 repeats
    with the tuned configs, the train step has the chunked loss at three batch sizes and the plain one beside it,
    and the folder merges into one report."""
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    out = tmp_path / "out"
    env = {**os.environ, "OUT": str(out), "PYTHON": sys.executable, "WANDB_MODE": "offline"}
    res = subprocess.run(["bash", "experiments/benchmarks/gpu/plan.sh", "next", "--dry-run"], cwd=root, env=env,
                         capture_output=True, text=True, timeout=1200)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    files = sorted(p.name for p in out.iterdir())
    assert len(files) <= 8 and all(p.is_file() for p in out.iterdir()), files
    assert {"env.txt", "tests.log", "next.log", "cpu-interpreter-smoke.json"} <= set(files)
    report = json.loads((out / "cpu-interpreter-smoke.json").read_text())
    assert all(r.get("add_bwd_ms") for r in report["tune"])  # both variants of every config
    assert report["kernels"] and all(len(r["fwd_repeats"]) == 3 for r in report["kernels"] + report["add_kernels"])
    assert all(r["run"]["kernel_code"].endswith("+tuned") for r in report["kernels"] + report["add_kernels"])
    assert {(r["norm"], r["loss_impl"]) for r in report["train_step"]} == {
        ("rmsnorm", "chunked"), ("fused_rmsnorm", "chunked"), ("rmsnorm", "plain")}
    assert len({r["batch"] for r in report["train_step"] if r["norm"] == "rmsnorm"}) == 3
    path = merge.main([str(out), "--results", str(tmp_path / "results")])
    assert "## Train step" in path.with_suffix(".md").read_text()
