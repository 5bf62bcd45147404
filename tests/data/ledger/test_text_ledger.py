"""The text and SFT streams' ledger, end to end: resume chains over workers, ranks, batch sizes, a scheduled
mixture, dedup and SFT best fit audit clean through `llm-data audit`; a packed row's pieces name every document
in it; planted faults (a replayed batch, a skipped batch, a hand-edited state, an older checkpoint) are named."""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from llm.cli.data import main as llm_data
from llm.data.dedup import publish_seen_hashes
from llm.data.ledger.reader import read_ledger
from llm.data.sft.stream import StreamingSFTDataModule
from llm.data.text.ledger_audit import TextAuditor, audit_text
from llm.data.text.stream import StreamingTextDataModule, merge_stream_states
from llm.data.tokenize.documents import encode_each
from llm.training.core.data_config import DataConfig
from tests.data.text.test_token_mixing import write_corpora
from tests.resume import in_fresh_process, loaded, step_ranks

SWITCH = [{"step": 0, "weights": [0.9, 0.1]}, {"step": 6, "weights": [0.2, 0.8]}]


def corpus(folder: Path, n: int = 400, dups: bool = False) -> Path:
    path = folder / "corpus.txt"
    lines = [f"{i} alpha beta gamma {i * 7} delta " * (1 + i % 6) for i in range(n)]
    if dups:  # every fifth document repeats an earlier one
        lines = [lines[i - 3] if i % 5 == 4 else line for i, line in enumerate(lines)]
    path.write_text("".join(f"{line}\n" for line in lines))
    return path


def sft_records(folder: Path, n: int = 120) -> Path:
    path = folder / "sft.jsonl"
    path.write_text("".join(json.dumps({"instruction": f"say {i} " * (1 + i % 4), "output": f"{i} ok " * (1 + i % 3)})
                            + "\n" for i in range(n)))
    return path


def data_config(config: dict) -> DataConfig:
    extra = dict(config.get("extra", {}))
    if config["kind"] == "sft":
        return DataConfig(datasets=[{"path": config["path"], "type": "alpaca"}], max_seq_len=512, packing_buffer=4,
                          num_workers=config.get("workers", 0), sample_packing=True, packing="best_fit", **extra)
    if config["kind"] == "mix":
        return DataConfig(datasets=[{"dataset_path": p} for p in config["paths"]], max_seq_len=32,
                          num_workers=config.get("workers", 0), streaming_dataset_mixing_strategy="weighted",
                          streaming_mixing_unit="tokens", streaming_mixing_schedule=SWITCH)
    return DataConfig(dataset_path=config["path"], max_seq_len=16, num_workers=config.get("workers", 0), **extra)


def run(config: dict, state: dict | None, steps: int | None) -> tuple[list[dict], dict]:
    """resume.py's protocol on `world` simulated ranks, each with the ledger; the ranks' states merged."""
    world = config.get("world", 1)
    kind = StreamingSFTDataModule if config["kind"] == "sft" else StreamingTextDataModule
    modules = loaded([kind(data_config(config), config["batch"] // world, rank=r, world_size=world, loop=False,
                           steps_per_epoch=config.get("steps"), ledger=config["ledger"]) for r in range(world)], state)
    out = step_ranks(modules, steps)
    if config.get("dedup"):
        states = [m.checkpoint_state() for m in modules]
        publish_seen_hashes(states[0])
    else:
        states = [m.state_dict() for m in modules]
    return out, merge_stream_states(states)


def chain(links: list[tuple[dict, int | None]]) -> tuple[list[dict], dict]:
    """Each link in a fresh process, resumed from the state the previous one saved."""
    state, out = None, []
    for config, steps in links:
        got, state = in_fresh_process(run, config, state, steps)
        state = pickle.loads(pickle.dumps(state))
        out += got
    return out, state


def audit_cli(ledger: Path, capsys: pytest.CaptureFixture, *more: str) -> tuple[int, str]:
    code = llm_data(["audit", str(ledger), *more])
    return code, capsys.readouterr().out


