"""Abilities read from declared attributes where a `getattr(x, name, default)` used to guess them.

Each case is one that the guess got wrong or hid: a disabled progress bar has no `desc`, so a
dying `map` worker was reported as an `optimize` one.
"""

from __future__ import annotations

import os

import pytest

from llm.data.ingest_stats import IngestWindow, zero_remote
from llm.data.jobs.tasks import progress_bar
from llm.data.shards.prepare.map import map as map_items


@pytest.mark.parametrize("enabled", [True, False])
def test_every_progress_bar_declares_its_job_name(enabled):
    bar = progress_bar(3, "dedup", "files", enabled)
    try:
        assert bar.desc == "dedup"
    finally:
        bar.close()


def _dies(value: int, folder: str) -> None:
    if value == 1:
        os._exit(3)  # the worker process ends, as an out-of-memory kill would


def test_a_dying_map_worker_is_named_as_map_without_a_progress_bar(tmp_path):
    with pytest.raises(RuntimeError, match=r"^map: worker process \d+ exited with code 3"):
        map_items(_dies, [0, 1, 2, 3], tmp_path / "out", num_workers=2, progress=False)


def test_an_ingest_window_starts_with_no_chunk_and_carries_an_open_chunk_over():
    window = IngestWindow()
    assert window._chunk is None
    window.open_chunk([4, 4, 4], 2)
    window.pending_waits.append(10)  # one batch of the chunk handed over
    window.reset(zero_remote())
    assert window._chunk == ([4, 4], 0, 2)  # the rest of the chunk belongs to the next window


def test_each_kind_of_datasets_entry_says_its_own_name():
    from llm.data.inputs.entries import SourceEntry, entry_name
    from llm.data.sft.settings import DatasetEntry

    assert entry_name(SourceEntry(dataset_path="data/wiki.jsonl.gz")) == "wiki"
    assert entry_name(SourceEntry(path="data/web.jsonl", name="web-2024")) == "web-2024"
    assert entry_name(SourceEntry(data_source="hf", dataset_name="org/set")) == "set"
    assert entry_name(DatasetEntry(path="sft/chat.jsonl")) == "chat"
    assert entry_name(DatasetEntry(path="org/hub-set", name="subset")) == "subset"


def test_closing_skip_ranges_closes_the_generator_of_batches_and_accepts_a_plain_iterator():
    from llm.training.skip_ranges import SkipRanges

    closed = []

    def batches():
        try:
            yield from range(10)
        finally:
            closed.append(True)  # the data's workers stop here

    filtered = SkipRanges([[1, 3]]).filter(batches())
    assert [next(filtered), next(filtered)] == [0, 3]
    filtered.close()
    assert closed == [True]
    assert list(SkipRanges([[0, 1]]).filter(iter("abc"))) == ["b", "c"]
