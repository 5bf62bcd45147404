"""Shared pieces of the storage tests: small token datasets and a loader run for check_resume."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import numpy as np

from llm.data.shards.format.loaders import TokensLoader
from llm.data.shards.prepare.optimize import optimize
from llm.data.shards.read.dataset import StreamingDataset
from llm.data.shards.read.loader import StreamingDataLoader


def docs(n: int = 300, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 50_000, size=int(rng.integers(5, 200))) for _ in range(n)]


def write(output: str, documents: list[np.ndarray], **kw):
    return optimize(lambda i: documents[i], list(range(len(documents))), output, item_loader=TokensLoader(),
                    chunk_bytes=kw.pop("chunk_bytes", "4KB"), num_workers=kw.pop("workers", 0), progress=False, **kw)


def stream_tokens(url: str, block: int = 64, **kw) -> np.ndarray:
    """Every token of one unshuffled epoch, in order, padding cut off."""
    workers, backend = kw.pop("workers", 0), kw.pop("backend", "auto")
    ds = StreamingDataset(url, item_loader=TokensLoader(block_size=block), **kw)
    loader = StreamingDataLoader(ds, batch_size=4, num_workers=workers, worker_backend=backend)
    tokens = np.concatenate([b.numpy().reshape(-1) for b in loader])
    return tokens[: ds.reader.total]


def run_remote(config: dict, state: dict | None, steps: int | None) -> tuple[list[np.ndarray], dict]:
    """check_resume's `run` over an s3:// dataset (one rank, any workers)."""
    ds = StreamingDataset(config["url"], item_loader=TokensLoader(block_size=config["block"]), shuffle=True, seed=3,
                          cache_dir=config["cache"], max_cache_size=config.get("max_cache"),
                          storage_options=config["options"])
    loader = StreamingDataLoader(ds, batch_size=config["batch"], num_workers=config.get("workers", 0),
                                 worker_backend=config.get("backend", "auto"), ledger=config.get("ledger"))
    if state is not None:
        loader.load_state_dict(state)
    out: list[np.ndarray] = []
    while loader.state_dict()["epoch"] < config.get("epochs", 1):
        for batch in loader:
            out.append(batch.numpy())
            if steps is not None and len(out) >= steps:
                return out, loader.state_dict()
    return out, loader.state_dict()


class FolderSampler:
    """Samples the bytes in a folder every few milliseconds while a run goes on."""

    def __init__(self, folder: Path):
        self.folder, self.peak, self.samples = Path(folder), 0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            total = 0
            try:
                for entry in os.scandir(self.folder):
                    try:
                        total += entry.stat().st_size
                    except FileNotFoundError:
                        pass
            except FileNotFoundError:
                pass
            self.peak, self.samples = max(self.peak, total), self.samples + 1
            time.sleep(0.002)

    def __enter__(self) -> FolderSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
