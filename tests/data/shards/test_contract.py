"""The seams of the read path: one base for a dataset and a mixture, the stage contract, one root seed."""

from __future__ import annotations

import numpy as np
import pytest

from llm.data import (
    CombinedStreamingDataset,
    StreamingDataLoader,
    StreamingDataset,
    TokensLoader,
    train_test_split,
)
from llm.data.mix.weights import PERIOD, quotas, slot_table
from llm.data.shards.plan.schedule import epoch_order
from llm.data.shards.plan.shuffle import make_permutation
from llm.data.shards.read.source import SampleSource
from llm.data.stage import Stage
from tests.data.shards.test_mixing import combined, make_source
from tests.resume import check_refused_state_changes_nothing


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    root = tmp_path_factory.mktemp("contract")
    return str(make_source(root / "a", 1, 200)), str(make_source(root / "b", 2, 60)), str(make_source(root / "c", 3, 60))


def epoch_of(loader: StreamingDataLoader) -> list[np.ndarray]:
    return [b.numpy() for b in loader]


def test_a_dataset_a_mixture_and_the_loader_are_stages(sources):
    ds = StreamingDataset(sources[0], item_loader=TokensLoader(block_size=7))
    mix = combined(sources[:2])
    assert isinstance(ds, SampleSource) and isinstance(mix, SampleSource) and isinstance(mix, Stage)
    assert not isinstance(mix, StreamingDataset)  # it holds its sources
    loader = StreamingDataLoader(mix, batch_size=4)
    assert isinstance(loader, Stage)
    next(iter(loader))
    assert set(loader.state_dict()) == {"version", "fingerprint", "seed", "shuffle", "shuffle_window", "subsample",
                                        "split", "num_samples", "epoch", "samples_consumed", "global_batch_size",
                                        "mixture"}


def test_a_state_of_another_mixture_is_refused_and_changes_nothing(sources):
    """Defect 5: the refused state used to re-anchor the mixture before the fingerprint check failed."""
    other = StreamingDataLoader(combined([sources[0], sources[2]], (0.9, 0.1)), batch_size=4)
    it = iter(other)
    for _ in range(7):
        next(it)
    bad = other.state_dict()
    loader = StreamingDataLoader(combined(sources[:2]), batch_size=4)
    fresh = StreamingDataLoader(combined(sources[:2]), batch_size=4)
    check_refused_state_changes_nothing(loader, bad, epoch_of, fresh)


@pytest.mark.parametrize("change", [{"samples_consumed": 10**9}, {"global_batch_size": 0}, {"version": 7},
                                    {"mixture": {"weights": [1.0], "anchor": [0], "counts": [0]}}])
def test_a_bad_loader_state_is_refused_whole(sources, change):
    loader = StreamingDataLoader(combined(sources[:2]), batch_size=4)
    it = iter(loader)
    for _ in range(3):
        next(it)
    bad = {**loader.state_dict(), **change}
    check_refused_state_changes_nothing(StreamingDataLoader(combined(sources[:2]), batch_size=4), bad, epoch_of,
                                        StreamingDataLoader(combined(sources[:2]), batch_size=4))


def test_a_dataset_is_a_stage_of_its_own(sources):
    ds = StreamingDataset(sources[0], item_loader=TokensLoader(block_size=7), shuffle=True)
    ds.set_epoch(3)
    again = StreamingDataset(sources[0], item_loader=TokensLoader(block_size=7), shuffle=True)
    again.load_state_dict(ds.state_dict())
    assert again.epoch == 3 and [int(x[0]) for x in again] == [int(x[0]) for x in ds]
    with pytest.raises(ValueError, match="shuffle is True in the state but False here"):
        StreamingDataset(sources[0], item_loader=TokensLoader(block_size=7)).check(ds.state_dict())


# ---- one root seed ---------------------------------------------------------------------------


def test_seed_and_epoch_no_longer_collide():
    n = 1000
    assert not np.array_equal(epoch_order(n, 42, 1, True)(np.arange(n)), epoch_order(n, 43, 0, True)(np.arange(n)))
    # the version-1 derivation (kept to resume old states) is the collision
    old = [epoch_order(n, s, e, True, legacy=True)(np.arange(n)) for s, e in ((42, 1), (43, 0))]
    assert np.array_equal(*old)


def test_two_same_size_sources_with_one_seed_get_different_orders(sources):
    a, b = (StreamingDataset(p, item_loader=TokensLoader(block_size=7), shuffle=True) for p in sources[1:])
    assert len(a) == len(b)
    mix = CombinedStreamingDataset([a, b], weights=[0.5, 0.5])
    ids = mix.global_ids(0, np.arange(2 * len(a)))
    src = mix.sources_of(ids)
    assert not np.array_equal(ids[src == 0], ids[src == 1] - mix.offsets[1])


def test_a_version_1_state_resumes_with_the_old_order(sources):
    """A v1 state: order seed + epoch. Its continuation is computed here from the old formula directly."""
    ds = StreamingDataset(sources[0], item_loader=TokensLoader(block_size=7), shuffle=True, seed=5)
    n = len(ds)
    loader = StreamingDataLoader(ds, batch_size=4)
    state = {**loader.state_dict(), "version": 1, "epoch": 1, "samples_consumed": 40}
    loader.load_state_dict(state)
    got = np.concatenate([b.numpy()[:, 0] for b in loader])
    old = make_permutation("feistel", n, 5 + 1)(np.arange(40, n))
    assert np.array_equal(got, ds.read_blocks(old)["input_ids"][:, 0])
    assert loader.state_dict()["version"] == 1  # it goes on with the order it resumed
    nxt = np.concatenate([b.numpy()[:, 0] for b in loader])  # epoch 2 of the old derivation
    assert np.array_equal(nxt, ds.read_blocks(make_permutation("feistel", n, 5 + 2)(np.arange(n)))["input_ids"][:, 0])


