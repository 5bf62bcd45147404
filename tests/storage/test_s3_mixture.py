"""A mixture of s3:// datasets: each source's cache gets its hints, item sources read in worker processes."""

from __future__ import annotations

import numpy as np
import pytest

from llm.data import (
    CombinedStreamingDataset,
    ItemsLoader,
    StreamingDataLoader,
    StreamingDataset,
    TokensLoader,
    optimize,
)
from tests.storage.helpers import docs, write


def test_each_remote_source_gets_cache_hints_for_the_shards_it_reads(s3_env, tmp_path):
    """Defect 3: one remote dataset sent hints, a mixture of two sent none."""
    urls = [s3_env.url(), s3_env.url()]
    for i, url in enumerate(urls):
        write(url, docs(150, seed=i))
    sources = [StreamingDataset(u, item_loader=TokensLoader(block_size=32), shuffle=True, cache_dir=tmp_path / f"c{i}")
               for i, u in enumerate(urls)]
    hinted: list[list[int]] = [[], []]
    for i, d in enumerate(sources):
        d.cache.hint = hinted[i].extend  # counts what the mixture tells each cache
    mix = CombinedStreamingDataset(sources, weights=[0.6, 0.4], seed=1)
    batches = list(StreamingDataLoader(mix, batch_size=4))
    assert batches and all(len(h) > 0 for h in hinted)
    ids = mix.global_ids(0, np.arange(mix.num_samples))
    src = mix.sources_of(ids)
    for i, d in enumerate(sources):
        first = d.to_base(ids[src == i] - mix.offsets[i]) * 32
        read = set((np.searchsorted(d.reader.starts, first, side="right") - 1).tolist())
        assert read <= set(hinted[i]), f"source {i}: shards read but never hinted"


@pytest.mark.timeout(240)
def test_a_mixture_of_remote_item_datasets_reads_in_worker_processes(s3_env):
    """Defect 4: the forkserver switch looked at dataset.cache, which a mixture lacked: the workers hung."""
    urls = [s3_env.url(), s3_env.url()]
    for k, url in enumerate(urls):
        optimize(lambda i, k=k: {"id": k * 1000 + i}, list(range(40)), url, chunk_size=8, num_workers=0, progress=False)
    mix = CombinedStreamingDataset([StreamingDataset(u, item_loader=ItemsLoader()) for u in urls], seed=2)
    loader = StreamingDataLoader(mix, batch_size=4, num_workers=2, worker_backend="processes")
    assert loader.multiprocessing_context is not None
    got = sorted(int(i) for batch in loader for i in batch["id"])
    want = sorted(int(i) for i in mix.global_ids(0, np.arange(mix.num_samples)))
    assert len(got) == mix.num_samples and got == sorted(int(x["id"]) for x in mix[:]) and want
