"""The text module and the SFT stream keep the one stage contract: state / check / restore, a refused state changes nothing."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from llm.data.dedup import publish_seen_hashes
from llm.data.sft.stream import StreamingSFTDataModule
from llm.data.stage import Stage, StateError
from llm.data.text.stream import StreamingTextDataModule
from llm.training.core.config import DataConfig
from tests.resume import assert_same_steps, take_steps


def _corpus(tmp_path: Path, n: int = 60) -> Path:
    path = tmp_path / "corpus.txt"
    path.write_text("".join(f"{i} alpha beta gamma {i * 7} delta\n" for i in range(n)))
    return path


def _module(path: Path, **extra: object) -> StreamingTextDataModule:
    return StreamingTextDataModule(DataConfig(dataset_path=str(path), max_seq_len=8, **extra), 2, loop=False)


def test_the_text_module_and_the_sft_stream_are_stages(tmp_path):
    records = tmp_path / "sft.jsonl"
    records.write_text(json.dumps({"instruction": "say hi", "output": "hi"}) + "\n")
    sft = StreamingSFTDataModule(DataConfig(datasets=[{"path": str(records), "type": "alpaca"}], max_seq_len=32),
                                 batch_size=1, loop=False)
    assert isinstance(_module(_corpus(tmp_path)), Stage) and isinstance(sft, Stage)
    assert sft.state_dict() == sft.state()


def _bad_states(good: dict) -> list[dict]:
    key = next(iter(good["partitions"]))
    cursor = good["partitions"][key]
    return [
        {**good, "partitions": {key: {**cursor, "records": "many"}}},
        {**good, "partitions": {key: {**cursor, "offset": -3}}},
        {**good, "partitions": {key: {**cursor, "token_buffer": "abc"}}},
        {**good, "partitions": {key: 5}},
        {**good, "version": 99},
        {k: v for k, v in good.items() if k != "partitions"},
        {**good, "partitions": {**good["partitions"], "00000:gone.txt[0:64]": cursor}},
    ]


@pytest.mark.parametrize("which", range(7))
def test_a_refused_state_changes_nothing(tmp_path, which):
    path = _corpus(tmp_path)
    saved = _module(path)
    take_steps(saved.train_dataloader(), 3)
    bad = _bad_states(saved.state_dict())[which]
    module = _module(path)
    with pytest.raises(StateError):
        module.load_state_dict(bad)
    assert_same_steps(take_steps(module.train_dataloader()), take_steps(_module(path).train_dataloader()),
                      "after a refused state")


def test_a_cursor_for_a_partition_that_does_not_exist_is_refused_naming_it(tmp_path):
    """Issue 34: such a cursor resumed silently (and its records were read again from the start)."""
    path = _corpus(tmp_path)
    saved = _module(path)
    take_steps(saved.train_dataloader(), 3)
    good = saved.state_dict()
    renamed = {k.replace("corpus.txt", "other.txt"): c for k, c in good["partitions"].items()}
    with pytest.raises(StateError, match=r"data state partition '00000:other.txt\[0:\d+\]' is not a partition of "
                                         r"this source \(its keys look like '00000:corpus.txt\[0:\d+\]'\); resume"):
        _module(path).load_state_dict({**good, "partitions": renamed})


def _dedup_checkpoint(tmp_path: Path) -> tuple[Path, Path, dict, dict]:
    """A deduplicating stream that wrote its seen-hashes file, 3 steps in: corpus, file, its options, its checkpoint."""
    path, seen = _corpus(tmp_path), tmp_path / "seen.bin"
    extra = {"data_source": "dedup_local", "seen_hashes_path": str(seen), "write_seen_hashes": True}
    saved = _module(path, **extra)
    take_steps(saved.train_dataloader(), 3)
    return path, seen, extra, saved.checkpoint_state()


def test_a_state_counting_more_seen_hashes_than_the_file_holds_is_refused_whole(tmp_path):
    path, seen, extra, state = _dedup_checkpoint(tmp_path)
    publish_seen_hashes(state)  # the checkpoint landed and its digests are in the file
    state["seen_hashes"]["count"] += 1000
    state["seen_hashes"]["base"] += 1000  # a state that says the file held 1000 more before it
    module, fresh = _module(path, **extra), _module(path, **extra)
    with pytest.raises(StateError, match=rf"seen-hashes file {seen} holds \d+ digests but the data state expects"):
        module.load_state_dict(state)
    assert_same_steps(take_steps(module.train_dataloader()), take_steps(fresh.train_dataloader()), "after a refused state")


def _sft(records: Path) -> StreamingSFTDataModule:
    data = DataConfig(datasets=[{"path": str(records), "type": "alpaca"}], max_seq_len=32)
    return data.sft_stream(seed=3).build(batch_size=2, loop=False)


def test_a_refused_state_changes_nothing_in_the_sft_stream(tmp_path):
    records = tmp_path / "sft.jsonl"
    records.write_text("".join(json.dumps({"instruction": f"say {i}", "output": f"{i}"}) + "\n" for i in range(20)))
    saved = _sft(records)
    take_steps(saved.train_dataloader(), 2)
    good = saved.state_dict()
    key = next(iter(good["partitions"]))
    module = _sft(records)
    with pytest.raises(StateError, match=rf"partition {re.escape(repr(key))} has records=.2."):
        module.load_state_dict({**good, "partitions": {key: {**good["partitions"][key], "records": "2"}}})
    assert_same_steps(take_steps(module.train_dataloader()), take_steps(_sft(records).train_dataloader()), "sft")
    module.load_state_dict(good)  # the good state still resumes where the first run stopped
    rest = take_steps(module.train_dataloader())
    assert_same_steps(rest, take_steps(_sft(records).train_dataloader())[2:], "sft resumed")


def test_a_seen_hashes_entry_whose_count_is_not_base_plus_its_digests_is_refused(tmp_path):
    path, seen, extra, state = _dedup_checkpoint(tmp_path)
    state["seen_hashes"]["count"] += 1000
    with pytest.raises(StateError, match="seen_hashes"):
        _module(path, **extra).load_state_dict(state)
