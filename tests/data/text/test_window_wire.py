"""Windows cross the worker pipe as they are (`packed_windows`) and come back as `to_example`'s tensors."""

from __future__ import annotations

import numpy as np
import pytest

from llm.data.pack.window import WindowCutter, listed, to_example
from llm.data.text.wire import packed_windows, unpack_windows

EOS = 7


def _expected(rows: list[np.ndarray], max_seq_len: int) -> tuple[np.ndarray, np.ndarray]:
    planes = [to_example(w, max_seq_len, EOS) for w in rows]
    return np.stack([p[0] for p in planes]), np.stack([p[1] for p in planes])


@pytest.mark.parametrize("vocab_size,top", [(50_257, 50_256), (1 << 16, (1 << 16) - 1), (100_277, 100_276), (None, 300)])
@pytest.mark.parametrize("lengths", [[9, 9, 9], [9, 4, 2, 9], [3]], ids=["full", "short", "one"])
def test_windows_come_back_as_input_ids_and_labels(vocab_size, top, lengths):
    rng = np.random.default_rng(len(lengths))
    max_seq_len = 8
    rows = [rng.integers(0, top + 1, n).astype(np.int32) for n in lengths]
    rows[0][0] = top  # the largest id the vocabulary allows
    wire = packed_windows(rows, max_seq_len, vocab_size)
    batch = unpack_windows(wire, max_seq_len, EOS)
    ids, labels = _expected(rows, max_seq_len)
    assert np.array_equal(batch["input_ids"].numpy(), ids) and np.array_equal(batch["labels"].numpy(), labels)
    assert str(batch["input_ids"].dtype) == str(batch["labels"].dtype) == "torch.int64"
    narrow = vocab_size is not None and vocab_size <= 1 << 16
    assert len(wire) == 8 + 4 * len(rows) + len(rows) * (max_seq_len + 1) * (2 if narrow else 4)


def test_an_id_beyond_the_stated_vocabulary_is_never_cut_to_16_bits():
    rows = [np.array([1, 70_000, 3], dtype=np.int32)]  # a tokenizer whose ids exceed its vocab_size
    batch = unpack_windows(packed_windows(rows, 4, 50_257), 4, EOS)
    assert batch["input_ids"][0, 1].item() == 70_000 and batch["labels"][0, 0].item() == 70_000


def test_a_worker_sends_its_cursor_buffer_as_an_array_and_a_state_lists_it():
    cutter = WindowCutter(4, EOS)
    windows = list(cutter.feed(np.array([1, 2, 3, 4, 5, 6], dtype=np.uint32), 10))  # 7 tokens: one window, 3 left
    assert not list(cutter.feed(np.array([], dtype=np.uint32), 20))  # no window: the buffer grows to 4
    wire, plain = cutter.wire_cursor(), cutter.cursor()
    assert [w.tolist() for w in windows] == [[1, 2, 3, 4, 5]]
    assert isinstance(wire["token_buffer"], np.ndarray) and wire["token_buffer"].dtype == np.int32
    assert plain["token_buffer"] == [5, 6, EOS, EOS] and type(plain["token_buffer"][0]) is int
    assert plain["records"] == 2 and plain["offset"] == 20
    assert listed(wire) == plain and listed(plain) is plain
    resumed = WindowCutter(4, EOS, wire)  # a cursor as it came from a worker resumes like a listed one
    assert resumed.cursor() == plain
