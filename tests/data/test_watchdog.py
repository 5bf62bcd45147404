"""The data watchdog without a store: worker slots written by real processes (and read after a SIGKILL), a loader
whose workers hang in a transform (logged, and raised in raise mode), the settings' one-sentence errors.
The store cases (a stalled GET, a killed worker, DDP) are in tests/storage/test_watchdog_*.py."""

from __future__ import annotations

import multiprocessing as mp
import os
import re
import signal
import time

import numpy as np
import pytest

from llm.data import StreamingDataLoader, StreamingDataset, TokensLoader, optimize
from llm.data.waiting import WorkerSlots, attach_slot, in_flight, local_lines, mark_reading, reading
from llm.data.watchdog import (
    DataStallError,
    Watchdog,
    add_listener,
    check_watchdog,
    remove_listener,
)


def _worker(path: str, index: int, ready, release) -> None:
    attach_slot(path, index)
    mark_reading(f"shard s-{index}.bin")
    with in_flight(f"reading s3://bucket/s-{index}.bin"):
        ready.set()
        release.wait(60)


def test_worker_slots_name_what_each_process_reads_also_after_it_was_killed() -> None:
    slots = WorkerSlots(2)
    ctx = mp.get_context("fork")
    # one release event per worker: a process killed inside Event.wait never acknowledges a notify, so a
    # shared event's set() would wait for it forever (multiprocessing's Condition counts its sleepers)
    ready, release = [ctx.Event(), ctx.Event()], [ctx.Event(), ctx.Event()]
    procs = [ctx.Process(target=_worker, args=(slots.path, i, ready[i], release[i])) for i in range(2)]
    for p in procs:
        p.start()
    try:
        assert all(e.wait(30) for e in ready)
        marks = slots.read()
        assert [(m.worker, m.pid, m.reading, m.request) for m in marks] == [
            (i, procs[i].pid, f"shard s-{i}.bin", f"reading s3://bucket/s-{i}.bin") for i in range(2)]
        assert all(m.reading_s >= 0 and m.request_s >= 0 and m.alive() for m in marks)
        os.kill(procs[1].pid, signal.SIGKILL)
        procs[1].join(30)
        after = slots.read()[1]
        assert not after.alive()
        assert re.fullmatch(rf"worker 1 \(pid {procs[1].pid}\) has exited while reading shard s-1\.bin "
                            r"\(for \d+\.\d s\), its request in flight for \d+\.\d s: reading s3://bucket/s-1\.bin",
                            after.phrase()), after.phrase()
    finally:
        for p, event in zip(procs, release):
            if p.is_alive():
                event.set()
            p.join(30)
            if p.is_alive():
                p.kill()


def test_this_process_marks_come_and_go() -> None:
    with reading("partition p0"), in_flight("reading s3://b/k"):
        lines = local_lines()
        assert any(re.search(r"reads partition p0 \(for \d+\.\d s\)", line) for line in lines), lines
        assert any(re.search(r"request in flight for \d+\.\d s: reading s3://b/k", line) for line in lines), lines
    assert not [line for line in local_lines() if "partition p0" in line or "s3://b/k" in line]


@pytest.fixture(scope="module")
def tokens(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("watchdog")
    optimize(lambda i: np.arange(i, i + 40) % 500, list(range(40)), str(root / "ds"), item_loader=TokensLoader(),
             chunk_bytes="2KB", num_workers=0, progress=False)
    return str(root / "ds")


class _SlowFirst:
    """A transform that hangs on the first block each worker reads (a stand-in for a stuck read)."""

    def __init__(self, seconds: float):
        self.seconds, self.done = seconds, False

    def __call__(self, block):
        if not self.done:
            self.done = True
            time.sleep(self.seconds)
        return block


def test_a_hanging_worker_process_is_logged_with_its_pid(tokens) -> None:
    seen: list[str] = []
    add_listener(seen.append)
    try:
        ds = StreamingDataset(tokens, item_loader=TokensLoader(block_size=16), transform=_SlowFirst(3))
        loader = StreamingDataLoader(ds, batch_size=2, num_workers=1, worker_backend="processes", watchdog_s=1)
        assert sum(1 for _ in loader) == len(loader)  # logging only: the epoch goes on
    finally:
        remove_listener(seen.append)
    assert seen, "the watchdog did not fire"
    assert re.match(rf"data watchdog: rank 0 of 1: StreamingDataLoader\({re.escape(tokens)}\) has handed no batch "
                    r"for \d+\.\d s \(watchdog_s=1\): worker 0 \(pid \d+\) ", seen[0]), seen[0]


@pytest.mark.parametrize("backend", ["threads", "processes"])
def test_raise_mode_raises_data_stall_error(tokens, backend) -> None:
    ds = StreamingDataset(tokens, item_loader=TokensLoader(block_size=16), transform=_SlowFirst(6))
    loader = StreamingDataLoader(ds, batch_size=2, num_workers=1, worker_backend=backend, watchdog_s=1,
                                 watchdog="raise")
    with pytest.raises(DataStallError, match=r"^data watchdog: rank 0 of 1: StreamingDataLoader\(.*\) has handed no "
                                             r"batch for \d+\.\d s \(watchdog_s=1\)"):
        for _ in loader:
            pass


def test_off_and_bad_settings() -> None:
    assert not Watchdog("x", 0).on
    assert check_watchdog(2, "raise") == (2.0, "raise")
    for value in (-1, float("nan"), "10", True):
        with pytest.raises(ValueError, match=r"^watchdog_s must be a number of seconds >= 0 \(0 turns the watchdog "
                                             r"off\), got "):
            check_watchdog(value, "log")
    with pytest.raises(ValueError, match=r"^data\.watchdog must be 'log' or 'raise', got 'loud'$"):
        check_watchdog(1, "loud", "data.")
    from llm.data.text.settings import TextStreamConfig

    with pytest.raises(ValueError, match=r"^data\.watchdog_s must be"):
        TextStreamConfig(watchdog_s=-5)


def test_a_network_folder_read_is_marked_in_flight(tmp_path) -> None:
    """`local:` datasets (network drives) are copied into the cache by LocalObjects.get_into: a read in flight."""
    from llm.data.storage.objects import LocalObjects

    (tmp_path / "shard.bin").write_bytes(b"x" * 100)
    seen: list[list[str]] = []

    def sink(_attempt: int):
        return lambda chunk: seen.append(local_lines())

    LocalObjects(tmp_path).get_into("shard.bin", sink)
    assert seen and any(re.search(rf"request in flight for \d+\.\d s: reading local:{re.escape(str(tmp_path))}/shard\.bin",
                                  line) for line in seen[0]), seen
    assert not [line for line in local_lines() if "shard.bin" in line]
