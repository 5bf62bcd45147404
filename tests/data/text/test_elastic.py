"""Text streams resumed with another global batch size, world size and num_workers (issue 35), in fresh processes.

Every file of the corpora is one partition (under 1 KiB) written with its own two letters,
so each row says which partition it came from (rows never mix partitions). A chain of
resumes (`tests/resume.py`, `check_resume_chain`) must give the straight run's rows: in
the same order on one rank without workers (a batch change only regroups them), else the
same rows, nothing lost or repeated, each partition's in the straight run's order.
"""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest

from llm.data.stage import StateError
from llm.data.text.stream import StreamingTextDataModule, merge_stream_states
from llm.training.core.data_config import DataConfig
from tests.resume import check_resume_chain, loaded, step_ranks

EOS = 256  # the simple tokenizer's
L = 16
LETTERS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"


def write_source(folder: Path, name: str, first_file: int, files: int = 4, lengths: tuple[int, int] = (5, 30)) -> str:
    """`files` files of ~900 bytes, file k written with letters 2k and 2k+1 of LETTERS; the folder's glob."""
    rng = random.Random(first_file)
    root = folder / name
    root.mkdir(parents=True, exist_ok=True)
    for k in range(first_file, first_file + files):
        alphabet, lines, size = LETTERS[2 * k: 2 * k + 2], [], 0
        while size < 850:
            lines.append("".join(rng.choice(alphabet) for _ in range(rng.randint(*lengths))))
            size += len(lines[-1]) + 1
        (root / f"{k:02d}.txt").write_text("\n".join(lines) + "\n")
    return str(root / "*.txt")


def corpora(folder: Path) -> dict[str, str]:
    """Three sources: `short` (files 0-3, short documents), `long` (4-7, longer ones), `extra` (8-9)."""
    return {"short": write_source(folder, "short", 0), "long": write_source(folder, "long", 4, lengths=(40, 120)),
            "extra": write_source(folder, "extra", 8, files=2)}


def partition_of(row: bytes) -> int:
    """The file a row came from: its first token's letter pair."""
    ids = np.frombuffer(row, dtype=np.int64)
    first = int(ids[ids != EOS][0])
    return LETTERS.index(chr(first)) // 2


def rows(step: dict) -> list[bytes]:
    """A step's rows, each its input_ids then labels (and position_ids with best fit) as int64 bytes."""
    keys = [k for k in ("input_ids", "labels", "position_ids") if k in step]
    return [b"".join(np.ascontiguousarray(step[k][i], dtype=np.int64).tobytes() for k in keys)
            for i in range(len(step["input_ids"]))]


def data_config(config: dict) -> DataConfig:
    sources = config.get("sources", ["short", "long"])
    keys: dict = {"max_seq_len": L, "num_workers": config.get("workers", 0), **config.get("extra", {})}
    if config.get("packing"):
        keys["packing"] = config["packing"]
    if len(sources) == 1:
        return DataConfig(dataset_path=config["paths"][sources[0]], **keys)
    entries = [{"dataset_path": config["paths"][s], "name": config.get("names", {}).get(s, s)} for s in sources]
    keys.setdefault("streaming_dataset_mixing_strategy", "weighted")
    if "streaming_mixing_schedule" not in keys:
        keys.setdefault("streaming_mixing_weights", [0.6, 0.4, 0.0][: len(sources)] if len(sources) == 2
                        else [0.4, 0.3, 0.3])
    return DataConfig(datasets=entries, **keys)


