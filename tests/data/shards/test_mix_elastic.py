"""Elastic resume of optimized shards: the global batch, ranks and workers change on every resume (8, then 4,
then 12; world 2, 1, 3; workers 2, then 0), in fresh processes, for plain datasets, the windowed order and
mixtures by records and by tokens, with schedules by step, samples and tokens, and per_batch."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llm.data import (
    CombinedStreamingDataset,
    ItemsLoader,
    StreamingDataLoader,
    StreamingDataset,
    TokensLoader,
    optimize,
)
from llm.data.shards.read.state import StateError
from tests.data.shards.test_mixing import make_source
from tests.resume import check_resume_chain, in_fresh_process, step_rows

# 8 then 4 then 12 samples a global batch, on 2, 1 and 3 ranks, with 2 then 0 workers
CHAIN = [({"batch": 8, "world": 2, "workers": 2}, 5), ({"batch": 4, "world": 1, "workers": 0}, 7),
         ({"batch": 12, "world": 3, "workers": 0}, None)]


def make_items(folder: Path, tag: int, n: int, lengths: tuple[int, int]) -> str:
    """Items whose every token says their source and index; lengths vary (token shares mean something)."""
    def fn(i):
        rng = np.random.default_rng(tag * 1000 + i)
        return {"input_ids": np.full(int(rng.integers(*lengths)), tag * 10_000 + i, dtype=np.int32)}

    optimize(fn, list(range(n)), str(folder), chunk_size=64, num_workers=0, progress=False)
    return str(folder)


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("elastic")
    return {"big": str(make_source(root / "big", 1, 400)), "small": str(make_source(root / "small", 2, 200)),
            "short": make_items(root / "short", 3, 600, (2, 12)), "long": make_items(root / "long", 4, 150, (30, 60))}


def build(config: dict) -> CombinedStreamingDataset | StreamingDataset:
    paths, kind = config["paths"], config["kind"]
    if kind in ("plain", "windowed"):
        return StreamingDataset(paths["big"], item_loader=TokensLoader(block_size=7), shuffle=True, seed=5,
                                shuffle_window=2 if kind == "windowed" else None)
    if kind == "items":
        sources = [StreamingDataset(paths[k], item_loader=ItemsLoader(), shuffle=True, seed=i)
                   for i, k in enumerate(("short", "long"))]
    else:
        sources = [StreamingDataset(paths[k], item_loader=TokensLoader(block_size=7), shuffle=True, seed=11 + i)
                   for i, k in enumerate(("big", "small"))]
    return CombinedStreamingDataset(sources, weights=config.get("weights"), schedule=config.get("schedule"),
                                    seed=3, unit=config.get("unit", "records"),
                                    batching=config.get("batching", "stratified"))


def _rows(batch, items: bool) -> np.ndarray:
    if items:  # an item as its id token and its length
        return np.array([[int(x["input_ids"][0]), len(x["input_ids"])] for x in batch], dtype=np.int64)
    return batch.numpy().astype(np.int64)


def run_chain(config: dict, state: dict | None, steps: int | None):
    """resume.py protocol: `world` ranks in lockstep in one process; one step is the global batch's rows."""
    import multiprocessing

    multiprocessing.set_start_method("fork", force=True)
    ds, world, items = build(config), config["world"], config["kind"] == "items"
    loaders = []
    for r in range(world):
        os.environ["RANK"], os.environ["WORLD_SIZE"] = str(r), str(world)
        loader = StreamingDataLoader(ds, batch_size=config["batch"] // world, num_workers=config["workers"],
                                     collate_fn=list if items else None, ledger=config.get("ledger"))
        if state is not None:
            loader.load_state_dict(state)
        loaders.append(loader)
    position = (state or {}).get("samples_consumed", 0)
    iters, out = [], []
    for r, loader in enumerate(loaders):
        os.environ["RANK"] = str(r)
        iters.append(iter(loader))
    while steps is None or len(out) < steps:
        parts = []
        for r, it in enumerate(iters):
            os.environ["RANK"] = str(r)
            parts.append(next(it, None))
        if any(p is None for p in parts):
            break
        size = min(config["batch"], ds.num_samples - position)
        rows = [_rows(p, items) for p in parts]
        if size < world:  # ranks past a short last batch repeat an early row, to step in lockstep
            rows = rows[:size]
        out.append(np.concatenate(rows))
        position += size
    os.environ["RANK"], os.environ["WORLD_SIZE"] = "0", str(world)
    saved = [lo.state_dict() for lo in loaders][0]  # every rank commits its ledger
    os.environ.pop("RANK"), os.environ.pop("WORLD_SIZE")
    return out, saved


