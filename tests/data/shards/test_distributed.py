"""Real torch.distributed (gloo, 2 processes): ranks come from the process group and split the data."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

import numpy as np
import torch.distributed as dist

from tests.data.shards.helpers import make_token_dataset, run_loader


def _rank_main(rank: int, world: int, init_file: str, dataset: str, results) -> None:
    from llm.data import StreamingDataLoader, StreamingDataset, TokensLoader

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        ds = StreamingDataset(dataset, item_loader=TokensLoader(block_size=64), shuffle=True, seed=7)
        loader = StreamingDataLoader(ds, batch_size=2, num_workers=2)
        it = iter(loader)
        head = [next(it).numpy() for _ in range(5)]
        state = loader.state_dict()
        gathered: list = [None] * world
        dist.all_gather_object(gathered, state)  # every rank saved the same state
        resumed = StreamingDataLoader(StreamingDataset(dataset, item_loader=TokensLoader(block_size=64), shuffle=True, seed=7), batch_size=2, num_workers=1)
        resumed.load_state_dict(state)
        tail = [b.numpy() for b in resumed]
        results.put((rank, head + tail, gathered))
    finally:
        dist.destroy_process_group()


def test_two_gloo_ranks_read_disjoint_halves_and_resume(tmp_path: Path):
    dataset = make_token_dataset(tmp_path, n_lines=700)
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=_rank_main, args=(r, 2, str(tmp_path / "init"), str(dataset), results)) for r in range(2)]
    for p in procs:
        p.start()
    outputs = dict((r, (steps, states)) for r, steps, states in (results.get(timeout=180) for _ in procs))
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    steps0, states = outputs[0]
    steps1, _ = outputs[1]
    assert states[0] == states[1] and states[0]["samples_consumed"] == 5 * 2 * 2
    assert len(steps0) == len(steps1)
    # The same global batches as the in-process simulation of two ranks (one step = both ranks' rows).
    reference, _ = run_loader({"path": str(dataset), "block": 64, "batch": 2, "world": 2, "workers": 0}, None, None)
    got = [np.concatenate([a, b]) for a, b in zip(steps0, steps1)]
    assert len(got) == len(reference)
    for g, r in zip(got, reference):
        assert np.array_equal(g, r)
    rows0 = {tuple(r) for s in steps0 for r in s.tolist()}
    rows1 = {tuple(r) for s in steps1 for r in s.tolist()}
    assert not rows0 & rows1, "ranks read disjoint samples"