def test_a_version_1_mixture_state_resumes_with_the_old_schedule(sources):
    mix = combined(sources[:2], (0.7, 0.3), seed=3)
    loader = StreamingDataLoader(mix, batch_size=4)
    state = {**loader.state_dict(), "version": 1, "samples_consumed": 20}
    loader.load_state_dict(state)
    got = np.concatenate([b.numpy()[:, 0] for b in loader])
    # the old schedule: period 1000 rolled by the seed, source s in the order of seed_s + its epoch
    slots = slot_table(quotas([0.7, 0.3]), 3)
    seen, want = [0, 0], []
    for p in range(mix.num_samples):
        s = int(slots[p % PERIOD])
        n_s = int(mix.sizes[s])
        q, seen[s] = seen[s], seen[s] + 1
        sample = make_permutation("feistel", n_s, 11 + s + q // n_s)(np.array([q % n_s]))[0]
        want.append(int(mix.datasets[s].read_blocks(np.array([sample]))["input_ids"][0, 0]))
    assert got.tolist() == want[20:]


# ---- splits x subsample ----------------------------------------------------------------------


@pytest.mark.parametrize("subsample", [0.3, 1.0, 2.0, 2.5])
def test_a_split_of_an_upsampled_dataset_shares_no_stored_block(sources, subsample):
    """Defect 8: with subsample=2.0 the halves shared hundreds of stored blocks."""
    ds = StreamingDataset(sources[0], item_loader=TokensLoader(block_size=7), subsample=subsample, seed=2)
    train, test = train_test_split(ds, [0.8, 0.2], seed=1)
    stored = [set(part.to_base(np.arange(len(part))).tolist()) for part in (train, test)]
    assert not stored[0] & stored[1]
    assert len(train) + len(test) == pytest.approx(len(ds), abs=2)


def test_an_empty_source_with_a_positive_weight_is_refused(sources):
    ds = StreamingDataset(sources[1], item_loader=TokensLoader(block_size=7))
    full, empty = train_test_split(ds, [1.0, 0.0])
    assert len(empty) == 0
    with pytest.raises(ValueError, match=r"^weights\[1\] \(datasets\[1\], .*\) is 0.5 but that dataset has no samples; give it weight 0 or leave it out$"):
        CombinedStreamingDataset([full, empty], weights=[0.5, 0.5])


# ---- every positive weight is served -------------------------------------------------------


def test_a_small_positive_weight_is_served_in_proportion(sources):
    """Defect 2: 0.0004 rounded to a quota of 0 per 1000 slots and was never served."""
    ds = [StreamingDataset(p, item_loader=TokensLoader(block_size=7)) for p in sources[:2]]
    mix = CombinedStreamingDataset(ds, weights=[0.9996, 0.0004])  # an epoch ends when both went round
    ids = np.concatenate([mix.global_ids(e, np.arange(mix.num_samples)) for e in range(3)])
    served = int((mix.sources_of(ids) == 1).sum())
    assert served > 0 and abs(served - 0.0004 * len(ids)) <= 1


def test_default_weights_serve_a_tiny_source(tmp_path):
    from llm.data import optimize

    optimize(lambda i: np.full(7, 5, dtype=np.int64), list(range(600)), str(tmp_path / "big"), num_workers=0,
             progress=False, item_loader=TokensLoader())
    optimize(lambda i: np.array([7, 7], dtype=np.int64), [0], str(tmp_path / "tiny"), num_workers=0, progress=False,
             item_loader=TokensLoader())
    ds = [StreamingDataset(tmp_path / n, item_loader=TokensLoader(block_size=1)) for n in ("big", "tiny")]
    assert [len(d) for d in ds] == [4200, 2]
    mix = CombinedStreamingDataset(ds, iterate_over_all=False)
    ids = np.concatenate([mix.global_ids(e, np.arange(mix.num_samples)) for e in range(3)])
    assert abs(int((mix.sources_of(ids) == 1).sum()) - len(ids) * 2 / 4202) <= 1


def test_the_two_drop_last_meanings_have_their_own_names_and_the_old_one_still_works(sources):
    block = TokensLoader(block_size=9)  # 1400 tokens: a short last block of 5
    new, old = (StreamingDataset(sources[0], item_loader=block, **kw) for kw in ({"drop_partial_block": True},
                                                                                  {"drop_last": True}))
    assert len(new) == len(old) == 1400 // 9 and new.drop_partial_block and old.drop_partial_block
    short = [StreamingDataLoader(new, batch_size=4, **kw) for kw in ({"drop_short_batch": True}, {"drop_last": True})]
    assert len(short[0]) == len(short[1]) == (1400 // 9) // 4
    with pytest.raises(ValueError, match="drop_short_batch=True and drop_last=False disagree"):
        StreamingDataLoader(new, batch_size=4, drop_short_batch=True, drop_last=False)


def test_the_loader_names_the_base_it_takes():
    with pytest.raises(TypeError, match=r"StreamingDataset or CombinedStreamingDataset \(a SampleSource\), got list"):
        StreamingDataLoader([1, 2, 3])
