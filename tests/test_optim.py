"""minillm/training/optim.py: Muon with AdamW (optimizer=muon) and the lr schedules (wsd among them), as a user runs
them."""

from __future__ import annotations

import math

import pytest
import torch
from helpers import ROOT, compose_cfg, logged, read_rows, tiny, tokens, wandb_records
from processes import cli, ok, summaries

from minillm.errors import ConfigError
from minillm.model import Transformer
from minillm.training.optim import MuonWithAdamW, lr_lambda, param_groups, warmup_schedule
from minillm.training.run.naming import run_name

CORPUS_CHARS = 20_000
TRAIN = str(ROOT / "train.py")
SMALL = ["model=tiny", "data=files", "data.batch_size=4", "data.val_windows=4", "trainer.max_steps=6",
         "trainer.val_check_interval=3", "trainer.log_every_n_steps=1", "test=false",
         "callbacks.text_sample.max_new_tokens=8"]


# --- MuonWithAdamW ------------------------------------------------------------------------------------------


def test_muon_takes_the_hidden_matrices_and_adamw_the_rest():
    model = Transformer(tiny(tie_embeddings=False))
    opt = MuonWithAdamW(param_groups(model, split_hidden=True), lr=0.02, adamw_lr=1e-3)
    names = {id(p): n for n, p in model.named_parameters()}
    muon = {names[id(p)] for g in opt.muon.param_groups for p in g["params"]}
    adamw = {names[id(p)] for g in opt.adamw.param_groups for p in g["params"]}
    assert muon == {n for n, p in model.named_parameters() if p.ndim == 2 and n.startswith("layers.")}
    assert adamw == set(names.values()) - muon and {"tok_emb.weight", "lm_head.weight", "norm.weight"} <= adamw
    assert opt.param_groups == opt.muon.param_groups + opt.adamw.param_groups and opt.lrs() == {
        "muon": 0.02, "adamw": 1e-3}
    assert [g["weight_decay"] for g in opt.adamw.param_groups] == [0.1, 0.0]  # head decays, gains do not


def test_the_schedule_scales_both_lrs_and_a_state_dict_continues_exactly():
    def make():
        torch.manual_seed(0)
        model = Transformer(tiny())
        opt = MuonWithAdamW(param_groups(model, split_hidden=True))
        return model, opt, warmup_schedule(opt, kind="wsd", warmup_steps=2, total_steps=8)

    def steps(model, opt, sched, n, first=0):
        out = []
        for i in range(first, first + n):
            x = tokens(seed=i)
            loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), x.flatten())
            loss.backward()
            opt.step()
            opt.zero_grad()
            sched.step()
            out.append(loss.item())
        return out

    model, opt, sched = make()
    full = steps(model, opt, sched, 6)
    assert [g["lr"] / g["initial_lr"] for g in opt.param_groups] == [lr_lambda("wsd", 2, 8)(6)] * 3
    model, opt, sched = make()
    first = steps(model, opt, sched, 3)
    saved = ({k: v.clone() for k, v in model.state_dict().items()}, opt.state_dict(), sched.state_dict())
    model, opt, sched = make()
    model.load_state_dict(saved[0])
    opt.load_state_dict(saved[1])
    sched.load_state_dict(saved[2])
    assert opt.muon.param_groups[0] is opt.param_groups[0] and opt.muon.state is opt.state  # shared again
    assert first + steps(model, opt, sched, 3, first=3) == full  # bit-exact


def test_a_bare_muon_is_refused_in_one_line():
    from minillm.training.lit_module import LitLM

    module = LitLM(tiny(), optimizer=__import__("functools").partial(torch.optim.Muon, lr=0.02))
    with pytest.raises(ConfigError, match=r"^optimizer._target_=torch.optim.Muon would be given every parameter.*"
                                          r"allowed: optimizer=muon"):
        module.configure_optimizers()


# --- as a user runs it -------------------------------------------------------------------------------------


@pytest.mark.slow  # long (end to end); `-m slow` runs it
def test_muon_trains_the_tiny_model_and_resumes_bit_exactly(tmp_path, shared_cache, corpus):
    """optimizer=muon from a fresh folder with W&B on: the loss falls, both lrs are in summary.json and the run
    name; a run stopped by SIGTERM at step 3 and resumed with ckpt_path=auto logs the uninterrupted run's losses."""
    args = [TRAIN, *SMALL, f"data.files=[{corpus}]", "optimizer=muon", "scheduler.warmup_steps=1", "name=muon"]
    ok(cli([*args, "run_id=full"], tmp_path, shared_cache))
    stop = ["+callbacks.signal._target_=helpers.SignalAt", "+callbacks.signal.signum=15", "+callbacks.signal.step=3"]
    assert cli([*args, "run_id=cut", *stop], tmp_path, shared_cache).returncode == 143
    ok(cli([*args, "run_id=cut", "ckpt_path=auto"], tmp_path, shared_cache))
    runs = tmp_path / "logs" / "muon" / "runs"
    losses = logged(read_rows(runs / "full"), "train/loss")
    assert logged(read_rows(runs / "cut"), "train/loss") == losses and len(losses) == 6
    assert losses[5] < losses[0] - 0.3, losses  # it learns
    (summary,) = summaries(runs / "full")
    assert (summary["optimizer"], summary["lr"], summary["adamw_lr"]) == ("MuonWithAdamW", 0.02, 0.003)
    assert summary["status"] in ("completed", "not_trained")
    (wandb_file,) = (runs / "full" / "wandb").glob("offline-run-*/*.wandb")
    (record,) = [r for r in wandb_records(wandb_file) if r.WhichOneof("record_type") == "run"]
    assert record.run.display_name == "rmsnorm-pre-L2-d32-muon-lr0.02-alr0.003-wu1-s1337"
    wandb_runs = list((runs / "cut" / "wandb").glob("offline-run-*"))
    assert len({p.name.rsplit("-", 1)[-1] for p in wandb_runs}) == 1  # one W&B run over both segments


