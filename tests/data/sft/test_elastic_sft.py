"""SFT streams resumed with another global batch size, world size and num_workers, and with sources added (issue 35).

Each `.jsonl` file is one partition (under 1 KiB) whose completions are written with the
file's own two letters, so every sample says where it came from (`tests/data/text/test_elastic.py`).
"""

from __future__ import annotations

import json
import random
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest

from llm.data.sft.stream import StreamingSFTDataModule
from llm.data.stage import StateError
from llm.data.text.stream import merge_stream_states
from llm.training.core.data_config import DataConfig
from tests.data.text.test_elastic import LETTERS, batch_chain, partition_of, topology_chain
from tests.resume import check_resume_chain, loaded


def write_entry(folder: Path, name: str, first_file: int, files: int, lengths: tuple[int, int]) -> str:
    rng = random.Random(first_file)
    root = folder / name
    root.mkdir(parents=True, exist_ok=True)
    for k in range(first_file, first_file + files):
        alphabet, lines, size = LETTERS[2 * k: 2 * k + 2], [], 0
        while size < 800:
            lines.append(json.dumps({"text": "".join(rng.choice(alphabet) for _ in range(rng.randint(*lengths)))}))
            size += len(lines[-1]) + 1
        (root / f"{k:02d}.jsonl").write_text("\n".join(lines) + "\n")
    return str(root / "*.jsonl")


def entries(folder: Path) -> dict[str, str]:
    return {"quick": write_entry(folder, "quick", 0, 4, (3, 12)), "essays": write_entry(folder, "essays", 4, 4, (20, 50)),
            "extra": write_entry(folder, "extra", 8, 2, (3, 12))}


def sft_rows(step: dict) -> list[bytes]:
    """A step's samples without their padding (a batch pads to its longest sample, which a batch change moves)."""
    keys = [k for k in ("input_ids", "labels", "position_ids") if k in step]
    out = []
    for i in range(len(step["input_ids"])):
        keep = np.asarray(step["attention_mask"][i]) == 1
        out.append(b"".join(np.ascontiguousarray(step[k][i][keep], dtype=np.int64).tobytes() for k in keys))
    return out


def sft_config(config: dict) -> DataConfig:
    sources = config.get("sources", ["quick", "essays"])
    keys: dict = {"max_seq_len": 64, "num_workers": config.get("workers", 0), **config.get("extra", {})}
    if config.get("best_fit"):
        keys.update(sample_packing=True, packing="best_fit", packing_buffer=4)
    if len(sources) > 1:
        keys.setdefault("streaming_dataset_mixing_strategy", "weighted")
        keys.setdefault("streaming_mixing_unit", "tokens")
        if "streaming_mixing_schedule" not in keys:
            keys["streaming_mixing_weights"] = [0.5, 0.5] if len(sources) == 2 else [0.4, 0.3, 0.3]
    return DataConfig(datasets=[{"path": config["paths"][s], "type": "completion", "name": s} for s in sources], **keys)


def run_sft(config: dict, state: dict | None, steps: int | None):
    """resume.py's protocol for the SFT stream: `world` ranks in one process, global batch `batch`, one pass."""
    world = config.get("world", 1)
    keys = ("input_ids", "attention_mask", "labels") + (("position_ids",) if config.get("best_fit") else ())
    modules = loaded([StreamingSFTDataModule(sft_config(config), config["batch"] // world, rank=r, world_size=world,
                                             loop=False) for r in range(world)], state, config.get("ledger"))
    iters, out = [iter(m.train_dataloader()) for m in modules], []
    while steps is None or len(out) < steps:
        live = [b for b in (next(it, None) for it in iters) if b is not None]
        if not live:
            break
        width = max(b["input_ids"].shape[1] for b in live)  # each rank pads to its own longest sample
        out.append({k: np.concatenate([np.pad(b[k].numpy(), ((0, 0), (0, width - b[k].shape[1]))) for b in live])
                    for k in keys})
    return out, merge_stream_states([m.state_dict() for m in modules])


SCHEDULE = [{"samples": 0, "weights": [0.8, 0.2]}, {"samples": 24, "weights": [0.3, 0.7]},
            {"samples": 64, "weights": [0.6, 0.4]}]
CASES = {"mixture by tokens": {}, "schedule by samples": {"extra": {"streaming_mixing_schedule": SCHEDULE}},
         "best fit": {"best_fit": True}, "one entry": {"sources": ["quick"]}}


@pytest.mark.parametrize("case", list(CASES))
def test_the_global_batch_8_then_4_then_12_gives_the_straight_runs_samples_in_order(tmp_path, case):
    base = {"paths": entries(tmp_path), **CASES[case]}
    check_resume_chain(run_sft, batch_chain(base), rows=sft_rows)


@pytest.mark.parametrize("case", ["mixture by tokens", "best fit"])
def test_world_2_then_1_then_3_and_workers_2_then_0_lose_and_repeat_nothing(tmp_path, case):
    base = {"paths": entries(tmp_path), **CASES[case]}
    check_resume_chain(run_sft, topology_chain(base), exact=False, rows=sft_rows, source_of=partition_of)


def _by_partition(steps: list[dict]) -> dict[int, list[bytes]]:
    out: dict[int, list[bytes]] = defaultdict(list)
    for step in steps:
        for row in sft_rows(step):
            out[partition_of(row)].append(row)
    return out


def test_an_sft_mixture_may_gain_a_dataset_with_mixture_changes_allow(tmp_path):
    paths = entries(tmp_path)
    three = {"paths": paths, "batch": 4, "sources": ["quick", "essays", "extra"]}
    head, state = run_sft({"paths": paths, "batch": 8}, None, 4)
    with pytest.raises(StateError, match="set data.mixture_changes: allow"):
        StreamingSFTDataModule(sft_config(three), 4, loop=False).load_state_dict(state)
    tail, after = run_sft({**three, "extra": {"mixture_changes": "allow"}}, state, None)
    assert _by_partition(head + tail) == _by_partition(run_sft(three, None, None)[0])
    assert set(after["consumed"]["0"]) == {"quick", "essays", "extra"}
