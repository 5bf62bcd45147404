"""Forked text workers write their windows into shared slots (text/ring.py): the same stream as through the pipe,
slots reused in turn under back-pressure, a message too big for a slot sent as bytes, a reference out of order
refused by name, and a worker whose main process is gone does not wait forever."""

from __future__ import annotations

import multiprocessing

import numpy as np
import pytest

import llm.data.text.stream as text_stream
import llm.data.text.workers as text_workers
from llm.data.text.ring import MessageRing
from tests.data.text.test_stream import write_corpus
from tests.data.text.test_worker_groups import _steps_and_states

fork_only = pytest.mark.skipif("fork" not in multiprocessing.get_all_start_methods(),
                               reason="the slots are inherited by forked workers only")


def _counting_rings(monkeypatch, slots: int | None = None, slot_bytes: int | None = None) -> list[MessageRing]:
    """Make `text_loader`'s rings through this, with `slots` and `slot_bytes` forced where given; returns them."""
    made: list[MessageRing] = []

    def make(workers, n, size, ctx):
        ring = MessageRing(workers, slots or n, slot_bytes or size, ctx)
        made.append(ring)
        return ring

    monkeypatch.setattr(text_workers, "MessageRing", make)
    return made


def _no_ring(workers, n, size, ctx):
    return None


@fork_only
@pytest.mark.parametrize("slots", [1, None])  # one slot a worker: each waits for the main process every message
def test_windows_through_shared_slots_are_the_pipes_stream_batch_for_batch(tmp_path, monkeypatch, slots):
    path = write_corpus(tmp_path, "txt")
    config = {"kind": "txt", "path": str(path), "L": 32, "batch": 4, "workers": 2}
    monkeypatch.setattr(text_stream, "group_size", lambda batch_tokens: 3)
    monkeypatch.setattr(text_workers, "MessageRing", _no_ring)
    ref, ref_states = _steps_and_states(config, None)
    rings = _counting_rings(monkeypatch, slots=slots)
    got, got_states = _steps_and_states(config, None)
    assert len(ref) > 150
    assert len(got) == len(ref) and all(np.array_equal(a, b) for a, b in zip(got, ref))
    assert got_states == ref_states
    # every message of every worker went through the slots, opened in the order each worker sent them
    assert rings and sum(rings[0]._expected) >= len(ref) // 3 - 2
    assert all(n > 10 for n in rings[0]._expected)
    # resumed inside a group, through the slots: the rest follows exactly
    rest, _ = _steps_and_states(config, None, ref_states[6])
    assert len(rest) == len(ref) - 7 and all(np.array_equal(a, b) for a, b in zip(rest, ref[7:]))


@fork_only
def test_a_message_bigger_than_a_slot_crosses_the_pipe_as_bytes(tmp_path, monkeypatch):
    path = write_corpus(tmp_path, "txt")
    config = {"kind": "txt", "path": str(path), "L": 512, "batch": 8, "workers": 2}
    monkeypatch.setattr(text_workers, "MessageRing", _no_ring)
    ref, ref_states = _steps_and_states(config, None)
    rings = _counting_rings(monkeypatch, slot_bytes=1)  # a page a slot: smaller than any message of 8 windows of 513
    got, got_states = _steps_and_states(config, None)
    assert len(ref) > 10 and len(got) == len(ref) and all(np.array_equal(a, b) for a, b in zip(got, ref))
    assert got_states == ref_states
    assert rings and rings[0]._expected == [0, 0]  # no slot was used


def test_the_main_process_refuses_a_slot_reference_out_of_order():
    ring = MessageRing(2, 2, 4096, multiprocessing.get_context())
    writer = ring.writer(1)
    first, ref = writer.take(100)
    first[:3] = b"abc"
    second = writer.take(100)[1]
    with pytest.raises(RuntimeError, match=r"text worker 1 sent message 1 of 100 bytes .* message 0 was due"):
        ring.read(second)
    assert bytes(ring.read(ref)[:3]) == b"abc"
    ring.release(ref)
    assert bytes(ring.read(second)[:3]) != b"" and ring._expected == [0, 1]
    assert writer.take(4097) is None  # bigger than a slot: the caller sends bytes
    with pytest.raises(ValueError, match="worker 2 has no slots in a ring made for 2 workers"):
        ring.writer(2)


def _wait_for_a_slot(ring: MessageRing) -> None:
    ring._owner = -1  # as if the process that made the ring were gone
    writer = ring.writer(0)
    writer.take(10)
    writer.take(10)  # its only slot is taken and nobody gives it back


@fork_only
def test_a_worker_waiting_for_a_slot_exits_once_the_main_process_is_gone():
    ctx = multiprocessing.get_context("fork")
    ring = MessageRing(1, 1, 4096, ctx)
    child = ctx.Process(target=_wait_for_a_slot, args=(ring,))
    child.start()
    child.join(20)
    assert child.exitcode == 1  # not alive, blocked for ever


def test_workers_from_a_forkserver_get_no_ring(tmp_path):
    from llm.data.text.workers import text_loader

    class Dataset(__import__("torch").utils.data.IterableDataset):
        group, batch_size, max_seq_len, ring = 3, 2, 16, None
        tokenizer = type("T", (), {"vocab_size": 100})()

        def __iter__(self):
            return iter(())

    ds = Dataset()
    text_loader(ds, 2, object_store=True, collate_fn=lambda x: x)
    assert ds.ring is None
    if "fork" in multiprocessing.get_all_start_methods() and multiprocessing.get_start_method() == "fork":
        text_loader(ds, 2, object_store=False, collate_fn=lambda x: x)
        assert isinstance(ds.ring, MessageRing) and ds.ring.slots >= 4


def test_a_ring_too_big_to_map_is_the_pipe():
    from llm.data.text.workers import RING_MAX_BYTES, message_ring

    ctx = multiprocessing.get_context()
    assert message_ring(2, 4, RING_MAX_BYTES // 12 + 1, ctx) is None  # 2 workers x 6 slots: over the cap
    ring = message_ring(2, 4, 1 << 20, ctx)
    assert isinstance(ring, MessageRing) and ring.slots == 6 and ring.slot_bytes == 1 << 20
