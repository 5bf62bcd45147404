"""Best-fit packing: whole documents in blocks, only long ones split, bounded open blocks, exact cursors."""

from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llm.data.pack.best_fit import (
    BestFitCutter,
    OpenBlocks,
    block_example,
    check_open_blocks,
    check_packing,
    cu_seqlens,
    window_slots,
)
from llm.data.pack.window import IGNORE_INDEX
from llm.data.stage import StateError

EOS = 999
docs_st = st.lists(st.lists(st.integers(0, 50), min_size=0, max_size=40), min_size=0, max_size=40)


def _pack(docs, L, buffer, cursor=None, start=0):
    """Every block that goes out, with the cursor right after it."""
    packer = BestFitCutter(L, EOS, buffer, cursor)
    out = []
    for i, doc in enumerate(docs[start:], start=start):
        for block in packer.feed(np.array(doc, dtype=np.int64), offset_after=i + 1):
            out.append(([w.tolist() for w in block], packer.cursor()))
    for block in packer.finish():
        out.append(([w.tolist() for w in block], packer.cursor()))
    return out


def _expected_pieces(docs, L):
    """A document of n tokens + EOS: whole when n <= L, else full windows of L + 1 and a tail."""
    pieces = []
    for doc in docs:
        data = [*doc, EOS]
        n = len(doc)
        pieces += [data[k * L : k * L + L + 1] for k in range(n // L)]
        if n % L:
            pieces.append(data[(n // L) * L :])
    return pieces


@settings(max_examples=200, deadline=None)
@given(docs=docs_st, L=st.integers(1, 24), buffer=st.integers(1, 6))
def test_every_document_whole_unless_longer_than_a_block(docs, L, buffer):
    blocks = [b for b, _ in _pack(docs, L, buffer)]
    assert all(sum(len(w) - 1 for w in b) <= L for b in blocks)
    got = Counter(tuple(w) for b in blocks for w in b)
    assert got == Counter(tuple(p) for p in _expected_pieces(docs, L))
    # a document that fits a block is never split: its whole window is one piece
    for doc in docs:
        if 0 < len(doc) <= L:
            assert got[(*doc, EOS)] >= 1


@settings(max_examples=150, deadline=None)
@given(docs=docs_st, L=st.integers(1, 12), buffer=st.integers(1, 5), cut=st.integers(0, 400))
def test_resume_from_any_cursor_is_exact(docs, L, buffer, cut):
    full = _pack(docs, L, buffer)
    if not full:
        return
    cut %= len(full)
    _, cursor = full[cut]
    assert len(cursor["open_blocks"]) <= buffer  # the cursor is bounded by the buffer
    rest = _pack(docs, L, buffer, cursor, start=cursor["records"])
    assert [b for b, _ in rest] == [b for b, _ in full[cut + 1 :]]


def test_a_block_fills_with_the_document_that_fits_it_best():
    blocks = OpenBlocks(capacity=10, limit=3)

    def add(piece: str) -> list:
        return blocks.add(piece, piece.upper(), len(piece))

    assert add("aaaaaa") == [] and add("bbbbbbb") == []  # rooms 4 and 3
    assert add("ccc") == [["bbbbbbb", "ccc"]]  # the tighter room, now exactly full: out at once
    assert add("dd") == [] and blocks.raw_blocks() == [["AAAAAA", "DD"]]
    assert add("eeeeeeeee") == [] and add("ffffffff") == []  # three open: the buffer is full
    assert add("ggggggg") == [["eeeeeeeee"]]  # no room anywhere: the fullest goes out
    assert len(blocks.blocks) == 3


def test_the_end_of_a_partition_repacks_the_open_blocks():
    packer = BestFitCutter(8, EOS, buffer=4)
    for i, n in enumerate([3, 3, 5, 5]):  # best fit keeps [3, 3], [5], [5] open
        assert list(packer.feed(np.arange(n), i + 1)) == []
    assert [[len(w) - 1 for w in pieces] for pieces, _ in packer.open.blocks.values()] == [[3, 3], [5], [5]]
    out = [[len(w) - 1 for w in b] for b in packer.finish()]
    assert out == [[5, 3], [5, 3]] and packer.done  # first-fit decreasing: two full blocks


def test_a_long_document_keeps_the_cursor_before_it_while_its_blocks_go_out():
    packer = BestFitCutter(4, EOS, buffer=2)
    assert list(packer.feed(np.arange(2), 1)) == []
    gen = packer.feed(np.arange(100, 111), 2)  # 11 tokens + EOS: two full blocks and a tail of 3
    first = next(gen)
    assert [w.tolist() for w in first] == [[100, 101, 102, 103, 104]]
    cursor = packer.cursor()
    assert (cursor["offset"], cursor["records"], cursor["skip"]) == (1, 1, 4)
    assert cursor["open_blocks"] == [[np.array([0, 1, EOS], "<i4").tobytes()]]  # windows as int32 bytes
    resumed = BestFitCutter(4, EOS, 2, cursor)
    again = list(resumed.feed(np.arange(100, 111), 2))
    assert [[w.tolist() for w in b] for b in again] == [[w.tolist() for w in b] for b in gen]


def test_block_example_positions_restart_at_each_document_and_padding_is_one_run():
    block = [np.array([1, 2, 3, EOS]), np.array([7, EOS])]
    ids, labels, pos = block_example(block, 8, EOS)
    assert ids.tolist() == [1, 2, 3, 7, EOS, EOS, EOS, EOS]
    assert labels.tolist() == [2, 3, EOS, EOS, IGNORE_INDEX, IGNORE_INDEX, IGNORE_INDEX, IGNORE_INDEX]
    assert pos.tolist() == [0, 1, 2, 0, 0, 1, 2, 3]
    import torch

    both = torch.as_tensor(np.stack([pos, pos]))
    assert cu_seqlens(both).tolist() == [0, 3, 4, 8, 11, 12, 16]


def test_bad_packing_settings_name_key_and_value():
    with pytest.raises(ValueError, match=r"packing 'bestfit' is not a packing mode; use one of: greedy, best_fit"):
        check_packing("bestfit", 64)
    with pytest.raises(ValueError, match=r"packing_buffer 0 must be a whole number >= 1"):
        check_packing("best_fit", 0)


def _w(*tokens):
    return np.array(tokens, "<i4").tobytes()


def test_open_blocks_of_a_state_are_checked():
    good = {"p0": {"open_blocks": [[_w(1, 2, 3), _w(4, EOS)]]}}
    check_open_blocks(good, 4, 2, window_slots)
    for bad in ([[_w(1, 2, 3, 4, 5, 6)]], [[[1, 2]]], [[b"abc"]], [[_w(1)]], [[]], "x", [[_w(1, 2)]] * 3):
        with pytest.raises(StateError, match="data state partition 'p0'"):
            check_open_blocks({"p0": {"open_blocks": bad}}, 4, 2, window_slots)