def text_of(path: Path, after: int) -> str:
    """The line of a plain text file that ends at byte offset `after` (what the ledger's record number is)."""
    data = path.read_bytes()
    return data[data.rfind(b"\n", 0, after - 1) + 1:after].decode().strip()


@pytest.mark.parametrize("workers", [0, 2])
def test_a_chain_over_workers_ranks_and_batch_sizes_audits_clean(tmp_path: Path, workers: int,
                                                                 capsys: pytest.CaptureFixture) -> None:
    path, ledger = corpus(tmp_path), tmp_path / "ledger"
    base = {"kind": "text", "path": str(path), "ledger": str(ledger)}
    straight_ledger = tmp_path / "straight"
    straight, _ = in_fresh_process(run, {**base, "ledger": str(straight_ledger), "batch": 4, "workers": workers}, None, None)
    code, out = audit_cli(straight_ledger, capsys)
    assert code == 0 and "audit: OK" in out and "400 documents trained exactly once" in out, out
    got, _ = chain([({**base, "batch": 4, "workers": workers}, 5),
                    ({**base, "batch": 4, "world": 2, "workers": 2 - workers}, 6),
                    ({**base, "batch": 6, "workers": workers}, None)])
    code, out = audit_cli(ledger, capsys)
    assert code == 0 and "400 documents trained exactly once" in out, out
    read = read_ledger(ledger)
    assert sorted(read.markers) == [1, 2] and sorted(set(read.ranks.tolist())) == [0, 1]
    assert read.markers[1]["topology"]["world_size"] == 2
    assert len(read.rows) == sum(len(s["input_ids"]) for s in got)


def _documents_hold_the_rows(module: StreamingTextDataModule, ledger: Path, path: Path, steps: list[dict]) -> None:
    """Every row's input_ids are exactly its pieces' token ranges of the documents the ledger names."""
    read = read_ledger(ledger)
    eos = module.tokenizer.eos_id
    rows = [row for step in steps for row in step["input_ids"]]
    assert len(rows) == len(read.rows)
    for r, row in enumerate(rows):
        mine = read.pieces[read.pieces["row_ref"] == r]
        assert len(mine)
        texts = [text_of(path, int(p["item"])) for p in mine]
        ids = encode_each(module.tokenizer, texts)
        held = np.concatenate([np.append(d, eos)[int(p["start"]):int(p["end"])] for d, p in zip(ids, mine)])
        assert np.array_equal(row[:len(held)], held), f"row {r}"
        assert np.all(row[len(held):] == eos)  # the rest is padding


@pytest.mark.parametrize("packing", ["greedy", "best_fit"])
def test_a_packed_rows_pieces_name_every_document_in_it(tmp_path: Path, packing: str) -> None:
    path, ledger = corpus(tmp_path, 120), tmp_path / "ledger"
    module = StreamingTextDataModule(DataConfig(dataset_path=str(path), max_seq_len=16, packing=packing), 4,
                                     loop=False, ledger=ledger)
    steps = [{k: v.numpy() for k, v in b.items()} for b in module.train_dataloader()]
    module.state_dict()
    _documents_hold_the_rows(module, ledger, path, steps)
    read = read_ledger(ledger)
    assert max(np.bincount(read.pieces["row_ref"])) > 1  # some rows hold several documents
    assert audit_text(read, TextAuditor(read.sources)).ok  # every row rebuilt from the files: the same checksum
    read.rows["crc"][5] ^= 1  # one row's tokens differ from what the files hold now
    report = audit_text(read, TextAuditor(read.sources))
    assert not report.ok and "1 of " in report.problems[0] and "no longer match the files on disk" in report.problems[0]


