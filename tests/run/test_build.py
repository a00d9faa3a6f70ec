"""Building a run (minillm/run/build.py): the validation cadence in optimizer steps, deterministic mode."""


from __future__ import annotations

import torch
from helpers import compose_cfg, read_rows

import minillm.train as train_script
from minillm.model import ModelConfig, Transformer
from minillm.run.build import build_trainer, trains_on_cpu


def test_validation_counts_optimizer_steps_under_gradient_accumulation(tmp_path, corpus):
    """val_check_interval=4 with 3 micro-batches per step: validations after steps 4 and 8 (Lightning alone
    counts batches and validates after steps 1, 2 and 4)."""
    cfg = compose_cfg(tmp_path, corpus, "trainer.max_steps=8", "trainer.val_check_interval=4",
                      "trainer.accumulate_grad_batches=3", "test=false")
    train_script.train(cfg)
    rows = read_rows(cfg.paths.output_dir)
    assert sorted(int(r["step"]) for r in rows if r.get("val/loss")) == [3, 7]  # step indices of steps 4 and 8


def test_deterministic_auto_is_on_where_the_run_trains_on_the_cpu(tmp_path, corpus, monkeypatch):
    """trainer.deterministic=auto (the default): Lightning's deterministic mode on the CPU, off on a GPU."""
    cfg = compose_cfg(tmp_path, corpus)
    assert cfg.trainer.deterministic == "auto"
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(False)
    try:
        build_trainer(cfg, [], [])
        assert torch.are_deterministic_algorithms_enabled()
    finally:
        torch.use_deterministic_algorithms(before)
    assert trains_on_cpu({"accelerator": "cpu"}) and not trains_on_cpu({"accelerator": "gpu"})
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert not trains_on_cpu({"accelerator": "auto"})
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert trains_on_cpu({"accelerator": "auto"})


def test_compiled_cpu_gradients_are_bit_identical_under_the_default(tmp_path, corpus):
    """model.compile=true on the CPU: Inductor fuses the embedding's backward with the first norm's and sums each
    token's gradient row with atomic adds, whose order changes from call to call on two threads (four runs of 1,600
    steps ended up to 0.004 apart in val loss); the default trainer.deterministic=auto turns that off."""
    cfg = compose_cfg(tmp_path, corpus)
    threads, before = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    try:
        build_trainer(cfg, [], [])
        torch.set_num_threads(2)
        torch._dynamo.reset()
        model = Transformer(ModelConfig(vocab_size=88, dim=128, n_heads=4, n_layers=1, max_seq_len=64))
        forward = torch.compile(model.forward)
        idx = torch.randint(0, 88, (32, 64), generator=torch.Generator().manual_seed(0))
        grads = set()
        for _ in range(8):
            model.zero_grad(set_to_none=True)
            forward(idx).square().mean().backward()
            grads.add(model.tok_emb.weight.grad.numpy().tobytes())
    finally:
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(before)
    assert len(grads) == 1
