"""The practical limits: the tokenizer alone (2 processes, no writing) and a NumPy memmap reader."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import time
from pathlib import Path

import numpy as np

from bench.runners.common import BATCH, BLOCK, consume
from bench.tok import encoder


def _count(args: tuple[str, str, str]) -> tuple[int, int]:
    spec, path, engine = args
    tokens = docs = 0
    for arr in encoder(spec, engine).documents(path):
        tokens += len(arr)
        docs += 1
    return tokens, docs


def prepare(spec: dict) -> dict:
    """Tokenizer limit: encode the corpus in N processes, count tokens, write nothing.

    `engine`: "ours" (the fastest engine identical to the reference, as `load_tokenizer` picks it)
    or "reference" (`tokenizers` / `tiktoken`).
    """
    engine = spec.get("engine", "reference")
    t0 = time.perf_counter()
    with mp.get_context("fork").Pool(spec["num_workers"]) as pool:
        parts = pool.map(_count, [(spec["tokenizer"], p, engine) for p in spec["inputs"]], chunksize=1)
    seconds = time.perf_counter() - t0
    return {"seconds": seconds, "tokens": sum(t for t, _ in parts), "documents": sum(d for _, d in parts)}


def _encode_file(args: tuple[str, str]) -> tuple[np.ndarray, np.ndarray]:
    spec, path = args
    docs = list(encoder(spec).documents(path))
    lens = np.array([len(d) for d in docs], dtype=np.int64)
    return (np.concatenate(docs) if docs else np.zeros(0, encoder(spec).dtype)), lens


def build_tokens(spec: dict) -> dict:
    """Untimed set-up: the canonical token stream of the corpus (in input order) as one flat file."""
    out = Path(spec["output"])
    tmp = out.with_suffix(".tmp")
    lens_all: list[np.ndarray] = []
    shard_docs = [0]
    dtype = None
    with open(tmp, "wb") as f, mp.get_context("fork").Pool(spec["num_workers"]) as pool:
        for toks, lens in pool.imap(_encode_file, [(spec["tokenizer"], p) for p in spec["inputs"]]):
            f.write(toks.tobytes())
            dtype = toks.dtype
            lens_all.append(lens)
            shard_docs.append(shard_docs[-1] + len(lens))
    lens = np.concatenate(lens_all)
    offsets = np.zeros(len(lens) + 1, dtype=np.int64)
    np.cumsum(lens, out=offsets[1:])
    offsets_path = str(out) + ".docs.npy"
    np.save(offsets_path, offsets)
    os.replace(tmp, out)
    meta = {"tokens": int(offsets[-1]), "documents": len(lens), "dtype": str(np.dtype(dtype)),
            "doc_offsets": offsets_path, "shard_docs": shard_docs, "path": str(out)}
    Path(spec["index"]).write_text(json.dumps(meta))
    return meta


def stream(spec: dict) -> dict:
    """Memmap limit: one process, a random permutation of whole blocks, gathered with fancy indexing."""
    import torch

    t0 = time.perf_counter()
    meta = json.loads(Path(spec["index"]).read_text())
    mm = np.memmap(meta["path"], dtype=np.dtype(meta["dtype"]), mode="r")
    n_blocks = len(mm) // BLOCK
    blocks = mm[: n_blocks * BLOCK].reshape(n_blocks, BLOCK)
    def batches():
        for epoch in range(spec.get("epochs", 1)):
            perm = np.random.default_rng(spec.get("seed", 42) + epoch).permutation(n_blocks)
            for i in range(0, n_blocks, BATCH):
                yield torch.from_numpy(blocks[perm[i:i + BATCH]].astype(np.int64))

    return consume(batches(), t0)
