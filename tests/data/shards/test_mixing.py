"""CombinedStreamingDataset: the schedule hits its weights in every window, sources run their own epochs,
resume is exact on other worker counts and world sizes (also after a source's second epoch), weights may change."""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llm.data import (
    CombinedStreamingDataset,
    StreamingDataLoader,
    StreamingDataset,
    TokensLoader,
    optimize,
)
from llm.data.mix.weights import MAX_PERIOD, check_weights, period_for, quotas, slot_table
from tests.resume import check_resume


def make_source(folder, tag: int, n_docs: int):
    """A token dataset whose every token says which source and which document it came from."""
    def fn(i):
        return np.full(7, tag * 10_000 + i, dtype=np.int64)

    optimize(fn, list(range(n_docs)), str(folder), chunk_bytes="2KB", num_workers=0, progress=False,
             item_loader=TokensLoader())
    return folder


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    root = tmp_path_factory.mktemp("mix")
    return str(make_source(root / "big", 1, 400)), str(make_source(root / "small", 2, 60))


def combined(paths, weights=(0.5, 0.5), seed=3, over_all=False, block=7, batching="stratified"):
    ds = [StreamingDataset(p, item_loader=TokensLoader(block_size=block), shuffle=True, seed=11 + i)
          for i, p in enumerate(paths)]
    return CombinedStreamingDataset(ds, weights=list(weights) if weights else None, seed=seed,
                                    iterate_over_all=over_all, batching=batching)


_WEIGHT = st.one_of(st.just(0.0), st.floats(0, 1), st.floats(1e-12, 1e-3), st.floats(1, 1e300),
                    st.integers(0, 20))


@settings(max_examples=60, deadline=None)
@given(st.lists(_WEIGHT, min_size=2, max_size=5).filter(lambda w: max(w) > 0), st.integers(0, 10**6),
       st.integers(0, 5 * MAX_PERIOD))
def test_every_positive_weight_is_served_in_every_window_of_a_period(raw, seed, start):
    """Small and extreme floats: each positive weight gets its share of every period within one slot,
    or the mixture refuses it up front naming it (a share below 1 / MAX_PERIOD)."""
    try:
        weights = check_weights(raw, len(raw), sizes=[1] * len(raw), names=["d"] * len(raw))
    except ValueError as e:
        assert "a share of" in str(e) and str(e).startswith("weights[")
        top = max(raw)
        assert any(w > 0 and w / top / sum(x / top for x in raw) < 1 / MAX_PERIOD for w in raw)
        return
    period = period_for(weights)
    quota = quotas(weights, period, floor=True)
    assert sum(quota) == period
    slots = np.tile(slot_table(quota, seed, period), 7)
    window = slots[start % period : start % period + period]
    for s, w in enumerate(weights):
        assert (window == s).sum() == quota[s]
        assert abs(quota[s] - w * period) < 2
        assert quota[s] >= 1 or w == 0


def samples(ds: CombinedStreamingDataset, epochs: int = 1) -> np.ndarray:
    return np.concatenate([ds.global_ids(e, np.arange(ds.num_samples)) for e in range(epochs)])


def test_sources_keep_their_own_epochs(sources):
    ds = combined(sources, (0.5, 0.5))
    ids = samples(ds, 3)
    src = ds.sources_of(ids)
    small = ids[src == 1] - ds.offsets[1]
    n_small = int(ds.sizes[1])
    # the small source is exhausted first: each of its epochs is a permutation, reshuffled
    first, second = small[:n_small], small[n_small : 2 * n_small]
    assert sorted(first) == list(range(n_small)) and sorted(second) == list(range(n_small))
    assert list(first) != list(second)
    assert ds.num_samples == pytest.approx(2 * n_small, abs=2)  # iterate_over_all=False: ends with the small one
    assert combined(sources, (0.5, 0.5), over_all=True).num_samples >= 2 * int(ds.sizes[0]) - 2
    proportional = combined(sources, None)
    assert proportional.weights == pytest.approx((ds.sizes / ds.sizes.sum()).tolist())


def rank_loaders(ds, config: dict, batch: int, state: dict | None) -> list[tuple]:
    """(rank, loader, iterator) for each of `world` simulated ranks, made under that rank's RANK/WORLD_SIZE."""
    world = config.get("world", 1)
    loaders = []
    for r in range(world):
        os.environ["RANK"], os.environ["WORLD_SIZE"] = str(r), str(world)
        loader = StreamingDataLoader(ds, batch_size=batch // world, num_workers=config.get("workers", 0),
                                     ledger=config.get("ledger"))
        if state is not None:
            loader.load_state_dict(state)
        loaders.append((r, loader, iter(loader)))
    return loaders


