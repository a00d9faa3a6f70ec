"""Downstream evaluation: minillm.tools.scoring (log-likelihoods, rolling windows, greedy generation), minillm-eval
--tasks
(accuracy with its binomial interval, bits per byte) and the lm-evaluation-harness model ``minillm``
(minillm/tools/harness.py), run as a user runs them on small local tasks the test writes (no hub)."""

from __future__ import annotations

import json
import math

import pytest
import torch
from processes import cli, ok
from test_export import fit_checkpoint

from minillm.tools.hub import load_checkpoint
from minillm.tools.scoring import Scorer, multiple_choice, read_task

CORPUS_CHARS = 6_000
WORDS = ["love", "night", "lord", "king", "queen", "words", "sweet", "fair"]


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory, corpus) -> dict[str, str]:
    root = tmp_path_factory.mktemp("ckpts")
    return {"char": fit_checkpoint(root / "char.ckpt", corpus, "char", n_kv_heads=2),
            "other": fit_checkpoint(root / "other.ckpt", corpus, "byte", norm="batchnorm", placement="post",
                                    qk_norm="rmsnorm")}


@pytest.fixture(scope="module")
def tasks(tmp_path_factory) -> dict:
    """A 16-item multiple-choice task (JSONL), the same task as lm_eval YAML, and a generation task."""
    root = tmp_path_factory.mktemp("tasks")
    items = [{"context": f"The {WORDS[i % 8]} and the", "choices": [f" {WORDS[(i + k) % 8]}" for k in range(4)],
              "answer": i % 4} for i in range(16)]
    (root / "mc.jsonl").write_text("".join(json.dumps(item) + "\n" for item in items))
    (root / "mc.yaml").write_text(
        f"task: minillm_mc\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {root / 'mc.jsonl'}\n"
        "test_split: test\noutput_type: multiple_choice\ndoc_to_text: context\ndoc_to_choice: choices\n"
        'doc_to_target: answer\ntarget_delimiter: ""\nmetric_list:\n  - metric: acc\n')
    (root / "gen.yaml").write_text(
        f"task: minillm_gen\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {root / 'mc.jsonl'}\n"
        "test_split: test\noutput_type: generate_until\ndoc_to_text: context\ndoc_to_target: \"{{choices[0]}}\"\n"
        'generation_kwargs:\n  until: ["\\n"]\n  max_gen_toks: 6\n  do_sample: false\n'
        "metric_list:\n  - metric: exact_match\n")
    return {"dir": root, "items": items}


def test_log_likelihoods_are_the_models_own_and_long_texts_score_every_token_once(ckpts):
    model, tok, _ = load_checkpoint(ckpts["char"])
    scorer = Scorer(model, tok, batch_size=3)
    ctx, cont = scorer.encode_pair("The king and ", "queen")
    assert tok.decode(ctx) == "The king and" and tok.decode(cont) == " queen"  # the space moves on
    ids = ctx + cont
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([ids[:-1]])), -1)[0]
    direct = math.fsum(logp[len(ctx) - 1 + k, t].item() for k, t in enumerate(cont))
    (value, greedy), = scorer.loglikelihood([("The king and ", "queen")])
    assert value == pytest.approx(direct, abs=1e-5) and greedy == all(
        logp[len(ctx) - 1 + k].argmax().item() == t for k, t in enumerate(cont))
    text = "the king and queen of love shall come to night with fair sweet words " * 2  # > max_seq_len (32)
    ids = scorer.prefix + [int(i) for i in tok.encode(text)]
    (values, _), = scorer.token_logprobs([(ids, len(scorer.prefix))])
    assert len(values) == len(ids) - len(scorer.prefix)
    with torch.no_grad():  # the last 32 tokens: predicted from a full window
        tail = torch.log_softmax(model(torch.tensor([ids[-33:-1]])), -1)[0]
    assert values[-32:] == pytest.approx([tail[j, t].item() for j, t in enumerate(ids[-32:])], abs=1e-5)
    assert scorer.loglikelihood_rolling([text])[0] == pytest.approx(math.fsum(values))


def test_multiple_choice_reports_accuracy_with_its_interval_and_bits_per_byte_for_any_norm(ckpts, tasks):
    for name in ("char", "other"):  # RMSNorm Pre-LN (char) and BatchNorm Post-LN with QK-norm (byte)
        model, tok, _ = load_checkpoint(ckpts[name])
        result = multiple_choice(Scorer(model, tok), tasks["items"])
        assert result["n"] == 16 and result["chance"] == 0.25 and 0 <= result["acc_low"] <= result["acc"]
        assert result["acc"] <= result["acc_high"] <= 1 and 0 < result["bpb"] < 20


@pytest.mark.slow  # long (end to end); `-m slow` runs it
def test_minillm_eval_tasks_and_lm_eval_agree_on_a_local_task(ckpts, tasks, tmp_path, shared_cache):
    """minillm-eval --tasks and `minillm-lm-eval --model minillm` (lm_eval's own command line and registry) on the
    same items: the same accuracy; lm_eval's greedy generations are minillm's."""
    env = {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}
    out = ok(cli(["-m", "minillm.tools.evaluate", ckpts["char"], "--tasks", str(tasks["dir"] / "mc.jsonl"), "--json",
                  str(tmp_path / "mc.json")], tmp_path, shared_cache, **env))
    ours = json.loads((tmp_path / "mc.json").read_text())["mc"]
    interval = f"{ours['acc_low']:.4f}-{ours['acc_high']:.4f}"
    assert f"mc: acc {ours['acc']:.4f} (95% CI {interval}, n 16, chance 0.2500)" in out
    ok(cli(["-m", "minillm.tools.harness", "--model", "minillm",
            "--model_args", f"checkpoint={ckpts['char']},batch_size=8",
            "--tasks", "minillm_mc,minillm_gen", "--include_path", str(tasks["dir"]), "--output_path",
            str(tmp_path / "lm_eval"), "--log_samples"], tmp_path, shared_cache, **env))
    (results,) = (tmp_path / "lm_eval").rglob("results_*.json")
    harness = json.loads(results.read_text())["results"]
    assert harness["minillm_mc"]["acc,none"] == pytest.approx(ours["acc"])
    (samples,) = (tmp_path / "lm_eval").rglob("samples_minillm_gen_*.jsonl")
    model, tok, _ = load_checkpoint(ckpts["char"])
    scorer = Scorer(model, tok)
    for line in samples.read_text().splitlines():
        sample = json.loads(line)
        assert sample["resps"][0][0] == scorer.generate_until(sample["doc"]["context"], ["\n"], 6)


def test_task_and_install_errors_are_one_line(ckpts, tmp_path, shared_cache, capsys, monkeypatch):
    from minillm.tools.evaluate import lm_eval_main

    (tmp_path / "bad.jsonl").write_text('{"context": "a", "choices": ["b"], "answer": 0}\n')
    out = cli(["-m", "minillm.tools.evaluate", ckpts["char"], "--tasks", str(tmp_path / "bad.jsonl")], tmp_path,
              shared_cache)
    assert out.returncode == 2 and out.output.count("\n") == 1 and out.output.startswith(
        f"minillm-eval: error: --tasks '{tmp_path / 'bad.jsonl'}' line 1 is not an item; allowed: one JSON object")
    with pytest.raises(ValueError, match="does not exist"):
        read_task(tmp_path / "none.jsonl")
    monkeypatch.setitem(__import__("sys").modules, "lm_eval", None)
    assert lm_eval_main(["--tasks", "x"]) == 2
    assert capsys.readouterr().err.startswith("minillm-lm-eval: error: lm-eval is not installed; allowed: pip install")
