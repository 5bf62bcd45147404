"""Fine-tuning mixtures by tokens (`streaming_mixing_unit: tokens`, Axolotl's keys too), named per entry in the
per-source accounting, checked against the batches' own count, with worker processes and an exact resume."""

from __future__ import annotations

import json
import multiprocessing
import random
from pathlib import Path

import pytest

from llm.data.sft.stream import StreamingSFTDataModule
from llm.training.core.axolotl import AXOLOTL_KEYS
from llm.training.core.data_config import DataConfig
from tests.resume import attach, check_resume, take_steps


def write_entries(folder: Path) -> list[str]:
    """Alpaca records: `short.jsonl` answers in ~20 '1's, `long.jsonl` in ~400 '2's (a digit says the entry)."""
    rng = random.Random(3)
    paths = []
    for name, digit, n, (lo, hi) in (("short", "1", 600, (15, 25)), ("long", "2", 60, (300, 500))):
        path = folder / f"{name}.jsonl"
        with open(path, "w") as f:
            for _ in range(n):
                f.write(json.dumps({"instruction": "Say it.", "input": "", "output": digit * rng.randint(lo, hi)}) + "\n")
        paths.append(str(path))
    return paths


def make(config: dict) -> StreamingSFTDataModule:
    data = DataConfig(datasets=[{"path": p, "type": "alpaca", **({"name": "chat"} if i else {})}
                                for i, p in enumerate(config["paths"])],
                      max_seq_len=512, num_workers=config["workers"], streaming_dataset_mixing_strategy="weighted",
                      streaming_mixing_weights=[0.5, 0.5], streaming_mixing_unit=config.get("unit", "tokens"))
    return StreamingSFTDataModule(data, batch_size=4, steps_per_epoch=config.get("steps", 60), loop=True)


def count(batches: list[dict]) -> dict[str, dict[str, int]]:
    """Tokens (attention) and samples per entry, from the batches alone: the answer's digit names the entry."""
    out = {"short": {"tokens": 0, "samples": 0}, "chat": {"tokens": 0, "samples": 0}}
    for batch in batches:
        for ids, mask in zip(batch["input_ids"], batch["attention_mask"]):
            name = "short" if (ids == ord("1")).any() else "chat"
            out[name]["tokens"] += int(mask.sum())
            out[name]["samples"] += 1
    return out


@pytest.mark.parametrize("workers", [0, 2])
def test_sft_token_shares_follow_the_weights_and_are_counted_exactly(tmp_path, workers):
    multiprocessing.set_start_method("fork", force=True)
    module = make({"paths": write_entries(tmp_path), "workers": workers})
    batches = [{k: v.numpy() for k, v in b.items()} for b in module.train_dataloader()]
    counted = count(batches)
    total = counted["short"]["tokens"] + counted["chat"]["tokens"]
    assert abs(counted["short"]["tokens"] / total - 0.5) < 0.02  # by records it would be ~5%
    # named by the entry's name, else its path's stem; equal to the batches' own count
    assert module.source_counts() == counted


def run_sft(config: dict, state: dict | None, steps: int | None):
    multiprocessing.set_start_method("fork", force=True)
    module = attach(make({**config, "steps": 30}), config)
    if state is not None:
        module.load_state_dict(state)
    left = 30 - module.progress.step  # the run ends at step 30, resumed or not
    return take_steps(module.train_dataloader(), left if steps is None else steps), module.state_dict()


def test_sft_token_mixing_resumes_exactly(tmp_path):
    config = {"paths": write_entries(tmp_path), "workers": 2}
    check_resume(run_sft, config, stops=[0, 11], fresh_process=False)


def test_axolotl_spells_the_mixing_keys_as_ours():
    assert AXOLOTL_KEYS["streaming_mixing_unit"] == "data.streaming_mixing_unit"
    assert AXOLOTL_KEYS["streaming_mixing_schedule"] == "data.streaming_mixing_schedule"
