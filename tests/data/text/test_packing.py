"""Packing: windows cover the token stream exactly once, EOS after each document, exact cursors."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from llm.data.pack.window import IGNORE_INDEX, WindowCutter, to_example

EOS = 999
docs_st = st.lists(st.lists(st.integers(0, 50), min_size=1, max_size=40), min_size=0, max_size=30)


def _pack(docs, L, cursor=None, start=0):
    packer = WindowCutter(L, EOS, cursor)
    out = []
    for i, doc in enumerate(docs[start:], start=start):
        for w in packer.feed(np.array(doc), offset_after=i + 1):
            out.append((w.copy(), packer.cursor()))
    for w in packer.finish():
        out.append((w.copy(), packer.cursor()))
    return out, packer


def _stream(docs):
    return [t for d in docs for t in [*d, EOS]]


@settings(max_examples=200, deadline=None)
@given(docs=docs_st, L=st.integers(1, 17))
def test_windows_cover_stream_once(docs, L):
    windows = [w for w, _ in _pack(docs, L)[0]]
    assert all(len(w) == L + 1 for w in windows[:-1])
    # labels (window[1:]) of all windows + the first token = the stream, nothing lost or repeated
    labels = [t for w in windows for t in w[1:].tolist()]
    stream = _stream(docs)
    assert ([windows[0][0]] if windows else []) + labels == (stream if len(stream) > 1 else [])
    # consecutive windows overlap by exactly one token
    for a, b in zip(windows, windows[1:]):
        assert a[-1] == b[0]


@settings(max_examples=150, deadline=None)
@given(docs=docs_st, L=st.integers(1, 9), cut=st.integers(0, 200))
def test_resume_from_any_cursor_is_exact(docs, L, cut):
    full, _ = _pack(docs, L)
    if not full:
        return
    cut %= len(full)
    _, cursor = full[cut]
    # buffer stays bounded by one block whatever the document sizes
    assert len(cursor["token_buffer"]) <= L
    rest, _ = _pack(docs, L, cursor, start=cursor["offset"])
    assert [w.tolist() for w, _ in rest] == [w.tolist() for w, _ in full[cut + 1 :]]


def test_long_document_keeps_cursor_before_it():
    packer = WindowCutter(4, EOS)
    windows = list(packer.feed(np.arange(3), 1))
    assert windows == [] and packer.cursor()["offset"] == 1
    gen = packer.feed(np.arange(100, 120), 2)
    next(gen)
    c = packer.cursor()
    assert c["offset"] == 1 and c["records"] == 1 and c["skip"] == 4 and c["token_buffer"] == [0, 1, 2, EOS]


def test_to_example_pads_and_ignores():
    ids, labels = to_example(np.array([5, 6, 7]), 5, EOS)
    assert ids.tolist() == [5, 6, EOS, EOS, EOS]
    assert labels.tolist() == [6, 7, IGNORE_INDEX, IGNORE_INDEX, IGNORE_INDEX]
    ids, labels = to_example(np.arange(6), 5, EOS)
    assert ids.tolist() == [0, 1, 2, 3, 4] and labels.tolist() == [1, 2, 3, 4, 5]
    assert ids.dtype == np.int64 and labels.dtype == np.int64
