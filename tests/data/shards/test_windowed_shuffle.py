"""Windowed shuffle: a permutation fixed by (layout, seed, epoch, window), working set of one window, exact resume.

The working-set claim, precisely: the positions of window w's span read the samples
owned by the window's shards, so at most `window` shards own them. Version 1 (no
`straddles`): a sample belongs to the shard holding its first token, and a block may
spill into the shards that follow it in storage order. Version 2: a block lying in two
shards belongs to whichever of them comes later in the shard order, so a window reads
its shards and their storage neighbours, and the neighbour it reads always belongs to
an earlier window (the reader has kept its edge bytes: read/edges.py).
"""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from llm.data import CombinedStreamingDataset, StreamingDataLoader, StreamingDataset, TokensLoader
from llm.data.shards.plan.schedule import epoch_order
from llm.data.shards.plan.shuffle.windowed import shard_sample_starts, straddling_blocks
from llm.data.shards.read.state import StateError
from tests.data.shards.helpers import make_token_dataset, run_loader
from tests.resume import check_resume


def _layout(token_counts: list[int], block: int) -> tuple[np.ndarray, np.ndarray]:
    """(token starts, sample starts) of shards holding these many tokens, cut into blocks."""
    token_starts = np.concatenate([[0], np.cumsum(token_counts)]).astype(np.int64)
    n = -(-int(token_starts[-1]) // block)
    return token_starts, shard_sample_starts(token_starts, block, n)


_shards = st.lists(st.integers(0, 60), min_size=1, max_size=40)


@given(counts=_shards, block=st.integers(1, 9), seed=st.integers(0, 2**31), epoch=st.integers(0, 50),
       window=st.integers(1, 45), version=st.sampled_from([1, 2]))
def test_order_is_a_permutation_fixed_by_seed_epoch_and_window(counts, block, seed, epoch, window, version):
    token_starts, starts = _layout(counts, block)
    n = int(starts[-1])
    straddles = straddling_blocks(token_starts, block, n) if version == 2 else None
    order = epoch_order(n, seed, epoch, True, window=window, sample_starts=starts, straddles=straddles)
    perm = order(np.arange(n))
    assert np.array_equal(np.sort(perm), np.arange(n))
    again = epoch_order(n, seed, epoch, True, window=window, sample_starts=starts, straddles=straddles)
    assert np.array_equal(again(np.arange(n)), perm)
    lo = n // 3  # any slice maps like the whole: a resume needs no earlier positions
    assert np.array_equal(order(np.arange(lo, n)), perm[lo:])


# At least 10 samples per shard: two epochs then share an order with odds below 1 in (10!)^2.
# With 2-sample shards the orders are few (2 shards, window 1: 8) and epochs matched by chance.
@given(counts=st.lists(st.integers(10, 60), min_size=2, max_size=40), seed=st.integers(0, 2**31),
       window=st.integers(1, 40))
def test_order_changes_with_the_epoch(counts, seed, window):
    _, starts = _layout(counts, 1)
    n = int(starts[-1])
    first = epoch_order(n, seed, 0, True, window=window, sample_starts=starts)(np.arange(n))
    assert not np.array_equal(first, epoch_order(n, seed, 1, True, window=window, sample_starts=starts)(np.arange(n)))


@settings(max_examples=150)
@given(counts=st.lists(st.integers(0, 60), min_size=1, max_size=40), block=st.integers(1, 9),
       seed=st.integers(0, 2**31), window=st.integers(1, 12), data=st.data())
def test_a_run_inside_one_window_reads_only_its_shards_and_their_spill(counts, block, seed, window, data):
    """Version 1 (straddling blocks in their first shard's window)."""
    counts = [c if c == 0 else max(c, block) for c in counts]  # non-empty shards hold at least one block
    token_starts, starts = _layout(counts, block)
    n = int(starts[-1])
    if n == 0:
        return
    order = epoch_order(n, seed, 0, True, window=window, sample_starts=starts)
    w = data.draw(st.integers(0, order.num_windows - 1))
    lo_w, hi_w = int(order.window_starts[w]), int(order.window_starts[w + 1])
    if lo_w == hi_w:
        return
    lo = data.draw(st.integers(lo_w, hi_w - 1))
    hi = data.draw(st.integers(lo + 1, hi_w))
    samples = order(np.arange(lo, hi))
    owners = set((np.searchsorted(starts, samples, side="right") - 1).tolist())
    mine = set(order.window_shards(w).tolist())
    assert owners <= mine and len(mine) <= window
    total = int(token_starts[-1])
    last = np.minimum((samples + 1) * block, total) - 1
    touched = set((np.searchsorted(token_starts, last, side="right") - 1).tolist()) | owners
    nonempty = [k for k, c in enumerate(counts) if c]
    successor = {k: next((j for j in nonempty if j > k), k) for k in mine}  # empty shards hold no tokens
    assert touched <= mine | set(successor.values()), "a block spills at most into the next shard holding tokens"


@settings(max_examples=150)
@given(counts=st.lists(st.integers(0, 60), min_size=1, max_size=40), block=st.integers(1, 9),
       seed=st.integers(0, 2**31), window=st.integers(1, 12))
def test_version_2_reads_a_straddling_block_in_the_later_window_and_nothing_else_outside(counts, block, seed, window):
    token_starts, starts = _layout(counts, block)
    n = int(starts[-1])
    if n == 0:
        return
    order = epoch_order(n, seed, 0, True, window=window, sample_starts=starts,
                        straddles=straddling_blocks(token_starts, block, n))
    window_of = np.empty(len(counts), dtype=np.int64)
    for w in range(order.num_windows):
        window_of[order.window_shards(w)] = w
    span_window = np.searchsorted(order.window_starts, np.arange(n), side="right") - 1
    read_in = np.empty(n, dtype=np.int64)
    read_in[order(np.arange(n))] = span_window  # the window each sample is read in
    total = int(token_starts[-1])
    first = np.searchsorted(token_starts, np.arange(n) * block, side="right") - 1
    last = np.searchsorted(token_starts, np.minimum((np.arange(n) + 1) * block, total) - 1, side="right") - 1
    for s in range(n):
        shards = [k for k in range(first[s], last[s] + 1) if counts[k]]  # the shards holding its tokens
        if len(shards) == 2 and shards[1] == shards[0] + 1:  # two neighbours: the later window reads it
            assert read_in[s] == max(window_of[shards[0]], window_of[shards[1]]), (s, shards)
        else:  # inside one shard, or across more than two: its first shard's window, as in version 1
            assert read_in[s] == window_of[first[s]], (s, shards)


@given(counts=_shards, block=st.integers(1, 9), seed=st.integers(0, 2**31), extra=st.integers(0, 5))
def test_one_window_of_every_shard_shuffles_everything(counts, block, seed, extra):
    _, starts = _layout(counts, block)
    n = int(starts[-1])
    order = epoch_order(n, seed, 0, True, window=len(counts) + extra, sample_starts=starts)
    assert order.num_windows == 1 and len(order.window_shards(0)) == len(counts)


# ---- on a real dataset ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return make_token_dataset(tmp_path_factory.mktemp("windowed"), n_lines=1500, chunk_bytes="6KB")


def _ds(path, **kw) -> StreamingDataset:
    return StreamingDataset(path, item_loader=TokensLoader(block_size=kw.pop("block", 64)), shuffle=kw.pop("shuffle", True),
                            seed=5, **kw)


def test_defaults_and_bad_values(dataset):
    shards = len(_ds(dataset).manifest.shards)
    assert shards > 6, "fixture must span several shards"
    assert _ds(dataset).shuffle_window is None, "local data keeps the global shuffle by default"
    assert _ds(dataset, shuffle_window="auto").shuffle_window is None
    assert _ds(dataset, shuffle_window=3).shuffle_window == 3
    assert _ds(dataset, shuffle=False).shuffle_window is None
    full = _ds(dataset, shuffle_window=shards)
    assert full.shuffle_window is None, "a window of every shard is the global shuffle"
    n = len(full)
    assert np.array_equal(full.epoch_permutation(2)(np.arange(n)), epoch_order(n, 5, 2, True)(np.arange(n)))
    for bad in (0, -1, True, 2.5, "big"):
        with pytest.raises(ValueError, match="shuffle_window must be"):
            _ds(dataset, shuffle_window=bad)
    with pytest.raises(ValueError, match="needs shuffle=True"):
        _ds(dataset, shuffle=False, shuffle_window=2)


@pytest.mark.parametrize("workers,backend", [(0, "auto"), (2, "threads")])
def test_an_epoch_delivers_every_block_once_window_by_window(dataset, workers, backend):
    ds = _ds(dataset, shuffle_window=2)
    loader = StreamingDataLoader(ds, batch_size=8, num_workers=workers, worker_backend=backend)
    rows = torch.cat(list(loader)).numpy()
    expected = ds.read_blocks(ds.epoch_permutation(0)(np.arange(len(ds))))["input_ids"]
    assert np.array_equal(rows, expected)
    assert sorted(map(tuple, rows.tolist())) == sorted(map(tuple, ds.read_blocks(np.arange(len(ds)))["input_ids"].tolist()))
    order = ds.epoch_permutation(0)
    assert order.num_windows > 2
    owners = np.searchsorted(order.owned, order(np.arange(len(ds))), side="right") - 1
    assert not np.array_equal(order.owned, ds.sample_starts), "some blocks straddle two windows' shards"
    for w in range(order.num_windows):
        span = owners[order.window_starts[w] : order.window_starts[w + 1]]
        assert set(span.tolist()) <= set(order.window_shards(w).tolist())


def test_state_records_the_window_and_refuses_another(dataset):
    loader = StreamingDataLoader(_ds(dataset, shuffle_window=2), batch_size=4)
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    assert state["shuffle_window"] == 2 and len(pickle.dumps(state)) < 600
    for other in (3, "global"):
        fresh = StreamingDataLoader(_ds(dataset, shuffle_window=other), batch_size=4)
        with pytest.raises(StateError, match="shuffle_window is 2 in the state") as e:
            fresh.load_state_dict(state)
        assert "\n" not in str(e.value) and "shuffle_window=2" in str(e.value)
    global_state = StreamingDataLoader(_ds(dataset), batch_size=4).state_dict()
    with pytest.raises(StateError, match="shuffle_window='global'"):
        StreamingDataLoader(_ds(dataset, shuffle_window=2), batch_size=4).load_state_dict(global_state)


def test_a_state_saved_before_windows_existed_resumes_as_global(dataset):
    ds = _ds(dataset)
    loader = StreamingDataLoader(ds, batch_size=4)
    reference = [b.numpy() for b in loader]
    old = {**loader.state_dict(), "epoch": 0, "samples_consumed": 12}
    del old["shuffle_window"]
    resumed = StreamingDataLoader(_ds(dataset), batch_size=4)
    resumed.load_state_dict(old)
    assert np.array_equal(np.concatenate([b.numpy() for b in resumed]), np.concatenate(reference[3:]))


@pytest.fixture(scope="module")
def resume_config(tmp_path_factory):
    path = make_token_dataset(tmp_path_factory.mktemp("windowed-resume"), n_lines=700, chunk_bytes="4KB")
    return {"path": str(path), "block": 64, "batch": 4, "world": 1, "workers": 0, "epochs": 2, "window": 2}


def test_resume_with_a_window_is_exact_on_other_workers_and_world_sizes(resume_config):
    ds = _ds(resume_config["path"], shuffle_window=2)
    assert ds.epoch_permutation(0).num_windows >= 3, "the order must span several windows"
    n = len(run_loader(resume_config, None, None)[0])
    per_epoch = n // 2
    check_resume(run_loader, resume_config, stops=[per_epoch // 2, per_epoch + 3], resume_configs=[
        {**resume_config, "workers": 2, "backend": "processes"},
        {**resume_config, "workers": 3, "backend": "threads"},
        {**resume_config, "world": 2, "batch": 2, "workers": 2, "backend": "threads"},  # same global batch
    ])


def test_a_state_of_the_version_1_window_order_resumes_with_that_order(resume_config):
    """States saved before order version 2 (state version 2) go on in the order they were saved in."""
    old_config = {**resume_config, "old_order": True}
    reference, _ = run_loader(old_config, None, None)
    current, _ = run_loader(resume_config, None, None)
    assert len(reference) == len(current) and any((a != b).any() for a, b in zip(reference, current)), \
        "the two orders differ (straddling blocks move to the later window)"
    head, state = run_loader(old_config, None, 7)
    assert state["version"] == 2
    tail, after = run_loader(resume_config, state, None)
    assert all(np.array_equal(a, b) for a, b in zip(head + tail, reference)) and len(head + tail) == len(reference)
    assert after["version"] == 2  # saved again as it was, so it keeps resuming in that order
    per_epoch = len(reference) // 2
    check_resume(run_loader, old_config, stops=[3, per_epoch + 2], resume_configs=[
        {**old_config, "workers": 2, "backend": "threads"},
        {**old_config, "world": 2, "batch": 2, "workers": 2, "backend": "threads"},
    ])


def test_a_mixture_of_windowed_sources_reads_them_in_their_windows(dataset, resume_config):
    a, b = _ds(dataset, shuffle_window=2), _ds(resume_config["path"], shuffle_window=3)
    mix = CombinedStreamingDataset([a, b], weights=[0.5, 0.5], seed=1)
    loader = StreamingDataLoader(mix, batch_size=4)
    batches = list(loader)
    assert loader.state_dict()["shuffle_window"] == [2, 3]
    ids = mix.global_ids(0, np.arange(mix.num_samples))
    assert np.array_equal(torch.cat(batches).numpy(), mix.read_blocks(ids)["input_ids"])
    firsts = ids[ids < mix.offsets[1]][:10]  # source a's first samples: a's own windowed order, keyed for the mixture
    assert np.array_equal(firsts, a.epoch_permutation(0, "mixture/source0")(np.arange(10)))


def test_items_are_windowed_by_the_shard_that_holds_them(tmp_path):
    from llm.data import ItemsLoader, optimize

    optimize(lambda i: {"id": i}, list(range(120)), tmp_path / "items", num_workers=0, chunk_size=10, progress=False)
    ds = StreamingDataset(tmp_path / "items", item_loader=ItemsLoader(), shuffle=True, shuffle_window=3)
    assert len(ds.manifest.shards) == 12 and ds.shuffle_window == 3
    loader = StreamingDataLoader(ds, batch_size=5, collate_fn=lambda items: [x["id"] for x in items])
    ids = [i for batch in loader for i in batch]
    assert sorted(ids) == list(range(120)) and ids != sorted(ids)
    for w in range(4):  # 30 positions per window, all from its 3 shards of 10 items
        assert {i // 10 for i in ids[30 * w : 30 * (w + 1)]} == set(ds.epoch_permutation(0).window_shards(w).tolist())
