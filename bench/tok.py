"""Tokenizer for every contestant: a cached GPT-2-like byte-level BPE, or a user SPEC; plus the shared `fn`."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from bench.corpus import iter_texts

VOCAB_SIZE = 50257
EOS_TOKEN = "<|endoftext|>"
ENCODE_BATCH = 64  # documents per encode_batch call: big enough to amortise, small enough for RAM


def train_tokenizer(
    cache_dir: Path, corpus_files: list[str], vocab_size: int = VOCAB_SIZE, max_train_mb: float = 20.0
) -> str:
    """Train (once) a byte-level BPE (GPT-2-like: 50,257 tokens) on the corpus; return its tokenizer.json."""
    out = cache_dir / f"bpe-{vocab_size}.json"
    if out.exists():
        return str(out)
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=[EOS_TOKEN], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    budget = int(max_train_mb * (1 << 20))

    def texts() -> Iterator[str]:
        # Training on a bounded sample keeps it to a minute or two on 2 cores; the vocabulary is
        # only there to make the token statistics GPT-2-like.
        seen = 0
        for path in corpus_files:
            for t in iter_texts(path):
                seen += len(t)
                yield t
                if seen >= budget:
                    return

    print(f"bench: training a {vocab_size}-token byte-level BPE (cached in {out})", file=sys.stderr)
    tok.train_from_iterator(texts(), trainer=trainer)
    tmp = out.with_suffix(".tmp")
    tok.save(str(tmp))
    os.replace(tmp, out)
    return str(out)


class Encoder:
    """Batch encoder with an EOS id: `tokenizers` (tokenizer.json) or `tiktoken` (.tiktoken file)."""

    def __init__(self, spec: str) -> None:
        self.spec = spec
        if spec.endswith(".tiktoken"):
            import tiktoken
            from tiktoken.load import load_tiktoken_bpe

            ranks = load_tiktoken_bpe(spec)
            self._tt = tiktoken.Encoding(
                name=Path(spec).stem,
                pat_str=r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""",
                mergeable_ranks=ranks, special_tokens={EOS_TOKEN: len(ranks)},
            )
            self.eos_id = len(ranks)
            self.vocab_size = len(ranks) + 1
            self._hf = None
        else:
            from tokenizers import Tokenizer

            self._hf = Tokenizer.from_file(spec)
            eos = self._hf.token_to_id(EOS_TOKEN)
            self.eos_id = int(eos if eos is not None else 0)
            self.vocab_size = self._hf.get_vocab_size()
            self._tt = None
        self.dtype = np.uint16 if self.vocab_size <= 65536 else np.uint32

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        if self._hf is not None:
            return [e.ids for e in self._hf.encode_batch(texts, add_special_tokens=False)]
        return self._tt.encode_ordinary_batch(texts, num_threads=1)

    def documents(self, path: str) -> Iterator[np.ndarray]:
        """Token arrays of each document in one corpus shard, each followed by EOS."""
        batch: list[str] = []
        for text in iter_texts(path):
            batch.append(text)
            if len(batch) == ENCODE_BATCH:
                yield from self._arrays(batch)
                batch = []
        if batch:
            yield from self._arrays(batch)

    def _arrays(self, texts: list[str]) -> Iterator[np.ndarray]:
        for ids in self.encode_batch(texts):
            arr = np.empty(len(ids) + 1, dtype=self.dtype)
            arr[:-1] = ids
            arr[-1] = self.eos_id
            yield arr


class OurEncoder(Encoder):
    """The same documents through `llm.data.load_tokenizer` (its `backend`: auto, or $LLM_TOKENIZER_BACKEND).

    What a user of ours gets: the fastest engine verified token-identical to the reference
    (`fastokens` where installed), so the ids equal `Encoder`'s; only the engine differs.
    """

    def __init__(self, spec: str) -> None:
        from llm.data.tokenize.tokenizers import load_tokenizer

        self.spec = spec
        self._tok = load_tokenizer(spec)
        self.backend = self._tok.backend
        self.eos_id, self.vocab_size = self._tok.eos_id, self._tok.vocab_size
        self.dtype = np.uint16 if self.vocab_size <= 65536 else np.uint32

    def _arrays(self, texts: list[str]) -> Iterator[np.ndarray]:
        from llm.data.tokenize.documents import tokenize_documents

        flat, lengths = tokenize_documents(self._tok, texts)  # one flat buffer, EOS after each document
        yield from np.split(flat.astype(self.dtype), np.cumsum(lengths)[:-1])


_ENCODERS: dict[tuple[str, str], Encoder] = {}


def encoder(spec: str, engine: str = "reference") -> Encoder:
    """One Encoder per process and engine (loading a 50k BPE costs ~0.1 s; workers reuse it)."""
    if (spec, engine) not in _ENCODERS:
        _ENCODERS[spec, engine] = OurEncoder(spec) if engine == "ours" else Encoder(spec)
    return _ENCODERS[spec, engine]


class TokenizeFile:
    """The `fn` every contestant's prepare step runs: path of a JSONL shard -> token arrays per document.

    A picklable callable (not a closure) so that LitData, ours and multiprocessing can ship it to workers.
    `engine="reference"` encodes with `tokenizers` / `tiktoken` (what the peers' users call);
    `"ours"` with `llm.data`'s engine choice. Both give the same ids.
    """

    def __init__(self, spec: str, as_torch: bool = False, engine: str = "reference") -> None:
        self.spec = spec
        self.as_torch = as_torch
        self.engine = engine

    def __call__(self, path: str) -> Iterator[np.ndarray]:
        enc = encoder(self.spec, self.engine)
        for arr in enc.documents(path):
            if self.as_torch:
                import torch

                yield torch.from_numpy(arr.astype(np.int32))
            else:
                yield arr
