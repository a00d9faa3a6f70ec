"""The training stack: real configs composed and instantiated, fast runs, sweeps, resume, bad input."""

from __future__ import annotations

import inspect
import json
import math
import subprocess
import sys
import time
from pathlib import Path

import lightning as L
import numpy as np
import pytest
import torch
from helpers import CONFIGS, EAGER_NORMS, ROOT, V, compose_cfg, logged, read_rows
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.utils import instantiate
from omegaconf import OmegaConf

import minillm.training.train as train_script
from minillm.errors import ConfigError, DataError
from minillm.model import PLACEMENTS, ModelConfig, Transformer
from minillm.norms import NORMS, DyT, LayerNorm, RMSNorm
from minillm.norms import norm_options as accepted_options
from minillm.placements import PLACEMENTS as LAYER_PLACEMENTS
from minillm.tools.hub import load_checkpoint
from minillm.training.run.build import build_trainer, model_config
from minillm.training.run.naming import group_sweeps

NORM_FILES = sorted(p.stem for p in (CONFIGS / "norm").glob("*.yaml"))


def train_losses(run_dir: Path) -> dict[int, float]:
    return logged(read_rows(run_dir), "train/loss")


@pytest.mark.parametrize("group", sorted(p.name for p in CONFIGS.iterdir() if p.is_dir()))
def test_every_config_in_every_group_composes_and_instantiates(group, tmp_path, corpus):
    """Each option of each group composes with the primary config and every component it selects builds
    (hydra and paths are not choosable; the data group's hub option needs the network, so it is built only)."""
    if group in ("hydra", "paths"):
        pytest.skip("composed by every other case")
    for option in sorted(p.stem for p in (CONFIGS / group).glob("*.yaml")):
        on_cpu = [] if torch.cuda.is_available() else ["trainer.accelerator=cpu", "trainer.devices=1"]  # gpu presets
        cfg = compose_cfg(tmp_path, corpus, f"{group}={option}", *on_cpu)
        if group == "data":
            assert type(instantiate(cfg.data)).__name__ == "TextDataModule"
            continue
        model_cfg = model_config(cfg, 11)
        assert model_cfg.norm == cfg.model.norm and model_cfg.placement == cfg.placement
        assert callable(instantiate(cfg.optimizer)) and callable(instantiate(cfg.scheduler))
        for node in ("callbacks", "logger"):
            for name, c in (cfg.get(node) or {}).items():
                assert c is None or "_target_" not in c or instantiate(c) is not None, (option, name)
        if option == "fsdp" and on_cpu:  # Lightning refuses FSDP without a GPU: build the strategy alone
            assert type(instantiate(cfg.trainer.strategy)).__name__ == "FSDPStrategy"
        else:
            assert isinstance(build_trainer(cfg, [], []), L.Trainer)


def test_debug_overfit_drives_the_loss_down_on_one_batch(tmp_path, corpus):
    cfg = compose_cfg(tmp_path, corpus, "debug=overfit", "trainer.max_steps=60", "trainer.val_check_interval=30",
                      "optimizer.lr=1e-2", "callbacks=none")
    train_script.train(cfg)
    losses = train_losses(Path(cfg.paths.output_dir))
    assert len(losses) == 60 and losses[59] < 0.5 * losses[0], losses


def test_instantiate_every_component(tmp_path, corpus):
    cfg = compose_cfg(tmp_path, corpus, "logger=wandb")
    dm = instantiate(cfg.data)
    dm.prepare_data()
    dm.setup("fit")
    model_cfg = model_config(cfg, dm.vocab_size)
    module = instantiate(cfg.module, _partial_=True)(model=model_cfg, optimizer=instantiate(cfg.optimizer),
                                                     scheduler=instantiate(cfg.scheduler))
    assert module.model.cfg.vocab_size == dm.vocab_size
    for name in ("callbacks", "logger"):
        for c in cfg[name].values():
            assert instantiate(c) is not None
    trainer = build_trainer(cfg, [], [])  # trainer.deterministic=auto is minillm's, resolved there
    assert trainer.max_steps == 4


@pytest.mark.parametrize("norm", EAGER_NORMS)  # the registry: a new norm is run through train.py too
@pytest.mark.parametrize("placement", ["pre", "post"])
def test_fast_dev_run_every_norm_and_placement(norm, placement, tmp_path, corpus):
    cfg = compose_cfg(tmp_path, corpus, "debug=fast_dev_run", f"norm={norm}", f"placement={placement}")
    metrics = train_script.train(cfg)
    assert "train/loss" in metrics and metrics["train/loss"] > 0


