"""Text DataLoader workers send several batches per message (text/wire.py): the same stream, the same states."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import llm.data.text.stream as text_stream
from llm.data.text.wire import group_size, grouped, ungrouped
from tests.data.text.test_stream import make_module, write_corpus
from tests.resume import loaded


def test_group_size_is_about_256k_tokens_within_bounds():
    assert group_size(8 * 2049) == 15  # 262,144 // 16,392
    assert group_size(4 * 4097) == 15
    assert group_size(1 << 20) == 1  # a batch above the target still goes alone
    assert group_size(1 << 18) == 1
    assert group_size(4 * 33) == 32  # tiny batches: at most 32 a message


def test_ungrouped_restores_the_one_at_a_time_round_robin():
    # two workers whose items never end (as text workers: "done" markers after their data)
    workers = [(f"w{w}-{i}" for i in itertools.count()) for w in range(2)]
    one_at_a_time = [next(workers[i % 2]) for i in range(40)]
    workers = [(f"w{w}-{i}" for i in itertools.count()) for w in range(2)]
    messages = ({"_group": g["_group"]} for pair in zip(*(grouped(w, 3) for w in workers)) for g in pair)
    assert list(itertools.islice(ungrouped(messages, 2), 40)) == one_at_a_time
    # a dataset iterated by hand ends: its last group is short, and nothing is lost
    assert [m["_group"] for m in grouped(iter(range(7)), 3)] == [[0, 1, 2], [3, 4, 5], [6]]
    assert list(ungrouped(iter([{"_group": [0, 2]}, {"_group": [1]}]), 2)) == [0, 1, 2]


def _steps_and_states(config: dict, steps: int | None, state: dict | None = None) -> tuple[list[np.ndarray], list[dict]]:
    """Each step's input_ids and labels, and the module's state after it (per-step state: exact mid-group)."""
    module = loaded([make_module(config)], state)[0]
    out, states = [], []
    for batch in itertools.islice(iter(module.train_dataloader()), steps):
        out.append(np.concatenate([batch["input_ids"].numpy(), batch["labels"].numpy()]))
        states.append(module.state_dict())
    return out, states


@pytest.mark.parametrize("group", [1, 5, 32])
def test_grouped_workers_give_the_same_batches_and_states_as_one_at_a_time(tmp_path, monkeypatch, group):
    path = write_corpus(tmp_path, "txt")
    config = {"kind": "txt", "path": str(path), "L": 32, "batch": 4, "workers": 2}
    monkeypatch.setattr(text_stream, "group_size", lambda batch_tokens: 0)  # 0: one batch a message, as before
    ref, ref_states = _steps_and_states(config, None)
    monkeypatch.setattr(text_stream, "group_size", lambda batch_tokens: group)
    got, got_states = _steps_and_states(config, None)
    assert len(ref) > 150  # the whole stream: a group's worth many times over
    assert len(got) == len(ref) and all(np.array_equal(a, b) for a, b in zip(got, ref))
    assert got_states == ref_states  # every step's cursors, whatever batch of a group it was
    # stopped inside a group (7 is no multiple of the group): the rest follows exactly, nothing lost or repeated
    rest, _ = _steps_and_states(config, None, ref_states[6])
    assert len(rest) == len(ref) - 7 and all(np.array_equal(a, b) for a, b in zip(rest, ref[7:]))


def test_messages_ahead_holds_about_a_million_tokens_and_little_of_a_short_epoch():
    from llm.data.text.workers import messages_ahead

    assert messages_ahead(15 * 8 * 2049, workers=2, batches_a_message=15, epoch_steps=None) == 5
    assert messages_ahead(64, workers=2, batches_a_message=1, epoch_steps=None) == 8  # tiny messages: at most 8
    assert messages_ahead(4 << 20, workers=2, batches_a_message=1, epoch_steps=None) == 2  # huge ones: at least 2
    # a short epoch: a quarter of it at most is read ahead (and dropped at its end), never below 2
    assert messages_ahead(64, workers=2, batches_a_message=1, epoch_steps=40) == 5
    assert messages_ahead(64, workers=2, batches_a_message=15, epoch_steps=100) == 2


def test_the_workers_queues_get_wide_pipes_where_the_os_allows():
    import fcntl

    from llm.data.text.workers import PIPE_BYTES, wide_pipe_context

    queue = wide_pipe_context(None).Queue()
    try:
        size = fcntl.fcntl(queue._reader.fileno(), fcntl.F_GETPIPE_SZ)
        assert size == PIPE_BYTES or size == 1 << 16  # 64 KB: the OS refused (a lower pipe-max-size)
        queue.put({"x": bytes(3 * PIPE_BYTES)})  # a message larger than the pipe still goes through
        assert len(queue.get(timeout=10)["x"]) == 3 * PIPE_BYTES
    finally:
        queue.close()
        queue.join_thread()
