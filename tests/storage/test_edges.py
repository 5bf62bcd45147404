"""Kept shard edges (read/edges.py): a block straddling two shards is read from them, token for token and
position for position as from the shards; a damaged edge is ignored; an encrypted dataset keeps none."""

from __future__ import annotations

import numpy as np
import pytest

from llm.data import FernetEncryption, StreamingDataset, TokensLoader
from tests.storage.helpers import docs, write

BLOCK = 32


def _remote(tmp_path, cache: str, **kw) -> StreamingDataset:
    loader = TokensLoader(block_size=BLOCK, document_boundaries=True)
    return StreamingDataset(f"local:{tmp_path / 'data'}", item_loader=loader, cache_dir=tmp_path / cache, **kw)


def _straddlers(ds: StreamingDataset) -> np.ndarray:
    """Blocks lying in two neighbouring shards."""
    first = np.arange(len(ds)) * BLOCK
    last = np.minimum(first + BLOCK, ds.reader.total) - 1
    a = np.searchsorted(ds.reader.starts, first, side="right") - 1
    b = np.searchsorted(ds.reader.starts, last, side="right") - 1
    return np.flatnonzero(b == a + 1)


def _drop_shards(ds: StreamingDataset) -> None:
    """Remove every cached shard (the edges stay): the next read of a shard is a download."""
    for f in ds.cache.folder.iterdir():
        if f.is_file() and not f.name.startswith("."):
            f.unlink()


@pytest.fixture(params=[None, "zstd"])
def dataset(tmp_path, request):
    write(f"local:{tmp_path / 'data'}", docs(300, seed=5), chunk_bytes="2KB", compression=request.param)
    plain = StreamingDataset(tmp_path / "data", item_loader=TokensLoader(block_size=BLOCK, document_boundaries=True))
    return tmp_path, plain.read_blocks(np.arange(len(plain)))


def test_straddling_blocks_read_from_kept_edges_are_the_shards_tokens_and_positions(dataset, downloads):
    tmp_path, expected = dataset
    ds = _remote(tmp_path, "c")
    assert ds.edges is not None
    everything = ds.read_blocks(np.arange(len(ds)))  # opens every shard: their edges are kept
    assert all(np.array_equal(everything[k], expected[k]) for k in expected)
    straddlers = _straddlers(ds)
    assert len(straddlers) > 10
    kept = sorted(p.name for p in ds.edges.folder.iterdir())
    assert kept == sorted(f"{s.file}.npz" for s in ds.manifest.shards)

    _drop_shards(ds)
    downloads.clear()
    fresh = _remote(tmp_path, "c")  # another reader of the same cache: the edges are on disk
    got = fresh.read_blocks(straddlers)
    assert downloads == [], "every straddling block came from the kept edges"
    assert all(np.array_equal(got[k], expected[k][straddlers]) for k in expected)
    fresh.hint_samples(straddlers)
    fresh.cache.wait_prefetches()
    assert downloads == [], "nor are their shards prefetched"


def test_a_damaged_or_foreign_edge_is_ignored_and_the_shard_read_whole(dataset, downloads):
    tmp_path, expected = dataset
    ds = _remote(tmp_path, "c")
    ds.read_blocks(np.arange(len(ds)))
    straddlers = _straddlers(ds)
    paths = sorted(ds.edges.folder.iterdir())
    paths[0].write_bytes(paths[0].read_bytes()[:-40] + b"\0" * 40)  # damaged
    paths[1].write_bytes(paths[2].read_bytes())  # another shard's edges
    _drop_shards(ds)
    downloads.clear()
    fresh = _remote(tmp_path, "c")
    got = fresh.read_blocks(straddlers)
    assert all(np.array_equal(got[k], expected[k][straddlers]) for k in expected)
    bad = {paths[0].name.removesuffix(".npz"), paths[1].name.removesuffix(".npz")}
    assert downloads and set(downloads) <= bad, downloads  # only the shards whose edges were bad, read whole


def test_an_encrypted_dataset_keeps_no_edges(tmp_path):
    key = FernetEncryption("correct horse battery staple")
    write(f"local:{tmp_path / 'secret'}", docs(100, seed=2), chunk_bytes="2KB", encryption=key)
    ds = StreamingDataset(f"local:{tmp_path / 'secret'}", item_loader=TokensLoader(block_size=BLOCK), encryption=key,
                          cache_dir=tmp_path / "c")
    ds.read_blocks(np.arange(len(ds)))
    assert ds.edges is None and not (ds.cache.folder / ".edges").exists()


def test_cache_ls_counts_the_edges_and_clear_removes_them_with_the_folder(dataset):
    from llm.data.storage.cache_admin import clear, list_caches

    tmp_path, _ = dataset
    ds = _remote(tmp_path, "c")
    ds.read_blocks(np.arange(len(ds)))
    folder = ds.cache.folder
    edge_bytes = sum(p.stat().st_size for p in ds.edges.folder.iterdir())
    shard_bytes = sum(p.stat().st_size for p in folder.iterdir() if p.is_file() and not p.name.startswith("."))
    ds.cache.registration.close()  # the reader is done: its folder may go
    del ds
    (listed,) = list_caches(tmp_path / "c")
    assert listed.bytes >= shard_bytes + edge_bytes
    cleared = clear(listed)
    assert cleared.gone and not folder.exists(), cleared