def source_of(row: bytes) -> int:
    return int(np.frombuffer(row[:8], dtype=np.int64)[0]) // 10_000


def chain(config: dict) -> list[tuple[dict, int | None]]:
    return [({**config, **topology}, steps) for topology, steps in CHAIN]


POINTS = {"step": [0, 4, 9], "samples": [0, 30, 75], "tokens": [0, 200, 530]}


def schedule(unit: str) -> list[dict]:
    weights = [[0.7, 0.3], [0.2, 0.8], [0.5, 0.5]]
    return [{unit: at, "weights": w} for at, w in zip(POINTS[unit], weights)]


@pytest.mark.parametrize("config", [
    {"kind": "plain"},
    {"kind": "windowed"},
    {"kind": "mix", "weights": [0.7, 0.3]},
    {"kind": "items", "weights": [0.6, 0.4], "unit": "tokens"},
    {"kind": "items", "weights": [0.6, 0.4]},
    {"kind": "mix", "schedule": schedule("samples")},
    {"kind": "mix", "schedule": schedule("tokens")},
    {"kind": "items", "schedule": schedule("tokens"), "unit": "tokens"},
], ids=["plain", "windowed", "records", "items-by-tokens", "items-by-records", "samples-points", "tokens-points",
        "items-tokens-points"])
def test_a_batch_ramp_across_ranks_and_workers_is_exact_row_for_row(data, config):
    """The order is a pure function of positions: a batch change only regroups the same rows."""
    check_resume_chain(run_chain, chain({**config, "paths": data}))


@pytest.mark.parametrize("config", [
    {"kind": "mix", "schedule": schedule("step")},
    {"kind": "mix", "weights": [0.6, 0.4], "batching": "per_batch"},
    {"kind": "mix", "schedule": schedule("step"), "batching": "per_batch"},
    {"kind": "items", "schedule": schedule("step"), "unit": "tokens"},
], ids=["step-points", "per-batch", "per-batch-step-points", "items-step-points"])
def test_a_batch_ramp_loses_and_repeats_nothing_and_keeps_each_sources_order(data, config):
    """A step point not reached yet, and a per_batch slot, are one global batch of the run that reaches them: the
    mixture differs from the straight run after a batch change, so its epoch (a number of positions) may end with
    more of one source. Each source's rows are still one stream: what the chain served of a source and what the
    straight run served of it are prefixes of each other (nothing lost, nothing repeated, the same order)."""
    links = chain({**config, "paths": data})
    straight, _ = in_fresh_process(run_chain, links[0][0], None, None)
    want = [r for step in straight for r in step_rows(step)]
    got, state = [], None
    for cfg, steps in links:
        out, state = in_fresh_process(run_chain, cfg, state, steps)
        state = pickle.loads(pickle.dumps(state))
        got += [r for step in out for r in step_rows(step)]
    assert len(got) == len(want)
    for source in {source_of(r) for r in want + got}:
        mine, theirs = [r for r in got if source_of(r) == source], [r for r in want if source_of(r) == source]
        n = min(len(mine), len(theirs))
        assert mine[:n] == theirs[:n], f"source {source}: not the straight run's stream"
        assert len(set(mine)) == len(mine) or len(mine) > len(set(theirs)), f"source {source}: a row repeated early"


def test_the_reported_step_schedule_resumed_at_batch_4_is_exact(data):
    """Issue 35: 5 batches of 8 under [{step 0: .7/.3}, {step 3: .2/.8}], then batch 4: step 3 was reached at
    sample 24 and stays there, so the rows are the straight run's (samples 14-19 of a were served twice)."""
    config = {"kind": "mix", "paths": data, "schedule": [{"step": 0, "weights": [0.7, 0.3]},
                                                          {"step": 3, "weights": [0.2, 0.8]}], "workers": 0}
    check_resume_chain(run_chain, [({**config, "batch": 8, "world": 1}, 5), ({**config, "batch": 4, "world": 1}, None)],
                       fresh_process=False)


