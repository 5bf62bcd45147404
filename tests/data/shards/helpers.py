"""Fixtures for the core (issue 2) tests: real text, real tokenizers, datasets in temp folders."""

from __future__ import annotations

import json
import os
from functools import partial
from pathlib import Path

import numpy as np

from llm.data import StreamingDataLoader, StreamingDataset, TokensLoader
from llm.data.shards.prepare.optimize_text import optimize_text

STDLIB = Path(json.__file__).resolve().parent.parent  # CPython's own sources: real text on any machine


def real_lines(limit: int = 4000) -> list[str]:
    """Non-blank lines of real Python sources, stable across runs."""
    lines: list[str] = []
    for path in sorted(STDLIB.glob("*.py")):
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            if line.strip():
                lines.append(line)
                if len(lines) >= limit:
                    return lines
    return lines


def write_jsonl(path: Path, texts: list[str]) -> Path:
    with open(path, "w") as f:
        for t in texts:
            f.write(json.dumps({"text": t, "id": len(t)}) + "\n")
    return path


def make_token_dataset(folder: Path, n_lines: int = 3000, tokenizer: str = "simple", workers: int = 0, **kw) -> Path:
    """A token dataset from real text, small shards so blocks cross shard boundaries."""
    src = folder / "src.jsonl"
    write_jsonl(src, real_lines(n_lines))
    out = folder / "ds"
    optimize_text([str(src)], out, tokenizer, num_workers=workers, chunk_bytes=kw.pop("chunk_bytes", "16KB"), progress=False, **kw)
    return out


def _numbered_documents(_: int, docs: int, doc: int):
    from llm.data.shards.prepare.optimize import DocumentBatch

    tokens = (np.arange(docs * doc, dtype=np.int64) * 7919 + 3) % 50_000
    return DocumentBatch(tokens, np.full(docs, doc, dtype=np.int64))


def many_shards(out: Path, docs: int, doc: int, docs_per_shard: int = 1) -> Path:
    """`docs` documents of `doc` tokens (the same tokens for any split) in shards of `docs_per_shard` documents."""
    from llm.data import optimize

    real_fsync = os.fsync
    os.fsync = lambda fd: None  # durability is not under test: 10^3-10^4 fsyncs would dominate the build
    try:
        optimize(partial(_numbered_documents, docs=docs, doc=doc), [0], out, item_loader=TokensLoader(),
                 chunk_bytes=f"{docs_per_shard * (doc * 2 + 8)}B", num_workers=0, progress=False)
    finally:
        os.fsync = real_fsync
    return out


def all_tokens(dataset_dir: Path) -> np.ndarray:
    """The dataset's full token stream, read shard by shard straight from the files."""
    from llm.data.shards.format.manifest import Manifest

    m = Manifest.load(dataset_dir)
    parts = []
    for s in m.shards:
        raw = np.fromfile(dataset_dir / s.file, dtype=np.uint8)
        parts.append(raw[: s.tokens * np.dtype(s.dtype).itemsize].view(s.dtype).astype(np.int64))
    return np.concatenate(parts)


def run_loader(config: dict, state: dict | None, steps: int | None) -> tuple[list[np.ndarray], dict]:
    """check_resume's `run`: world_size ranks in lockstep in one process; a step is the global batch."""
    ds = StreamingDataset(
        config["path"], item_loader=TokensLoader(block_size=config["block"]), shuffle=config.get("shuffle", True), seed=7,
        shuffle_window=config.get("window"), encryption=config.get("encryption"),
    )
    if config.get("old_order") and state is None:  # the run of a library before state version 3 (its order)
        ds.legacy_window = True
    world, workers = config.get("world", 1), config.get("workers", 0)
    loaders = [
        StreamingDataLoader(ds, batch_size=config["batch"], num_workers=workers, worker_backend=config.get("backend", "auto"),
                            ledger=config.get("ledger"))
        for _ in range(world)
    ]
    if state is not None:
        for loader in loaders:
            loader.load_state_dict(state)
    epochs = config.get("epochs", 1)
    out: list[np.ndarray] = []
    while loaders[0].state_dict()["epoch"] < epochs and (steps is None or len(out) < steps):
        iters = []
        for rank, loader in enumerate(loaders):
            os.environ["RANK"], os.environ["WORLD_SIZE"] = str(rank), str(world)
            it = iter(loader)
            iters.append((it, next(it, None)))  # ranks are read when iteration starts
        os.environ.pop("RANK"), os.environ.pop("WORLD_SIZE")
        firsts = [b for _, b in iters]
        while firsts[0] is not None:
            out.append(np.concatenate([b.numpy() for b in firsts]))
            if steps is not None and len(out) >= steps:
                return out, every_rank_state(loaders)
            firsts = [next(it, None) for it, _ in iters]
    return out, every_rank_state(loaders)


def every_rank_state(loaders: list) -> dict:
    """Rank 0's state after every rank's state_dict(), as each rank saves its checkpoint: each commits its ledger."""
    return [loader.state_dict() for loader in loaders][0]