@pytest.mark.parametrize("packing", ["greedy", "best_fit"])
def test_rows_resumed_mid_document_still_name_what_they_hold(tmp_path: Path, packing: str) -> None:
    """The token buffer and open blocks a cursor carries keep their documents (ledger_buffer, ledger_blocks)."""
    path, ledger = corpus(tmp_path, 120), tmp_path / "ledger"
    base = {"kind": "text", "path": str(path), "ledger": str(ledger), "extra": {"packing": packing}}
    steps = []
    state = None
    for config, n in (({**base, "batch": 4}, 5), ({**base, "batch": 3, "workers": 2}, 7), ({**base, "batch": 5}, None)):
        got, state = run(config, state, n)
        steps += got
    module = StreamingTextDataModule(data_config(base), 4, loop=False)
    _documents_hold_the_rows(module, ledger, path, steps)
    assert state["partitions"] and all("ledger_buffer" in c or "ledger_blocks" in c for c in state["partitions"].values())


@pytest.mark.parametrize("packing", ["greedy", "best_fit"])
def test_a_run_stopped_mid_pass_audits_clean(tmp_path: Path, packing: str, capsys: pytest.CaptureFixture) -> None:
    """Records a packer holds when the run stops (token buffer, open blocks, a long document half cut) are in
    flight, named in the last segment: not missing."""
    path, ledger = corpus(tmp_path, 120), tmp_path / "ledger"
    base = {"kind": "text", "path": str(path), "ledger": str(ledger), "extra": {"packing": packing, "packing_buffer": 4}}
    _, state = run({**base, "batch": 4}, None, 9)
    _, state = run({**base, "batch": 3, "workers": 2}, state, 5)
    code, out = audit_cli(ledger, capsys)
    assert code == 0, out
    assert read_ledger(ledger).last_headers[0]["in_flight"]


def test_a_scheduled_mixture_resumed_at_another_global_batch_audits_clean(tmp_path: Path,
                                                                          capsys: pytest.CaptureFixture) -> None:
    ledger = tmp_path / "ledger"
    base = {"kind": "mix", "paths": write_corpora(tmp_path / "data", 300, 20), "ledger": str(ledger), "steps": 30}
    chain([({**base, "batch": 4}, 4), ({**base, "batch": 6, "world": 2, "workers": 2}, 5), ({**base, "batch": 2}, None)])
    code, out = audit_cli(ledger, capsys)
    assert code == 0, out
    assert "source short: " in out and "(weight 0.9000)" in out and "source long: " in out