def test_per_batch_keeps_every_global_batch_from_one_source_across_a_ramp(data):
    config = {"kind": "mix", "paths": data, "weights": [0.6, 0.4], "batching": "per_batch", "workers": 0, "world": 1}
    state, steps = None, []
    for batch, n in ((8, 30), (16, 20), (4, 20)):
        out, state = run_chain({**config, "batch": batch}, state, n)
        assert [len(s) for s in out] == [batch] * n
        steps += out
    assert all(len(set((s[:, 0] // 10_000).tolist())) == 1 for s in steps)
    assert state["mixture"]["slots"] == [[0, 8], [240, 16], [560, 4]]


def _ramp_shares(data: dict, weights: list[float], batching: str, per_stage: int) -> np.ndarray:
    """Each source's share of the rows served over a ramp of 8, 16 and 32 a global batch, resumed between."""
    counts, state = np.zeros(2), None
    for batch in (8, 16, 32):
        sources = [StreamingDataset(data[k], item_loader=TokensLoader(block_size=7), shuffle=True, seed=i)
                   for i, k in enumerate(("big", "small"))]
        loader = StreamingDataLoader(CombinedStreamingDataset(sources, weights=weights, seed=9, batching=batching,
                                                              iterate_over_all=True), batch_size=batch)
        if state is not None:
            loader.load_state_dict(state)
        taken = 0
        while taken < per_stage:  # across the mixture's epochs
            for b in loader:
                counts += np.bincount(b.numpy()[:, 0] // 10_000 - 1, minlength=2)
                taken += 1
                if taken == per_stage:
                    break
        state = loader.state_dict()
    assert [c["samples"] for c in loader.source_counts().values()] == counts.tolist()  # the state agrees
    return counts / counts.sum()


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.integers(1, 9), min_size=2, max_size=2), st.sampled_from(["stratified", "per_batch"]))
def test_source_shares_over_a_batch_ramp_stay_within_1_percent_of_the_weights(data, raw, batching):
    weights = [w / sum(raw) for w in raw]
    shares = _ramp_shares(data, weights, batching, 200)
    assert np.abs(shares - weights).max() <= 0.01, (shares, weights)


# ---- the served past, old states, bad input ---------------------------------------------------------------


def _mix(data: dict, schedule_points: list[dict] | None = None, keys: tuple[str, ...] = ("big", "small"),
         **kw) -> CombinedStreamingDataset:
    sources = [StreamingDataset(data[k], item_loader=TokensLoader(block_size=7), shuffle=True, seed=11 + i)
               for i, k in enumerate(keys)]
    return CombinedStreamingDataset(sources, schedule=schedule_points, seed=3, **kw)


REPORTED = [{"step": 0, "weights": [0.7, 0.3]}, {"step": 3, "weights": [0.2, 0.8]}]


def _saved(data: dict, batch: int, steps: int, schedule_points: list[dict] = REPORTED) -> dict:
    loader = StreamingDataLoader(_mix(data, schedule_points), batch_size=batch)
    for _, _ in zip(range(steps), loader):
        pass
    return loader.state_dict()


def test_a_past_point_with_unchanged_weights_is_refused_and_changes_nothing(data):
    """It used to pass the past check, then repeat 1005 and skip 14: a new segment restarts the slot table."""
    from tests.resume import check_refused_state_changes_nothing

    state = _saved(data, 8, 5)
    added = [REPORTED[0], {"step": 2, "weights": [0.7, 0.3]}, REPORTED[1]]

    def loader() -> StreamingDataLoader:
        return StreamingDataLoader(_mix(data, added), batch_size=4)

    refused = loader()
    with pytest.raises(StateError, match=r"^schedule has a change point at step 2 where the run that saved this state, "
                                         r"which has read to step 5, had none; .* change the schedule only from step 5 on$"):
        refused.load_state_dict(state)
    check_refused_state_changes_nothing(refused, state, lambda lo: [b.numpy() for _, b in zip(range(12), lo)], loader())
    future = [*REPORTED, {"step": 9, "weights": [0.5, 0.5]}]  # a point not reached yet is the future's
    StreamingDataLoader(_mix(data, future), batch_size=4).load_state_dict(state)


def _as_version_1(state: dict, drop_batch: bool = False) -> dict:
    mixture = {k: v for k, v in state["mixture"].items()
               if k in ("weights", "anchor", "counts", "batching", "unit", "schedule", "step_samples")}
    if drop_batch:
        mixture.pop("step_samples")
    return {**state, "mixture": mixture}


def test_a_version_1_mixture_state_resumes_at_another_batch_as_a_version_2_one(data):
    state = _saved(data, 8, 2)  # step 3 not reached yet: it lands 1 batch of 4 after the resume
    rows = []
    for saved in (state, _as_version_1(state)):
        loader = StreamingDataLoader(_mix(data, REPORTED), batch_size=4)
        loader.load_state_dict(saved)
        rows.append(np.concatenate([b.numpy() for _, b in zip(range(10), loader)]))
        assert loader.state_dict()["mixture"]["clock"]["reached"] == [[0, 0], [3, 20]]
    assert np.array_equal(rows[0], rows[1])


def test_a_version_1_state_that_records_no_global_batch_is_one_sentence(data):
    state = _as_version_1(_saved(data, 8, 2), drop_batch=True)
    state.pop("global_batch_size")
    mix = _mix(data, REPORTED)
    with pytest.raises(StateError, match=r"^loader state key 'mixture' \(version 1\) records no global batch, so its "
                                         r"step points cannot be turned into positions for another batch size; "):
        mix.load_state_dict(state)


@pytest.mark.parametrize("points, message", [
    ([{"step": 0, "samples": 0, "weights": [1, 1]}],
     r"^schedule\[0\] gives step and samples; a point gives exactly one of step, samples and tokens$"),
    ([{"samples": 0, "weights": [1, 1]}, {"tokens": 70, "weights": [1, 2]}],
     r"^schedule\[1\] is by tokens but schedule\[0\] is by samples; give every point of a schedule by one of"),
    ([{"step": 0, "weights": [1, 1]}, {"step": np.int64(3), "weights": [1, 2]}], None),
    ([{"step": 0, "weights": [1, 1]}, {"step": True, "weights": [1, 2]}],
     r"^schedule\[1\]\.step is True; expected a whole number of steps >= 0$"),
])
def test_bad_schedule_points_are_one_sentence(data, points, message):
    if message is None:
        assert _mix(data, points).schedule.change_points() == [0, 3]
        return
    with pytest.raises(ValueError, match=message):
        _mix(data, points)


# ---- sources added or removed -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def third(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("third")
    return {"extra": str(make_source(root / "extra", 3, 100)),
            "changed": str(make_source(root / "other" / "small", 5, 200))}  # "small" again, other data


def _run(mix: CombinedStreamingDataset, state: dict | None, steps: int) -> tuple[np.ndarray, dict, StreamingDataLoader]:
    loader = StreamingDataLoader(mix, batch_size=4)
    if state is not None:
        loader.load_state_dict(state)
    rows = np.concatenate([b.numpy()[:, 0] for _, b in zip(range(steps), loader)])
    return rows, loader.state_dict(), loader


def test_a_changed_source_list_is_refused_without_the_option_naming_it(data, third):
    _, state, _ = _run(_mix(data, weights=[0.5, 0.5]), None, 5)
    more = {**data, **third}
    with pytest.raises(StateError, match=r"^loader state was saved with the sources \['big', 'small'\] but this "
                                         r"mixture has \['big', 'small', 'extra'\]; pass CombinedStreamingDataset\("
                                         r"\.\.\., allow_source_changes=True\)"):
        StreamingDataLoader(_mix(more, keys=("big", "small", "extra"), weights=[0.4, 0.4, 0.2]),
                            batch_size=4).load_state_dict(state)


def test_sources_added_and_removed_keep_their_own_cursors_and_counts(data, third):
    more = {**data, **third}
    head, state, _ = _run(_mix(data, weights=[0.5, 0.5]), None, 10)
    straight, _, _ = _run(_mix(data, weights=[0.5, 0.5]), None, 60)
    grown = _mix(more, keys=("big", "small", "extra"), weights=[0.4, 0.4, 0.2], allow_source_changes=True)
    tail, state2, loader = _run(grown, state, 20)
    for tag in (1, 2):  # a kept source continues its own stream
        mine = np.concatenate([head, tail])
        mine, theirs = mine[mine // 10_000 == tag], straight[straight // 10_000 == tag]
        assert np.array_equal(mine, theirs[: len(mine)])
    extra = tail[tail // 10_000 == 3]
    assert len(extra) and np.array_equal(extra, grown._source_order(2, 0)(np.arange(len(extra))) + 30_000)
    counts = loader.source_counts()
    assert counts["extra"]["samples"] == len(extra)
    # remove "small": its counts stay in the accounting, "big" and "extra" carry on
    shrunk = _mix(more, keys=("big", "extra"), weights=[0.5, 0.5], allow_source_changes=True)
    last, _, loader = _run(shrunk, state2, 10)
    assert not (last // 10_000 == 2).any()
    after = loader.source_counts()
    assert after["small"] == counts["small"]
    assert after["big"]["samples"] + after["extra"]["samples"] == counts["big"]["samples"] + counts["extra"]["samples"] + 40


def test_ambiguous_source_changes_are_one_sentence_naming_the_source(data, third):
    _, state, _ = _run(_mix(data, weights=[0.5, 0.5]), None, 5)
    changed = {"big": data["big"], "small": third["changed"]}
    with pytest.raises(StateError, match=r"^source 'small' holds other data than the source of that name in the state "
                                         r"\(its fingerprint changed\)"):
        StreamingDataLoader(_mix(changed, weights=[0.5, 0.5], allow_source_changes=True),
                            batch_size=4).load_state_dict(state)
    twice = {**data, "again": third["changed"]}
    with pytest.raises(StateError, match=r"^this mixture has two sources named 'small'; allow_source_changes matches "
                                         "sources by name"):
        StreamingDataLoader(_mix(twice, keys=("big", "small", "again"), weights=[0.4, 0.3, 0.3],
                                 allow_source_changes=True), batch_size=4).load_state_dict(state)


def test_a_step_schedule_carries_on_across_a_source_change_and_a_batch_change(data, third):
    """Steps served before the change stay served: step 6 lands 2 batches of 4 after a stop at step 4."""
    more = {**data, **third}
    loader = StreamingDataLoader(_mix(data, [{"step": 0, "weights": [0.7, 0.3]}, {"step": 6, "weights": [0.2, 0.8]}]),
                                 batch_size=8)
    for _, _ in zip(range(4), loader):
        pass
    grown = [{"step": 0, "weights": [0.7, 0.3, 0.0]}, {"step": 6, "weights": [0.2, 0.4, 0.4]}]
    _, state, _ = _run(_mix(more, grown, keys=("big", "small", "extra"), allow_source_changes=True),
                       loader.state_dict(), 8)
    assert state["mixture"]["clock"] == {"step": 12, "position": 32, "reached": [[0, 0], [6, 8]]}
    again, _, _ = _run(_mix(more, grown, keys=("big", "small", "extra"), allow_source_changes=True), state, 3)
    assert len(again) == 12


def test_a_version_1_per_batch_state_resumes_at_another_batch_from_its_position(data):
    """Version-1 per_batch states could not change the batch at all; converted, the new slot size starts where
    the state stopped, and every global batch is still one source."""
    loader = StreamingDataLoader(_mix(data, weights=[0.6, 0.4], batching="per_batch"), batch_size=8)
    head = [b.numpy() for _, b in zip(range(6), loader)]
    state = _as_version_1(loader.state_dict())
    resumed = StreamingDataLoader(_mix(data, weights=[0.6, 0.4], batching="per_batch"), batch_size=4)
    resumed.load_state_dict(state)
    tail = [b.numpy() for _, b in zip(range(10), resumed)]
    assert resumed.state_dict()["mixture"]["slots"] == [[0, 8], [48, 4]]
    assert all(len(set((b[:, 0] // 10_000).tolist())) == 1 for b in head + tail)
    rows = np.concatenate(head + tail)[:, 0]
    assert len(set(rows.tolist())) == len(rows)  # nothing repeated


def test_a_version_1_state_with_another_count_of_sources_is_one_sentence(data, third):
    _, state, _ = _run(_mix(data, weights=[0.5, 0.5]), None, 5)
    more = {**data, **third}
    grown = _mix(more, keys=("big", "small", "extra"), weights=[0.4, 0.4, 0.2], allow_source_changes=True)
    with pytest.raises(StateError, match=r"^loader state key 'mixture' \(version 1\) holds 2 sources but this mixture "
                                         r"has 3, and it does not name them"):
        StreamingDataLoader(grown, batch_size=4).load_state_dict(_as_version_1(state))
