"""The engine wrappers: each turns one engine's API into `encode`, `encode_batch` and `encode_flat`.

`engines.py` decides which one serves a vocabulary; these only encode. `encode_flat` (all ids as
one uint32 array plus offsets, no per-token Python objects) is None where an engine has no such
path; callers then use `encode_batch`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np


def tokenizer_threads() -> int:
    """Threads one batch encode may use: 1 inside our worker processes, which are the parallelism.

    `LLM_TOKENIZER_THREADS` is set to 1 by `optimize` workers; elsewhere every core may be used.
    """
    return int(os.environ.get("LLM_TOKENIZER_THREADS") or os.cpu_count() or 1)



class TokenizersEncoder:
    """Hugging Face `tokenizers` (the tokenizer.json reference): added tokens are matched in text."""

    name = "tokenizers"
    encode_flat = None  # no flat batch encoder: callers fall back to encode_batch

    def __init__(self, tok: Any):
        self._tok = tok
        # encode_batch_fast skips offset tracking (tokenizers >= 0.20): same ids, less work.
        self._batch = getattr(tok, "encode_batch_fast", tok.encode_batch)

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [e.ids for e in self._batch(list(texts), add_special_tokens=False)]


class TiktokenEncoder:
    """`tiktoken`: ordinary text only (a .tiktoken file), or with the vocabulary's added tokens matched."""

    name = "tiktoken"
    encode_flat = None  # no flat batch encoder: callers fall back to encode_batch

    def __init__(self, enc: Any, match_special: bool):
        self._enc = enc
        self._match = match_special

    def encode(self, text: str) -> list[int]:
        if self._match:
            return self._enc.encode(text, allowed_special="all", disallowed_special=())
        return self._enc.encode_ordinary(text)

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        if self._match:
            return self._enc.encode_batch(
                list(texts), num_threads=tokenizer_threads(), allowed_special="all", disallowed_special=()
            )
        return self._enc.encode_ordinary_batch(list(texts), num_threads=tokenizer_threads())


