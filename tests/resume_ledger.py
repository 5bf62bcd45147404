"""The run ledger side of `tests/resume.py`: audit what a straight run and a resumed chain wrote, and compare them.

Every run the resume helpers drive gets ``config["ledger"]``, a folder of its own; the pipeline's
``run`` passes it to its stream's constructor (``StreamingDataLoader(ledger=)``, the text and SFT
modules' ``ledger=``) or puts its trainer's run folder there (llm-train writes
``RUN_DIR/ledger/<run>``). After the runs, `audited` checks each ledger the way ``llm-data audit``
does (`audit_ledger`, the data re-read) and `assert_same_identities` compares the straight run's
sample identities (source, epoch, file, record, token range) with the chain's.
"""

from __future__ import annotations

import shutil
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from llm.data.audit import audit_ledger
from llm.data.ledger.audit import AuditReport
from llm.data.ledger.reader import Ledger, read_ledger


def find_ledger(folder: Path, what: str) -> Path:
    """The one ledger under `folder` (llm-train puts it in RUN_DIR/ledger/<run>)."""
    found = sorted(p.parent for p in Path(folder).rglob("ledger.json"))
    assert len(found) == 1, (
        f"{what}: {len(found)} ledgers under {folder}; the pipeline's run must pass config['ledger'] to its "
        "stream (ledger=...) or put its trainer's checkpoint_dir there, once (see tests/resume.py)")
    return found[0]


def copy_ledger(source: Path, target: Path) -> None:
    """A head's ledger, copied for one more continuation (each continuation is its own run's chain)."""
    if Path(source).exists():
        shutil.copytree(source, target)


def rows_in(step: Any) -> int:
    """The rows (samples) one step held: its input_ids' rows (items concatenated: its `lengths`), else its first
    array's."""
    if isinstance(step, dict):
        if "lengths" in step and np.asarray(step.get("input_ids")).ndim == 1:
            return len(step["lengths"])
        first = step["input_ids"] if "input_ids" in step else step[sorted(step)[0]]
    else:
        first = step
    return len(np.asarray(first))


def audited(folder: Path, steps: list[Any], what: str, verify: bool = True) -> tuple[AuditReport, Ledger]:
    """Audit the ledger under `folder`: OK, its trained rows are the rows `steps` held, and on a shard ledger
    (one row, one sample) the samples trained exactly once are those rows."""
    ledger = read_ledger(find_ledger(folder, what))
    report = audit_ledger(ledger, verify=verify)
    assert report.ok, f"{what}: the ledger audit failed: " + "; ".join(report.lines())
    consumed = sum(rows_in(s) for s in steps)
    trained = report.samples - report.skipped
    assert trained == consumed, f"{what}: the ledger holds {trained} trained rows, the run consumed {consumed}"
    if not any(s.get("type") == "text" for s in ledger.sources):
        assert report.once == consumed, f"{what}: {report.once} samples trained exactly once, the run consumed {consumed}"
    return report, ledger


def _drop(pieces: np.ndarray) -> np.ndarray:
    """A dedup drop or an SFT record with nothing to train on: a piece with start == end == 0."""
    return (pieces["start"] == 0) & (pieces["end"] == 0)


def identities(ledger: Ledger) -> tuple[Counter, list[tuple]]:
    """Every piece's identity (source, epoch, file, record, start, end) as a multiset (epoch included, so the same
    multiset per epoch), and the trained rows in the order handed over (step, rank, row), each as its pieces."""
    names = ledger.names
    pieces = ledger.pieces
    key = [(int(p["source"]), int(p["epoch"]), names[int(p["name"])] if int(p["name"]) >= 0 else None,
            int(p["item"]), int(p["start"]), int(p["end"])) for p in pieces]
    multiset = Counter(key)
    trained = ledger.trained
    held: list[list[tuple]] = [[] for _ in range(len(ledger.rows))]
    for k, p, drop in zip(key, pieces, _drop(pieces)):
        if not drop:
            held[int(p["row_ref"])].append(k)
    order = np.lexsort((ledger.rows["row"], ledger.ranks, ledger.rows["step"]))
    return multiset, [tuple(held[i]) for i in order if trained[i]]


def assert_same_identities(straight: tuple[AuditReport, Ledger], chain: tuple[AuditReport, Ledger], ordered: bool,
                           what: str) -> None:
    """The chain trained the straight run's samples: as many exactly once (samples, or a text stream's documents),
    the same multiset per epoch, and with `ordered` (the topology unchanged, or a token-for-token resume) in the
    same order."""
    assert chain[0].once == straight[0].once, (
        f"{what}: {chain[0].once} {chain[0].unit} trained exactly once, the straight run {straight[0].once}")
    straight, chain = straight[1], chain[1]
    want, want_order = identities(straight)
    got, got_order = identities(chain)
    lost, repeated = want - got, got - want
    assert not lost and not repeated, (
        f"{what}: the ledger's sample identities differ from the straight run's: {sum(lost.values())} missing "
        f"(first {sorted(lost)[:2]}), {sum(repeated.values())} extra (first {sorted(repeated)[:2]})")
    if ordered:
        first = next((i for i, (a, b) in enumerate(zip(got_order, want_order)) if a != b), None)
        assert first is None and len(got_order) == len(want_order), (
            f"{what}: the ledger's row {first} is not the straight run's ({len(got_order)} rows, {len(want_order)})")
