"""Remote ingest counts against independent ones: GET requests seen on the wire (a counting proxy in front of
SeaweedFS), bytes equal to the shard sizes, evictions equal to downloads minus the files left in the cache;
with 0 workers, 2 reader threads and 2 worker processes (whose counts travel with their chunks), and in `llm-train`'s
metrics.jsonl."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml

from llm.data import StreamingDataLoader, StreamingDataset, TokensLoader
from llm.data.ingest_stats import PROCESS_REMOTE, remote_diff
from llm.data.shards.format.remote import load_any
from tests.storage.faultproxy import FaultProxy
from tests.storage.helpers import docs, write


def _upstream(server) -> tuple[str, int]:
    host, port = server.endpoint.removeprefix("http://").split(":")
    return host, int(port)


@pytest.fixture(scope="module")
def dataset(s3_server) -> tuple[str, list[int]]:
    url = s3_server.url()
    write(url, docs(120, seed=5), storage_options=s3_server.options())
    return url, [s.bytes for s in load_any(url, s3_server.options()).shards]


def _shard_gets(proxy: FaultProxy) -> int:
    return sum(n for (method, path), n in proxy.seen.items() if method == "GET" and "/shard-" in path)


@pytest.mark.parametrize("workers, backend", [(0, "auto"), (2, "threads"), (2, "processes")])
def test_requests_and_bytes_match_the_wire(s3_server, dataset, tmp_path: Path, workers: int, backend: str) -> None:
    url, sizes = dataset
    assert len(sizes) >= 4, "the test needs several shards"
    proxy = FaultProxy(_upstream(s3_server), lambda method, path, attempt: "ok")  # counts every request it passes
    try:
        ds = StreamingDataset(url, item_loader=TokensLoader(block_size=64), shuffle=True, cache_dir=tmp_path,
                              max_cache_size=None, storage_options=s3_server.options(endpoint=proxy.endpoint))
        loader = StreamingDataLoader(ds, batch_size=4, num_workers=workers, worker_backend=backend)
        before = PROCESS_REMOTE.snapshot()
        assert sum(1 for _ in loader) == len(loader)
        first = loader.stats(reset=True)
        assert first["remote_requests"] == _shard_gets(proxy) == len(sizes), "each shard is fetched once, by one GET"
        assert first["remote_bytes"] == sum(sizes)
        assert first["cache_misses"] >= 1 and first["cache_evictions"] == 0
        assert remote_diff(PROCESS_REMOTE.snapshot(), before) == {k: first[k] for k in before}, "what llm-train reads"
        if workers:
            return  # each epoch starts its worker processes afresh (seconds each): one is enough
        assert sum(1 for _ in loader) == len(loader)  # the second epoch: every shard is in the cache
        second = loader.stats()
        assert (second["remote_requests"], second["remote_bytes"], second["cache_misses"]) == (0, 0, 0)
        assert second["cache_hits"] >= len(sizes) and _shard_gets(proxy) == len(sizes)
    finally:
        proxy.close()


def test_evictions_are_downloads_minus_what_the_cache_holds(s3_server, dataset, tmp_path: Path) -> None:
    url, sizes = dataset
    ds = StreamingDataset(url, item_loader=TokensLoader(block_size=64), shuffle=True, cache_dir=tmp_path,
                          max_cache_size=3 * max(sizes), storage_options=s3_server.options())
    loader = StreamingDataLoader(ds, batch_size=4)
    for _ in range(2):
        assert sum(1 for _ in loader) == len(loader)
    stats = loader.stats()
    held = [p for p in ds.cache.folder.iterdir() if p.name.startswith("shard-")]
    assert stats["cache_evictions"] > 0
    assert stats["remote_requests"] - stats["cache_evictions"] == len(held)
    assert stats["remote_requests"] >= len(sizes) and stats["remote_bytes"] >= sum(sizes)  # every shard at least once


@pytest.mark.slow
def test_llm_train_writes_remote_counts_per_interval(s3_env, tmp_path: Path) -> None:
    from llm.data.shards.prepare.optimize_text import optimize_text
    from llm.training.train import main as train_main

    corpus = tmp_path / "c.txt"
    corpus.write_text("\n".join(f"line {i} of the remote corpus, with a few more words" for i in range(25)) + "\n")
    url = s3_env.url()
    optimize_text([str(corpus)], url, "simple", num_workers=0, chunk_bytes="1KB", progress=False)
    sizes = [s.bytes for s in load_any(url).shards]
    assert len(sizes) >= 2, "the test needs several shards"
    tree = {"data": {"data_source": "optimized", "dataset_path": url, "max_seq_len": 32, "num_workers": 2},
            "model": {"d_model": 32, "n_layers": 1, "n_heads": 2},
            "training": {"batch_size": 4, "epochs": 1, "log_interval_steps": 5},
            "checkpoint": {"checkpoint_dir": str(tmp_path / "ck")}}
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(tree))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a tiny model on a shared machine: one thread is faster
    try:
        assert train_main(["--task", "lm", "--config-path", str(tmp_path / "cfg.yaml")]) == 0
    finally:
        torch.set_num_threads(threads)
    records = [json.loads(line) for line in (tmp_path / "ck" / "metrics.jsonl").read_text().splitlines()]
    logged = [r for r in records if "loss" in r]
    assert logged and all("remote_bytes" in r and "cache_hits" in r for r in logged)
    assert sum(r["remote_bytes"] for r in logged) == sum(sizes)
    assert sum(r["remote_requests"] for r in logged) == len(sizes)
