"""Reads that don't storm the store, on Azure and GCS too: every request counted on the wire (the fault proxy,
passing everything) per epoch. Token shards with the windowed shuffle (s3: test_s3_requests.py, with items
and a cache that holds the dataset), and raw text on all three: a few large ranged GETs, listing O(1) per
epoch, never a request per sample."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from llm.data.shards.format.loaders import TokensLoader
from llm.data.shards.read.dataset import StreamingDataset
from llm.data.shards.read.loader import StreamingDataLoader
from tests.storage.faultproxy import FaultProxy
from tests.storage.helpers import docs, write
from tests.storage.test_s3_text import _docs, _jsonl, make_module, run_stream, upload, via

BLOCK = 32


def _upstream(server) -> tuple[str, int]:
    host, port = server.endpoint.removeprefix("http://").split(":")
    return host, int(port)


def _kinds(seen: Counter, prefix: str) -> Counter:
    """Requests by kind: GETs of shards, of other objects (index.json), listings and the rest."""
    out: Counter = Counter()
    for (method, path), n in seen.items():
        name = path.rsplit("/", 1)[-1]
        if method == "GET" and f"/{prefix}/" in path and name.startswith("shard-"):
            out["shard GET"] += n
        elif method == "GET" and f"/{prefix}/" in path:
            out["other GET"] += n
        elif method == "GET":
            out["list"] += n  # GET on the bucket or container itself
        else:
            out[method] += n
    return out


@pytest.mark.parametrize("store", ["az", "gs"])  # s3: test_s3_requests.py
def test_an_epoch_with_the_windowed_shuffle_gets_each_shard_about_once(request, tmp_path, store):
    server = request.getfixturevalue(f"{store}_server")
    url = server.url()
    prefix = url.split("/", 3)[3]
    write(url, docs(600, seed=6), chunk_bytes="4KB", storage_options=server.options())
    proxy = FaultProxy(_upstream(server), lambda *_: "ok")
    try:
        limit = 8 * 4096
        ds = StreamingDataset(url, item_loader=TokensLoader(block_size=BLOCK), shuffle=True, seed=1,
                              cache_dir=tmp_path, max_cache_size=limit, storage_options=via(server, proxy.endpoint))
        shards, samples = len(ds.manifest.shards), len(ds)
        assert 1 < ds.shuffle_window < shards, "the dataset must not fit in the cache"
        crossings = []  # storage boundaries whose two shards fall in different windows, per epoch
        for epoch in range(2):
            order = ds.epoch_permutation(epoch)
            window_of = {int(k): w for w in range(order.num_windows) for k in order.window_shards(w)}
            crossings.append(sum(window_of[k] != window_of[k + 1] for k in range(shards - 1)))
        loader = StreamingDataLoader(ds, batch_size=4, num_workers=0)
        per_epoch = []
        for _ in range(2):
            proxy.seen.clear()
            rows = np.concatenate([b.numpy() for b in loader])
            assert len(rows) == samples
            per_epoch.append(_kinds(proxy.seen, prefix))
    finally:
        proxy.close()
    second = per_epoch[1]
    for counts, crossing in zip(per_epoch, crossings):
        # Once per shard for its window, once more per boundary whose shards fall in two windows (a token
        # block straddling it reads both), and a few more where the cache, 8 shards here, evicted a neighbour
        # before its second use: measured 69-70 GETs for 33 shards and 30 such boundaries, on every store.
        assert shards <= counts["shard GET"] <= 2.25 * shards, (counts, shards, crossing)
        assert counts["list"] <= 1 and counts["other GET"] <= 2, counts  # the manifest, read when opened
        assert sum(counts.values()) < samples / 4, (counts, samples)  # never a request per sample
    assert second["other GET"] == 0 and second["list"] == 0, second  # a second epoch lists and reads no manifest
    print(f"{store}: {shards} shards, {samples} samples; requests per epoch {[dict(c) for c in per_epoch]}, "
          f"boundaries across windows {crossings}")


@pytest.mark.parametrize("store", ["s3", "az", "gs"])
def test_text_is_read_in_a_few_large_ranged_gets(request, tmp_path, store):
    server = request.getfixturevalue(f"{store}_server")
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "big.jsonl").write_bytes(_jsonl(_docs(4000, 9)))
    url = server.url()
    upload(tmp_path / "in", url, server.options())
    proxy = FaultProxy(_upstream(server), lambda *_: "ok")
    try:
        config = {"path": f"{url}/big.jsonl", "options": via(server, proxy.endpoint), "L": 256, "batch": 8}
        steps, _ = run_stream(config, None, None)
        counts = Counter(method for method, _ in proxy.seen.elements())
    finally:
        proxy.close()
    partitions = len(make_module({**config, "options": server.options()}).partitions())
    # one GET per partition (each up to 8 MiB), the 4 KiB "JSON array?" probe, and the HEAD of the exact key
    assert counts["GET"] <= partitions + 2, (counts, partitions)
    assert counts["HEAD"] <= 2 and sum(counts.values()) <= partitions + 4, counts
    assert sum(counts.values()) * 20 < 4000, counts  # dozens of records per request, never one each
    print(f"{store}: 4000 records, {partitions} partitions, {len(steps)} batches; requests {dict(counts)}")
