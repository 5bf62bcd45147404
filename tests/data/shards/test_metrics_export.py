"""`StreamingDataLoader(metrics_port=)`: scraped over HTTP on loopback and parsed by prometheus_client's parser, the
figures are `stats()`'s and the per-source counts `source_counts()`'s; a port in use, a bad port and a missing
library are one sentence each; the port is freed when the loader is closed or collected."""

from __future__ import annotations

import gc
import socket
import sys
import threading
from pathlib import Path

import pytest

from llm.data import CombinedStreamingDataset, StreamingDataLoader, StreamingDataset, TokensLoader
from llm.data.ingest_stats import REMOTE_KEYS
from llm.data.metrics_export import MetricsPortError
from tests.data.shards.helpers import make_token_dataset
from tests.scrape import by_source, scrape, value

LOOPBACK = "127.0.0.1"


@pytest.fixture(scope="module")
def token_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_token_dataset(tmp_path_factory.mktemp("metrics"), n_lines=1200)


def _listening(port: int = 0) -> socket.socket:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as a server binds: scraped connections linger
    sock.bind((LOOPBACK, port))
    sock.listen()
    return sock


def _free(port: int) -> bool:
    try:
        _listening(port).close()
        return True
    except OSError:
        return False


def _check_against_stats(samples: dict, stats: dict) -> None:
    assert value(samples, "llm_data_batches_total") == stats["batches"]
    assert value(samples, "llm_data_tokens_total") == stats["tokens"]
    assert value(samples, "llm_data_wait_seconds_count") == stats["batches"]
    assert value(samples, "llm_data_wait_seconds_sum") == pytest.approx(stats["wait_s"])
    for q in (50, 95, 99):
        assert value(samples, "llm_data_wait_seconds", quantile=str(q / 100)) == pytest.approx(stats[f"wait_p{q}_ms"] / 1000)
    for key in REMOTE_KEYS:
        assert value(samples, f"llm_data_{key}_total") == stats[key]


@pytest.mark.parametrize("workers, backend", [(0, "auto"), (2, "threads"), (2, "processes")])
def test_a_scrape_serves_stats_after_some_batches(token_dir: Path, workers: int, backend: str) -> None:
    ds = StreamingDataset(token_dir, item_loader=TokensLoader(block_size=33), shuffle=True)
    loader = StreamingDataLoader(ds, batch_size=4, num_workers=workers, worker_backend=backend, metrics_port=0,
                                 metrics_host=LOOPBACK)
    try:
        url = loader.metrics_url
        assert url.startswith(f"http://{LOOPBACK}:") and url.endswith("/metrics")
        empty = scrape(url)  # before the first batch: zeros, no quantiles
        assert value(empty, "llm_data_batches_total") == 0
        assert not any(name == "llm_data_wait_seconds" for name, _ in empty)
        it = iter(loader)
        taken = [next(it) for _ in range(7)]
        samples = scrape(url)
        stats = loader.stats()
        assert stats["batches"] == 7 and stats["tokens"] == sum(b.numel() for b in taken)
        _check_against_stats(samples, stats)
        counts = loader.source_counts()
        assert by_source(samples, "llm_data_source_tokens_total") == {"ds": counts["ds"]["tokens"]} == {"ds": 7 * 4 * 33}
        assert by_source(samples, "llm_data_source_samples_total") == {"ds": 28}
        assert not by_source(samples, "llm_data_source_remote_bytes_total"), "local data: no cache, no remote series"
        del it
    finally:
        loader.close_metrics()


def test_a_mixture_is_served_per_source(tmp_path: Path, token_dir: Path) -> None:
    other = tmp_path / "other"
    other.mkdir()
    make_token_dataset(other, n_lines=900)
    sources = [StreamingDataset(d, item_loader=TokensLoader(block_size=33), shuffle=True) for d in (token_dir, other / "ds")]
    mix = CombinedStreamingDataset(sources, weights=[0.7, 0.3], seed=3)
    loader = StreamingDataLoader(mix, batch_size=8, num_workers=2, metrics_port=0, metrics_host=LOOPBACK)
    try:
        for i, _ in enumerate(loader):
            if i == 19:
                break
        samples = scrape(loader.metrics_url)
        counts = loader.source_counts()
        assert len(counts) == 2 and set(counts) == set(mix.names)
        tokens = by_source(samples, "llm_data_source_tokens_total")
        assert tokens == {name: c["tokens"] for name, c in counts.items()}
        assert by_source(samples, "llm_data_source_samples_total") == {name: c["samples"] for name, c in counts.items()}
        assert sum(tokens.values()) == value(samples, "llm_data_tokens_total") == 20 * 8 * 33
        assert all(v > 0 for v in tokens.values()), "both sources served some blocks"
        _check_against_stats(samples, loader.stats())
    finally:
        loader.close_metrics()


def test_a_port_in_use_is_one_sentence_and_serves_nothing(token_dir: Path) -> None:
    taken = _listening()
    port = taken.getsockname()[1]
    try:
        ds = StreamingDataset(token_dir, item_loader=TokensLoader(block_size=33))
        with pytest.raises(MetricsPortError) as err:
            StreamingDataLoader(ds, batch_size=4, metrics_port=port, metrics_host=LOOPBACK)
        message = str(err.value)
        assert message == (f"metrics_port {port} is in use on {LOOPBACK} (something already listens there); "
                           "pick another port, or 0 for a free one")
        assert isinstance(err.value, OSError) and "\n" not in message
        taken.settimeout(0.5)
        with pytest.raises(socket.timeout):
            taken.accept()  # nobody connected to the port's owner: the loader left it alone
    finally:
        taken.close()


