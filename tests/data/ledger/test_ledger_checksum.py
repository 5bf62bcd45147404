"""The rows' checksum (ledger version 2, rule "wsum32"): its definition, that it finds a changed token in the
data, and that a version 1 ledger (rule "xxh3-int64") is still audited by its own rule, also when resumed."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from llm.data import StreamingDataLoader, StreamingDataset, TokensLoader
from llm.data.ledger.audit import audit
from llm.data.ledger.format import (
    CHECKSUM,
    LedgerError,
    checksum_rule,
    decode_segment,
    encode_segment,
    read_header,
    row_checksums,
    row_checksums_v1,
)
from llm.data.ledger.reader import read_ledger
from llm.data.shards.read.ledger_audit import ShardAuditor
from tests.data.ledger.test_shard_ledger import audit_cli, steps
from tests.data.shards.helpers import make_token_dataset


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_token_dataset(tmp_path_factory.mktemp("checksum-ds"), n_lines=600)


def _fmix32(x: int) -> int:
    x ^= x >> 16
    x = (x * 0x85EBCA6B) & 0xFFFFFFFF
    x ^= x >> 13
    x = (x * 0xC2B2AE35) & 0xFFFFFFFF
    return x ^ (x >> 16)


def test_the_checksum_is_the_documented_sum_whatever_dtype_holds_the_ids() -> None:
    rng = np.random.default_rng(5)
    rows = rng.integers(0, 65536, (40, 300))
    # the definition, written out in plain Python: sum of id_i * (fmix32(i + 1) | 1) modulo 2**32
    expected = [sum(int(v) * (_fmix32(i + 1) | 1) for i, v in enumerate(r)) % 2**32 for r in rows]
    assert row_checksums(rows).tolist() == expected
    for dtype in (np.uint16, np.int32, np.uint32, np.uint64):
        assert row_checksums(rows.astype(dtype)).tolist() == expected
    assert row_checksums(np.array([[-1]])).tolist() == [(2**32 - 1) * (_fmix32(1) | 1) % 2**32]  # ids modulo 2**32
    assert row_checksums(np.zeros((0, 8), np.int64)).shape == (0,)


def test_any_single_changed_token_changes_the_checksum() -> None:
    rng = np.random.default_rng(6)
    rows = rng.integers(0, 200_000, (64, 512))
    base = row_checksums(rows)
    for pos in range(512):  # every position, a random change (a 2**31 step included: odd weights catch it)
        changed = rows.copy()
        changed[:, pos] += rng.integers(1, 2**31, 64) if pos % 7 else 2**31
        assert np.all(row_checksums(changed) != base)
    swapped = rows.copy()
    swapped[:, [3, 4]] = swapped[:, [4, 3]]
    assert np.all((row_checksums(swapped) != base) | (rows[:, 3] == rows[:, 4]))


def test_a_changed_token_in_the_data_is_caught_by_audit(dataset: Path, tmp_path: Path) -> None:
    ledger = tmp_path / "ledger"
    steps(dataset, ledger, None, 6)
    read = read_ledger(ledger)
    assert read.header["checksum"] == CHECKSUM and read.header["version"] == 2
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


def _as_version_1(ledger: Path, recompute: bool = True) -> None:
    """Rewrite a ledger the way version 1 wrote it: no checksum rule named, rows' checksums by xxh3 over int64."""
    header = read_header(ledger)
    ds = ShardAuditor(header["sources"]).dataset(0)
    (ledger / "ledger.json").write_text(json.dumps({k: v for k, v in {**header, "version": 1}.items()
                                                    if k != "checksum"}))
    for path in sorted(ledger.glob("*.seg")):
        seg = decode_segment(path.read_bytes(), str(path))
        if recompute:
            seg.rows["crc"][seg.pieces["row_ref"]] = row_checksums_v1(
                ds.read_blocks(seg.pieces["item"].astype(np.int64))["input_ids"])
        head = {k: v for k, v in seg.header.items() if k not in ("checksum", "rows", "pieces")}
        path.write_bytes(encode_segment(head, seg.rows, seg.pieces))


def test_a_version_1_ledger_is_audited_by_its_own_rule_and_resumed_with_it(dataset: Path, tmp_path: Path,
                                                                          capsys: pytest.CaptureFixture) -> None:
    ledger = tmp_path / "v1"
    _, state = steps(dataset, ledger, None, 5)
    _as_version_1(ledger)
    assert audit_cli(ledger, capsys)[0] == 0
    # resumed by this version: the run goes on with version 1's rule, and its new segments say so
    steps(dataset, ledger, state, 4)
    assert read_header(ledger)["version"] == 1
    newest = sorted(ledger.glob("*.seg"))[-1]
    assert decode_segment(newest.read_bytes(), str(newest)).header["checksum"] == "xxh3-int64"
    code, out = audit_cli(ledger, capsys)
    assert code == 0 and "audit: OK" in out, out
    # the rule is the header's: version 2 checksums under a version 1 header do not match
    other = tmp_path / "mislabelled"
    steps(dataset, other, None, 3)
    _as_version_1(other, recompute=False)
    code, out = audit_cli(other, capsys)
    assert code == 1 and "no longer match the data on disk" in out, out


def test_a_ledger_of_a_later_version_or_an_unknown_rule_names_it(dataset: Path, tmp_path: Path) -> None:
    ledger = tmp_path / "ledger"
    steps(dataset, ledger, None, 2)
    header = read_header(ledger)
    (ledger / "ledger.json").write_text(json.dumps({**header, "version": 3}))
    with pytest.raises(LedgerError, match="written by ledger version 3; this llm reads versions 1, 2"):
        read_header(ledger)
    (ledger / "ledger.json").write_text(json.dumps({**header, "checksum": "crc64"}))
    with pytest.raises(LedgerError, match="names checksum rule 'crc64' \\(ledger version 2\\)"):
        read_header(ledger)


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