class FastokensEncoder(TokenizersEncoder):
    """`fastokens` (Rust): a tokenizer.json with the `tokenizers` semantics, or .tiktoken ranks."""

    name = "fastokens"

    def __init__(self, tok: Any):
        self._tok = tok
        self._batch = tok.encode_batch
        threads = os.environ.get("LLM_TOKENIZER_THREADS")
        if threads:  # optimize workers: one thread each; read by fastokens at its first encode
            os.environ.setdefault("FASTOKENS_BPE_THREADS", threads)

    def encode_flat(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """(all ids as one uint32 array, len(texts) + 1 offsets): no per-token Python objects."""
        ids, offsets = self._tok.encode_batch_flat(list(texts), add_special_tokens=False)
        return np.frombuffer(ids, dtype="<u4"), np.frombuffer(offsets, dtype="<u8").astype(np.int64)


# gigatoken (0.10) caches every pre-token it has seen, per tokenizer, without a bound: its memory
# grows with the variety of the text. The tokenizer is built anew after this many characters
# ($LLM_GIGATOKEN_REBUILD_CHARS; 0: never), which frees the caches; loading a vocabulary again
# costs a few percent of encoding that much text (bench/encoders.py).
GIGATOKEN_REBUILD_CHARS = 1 << 30


def gigatoken_rebuild_chars() -> int:
    return int(os.environ.get("LLM_GIGATOKEN_REBUILD_CHARS") or GIGATOKEN_REBUILD_CHARS)


class GigatokenEncoder:
    """`gigatoken` (Rust): a byte-level tokenizer.json, or .tiktoken ranks with GPT-2's pre-tokenizer.

    `build` makes the tokenizer; it is called again after `rebuild_chars` characters of text so
    that gigatoken's unbounded pre-token caches never outgrow one such stretch of text.
    """

    name = "gigatoken"

    def __init__(self, build: Callable[[], Any], rebuild_chars: int | None = None):
        self._build = build
        self._tok = build()
        self._rebuild_chars = gigatoken_rebuild_chars() if rebuild_chars is None else rebuild_chars
        self._chars_since_build = 0
        self.rebuilds = 0
        # Our optimize workers encode on their own thread (LLM_TOKENIZER_THREADS=1); elsewhere
        # gigatoken decides (its thread pool, but never inside a forked or multiprocessing child).
        self._parallel = False if os.environ.get("LLM_TOKENIZER_THREADS") == "1" else None

    def _tokenizer(self, texts: Sequence[str]) -> Any:
        self._chars_since_build += sum(map(len, texts))
        if self._rebuild_chars and self._chars_since_build > self._rebuild_chars:
            self._tok = None  # the old caches go before the new tokenizer is built
            self._tok = self._build()
            self._chars_since_build = sum(map(len, texts))
            self.rebuilds += 1
        return self._tok

    def encode(self, text: str) -> list[int]:
        return self.encode_batch([text])[0]

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        texts = list(texts)
        return self._tokenizer(texts).encode_batch_list(texts, parallel=self._parallel)

    def encode_flat(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """(all ids as one uint32 array, len(texts) + 1 offsets), read from gigatoken's columnar result."""
        texts = list(texts)
        layout = self._tokenizer(texts).encode_batch(texts, parallel=self._parallel).layout
        if type(layout).__name__ != "ListOffsetArray":  # not what 0.10 returns; take the generic way
            import awkward as ak

            result = ak.Array(layout)
            offsets = np.concatenate(([0], np.cumsum(np.asarray(ak.num(result), dtype=np.int64))))
            return np.asarray(ak.flatten(result), dtype=np.uint32), offsets
        offsets = np.asarray(layout.offsets.data, dtype=np.int64)
        ids = np.asarray(layout.content.data)[offsets[0] : offsets[-1]]
        return ids.astype(np.uint32, copy=False), offsets - offsets[0]


class MissingBytesEncoder:
    """A fast engine on a vocabulary completed with the byte symbols it lacked (`complete_byte_alphabet`).

    A document without those bytes encodes exactly as with the original vocabulary. One with them
    (its ids hold an id >= `first_added`) is encoded again by the reference, which drops those
    bytes from their pre-token and may merge across the gap, as the completed vocabulary cannot.
    """

    def __init__(self, fast: Any, reference: Any, first_added: int):
        self.name = fast.name
        self._fast = fast
        self._reference = reference
        self._first_added = first_added
        self.encode_flat = self._encode_flat if fast.encode_flat is not None else None
        self.documents_redone = 0  # how many documents the reference encoded (for tests and logs)

    def encode(self, text: str) -> list[int]:
        return self.encode_batch([text])[0]

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        texts = list(texts)
        out = [list(ids) for ids in self._fast.encode_batch(texts)]
        redo = [i for i, ids in enumerate(out) if ids and max(ids) >= self._first_added]
        if redo:
            self.documents_redone += len(redo)
            for i, ids in zip(redo, self._reference.encode_batch([texts[i] for i in redo])):
                out[i] = list(ids)
        return out

    def _encode_flat(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        texts = list(texts)
        ids, offsets = self._fast.encode_flat(texts)
        hits = np.flatnonzero(ids >= self._first_added)
        if not len(hits):
            return ids, offsets
        redo = np.unique(np.searchsorted(offsets, hits, side="right") - 1)
        self.documents_redone += len(redo)
        again = dict(zip(redo.tolist(), self._reference.encode_batch([texts[i] for i in redo])))
        pieces = [np.asarray(again[i], dtype=np.uint32) if i in again else ids[offsets[i] : offsets[i + 1]]
                  for i in range(len(texts))]
        lengths = np.fromiter((len(p) for p in pieces), dtype=np.int64, count=len(pieces))
        new_offsets = np.concatenate(([0], np.cumsum(lengths)))
        flat = np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.uint32)
        return flat.astype(np.uint32, copy=False), new_offsets