def test_under_torchrun_each_process_serves_on_port_plus_local_rank(token_dir: Path, monkeypatch) -> None:
    probe = _listening()
    port = probe.getsockname()[1]
    probe.close()
    if port >= 65535 or not _free(port + 1):
        pytest.skip("the port after a free one is taken")
    monkeypatch.setenv("LOCAL_RANK", "1")
    ds = StreamingDataset(token_dir, item_loader=TokensLoader(block_size=33))
    loader = StreamingDataLoader(ds, batch_size=4, metrics_port=port, metrics_host=LOOPBACK)
    try:
        assert loader.metrics_server.port == port + 1 and loader.metrics_url == f"http://{LOOPBACK}:{port + 1}/metrics"
        assert value(scrape(loader.metrics_url), "llm_data_batches_total") == 0
        taken = _listening(port)  # the same port on another machine's rank 0 is free here; in use here:
        try:
            with pytest.raises(MetricsPortError, match=rf"^metrics_port {port - 1} \+ local rank 1 = port {port} is in use"):
                StreamingDataLoader(ds, batch_size=4, metrics_port=port - 1, metrics_host=LOOPBACK)
        finally:
            taken.close()
    finally:
        loader.close_metrics()


def test_the_port_is_freed_on_close_and_when_the_loader_is_collected(token_dir: Path) -> None:
    ds = StreamingDataset(token_dir, item_loader=TokensLoader(block_size=33))
    loader = StreamingDataLoader(ds, batch_size=4, metrics_port=0, metrics_host=LOOPBACK)
    port = loader.metrics_server.port
    assert not _free(port)
    loader.close_metrics()
    assert _free(port) and loader.metrics_url is None
    loader.serve_metrics(port, LOOPBACK)  # served again, on the port it asked for
    assert loader.metrics_server.port == port and not _free(port)
    del loader
    gc.collect()
    assert _free(port), "a collected loader's endpoint stops"


@pytest.mark.parametrize("port", [-1, 65536, 1.5, True, "9400"])
def test_a_bad_port_is_one_sentence(token_dir: Path, port: object) -> None:
    ds = StreamingDataset(token_dir, item_loader=TokensLoader(block_size=33))
    with pytest.raises(ValueError, match=r"^metrics_port must be an integer from 0 to 65535 \(0: a free port\), got "):
        StreamingDataLoader(ds, batch_size=4, metrics_port=port, metrics_host=LOOPBACK)


def test_a_local_rank_that_is_no_number_is_one_sentence(token_dir: Path, monkeypatch) -> None:
    monkeypatch.setenv("LOCAL_RANK", "one")
    ds = StreamingDataset(token_dir, item_loader=TokensLoader(block_size=33))
    with pytest.raises(ValueError, match=r"^LOCAL_RANK is 'one', not a whole number >= 0; metrics_port is offset by it"):
        StreamingDataLoader(ds, batch_size=4, metrics_port=9400, metrics_host=LOOPBACK)


def test_a_host_not_of_this_machine_is_one_sentence(token_dir: Path) -> None:
    ds = StreamingDataset(token_dir, item_loader=TokensLoader(block_size=33))
    with pytest.raises(MetricsPortError, match=r"^metrics_port 0: host '192\.0\.2\.1' is not an address of this machine"):
        StreamingDataLoader(ds, batch_size=4, metrics_port=0, metrics_host="192.0.2.1")  # TEST-NET-1: never local


def test_without_prometheus_client_the_error_names_the_extra(token_dir: Path, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "prometheus_client", None)  # what an import of a missing library raises
    ds = StreamingDataset(token_dir, item_loader=TokensLoader(block_size=33))
    with pytest.raises(ImportError, match=r"^metrics_port needs the prometheus_client library: pip install "
                                          r"'llm-stream-data\[metrics\]'"):
        StreamingDataLoader(ds, batch_size=4, metrics_port=0)
    loader = StreamingDataLoader(ds, batch_size=4)  # without metrics_port nothing needs it
    assert loader.metrics_url is None and sum(1 for _ in loader) == len(loader)


def test_scrapes_during_iteration_never_break_the_loop_nor_count_backwards(tmp_path: Path) -> None:
    """A scrape bins the waits from its own thread while the loop appends (and bins) them, and reads the tokens
    while chunks close: the loop must never fail (a NumPy view of the live array made appends raise BufferError),
    and no counter may read lower than an earlier scrape (Prometheus would take it for a restart)."""
    ds = StreamingDataset(make_token_dataset(tmp_path, n_lines=1500), item_loader=TokensLoader(block_size=5))
    loader = StreamingDataLoader(ds, batch_size=1, num_workers=2, metrics_port=0, metrics_host=LOOPBACK)
    seen: list[tuple[float, float, float]] = []
    done = threading.Event()
    failed: list[BaseException] = []

    def scraper() -> None:
        try:
            while not done.is_set():
                s = scrape(loader.metrics_url)
                seen.append((value(s, "llm_data_batches_total"), value(s, "llm_data_tokens_total"),
                             value(s, "llm_data_wait_seconds_count")))
        except BaseException as e:  # noqa: BLE001 - handed to the test's thread
            failed.append(e)

    thread = threading.Thread(target=scraper)
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads take turns far more often: a race shows within the run
    thread.start()
    try:
        batches = sum(sum(1 for _ in loader) for _ in range(3))  # three epochs: several flushes of 4,096 waits
    finally:
        done.set()
        thread.join()
        sys.setswitchinterval(switch)
        loader.close_metrics()
    assert not failed, failed
    assert batches == 3 * len(loader) > 2 * 4096 and len(seen) > 10
    for earlier, later in zip(seen, seen[1:]):
        assert all(a <= b for a, b in zip(earlier, later)), (earlier, later)
    assert all(tokens == 5 * batches_ for batches_, tokens, _ in seen), "each batch counted with its tokens"
