"""Data: corpus -> tokenizer -> token store (memory-mapped token files) -> windows for Lightning.

Flow, the same for every source::

    source ("shakespeare" | "files" | "hub")              minillm.training.data.corpus: `datasets` rows of documents
      -> tokenizer ("char" | "byte" | "bpe" | tokenizer.json | "hf:<name>")      minillm.training.data.tokenizer
      -> `datasets` .map(batched=True, num_proc=...) -> train.bin / val.bin + meta.json   minillm.training.data.store
         (prepared once per corpus, tokenizer and split; a hit opens the memory maps without reading text)
      -> random train windows, consecutive val/test windows, shared over DDP processes   minillm.training.data.windows
    TextDataModule ties them together (minillm.training.data.datamodule); ``python -m minillm.tools.prepare`` prepares
    a store ahead of training.
"""

from minillm.training.data.corpus import (
    SHAKESPEARE_HINT,
    SOURCES,
    CorpusSpec,
    load_documents,
    load_shakespeare,
    resolve_files,
    shakespeare_documents,
    shakespeare_files,
    strip_gutenberg,
    text_pieces,
)
from minillm.training.data.datamodule import TextDataModule
from minillm.training.data.store import CACHE_VERSION, StoreSpec, TokenStore, open_store, prepare_store, store_path
from minillm.training.data.tokenizer import (
    BUILT_IN,
    DOC_SEPARATOR,
    EOS,
    ByteTokenizer,
    CharTokenizer,
    HFTokenizer,
    Tokenizer,
    load_tokenizer,
    token_dtype,
    tokenizer_from_state,
    train_bpe,
)
from minillm.training.data.windows import (
    FixedWindows,
    RandomWindows,
    ResumableLoader,
    StreamSampler,
    eval_starts,
    window_starts,
)

__all__ = [
    "BUILT_IN", "CACHE_VERSION", "DOC_SEPARATOR", "EOS", "SHAKESPEARE_HINT", "SOURCES", "ByteTokenizer",
    "CharTokenizer", "CorpusSpec", "FixedWindows", "HFTokenizer", "RandomWindows", "ResumableLoader", "StoreSpec",
    "StreamSampler", "TextDataModule", "TokenStore", "Tokenizer", "eval_starts", "load_documents", "load_shakespeare",
    "load_tokenizer", "open_store", "prepare_store", "resolve_files", "shakespeare_documents", "shakespeare_files",
    "store_path", "strip_gutenberg", "text_pieces", "token_dtype", "tokenizer_from_state", "train_bpe",
    "window_starts",
]