def next_parts(loaders: list[tuple]) -> list:
    """Each rank's next batch (None at the end of its epoch), read under its own RANK."""
    parts = []
    for r, _, it in loaders:
        os.environ["RANK"] = str(r)
        parts.append(next(it, None))
    return parts


def run_combined(config: dict, state: dict | None, steps: int | None):
    """resume.py protocol: `world` ranks in lockstep in one process, a step is the global batch."""
    ds = combined(config["paths"], config["weights"], batching=config.get("batching", "stratified"))
    world = config.get("world", 1)
    loaders = rank_loaders(ds, config, config["batch"], state)
    out: list[np.ndarray] = []
    epochs = config.get("epochs", 2)
    done = 0
    while steps is None or len(out) < steps:
        parts = next_parts(loaders)
        if any(p is None for p in parts):
            done += 1
            if done + (state or {}).get("epoch", 0) >= epochs:
                break
            fresh = []
            for r, lo, _ in loaders:
                os.environ["RANK"] = str(r)  # a loader reads its rank when an epoch starts
                fresh.append((r, lo, iter(lo)))
            loaders = fresh
            continue
        out.append(np.concatenate([p.numpy() for p in parts]))
    os.environ["RANK"], os.environ["WORLD_SIZE"] = "0", str(world)
    state_out = [lo.state_dict() for _, lo, _ in loaders][0]  # every rank commits its ledger
    os.environ.pop("RANK"), os.environ.pop("WORLD_SIZE")
    return out, state_out


