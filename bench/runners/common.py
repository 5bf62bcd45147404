"""Helpers shared by the runners: the timed consume loop, block hashing, the pretokenized-docs `fn`."""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np

BLOCK = 2049
BATCH = 8


def as_int64(batch: object):
    """A batch as an int64 tensor (batch, block): every contestant's output is normalised the same way."""
    import torch

    if isinstance(batch, dict):
        batch = batch["input_ids"]
    if isinstance(batch, np.ndarray):
        batch = torch.from_numpy(batch)
    if batch.dtype != torch.int64:
        batch = batch.to(torch.int64)
    return batch


def block_hashes(batch) -> list[int]:
    """xxh3-64 of each row: identifies a block's content across contestants and processes."""
    import xxhash

    arr = batch.numpy()
    return [xxhash.xxh3_64_intdigest(row.tobytes()) for row in arr]


def consume(batches: Iterable, t0: float, hash_blocks: bool = False, max_batches: int | None = None,
            count=None) -> dict:
    """Iterate batches, timing from t0 (before the dataset was built) to the first and the last batch.

    `count(batch)` says how many corpus tokens a batch carries (default: every element).
    """
    first = None
    tokens = nbatches = 0
    hashes: list[int] = []
    for batch in batches:
        b = as_int64(batch)
        if first is None:
            first = time.perf_counter() - t0
        tokens += int(count(batch)) if count else b.numel()
        nbatches += 1
        if hash_blocks:
            hashes.extend(block_hashes(b))
        if max_batches is not None and nbatches >= max_batches:
            break
    total = time.perf_counter() - t0
    steady = total - (first or 0.0)
    out = {"first_batch_s": first, "seconds": total, "tokens": tokens, "batches": nbatches,
           "tokens_per_s": tokens / total if total > 0 else 0.0,
           "steady_tokens_per_s": (tokens - tokens / max(nbatches, 1)) / steady if steady > 0 else 0.0}
    if hash_blocks:
        out["_hashes"] = hashes
    return out


def epochs(loader, n: int) -> Iterator:
    """n epochs of a loader: iterating it again starts the next (reshuffled) epoch, for every peer."""
    for _ in range(n):
        yield from loader


def time_epochs(loader, spec: dict, t0: float) -> dict:
    """The stream scenario's measurement: spec's epochs of `loader` from t0, block hashes saved where spec asks."""
    res = consume(epochs(loader, spec.get("epochs", 1)), t0, hash_blocks=spec.get("hash", False))
    save_hashes(res, spec.get("hashes_out"))
    return res


def save_hashes(result: dict, path: str | None) -> None:
    """Move the block hashes out of the result into an .npy file (the JSON stays small)."""
    hashes = result.pop("_hashes", None)
    if path and hashes is not None:
        np.save(path, np.asarray(hashes, dtype=np.uint64))


class PretokenizedDocs:
    """An `fn` that yields the already-tokenized documents of corpus shard `i` (for the 4x scale datasets).

    Re-tokenizing 4x the corpus would only measure the tokenizer again; scale is about the reader.
    """

    def __init__(self, tokens_path: str, index_path: str) -> None:
        self.tokens_path = tokens_path
        self.index_path = index_path
        self._mm = None
        self._index = None

    def __call__(self, shard: int) -> Iterator[np.ndarray]:
        if self._mm is None:
            meta = json.loads(Path(self.index_path).read_text())
            self._mm = np.memmap(self.tokens_path, dtype=np.dtype(meta["dtype"]), mode="r")
            self._index = np.load(meta["doc_offsets"])  # int64 [n_docs + 1] token offsets
            self._shard_docs = meta["shard_docs"]  # [n_shards + 1] document offsets
        d0, d1 = self._shard_docs[shard], self._shard_docs[shard + 1]
        offs = self._index
        for d in range(d0, d1):
            yield np.array(self._mm[offs[d]:offs[d + 1]])


def prepare_fn_and_inputs(spec: dict, engine: str = "reference"):
    """The same `fn` and inputs for every optimize()-style contestant: text shards, or pretokenized docs.

    `engine` is the encoder its users would use (bench.tok.TokenizeFile): the same ids either way.
    """
    if "pretokenized" in spec:
        p = spec["pretokenized"]
        return PretokenizedDocs(p["tokens"], p["index"]), list(range(p["shards"])) * p["copies"]
    from bench.tok import TokenizeFile

    return TokenizeFile(spec["tokenizer"], engine=engine), spec["inputs"]
