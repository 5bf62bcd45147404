"""Dataset features (issue 15): `subsample`, `train_test_split`, random access and slices, their states and resume."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from llm.data import (
    CombinedStreamingDataset,
    StreamingDataLoader,
    StreamingDataset,
    TokensLoader,
    optimize,
    train_test_split,
)
from llm.data.shards.plan.subset import part_totals, split_views, subsample_view
from llm.data.shards.read.state import StateError
from tests.resume import check_resume

N_ITEMS = 300


def _item(i: int) -> dict:
    return {"i": i, "x": np.full(3, i, dtype=np.int64)}


def _doc(i: int) -> np.ndarray:
    rng = np.random.default_rng(i)
    return rng.integers(0, 50_000, size=int(rng.integers(20, 300)))


@pytest.fixture(scope="module")
def items(tmp_path_factory) -> str:
    out = str(tmp_path_factory.mktemp("items") / "ds")
    optimize(_item, list(range(N_ITEMS)), out, chunk_bytes="3KB", num_workers=0, progress=False)
    return out


@pytest.fixture(scope="module")
def tokens(tmp_path_factory) -> str:
    out = str(tmp_path_factory.mktemp("tokens") / "ds")
    optimize(_doc, list(range(300)), out, item_loader=TokensLoader(), chunk_bytes="8KB", num_workers=0, progress=False)
    return out


def ids_of(samples: list[dict]) -> list[int]:
    return [int(s["i"]) for s in samples]


# ---- the pure functions (subset.py), any layout ------------------------------------------------

layouts = st.lists(st.integers(0, 60), min_size=1, max_size=12).map(lambda s: np.concatenate([[0], np.cumsum(s)]))
fraction_lists = st.lists(st.integers(0, 100), min_size=1, max_size=5).flatmap(
    lambda w: st.just([x / max(sum(w), 1) for x in w]) | st.just([x / 500 for x in w])
)


@given(starts=layouts, fractions=fraction_lists, seed=st.integers(0, 2**31))
def test_splits_are_disjoint_complete_and_sized_by_largest_remainder(starts, fractions, seed):
    n = int(starts[-1])
    views = split_views(starts, fractions, f"split:{seed}")
    parts = [v(np.arange(v.num_samples)) for v in views]
    every = np.concatenate(parts)
    assert len(np.unique(every)) == len(every), "disjoint"
    assert every.size == 0 or (every.min() >= 0 and every.max() < n)
    sizes = [len(p) for p in parts]
    total = sum(Fraction(repr(f)) for f in fractions)
    whole = abs(total - 1) <= 1e-9  # [1/3] * 3 and the like count as summing to 1
    exact = [Fraction(repr(f)) / (total if whole else 1) * n for f in fractions]
    assert all(math.floor(e) <= s <= math.floor(e) + 1 for s, e in zip(sizes, exact)), (sizes, exact)
    if whole:
        assert sorted(every.tolist()) == list(range(n)), "complete"
    else:
        assert len(every) == math.floor(total * n)
    again = split_views(starts, fractions, f"split:{seed}")
    assert all(np.array_equal(p, v(np.arange(v.num_samples))) for p, v in zip(parts, again)), "deterministic"
    for v in views:  # view shard v only holds samples of its parent shard: locality is kept
        shard_of = np.searchsorted(starts, v(np.arange(v.num_samples)), side="right") - 1
        assert np.array_equal(shard_of, v.shard[np.searchsorted(v.starts, np.arange(v.num_samples), side="right") - 1])


@given(starts=layouts, f=st.floats(0.01, 3.5), seed=st.integers(0, 2**31))
def test_subsample_counts_and_is_fixed_by_the_seed(starts, f, seed):
    n = int(starts[-1])
    view = subsample_view(starts, f, f"subsample:{seed}")
    if view is None:
        assert Fraction(repr(f)) == 1
        return
    ids = view(np.arange(view.num_samples))
    assert view.num_samples == math.floor(Fraction(repr(f)) * n)
    counts = np.bincount(ids, minlength=n)
    assert n == 0 or (counts.min() >= math.floor(f) and counts.max() <= math.floor(f) + 1), "floor(f) or +1 times"
    assert np.array_equal(ids, subsample_view(starts, f, f"subsample:{seed}")(np.arange(view.num_samples)))


def test_subsample_seed_picks_another_subset_and_decimals_count_exactly():
    starts = np.array([0, 400, 1000])
    a, b = (subsample_view(starts, 0.5, f"subsample:{s}") for s in (1, 2))
    assert set(a(np.arange(500)).tolist()) != set(b(np.arange(500)).tolist())
    assert subsample_view(np.array([0, 100]), 0.29, "k").num_samples == 29  # not 28 from 0.29 * 100 in floats
    assert part_totals(10, [1 / 3] * 3) == [4, 3, 3]  # the remainder goes to the earliest of equal parts
    assert part_totals(10, [0.55, 0.45]) == [6, 4] and part_totals(10, [0.25, 0.25]) == [3, 2]


# ---- subsample on datasets -------------------------------------------------------------------


def test_subsample_is_a_deterministic_subset_and_len_reflects_it(items):
    full = ids_of(StreamingDataset(items)[:])
    sub = StreamingDataset(items, subsample=0.3, seed=5)
    assert len(sub) == 90 and len(set(ids_of(sub[:]))) == 90 and set(ids_of(sub[:])) <= set(full)
    assert ids_of(StreamingDataset(items, subsample=0.3, seed=5)[:]) == ids_of(sub[:])
    assert set(ids_of(StreamingDataset(items, subsample=0.3, seed=6)[:])) != set(ids_of(sub[:]))
    up = StreamingDataset(items, subsample=2.5)
    counts = np.bincount(ids_of(up[:]), minlength=N_ITEMS)
    assert len(up) == 750 and set(counts.tolist()) == {2, 3} and (counts == 3).sum() == 150


@pytest.mark.parametrize("window", [None, 2])
def test_an_epoch_serves_the_subset_once_shuffled(items, window):
    sub = StreamingDataset(items, subsample=0.4, shuffle=True, seed=3, shuffle_window=window)
    assert window is None or sub.shuffle_window == window
    loader = StreamingDataLoader(sub, batch_size=7, num_workers=2, worker_backend="threads")
    got = [int(i) for b in loader for i in b["i"]]
    assert sorted(got) == sorted(ids_of(sub[:])) and got != sorted(got)
    assert got != [int(i) for b in loader for i in b["i"]], "reshuffled next epoch"


@pytest.mark.parametrize("bad", [0, -0.5, float("nan"), float("inf"), "0.5", True, None])
def test_a_bad_subsample_is_one_error_naming_it(items, bad):
    with pytest.raises(ValueError, match=f"subsample must be a number > 0.*got {bad!r}"):
        StreamingDataset(items, subsample=bad)


# ---- train_test_split ------------------------------------------------------------------------


def test_splits_partition_the_dataset_and_stream_alone(items):
    ds = StreamingDataset(items, shuffle=True, seed=1)
    train, val, test = train_test_split(ds, splits=[0.8, 0.1, 0.1], seed=4)
    assert [len(train), len(val), len(test)] == [240, 30, 30]
    parts = [ids_of(s[:]) for s in (train, val, test)]
    assert sorted(sum(parts, [])) == list(range(N_ITEMS))
    for split, part in zip((train, val, test), parts):
        epoch = [int(i) for b in StreamingDataLoader(split, batch_size=8) for i in b["i"]]
        assert sorted(epoch) == sorted(part) and epoch != sorted(epoch)
    assert [ids_of(s[:]) for s in train_test_split(ds, [0.8, 0.1, 0.1], seed=4)] == parts
    assert ids_of(train_test_split(ds, [0.8, 0.1, 0.1], seed=5)[0][:]) != parts[0]
    # a split of a subsample splits that subsample
    halves = train_test_split(StreamingDataset(items, subsample=0.5), [0.5, 0.5])
    assert sorted(ids_of(halves[0][:]) + ids_of(halves[1][:])) == sorted(ids_of(StreamingDataset(items, subsample=0.5)[:]))


@pytest.mark.parametrize("bad", [[], [0.5, -0.1], [0.7, 0.4], ["a"], [True], [float("nan")], 0.5, "0.8", None])
def test_a_bad_split_list_is_one_error_naming_it(items, bad):
    with pytest.raises(ValueError, match="splits must") as e:
        train_test_split(StreamingDataset(items), bad)
    assert repr(bad) in str(e.value) or any(repr(x) in str(e.value) for x in (bad if isinstance(bad, list) else []))


def test_a_mixture_is_not_split(items):
    mix = CombinedStreamingDataset([StreamingDataset(items)])
    with pytest.raises(TypeError, match="split each source"):
        train_test_split(mix, [0.5, 0.5])


# ---- random access and slices -----------------------------------------------------------------


@settings(max_examples=40)
@given(sl=st.slices(N_ITEMS + 5))
def test_slices_match_a_list(items, sl):
    ds = StreamingDataset(items)
    reference = list(range(N_ITEMS))
    assert ids_of(ds[sl]) == reference[sl]


def test_random_access_on_tokens_and_items(items, tokens):
    ds = StreamingDataset(items)
    assert ds[-1]["i"] == N_ITEMS - 1 and ds[-N_ITEMS]["i"] == 0 and ids_of(ds[:]) == list(range(N_ITEMS))
    for bad in (N_ITEMS, -N_ITEMS - 1):
        with pytest.raises(IndexError, match="out of range"):
            ds[bad]
    with pytest.raises(TypeError, match="integers or slices, not float"):
        ds[1.5]
    tok = StreamingDataset(tokens, item_loader=TokensLoader(block_size=33))
    blocks = tok[2:9:3]
    assert isinstance(blocks, list) and len(blocks) == 3
    assert all(torch.equal(b, tok[i]) for b, i in zip(blocks, range(2, 9, 3)))
    assert torch.equal(tok[-1], tok[len(tok) - 1]) and tok[len(tok):] == []
    sub = StreamingDataset(tokens, item_loader=TokensLoader(block_size=33), subsample=0.5)
    assert all(torch.equal(a, b) for a, b in zip(sub[:], [sub[i] for i in range(len(sub))]))


# ---- mixtures of subsets ----------------------------------------------------------------------


def test_a_mixture_of_subsampled_and_split_sources_serves_only_their_samples(items):
    a = StreamingDataset(items, subsample=0.2, shuffle=True, seed=1)
    b = train_test_split(StreamingDataset(items, shuffle=True, seed=2, transform=lambda s: {**s, "i": -s["i"] - 1}),
                         [0.25, 0.75])[0]
    mix = CombinedStreamingDataset([a, b], weights=[0.5, 0.5], seed=3)
    got = [int(i) for batch in StreamingDataLoader(mix, batch_size=10, num_workers=2) for i in batch["i"]]
    assert set(got) == set(ids_of(a[:])) | set(ids_of(b[:])), "every sample of each source, nothing else"
    assert all(i < 0 for i in ids_of(b[:])), "the source's transform applies in the mixture"
    assert ids_of(mix[2:9:3]) == ids_of([mix[2], mix[5], mix[8]]) and mix[-1]["i"] == mix[len(mix) - 1]["i"]
    state = StreamingDataLoader(mix, batch_size=10).state_dict()
    assert state["subsample"] == [0.2, 1.0] and state["split"] == [None, [[0, [0.25, 0.75], 42]]]
    other = CombinedStreamingDataset([StreamingDataset(items, subsample=0.3, shuffle=True, seed=1), b],
                                     weights=[0.5, 0.5], seed=3)
    with pytest.raises(StateError, match="subsample is"):
        StreamingDataLoader(other, batch_size=10).load_state_dict(state)


# ---- states and exact resume -----------------------------------------------------------------


def test_a_state_is_refused_by_another_subsample_or_split(items):
    loader = StreamingDataLoader(StreamingDataset(items, subsample=0.5), batch_size=4)
    next(iter(loader))
    state = loader.state_dict()
    with pytest.raises(StateError, match=r"subsample is 0\.5 in the state but 0\.25 here; pass StreamingDataset\(subsample=0\.5\)"):
        StreamingDataLoader(StreamingDataset(items, subsample=0.25), batch_size=4).load_state_dict(state)
    with pytest.raises(StateError, match="subsample is 0.5 in the state but 1.0"):
        StreamingDataLoader(StreamingDataset(items), batch_size=4).load_state_dict(state)
    first, second = train_test_split(StreamingDataset(items), [0.5, 0.5], seed=9)
    saved = StreamingDataLoader(first, batch_size=4).state_dict()
    assert saved["split"] == [[0, [0.5, 0.5], 9]]
    with pytest.raises(StateError, match=r"split is \[\[0, \[0.5, 0.5\], 9\]\] in the state but \[\[1, "):
        StreamingDataLoader(second, batch_size=4).load_state_dict(saved)
    StreamingDataLoader(first, batch_size=4).load_state_dict(saved)
    old = {k: v for k, v in StreamingDataLoader(StreamingDataset(items), batch_size=4).state_dict().items()
           if k not in ("subsample", "split")}  # saved before these keys existed
    StreamingDataLoader(StreamingDataset(items), batch_size=4).load_state_dict(old)


def make_dataset(config: dict) -> StreamingDataset:
    loader = TokensLoader(block_size=config["block"]) if "block" in config else None
    ds = StreamingDataset(config["path"], item_loader=loader, shuffle=True, seed=7, subsample=config.get("subsample", 1.0),
                          shuffle_window=config.get("window"))
    if "split" in config:
        index, fractions = config["split"]
        ds = train_test_split(ds, fractions, seed=11)[index]
    return ds


def run_subset(config: dict, state: dict | None, steps: int | None) -> tuple[list, dict]:
    """check_resume's `run`: a subsampled or split dataset, any workers and backend."""
    loader = StreamingDataLoader(make_dataset(config), batch_size=config["batch"], num_workers=config.get("workers", 0),
                                 worker_backend=config.get("backend", "auto"), ledger=config.get("ledger"))
    if state is not None:
        loader.load_state_dict(state)
    out: list = []
    while loader.state_dict()["epoch"] < config.get("epochs", 2):
        for batch in loader:
            out.append({k: v.numpy() for k, v in batch.items()} if isinstance(batch, dict) else batch.numpy())
            if steps is not None and len(out) >= steps:
                return out, loader.state_dict()
    return out, loader.state_dict()


