"""The ledger's core: segments committed with the checkpoint, the chain of resumes, and audit's findings."""

from __future__ import annotations

import zlib
from pathlib import Path

import numpy as np
import pytest

from llm.data.ledger.audit import audit
from llm.data.ledger.format import PIECE, ROW, LedgerError
from llm.data.ledger.reader import read_ledger
from llm.data.ledger.writer import LedgerWriter

N = 64  # samples per epoch
BATCH = 4
SOURCES = [{"name": "web", "fingerprint": "f0", "num_samples": N}]


def order(epoch: int) -> np.ndarray:
    return np.random.default_rng(epoch).permutation(N)


def batch(step: int) -> tuple[np.ndarray, np.ndarray]:
    """Rows and pieces of global step `step` (1-based) of a shuffled single-source run."""
    pos = np.arange((step - 1) * BATCH, step * BATCH)
    epoch, pos = pos // N, pos % N
    items = np.array([order(int(e))[p] for e, p in zip(epoch, pos)])
    rows = np.zeros(BATCH, ROW)
    rows["row"] = np.arange(BATCH)
    rows["crc"] = [zlib.crc32(np.int64(i).tobytes()) for i in items]
    pieces = np.zeros(BATCH, PIECE)
    pieces["row_ref"], pieces["epoch"], pieces["name"], pieces["item"], pieces["end"] = np.arange(BATCH), epoch, -1, items, 8
    return rows, pieces


def run(writer: LedgerWriter, steps: range, commit_every: int = 5) -> dict:
    state = writer.state()
    for step in steps:
        writer.record(step, *batch(step))
        if step % commit_every == 0:
            state = writer.commit()
    return state


def expected(source: int, epoch: int, count: int) -> np.ndarray:
    return order(epoch)[:count]


def test_a_straight_run_audits_clean_and_costs_under_16_bytes_a_sample(tmp_path: Path) -> None:
    w = LedgerWriter(tmp_path, sources=SOURCES)
    w.open(None)
    run(w, range(1, 41))  # 160 samples: epochs 0 and 1 complete, 32 of epoch 2
    w.commit()
    ledger = read_ledger(tmp_path)
    report = audit(ledger, expected_items=expected)
    assert report.ok, report.lines()
    assert report.samples == 160 and report.once == 160
    size = sum(p.stat().st_size for p in tmp_path.glob("*.seg"))
    assert size / 160 <= 16 * 2  # tiny segments carry a header each; the bound below is the real one
    w2 = LedgerWriter(tmp_path / "big", sources=[{"name": "web", "num_samples": 10**6}])
    w2.open(None)
    rng = np.random.default_rng(0)
    for step in range(1, 2001):
        rows = np.zeros(8, ROW)
        rows["crc"] = rng.integers(0, 2**32, 8)
        pieces = np.zeros(8, PIECE)
        pieces["row_ref"], pieces["name"], pieces["item"], pieces["end"] = np.arange(8), -1, rng.integers(0, 10**6, 8), 2049
        w2.record(step, rows, pieces)
        if step % 500 == 0:
            w2.commit()
    big = sum(p.stat().st_size for p in (tmp_path / "big").glob("*.seg"))
    assert big / 16000 <= 16, f"{big / 16000:.1f} bytes per sample"


def test_steps_written_past_a_checkpoint_that_never_landed_are_dropped_on_resume(tmp_path: Path) -> None:
    w = LedgerWriter(tmp_path, sources=SOURCES)
    w.open(None)
    saved = run(w, range(1, 11))  # the checkpoint at step 10 landed
    run(w, range(11, 16))  # the segment of step 15 was written, then kill -9 before its checkpoint
    assert len(list(tmp_path.glob("*.seg"))) == 3
    w = LedgerWriter(tmp_path, sources=SOURCES)
    w.open(saved)
    assert len(list(tmp_path.glob("*.seg"))) == 2  # steps 11-15 are gone
    run(w, range(11, 33))
    w.commit()
    report = audit(read_ledger(tmp_path), expected_items=expected)
    assert report.ok, report.lines()
    assert report.samples == 32 * BATCH


def test_a_resume_from_an_older_checkpoint_on_a_newer_ledger_is_named(tmp_path: Path) -> None:
    w = LedgerWriter(tmp_path, sources=SOURCES)
    w.open(None)
    old = run(w, range(1, 11))
    new = run(w, range(11, 21))
    w = LedgerWriter(tmp_path, sources=SOURCES)
    w.open(new)
    run(w, range(21, 31))
    w = LedgerWriter(tmp_path, sources=SOURCES)
    w.open(old)  # the user resumed the step-10 checkpoint: steps 11-30 were trained by a model now thrown away
    run(w, range(11, 26))
    ledger = read_ledger(tmp_path)
    assert sorted(ledger.abandoned) == [(0, 0, 11, 15), (0, 0, 16, 20), (0, 1, 21, 25), (0, 1, 26, 30)]
    report = audit(ledger, expected_items=expected)
    assert not report.ok and not report.repeated  # the standing chain itself is clean
    assert any("generation 1 steps 21-25" in p and "older checkpoint" in p for p in report.problems)


