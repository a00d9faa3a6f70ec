"""Every console script meets the bad inputs a user gives it: a missing file, a folder, a text file, a truncated
checkpoint, a checkpoint of another model and a flag it does not know. Each is one line that names what was wrong,
exit code 2, no traceback (README: train, eval, sample, export, import, inspect, prepare, lm-eval, report, replay)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch
from helpers import ROOT
from processes import cli, ok

CORPUS_CHARS = 20_000
KINDS = ("missing", "folder", "text", "truncated", "other model", "bad flag")
SMALL = ["model=tiny", "data=files", "data.batch_size=4", "data.val_windows=4", "trainer.max_steps=2",
         "trainer.val_check_interval=2", "callbacks.text_sample.max_new_tokens=8", "logger=csv"]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory, shared_cache, corpus) -> dict[str, Path]:
    """A trained checkpoint, and a bad input of each kind (for minillm-import, Hugging Face folders)."""
    tmp = tmp_path_factory.mktemp("inputs")
    ok(cli([str(ROOT / "train.py"), *SMALL, f"data.files=[{corpus}]", "run_id=good", "test=false"], tmp, shared_cache))
    good = tmp / "logs" / "default" / "runs" / "good" / "checkpoints" / "last.ckpt"
    (tmp / "empty").mkdir()
    (tmp / "notes.txt").write_text("a text file, not a checkpoint\n")
    data = good.read_bytes()
    (tmp / "half.ckpt").write_bytes(data[: len(data) // 2])  # a save cut short
    torch.save({"state_dict": {"weight": torch.zeros(3, 3)}, "hyper_parameters": {"lr": 0.1}, "global_step": 0},
               tmp / "other.ckpt")  # a Lightning checkpoint of some other model
    llama = {"model_type": "llama", "hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 4,
             "num_hidden_layers": 2, "num_key_value_heads": 2, "vocab_size": 40, "max_position_embeddings": 16,
             "rms_norm_eps": 1e-5, "tie_word_embeddings": False}
    for name, config in (("hf-truncated", llama), ("hf-gpt2", {"model_type": "gpt2", "n_embd": 8})):
        (tmp / name).mkdir()
        (tmp / name / "config.json").write_text(json.dumps(config))
    (tmp / "hf-truncated" / "model.safetensors").write_bytes(data[:100])
    (tmp / "tasks").mkdir()
    item = {"context": "The king", "choices": [" and", " the"], "answer": 0}
    (tmp / "task.jsonl").write_text(json.dumps(item) + "\n")
    (tmp / "tasks" / "my_task.yaml").write_text(
        f"task: my_task\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {tmp / 'task.jsonl'}\n"
        "test_split: test\noutput_type: multiple_choice\ndoc_to_text: context\ndoc_to_choice: choices\n"
        'doc_to_target: answer\ntarget_delimiter: ""\nmetric_list:\n  - metric: acc\n')
    return {"good": good, "missing": tmp / "none.ckpt", "folder": tmp / "empty", "text": tmp / "notes.txt",
            "truncated": tmp / "half.ckpt", "other model": tmp / "other.ckpt", "tmp": tmp, "corpus": corpus,
            "hf missing": tmp / "no-model", "hf truncated": tmp / "hf-truncated", "hf other model": tmp / "hf-gpt2"}


def harness(x: Path, i: dict) -> list[str]:
    """minillm-lm-eval as its console script runs it (minillm.tools.evaluate:lm_eval_main)."""
    script = i["tmp"] / "minillm_lm_eval.py"
    script.write_text("import sys\nfrom minillm.tools.evaluate import lm_eval_main\nsys.exit(lm_eval_main())\n")
    return [str(script), "--model", "minillm", "--model_args", f"checkpoint={x}", "--tasks", "my_task",
            "--include_path", str(i["tmp"] / "tasks")]


# tool -> its command for an input x (i: the inputs); and, where a kind of input means something else to the tool, what
# it gets instead
TOOLS = {
    "train": lambda x, i: [str(ROOT / "train.py"), *SMALL, f"data.files=[{i['corpus']}]", f"ckpt_path={x}"],
    "eval": lambda x, i: ["-m", "minillm.tools.evaluate", str(x)],
    "sample": lambda x, i: ["-m", "minillm.tools.sample", str(x)],
    "export": lambda x, i: ["-m", "minillm.tools.export", str(x), str(i["tmp"] / "exported")],
    "import": lambda x, i: ["-m", "minillm.tools.import_hf", str(x), str(i["tmp"] / "imported.ckpt")],
    "inspect": lambda x, i: ["-m", "minillm.tools.inspection", str(x), "--text", str(i["text"]), "--no-wandb"],
    "prepare": lambda x, i: ["-m", "minillm.tools.prepare", "data=files", f"data.files=[{x}]",
                             f"data.cache_dir={i['tmp'] / 'cache'}"],
    "lm-eval": harness,
    "report": lambda x, i: ["-m", "minillm.analysis.report", str(x)],
    "replay": lambda x, i: ["-m", "minillm.tools.replay", str(x), "--steps", "0:2"],
}
INSTEAD = {("import", "missing"): "hf missing", ("import", "truncated"): "hf truncated",
           ("import", "other model"): "hf other model"}
VALID = {"import": "hf truncated", "report": "tmp", "prepare": "text"}  # what gets the bad flag (the rest: "good")


@pytest.mark.parametrize("tool", sorted(TOOLS))
def test_every_console_script_answers_bad_input_in_one_line(tool, inputs, tmp_path, shared_cache):
    if tool == "lm-eval":  # lm_eval imported once here, for the processes forked below (minillm.tools.harness in them:
        pytest.importorskip("lm_eval.api.registry")  # importing it here would register its model in later forks too)
    for kind in KINDS:
        if kind == "bad flag":
            args, named = [*TOOLS[tool](inputs[VALID.get(tool, "good")], inputs), "--bogus"], "--bogus"
        else:
            given = inputs[INSTEAD.get((tool, kind), kind)]
            if tool == "prepare" and kind == "text":  # a text file is a corpus: here it is given as the tokenizer
                args = [*TOOLS[tool](inputs["corpus"], inputs), f"data.tokenizer={given}"]
            else:
                args = TOOLS[tool](given, inputs)
            named = str(given)
        out = cli(args, tmp_path, shared_cache)
        lines = [line for line in out.output.splitlines() if re.search(r"error", line, re.I)]
        assert out.returncode == 2 and "Traceback" not in out.output, (tool, kind, out.output[-3000:])
        assert len(lines) == 1 and named in lines[0], (tool, kind, lines, out.output[-2000:])
        assert not re.search(r"^usage:", out.output, re.M | re.I), (tool, kind, out.output[-2000:])  # no usage block
    assert not (inputs["tmp"] / "exported").exists() and not (inputs["tmp"] / "imported.ckpt").exists()
    shutil.rmtree(tmp_path / "logs", ignore_errors=True)


PAYLOAD_RAN = "payload-ran"  # the file a pickle payload would create in the command's folder


class Payload:
    """What a hostile checkpoint holds: an object whose unpickling would run a shell command."""

    def __reduce__(self):
        import os

        return os.system, (f"touch {PAYLOAD_RAN}",)


@pytest.fixture(scope="module")
def bad_files(inputs) -> dict[str, Path]:
    """Files that are not checkpoints: empty, text, a zip cut short, pickles with a payload (torch's zip format and a
    bare pickle)."""
    import pickle

    tmp = inputs["tmp"]
    (tmp / "empty.ckpt").write_bytes(b"")
    torch.save({"state_dict": Payload()}, tmp / "payload.ckpt")
    (tmp / "payload.pkl").write_bytes(pickle.dumps({"state_dict": Payload()}))
    return {"empty": tmp / "empty.ckpt", "text": inputs["text"], "truncated": inputs["truncated"],
            "payload": tmp / "payload.ckpt", "bare pickle payload": tmp / "payload.pkl"}


# what the one line says of each file, and what it must never say
SAYS = {"empty": "is empty (0 bytes), not a checkpoint", "text": "is a text file, not a checkpoint",
        "truncated": "is truncated: its zip archive has no end (a save or a copy cut short)",
        "payload": "is refused unread: it is a pickle that asks for more than tensors and plain values (a call of "
                   "posix.system), which minillm never loads, so nothing of it ran; allowed: a checkpoint minillm "
                   "wrote",
        "bare pickle payload": "is refused unread: it is a pickle that asks for more than tensors and plain values"}
NEVER = ("weights_only", "Re-running", "IndexError", "EOFError", "internal miniz error")
READERS = {**{t: TOOLS[t] for t in ("train", "eval", "sample", "export", "inspect", "lm-eval", "replay")},
           "decay_from": lambda x, i: [str(ROOT / "train.py"), *SMALL, f"data.files=[{i['corpus']}]", "scheduler=wsd",
                                       f"decay_from={x}"]}


@pytest.mark.parametrize("tool", sorted(READERS))
def test_every_checkpoint_reader_says_what_a_bad_file_is_in_one_honest_line(tool, inputs, bad_files, tmp_path,
                                                                           shared_cache):
    """Empty, text, truncated and pickle-payload files given where a checkpoint goes: one complete line naming the
    file and what it is (never torch's advice to turn weights_only off, never "truncated" for a payload, never an
    IndexError or EOFError), exit 2, and the payload never runs."""
    if tool == "lm-eval":
        pytest.importorskip("lm_eval.api.registry")
    for kind, path in bad_files.items():
        out = cli(READERS[tool](path, inputs), tmp_path, shared_cache)
        lines = [line for line in out.output.splitlines() if re.search(r"error", line, re.I)]
        assert out.returncode == 2 and "Traceback" not in out.output, (tool, kind, out.output[-3000:])
        assert len(lines) == 1 and f"{str(path)!r} {SAYS[kind]}" in lines[0], (tool, kind, lines)
        assert not any(word in lines[0] for word in NEVER), (tool, kind, lines[0])
        assert kind.endswith("payload") or "pickle" not in lines[0], (tool, kind, lines[0])
        assert not kind.endswith("payload") or "truncated" not in lines[0], (tool, kind, lines[0])
        assert not (tmp_path / PAYLOAD_RAN).exists(), (tool, kind)
    shutil.rmtree(tmp_path / "logs", ignore_errors=True)


def test_an_exception_chain_that_loops_back_is_read_once():
    """A chain of causes can loop (an error raised while handling its own cause): reading it once, not forever (a
    binary file given as a corpus hung there)."""
    from minillm.errors import causes, disk_error

    first, second = ValueError("a"), RuntimeError("b")
    first.__context__, second.__context__ = second, first
    assert list(causes(first)) == [first, second] and disk_error(first) is None