def run(config: dict, state: dict | None, steps: int | None):
    """resume.py's protocol: `world` ranks in one process, global batch `batch`, to the end of one pass."""
    world = config.get("world", 1)
    data = data_config(config)
    keys = ("input_ids", "labels", "position_ids") if config.get("packing") == "best_fit" else ("input_ids", "labels")
    modules = loaded([StreamingTextDataModule(data, config["batch"] // world, rank=r, world_size=world, loop=False)
                      for r in range(world)], state, config.get("ledger"))
    out = step_ranks(modules, steps, keys)
    return out, merge_stream_states([m.state_dict() for m in modules])


def batch_chain(base: dict) -> list[tuple[dict, int | None]]:
    """Global batch 8 for 6 steps, 4 for 10, then 12 to the end: boundaries at 48, 88, 100, 112, ..."""
    return [({**base, "batch": 8}, 6), ({**base, "batch": 4}, 10), ({**base, "batch": 12}, None)]


def topology_chain(base: dict) -> list[tuple[dict, int | None]]:
    """World 2 with 2 workers (global 8), world 1 without workers (global 4), world 3 with 2 workers (global 12)."""
    return [({**base, "batch": 8, "world": 2, "workers": 2}, 5), ({**base, "batch": 4, "world": 1, "workers": 0}, 9),
            ({**base, "batch": 12, "world": 3, "workers": 2}, None)]


# every segment of these starts on a batch boundary of the straight run (global 8) and of batch_chain
SAMPLES = [{"samples": 0, "weights": [0.9, 0.1]}, {"samples": 24, "weights": [0.3, 0.7]},
           {"samples": 64, "weights": [0.7, 0.3]}, {"samples": 112, "weights": [0.2, 0.8]}]
TOKENS = [{"tokens": p["samples"] * L, "weights": p["weights"]} for p in SAMPLES]
STEPS = [{"step": 0, "weights": [0.9, 0.1]}, {"step": 3, "weights": [0.3, 0.7]}]  # reached before the first stop

CASES = {
    "one source": {"sources": ["short"]},
    "records": {},
    "tokens": {"extra": {"streaming_mixing_unit": "tokens"}},
    "schedule by step": {"extra": {"streaming_mixing_schedule": STEPS}},
    "schedule by samples": {"extra": {"streaming_mixing_schedule": SAMPLES}},
    "schedule by tokens, unit tokens": {"extra": {"streaming_mixing_schedule": TOKENS, "streaming_mixing_unit": "tokens"}},
    "schedule by tokens, unit records": {"extra": {"streaming_mixing_schedule": TOKENS}},
    "best fit": {"packing": "best_fit", "extra": {"streaming_mixing_unit": "tokens"}},
}


@pytest.mark.parametrize("case", list(CASES))
def test_the_global_batch_8_then_4_then_12_gives_the_straight_runs_rows_in_order(tmp_path, case):
    base = {"paths": corpora(tmp_path), **CASES[case]}
    check_resume_chain(run, batch_chain(base), rows=rows)


@pytest.mark.parametrize("case", ["records", "tokens", "schedule by step", "schedule by samples",
                                  "schedule by tokens, unit tokens", "best fit"])
def test_world_2_then_1_then_3_and_workers_2_then_0_lose_and_repeat_nothing(tmp_path, case):
    base = {"paths": corpora(tmp_path), **CASES[case]}
    check_resume_chain(run, topology_chain(base), exact=False, rows=rows, source_of=partition_of)


def test_a_step_point_not_reached_yet_lands_at_the_new_batchs_steps(tmp_path):
    """A step point is a training step until reached: after a batch change it falls elsewhere in the rows,
    and still nothing is lost or repeated, each partition in order."""
    later = [STEPS[0], {"step": 12, "weights": [0.3, 0.7]}]
    base = {"paths": corpora(tmp_path), "extra": {"streaming_mixing_schedule": later, "streaming_mixing_unit": "tokens"}}
    check_resume_chain(run, batch_chain(base), exact=False, rows=rows, source_of=partition_of)
    _, state = run({**base, "batch": 4}, None, 14)
    assert state["mix"]["reached"] == [[12, 12, 48, 48 * L]]  # kept as samples and tokens from here on


def test_a_step_schedule_continues_by_samples_where_its_points_took_effect(tmp_path):
    """Saved under a schedule by step at global batch 8, resumed at 4 under the same points by samples."""
    paths = corpora(tmp_path)
    by_step = {"paths": paths, "extra": {"streaming_mixing_schedule": STEPS}}
    by_samples = {"paths": paths, "extra": {"streaming_mixing_schedule": [
        {"samples": 0, "weights": [0.9, 0.1]}, {"samples": 24, "weights": [0.3, 0.7]}]}}
    # the segment served goes on where it is (its shares counted from samples 24), so the rows are the straight run's
    check_resume_chain(run, [({**by_step, "batch": 8}, 6), ({**by_samples, "batch": 4}, None)], rows=rows,
                       fresh_process=False)
    _, state = run({**by_step, "batch": 8}, None, 6)
    moved = [{"samples": 0, "weights": [0.9, 0.1]}, {"samples": 32, "weights": [0.3, 0.7]}]
    with pytest.raises(StateError, match=r"^streaming_mixing_schedule gives other weights at samples 24 than the run "
                                         r"that saved this state, which has read to samples 48; change the schedule "
                                         r"only from samples 48 on$"):
        StreamingTextDataModule(data_config({"paths": paths, "extra": {"streaming_mixing_schedule": moved}}),
                                4, loop=False).load_state_dict(state)


def test_a_version_2_state_that_switched_by_step_cannot_resume_under_a_schedule_by_samples(tmp_path):
    paths = corpora(tmp_path)
    _, state = run({"paths": paths, "batch": 8, "extra": {"streaming_mixing_schedule": STEPS}}, None, 6)
    old = {k: v for k, v in state.items() if k not in ("samples", "tokens", "sources")}
    old["version"] = 2
    old["mix"] = {k: v for k, v in state["mix"].items() if k != "reached"}
    module = StreamingTextDataModule(data_config({"paths": paths, "extra": {"streaming_mixing_schedule": SAMPLES}}),
                                     4, loop=False)
    with pytest.raises(StateError, match=r"^the data state \(version 2\) keeps its mixture's change points as steps, "
                                         r"without the samples where they took effect, so streaming_mixing_schedule "
                                         r"by samples cannot be checked against what it served; resume it under its "
                                         r"schedule by step \(at any global batch size\), then save again$"):
        module.load_state_dict(old)
    # under its schedule by step it resumes at any batch, its samples counted from the rows it handed over
    resumed = StreamingTextDataModule(data_config({"paths": paths, "extra": {"streaming_mixing_schedule": STEPS}}),
                                      4, loop=False)
    resumed.load_state_dict(old)
    assert (resumed.progress.step, resumed.progress.samples) == (6, 48)


def test_a_past_point_with_unchanged_weights_is_refused_not_allowed_to_move_the_shares(tmp_path):
    """It passed the old check, then started a new segment at the resume and moved every later draw."""
    paths = corpora(tmp_path)
    switch = [{"step": 0, "weights": [0.9, 0.1]}, {"step": 20, "weights": [0.3, 0.7]}]
    _, state = run({"paths": paths, "batch": 4, "extra": {"streaming_mixing_schedule": switch}}, None, 15)
    added = [switch[0], {"step": 10, "weights": [0.9, 0.1]}, switch[1]]
    module = StreamingTextDataModule(data_config({"paths": paths, "extra": {"streaming_mixing_schedule": added}}),
                                     4, loop=False)
    with pytest.raises(StateError, match=r"^streaming_mixing_schedule has a change point at step 10 where the run "
                                         r"that saved this state, which has read to step 15, had none; a change point "
                                         r"in the past moves what was read"):
        module.load_state_dict(state)


@pytest.mark.parametrize("schedule, message", [
    ([{"step": 0, "samples": 0, "weights": [0.5, 0.5]}],
     r"streaming_mixing_schedule\[0\] gives step and samples; a point gives exactly one of step, samples and tokens"),
    ([{"samples": 0, "weights": [0.5, 0.5]}, {"tokens": 64, "weights": [0.2, 0.8]}],
     r"streaming_mixing_schedule\[1\] is by tokens but streaming_mixing_schedule\[0\] is by samples"),
])
def test_a_schedule_point_with_two_positions_or_two_kinds_is_one_sentence_naming_it(tmp_path, schedule, message):
    with pytest.raises(ValueError, match=message):
        data_config({"paths": corpora(tmp_path), "extra": {"streaming_mixing_schedule": schedule}})
