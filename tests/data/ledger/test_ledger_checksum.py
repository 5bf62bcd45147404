"""The rows' checksum (ledger version 3, rule "wword64", over the ids as each source stores them): its definition,
that it finds a changed token in the data, that a mixture of sources stored in different dtypes is checksummed per
source, and that version 1 and 2 ledgers (rules "xxh3-int64", "wsum32") are still audited by their own rule, also
when resumed."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from llm.data import (
    CombinedStreamingDataset,
    StreamingDataLoader,
    StreamingDataset,
    TokensLoader,
    optimize,
)
from llm.data.ledger.audit import audit
from llm.data.ledger.format import (
    CHECKSUM,
    RULES,
    LedgerError,
    checksum_rule,
    decode_segment,
    encode_segment,
    read_header,
    row_checksums,
    row_checksums_v1,
    row_checksums_v2,
)
from llm.data.ledger.reader import read_ledger
from llm.data.shards.read.ledger_audit import ShardAuditor
from tests.data.ledger.test_shard_ledger import audit_cli, steps
from tests.data.shards.helpers import all_tokens, make_token_dataset


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_token_dataset(tmp_path_factory.mktemp("checksum-ds"), n_lines=600)


def _fmix32(x: int) -> int:
    x ^= x >> 16
    x = (x * 0x85EBCA6B) & 0xFFFFFFFF
    x ^= x >> 13
    x = (x * 0xC2B2AE35) & 0xFFFFFFFF
    return x ^ (x >> 16)


def _splitmix64(x: int) -> int:
    x = (x * 0x9E3779B97F4A7C15) % 2**64
    x ^= x >> 30
    x = (x * 0xBF58476D1CE4E5B9) % 2**64
    x ^= x >> 27
    x = (x * 0x94D049BB133111EB) % 2**64
    return x ^ (x >> 31)


def _wword64(row: np.ndarray, dtype: type) -> int:
    """Rule "wword64" written out in plain Python: the row's little-endian bytes in `dtype`, zero-padded to whole
    64-bit words x_j; s = sum x_j * (splitmix64(j + 1) | 1) modulo 2**64; (s xor s >> 32) modulo 2**32."""
    data = row.astype(np.dtype(dtype).newbyteorder("<")).tobytes()
    data += bytes(-len(data) % 8)
    s = sum(int.from_bytes(data[i:i + 8], "little") * (_splitmix64(i // 8 + 1) | 1) for i in range(0, len(data), 8))
    s %= 2**64
    return (s ^ (s >> 32)) % 2**32


@pytest.mark.parametrize("dtype", [np.uint16, np.uint32, np.int64])
@pytest.mark.parametrize("width", [300, 255, 1])
def test_the_checksum_is_the_documented_sum_over_the_ids_as_stored(dtype: type, width: int) -> None:
    rng = np.random.default_rng(5)
    rows = rng.integers(0, 65536, (40, width)).astype(dtype)
    expected = [_wword64(r, dtype) for r in rows]
    assert row_checksums(rows, dtype).tolist() == expected
    # rows that reach it in another dtype (the audit reads them in the loader's int64) are cast to the stored one
    assert row_checksums(rows.astype(np.int64), dtype).tolist() == expected
    assert row_checksums(np.zeros((0, 8), np.int64), dtype).shape == (0,)
    # the stored dtype is part of the rule: uint16 rows checksum otherwise than the same ids held as int64
    if dtype is not np.int64 and width > 1:
        assert row_checksums(rows, dtype).tolist() != row_checksums(rows, np.int64).tolist()
    assert row_checksums(rows.astype(np.int64)).tolist() == [_wword64(r, np.int64) for r in rows]  # None: int64


def test_the_version_2_checksum_is_still_its_documented_sum_whatever_dtype_holds_the_ids() -> None:
    rng = np.random.default_rng(5)
    rows = rng.integers(0, 65536, (40, 300))
    # the definition, written out in plain Python: sum of id_i * (fmix32(i + 1) | 1) modulo 2**32
    expected = [sum(int(v) * (_fmix32(i + 1) | 1) for i, v in enumerate(r)) % 2**32 for r in rows]
    assert row_checksums_v2(rows).tolist() == expected
    assert RULES["wsum32"] is row_checksums_v2
    for dtype in (np.uint16, np.int32, np.uint32, np.uint64):
        assert row_checksums_v2(rows.astype(dtype), dtype).tolist() == expected
    assert row_checksums_v2(np.array([[-1]])).tolist() == [(2**32 - 1) * (_fmix32(1) | 1) % 2**32]  # ids mod 2**32


@pytest.mark.parametrize("dtype", [np.uint16, np.uint32])
def test_any_single_changed_token_changes_the_checksum(dtype: type) -> None:
    rng = np.random.default_rng(6)
    top = np.iinfo(dtype).max + 1
    rows = rng.integers(0, top, (64, 512)).astype(dtype)
    base = row_checksums(rows, dtype)
    for pos in range(512):  # every position, a random change (the top bit alone included)
        changed = rows.copy()
        step = rng.integers(1, top, 64) if pos % 7 else np.full(64, top // 2)
        changed[:, pos] = (changed[:, pos].astype(np.int64) + step) % top
        assert np.all(row_checksums(changed, dtype) != base)
    for a, b in ((3, 4), (0, 4), (5, 300)):  # in one word, in neighbouring words, far apart
        swapped = rows.copy()
        swapped[:, [a, b]] = swapped[:, [b, a]]
        assert np.all((row_checksums(swapped, dtype) != base) | (rows[:, a] == rows[:, b]))
    shifted = np.roll(rows, 1, axis=1)
    assert np.all(row_checksums(shifted, dtype) != base)


def test_a_changed_token_in_the_data_is_caught_by_audit(dataset: Path, tmp_path: Path) -> None:
    ledger = tmp_path / "ledger"
    steps(dataset, ledger, None, 6)
    read = read_ledger(ledger)
    assert read.header["checksum"] == CHECKSUM and read.header["version"] == 3
    assert read.sources[0]["checksum_dtype"] == "uint16"
    auditor = ShardAuditor(read.sources, checksum_rule(read.header))
    assert audit(read, auditor.expected_items, auditor.verify).ok
    # one token of one trained sample differs as read now (a shard rewritten with its manifest, say: the
    # shard checksums would catch a plain byte flip first), by +1 and by 2**15
    ds, victim = auditor.dataset(0), int(read.pieces["item"][5])
    stored = ds.read_blocks
    for change in (1, 1 << 15):
        def changed(items: np.ndarray, change: int = change) -> dict[str, np.ndarray]:
            out = stored(items)
            out["input_ids"] = out["input_ids"].copy()
            out["input_ids"][np.asarray(items) == victim, 17] += change
            return out
        ds.read_blocks = changed
        report = audit(read, auditor.expected_items, auditor.verify)
        assert not report.ok and "1 trained samples no longer match the data on disk" in report.problems[0]


def _as_version(ledger: Path, version: int, recompute: bool = True) -> None:
    """Rewrite a ledger the way version 1 or 2 wrote it: version 1 named no checksum rule and took xxh3 over int64
    ids, version 2 named "wsum32"; neither recorded a checksum_dtype per source."""
    header = read_header(ledger)
    ds = ShardAuditor(header["sources"]).dataset(0)
    rule, name = (row_checksums_v1, None) if version == 1 else (row_checksums_v2, "wsum32")
    sources = [{k: v for k, v in x.items() if k != "checksum_dtype"} for x in header["sources"]]
    (ledger / "ledger.json").write_text(json.dumps({k: v for k, v in {**header, "version": version, "checksum": name,
                                                                      "sources": sources}.items() if v is not None}))
    for path in sorted(ledger.glob("*.seg")):
        seg = decode_segment(path.read_bytes(), str(path))
        if recompute:
            seg.rows["crc"][seg.pieces["row_ref"]] = rule(ds.read_blocks(seg.pieces["item"].astype(np.int64))["input_ids"])
        head = {k: v for k, v in {**seg.header, "checksum": name}.items() if k not in ("rows", "pieces") and v is not None}
        path.write_bytes(encode_segment(head, seg.rows, seg.pieces))


@pytest.mark.parametrize(("version", "rule"), [(1, "xxh3-int64"), (2, "wsum32")])
def test_an_older_ledger_is_audited_by_its_own_rule_and_resumed_with_it(dataset: Path, tmp_path: Path, version: int,
                                                                        rule: str, capsys: pytest.CaptureFixture) -> None:
    ledger = tmp_path / f"v{version}"
    _, state = steps(dataset, ledger, None, 5)
    _as_version(ledger, version)
    assert audit_cli(ledger, capsys)[0] == 0
    # resumed by this version: the run goes on with its own rule, and its new segments say so
    steps(dataset, ledger, state, 4)
    assert read_header(ledger)["version"] == version
    newest = sorted(ledger.glob("*.seg"))[-1]
    assert decode_segment(newest.read_bytes(), str(newest)).header["checksum"] == rule
    code, out = audit_cli(ledger, capsys)
    assert code == 0 and "audit: OK" in out, out
    # the rule is the header's: version 3 checksums under an older header do not match
    other = tmp_path / "mislabelled"
    steps(dataset, other, None, 3)
    _as_version(other, version, recompute=False)
    code, out = audit_cli(other, capsys)
    assert code == 1 and "no longer match the data on disk" in out, out


def test_a_ledger_of_a_later_version_an_unknown_rule_or_no_stored_dtype_names_it(dataset: Path, tmp_path: Path,
                                                                                capsys: pytest.CaptureFixture) -> None:
    ledger = tmp_path / "ledger"
    steps(dataset, ledger, None, 2)
    header = read_header(ledger)
    (ledger / "ledger.json").write_text(json.dumps({**header, "version": 4}))
    with pytest.raises(LedgerError, match="written by ledger version 4; this llm reads versions 1, 2, 3"):
        read_header(ledger)
    (ledger / "ledger.json").write_text(json.dumps({**header, "checksum": "crc64"}))
    with pytest.raises(LedgerError, match="names checksum rule 'crc64' \\(ledger version 3\\)"):
        read_header(ledger)
    # a source entry whose checksum_dtype was edited away: named, not reported as changed data
    (ledger / "ledger.json").write_text(json.dumps({**header, "sources": [
        {k: v for k, v in header["sources"][0].items() if k != "checksum_dtype"}]}))
    code, out = audit_cli(ledger, capsys)
    assert code == 1 and "has no valid checksum_dtype" in out and "no longer match" not in out, out


def _blocks(folder: Path, n: int, top: int) -> Path:
    def block(i: int) -> np.ndarray:
        return (np.arange(64, dtype=np.int64) * 7919 + i * 104_729) % top
    optimize(block, list(range(n)), str(folder), chunk_bytes="16KB", num_workers=0, progress=False,
             item_loader=TokensLoader())
    return folder


def test_a_mixture_of_uint16_and_uint32_sources_is_checksummed_per_stored_dtype(tmp_path: Path,
                                                                                capsys: pytest.CaptureFixture) -> None:
    small, big = _blocks(tmp_path / "small", 300, 50_000), _blocks(tmp_path / "big", 300, 100_000)
    datasets = [StreamingDataset(p, item_loader=TokensLoader(block_size=64), shuffle=True, seed=3) for p in (small, big)]
    assert [d.checksum_dtype().name for d in datasets] == ["uint16", "uint32"]
    ledger = tmp_path / "ledger"
    loader = StreamingDataLoader(CombinedStreamingDataset(datasets, weights=[0.5, 0.5], seed=3), batch_size=8,
                                 num_workers=2, ledger=ledger)
    for k, batch in enumerate(loader):
        assert batch.dtype == torch.int64  # the loader's rows are widened after the checksum, not before
        if k == 30:
            break
    loader.state_dict()
    read = read_ledger(ledger)
    assert [x["checksum_dtype"] for x in read.sources] == ["uint16", "uint32"]
    # each row's checksum is the rule over its source's ids as stored, from the shard files themselves
    for s, d in enumerate(datasets):
        mine = read.pieces["source"] == s
        rows = all_tokens(d.input_dir)[read.pieces["item"][mine].astype(np.int64)[:, None] * 64 + np.arange(64)]
        stored = rows.astype(d.checksum_dtype())
        assert mine.any() and np.array_equal(read.rows["crc"][read.pieces["row_ref"][mine]],
                                             row_checksums(stored, d.checksum_dtype()))
    code, out = audit_cli(ledger, capsys)
    assert code == 0 and "audit: OK" in out, out
    # one token of a trained uint32 sample changed as read now: caught
    auditor = ShardAuditor(read.sources, checksum_rule(read.header))
    victim = int(read.pieces["item"][np.flatnonzero(read.pieces["source"] == 1)[0]])
    ds, stored_read = auditor.dataset(1), auditor.dataset(1).read_blocks
    def changed(items: np.ndarray) -> dict[str, np.ndarray]:
        out = stored_read(items)
        out["input_ids"] = out["input_ids"].copy()
        out["input_ids"][np.asarray(items) == victim, 5] += 70_000
        return out
    ds.read_blocks = changed
    report = audit(read, auditor.expected_items, auditor.verify)
    assert not report.ok and "1 trained samples no longer match the data on disk" in report.problems[0], report.problems


def test_commits_in_the_middle_of_a_chunk_keep_every_row_once(dataset: Path, tmp_path: Path,
                                                             capsys: pytest.CaptureFixture) -> None:
    ledger = tmp_path / "ledger"
    ds = StreamingDataset(dataset, item_loader=TokensLoader(block_size=64), shuffle=True, seed=3)
    loader = StreamingDataLoader(ds, batch_size=4, num_workers=2, ledger=ledger)
    batches = rows = 0
    for batch in loader:  # a chunk is 64 batches here: every commit falls inside one
        batches, rows = batches + 1, rows + len(batch)
        if batches % 5 == 0:
            loader.state_dict()
    loader.state_dict()
    code, out = audit_cli(ledger, capsys)
    assert code == 0 and "audit: OK" in out and f"{rows} rows read" in out.replace(",", ""), out


def test_worker_processes_send_the_checksums_they_took_as_they_read(dataset: Path, tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture) -> None:
    ledger = tmp_path / "ledger"
    ds = StreamingDataset(dataset, item_loader=TokensLoader(block_size=64), shuffle=True, seed=3)
    loader = StreamingDataLoader(ds, batch_size=4, num_workers=2, worker_backend="processes", ledger=ledger)
    for k, _ in enumerate(loader):  # the chunk's ids and checksums cross the worker pipe as one object
        if k == 40:
            break
    loader.state_dict()
    read = read_ledger(ledger)
    assert len(read.rows) == 41 * 4
    stored = ds.read_blocks(read.pieces["item"].astype(np.int64))["input_ids"]
    assert np.array_equal(read.rows["crc"], row_checksums(stored, read.sources[0]["checksum_dtype"]))
    code, out = audit_cli(ledger, capsys)
    assert code == 0 and "audit: OK" in out, out
