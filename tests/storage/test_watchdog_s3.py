"""The data watchdog against a real store: a shard GET stalled by the fault proxy is named (rank, worker or reader
thread, the shard and the request in flight with its age), logged or raised; a worker process killed while it
waits is named in the error that ends the iteration. Small `watchdog_s`; no timing asserts."""

from __future__ import annotations

import os
import re
import signal
import threading

import numpy as np
import pytest

from llm.data import StreamingDataLoader, StreamingDataset, TokensLoader
from llm.data.watchdog import DataStallError, add_listener, remove_listener
from tests.storage.faultproxy import FaultProxy
from tests.storage.helpers import docs, write


def _upstream(server) -> tuple[str, int]:
    host, port = server.endpoint.removeprefix("http://").split(":")
    return host, int(port)


@pytest.fixture(scope="module")
def dataset(s3_server) -> tuple[str, np.ndarray]:
    url = s3_server.url()
    documents = docs(60, seed=21)
    write(url, documents, storage_options=s3_server.options())
    return url, np.concatenate(documents)


class _Stall:
    """The fault proxy's plan: the first GET of the first shard asked for gets no answer (until the client gives up)."""

    def __init__(self) -> None:
        self.path: str | None = None
        self.lock = threading.Lock()

    def __call__(self, method: str, path: str, attempt: int) -> str:
        with self.lock:
            if method == "GET" and "/shard-" in path and self.path is None:
                self.path = path
                return "stall"
        return "ok"

    @property
    def shard(self) -> str:
        assert self.path is not None, "no shard GET went through the proxy"
        return self.path.rsplit("/", 1)[1]


class _Reports:
    """Every watchdog report of this process while the block runs."""

    def __init__(self) -> None:
        self.seen: list[str] = []
        self.hooks: list = []

    def __call__(self, report: str) -> None:
        self.seen.append(report)
        for hook in self.hooks:
            hook(report)

    def __enter__(self) -> _Reports:
        add_listener(self)
        return self

    def __exit__(self, *exc: object) -> None:
        remove_listener(self)


def _loader(url: str, options: dict, cache, workers: int, backend: str, **kw) -> StreamingDataLoader:
    ds = StreamingDataset(url, item_loader=TokensLoader(block_size=64), cache_dir=cache, max_cache_size=None,
                          storage_options=options)
    return StreamingDataLoader(ds, batch_size=4, num_workers=workers, worker_backend=backend, **kw)


@pytest.mark.parametrize("workers, backend", [(0, "auto"), (2, "threads"), (2, "processes")])
def test_a_stalled_request_is_named_and_the_epoch_is_whole(s3_server, dataset, tmp_path, caplog, workers, backend):
    url, want = dataset
    stall = _Stall()
    proxy = FaultProxy(_upstream(s3_server), stall)
    try:
        # the stalled GET times out after 4 s and is retried; the watchdog looks after 1 s
        options = {**s3_server.options(retries=3, backoff=0.01, timeout=4), **s3_server.options_via(proxy.endpoint)}
        loader = _loader(url, options, tmp_path, workers, backend, watchdog_s=1)
        with _Reports() as reports, caplog.at_level("WARNING", logger="llm.data.watchdog"):
            got = np.concatenate([b.numpy().reshape(-1) for b in loader])
    finally:
        proxy.close()
    assert np.array_equal(got[: len(want)], want), "the epoch is whole after the stall"
    named = [r for r in reports.seen if stall.shard in r and "in flight for" in r]
    assert named, f"no report named {stall.shard} with its request in flight: {reports.seen}"
    report = named[0]
    assert report.startswith("data watchdog: rank 0 of 1: StreamingDataLoader(") and "has handed no batch for" in report
    assert re.search(rf"in flight for \d+\.\d s: reading s3://llm-test/\S+/{re.escape(stall.shard)}", report), report
    if backend == "processes":
        assert re.search(r"worker \d \(pid \d+\) reads shard ", report), report
    else:
        assert re.search(r"thread \S+ reads shard ", report), report
    assert report in caplog.text, "the report is logged on the llm.data.watchdog logger"


