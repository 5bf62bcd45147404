"""`StreamingDataLoader(profile_batches=N)` writes a valid Chrome trace of the first N batches, then stops."""

from __future__ import annotations

import itertools
import json
import os
import threading
import time

import numpy as np
import pytest

from llm.data import StreamingDataLoader, StreamingDataset, TokensLoader, optimize
from llm.data.shards.read.source import chunk_bounds

NAMES = {"read", "decode", "transform", "collate", "wait"}


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("profile")
    optimize(lambda i: {"i": i, "v": np.full(4, i)}, list(range(200)), str(root / "items"), chunk_bytes="2KB",
             num_workers=0, progress=False)
    optimize(lambda i: np.arange(50) + i, list(range(200)), str(root / "tokens"), item_loader=TokensLoader(),
             chunk_bytes="4KB", num_workers=0, progress=False)
    return {"items": str(root / "items"), "tokens": str(root / "tokens")}


def load_trace(folder) -> list[dict]:
    """The trace's events, checked against the Trace Event Format as chrome://tracing and Perfetto read it."""
    trace = json.loads((folder / "result.json").read_text())
    assert isinstance(trace, dict) and isinstance(trace["traceEvents"], list)
    for e in trace["traceEvents"]:
        assert e["ph"] in ("X", "M") and isinstance(e["pid"], int) and isinstance(e["tid"], int) and e["name"]
        if e["ph"] == "X":
            assert isinstance(e["ts"], (int, float)) and isinstance(e["dur"], (int, float)) and e["dur"] >= 0
            assert e["ts"] >= 0 and e["name"] in NAMES
        else:
            assert e["name"] in ("thread_name", "process_name") and isinstance(e["args"]["name"], str)
    return [e for e in trace["traceEvents"] if e["ph"] == "X"]


def test_token_reads_on_two_reader_threads_and_one_wait_per_batch(folders, tmp_path):
    ds = StreamingDataset(folders["tokens"], item_loader=TokensLoader(block_size=16), shuffle=True)
    read = ds.read_blocks

    def slow_read(ids):  # reads that take a while, so both reader threads are surely busy
        time.sleep(0.005)
        return read(ids)

    ds.read_blocks = slow_read
    loader = StreamingDataLoader(ds, batch_size=4, num_workers=2, worker_backend="threads",
                                 profile_batches=8, profile_dir=tmp_path / "trace")
    consumed = list(itertools.islice(loader, 8))
    assert len(consumed) == 8 and (tmp_path / "trace" / "result.json").exists(), "written once 8 batches are out"
    events = load_trace(tmp_path / "trace")
    waits = [e for e in events if e["name"] == "wait"]
    assert sorted(e["args"]["batch"] for e in waits) == list(range(8))
    assert {(e["pid"], e["tid"]) for e in waits} == {(os.getpid(), threading.get_native_id())}
    reads = [e for e in events if e["name"] == "read"]
    bounds = chunk_bounds(len(loader), 2, loader._chunk_batches)
    assert len(reads) == sum(lo < 8 for lo in bounds[:-1]), "chunks holding the first 8 batches, no more"
    assert len({e["tid"] for e in reads}) == 2 and threading.get_native_id() not in {e["tid"] for e in reads}
    assert sum(e["args"]["samples"] for e in reads) >= 8 * 4
    first = min(e["ts"] for e in reads)
    assert first <= min(e["ts"] + e["dur"] for e in waits), "the first wait ends after a read began"


def test_item_spans_come_from_worker_processes(folders, tmp_path):
    ds = StreamingDataset(folders["items"], shuffle=True)
    loader = StreamingDataLoader(ds, batch_size=8, num_workers=2, profile_batches=6, profile_dir=tmp_path,
                                 worker_backend="processes")
    batches = list(loader)
    assert len(batches) == len(loader) == 25
    events = load_trace(tmp_path)
    names = {e["name"] for e in events}
    assert names == {"read", "decode", "collate", "wait"}
    workers = {e["pid"] for e in events if e["name"] != "wait"}
    assert len(workers) == 2 and os.getpid() not in workers
    collates = [e for e in events if e["name"] == "collate"]
    bounds = chunk_bounds(len(loader), 2, loader._chunk_batches)
    recorded = [(lo, hi) for lo, hi in zip(bounds[:-1], bounds[1:]) if lo < 6]
    assert len(collates) == sum(hi - lo for lo, hi in recorded) >= 6, "at least one collate per profiled batch"
    assert len([e for e in events if e["name"] == "decode"]) == 8 * sum(hi - lo for lo, hi in recorded)


def test_a_short_epoch_is_written_at_its_end_and_later_epochs_are_not_recorded(folders, tmp_path):
    ds = StreamingDataset(folders["items"], transform=lambda s: s["i"])
    loader = StreamingDataLoader(ds, batch_size=50, profile_batches=100, profile_dir=tmp_path)
    assert len(list(loader)) == 4
    events = load_trace(tmp_path)
    assert len([e for e in events if e["name"] == "wait"]) == 4 and any(e["name"] == "transform" for e in events)
    before = (tmp_path / "result.json").read_bytes()
    assert len(list(loader)) == 4 and (tmp_path / "result.json").read_bytes() == before


@pytest.mark.parametrize("bad", [0.5, -1, True, "8"])
def test_a_bad_profile_batches_is_refused(folders, bad):
    with pytest.raises(ValueError, match="profile_batches must be a positive number"):
        StreamingDataLoader(StreamingDataset(folders["items"]), profile_batches=bad)