def test_exact_resume_across_a_sources_second_epoch(sources):
    config = {"paths": sources, "weights": [0.7, 0.3], "batch": 4, "workers": 0, "epochs": 2}
    others = [{**config, "workers": 2}, {**config, "world": 2}]
    ref = check_resume(run_combined, config, stops=[3, 25, 50], resume_configs=others, fresh_process=False)
    tokens = np.concatenate(ref)
    small_docs = tokens[(tokens // 10_000) == 2]
    assert len(np.unique(small_docs)) == 60  # the small source came round at least once fully
    assert len(small_docs) // 7 > 60  # and into its second epoch within the run


def test_changing_the_weights_on_resume_repeats_nothing(sources):
    paths = sources
    ds = combined(paths, (0.5, 0.5), over_all=True)
    loader = StreamingDataLoader(ds, batch_size=4)
    it = iter(loader)
    head = [next(it).numpy() for _ in range(20)]
    state = loader.state_dict()
    assert state["mixture"]["counts"] == [40, 40]
    new = combined(paths, (0.9, 0.1), over_all=True)
    resumed = StreamingDataLoader(new, batch_size=4)
    resumed.load_state_dict(state)
    tail = [b.numpy() for b in resumed]
    seen_big = {int(b[0]) for batch in head for b in batch if b[0] // 10_000 == 1}
    later_big = [int(b[0]) for batch in tail for b in batch if b[0] // 10_000 == 1]
    n_big = 400
    # the big source continues its own epoch: none of its first-epoch documents comes again early
    assert not seen_big & set(later_big[: n_big - len(seen_big)])
    shares = np.mean([b[0] // 10_000 == 1 for batch in tail[:100] for b in batch])
    assert abs(shares - 0.9) < 0.02


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"weights": [0.5]}, "^weights has 1 weight but there are 2 datasets; give one weight per dataset$"),
        ({"weights": [0.5, 0.3, 0.2]}, "weights has 3 weights but there are 2 datasets"),
        ({"weights": [1.0, -0.5]}, r"^weights\[1\] \(datasets\[1\], .*\) is -0.5; expected a finite number >= 0"),
        ({"weights": [float("inf"), 1]}, r"weights\[0\] \(datasets\[0\], .*\) is inf; expected a finite number"),
        ({"weights": [float("nan"), 1]}, r"weights\[0\] \(datasets\[0\], .*\) is nan; expected a finite number"),
        ({"weights": ["0.5", 0.5]}, r"weights\[0\] \(datasets\[0\], .*\) is '0.5'; expected a finite number"),
        ({"weights": [True, 1]}, r"weights\[0\] \(datasets\[0\], .*\) is True; expected a finite number"),
        ({"weights": "0.5, 0.5"}, "^weights is '0.5, 0.5'; give a list of 2 numbers >= 0, one per dataset$"),
        ({"weights": [1e308, 1e-300]}, r"weights\[1\] \(datasets\[1\], .*\) is 1e-300, a share of 0 of the mixture"),
        ({"weights": [0, 0]}, "weights are all zero"),
        ({"weights": [0.5, 0.5], "batching": "per_step"}, "batching='per_step' is not known"),
    ],
)
def test_bad_input_is_one_sentence(sources, kwargs, message):
    ds = [StreamingDataset(p, item_loader=TokensLoader(block_size=7)) for p in sources]
    with pytest.raises(ValueError, match=message):
        CombinedStreamingDataset(ds, **kwargs)


def test_other_block_sizes_are_refused(sources):
    a = StreamingDataset(sources[0], item_loader=TokensLoader(block_size=7))
    b = StreamingDataset(sources[1], item_loader=TokensLoader(block_size=9))
    with pytest.raises(ValueError, match="datasets\\[1\\] has block_size 9 but datasets\\[0\\] has 7"):
        CombinedStreamingDataset([a, b])


def test_document_boundaries_give_each_source_its_own_position_ids(sources):
    """Blocks (and their position ids) are gathered from each source straight into the batch rows."""
    loaders = [TokensLoader(block_size=5, document_boundaries=True) for _ in sources]
    ds = [StreamingDataset(p, item_loader=lo, shuffle=True, seed=11 + i) for i, (p, lo) in enumerate(zip(sources, loaders))]
    mix = CombinedStreamingDataset(ds, weights=[0.7, 0.3], seed=5)
    ids = mix.global_ids(0, np.arange(64))
    got = mix.read_blocks(ids)
    src = mix.sources_of(ids)
    for row, (gid, s) in enumerate(zip(ids.tolist(), src.tolist())):
        own = ds[s].read_blocks(np.array([gid - mix.offsets[s]]))
        assert (got["input_ids"][row] == own["input_ids"][0]).all()
        assert (got["position_ids"][row] == own["position_ids"][0]).all()
    assert set(src.tolist()) == {0, 1}


def test_sources_with_and_without_document_boundaries_are_refused(sources):
    a = StreamingDataset(sources[0], item_loader=TokensLoader(block_size=5, document_boundaries=True))
    b = StreamingDataset(sources[1], item_loader=TokensLoader(block_size=5))
    with pytest.raises(ValueError, match=r"datasets\[1\] has document_boundaries=False"):
        CombinedStreamingDataset([a, b])


def test_per_batch_takes_every_global_batch_from_one_source_in_proportion(sources):
    ds = combined(sources, (0.7, 0.3), over_all=True, batching="per_batch")
    loader = StreamingDataLoader(ds, batch_size=4)
    batches = [b.numpy() for _ in range(3) for b in loader]  # three combined epochs
    kinds = [set((b[:, 0] // 10_000).tolist()) for b in batches]
    assert all(len(k) == 1 for k in kinds)
    first = np.array([k.pop() for k in kinds])
    assert abs((first == 1).mean() - 0.7) < 0.01
    small = np.concatenate([b[:, 0] for b in batches if b[0, 0] // 10_000 == 2])
    assert set((small % 10_000).tolist()) == set(range(60))  # the small source went round, and on


def test_per_batch_resumes_exactly_across_workers_and_ranks(sources):
    config = {"paths": sources, "weights": [0.6, 0.4], "batch": 4, "workers": 0, "epochs": 2, "batching": "per_batch"}
    others = [{**config, "workers": 2}, {**config, "world": 2}]
    ref = check_resume(run_combined, config, stops=[5, 40], resume_configs=others, fresh_process=False)
    assert all(len(set((step[:, 0] // 10_000).tolist())) == 1 for step in ref)


def test_reprs_name_the_location_the_samples_and_the_block_size(sources):
    big = StreamingDataset(sources[0], item_loader=TokensLoader(block_size=7), shuffle=True, seed=11)
    assert repr(big) == (f"StreamingDataset(input_dir={sources[0]!r}, samples={big.num_samples}, block_size=7, "
                         "shuffle=True, seed=11)")
    assert big.num_samples == 400  # 400 documents of 7 tokens: one block each
    ds = combined(sources, weights=(0.75, 0.25))
    assert repr(ds) == (f"CombinedStreamingDataset(sources=[({sources[0]!r}, 0.75), ({sources[1]!r}, 0.25)], "
                        f"samples={ds.num_samples}, block_size=7, seed=3)")
