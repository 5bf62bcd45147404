"""`llm-data audit` reads a text stream's records in object storage again (the loopback S3 server, credentials from
the environment as the run had them): a straight run audits clean, an object replaced with one record edited is
named with the record, and without working credentials the source is said to be not re-checked."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llm.cli.data import main as llm_data
from llm.data.ledger.reader import read_ledger
from llm.data.storage.objects import open_objects
from llm.data.text.stream import StreamingTextDataModule
from llm.training.core.data_config import DataConfig


def test_s3_text_records_are_reread_by_audit(s3_env, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture) -> None:
    url = s3_env.url()
    lines = [json.dumps({"text": f"doc {i} alpha beta gamma " * (1 + i % 5)}) for i in range(150)]
    objects = open_objects(url, s3_env.options())
    objects.put("corpus.jsonl", ("\n".join(lines) + "\n").encode())
    ledger = tmp_path / "ledger"
    module = StreamingTextDataModule(DataConfig(dataset_path=f"{url}/corpus.jsonl", max_seq_len=16), 4, loop=False,
                                     ledger=ledger)
    for _ in module.train_dataloader():
        pass
    module.state_dict()
    assert read_ledger(ledger).sources[0]["kind"] == "object"
    assert llm_data(["audit", str(ledger)]) == 0
    out = capsys.readouterr().out
    assert "150 documents trained exactly once" in out and "not re-checked" not in out, out

    lines[60] = lines[60].replace("alpha", "ALPHA")  # one record edited in place, the object replaced
    objects.put("corpus.jsonl", ("\n".join(lines) + "\n").encode())
    assert llm_data(["audit", str(ledger)]) == 1
    out = capsys.readouterr().out
    assert "problem: corpus changed since the run: corpus.jsonl changed" in out, out
    offset = len(("\n".join(lines[:61]) + "\n").encode())  # the record: the byte offset just after it
    assert "trained rows no longer match the files on disk" in out and f"{url}/corpus.jsonl record {offset}" in out, out

    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong")  # no working credentials: counted, not re-checked
    code = llm_data(["audit", str(ledger)])
    out = capsys.readouterr().out
    assert "not re-checked: corpus cannot be read again (" in out and "not re-checked against its data" in out, out
    assert code == 0  # nothing repeated or lost, and said plainly that the records were not read again
