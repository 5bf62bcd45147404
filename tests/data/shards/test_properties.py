"""Invariants of the plan, the shuffle and the packing of blocks, checked with hypothesis."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llm.data.shards.format.manifest import Manifest
from llm.data.shards.format.reader import TokenReader
from llm.data.shards.format.writer import TokenShardWriter
from llm.data.shards.plan.schedule import BatchSchedule, epoch_order


@given(n=st.integers(1, 5000), seed=st.integers(0, 2**31), epoch=st.integers(0, 50))
def test_shuffle_is_a_permutation_fixed_by_seed_and_epoch(n, seed, epoch):
    order = epoch_order(n, seed, epoch, shuffle=True)
    perm = order(np.arange(n))
    assert np.array_equal(np.sort(perm), np.arange(n))
    assert np.array_equal(perm, epoch_order(n, seed, epoch, shuffle=True)(np.arange(n)))
    # any slice of positions maps like the whole: a resume needs no earlier positions
    lo = n // 3
    assert np.array_equal(order(np.arange(lo, n)), perm[lo:])


@given(n=st.integers(64, 5000), seed=st.integers(0, 2**31))
def test_shuffle_changes_with_epoch_and_seed(n, seed):
    base = epoch_order(n, seed, 0, True)(np.arange(n))
    assert not np.array_equal(base, epoch_order(n, seed, 1, True)(np.arange(n)))
    assert not np.array_equal(base, np.arange(n))


@given(
    total=st.integers(1, 400),
    batch=st.integers(1, 9),
    world=st.integers(1, 5),
    start_frac=st.floats(0, 1),
    drop_last=st.booleans(),
)
def test_rank_splits_are_disjoint_complete_and_even(total, batch, world, start_frac, drop_last):
    start = int(total * start_frac)
    schedules = [BatchSchedule(total, start, batch, r, world, drop_last) for r in range(world)]
    lengths = {len(s) for s in schedules}
    assert len(lengths) == 1, "every rank steps the same number of times"
    seen = np.concatenate([s.positions(k) for s in schedules for k in range(len(s))] or [np.zeros(0, np.int64)])
    end = schedules[0].end
    expected = np.arange(start, end)
    unique = np.unique(seen)
    assert np.array_equal(unique[unique >= start], expected), "every position in [start, end) is read"
    repeats = seen.size - unique.size + np.count_nonzero(unique < start)
    assert repeats < world, "only a short final global batch repeats, at most world-1 samples"
    if drop_last:
        assert all(len(s.positions(k)) == batch for s in schedules for k in range(len(s)))
        assert end - start == len(schedules[0]) * batch * world


@settings(deadline=None, max_examples=40)
@given(
    docs=st.lists(st.integers(0, 300), min_size=1, max_size=40),
    block=st.integers(1, 97),
    chunk_tokens=st.integers(1, 500),
)
def test_blocks_cover_the_token_stream_exactly_once(tmp_path_factory, docs, block, chunk_tokens):
    folder = tmp_path_factory.mktemp("prop")
    writer = TokenShardWriter(folder, "shard-p", chunk_tokens=chunk_tokens)
    stream = []
    for i, length in enumerate(docs):
        doc = (np.arange(length + 1, dtype=np.int64) * 7 + i) % 60000  # +1: every document ends with a token
        writer.add(doc)
        stream.append(doc)
    writer.flush()
    manifest = Manifest(kind="tokens", shards=writer.shards, dtype="uint16")
    manifest.save(folder)
    tokens = np.concatenate(stream)
    reader = TokenReader(folder, Manifest.load(folder))
    n_blocks = -(-tokens.size // block)
    out = np.full((n_blocks, block), -1, dtype=np.int64)
    positions = np.empty(block, dtype=np.int64)
    for b in range(n_blocks):
        stop = min((b + 1) * block, tokens.size)
        reader.read(b * block, stop, out[b], positions)
        assert positions[0] == 0
    flat = out.reshape(-1)
    assert np.array_equal(flat[: tokens.size], tokens)
    assert np.all(flat[tokens.size :] == -1)


@given(n=st.integers(0, 3000), workers=st.integers(1, 8), most=st.integers(1, 64))
def test_worker_chunks_tile_the_batches_in_order(n, workers, most):
    from llm.data.shards.read.source import chunk_bounds

    bounds = chunk_bounds(n, workers, most)
    assert bounds[0] == 0 and bounds[-1] == n
    sizes = np.diff(bounds)
    assert np.all(sizes >= 1) and np.all(sizes <= most)
    assert all(sizes[:workers] == 1), "each worker's first chunk is one batch: a quick first batch"


@given(st.integers(1, 40_000), st.integers(0, 2**32), st.lists(st.tuples(st.integers(0, 40_000), st.integers(1, 3000)),
                                                            min_size=1, max_size=8))
def test_the_segment_cache_gives_the_permutations_own_values(n, seed, ranges):
    from llm.data.seeds import derive_seed
    from llm.data.shards.plan.schedule import SegmentedOrder, epoch_order
    from llm.data.shards.plan.shuffle import make_permutation

    order, plain = epoch_order(n, seed, 0, True), make_permutation("feistel", n, derive_seed(seed, "shuffle", 0))
    assert isinstance(order, SegmentedOrder)
    for lo, size in ranges:
        lo = lo % n
        positions = np.arange(lo, min(lo + size, n))
        assert np.array_equal(order(positions), plain(positions))
    scattered = np.array([0, n - 1, n // 2])
    assert np.array_equal(order(scattered), plain(scattered))
    with pytest.raises(IndexError):
        order(np.array([n]))
