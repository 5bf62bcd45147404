"""Windowed shuffle over s3://: the default window fits the cache, so one epoch fetches each shard about once."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import llm.data.storage.cache as cache_module
from llm.data.shards.format.loaders import TokensLoader
from llm.data.shards.loader import StreamingDataLoader
from llm.data.shards.streaming import StreamingDataset
from tests.storage.helpers import docs, write

BLOCK = 32


@pytest.fixture
def downloads(monkeypatch):
    """Names of the objects the shard cache downloads (every attempt), counted in this process."""
    names: list[str] = []
    lock = threading.Lock()
    original = cache_module._download_to

    def counting(objects, name, part):
        with lock:
            names.append(name)
        return original(objects, name, part)

    monkeypatch.setattr(cache_module, "_download_to", counting)
    return names


def _epoch(ds: StreamingDataset) -> np.ndarray:
    loader = StreamingDataLoader(ds, batch_size=4, num_workers=2, worker_backend="threads")
    return np.concatenate([b.numpy() for b in loader])


def test_default_window_fits_the_cache_and_an_epoch_fetches_each_shard_about_once(s3_env, tmp_path, downloads):
    documents = docs(800, seed=4)
    url = s3_env.url()
    write(url, documents)
    limit = 8 * 4096
    ds = StreamingDataset(url, item_loader=TokensLoader(block_size=BLOCK), shuffle=True, cache_dir=tmp_path / "w",
                          max_cache_size=limit)
    shards = len(ds.manifest.shards)
    largest = max(s.bytes for s in ds.manifest.shards)
    assert sum(s.bytes for s in ds.manifest.shards) > 4 * limit, "the dataset must not fit in the cache"
    assert ds.shuffle_window == (limit // 2) // largest and 1 < ds.shuffle_window < shards

    rows = _epoch(ds)
    tokens = np.concatenate(documents)
    blocks = np.full((len(ds), BLOCK), ds.pad_id, dtype=np.int64)
    blocks.reshape(-1)[: tokens.size] = tokens
    assert sorted(map(tuple, rows.tolist())) == sorted(map(tuple, blocks.tolist())), "every block exactly once"
    assert not np.array_equal(rows, blocks), "shuffled"
    windowed = len(downloads)
    assert set(downloads) == {s.file for s in ds.manifest.shards}
    # Each shard once for its window, plus at most once more when a block spilling from the shard
    # before it (in storage order) is read in that shard's window: <= 2 x shards, never many times that.
    assert windowed <= 2 * shards, f"{windowed} downloads for {shards} shards"

    downloads.clear()
    everywhere = StreamingDataset(url, item_loader=TokensLoader(block_size=BLOCK), shuffle=True,
                                  cache_dir=tmp_path / "g", max_cache_size=limit, shuffle_window="global")
    assert everywhere.shuffle_window is None
    assert sorted(map(tuple, _epoch(everywhere).tolist())) == sorted(map(tuple, blocks.tolist()))
    assert len(downloads) > 3 * windowed, f"global shuffle: {len(downloads)} downloads, windowed: {windowed}"
