"""`skip_documents`: documents dropped by id in text streams, SFT, token shards and mixtures; the rest keeps its
order, a resume in a fresh process keeps the skip (the state's union), the ledger marks them and audit counts
them as skipped; bad ids are one sentence naming them."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from llm.cli.data import main as llm_data
from llm.data import CombinedStreamingDataset, StreamingDataLoader, StreamingDataset, TokensLoader
from llm.data.ledger.reader import read_ledger
from llm.data.sft.stream import StreamingSFTDataModule
from llm.data.skip_documents import SKIPPED, SkipDocumentsError, parse_id, read_ids, union
from llm.data.stage import StateError
from llm.data.text.stream import StreamingTextDataModule
from llm.training.core.data_config import DataConfig
from tests.data.ledger.test_text_ledger import _documents_hold_the_rows, corpus, sft_records
from tests.data.shards.helpers import make_token_dataset
from tests.resume import in_fresh_process


def trained_docs(ledger: Path) -> list[tuple[str, int]]:
    """The documents the ledger's trained pieces name, in the order first trained (row by row)."""
    read = read_ledger(ledger)
    p = read.pieces[read.pieces["start"] != SKIPPED]
    p = p[~((p["start"] == 0) & (p["end"] == 0))]
    seen: dict[tuple[str, int], None] = {}
    for x in p[np.argsort(p["row_ref"], kind="stable")]:
        seen.setdefault((read.names[int(x["name"])], int(x["item"])), None)
    return list(seen)


def skipped_docs(ledger: Path) -> set[tuple[str, int]]:
    read = read_ledger(ledger)
    p = read.pieces[(read.pieces["start"] == SKIPPED) & (read.pieces["end"] == SKIPPED)]
    return {(read.names[int(x["name"])] if x["name"] >= 0 else "", int(x["item"])) for x in p}


# ---- text -------------------------------------------------------------------------------------------

def run_text(config: dict, state: dict | None, steps: int | None) -> tuple[list[np.ndarray], dict]:
    kind = StreamingSFTDataModule if config.get("sft") else StreamingTextDataModule
    data = (DataConfig(datasets=[{"path": config["path"], "type": "alpaca"}], max_seq_len=512, packing_buffer=4,
                       sample_packing=True, packing="best_fit", num_workers=config.get("workers", 0))
            if config.get("sft") else DataConfig(dataset_path=config["path"], max_seq_len=16,
                                                 num_workers=config.get("workers", 0)))
    module = kind(data, config["batch"], loop=False, ledger=config["ledger"], skip_documents=config.get("skip"))
    if state is not None:
        module.load_state_dict(state)
    out, it = [], iter(module.train_dataloader())
    while steps is None or len(out) < steps:
        batch = next(it, None)
        if batch is None:
            break
        out.append(batch["input_ids"].numpy())
    return out, module.state_dict()


def audit(ledger: Path, capsys: pytest.CaptureFixture) -> tuple[int, str]:
    code = llm_data(["audit", str(ledger)])
    return code, capsys.readouterr().out