def test_text_with_dedup_audits_clean_counting_dropped_duplicates(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    path, ledger = corpus(tmp_path, 200, dups=True), tmp_path / "ledger"
    base = {"kind": "text", "path": str(path), "ledger": str(ledger), "dedup": True,
            "extra": {"data_source": "dedup_local", "seen_hashes_path": str(tmp_path / "seen.bin"),
                      "write_seen_hashes": True}}
    chain([({**base, "batch": 4}, 5), ({**base, "batch": 4, "world": 2, "workers": 2}, 4), ({**base, "batch": 2}, None)])
    code, out = audit_cli(ledger, capsys)
    assert code == 0, out
    assert "dropped: 40 records read and not trained (duplicates, or nothing to train on), accounted for" in out and "160 documents trained exactly once" in out


def test_sft_with_best_fit_packing_audits_clean(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    path, ledger = sft_records(tmp_path), tmp_path / "ledger"
    base = {"kind": "sft", "path": str(path), "ledger": str(ledger)}
    chain([({**base, "batch": 2}, 3), ({**base, "batch": 3, "workers": 2}, 3), ({**base, "batch": 4}, None)])
    code, out = audit_cli(ledger, capsys)
    assert code == 0 and "120 documents trained exactly once" in out, out
    read = read_ledger(ledger)
    assert max(np.bincount(read.pieces["row_ref"])) > 1  # rows packed with several samples
    assert read.names == [str(path)] and read.sources[0]["type"] == "text"


def test_an_sft_rows_pieces_are_its_samples(tmp_path: Path) -> None:
    path, ledger = sft_records(tmp_path, 40), tmp_path / "ledger"
    module = StreamingSFTDataModule(data_config({"kind": "sft", "path": str(path)}), 3, loop=False, ledger=ledger)
    rows = [row for b in module.train_dataloader() for row in b["input_ids"].numpy()]
    module.state_dict()
    read = read_ledger(ledger)
    assert len(rows) == len(read.rows) and len(read.pieces) == 40
    for r, row in enumerate(rows):
        mine = read.pieces[read.pieces["row_ref"] == r]
        samples = module.collators[0].encode_each([json.loads(text_of(path, int(p["item"]))) for p in mine])
        held = np.concatenate([np.asarray(ids)[int(p["start"]):int(p["end"])] for (ids, _), p in zip(samples, mine)])
        assert np.array_equal(row[:len(held)], held), f"row {r}"


def _module(path: Path, ledger: Path, state: dict | None = None, **extra: Any) -> StreamingTextDataModule:
    module = StreamingTextDataModule(DataConfig(dataset_path=str(path), max_seq_len=16, **extra), 4, loop=False)
    module.attach_ledger(ledger)  # as llm-train does
    if state is not None:
        module.load_state_dict(state)
    return module


def _steps(module: StreamingTextDataModule, n: int | None) -> dict:
    it = iter(module.train_dataloader())
    while n is None or n > 0:
        if next(it, None) is None:
            break
        n = None if n is None else n - 1
    return module.state_dict()


def test_planted_faults_are_caught_and_named(tmp_path: Path, capsys: pytest.CaptureFixture,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    from llm.data.text.ledger import TextLedger

    path = corpus(tmp_path, 120)
    record = TextLedger.record

    # a replayed batch: the loader hands one batch over twice
    ledger = tmp_path / "replay"
    calls = {"n": 0}

    def twice(self: TextLedger, input_ids: Any, table: Any) -> None:
        calls["n"] += 1
        record(self, input_ids, table)
        if calls["n"] == 3:
            record(self, input_ids, table)

    monkeypatch.setattr(TextLedger, "record", twice)
    _steps(_module(path, ledger), None)
    monkeypatch.setattr(TextLedger, "record", record)
    code, out = audit_cli(ledger, capsys)
    assert code == 1 and "repeated: corpus pass 0 " in out and "trained again" in out, out

    # a skipped batch: a worker's batch lost between the loader and the trainer
    ledger = tmp_path / "skipped"
    calls["n"] = 0

    def skip(self: TextLedger, input_ids: Any, table: Any) -> None:
        calls["n"] += 1
        if calls["n"] != 4:
            record(self, input_ids, table)

    monkeypatch.setattr(TextLedger, "record", skip)
    _steps(_module(path, ledger), None)
    monkeypatch.setattr(TextLedger, "record", record)
    code, out = audit_cli(ledger, capsys)
    assert code == 1 and "missing: corpus pass 0 " in out and "never trained" in out, out
    assert f"{path}:" in out  # named by file and line

    # a state edited by hand: one partition's cursor sent back to its start
    ledger = tmp_path / "edited"
    state = _steps(_module(path, ledger), 6)
    key = next(k for k, c in state["partitions"].items() if c["offset"] and not c["done"])
    state["partitions"][key] = {**state["partitions"][key], "offset": 0, "records": 0, "tokens": 0,
                                "token_buffer": [], "skip": 0, "ledger_buffer": []}
    _steps(_module(path, ledger, state), None)
    code, out = audit_cli(ledger, capsys)
    assert code == 1 and "repeated: " in out, out

    # a resume from an older checkpoint on top of a newer ledger
    ledger = tmp_path / "older"
    old = _steps(_module(path, ledger), 3)
    new = _steps(_module(path, ledger, old), 3)
    _steps(_module(path, ledger, new), 2)
    _steps(_module(path, ledger, old), None)
    code, out = audit_cli(ledger, capsys)
    assert code == 1 and "abandoned by a resume from an older checkpoint" in out, out

    # the data changed since the run
    ledger = tmp_path / "changed"
    _steps(_module(path, ledger), 2)
    with open(path, "a") as f:
        f.write("one more line\n")
    code, out = audit_cli(ledger, capsys)
    assert code == 1 and "changed since the run" in out, out
    code, out = audit_cli(ledger, capsys, "--no-verify")
    assert code == 0, out