def test_resume_of_a_subsample_is_exact_on_other_workers(tokens):
    config = {"path": tokens, "block": 64, "batch": 4, "subsample": 0.4}
    ref = check_resume(run_subset, config, stops=[3, 40], resume_configs=[
        {**config, "workers": 2, "backend": "threads"}, {**config, "workers": 2, "backend": "processes"}])
    n = len(make_dataset(config))
    assert len(ref) == 2 * math.ceil(n / 4) and n == math.floor(0.4 * len(StreamingDataset(tokens, item_loader=TokensLoader(block_size=64))))


def test_resume_of_an_upsampled_windowed_subsample_is_exact(tokens):
    config = {"path": tokens, "block": 64, "batch": 4, "subsample": 1.5, "window": 2, "epochs": 1}
    check_resume(run_subset, config, stops=[7], resume_configs=[{**config, "workers": 3}])


def test_resume_of_a_split_is_exact_on_other_workers(items, tokens):
    config = {"path": items, "batch": 5, "split": (1, [0.6, 0.3, 0.1])}
    check_resume(run_subset, config, stops=[4, 20], resume_configs=[{**config, "workers": 2}])
    config = {"path": tokens, "block": 64, "batch": 4, "subsample": 0.5, "split": (0, [0.7, 0.3]), "window": 3}
    check_resume(run_subset, config, stops=[9], resume_configs=[{**config, "workers": 2, "backend": "threads"}])
