"""The metrics endpoint over s3:// data (SeaweedFS): bytes and requests scraped equal the shard sizes and the GETs
seen on the wire (a counting proxy), in total and per source of a mixture read in this process."""

from __future__ import annotations

from pathlib import Path

import pytest

from llm.data import CombinedStreamingDataset, StreamingDataLoader, StreamingDataset, TokensLoader
from llm.data.shards.format.remote import load_any
from tests.scrape import by_source, scrape, value
from tests.storage.faultproxy import FaultProxy
from tests.storage.helpers import docs, write


def _upstream(server) -> tuple[str, int]:
    host, port = server.endpoint.removeprefix("http://").split(":")
    return host, int(port)


def _shard_gets(proxy: FaultProxy) -> int:
    return sum(n for (method, path), n in proxy.seen.items() if method == "GET" and "/shard-" in path)


@pytest.mark.parametrize("workers, backend", [(2, "threads"), (2, "processes")])
def test_remote_bytes_and_requests_are_served_per_source(s3_server, tmp_path: Path, workers: int, backend: str) -> None:
    urls = [s3_server.url(), s3_server.url()]
    sizes = []
    for i, url in enumerate(urls):
        write(url, docs(100 + 40 * i, seed=20 + i), storage_options=s3_server.options())
        sizes.append(sum(s.bytes for s in load_any(url, s3_server.options()).shards))
    proxy = FaultProxy(_upstream(s3_server), lambda method, path, attempt: "ok")  # counts every request it passes
    try:
        options = s3_server.options(endpoint=proxy.endpoint)
        sources = [StreamingDataset(u, item_loader=TokensLoader(block_size=64), shuffle=True, cache_dir=tmp_path / f"c{i}",
                                    max_cache_size=None, storage_options=options) for i, u in enumerate(urls)]
        mix = CombinedStreamingDataset(sources, weights=[0.5, 0.5], seed=7)
        loader = StreamingDataLoader(mix, batch_size=4, num_workers=workers, worker_backend=backend, metrics_port=0,
                                     metrics_host="127.0.0.1")
        try:
            assert sum(1 for _ in loader) == len(loader)  # a whole epoch: every shard of both sources is read
            samples = scrape(loader.metrics_url)
            stats = loader.stats()
            assert value(samples, "llm_data_remote_requests_total") == stats["remote_requests"] == _shard_gets(proxy)
            assert value(samples, "llm_data_remote_bytes_total") == stats["remote_bytes"] == sum(sizes)
            assert value(samples, "llm_data_cache_misses_total") == stats["cache_misses"] >= 2
            assert value(samples, "llm_data_batches_total") == stats["batches"] == len(loader)
            per_source = by_source(samples, "llm_data_source_remote_bytes_total")
            if backend == "processes":  # their counts reach this process summed over sources: totals only
                assert per_source == {}
            else:
                assert per_source == dict(zip(mix.names, map(float, sizes)))
                requests = by_source(samples, "llm_data_source_remote_requests_total")
                assert sum(requests.values()) == _shard_gets(proxy) and all(requests.values())
        finally:
            loader.close_metrics()
    finally:
        proxy.close()
