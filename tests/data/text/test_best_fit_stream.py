"""`packing: best_fit` on the text stream: whole documents per block, their boundaries out, exact resume on any topology."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from llm.data.pack.window import IGNORE_INDEX
from llm.data.stage import StateError
from llm.data.text.stream import StreamingTextDataModule, merge_stream_states
from llm.training.core.config import DataConfig
from tests.data.text.test_stream import write_corpus
from tests.resume import (
    check_refused_state_changes_nothing,
    check_resume,
    loaded,
    step_ranks,
    take_steps,
)

EOS = 256  # the simple tokenizer's


def make_module(config: dict, rank: int | None = None, world: int | None = None) -> StreamingTextDataModule:
    data = DataConfig(dataset_path=config["path"], max_seq_len=config["L"], num_workers=config["workers"],
                      packing=config.get("packing", "best_fit"), packing_buffer=config.get("buffer", 4))
    return StreamingTextDataModule(data, config["batch"], rank=rank, world_size=world, loop=False)


KEYS = ("input_ids", "labels", "position_ids")


def run_best_fit(config: dict, state: dict | None, steps: int | None):
    """`tests/resume.py` protocol: global steps = every rank's batch at that step, stacked."""
    world = config.get("world", 1)
    modules = loaded([make_module(config, r, world) for r in range(world)], state, config.get("ledger"))
    return step_ranks(modules, steps, KEYS), merge_stream_states([m.state_dict() for m in modules])


def rows(step: dict) -> list[bytes]:
    return [b"".join(step[k][i].tobytes() for k in KEYS) for i in range(len(step["input_ids"]))]


def _pieces(step: dict) -> list[list[int]]:
    """Each row's pieces as the token windows they came from (inputs + the last label)."""
    out = []
    for ids, labels, pos in zip(step["input_ids"], step["labels"], step["position_ids"]):
        starts = [*np.flatnonzero(pos == 0), len(pos)]
        for a, b in zip(starts, starts[1:]):
            if labels[a] != IGNORE_INDEX:
                out.append([*ids[a:b].tolist(), int(labels[b - 1])])
    return out


def test_documents_stay_whole_and_boundaries_go_out(tmp_path: Path) -> None:
    path = write_corpus(tmp_path, "txt")
    config = {"path": str(path), "L": 48, "batch": 3, "workers": 0, "buffer": 8}
    steps, state = run_best_fit(config, None, None)
    module = make_module(config)
    batch = next(iter(make_module(config).train_dataloader()))
    # flash-attention's layout: every run's start in the flattened batch, then the total
    starts = np.flatnonzero(batch["position_ids"].reshape(-1).numpy() == 0)
    assert batch["cu_seqlens"].dtype == torch.int32
    assert batch["cu_seqlens"].tolist() == [*starts.tolist(), batch["input_ids"].numel()]
    docs = [list(line.strip()) for line in path.read_bytes().split(b"\n") if line.strip()]
    whole = {tuple([*d, EOS]) for d in docs if len(d) <= 48}
    pieces = [tuple(p) for s in steps for p in _pieces(s)]
    assert len(docs) == 600 and sum(p[-1] == EOS for p in pieces) == 600  # every document ends once
    # every document that fits a block is one piece, whole; only longer ones are split
    assert whole <= set(pieces)
    assert sum(len(p) - 1 for p in pieces) == sum(len(d) for d in docs)  # n tokens + EOS fill n slots
    assert all(c["done"] and not c["open_blocks"] for c in state["partitions"].values())
    assert module.source_fingerprint()["packing"] == "best_fit"


@pytest.mark.slow
def test_exact_resume_two_workers_fresh_process(tmp_path: Path) -> None:
    path = write_corpus(tmp_path, "txt", n=150)
    config = {"path": str(path), "L": 40, "batch": 4, "workers": 2, "buffer": 6}
    ref = check_resume(run_best_fit, config, stops=[4, 15])
    assert len(ref) > 15


@pytest.mark.slow
def test_other_topologies_lose_and_repeat_nothing_fresh_process(tmp_path: Path) -> None:
    path = write_corpus(tmp_path, "txt", n=150)
    config = {"path": str(path), "L": 40, "batch": 4, "workers": 2, "buffer": 6}
    others = [{**config, "workers": 0}, {**config, "workers": 1, "world": 2}]
    check_resume(run_best_fit, config, stops=[9], resume_configs=others, exact=False, split_records=rows)


def test_resume_on_another_worker_count_quick(tmp_path: Path) -> None:
    path = write_corpus(tmp_path, "txt", n=200)
    config = {"path": str(path), "L": 40, "batch": 4, "workers": 0, "buffer": 6}
    check_resume(run_best_fit, config, stops=[3, 17], resume_configs=[{**config, "world": 2}], exact=False,
                 split_records=rows, fresh_process=False)


def test_a_state_with_an_oversized_open_block_changes_nothing(tmp_path: Path) -> None:
    path = write_corpus(tmp_path, "txt", n=200)
    config = {"path": str(path), "L": 32, "batch": 2, "workers": 0, "buffer": 4}
    module = make_module(config)
    take_steps(module.train_dataloader(), 5)
    state = copy.deepcopy(module.state_dict())
    key = next(k for k, c in state["partitions"].items() if c["open_blocks"])
    state["partitions"][key]["open_blocks"][0].append(np.arange(40, dtype="<i4").tobytes())
    fresh = make_module(config)
    take_steps(fresh.train_dataloader(), 5)

    def run(m: StreamingTextDataModule) -> list:
        return take_steps(m.train_dataloader(), 4)

    check_refused_state_changes_nothing(module, state, run, fresh)
    with pytest.raises(StateError, match=re.escape(f"data state partition {key!r} has an open block that does not fit 32")):
        module.load_state_dict(state)


def test_greedy_checkpoints_resume_and_best_fit_states_are_other_data(tmp_path: Path) -> None:
    path = write_corpus(tmp_path, "txt", n=100)
    greedy = {"path": str(path), "L": 32, "batch": 2, "workers": 0, "packing": "greedy"}
    assert "packing" not in make_module(greedy).source_fingerprint()  # older checkpoints keep their fingerprint
    _, state = run_best_fit({**greedy, "packing": "best_fit"}, None, 3)
    with pytest.raises(StateError, match="packing"):
        make_module(greedy).load_state_dict(state)
