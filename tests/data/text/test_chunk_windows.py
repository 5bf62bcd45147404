"""`WindowCutter.cut_chunk` (a chunk of documents cut at once, the stream's fast path) against the plain
definition of the stream and against `feed` one document at a time: the same windows, the same cursor
wherever a batch ends, and a resume from any of those cursors that goes on exactly."""

from __future__ import annotations

import numpy as np
import pytest

from llm.data.pack.window import WindowCutter
from llm.data.text.blocks import chunk_windows

EOS = 3


def _docs(seed: int, count: int, L: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    sizes = rng.choice([0, 1, 2, L - 2, L - 1, L, L + 1, 2 * L, 3 * L + 2, 5], size=count)
    return [rng.integers(10, 1000, n).astype(np.uint32) for n in sizes]


def _one_at_a_time(docs, L, size, cursor=None):
    """The reference: `feed` each document in turn, a batch (and its cursor) every `size` windows."""
    cutter, rows, out = WindowCutter(L, EOS, cursor), [], []
    start = cutter.records
    for i, ids in enumerate(docs[start:], start=start):
        for w in cutter.feed(ids, 100 * (i + 1)):
            rows.append(w.tolist())
            if len(rows) == size:
                out.append((rows, cutter.cursor()))
                rows = []
    return out, rows, cutter.cursor()


def _chunked(docs, L, size, chunk):
    """The fast path as the dataset runs it: `chunk` documents at a time through `chunk_windows`."""
    cutter, rows, out, queue = WindowCutter(L, EOS), [], [], []

    def batch():
        out.append(([r.tolist() for r in rows], cutter.cursor()))
        rows.clear()
        return {}

    for a in range(0, len(docs), chunk):
        part = docs[a:a + chunk]
        records = [((None, 100 * (a + i + 1), None), (cutter, queue), 0) for i in range(len(part))]
        list(chunk_windows(cutter, queue, records, part, rows, [], size, batch))
    return out, [r.tolist() for r in rows], cutter.cursor()


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("L,size,chunk", [(8, 1, 5), (8, 3, 64), (16, 4, 2), (5, 2, 7)])
def test_a_chunk_cut_at_once_is_the_stream_and_the_cursors_of_one_at_a_time(seed, L, size, chunk):
    docs = _docs(seed, 60, L)
    stream = np.concatenate([np.append(d, EOS) for d in docs]).tolist()
    plain = [stream[k * L:k * L + L + 1] for k in range((len(stream) - 1) // L)]  # the definition
    ref, ref_rest, ref_end = _one_at_a_time(docs, L, size)
    got, got_rest, got_end = _chunked(docs, L, size, chunk)
    assert [r for rows, _ in ref for r in rows] + ref_rest == plain
    assert [r for rows, _ in got for r in rows] + got_rest == plain
    assert [c for _, c in got] == [c for _, c in ref]  # every batch's cursor, inside a long document too
    assert got_end == ref_end
    assert any(c["skip"] for _, c in ref) or L == 16  # some batch ended inside a document's windows
    for n, (_, cursor) in enumerate(ref):  # resumed from any batch: the rest of the windows, exactly
        rest, tail, _ = _one_at_a_time(docs, L, size, cursor)
        flat = [r for rows, _ in rest for r in rows] + tail
        assert flat == plain[(n + 1) * size:]
