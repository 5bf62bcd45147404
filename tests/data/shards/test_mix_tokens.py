"""CombinedStreamingDataset: token shares over items of variable length, weight schedules (exact resume across a
switch, future-only changes on resume), and `source_counts()` against an independent count of the batches."""

from __future__ import annotations

import multiprocessing
import os

import numpy as np
import pytest

from llm.data import (
    CombinedStreamingDataset,
    ItemsLoader,
    StreamingDataLoader,
    StreamingDataset,
    TokensLoader,
)
from llm.data.shards.read.state import StateError
from tests.data.shards.test_mixing import combined, make_source, next_parts, rank_loaders
from tests.resume import (
    assert_same_steps,
    check_refused_state_changes_nothing,
    check_resume,
)


def make_items(folder, tag: int, n: int, lengths: tuple[int, int]) -> str:
    """Items {"input_ids": tag repeated a random length}: the length is the item's tokens, the tag its source."""
    from llm.data import optimize

    def fn(i):
        rng = np.random.default_rng(tag * 100_000 + i)
        return {"input_ids": np.full(int(rng.integers(*lengths)), tag, dtype=np.int32)}

    optimize(fn, list(range(n)), str(folder), chunk_size=256, num_workers=0, progress=False)
    return str(folder)


@pytest.fixture(scope="module")
def item_sources(tmp_path_factory):
    root = tmp_path_factory.mktemp("items")
    # documents 20x apart in length: ~10 tokens and ~200 tokens
    return make_items(root / "short", 1, 4000, (5, 16)), make_items(root / "long", 2, 300, (150, 251))


def as_list(items: list) -> list:
    return items  # variable-length items: the batch is the list of them


def count(batches: list) -> dict[str, dict[str, int]]:
    """Tokens and samples per source, from the items' own tags and lengths."""
    out = {"short": {"tokens": 0, "samples": 0}, "long": {"tokens": 0, "samples": 0}}
    for batch in batches:
        for item in batch:
            name = {1: "short", 2: "long"}[int(item["input_ids"][0])]
            out[name]["tokens"] += len(item["input_ids"])
            out[name]["samples"] += 1
    return out


@pytest.mark.parametrize("weights, workers, steps", [([0.5, 0.5], 0, 300), ([0.3, 0.7], 2, 60)])
def test_token_shares_over_items_follow_the_weights(item_sources, weights, workers, steps):
    multiprocessing.set_start_method("fork", force=True)
    sources = [StreamingDataset(p, item_loader=ItemsLoader(), shuffle=True, seed=i) for i, p in enumerate(item_sources)]
    mix = CombinedStreamingDataset(sources, weights=weights, unit="tokens", seed=4)
    loader = StreamingDataLoader(mix, batch_size=8, num_workers=workers, collate_fn=as_list)
    batches = []
    for batch in loader:
        batches.append(batch)
        if len(batches) == steps:
            break
    counted = count(batches)
    total = counted["short"]["tokens"] + counted["long"]["tokens"]
    shares = [counted["short"]["tokens"] / total, counted["long"]["tokens"] / total]
    assert all(abs(s - w) <= 0.01 * 300 / steps for s, w in zip(shares, weights)), shares
    assert loader.source_counts() == counted  # from the position alone, equal to the batches' own count


def test_records_over_items_leave_tokens_20_to_1(item_sources):
    sources = [StreamingDataset(p, item_loader=ItemsLoader()) for p in item_sources]
    loader = StreamingDataLoader(CombinedStreamingDataset(sources, weights=[0.5, 0.5]), batch_size=8,
                                 collate_fn=as_list)
    batches = [b for _, b in zip(range(100), loader)]
    counted = count(batches)
    assert counted["long"]["tokens"] > 10 * counted["short"]["tokens"]
    assert loader.source_counts() == counted


