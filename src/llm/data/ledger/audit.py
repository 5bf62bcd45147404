"""`audit`: count every sample the run stands on, from the ledger alone, and say what is wrong.

It never asks the loader: the counts come from the rows the workers read (ledger), and the
expectations from the data (each source's size, and optionally its order and its tokens,
through the callbacks a wing provides). What it reports:

* samples trained exactly once, and samples read but skipped (`data.skip_batches`): accounted
  for, neither trained nor missing;
* samples trained more than once (the first few, with epoch, file or shard, record and step);
* samples missing: of an epoch the run went past, every sample the source holds; of the epoch
  the run stands in, with `expected_items`, each sample the order served before the last one
  read that never came (a skipped worker chunk, a state edited by hand);
* steps recorded twice on one rank (a replayed batch), generations abandoned by a resume from
  an older checkpoint, damaged or foreign segments;
* each source's share of the samples against its weight, and a mixture's shares per schedule phase
  against the weights and schedule the ledger records (`shares.py`); a share off by more than the
  tolerance is a problem;
* rows whose tokens no longer match the data (`verify`): the dataset changed since.

`AuditReport.ok` is True only when nothing is repeated, lost, abandoned or changed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from llm.data.ledger.reader import Ledger
from llm.data.ledger.shares import Phase, mixture_of, report_phases
from llm.data.ledger.shares import phases as phase_table
from llm.data.skip_documents import SKIPPED

SHOW = 5  # ids shown per finding
ExpectedItems = Callable[[int, int, int], np.ndarray]  # (source, epoch, count) -> the first `count` items of its order
Verify = Callable[[int, np.ndarray, np.ndarray], np.ndarray]  # (source, items, crcs) -> bool mask of matching rows


@dataclass
class AuditReport:
    """What `audit` found; `lines()` is what the CLI prints."""

    samples: int = 0
    unit: str = "samples"  # what `once` counts: samples of a dataset, or documents of a text stream
    once: int = 0
    skipped: int = 0  # rows read but not trained (data.skip_batches)
    repeated: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # replays, abandoned steps, damage, changed data
    shares: dict[str, dict[str, float]] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    accounted: list[str] = field(default_factory=list)  # read and not trained, on purpose (dedup drops)
    skipped_ids: int = 0  # documents (text) or blocks (shards) dropped by id: data.skip_documents
    phases: list[str] = field(default_factory=list)  # a scheduled mixture's shares per phase
    unchecked: list[str] = field(default_factory=list)  # sources whose records could not be read again

    @property
    def ok(self) -> bool:
        return not (self.repeated or self.missing or self.problems)

    def lines(self) -> list[str]:
        # rows are what batches held; what is counted once is a block (shards) or a document (text, SFT)
        out = [f"samples: {self.samples:,} rows read, {self.once:,} {self.unit} trained exactly once"
               + (f", {self.skipped:,} skipped (read, not trained: data.skip_batches)" if self.skipped else "")]
        for name, share in self.shares.items():
            weight = share.get("weight")
            out.append(f"source {name}: {int(share['samples']):,} samples, share {share['share']:.4f}"
                       + (f" (weight {weight:.4f})" if weight is not None else ""))
        out += self.phases
        out += self.accounted
        out += [f"not re-checked: {u}" for u in self.unchecked]
        out += [f"repeated: {r}" for r in self.repeated] + [f"missing: {m}" for m in self.missing]
        out += [f"problem: {p}" for p in self.problems]
        verdict = "audit: OK, every sample exactly once" + (
            f" ({len(self.unchecked)} source{'s' * (len(self.unchecked) > 1)} counted but not re-checked against "
            "its data)" if self.unchecked else "")
        out.append(verdict if self.ok else
                   f"audit: FAILED ({self.counts.get('repeated', 0)} repeated, {self.counts.get('missing', 0)} missing, "
                   f"{len(self.problems)} other problems)")
        return out


def _describe(ledger: Ledger, source: int, epoch: int, name: int, item: int, step: int | None = None) -> str:
    sources = ledger.sources
    src = sources[source]["name"] if source < len(sources) else f"source {source}"
    where = f"{ledger.names[name]} record {item}" if name >= 0 else f"sample {item}"
    return f"{src} epoch {epoch} {where}" + (f" (step {step})" if step is not None else "")


def _replayed_steps(ledger: Ledger, report: AuditReport) -> None:
    """A step a rank recorded in two places: a batch replayed, or the ledger resumed wrongly."""
    if not len(ledger.rows):
        return
    key = ledger.ranks.astype(np.int64) << 40 | ledger.rows["step"].astype(np.int64)
    # one step is many rows: count each (rank, step) once per segment that holds it
    first_row = np.r_[True, (key[1:] != key[:-1]) | (ledger.generations[1:] != ledger.generations[:-1])]
    steps, counts = np.unique(key[first_row], return_counts=True)
    for k in steps[counts > 1][:SHOW]:
        report.problems.append(f"step {int(k) & ((1 << 40) - 1)} of rank {int(k) >> 40} is recorded twice "
                               "(a replayed batch, or a resume from a state that was not the latest)")


def audit(ledger: Ledger, expected_items: ExpectedItems | None = None, verify: Verify | None = None,
          weights: list[float] | None = None, amounts: np.ndarray | None = None,
          judge: Callable[[Phase], None] | None = None) -> AuditReport:
    """Audit a ledger; see the module docstring for what is checked.

    `amounts`: per ledger row, what it trained of each source, for a mixture's shares by phase (None: each row
    one of its source's, as a shard mixture counts); `judge`: sets whether a phase's shares are held to its weights
    and its slack (None: every phase, a slot of rounding; a text mixture's source may run out of records)."""
    report = AuditReport()
    marks = (ledger.pieces["start"] == SKIPPED) & (ledger.pieces["end"] == SKIPPED)  # dropped by id, never trained
    key_fields = ["source", "epoch", "name", "item", "start", "end"]
    by_id = np.unique(ledger.pieces[marks][key_fields])
    if len(by_id):
        report.skipped_ids = len(by_id)
        unit = "documents" if (by_id["name"] >= 0).all() else "blocks"
        report.accounted.append(f"skipped by id: {len(by_id):,} {unit} read and not trained (data.skip_documents), "
                                "accounted for")
        ledger = replace(ledger, pieces=ledger.pieces[~marks])
    report.problems += ledger.damaged
    for rank, generation, first, last in ledger.abandoned:
        report.problems.append(f"rank {rank} generation {generation} steps {first}-{last} were trained and then "
                               "abandoned by a resume from an older checkpoint; they are not counted")
    _replayed_steps(ledger, report)
    pieces, rows = ledger.pieces, ledger.rows
    report.samples = len(rows)
    trained = ledger.trained
    report.skipped = int((~trained).sum())
    # a skipped row was read, so it is accounted for (not missing), but it counts as trained by nobody
    kept = trained[pieces["row_ref"]] if len(pieces) else np.zeros(0, bool)
    keys = pieces[kept][key_fields]
    uniq, first, counts = np.unique(keys, return_index=True, return_counts=True)
    first = np.flatnonzero(kept)[first] if len(first) else first
    report.once = int((counts == 1).sum())
    dup = np.flatnonzero(counts > 1)
    report.counts["repeated"] = int((counts[dup] - 1).sum())
    for i in dup[:SHOW]:
        p = pieces[first[i]]
        report.repeated.append(f"{_describe(ledger, int(p['source']), int(p['epoch']), int(p['name']), int(p['item']))}"
                               f" trained {int(counts[i])} times")
    seen = np.unique(pieces[key_fields])
    if len(by_id):  # a block dropped by id was read: not missing (its piece's range is the marker's)
        seen = np.unique(np.concatenate([seen, by_id]))
    _missing(ledger, seen, expected_items, report)
    if verify is not None:
        _verify(ledger, verify, report)
    _shares(ledger, weights, report, amounts, judge)
    return report


def _missing(ledger: Ledger, uniq: np.ndarray, expected_items: ExpectedItems | None, report: AuditReport) -> None:
    """Samples of past epochs never read, and (with the order) gaps in the epoch the run stands in."""
    missing_total = 0
    for s, info in enumerate(ledger.sources):
        size = info.get("num_samples")
        mine = uniq[uniq["source"] == s]
        if size is None or not len(mine):
            continue
        last_epoch = int(mine["epoch"].max())
        for epoch in range(int(mine["epoch"].min()), last_epoch + 1):
            items = np.unique(mine["item"][mine["epoch"] == epoch].astype(np.int64))
            if epoch < last_epoch and info.get("drop_short_batch") and expected_items is not None:
                # the loader dropped the epoch's short last global batch: the order's tail, shorter than a batch
                tail = size - len(items)
                want = np.unique(np.asarray(expected_items(s, epoch, len(items) if tail < _largest_batch(ledger)
                                                           else size), dtype=np.int64))
            elif epoch < last_epoch or len(items) == size:
                want = np.arange(size, dtype=np.int64)
            elif expected_items is not None and len(items):
                want = np.unique(np.asarray(expected_items(s, epoch, len(items)), dtype=np.int64))
            else:
                continue
            gone = np.setdiff1d(want, items)
            missing_total += len(gone)
            for item in gone[:SHOW]:
                report.missing.append(f"{_describe(ledger, s, epoch, -1, int(item))} was never trained"
                                      + (" (its epoch is complete)" if epoch < last_epoch else ""))
    report.counts["missing"] = missing_total


def _largest_batch(ledger: Ledger) -> int:
    """The most rows any step held, all ranks together: the largest global batch of the run."""
    if not len(ledger.rows):
        return 0
    key = ledger.generations.astype(np.int64) << 48 | ledger.rows["step"].astype(np.int64)
    return int(np.unique(key, return_counts=True)[1].max())


def _verify(ledger: Ledger, verify: Verify, report: AuditReport) -> None:
    """Rows whose checksum no longer matches the stored data: the dataset changed since it was trained on."""
    shard_pieces = ledger.pieces[ledger.pieces["name"] < 0]
    for s in np.unique(shard_pieces["source"]).tolist():
        mine = shard_pieces[shard_pieces["source"] == s]
        crcs = ledger.rows["crc"][mine["row_ref"]]
        good = np.asarray(verify(int(s), mine["item"].astype(np.int64), crcs), dtype=bool)
        if not good.all():
            name = ledger.sources[s]["name"] if s < len(ledger.sources) else f"source {s}"
            report.problems.append(f"{name}: {int((~good).sum())} trained samples no longer match the data on disk "
                                   f"(first: sample {int(mine['item'][~good][0])}); the dataset changed since the run")


def _shares(ledger: Ledger, weights: list[float] | None, report: AuditReport, amounts: np.ndarray | None,
            judge: Callable[[Phase], None] | None) -> None:
    if not len(ledger.pieces):
        return
    if weights is None and ledger.sources and all(s.get("weight") is not None for s in ledger.sources):
        weights = [float(s["weight"]) for s in ledger.sources]  # the mixture's weights as the run started
    every_row = np.full(len(ledger.rows), -1, np.int64)
    every_row[ledger.pieces["row_ref"]] = ledger.pieces["source"]  # a row's source: its (last) piece's
    by_row = every_row[ledger.trained]  # shares of what was trained
    total = len(by_row)
    for s, info in enumerate(ledger.sources):
        n = int((by_row == s).sum())
        share: dict[str, Any] = {"samples": n, "share": n / total if total else 0.0}
        if weights is not None and s < len(weights):
            share["weight"] = weights[s]
        report.shares[str(info.get("name", s))] = share
    specs = mixture_of(ledger)
    if not specs or len(ledger.sources) < 2:
        return
    if amounts is None:
        amounts = np.zeros((len(ledger.rows), len(ledger.sources)), np.float64)
        known = every_row >= 0
        amounts[np.flatnonzero(known), every_row[known]] = 1.0
    found, notes = phase_table(ledger, amounts, specs)
    for phase in found if judge is not None else []:
        judge(phase)
    scheduled = any(len(spec.get("schedule") or []) > 1 for spec in specs.values())
    names = [str(info.get("name", s)) for s, info in enumerate(ledger.sources)]
    lines, problems = report_phases(found, names, scheduled)
    report.phases += lines + notes
    report.problems += problems