@pytest.mark.parametrize("sft", [False, True])
def test_text_and_sft_drop_the_named_records_and_keep_the_rest_in_order(tmp_path: Path, sft: bool,
                                                                        capsys: pytest.CaptureFixture) -> None:
    path = sft_records(tmp_path, 60) if sft else corpus(tmp_path, 80)
    name = "sft" if sft else "corpus"
    base = {"path": str(path), "batch": 3, "sft": sft}
    _, _ = in_fresh_process(run_text, {**base, "ledger": str(tmp_path / "plain")}, None, None)
    reference = trained_docs(tmp_path / "plain")
    gone = [reference[5], reference[17]]
    ids = [f"{name}:{f}:{r}" for f, r in gone]
    straight, _ = in_fresh_process(run_text, {**base, "ledger": str(tmp_path / "straight"), "skip": ids}, None, None)
    want = [d for d in reference if d not in gone]
    # greedy rows keep the records' order; best fit (the SFT rows here) packs what is open, so rows may reorder
    assert trained_docs(tmp_path / "straight") == want if not sft else sorted(trained_docs(tmp_path / "straight")) == sorted(want)
    # resumed in a fresh process mid-run, the second half not given the ids: the state keeps them
    first, state = in_fresh_process(run_text, {**base, "ledger": str(tmp_path / "chain"), "skip": ids}, None, 4)
    assert state["skip_documents"] == sorted(ids)
    rest, state = in_fresh_process(run_text, {**base, "ledger": str(tmp_path / "chain")},
                                   pickle.loads(pickle.dumps(state)), None)
    assert state["skip_documents"] == sorted(ids)
    assert all(np.array_equal(a, b) for a, b in zip(straight, first + rest)) and len(straight) == len(first + rest)
    assert trained_docs(tmp_path / "chain") == trained_docs(tmp_path / "straight")
    assert skipped_docs(tmp_path / "chain") == set(gone)
    code, out = audit(tmp_path / "chain", capsys)
    assert code == 0 and "skipped by id: 2 documents" in out and f"{len(reference) - 2} documents trained" in out, out
    if not sft:  # the tokens: every row holds exactly the documents its pieces name, none of the skipped ones
        module = StreamingTextDataModule(DataConfig(dataset_path=str(path), max_seq_len=16), 3, loop=False)
        _documents_hold_the_rows(module, tmp_path / "straight", path, [{"input_ids": s} for s in straight])


def test_a_text_mixture_drops_a_record_of_one_source_and_the_draws_stay(tmp_path: Path) -> None:
    a, b = corpus(tmp_path, 60), tmp_path / "b.txt"
    b.write_text("".join(f"bee {i} " * (1 + i % 3) + "\n" for i in range(40)))

    def docs(skip: list[str] | None, ledger: str) -> list[tuple[str, int]]:
        data = DataConfig(datasets=[{"dataset_path": str(a)}, {"dataset_path": str(b)}], max_seq_len=16,
                          streaming_dataset_mixing_strategy="weighted", streaming_mixing_weights=[0.6, 0.4])
        module = StreamingTextDataModule(data, 2, loop=False, ledger=ledger, skip_documents=skip)
        for _ in module.train_dataloader():
            pass
        module.state_dict()
        return trained_docs(Path(ledger))

    reference = docs(None, str(tmp_path / "l1"))
    target = next(d for d in reference[10:] if d[0] == str(b))
    got = docs([f"b:{target[0]}:{target[1]}"], str(tmp_path / "l2"))
    # each source's records in the order read (rows of two sources interleave as their windows fill)
    for source in (str(a), str(b)):
        assert [d for d in got if d[0] == source] == [d for d in reference if d[0] == source and d != target]


# ---- token shards --------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_token_dataset(tmp_path_factory.mktemp("skip-ds"), n_lines=400)


def run_shards(config: dict, state: dict | None, steps: int | None) -> tuple[list[np.ndarray], dict]:
    ds = StreamingDataset(config["path"], item_loader=TokensLoader(block_size=64), shuffle=True, seed=3)
    loader = StreamingDataLoader(ds, batch_size=4, num_workers=config.get("workers", 0), ledger=config["ledger"],
                                 skip_documents=config.get("skip"))
    if state is not None:
        loader.load_state_dict(state)
    out = []
    for batch in loader:
        out.append(np.asarray(batch))
        if steps is not None and len(out) == steps:
            break
    return out, loader.state_dict()


