"""Windowed shuffle over object storage: the default window fits the cache, so an epoch fetches each shard about once, not 50 times.

Blocks that straddle two shards of different windows are read in the later window, from its own
shard and the kept edge of the other (plan/shuffle/windowed.py, read/edges.py): before that, each
such boundary cost one more whole-shard GET (about two per shard per epoch)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from llm.data.shards.format.loaders import TokensLoader
from llm.data.shards.read.dataset import StreamingDataset
from llm.data.shards.read.loader import StreamingDataLoader
from tests.storage.faultproxy import FaultProxy
from tests.storage.helpers import docs, write

BLOCK = 32


def _epoch(ds: StreamingDataset, workers: int = 2) -> np.ndarray:
    loader = StreamingDataLoader(ds, batch_size=2, num_workers=workers, worker_backend="threads")
    return np.concatenate([b.numpy() for b in loader])


def test_default_window_fits_the_cache_and_an_epoch_fetches_each_shard_about_once(s3_env, tmp_path, downloads):
    documents = docs(800, seed=4)  # the az/gs test's size: enough shards for the assertions, a quarter of the time
    url = s3_env.url()
    write(url, documents, chunk_bytes="4KB")
    limit = 8 * 4096
    ds = StreamingDataset(url, item_loader=TokensLoader(block_size=BLOCK), shuffle=True, cache_dir=tmp_path / "w",
                          max_cache_size=limit)
    shards = len(ds.manifest.shards)
    largest = max(s.bytes for s in ds.manifest.shards)
    assert sum(s.bytes for s in ds.manifest.shards) > 4 * limit, "the dataset must not fit in the cache"
    assert ds.shuffle_window == (limit // 2) // largest and 1 < ds.shuffle_window < shards

    tokens = np.concatenate(documents)
    blocks = np.full((len(ds), BLOCK), ds.pad_id, dtype=np.int64)
    blocks.reshape(-1)[: tokens.size] = tokens
    everything = sorted(map(tuple, blocks.tolist()))
    rows = _epoch(ds, workers=0)
    assert sorted(map(tuple, rows.tolist())) == everything, "every block exactly once"
    assert not np.array_equal(rows, blocks), "shuffled"
    assert set(downloads) == {s.file for s in ds.manifest.shards}
    # One reader: each shard once, although many boundaries' two shards fall in different windows.
    order = ds.epoch_permutation(0)
    window_of = {int(k): w for w in range(order.num_windows) for k in order.window_shards(w)}
    crossing = sum(window_of[k] != window_of[k + 1] for k in range(shards - 1))
    assert crossing > shards / 2 and len(downloads) <= 1.05 * shards, f"{len(downloads)} downloads, {shards} shards"

    downloads.clear()  # two reader threads: a few more where their chunks straddle two windows
    again = StreamingDataset(url, item_loader=TokensLoader(block_size=BLOCK), shuffle=True, cache_dir=tmp_path / "w2",
                             max_cache_size=limit)
    assert sorted(map(tuple, _epoch(again).tolist())) == everything
    windowed = len(downloads)
    assert windowed <= 1.25 * shards, f"{windowed} downloads for {shards} shards"

    downloads.clear()
    everywhere = StreamingDataset(url, item_loader=TokensLoader(block_size=BLOCK), shuffle=True,
                                  cache_dir=tmp_path / "g", max_cache_size=limit, shuffle_window="global")
    assert everywhere.shuffle_window is None
    assert sorted(map(tuple, _epoch(everywhere).tolist())) == everything
    assert len(downloads) > 5 * windowed, f"global shuffle: {len(downloads)} downloads, windowed: {windowed}"


@pytest.mark.parametrize("store", ["az", "gs"])  # s3: the test above, and test_s3_requests.py
def test_the_windowed_shuffle_fetches_each_shard_about_once_on_azure_and_gcs(store_env_of, tmp_path, downloads, store):
    """Counted twice: downloads in this process, and requests on the wire (a proxy passing everything)."""
    documents = docs(800, seed=4)
    server = store_env_of(store)
    url = server.url()
    write(url, documents, chunk_bytes="4KB")
    limit = 8 * 4096
    host, port = server.endpoint.removeprefix("http://").split(":")
    proxy = FaultProxy((host, int(port)), lambda *_: "ok")
    try:
        ds = StreamingDataset(url, item_loader=TokensLoader(block_size=BLOCK), shuffle=True, cache_dir=tmp_path / "w",
                              max_cache_size=limit, storage_options=server.options_via(proxy.endpoint))
        shards = len(ds.manifest.shards)
        assert sum(s.bytes for s in ds.manifest.shards) > 4 * limit and 1 < ds.shuffle_window < shards
        tokens = np.concatenate(documents)
        blocks = np.full((len(ds), BLOCK), ds.pad_id, dtype=np.int64)
        blocks.reshape(-1)[: tokens.size] = tokens
        opened = sum(proxy.seen.values())  # the manifest (and, for a prefix, nothing else)
        rows = _epoch(ds, workers=0)
    finally:
        proxy.close()
    on_the_wire = Counter(method for method, path in proxy.seen.elements() if "/shard-" in path)
    assert opened <= 2 and on_the_wire == Counter({"GET": len(downloads)}), (opened, on_the_wire, len(downloads))
    assert sum(proxy.seen.values()) - opened == len(downloads) < len(ds) / 4  # nothing else; never one per sample
    assert sorted(map(tuple, rows.tolist())) == sorted(map(tuple, blocks.tolist())), "every block exactly once"
    assert not np.array_equal(rows, blocks), "shuffled"
    assert set(downloads) == {s.file for s in ds.manifest.shards}
    print(f"{store}: {len(downloads)} GETs for {shards} shards")
    assert len(downloads) <= 1.15 * shards, f"{len(downloads)} downloads, {shards} shards"
