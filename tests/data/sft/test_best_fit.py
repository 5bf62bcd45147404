"""`packing: best_fit` with `sample_packing`: whole samples packed across batches into full rows, exact resume."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from llm.data.sft.stream import StreamingSFTDataModule
from llm.training.core.data_config import DataConfig, DatasetEntry
from tests.data.sft.test_stream import write_alpaca
from tests.resume import check_resume, loaded, take_steps

MAX_LEN = 1024  # bytes (the simple tokenizer): about five alpaca samples a row


def make(config: dict) -> StreamingSFTDataModule:
    data = DataConfig(datasets=[DatasetEntry(path=config["path"], type="alpaca")], max_seq_len=MAX_LEN,
                      num_workers=config["workers"], sample_packing=True, packing=config.get("packing", "best_fit"),
                      packing_buffer=4)
    return StreamingSFTDataModule(data, batch_size=3, loop=False)


def run_sft(config: dict, state: dict | None, steps: int | None):
    (module,) = loaded([make(config)], state, config.get("ledger"))
    steps_out = take_steps(module.train_dataloader(), steps)
    return [{k: v for k, v in s.items() if k != "cu_seqlens"} for s in steps_out], module.state_dict()


def _samples(step: dict) -> list[tuple[int, ...]]:
    """Each row's samples (by their position runs), padding left out."""
    out = []
    for ids, mask, pos in zip(step["input_ids"], step["attention_mask"], step["position_ids"]):
        starts = [*np.flatnonzero(pos == 0), len(pos)]
        out += [tuple(ids[a:b].tolist()) for a, b in zip(starts, starts[1:]) if mask[a]]
    return out


@pytest.mark.parametrize("workers", [0, 2])
def test_rows_are_packed_across_batches_and_resume_exactly(tmp_path: Path, workers: int) -> None:
    path = write_alpaca(tmp_path / "a.jsonl")
    config = {"path": str(path), "workers": workers}
    ref = check_resume(run_sft, config, stops=[0, 3, 7], fresh_process=False)
    greedy = take_steps(make({**config, "packing": "greedy"}).train_dataloader())
    # every record is one whole sample, in both modes; best fit needs fewer rows for them
    assert sorted(s for step in ref for s in _samples(step)) == sorted(s for step in greedy for s in _samples(step))
    rows = sum(len(s["input_ids"]) for s in ref)
    assert rows < sum(len(s["input_ids"]) for s in greedy)
    fill = np.concatenate([s["attention_mask"].sum(1) for s in ref])
    assert np.median(fill) > 0.85 * MAX_LEN  # most rows are nearly full (a partition's end leaves a few short)


def test_cu_seqlens_mark_every_sample(tmp_path: Path) -> None:
    batch = next(iter(make({"path": str(write_alpaca(tmp_path / "a.jsonl")), "workers": 0}).train_dataloader()))
    starts = np.flatnonzero(batch["position_ids"].reshape(-1).numpy() == 0).tolist()
    assert batch["cu_seqlens"].tolist() == [*starts, batch["input_ids"].numel()]
    assert (batch["labels"].reshape(-1)[starts] == -100).all()  # nothing predicts a sample's first token


def test_best_fit_needs_sample_packing(tmp_path: Path) -> None:
    data = DataConfig(datasets=[DatasetEntry(path=str(write_alpaca(tmp_path / "a.jsonl")), type="alpaca")],
                      packing="best_fit")
    with pytest.raises(ValueError, match="packing 'best_fit' packs samples into rows and needs sample_packing: true"):
        StreamingSFTDataModule(data, batch_size=2, loop=False)
