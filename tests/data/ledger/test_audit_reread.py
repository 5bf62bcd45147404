"""Audit reads SFT, Hugging Face and object-store records again the way the stream read them: SFT rows are rebuilt
from their records with the run's prompt format (best fit's packed rows too), Hugging Face parquet records are
re-read through the HF input; a straight run audits clean, an edited record fails the audit naming it, and a
source that is gone is said to be not re-checked."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from llm.cli.data import main as llm_data
from llm.data.ledger.reader import read_ledger
from llm.data.sft.stream import StreamingSFTDataModule
from llm.data.text.stream import StreamingTextDataModule
from llm.training.core.data_config import DataConfig


def audit_cli(ledger: Path, capsys: pytest.CaptureFixture, *more: str) -> tuple[int, str]:
    code = llm_data(["audit", str(ledger), *more])
    return code, capsys.readouterr().out


def records(n: int = 60) -> list[dict]:
    return [{"instruction": f"say {i} " * (1 + i % 4), "output": f"{i} ok " * (1 + i % 3)} for i in range(n)]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def train(module: StreamingTextDataModule) -> None:
    for _ in module.train_dataloader():
        pass
    module.state_dict()  # commits the ledger


SFT_PACKING = {"plain": {}, "sample_packing": {"sample_packing": True},
               "best_fit": {"sample_packing": True, "packing": "best_fit", "packing_buffer": 4}}


@pytest.mark.parametrize("packing", list(SFT_PACKING))
def test_sft_rows_are_rebuilt_and_an_edited_record_is_named(tmp_path: Path, packing: str,
                                                            capsys: pytest.CaptureFixture) -> None:
    rows = records()
    path, ledger = write_jsonl(tmp_path / "sft.jsonl", rows), tmp_path / "ledger"
    config = DataConfig(datasets=[{"path": str(path), "type": "alpaca"}], max_seq_len=512, **SFT_PACKING[packing])
    train(StreamingSFTDataModule(config, 3, loop=False, ledger=ledger))
    assert read_ledger(ledger).sources[0]["sft"]["entry"]["type"] == "alpaca"
    code, out = audit_cli(ledger, capsys)
    assert code == 0 and "60 documents trained exactly once" in out and "not re-checked" not in out, out

    # a record edited in place at the same length: its tokens differ, so its row no longer matches and the
    # row's records are named (the file is named as changed too)
    rows[17]["output"] = rows[17]["output"].replace("ok", "OK")
    write_jsonl(path, rows)
    code, out = audit_cli(ledger, capsys)
    assert code == 1 and "sft changed since the run: sft.jsonl changed" in out, out
    assert "trained rows no longer match the files on disk" in out and f"{path}:18" in out, out

    # a record edited to another length: its sample is named by file and line, the records after it still match
    rows[17]["output"] = "a much shorter answer"
    write_jsonl(path, rows)
    code, out = audit_cli(ledger, capsys)
    assert code == 1, out
    assert f"problem: sft pass 0 {path}:18 changed since the run: it now makes a sample of " in out, out
    assert "1 SFT record changed since the run" in out, out


def test_hf_parquet_records_are_reread_and_a_changed_record_named(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    texts = [f"doc {i} alpha beta " * (1 + i % 5) for i in range(200)]
    data, ledger = tmp_path / "hf.parquet", tmp_path / "ledger"
    pq.write_table(pa.table({"text": texts}), data, row_group_size=50)
    config = DataConfig(data_source="hf", dataset_name="parquet", dataset_path=str(data), max_seq_len=16)
    train(StreamingTextDataModule(config, 4, loop=False, ledger=ledger))
    assert read_ledger(ledger).sources[0]["kind"] == "hf"
    code, out = audit_cli(ledger, capsys)
    assert code == 0 and "200 documents trained exactly once" in out and "not re-checked" not in out, out

    texts[42] = "doc 42 gamma gamma"  # one record edited: the HF fingerprint cannot see it, the checksums do
    pq.write_table(pa.table({"text": texts}), data, row_group_size=50)
    code, out = audit_cli(ledger, capsys)
    assert code == 1 and "trained rows no longer match the files on disk" in out and " record 43" in out, out

    data.unlink()  # gone: counted, and said to be not re-checked (not OK silently)
    code, out = audit_cli(ledger, capsys)
    assert "not re-checked: hf cannot be read again (" in out, out
    assert "(1 source counted but not re-checked against its data)" in out, out
    code, out = audit_cli(ledger, capsys, "--no-verify")
    assert code == 0 and "not re-checked" not in out, out