@pytest.mark.parametrize("placement", ["peri", "branch", "deepnorm", "double", "mix"])
def test_fast_dev_run_newer_placements(placement, tmp_path, corpus):
    metrics = train_script.train(compose_cfg(tmp_path, corpus, "debug=fast_dev_run", f"placement={placement}"))
    assert metrics["train/loss"] > 0


def test_short_run_logs_metrics_checkpoints_and_sample(tmp_path, corpus):
    cfg = compose_cfg(tmp_path, corpus, "trainer.max_steps=6")
    metrics = train_script.train(cfg)
    run = Path(cfg.paths.output_dir)
    rows = read_rows(run)
    for key in ("train/loss", "train/lr", "train/tokens", "val/loss", "val/ppl", "val/bpc", "test/loss"):
        assert any(r.get(key) for r in rows), key
    assert (run / "checkpoints" / "last.ckpt").exists() and (run / "checkpoints" / "best.ckpt").exists()
    assert "step 6" in (run / "samples.txt").read_text()
    tokens = [float(r["train/tokens"]) for r in rows if r.get("train/tokens")]
    assert tokens[-1] == 6 * 8 * 32  # steps * batch * seq_len
    assert metrics["test/bpc"] == pytest.approx(metrics["test/loss"] / 0.6931471805599453, rel=1e-5)
    # per-window losses of the final validation and of the test pass, in the run folder (module.eval_windows_dir)
    summary = json.loads((run / "summary.json").read_text())
    val, test = np.load(run / "val_windows.npy"), np.load(run / "test_windows.npy")
    assert val.dtype == np.float64 and len(val) == cfg.data.val_windows and len(test) >= len(val)
    assert val.mean() == pytest.approx(summary["final_val_loss"], rel=1e-5)
    assert test.mean() == pytest.approx(metrics["test/loss"], rel=1e-5)
    # every setting a user can sweep, for the comparison's strata: optimizer and its lrs, schedule, data, model
    settings = summary["settings"]
    assert settings["optimizer"]["_target_"] == "torch.optim.AdamW" and settings["optimizer"]["lr"] == summary["lr"]
    assert (settings["scheduler"]["warmup_steps"], settings["scheduler"]["kind"]) == (cfg.scheduler.warmup_steps,
                                                                                     "cosine")
    assert (settings["data"]["source"], settings["data"]["tokenizer"]) == (cfg.data.source, cfg.data.tokenizer)
    assert settings["model"]["norm"] == summary["norm"] and settings["model"]["dim"] == summary["dim"]
    assert settings["seed"] == summary["seed"] and settings["trainer"]["precision"] == summary["precision"]


def test_resume_continues_step_count_and_loss_curve(tmp_path, corpus):
    full = compose_cfg(tmp_path / "full", corpus, "trainer.max_steps=8", "trainer.val_check_interval=4")
    train_script.train(full)
    first = compose_cfg(tmp_path / "first", corpus, "trainer.max_steps=4", "trainer.val_check_interval=4",
                        "scheduler.total_steps=8")
    train_script.train(first)
    ckpt = Path(first.paths.output_dir) / "checkpoints" / "last.ckpt"
    time.sleep(1.1)  # started_at has 1 s resolution: the resumed segment starts in a later second
    resumed = compose_cfg(tmp_path / "resumed", corpus, "trainer.max_steps=8", "trainer.val_check_interval=4",
                          f"ckpt_path={ckpt}")
    train_script.train(resumed)
    a, b = train_losses(Path(full.paths.output_dir)), train_losses(Path(resumed.paths.output_dir))
    assert sorted(b) == [4, 5, 6, 7]  # the resumed run starts at step 4, not 0
    assert all(a[s] == b[s] for s in b), (a, b)  # bit-identical continuation on CPU in fp32
    # the summary covers the whole run, not only the resumed segment (the callbacks' state is checkpointed)
    whole, tail = (json.loads((Path(c.paths.output_dir) / "summary.json").read_text()) for c in (full, resumed))
    for key in ("steps", "tokens", "best_val_loss", "best_val_step", "final_val_loss", "max_grad_norm",
                "nonfinite_grad_steps", "spike_count", "max_abs_h", "diverged"):
        assert tail[key] == pytest.approx(whole[key], rel=1e-6), key
    first_summary = json.loads((Path(first.paths.output_dir) / "summary.json").read_text())
    assert tail["train_time_s"] > first_summary["train_time_s"]  # the first segment's time is included
    assert tail["started_at"] == first_summary["started_at"] <= tail["written_at"]  # dated from the first segment


