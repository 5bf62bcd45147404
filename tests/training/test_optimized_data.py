"""OptimizedData: a pass is exactly `steps_per_pass` full global batches, so the trainer's epochs never drift."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np
import pytest

from llm.data.shards.prepare.optimize_text import optimize_text
from llm.training.core.loading import build_config
from llm.training.tasks.optimized import OptimizedData


def _dataset(tmp_path: Path) -> Path:
    corpus = tmp_path / "c.txt"  # hex digests: every block is distinct, so repeats are visible
    corpus.write_text("\n".join(hashlib.sha256(str(i).encode()).hexdigest() for i in range(37)) + "\n")
    optimize_text([str(corpus)], tmp_path / "opt", "simple", num_workers=0, chunk_bytes="1KB", progress=False)
    return tmp_path / "opt"


def _next_as(rank: int, world: int, it: object) -> dict:
    os.environ["RANK"], os.environ["WORLD_SIZE"] = str(rank), str(world)  # read when a pass starts
    try:
        return next(it)  # type: ignore[call-overload]
    finally:
        del os.environ["RANK"], os.environ["WORLD_SIZE"]


@pytest.mark.parametrize("world", [1, 2])
def test_every_pass_is_steps_per_pass_full_batches_without_repeats(tmp_path: Path, world: int) -> None:
    path = _dataset(tmp_path)
    cfg = build_config({
        "data": {"data_source": "optimized", "dataset_path": str(path), "max_seq_len": 8},
        "training": {"batch_size": 4, "seed": 5},
    })
    ranks = [OptimizedData(cfg, r, world) for r in range(world)]
    n_blocks, global_batch = len(ranks[0].dataset), 4 * world
    assert n_blocks % global_batch, "the test needs a short last global batch to drop"
    per_pass = ranks[0].steps_per_pass
    assert per_pass == n_blocks // global_batch
    iters = [r.batches() for r in ranks]
    passes = []
    for _ in range(4):
        rows = []
        for _ in range(per_pass):
            for rank, it in enumerate(iters):
                batch = _next_as(rank, world, it)
                assert batch["input_ids"].shape == (4, 8), "every batch is full"
                rows += [r.tobytes() for r in batch["input_ids"].numpy()]
        assert len(set(rows)) == len(rows) == per_pass * global_batch, "no block twice within a pass"
        passes.append(rows)
        # the pass ended exactly at the loader's epoch end: its state is the next epoch's start
        state = ranks[0].state_dict()
        assert (state["epoch"], state["samples_consumed"]) == (len(passes), 0)
    assert passes[0] != passes[1], "each pass is reshuffled"
    every = {np.asarray(ranks[0].dataset[i][:-1]).tobytes() for i in range(n_blocks)}  # inputs: all but the last
    assert all(set(p) <= every for p in passes)