def test_a_replayed_batch_and_a_skipped_chunk_are_caught(tmp_path: Path) -> None:
    w = LedgerWriter(tmp_path / "replay", sources=SOURCES)
    w.open(None)
    for step in range(1, 9):
        w.record(step, *batch(step if step != 6 else 5))  # step 6 serves step 5's batch again
    w.commit()
    report = audit(read_ledger(tmp_path / "replay"), expected_items=expected)
    assert not report.ok and report.counts["repeated"] == BATCH
    assert "trained 2 times" in report.repeated[0] and report.counts["missing"] == BATCH

    w = LedgerWriter(tmp_path / "skip", sources=SOURCES)
    w.open(None)
    for step, served in enumerate([1, 2, 3, 6, 7, 8], start=1):  # a worker's chunk (batches 4-5) never came
        w.record(step, *batch(served))
    w.commit()
    report = audit(read_ledger(tmp_path / "skip"), expected_items=expected)
    assert report.counts["missing"] == 2 * BATCH and not report.repeated
    assert "web epoch 0 sample" in report.missing[0]


def test_a_truncated_segment_is_named_and_the_rest_still_audited(tmp_path: Path) -> None:
    w = LedgerWriter(tmp_path, sources=SOURCES)
    w.open(None)
    run(w, range(1, 16))
    last = sorted(tmp_path.glob("*.seg"))[-1]
    last.write_bytes(last.read_bytes()[:-9])
    ledger = read_ledger(tmp_path)
    assert len(ledger.rows) == 10 * BATCH
    assert ledger.damaged and last.name in ledger.damaged[0] and "truncated" in ledger.damaged[0]
    assert not audit(ledger).ok


def test_a_ledger_of_another_run_is_refused_naming_both(tmp_path: Path) -> None:
    a, b = LedgerWriter(tmp_path / "a"), LedgerWriter(tmp_path / "b")
    a.open(None, run="run-a")
    b.open(None, run="run-b")
    state_a = run(a, range(1, 6))
    assert not (tmp_path / "b" / "ledger.json").exists()  # nothing reaches the disk before the first commit
    b.commit()
    with pytest.raises(LedgerError, match="belongs to run run-a but .*b holds the ledger of run run-b"):
        LedgerWriter(tmp_path / "b").open(state_a)
    with pytest.raises(LedgerError, match="already holds the ledger of run run-a"):
        LedgerWriter(tmp_path / "a").open(None)
    with pytest.raises(LedgerError, match="not of run run-x"):
        read_ledger(tmp_path / "a", run="run-x")
    (tmp_path / "b" / "r00000-g0000-000000000001-000000000005.seg").write_bytes(
        next((tmp_path / "a").glob("*.seg")).read_bytes())
    assert any("copied in from another run" in d for d in read_ledger(tmp_path / "b").damaged)


def test_ranks_write_their_own_segments_and_a_resume_on_another_topology_is_a_new_generation(tmp_path: Path) -> None:
    writers = [LedgerWriter(tmp_path, rank=r, sources=SOURCES) for r in range(2)]
    for w in writers:
        w.open(None, topology={"world_size": 2}, run="r1")
    for step in range(1, 6):
        rows, pieces = batch(step)
        for r, w in enumerate(writers):  # rank r takes half of the global batch
            half = pieces[r * 2:(r + 1) * 2].copy()
            half["row_ref"] -= r * 2
            w.record(step, rows[r * 2:(r + 1) * 2], half)
    states = [w.commit() for w in writers]
    assert states[0] == states[1] == {"run": "r1", "generation": 0, "step": 5}
    one = LedgerWriter(tmp_path, rank=0, sources=SOURCES)
    one.open(states[0], topology={"world_size": 1})
    assert one.generation == 1
    run(one, range(6, 17))
    one.commit()
    ledger = read_ledger(tmp_path)
    assert ledger.markers[1]["resumed_from"] == {"generation": 0, "step": 5}
    assert ledger.markers[1]["topology"] == {"world_size": 1}
    report = audit(ledger, expected_items=expected)
    assert report.ok, report.lines()
    assert report.samples == 16 * BATCH