def test_run_names_tell_optimizers_and_their_lrs_apart(tmp_path, corpus):
    names = {run_name(compose_cfg(tmp_path, corpus, *o)) for o in (
        [], ["optimizer=muon"], ["optimizer=muon", "optimizer.adamw_lr=1e-3"], ["optimizer._target_=torch.optim.Adam"])}
    assert names == {"rmsnorm-pre-L2-d32-lr0.003-wu1-s1337", "rmsnorm-pre-L2-d32-muon-lr0.02-alr0.003-wu1-s1337",
                     "rmsnorm-pre-L2-d32-muon-lr0.02-alr0.001-wu1-s1337", "rmsnorm-pre-L2-d32-adam-lr0.003-wu1-s1337"}


# --- schedules --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape, mid", [("sqrt", 1 - math.sqrt(0.5)), ("linear", 0.5), ("cosine", 0.5)])
def test_wsd_warms_up_holds_then_decays_its_last_fraction(shape, mid):
    f = lr_lambda("wsd", warmup_steps=10, total_steps=100, min_lr_ratio=0.0, decay_fraction=0.2, decay_shape=shape)
    assert [f(s) for s in (0, 9, 10, 50, 79, 80)] == [0.1, 1.0, 1.0, 1.0, 1.0, 1.0]
    assert f(90) == pytest.approx(mid) and f(100) == 0.0 and f(99) < f(90)
    assert lr_lambda("wsd", 10, 100, decay_fraction=0.0)(99) == 1.0  # no decay: a stable run
    branch = lr_lambda("wsd", 10, 100, min_lr_ratio=0.0, decay_start=60)  # a decay branch from step 60
    assert branch(59) == 1.0 and branch(60) == 1.0 and branch(80) == pytest.approx(1 - math.sqrt(0.5))
    early = lr_lambda("wsd", 10, 12, min_lr_ratio=0.0, decay_fraction=0.5)  # decay from inside the warmup
    assert early(5) == 0.6 and early(6) == pytest.approx(0.7 * (1 - math.sqrt(0 / 6)))


def test_wsd_settings_are_checked_with_their_field_names():
    with pytest.raises(ConfigError, match=r"scheduler.decay_shape='exp' is invalid; allowed: sqrt, linear, cosine"):
        lr_lambda("wsd", 1, 10, decay_shape="exp")
    with pytest.raises(ConfigError, match=r"scheduler.decay_fraction=1.5 is invalid"):
        lr_lambda("wsd", 1, 10, decay_fraction=1.5)


# --- fused AdamW ----------------------------------------------------------------------------------------------


def test_adamw_is_fused_on_a_gpu_unless_a_grad_scaler_unscales_or_the_config_says_otherwise():
    import functools

    from minillm.training.optim import with_fused

    adamw = functools.partial(torch.optim.AdamW, lr=1e-3)
    cuda, cpu = torch.device("cuda", 0), torch.device("cpu")
    assert with_fused(adamw, cuda).keywords["fused"] is True  # not set: auto
    assert with_fused(adamw, cpu).keywords["fused"] is None  # torch's default on the CPU
    assert with_fused(adamw, cuda, scaled=True).keywords["fused"] is None  # fp16: Lightning unscales, then clips
    assert with_fused(functools.partial(adamw, fused="auto"), cuda).keywords["fused"] is True
    assert with_fused(functools.partial(adamw, fused=False), cuda).keywords["fused"] is False
    muon = functools.partial(MuonWithAdamW, lr=0.02)
    assert with_fused(muon, cuda) is muon  # only AdamW is fused by default


@pytest.mark.slow  # long (end to end); `-m slow` runs it
def test_a_bad_optimizer_fused_is_a_one_line_config_error(tmp_path, corpus):
    import subprocess
    import sys

    cmd = [sys.executable, TRAIN, "model=tiny", "data=files", f"data.files=[{corpus}]", "+optimizer.fused=yes",
           f"hydra.run.dir={tmp_path / 'run'}", f"paths.cache_dir={tmp_path / 'cache'}"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert out.returncode == 2 and "Traceback" not in out.stdout + out.stderr
    assert "config error: optimizer.fused='yes' is invalid; allowed: auto" in out.stdout + out.stderr


def test_gradients_are_clipped_under_bf16_with_a_fused_optimizer():
    """Lightning refuses to clip for an optimizer that may unscale in its step (fused AdamW) under mixed precision,
    even in bf16 where nothing is scaled; minillm's module clips there as Lightning clips otherwise."""
    import lightning as L

    from minillm.training.lit_module import LitLM

    module = LitLM(tiny())
    module.trainer = L.Trainer(accelerator="cpu", precision="bf16-mixed", logger=False, enable_progress_bar=False,
                               enable_checkpointing=False, enable_model_summary=False)
    opt = torch.optim.AdamW(module.parameters(), lr=1e-3, fused=True)
    for p in module.parameters():
        p.grad = torch.full_like(p, 10.0)
    with pytest.raises(RuntimeError, match="does not allow for gradient clipping"):
        L.LightningModule.configure_gradient_clipping(module, opt, 1.0, "norm")  # Lightning's own
    module.configure_gradient_clipping(opt, 1.0, "norm")
    total = torch.nn.utils.get_total_norm([p.grad for p in module.parameters()])
    assert total == pytest.approx(1.0, rel=1e-4)
