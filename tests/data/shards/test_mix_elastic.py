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
                                     collate_fn=list if items else None)
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
    saved = loaders[0].state_dict()
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