def run_tokens(config: dict, state: dict | None, steps: int | None):
    """resume.py protocol over the item mixture by tokens (one rank, `workers` processes)."""
    multiprocessing.set_start_method("fork", force=True)
    sources = [StreamingDataset(p, item_loader=ItemsLoader(), shuffle=True, seed=i)
               for i, p in enumerate(config["paths"])]
    mix = CombinedStreamingDataset(sources, weights=config.get("weights"), schedule=config.get("schedule"),
                                   unit="tokens", seed=4)
    loader = StreamingDataLoader(mix, batch_size=4, num_workers=config["workers"], collate_fn=as_list,
                                 ledger=config.get("ledger"))
    if state is not None:
        loader.load_state_dict(state)
    out, it = [], iter(loader)
    left = 40 - (state["samples_consumed"] // 4 if state else 0)  # the run ends at step 40, resumed or not
    while len(out) < (left if steps is None else steps):
        batch = next(it, None)
        if batch is None:
            break
        out.append({"input_ids": np.concatenate([x["input_ids"] for x in batch]),
                    "lengths": np.array([len(x["input_ids"]) for x in batch])})
    return out, loader.state_dict()


def test_token_mixing_over_items_resumes_exactly_on_other_worker_counts(item_sources):
    config = {"paths": item_sources, "schedule": [{"step": 0, "weights": [0.8, 0.2]}, {"step": 17, "weights": [0.3, 0.7]}],
              "workers": 0}
    check_resume(run_tokens, config, stops=[5, 18], resume_configs=[{**config, "workers": 2}], fresh_process=False)


def run_schedule(config: dict, state: dict | None, steps: int | None):
    """resume.py protocol over token datasets: `world` ranks in lockstep, a step is the global batch."""
    sources = [StreamingDataset(p, item_loader=TokensLoader(block_size=7), shuffle=True, seed=11 + i)
               for i, p in enumerate(config["paths"])]
    mix = CombinedStreamingDataset(sources, schedule=config["schedule"], seed=3)
    out, loaders = [], rank_loaders(mix, config, 8, state)
    while steps is None or len(out) < steps:
        parts = next_parts(loaders)
        if any(p is None for p in parts):
            break
        out.append(np.concatenate([p.numpy() for p in parts]))
    os.environ["RANK"], os.environ["WORLD_SIZE"] = "0", "1"
    return out, [lo.state_dict() for _, lo, _ in loaders][0]  # every rank commits its ledger


@pytest.fixture(scope="module")
def token_sources(tmp_path_factory):
    root = tmp_path_factory.mktemp("mixsched")
    return str(make_source(root / "big", 1, 400)), str(make_source(root / "small", 2, 200))


SCHEDULE = [{"step": 0, "weights": [0.9, 0.1]}, {"step": 12, "weights": [0.25, 0.75], "interpolate": "linear"},
            {"step": 30, "weights": [0.5, 0.5]}]


def test_a_schedule_switches_at_its_steps_and_resumes_exactly_on_any_topology(token_sources):
    config = {"paths": token_sources, "schedule": SCHEDULE}
    ref = check_resume(run_schedule, config, stops=[7, 12, 13, 31],
                       resume_configs=[{**config, "workers": 2}, {**config, "world": 2}], fresh_process=False)
    small = [float((step // 10_000 == 2).mean()) for step in ref]  # each token says its source
    assert np.mean(small[:12]) == pytest.approx(0.1, abs=0.02)
    assert np.mean(small[12:14]) == pytest.approx(0.75, abs=0.07)  # the ramp starts at 0.75
    assert np.mean(small[30:40]) == pytest.approx(0.5, abs=0.05)


@pytest.mark.slow
def test_a_schedule_resumes_exactly_in_fresh_processes(token_sources):
    check_resume(run_schedule, {"paths": token_sources, "schedule": SCHEDULE}, stops=[13])


def test_a_schedule_changed_for_the_future_resumes_and_one_changing_the_past_is_refused(token_sources):
    later = [SCHEDULE[0], {"step": 20, "weights": [0.25, 0.75]}]
    head, state = run_schedule({"paths": token_sources, "schedule": later}, None, 10)
    tail, _ = run_schedule({"paths": token_sources, "schedule": SCHEDULE}, state, None)
    straight, _ = run_schedule({"paths": token_sources, "schedule": SCHEDULE}, None, None)
    assert_same_steps(head + tail, straight, "schedule changed at step 10 for steps 12 on")
    _, state = run_schedule({"paths": token_sources, "schedule": SCHEDULE}, None, 15)

    def loader() -> StreamingDataLoader:
        sources = [StreamingDataset(p, item_loader=TokensLoader(block_size=7)) for p in token_sources]
        return StreamingDataLoader(CombinedStreamingDataset(sources, schedule=later, seed=3), batch_size=8)

    refused = loader()
    with pytest.raises(StateError, match="schedule gives other weights at step 12 than the run that saved this "
                                         "state, which has read to step 15; change the schedule only from step 15 on"):
        refused.load_state_dict(state)
    check_refused_state_changes_nothing(refused, state, lambda lo: [b.numpy() for _, b in zip(range(25), lo)], loader())


def test_source_counts_of_token_blocks_follow_the_position(token_sources):
    mix = combined(token_sources, (0.75, 0.25))
    loader = StreamingDataLoader(mix, batch_size=4)
    batches = [b for _, b in zip(range(10), loader)]
    tags = np.concatenate([b.numpy().ravel() for b in batches]) // 10_000
    counts = loader.source_counts()
    assert counts["big"]["tokens"] == int((tags == 1).sum()) and counts["small"]["tokens"] == int((tags == 2).sum())
    assert counts["big"]["samples"] + counts["small"]["samples"] == 40
    restored = StreamingDataLoader(combined(token_sources, (0.75, 0.25)), batch_size=4)
    restored.load_state_dict(loader.state_dict())
    assert restored.source_counts() == counts  # kept in the state (the position)
