"""`data.skip_documents` under DDP: a global batch whose share on any rank came with no rows is dropped by every
rank together, so the ranks' data positions never part (real torch.distributed, 2 processes, gloo)."""

from __future__ import annotations

import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from llm.training.skip_ranges import SkipRanges


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank(rank: int, port: int, empty_on: dict[int, set[int]], skip_documents: bool, out: dict) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        def batches():  # this rank's share of global batches 0..7; some came back with no rows
            for i in range(8):
                rows = 0 if i in empty_on[rank] else 2
                yield {"input_ids": torch.full((rows, 4), i)}

        skips = SkipRanges(None, skip_documents=skip_documents)
        out[rank] = ([int(b["input_ids"][0, 0]) if len(b["input_ids"]) else -1 for b in skips.filter(batches())],
                     skips.skipped)
    finally:
        dist.destroy_process_group()


def _run(empty_on: dict[int, set[int]], skip_documents: bool = True) -> dict:
    with mp.Manager() as manager:
        out = manager.dict()
        mp.spawn(_rank, args=(_free_port(), empty_on, skip_documents, out), nprocs=2, join=True)
        return dict(out)


@pytest.mark.timeout(120)
def test_an_empty_share_on_one_rank_drops_that_batch_on_every_rank() -> None:
    out = _run({0: set(), 1: {2, 5}})
    assert out[0] == out[1] == ([0, 1, 3, 4, 6, 7], 2)  # both ranks train the same global batches


@pytest.mark.timeout(120)
def test_without_skip_documents_no_collective_and_nothing_dropped() -> None:
    out = _run({0: set(), 1: set()}, skip_documents=False)
    assert out[0] == out[1] == (list(range(8)), 0)