def blocks_of(ds: StreamingDataset, start: int, end: int) -> set[int]:
    return set(range(start // 64, (end - 1) // 64 + 1))


def test_shards_drop_every_block_of_the_document_and_keep_the_rest(shards: Path, tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture) -> None:
    ds = StreamingDataset(shards, item_loader=TokensLoader(block_size=64))
    ends = ds.reader._shard(0)[1]
    start, end = int(ends[6]), int(ends[7])  # a document inside the first shard
    sid = f"{shards.name}@{start}"
    reference, _ = run_shards({"path": str(shards), "ledger": str(tmp_path / "plain")}, None, None)
    gone = blocks_of(ds, start, end)
    want = [row for row in np.concatenate(reference)
            if not any(np.array_equal(row, ds.read_blocks(np.array([b]))["input_ids"][0]) for b in gone)]
    first, state = in_fresh_process(run_shards, {"path": str(shards), "ledger": str(tmp_path / "l"), "skip": [sid]},
                                    None, 5)
    rest, state = in_fresh_process(run_shards, {"path": str(shards), "ledger": str(tmp_path / "l"), "workers": 2},
                                   pickle.loads(pickle.dumps(state)), None)
    got = np.concatenate(first + rest)
    assert np.array_equal(got, np.stack(want)) and len(got) == len(np.concatenate(reference)) - len(gone)
    assert state["skip_documents"] == [sid] and state["epoch"] == 1
    assert {item for _, item in skipped_docs(tmp_path / "l")} == gone
    code, out = audit(tmp_path / "l", capsys)
    assert code == 0 and f"skipped by id: {len(gone)} blocks" in out, out


def test_a_shard_mixture_drops_the_blocks_of_one_source(shards: Path, tmp_path: Path) -> None:
    (tmp_path / "other").mkdir()
    other = make_token_dataset(tmp_path / "other", n_lines=200)

    def rows(skip: list[str] | None, ledger: Path) -> tuple[list[tuple[int, int]], list[str]]:
        """(source, sample) of every row, in order, as the ledger recorded them (the two datasets share text)."""
        mix = CombinedStreamingDataset([StreamingDataset(p, item_loader=TokensLoader(block_size=64), shuffle=True,
                                                         seed=3) for p in (shards, other)], weights=[0.5, 0.5], seed=5)
        loader = StreamingDataLoader(mix, batch_size=4, skip_documents=skip, ledger=ledger)
        for _ in loader:
            pass
        loader.state_dict()
        p = read_ledger(ledger).pieces
        p = p[p["start"] != SKIPPED]
        return list(zip(p["source"].tolist(), p["item"].tolist())), [s["name"] for s in mix.ledger_sources()]

    reference, names = rows(None, tmp_path / "l1")
    ds = StreamingDataset(other, item_loader=TokensLoader(block_size=64))
    ends = ds.reader._shard(0)[1]
    gone = blocks_of(ds, int(ends[2]), int(ends[3]))
    got, _ = rows([f"{names[1]}@{int(ends[2])}"], tmp_path / "l2")
    keep = [r for r in reference if not (r[0] == 1 and r[1] in gone)]
    assert got == keep and len(keep) < len(reference)


# ---- bad input, and the union ---------------------------------------------------------------------------

def test_ids_parse_from_a_list_or_a_file_and_bad_ones_are_one_sentence(tmp_path: Path) -> None:
    assert parse_id("src:s3://b/x.jsonl:12").head == "src:s3://b/x.jsonl"
    assert parse_id("ds@4096").kind == "shard"
    ids = tmp_path / "ids.txt"
    ids.write_text("# spikes of step 120\nds@5  # the long one\n\nsrc:a.txt:9\n")
    assert read_ids(str(ids)) == ["ds@5", "src:a.txt:9"]
    assert union(["ds@5"], ["ds@1"]) == ["ds@1", "ds@5"]
    with pytest.raises(SkipDocumentsError, match=r"malformed document id 'a.txt:9'.*SOURCE:FILE:RECORD"):
        read_ids(["a.txt:9"])
    with pytest.raises(SkipDocumentsError, match=r"ids.txt line 2 holds the malformed document id 'oops'"):
        ids.write_text("ds@5\noops\n")
        read_ids(str(ids))
    with pytest.raises(SkipDocumentsError, match=r"names the file 'nope.txt', which does not exist"):
        read_ids("nope.txt")


def test_ids_found_nowhere_are_refused_before_any_batch(tmp_path: Path, shards: Path) -> None:
    path = corpus(tmp_path, 20)
    cfg = DataConfig(dataset_path=str(path), max_seq_len=16)

    def text(ids: Any) -> None:
        StreamingTextDataModule(cfg, 2, loop=False, skip_documents=ids)

    with pytest.raises(SkipDocumentsError, match=r"'other:.*' names no source of this stream \(its sources: corpus\)"):
        text([f"other:{path}:10"])
    with pytest.raises(SkipDocumentsError, match=r"names 'b.txt', which source corpus does not read"):
        text(["corpus:b.txt:10"])
    with pytest.raises(SkipDocumentsError, match=r"does not end a record of .*byte 3 is not after a line end"):
        text([f"corpus:{path}:3"])
    with pytest.raises(SkipDocumentsError, match=r"is past the end of"):
        text([f"corpus:{path}:99999999"])
    with pytest.raises(SkipDocumentsError, match=r"names a document of token shards"):
        text(["corpus@4"])
    ds = StreamingDataset(shards, item_loader=TokensLoader(block_size=64))
    with pytest.raises(SkipDocumentsError, match=r"where no document starts"):
        StreamingDataLoader(ds, batch_size=2, skip_documents=[f"{shards.name}@{int(ds.reader._shard(0)[1][0]) + 1}"])
    with pytest.raises(SkipDocumentsError, match=r"found nowhere in this run's data .*holds tokens 0 to"):
        StreamingDataLoader(ds, batch_size=2, skip_documents=[f"{shards.name}@{ds.reader.total + 5}"])
    with pytest.raises(SkipDocumentsError, match=r"'elsewhere@0' is found nowhere"):
        StreamingDataLoader(ds, batch_size=2, skip_documents=["elsewhere@0"])


def test_a_resume_keeps_the_union_of_the_states_ids_and_its_own(shards: Path, tmp_path: Path) -> None:
    ds = StreamingDataset(shards, item_loader=TokensLoader(block_size=64))
    ends = ds.reader._shard(0)[1]
    a, b = f"{shards.name}@{int(ends[1])}", f"{shards.name}@{int(ends[4])}"
    loader = StreamingDataLoader(ds, batch_size=2, skip_documents=[a])
    state = loader.state_dict()
    resumed = StreamingDataLoader(ds, batch_size=2, skip_documents=[b])
    resumed.load_state_dict(state)
    assert resumed.skip_documents == sorted([a, b]) and resumed.state_dict()["skip_documents"] == sorted([a, b])
    plain = StreamingDataLoader(ds, batch_size=2)  # a state without ids loads into a loader without them
    plain.load_state_dict(StreamingDataLoader(ds, batch_size=2).state_dict())
    assert plain.skip_documents == [] and "skip_documents" not in plain.state_dict()
    with pytest.raises(StateError, match=r"'elsewhere@0' is found nowhere"):
        plain.load_state_dict({**state, "skip_documents": ["elsewhere@0"]})
    assert plain.skip_documents == []  # a refused state changes nothing


def test_batches_left_without_rows_are_handed_over_empty_and_audit_clean(shards: Path, tmp_path: Path,
                                                                          capsys: pytest.CaptureFixture) -> None:
    ds = StreamingDataset(shards, item_loader=TokensLoader(block_size=64))
    ends = ds.reader._shard(0)[1]
    long_doc = max(range(1, len(ends)), key=lambda i: int(ends[i] - ends[i - 1]))  # the one spanning most blocks
    sid = f"{shards.name}@{int(ends[long_doc - 1])}"
    loader = StreamingDataLoader(ds, batch_size=1, ledger=tmp_path / "l", skip_documents=[sid])
    sizes = []
    for batch in loader:
        sizes.append(len(batch))
        if not len(batch):
            loader.ledger_skip()  # as llm-train does: read past it, like a skipped batch
            loader.state_dict()  # a commit right after an empty batch
    loader.state_dict()
    assert sizes.count(0) >= 2 and sum(sizes) == len(ds) - sizes.count(0)
    code, out = audit(tmp_path / "l", capsys)
    assert code == 0 and f"skipped by id: {sizes.count(0)} blocks" in out, out
