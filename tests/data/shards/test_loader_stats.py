"""`StreamingDataLoader.stats()`: batches, tokens and waits counted against the batches the caller got, with
0 and 2 workers (threads and processes), and the wait histogram against exact percentiles."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from llm.data import ItemsLoader, StreamingDataLoader, StreamingDataset, TokensLoader, optimize
from llm.data.ingest_stats import REMOTE_KEYS, RemoteCounters, WaitHistogram
from tests.data.shards.helpers import make_token_dataset


@pytest.fixture(scope="module")
def token_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_token_dataset(tmp_path_factory.mktemp("stats"), n_lines=1500)


@pytest.mark.parametrize("workers, backend", [(0, "auto"), (2, "threads"), (2, "processes")])
def test_stats_count_what_the_caller_got(token_dir: Path, workers: int, backend: str) -> None:
    ds = StreamingDataset(token_dir, item_loader=TokensLoader(block_size=33), shuffle=True)
    loader = StreamingDataLoader(ds, batch_size=4, num_workers=workers, worker_backend=backend)
    batches, tokens = 0, 0
    for batch in loader:
        batches += 1
        tokens += batch.numel()
    stats = loader.stats()
    assert (stats["batches"], stats["tokens"]) == (batches, tokens) == (len(loader), len(ds) * 33)
    assert stats["wait_p50_ms"] <= stats["wait_p95_ms"] <= stats["wait_p99_ms"]
    assert 0 < stats["wait_s"] <= stats["seconds"]
    assert stats["batches_per_s"] == pytest.approx(batches / stats["seconds"])
    assert stats["tokens_per_s"] == pytest.approx(tokens / stats["seconds"])
    assert all(stats[key] == 0 for key in REMOTE_KEYS), "local data reads nothing remote"


def test_reset_starts_a_new_window_and_a_second_epoch_adds_up(token_dir: Path) -> None:
    ds = StreamingDataset(token_dir, item_loader=TokensLoader(block_size=33))
    loader = StreamingDataLoader(ds, batch_size=8)
    first = sum(1 for _ in loader)
    assert loader.stats(reset=True)["batches"] == first
    empty = loader.stats()
    assert empty["batches"] == 0 and empty["wait_p50_ms"] is None and empty["tokens"] == 0
    taken = 0
    for _ in loader:  # the second epoch, left early
        taken += 1
        if taken == 5:
            break
    assert loader.stats()["batches"] == 5


def test_item_batches_count_no_tokens(tmp_path: Path) -> None:
    optimize(lambda i: {"x": np.full(3, i), "label": i}, list(range(40)), str(tmp_path / "items"), num_workers=0, progress=False)
    loader = StreamingDataLoader(StreamingDataset(tmp_path / "items", item_loader=ItemsLoader()), batch_size=4, num_workers=2,
                                 worker_backend="processes")
    assert sum(1 for _ in loader) == 10
    stats = loader.stats()
    assert stats["batches"] == 10 and stats["tokens"] is None and stats["tokens_per_s"] is None


def test_wait_percentiles_are_within_six_percent_of_the_exact_ones() -> None:
    waits = np.random.default_rng(0).lognormal(mean=11, sigma=2.5, size=20_000).astype(np.int64) + 1  # ns
    histogram = WaitHistogram()
    for w in waits.tolist():
        histogram.add(w)
    for q in (50, 95, 99):
        exact = np.percentile(waits, q, method="inverted_cdf") / 1e6
        assert histogram.percentile_ms(q) == pytest.approx(exact, rel=0.06), q
    assert histogram.total_ns == int(waits.sum()) and histogram.n == len(waits)


def test_counters_restart_at_zero_in_a_forked_child() -> None:
    parent = RemoteCounters()
    counters = RemoteCounters(parent)
    counters.add("remote_bytes", 100)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: nothing it inherited is its own count
        ok = counters.snapshot()["remote_bytes"] == 0 and parent.snapshot()["remote_bytes"] == 0
        counters.add("remote_bytes", 7)
        ok = ok and parent.snapshot()["remote_bytes"] == 7
        os.write(write, b"1" if ok else b"0")
        os._exit(0)
    os.close(write)
    assert os.read(read, 1) == b"1"
    os.waitpid(pid, 0)
    assert counters.snapshot()["remote_bytes"] == parent.snapshot()["remote_bytes"] == 100


def test_a_mixture_counts_its_batches_and_tokens(token_dir: Path) -> None:
    from llm.data import CombinedStreamingDataset

    sources = [StreamingDataset(token_dir, item_loader=TokensLoader(block_size=33), shuffle=True, seed=s) for s in (1, 2)]
    mix = CombinedStreamingDataset(sources, weights=[0.5, 0.5], seed=3)
    loader = StreamingDataLoader(mix, batch_size=4, num_workers=2)
    tokens = sum(b.numel() for b in loader)
    stats = loader.stats()
    assert (stats["batches"], stats["tokens"]) == (len(loader), tokens) and stats["remote_bytes"] == 0


def test_tokens_are_exact_mid_chunk_and_across_a_reset(token_dir: Path) -> None:
    ds = StreamingDataset(token_dir, item_loader=TokensLoader(block_size=33))
    loader = StreamingDataLoader(ds, batch_size=2)  # late chunks hold many batches
    it = iter(loader)
    for n in range(1, 40):
        next(it)
        assert loader.stats()["tokens"] == n * 2 * 33, n
        if n == 30:
            loader.stats(reset=True)
            break
    next(it)
    assert (loader.stats()["batches"], loader.stats()["tokens"]) == (1, 2 * 33)
