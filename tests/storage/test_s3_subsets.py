"""`subsample` and `train_test_split` of an s3:// dataset: the same samples as a local copy, windowed locality kept, exact resume."""

from __future__ import annotations

import numpy as np

from llm.data import StreamingDataLoader, StreamingDataset, TokensLoader, train_test_split
from tests.resume import check_resume
from tests.storage.helpers import docs, write

BLOCK = 32


def test_a_remote_subsample_and_split_match_a_local_copy_and_keep_locality(s3_env, tmp_path, downloads):
    documents = docs(1600, seed=8)
    url = s3_env.url()
    write(url, documents, chunk_bytes="16KB")
    write(str(tmp_path / "local"), documents, chunk_bytes="16KB")
    limit = 6 * 16 * 1024
    remote = StreamingDataset(url, item_loader=TokensLoader(block_size=BLOCK), shuffle=True, cache_dir=tmp_path / "c",
                              max_cache_size=limit, subsample=0.5)
    shards = len(remote.manifest.shards)
    assert remote.shuffle_window is not None and remote.shuffle_window < shards, "the default window fits the cache"
    local = StreamingDataset(tmp_path / "local", item_loader=TokensLoader(block_size=BLOCK), shuffle=True,
                             subsample=0.5, shuffle_window=remote.shuffle_window)
    assert len(remote) == len(local) == len(StreamingDataset(url, item_loader=TokensLoader(block_size=BLOCK))) // 2
    epoch = np.concatenate([b.numpy() for b in StreamingDataLoader(remote, batch_size=4)])
    assert np.array_equal(epoch, np.concatenate([b.numpy() for b in StreamingDataLoader(local, batch_size=4)]))
    crossings = shards  # at most one more fetch per storage boundary between two windows (see test_windowed_s3)
    assert len(downloads) <= shards + crossings, f"{len(downloads)} downloads for {shards} shards: locality lost"
    train, val = train_test_split(remote, [0.9, 0.1], seed=1)
    local_val = train_test_split(local, [0.9, 0.1], seed=1)[1]
    assert all(np.array_equal(a.numpy(), b.numpy()) for a, b in zip(val[:], local_val[:])) and len(val) == len(local_val)


def run_split(config: dict, state: dict | None, steps: int | None) -> tuple[list[np.ndarray], dict]:
    ds = StreamingDataset(config["url"], item_loader=TokensLoader(block_size=BLOCK), shuffle=True, seed=2,
                          cache_dir=config["cache"], max_cache_size="48KB", storage_options=config["options"],
                          subsample=0.7)
    loader = StreamingDataLoader(train_test_split(ds, [0.5, 0.5], seed=4)[1], batch_size=4,
                                 num_workers=config.get("workers", 0), ledger=config.get("ledger"))
    if state is not None:
        loader.load_state_dict(state)
    out: list[np.ndarray] = []
    for batch in loader:
        out.append(batch.numpy())
        if steps is not None and len(out) >= steps:
            break
    return out, loader.state_dict()


def test_resume_of_a_remote_split_of_a_subsample_is_exact(s3_server, tmp_path):
    url = s3_server.url()
    write(url, docs(400, seed=3), storage_options=s3_server.options())
    config = {"url": url, "options": s3_server.options(), "cache": str(tmp_path / "cache")}
    check_resume(run_split, config, stops=[6], resume_configs=[{**config, "workers": 2, "cache": str(tmp_path / "c2")}],
                 verify=False)  # the audit reopens s3:// without the test server's storage_options: counts only
