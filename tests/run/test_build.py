"""Building a run (minillm/training/run/build.py): the validation cadence in optimizer steps, deterministic mode."""


from __future__ import annotations

import pytest
import torch
from helpers import compose_cfg, read_rows

import minillm.training.train as train_script
from minillm.model import ModelConfig, Transformer
from minillm.training.run import build
from minillm.training.run.build import build_trainer


def test_validation_counts_optimizer_steps_under_gradient_accumulation(tmp_path, corpus):
    """val_check_interval=4 with 3 micro-batches per step: validations after steps 4 and 8 (Lightning alone
    counts batches and validates after steps 1, 2 and 4)."""
    cfg = compose_cfg(tmp_path, corpus, "trainer.max_steps=8", "trainer.val_check_interval=4",
                      "trainer.accumulate_grad_batches=3", "test=false")
    train_script.train(cfg)
    rows = read_rows(cfg.paths.output_dir)
    assert sorted(int(r["step"]) for r in rows if r.get("val/loss")) == [3, 7]  # step indices of steps 4 and 8


def test_deterministic_auto_is_on_where_the_run_trains_on_the_cpu(tmp_path, corpus, monkeypatch):
    """trainer.deterministic=auto (the default): torch's deterministic mode on the CPU, off on a GPU; an explicit
    false stays off on the CPU."""
    cfg = compose_cfg(tmp_path, corpus)
    assert cfg.trainer.deterministic == "auto"
    torch.use_deterministic_algorithms(False)
    build_trainer(cfg, [], [])
    assert torch.are_deterministic_algorithms_enabled()
    build_trainer(compose_cfg(tmp_path, corpus, "trainer.deterministic=false"), [], [])
    assert not torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    monkeypatch.setattr(build, "trains_on_cpu", lambda trainer: False)  # what auto sees on a GPU machine
    build_trainer(cfg, [], [])
    assert not torch.are_deterministic_algorithms_enabled()


def test_trains_on_cpu_reads_the_accelerator_and_the_machine(monkeypatch):
    assert build.trains_on_cpu({"accelerator": "cpu"}) and not build.trains_on_cpu({"accelerator": "gpu"})
    for cuda, mps, cpu in ((True, False, False), (False, True, False), (False, False, True)):
        monkeypatch.setattr(torch.cuda, "is_available", lambda cuda=cuda: cuda)
        monkeypatch.setattr(torch.backends.mps, "is_available", lambda mps=mps: mps)
        assert build.trains_on_cpu({"accelerator": "auto"}) == cpu
        assert build.trains_on_cpu({}) == cpu  # auto is the default


@pytest.mark.slow  # long (end to end); `-m slow` runs it
def test_compiled_cpu_backward_has_no_atomic_adds_under_the_default(tmp_path, corpus):
    """model.compile=true on the CPU: Inductor fuses the embedding's backward with the first norm's and, unless
    deterministic mode is on, sums each token's gradient row with atomic adds, whose order changes from call to
    call on several threads (compiled default runs of 1,600 steps ended up to 0.004 apart in val loss). Under
    the default trainer.deterministic=auto the generated code has none, and repeated backward passes on two
    threads give one gradient, bit for bit."""
    from torch._inductor.utils import run_and_get_code

    build_trainer(compose_cfg(tmp_path, corpus), [], [])
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        torch._dynamo.reset()
        model = Transformer(ModelConfig(vocab_size=88, dim=128, n_heads=4, n_layers=1, max_seq_len=64))
        forward = torch.compile(model.forward)
        idx = torch.randint(0, 88, (32, 64), generator=torch.Generator().manual_seed(0))
        _, code = run_and_get_code(lambda: forward(idx).square().mean().backward())
        grads = set()
        for _ in range(8):
            model.zero_grad(set_to_none=True)
            forward(idx).square().mean().backward()
            grads.add(model.tok_emb.weight.grad.numpy().tobytes())
    finally:
        torch.set_num_threads(threads)
    assert len(code) >= 2 and not any("atomic_add" in c for c in code)  # the forward's and the backward's
    assert len(grads) == 1
