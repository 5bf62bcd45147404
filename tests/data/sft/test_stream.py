"""Streaming SFT data: records from local files, collated and masked, resumed exactly with 0 and 2 workers."""

from __future__ import annotations

import json
import multiprocessing
from pathlib import Path

import pytest

from llm.data.sft.stream import StreamingSFTDataModule, record_source
from llm.training.core.data_config import DataConfig, DatasetEntry
from tests.resume import attach, check_resume, loaded, take_steps


def write_alpaca(path: Path, n: int = 120) -> Path:
    with open(path, "w") as f:
        for i in range(n):
            f.write(json.dumps({"instruction": f"Say {i}.", "input": "" if i % 3 else f"ctx {i}", "output": f"{i}!" * (i % 5 + 1)}) + "\n")
    return path


def make(config: dict) -> StreamingSFTDataModule:
    data = DataConfig(datasets=[DatasetEntry(path=config["path"], type="alpaca")], max_seq_len=256,
                      num_workers=config["workers"], sample_packing=config.get("packing", False))
    return StreamingSFTDataModule(data, batch_size=3, loop=False)


def run_sft(config: dict, state: dict | None, steps: int | None):
    (module,) = loaded([make(config)], state, config.get("ledger"))
    return take_steps(module.train_dataloader(), steps), module.state_dict()


@pytest.mark.parametrize("workers, packing", [(0, False), (2, False), (0, True)])
def test_exact_resume(tmp_path, workers, packing):
    path = write_alpaca(tmp_path / "a.jsonl")
    config = {"path": str(path), "workers": workers, "packing": packing}
    ref = check_resume(run_sft, config, stops=[0, 7, 25], fresh_process=False)
    # every record arrives once: its output (the only target text) decodes from the labels
    outputs = []
    for step in ref:
        for ids, labels in zip(step["input_ids"], step["labels"]):
            target = bytes(int(t) for t, lab in zip(ids, labels) if lab != -100 and t < 256).decode()
            outputs.extend(x for x in target.split("\x00") if x)
    want = sorted(f"{i}!" * (i % 5 + 1) for i in range(120))
    if not packing:
        assert sorted(outputs) == want


def test_records_are_whole_json_from_jsonl_and_parquet(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"instruction": ["a", "b"], "input": ["", "x"], "output": ["1", "2"]}), tmp_path / "t.parquet")
    for path in (write_alpaca(tmp_path / "a.jsonl", 2), tmp_path / "t.parquet"):
        source = record_source(DatasetEntry(path=str(path), type="alpaca"))
        records = [json.loads(t) for t in source.iter_texts()]
        assert len(records) == 2 and set(records[0]) == {"instruction", "input", "output"}


def test_a_hub_id_is_not_taken_for_a_local_path():
    source = record_source(DatasetEntry(path="tatsu-lab/alpaca", type="alpaca"))
    assert source.source_fingerprint()["dataset_name"] == "tatsu-lab/alpaca"  # lazy: nothing downloads


def write_chat(path: Path, n: int = 40) -> Path:
    with open(path, "w") as f:
        for i in range(n):
            f.write(json.dumps({"messages": [{"role": "user", "content": f"q{i}"},
                                             {"role": "assistant", "content": f"a{i}"}]}) + "\n")
    return path


def run_mixed(config: dict, state: dict | None, steps: int | None):
    multiprocessing.set_start_method("fork", force=True)
    data = DataConfig(datasets=[DatasetEntry(path=config["alpaca"], type="alpaca"),
                                DatasetEntry(path=config["chat"], type="chat")],
                      max_seq_len=256, num_workers=config["workers"],
                      streaming_dataset_mixing_strategy="weighted", streaming_mixing_weights=[0.7, 0.3])
    module = attach(StreamingSFTDataModule(data, batch_size=3, loop=False), config)
    if state is not None:
        module.load_state_dict(state)
    return take_steps(module.train_dataloader(), steps), module.state_dict()


@pytest.mark.parametrize("workers", [0, 2])
def test_a_mixture_of_formats_resumes_exactly(tmp_path, workers):
    config = {"alpaca": str(write_alpaca(tmp_path / "a.jsonl", 90)), "chat": str(write_chat(tmp_path / "c.jsonl")),
              "workers": workers}
    ref = check_resume(run_mixed, config, stops=[5, 20], fresh_process=False)
    targets = [bytes(int(t) for t, lab in zip(ids, labels) if lab != -100 and t < 256).decode()
               for step in ref for ids, labels in zip(step["input_ids"], step["labels"])]
    chats = [t for t in targets if t.startswith("<|assistant|>")]
    assert len(targets) == 130 and len(chats) == 40  # every record once, each in its own format


def test_records_left_without_a_trainable_token_are_skipped_and_the_stream_goes_on(tmp_path):
    from llm.data.sft.collator import UntrainableSampleWarning

    path = tmp_path / "mixed.jsonl"  # the odd records' instruction pushes the answer past 200 tokens
    path.write_text("".join(json.dumps({"instruction": "x" * (60 * (i % 2)), "input": "", "output": f"{i}"}) + "\n"
                            for i in range(10)))
    data = DataConfig(datasets=[DatasetEntry(path=str(path), type="alpaca")], max_seq_len=200)
    module = StreamingSFTDataModule(data, batch_size=2, loop=False)
    with pytest.warns(UntrainableSampleWarning, match="sequence_len=200"):
        batches = list(module.train_dataloader())
    targets = [bytes(int(t) for t, lab in zip(ids, labels) if lab != -100 and t < 256).decode()
               for b in batches for ids, labels in zip(b["input_ids"], b["labels"])]
    assert targets == ["0", "2", "4", "6", "8"] and module.collator.skipped == 5


@pytest.mark.parametrize("path, local", [("data/x.jsonl", True), ("./x", True), ("/a/b", True), ("~/x.csv", True),
                                         ("tatsu-lab/alpaca", False), ("HuggingFaceH4/ultrachat_200k", False)])
def test_what_looks_like_a_local_path(path, local):
    from llm.data.sft.stream import looks_local

    assert looks_local(path) is local