def test_wandb_offline_run_directory_is_created(tmp_path, corpus, monkeypatch):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    cfg = compose_cfg(tmp_path, corpus, "logger=wandb", "trainer.max_steps=2")
    train_script.train(cfg)
    runs = list((Path(cfg.paths.output_dir) / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and any(runs[0].glob("*.wandb"))


@pytest.mark.slow  # the README's sweep (6 runs) runs in test_journey
def test_multirun_sweep_makes_one_run_dir_per_combination(tmp_path, corpus):
    sweep = tmp_path / "sweep"
    cmd = [sys.executable, str(ROOT / "train.py"), "-m", "model=tiny", "data=files", f"data.files=[{corpus}]",
           "data.batch_size=4", "data.val_windows=4", "trainer=cpu", "trainer.max_steps=2",
           "trainer.log_every_n_steps=1", "logger=csv",
           "callbacks=none", "test=false", f"paths.cache_dir={tmp_path / 'cache'}", f"hydra.sweep.dir={sweep}",
           "norm=layernorm,rmsnorm", "placement=pre,post"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    runs = sorted(p for p in sweep.iterdir() if p.is_dir() and p.name.isdigit())
    assert len(runs) == 4
    assert all((r / "csv" / "metrics.csv").exists() for r in runs)


@pytest.mark.parametrize(
    "override, message",
    [
        ("model.norm=groupnorm", "model.norm='groupnorm' is invalid; allowed: batchnorm"),
        ("placement=middle", "placement='middle' is invalid; allowed: pre, post, peri"),
        ("trainer.precision=8-mixed", "trainer.precision='8-mixed' is invalid; allowed: 32-true"),
        ("model.dim=33", "model.dim=33 is invalid; allowed: a multiple of n_heads=2"),
        ("model.norm_eps=abc", "model.norm_eps='abc' is invalid; allowed: a finite number >= 0"),
        ("run_id=a/b", "run_id='a/b' is invalid; allowed: a folder name"),
        ("optimizer.lr=0", "optimizer.lr=0 is invalid; allowed: a finite number > 0"),
        ("optimizer.lr=-1e-3", "optimizer.lr=-0.001 is invalid"),
        ("optimizer.lr=nan", "optimizer.lr=nan is invalid; allowed: a finite number > 0"),
        ("optimizer.lr=inf", "optimizer.lr=inf is invalid"),
        ("optimizer.lr=fast", "optimizer.lr='fast' is invalid"),
        ("optimizer.betas=[1.5,0.9]", r"optimizer.betas=\[1.5, 0.9\] is invalid; allowed: two numbers in \[0, 1\)"),
        ("optimizer.weight_decay=-0.1", "optimizer.weight_decay=-0.1 is invalid"),
        ("trainer.max_steps=0", "trainer.max_steps=0 is invalid; allowed: an integer >= 1"),
        ("trainer.deterministic=always", "trainer.deterministic='always' is invalid; allowed: auto, true, false, warn"),
        ("trainer.val_check_interval=0", "trainer.val_check_interval=0 is invalid; allowed: an integer >= 1"),
        ("trainer.val_check_interval=9", "trainer.val_check_interval=9 is invalid; allowed: <= trainer.max_steps=4"),
        ("trainer.log_every_n_steps=0", "trainer.log_every_n_steps=0 is invalid"),
        ("trainer.accumulate_grad_batches=0", "trainer.accumulate_grad_batches=0 is invalid"),
        ("trainer.gradient_clip_val=-1", "trainer.gradient_clip_val=-1 is invalid"),
        ("scheduler.warmup_steps=-1", "scheduler.warmup_steps=-1 is invalid; allowed: an integer >= 0"),
        ("scheduler.kind=step", "scheduler.kind='step' is invalid; allowed: cosine, linear, constant"),
        ("scheduler.min_lr_ratio=2", "scheduler.min_lr_ratio=2 is invalid"),
        ("data.seq_len=64", "data.seq_len=64 is invalid; allowed: <= model.max_seq_len=32"),
        ("data.batch_size=0", "batch_size=0"),
        ("data.files=[/nonexistent/corpus.txt]", "/nonexistent/corpus.txt"),
        ("model.max_seq_len=100000", "need at least"),
        ("module.z_loss=-1", "module.z_loss=-1 is invalid"),
        ("model.compile=true module.compile_backend=turbo", "module.compile_backend='turbo' is invalid"),
        ("seed=one", "seed='one' is invalid; allowed: an integer"),
        ("name=a/b", "name='a/b' is invalid; allowed: a folder name"),
        ("test_weights=worst", "test_weights='worst' is invalid; allowed: final, best"),
        ("ckpt_path=/nonexistent/x.ckpt", "ckpt_path='/nonexistent/x.ckpt' does not exist"),
        ("callbacks.stability.every_n_steps=0", "callbacks.stability.every_n_steps=0 is invalid"),
        ("callbacks.divergence.patience=0", "callbacks.divergence.patience=0 is invalid"),
        ("callbacks.text_sample.temperature=-1", "callbacks.text_sample.temperature=-1 is invalid"),
        ("callbacks.progress_bar.mode=fancy", "callbacks.progress_bar.mode='fancy' is invalid; allowed: auto"),
        ("+callbacks.stability.colour=red", "unexpected keyword argument 'colour'"),
        ("optimizer._target_=torch.optim.Turbo", "Error locating target 'torch.optim.Turbo'"),
        ("norm=fused_rmsnorm", "norm=fused_rmsnorm needs a CUDA GPU and none is visible: .* or use norm=rmsnorm$"),
        ("norm=derf model.norm_impl=triton", r"model.norm_impl=triton \(the Triton kernel of norm=derf\) needs a CUDA "
                                             "GPU and none is visible: .* or use model.norm_impl=auto$"),
    ],
)
def test_bad_input_is_one_clear_error_before_training(override, message, tmp_path, corpus, monkeypatch):
    if "fused_rmsnorm" in override or "triton" in override:  # as on a machine without a GPU (the tests run the
        # kernel interpreted)
        monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
        monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    cfg = compose_cfg(tmp_path, corpus, *override.split())
    with pytest.raises(ConfigError, match=message):
        train_script.train(cfg)
    assert not (Path(cfg.paths.output_dir) / "checkpoints").exists()


def test_a_corrupted_token_cache_is_one_error_naming_the_folder_to_delete(tmp_path, corpus):
    cfg = compose_cfg(tmp_path, corpus)
    dm = instantiate(cfg.data)
    dm.prepare_data()
    cache = Path(cfg.paths.cache_dir)
    files = [f for f in cache.rglob("*") if f.is_file() and f.stat().st_size > 100]
    assert files
    for f in files:  # a disk that filled up, a copy cut short
        f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    with pytest.raises(DataError, match=r"token cache '.*' is unreadable .*delete that folder"):
        train_script.train(compose_cfg(tmp_path, corpus))


def test_a_corpus_of_one_repeated_character_is_a_data_error(tmp_path):
    one = tmp_path / "one.txt"
    one.write_text("a" * 5000)
    with pytest.raises(DataError, match="nothing to predict"):
        train_script.train(compose_cfg(tmp_path, one))


def test_unknown_norm_group_is_a_hydra_error_listing_options(tmp_path, corpus):
    with pytest.raises(Exception, match=r"(?s)Could not find 'norm/groupnorm'.*rmsnorm"):
        compose_cfg(tmp_path, corpus, "norm=groupnorm")


def test_cli_config_error_is_one_line_and_exit_code_2(tmp_path, corpus):
    cmd = [sys.executable, str(ROOT / "train.py"), "model=tiny", "data=files", f"data.files=[{corpus}]",
           "optimizer.lr=-1", f"hydra.run.dir={tmp_path / 'run'}", f"paths.cache_dir={tmp_path / 'cache'}"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert out.returncode == 2
    assert "config error: optimizer.lr=-1 is invalid; allowed: a finite number > 0" in out.stdout + out.stderr
    assert "Traceback" not in out.stdout + out.stderr


def test_16_mixed_on_cpu_warns_and_runs_bf16_while_cpu_fp16_scales_fp16(tmp_path, corpus):
    cfg = compose_cfg(tmp_path / "a", corpus, "trainer.precision=16-mixed", "trainer.max_steps=2")
    with pytest.warns(UserWarning, match="Lightning runs bf16-mixed instead.*trainer=cpu_fp16"):
        train_script.train(cfg)
    summary = json.loads((Path(cfg.paths.output_dir) / "summary.json").read_text())
    assert (summary["precision"], summary["precision_used"], summary["amp_scale"]) == ("16-mixed", "bf16-mixed", None)

    cfg = compose_cfg(tmp_path / "b", corpus, "trainer=cpu_fp16", "trainer.max_steps=2")
    train_script.train(cfg)
    summary = json.loads((Path(cfg.paths.output_dir) / "summary.json").read_text())
    assert (summary["precision"], summary["precision_used"]) == ("16-mixed", "16-mixed")
    assert summary["amp_scale"] == 2.0**16  # a real GradScaler: fp16 autocast with loss scaling on the CPU
    assert any(r.get("stab/amp_scale") for r in read_rows(Path(cfg.paths.output_dir)))


@pytest.mark.slow  # long (end to end); `-m slow` runs it
def test_compiled_run_records_every_stability_metric_as_the_eager_run(tmp_path, corpus):
    """model.compile=true: the measured steps run uncompiled, so the forward hooks fire; every metric is logged
    at the same steps as in an eager run, with the same values (aot_eager: the same arithmetic, no codegen)."""
    assert not hasattr(model_config(compose_cfg(tmp_path, corpus), 11), "compile")  # not architecture
    runs = {}
    for compiled in (False, True):
        torch._dynamo.reset()
        counters = torch._dynamo.utils.counters
        counters.clear()
        cfg = compose_cfg(tmp_path / str(compiled), corpus, f"model.compile={str(compiled).lower()}",
                          "module.compile_backend=aot_eager", "callbacks.stability.every_n_steps=2",
                          "callbacks.stability.probe_every_n_steps=2", "trainer.max_steps=6", "test=false")
        train_script.train(cfg)
        assert (counters["stats"]["unique_graphs"] > 0) == compiled  # the unmeasured steps really compiled
        rows = read_rows(Path(cfg.paths.output_dir))
        runs[compiled] = {k: logged(rows, k) for k in rows[0] if k not in ("step", "epoch")}
    eager, compiled = runs[False], runs[True]
    assert sorted(k for k in eager if eager[k]) == sorted(k for k in compiled if compiled[k])
    stab = [k for k in eager if k.startswith(("stab/", "layer/", "norm/")) and not k.startswith("stab/loss_spike")]
    assert len(stab) > 30 and "layer/0/attn_logit_max" in stab
    for key in stab:
        assert sorted(compiled[key]) == sorted(eager[key]) == [0, 2, 4], key  # every measured step, not only 0
        assert compiled[key] == pytest.approx(eager[key], rel=1e-4, abs=1e-6), key


def test_wandb_group_is_one_per_sweep_and_tags_name_the_run(tmp_path, corpus):
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode
    from omegaconf import read_write

    cfg = compose_cfg(tmp_path, corpus, "logger=wandb", "name=my_sweep", "optimizer.lr=0.01", "seed=3")
    group_sweeps(cfg)
    assert cfg.logger.wandb.group == "my_sweep"  # a single run: the experiment name
    assert cfg.logger.wandb.name == "rmsnorm-pre-L2-d32-lr0.01-wu1-s3"  # tiny model: depth and width differ
    jobs = [["norm=layernorm", "data.batch_size=4", "data.files=[/x.txt]", "trainer.gradient_clip_val=null"],
            ["norm=layernorm", "data.batch_size=8", "data.files=[/x.txt]", "trainer.gradient_clip_val=1.0"]]
    names = []
    for job in jobs:
        cfg = compose_cfg(tmp_path, corpus, "logger=wandb", "name=my_sweep", "optimizer.lr=0.01", "seed=3", *job)
        hydra_cfg = HydraConfig.get()
        with read_write(hydra_cfg):  # as Hydra sets it for the jobs of `train.py -m`
            hydra_cfg.mode, hydra_cfg.sweep.dir = RunMode.MULTIRUN, "logs/my_sweep/multiruns/2026-01-02_03-04-05"
            hydra_cfg.overrides.task = job
        group_sweeps(cfg)
        names.append(cfg.logger.wandb.name)
    assert names == [f"layernorm-pre-L2-d32-lr0.01-wu1-s3-batch_size={b}-gradient_clip_val={c}"
                     for b, c in ((4, "null"), (8, "1.0"))]  # trainer.* is not under train
    assert cfg.logger.wandb.group == "my_sweep-2026-01-02_03-04-05"
    logger = instantiate(cfg.logger.wandb)
    assert logger._wandb_init["tags"] == ["norm:layernorm", "placement:pre", "lr:0.01", "precision:32-true", "seed:3"]
    assert logger._wandb_init["group"] == "my_sweep-2026-01-02_03-04-05" and "anonymous" not in logger._wandb_init


# --- every norm and placement, every option, through Hydra ---------------------------------------------------


def test_every_registered_norm_has_a_config_file():
    assert NORM_FILES == sorted(NORMS), "each norm of minillm.norms.NORMS needs configs/norm/<name>.yaml"


@pytest.mark.parametrize("norm", NORM_FILES)
def test_norm_config_lists_every_option_with_the_class_default(norm):
    """So each option is reachable as model.norm_options.<option>=<value> (no '+' needed)."""
    cfg = OmegaConf.load(CONFIGS / "norm" / f"{norm}.yaml")
    params = inspect.signature(NORMS[norm].__init__).parameters
    assert cfg.norm == norm
    assert OmegaConf.to_container(cfg.norm_options) == {
        k: params[k].default for k in accepted_options(norm) if k != "max_seq_len"}  # the model passes it


@pytest.mark.slow  # long (end to end); `-m slow` runs it
@pytest.mark.parametrize("norm", NORM_FILES)
def test_every_norm_and_placement_round_trip_through_hydra(norm, tmp_path, corpus):
    for placement in PLACEMENTS:
        cfg = compose_cfg(tmp_path, corpus, f"norm={norm}", f"placement={placement}")
        mc = model_config(cfg, V)
        assert isinstance(mc, ModelConfig) and (mc.norm, mc.placement) == (norm, placement)
        assert mc.norm_options == OmegaConf.to_container(cfg.model.norm_options)
        if norm == "fused_rmsnorm":
            continue  # building it needs a GPU (or the slow interpreter): tests/test_kernels.py
        model = Transformer(mc)
        assert [b.placement for b in model.layers] == [p for p, _ in mc.layer_specs()]
        assert all(type(b.attn_norm) is NORMS[norm] and type(b.ffn_norm) is NORMS[norm] for b in model.layers)
        has_out_norm = LAYER_PLACEMENTS.get(placement) is not None and LAYER_PLACEMENTS[placement].out_norm
        assert all((b.attn_out_norm is not None) == has_out_norm for b in model.layers)
        if norm == "powernorm":
            assert model.layers[0].attn_norm.alpha_fwd == 0.9 and model.layers[0].attn_norm.max_seq_len == 32


def test_norm_placement_and_loss_options_reach_the_model_through_hydra(tmp_path, corpus):
    cfg = compose_cfg(tmp_path, corpus, "norm=rmsnorm", "placement=mix", "model.mix_fraction=0.5",
                      "model.n_layers=4", "model.qk_norm=layernorm", "model.norm_options.zero_centered=true",
                      "model.norm_options.cast=fp32", "module.z_loss=1e-4")
    module = instantiate(cfg.module, _partial_=True)(model=model_config(cfg, V))
    m = module.model
    assert [b.placement for b in m.layers] == ["post", "post", "pre", "pre"]
    norms = [m.norm] + [n for b in m.layers for n in (b.attn_norm, b.ffn_norm)]
    assert all(type(n) is RMSNorm and n.cast == "fp32" and n.zero_centered and torch.all(n.weight == 0)
               for n in norms)
    q = m.layers[0].attn.q_norm  # the QK-norm has its own options (model.qk_norm_options), defaults here
    assert type(q) is LayerNorm and not q.zero_centered and q.weight.shape == (16,)
    assert module.hparams.z_loss == 1e-4


def test_attn_norm_options_as_a_sweep_spells_them_reach_the_model_summary_and_checkpoint(tmp_path, corpus):
    """+model.attn_norm_options.alpha0=1.0 (DyT's per-site alpha0): the attention norms start at 1.0, the others
    at norm_options' 0.5; summary.json records the options (the arm of a comparison); the checkpoint rebuilds it."""
    cfg = compose_cfg(tmp_path, corpus, "norm=dyt", "model.norm_options.alpha0=0.5",
                      "+model.attn_norm_options.alpha0=1.0", "trainer.max_steps=2",
                      "++trainer.enable_checkpointing=true")
    train_script.train(cfg)
    run = Path(cfg.paths.output_dir)
    summary = json.loads((run / "summary.json").read_text())
    assert (summary["norm_options"]["alpha0"], summary["attn_norm_options"]) == (0.5, {"alpha0": 1.0})
    model, _, _ = load_checkpoint(next(run.glob("checkpoints/*.ckpt")))
    alphas = {n: float(p.detach().flatten()[0]) for n, p in model.named_parameters() if n.endswith("alpha")}
    assert alphas and all(abs(v - (1.0 if ".attn_norm." in n else 0.5)) < 0.05 for n, v in alphas.items())  # 2 steps
    baseline = compose_cfg(tmp_path / "b", corpus, "norm=dyt", "trainer.max_steps=2")
    train_script.train(baseline)
    assert "attn_norm_options" not in json.loads((Path(baseline.paths.output_dir) / "summary.json").read_text())


def test_per_layer_override_through_hydra(tmp_path, corpus):
    cfg = compose_cfg(tmp_path, corpus, "norm=powernorm", "model.qk_norm=rmsnorm",
                      "model.layers=[{placement:post,norm:layernorm},{placement:peri,norm:dyt}]")
    mc = model_config(cfg, V)
    assert mc.layers == [{"placement": "post", "norm": "layernorm"}, {"placement": "peri", "norm": "dyt"}]
    m = Transformer(mc)
    b0, b1 = m.layers
    assert (b0.placement, type(b0.attn_norm), type(b0.ffn_norm)) == ("post", LayerNorm, LayerNorm)
    assert (b1.placement, type(b1.attn_norm), type(b1.attn_out_norm)) == ("peri", DyT, DyT)
    assert type(m.norm) is DyT  # the final norm follows the last layer
    assert type(b0.attn.q_norm) is RMSNorm  # powernorm's options (alpha_fwd, stats) are not passed to it
    assert m(torch.zeros(2, 5, dtype=torch.long)).shape == (2, 5, V)


def test_experiment_presets(tmp_path, corpus):
    cfg = compose_cfg(tmp_path, corpus, "experiment=olmo2")
    m = Transformer(model_config(cfg, V))
    assert {b.placement for b in m.layers} == {"branch"} and type(m.layers[0].attn_norm) is RMSNorm
    assert type(m.layers[1].attn.k_norm) is RMSNorm and cfg.module.z_loss == 1e-5
    d = m.cfg.n_heads * m.cfg.head_dim  # OLMo 2 normalizes the flattened projection of all heads
    assert m.cfg.qk_norm_axis == "flat" and m.layers[1].attn.q_norm.weight.shape == (d,)
    cfg = compose_cfg(tmp_path, corpus, "experiment=ngpt")
    m = Transformer(model_config(cfg, V))
    assert m.cfg.ngpt and m.cfg.norm == "none" and m.layers[0].attn_step is not None
    preset = OmegaConf.load(CONFIGS / "experiment" / "ngpt.yaml")  # the tests' overrides set a warmup of 1
    assert cfg.optimizer.weight_decay == 0 and preset.scheduler.warmup_steps == 0  # the paper: neither
    cfg = compose_cfg(tmp_path, corpus, "experiment=deepnet")
    m = Transformer(model_config(cfg, V))
    assert {b.placement for b in m.layers} == {"deepnorm"} and type(m.layers[0].attn_norm) is LayerNorm
    assert m.layers[0].alpha == pytest.approx((2 * cfg.model.n_layers) ** 0.25)


@pytest.mark.parametrize("overrides", [
    ("norm=scalenorm", "placement=deepnorm"), ("experiment=olmo2",),
    ("norm=powernorm", "placement=peri", "model.norm_options.group_scaling=1"),
])
def test_fast_dev_run_through_train_py(overrides, tmp_path, corpus):
    metrics = train_script.train(compose_cfg(tmp_path, corpus, "debug=fast_dev_run", "callbacks=stability",
                                             *overrides))
    assert math.isfinite(metrics["train/loss"]) and metrics["train/loss"] > 0



def test_a_numeric_run_id_or_name_is_a_folder_name():
    from minillm.errors import check_name

    check_name("run_id", 7)  # Hydra reads run_id=7 as an int
    check_name("name", 2026)
    with pytest.raises(ConfigError, match="run_id=True is invalid; allowed: a folder name"):
        check_name("run_id", True)


def test_model_config_defaults_are_the_default_runs(tmp_path, corpus):
    """Transformer(ModelConfig(vocab_size=V)) in a notebook is the model `python train.py` trains: every field
    but the vocabulary (the tokenizer's) has the default config's value; the config lists the norm's options with
    the values the class takes when they are left out."""
    import dataclasses
    import inspect

    from minillm.model import ModelConfig

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        cfg = compose("train")
    composed = model_config(cfg, vocab_size=88).to_dict()
    defaults = ModelConfig(vocab_size=88).to_dict()
    assert {f.name for f in dataclasses.fields(ModelConfig)} == set(composed)
    params = inspect.signature(NORMS[composed["norm"]].__init__).parameters
    assert composed.pop("norm_options") == {k: params[k].default for k in defaults.pop("norm_options") or params
                                            if k not in ("self", "dim", "eps")}
    assert {k: v for k, v in composed.items() if v != defaults[k]} == {}



def test_help_lists_every_key_with_fixed_choices(tmp_path):
    """train.py --help's "Keys with fixed choices" names every config key the code checks against a fixed list
    (each check_choice of a dotted field or a top-level key), with the values the check allows."""
    import re

    from processes import cli, ok

    out = ok(cli([str(ROOT / "train.py"), "--help"], tmp_path, tmp_path / "cache"))
    listed = dict(line.split(": ", 1) for line in out.split("Keys with fixed choices:\n", 1)[1].split("\nLaunchers")[0]
                  .splitlines())
    source = "\n".join(p.read_text() for p in (ROOT / "minillm").rglob("*.py"))
    checked = set(re.findall(r'check_choice\("([a-z_]+\.[a-z_.]+|placement|test_weights)"', source))
    checked -= {"model.norm", "model.placement"}  # config groups (norm=, placement=), listed as groups
    assert checked and checked <= set(listed), sorted(checked - set(listed))
    assert listed["model.qk_norm_axis"] == "head, flat" and listed["model.qk_norm_gains"] == "shared, per_head, null"


def test_runs_of_different_models_get_different_wandb_names(tmp_path, corpus):
    """The W&B name (minillm.training.run.naming.run_name, of the config train.py composes) tells the model options
    apart: a flat QK-norm and a keys-only one, v_norm, attn_scale, a branch scale."""
    from minillm.training.run.naming import run_name

    options = [[], ["model.qk_norm=rmsnorm"], ["model.qk_norm=rmsnorm", "model.qk_norm_axis=flat"],
               ["model.qk_norm=rmsnorm", "model.qk_norm_on=k"], ["model.v_norm=true"], ["model.attn_scale=0.2"],
               ["model.branch_scale=layerscale"], ["model.branch_scale=layerscale", "model.branch_scale_init=0.1"],
               ["model.layer_output_scale=true"], ["model.embed_scale=true"], ["model.embed_norm=true"]]
    names = [run_name(compose_cfg(tmp_path, corpus, *o)) for o in options]
    assert len(set(names)) == len(names), names
    assert names[0] == "rmsnorm-pre-L2-d32-lr0.003-wu1-s1337"  # the default run's options are not named
    assert names[2] == "rmsnorm-pre-L2-d32-qkrmsnorm-qk_norm_axis=flat-lr0.003-wu1-s1337"
    assert names[4] == "rmsnorm-pre-L2-d32-v_norm-lr0.003-wu1-s1337"
    assert names[5] == "rmsnorm-pre-L2-d32-attn_scale=0.2-lr0.003-wu1-s1337"


@pytest.mark.parametrize("workers, expected", [(0, 6), (2, 4), (8, 1)])
def test_threads_under_slurm_leave_the_tasks_cpus_to_its_dataloader_workers(monkeypatch, workers, expected):
    """threads=null in a SLURM task: torch takes the task's CPUs less its DataLoader workers (they run on the same
    CPUs), never fewer than one; an explicit threads wins."""
    from hydra.core.hydra_config import HydraConfig

    from minillm.training.run import build

    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "6")
    monkeypatch.setattr(HydraConfig, "initialized", staticmethod(lambda: False))  # no launcher left by other tests
    before = torch.get_num_threads()
    try:
        build.set_threads(OmegaConf.create({"threads": None, "data": {"num_workers": workers}}))
        assert torch.get_num_threads() == expected
        build.set_threads(OmegaConf.create({"threads": 3, "data": {"num_workers": workers}}))
        assert torch.get_num_threads() == 3
    finally:
        torch.set_num_threads(before)