def test_raise_mode_raises_data_stall_error_naming_the_shard(s3_server, dataset, tmp_path):
    url, _ = dataset
    stall = _Stall()
    proxy = FaultProxy(_upstream(s3_server), stall)
    try:
        options = {**s3_server.options(retries=0, timeout=5), **s3_server.options_via(proxy.endpoint)}
        loader = _loader(url, options, tmp_path, 2, "threads", watchdog_s=1, watchdog="raise")
        with pytest.raises(DataStallError) as caught:
            for _ in loader:
                pass
    finally:
        proxy.close()
    message = str(caught.value)
    assert message.startswith("data watchdog: rank 0 of 1:") and stall.shard in message, message
    assert "in flight for" in message


def test_a_killed_worker_is_named_with_what_it_was_reading(s3_server, dataset, tmp_path):
    url, _ = dataset
    stall = _Stall()
    proxy = FaultProxy(_upstream(s3_server), stall)
    killed: list[tuple[str, str]] = []

    def kill_the_reader(report: str) -> None:
        # the worker whose own GET is stalled (the other may wait for the same shard's download lock)
        found = re.search(r"worker (\d) \(pid (\d+)\) reads shard (\S+) of \S+ \(for \S+ s\), its request in flight", report)
        if found and not killed and stall.path and found.group(3) == stall.shard:
            killed.append((found.group(1), found.group(2)))
            os.kill(int(found.group(2)), signal.SIGKILL)

    try:
        options = {**s3_server.options(retries=0, timeout=60), **s3_server.options_via(proxy.endpoint)}
        loader = _loader(url, options, tmp_path, 2, "processes", watchdog_s=1)
        with _Reports() as reports:
            reports.hooks.append(kill_the_reader)
            with pytest.raises(RuntimeError) as caught:  # torch's own error for a worker that died
                for _ in loader:
                    pass
    finally:
        proxy.close()
    assert killed, f"no report named a worker reading {stall.path}: {reports.seen}"
    worker, pid = killed[0]
    notes = "\n".join(getattr(caught.value, "__notes__", []))
    assert f"worker {worker} (pid {pid}) has exited while reading shard {stall.shard}" in notes, notes
    assert "in flight for" in notes, notes


def test_a_text_stream_names_the_partition_and_request_of_its_worker(s3_server, tmp_path):
    """The text (and SFT) stream's workers report the partition they read and the ranged GET in flight."""
    from llm.data.storage.objects import open_objects
    from llm.data.text.stream import StreamingTextDataModule
    from llm.training.core.data_config import DataConfig

    url = s3_server.url()
    lines = "".join(f'{{"text": "record {i} alpha beta gamma delta"}}\n' for i in range(300)).encode()
    open_objects(url, s3_server.options()).put("part.jsonl", lines)
    stalled: list[str] = []
    armed = threading.Event()  # once the main process has listed and cut the partitions: the worker's first GET

    def plan(method: str, path: str, attempt: int) -> str:
        if armed.is_set() and method == "GET" and path.endswith("/part.jsonl") and not stalled:
            stalled.append(path)
            return "stall"
        return "ok"

    proxy = FaultProxy(_upstream(s3_server), plan)
    try:
        options = {**s3_server.options(retries=3, backoff=0.01, timeout=4), **s3_server.options_via(proxy.endpoint)}
        data = DataConfig(dataset_path=f"{url}/part.jsonl", max_seq_len=16, num_workers=1, storage_options=options,
                          watchdog_s=1)
        module = StreamingTextDataModule(data, 4, rank=0, world_size=1, loop=False)
        module.partitions()
        armed.set()
        with _Reports() as reports:
            batches = sum(1 for _ in module.train_dataloader())
    finally:
        proxy.close()
    assert batches > 0 and stalled, "the stream ends after the stalled GET was retried"
    named = [r for r in reports.seen if "in flight for" in r and "part.jsonl" in r]
    assert named, reports.seen
    assert named[0].startswith("data watchdog: rank 0 of 1: StreamingTextDataModule has handed no batch")
    assert re.search(r"worker 0 \(pid \d+\) reads partition \S*part\.jsonl", named[0]), named[0]
    assert re.search(rf"in flight for \d+\.\d s: reading {re.escape(url)}/part\.jsonl", named[0]), named[0]
