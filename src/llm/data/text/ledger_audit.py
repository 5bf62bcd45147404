"""Audit of a text or SFT ledger: every record's token ranges trained once, records of a pass never read.

It counts from the ledger's pieces alone and checks against the files as they are on disk now,
read the way the stream read them (`TextAuditor`, through the inputs wing). Per source and pass:

* each document's ranges must tile it from token 0 without overlap: an overlap is a repeat (a
  replayed batch, a resume from a wrong state), a hole is a part never trained (a skipped batch);
* records trained in two rows' worth of the same range, or trained and also dropped: repeated;
* records of a partition never read: all of a pass the partition went past, and in the pass it
  stands in, each one before the last record read (a skipped worker chunk, a cursor edited by hand);
* records a dedup source dropped (pieces with start == end == 0): counted as accounted for;
* each source's share of the rows against its weight, a mixture's shares per phase (`ledger_shares.py`),
  and the generic checks (`ledger/audit.py`);
* rows rebuilt from the records as stored now (`ledger_rebuild.py`): local files, Hugging Face datasets and
  object stores read again through the stream's own inputs; a source that cannot be is `not re-checked`.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from llm.data.inputs.hf import HFStreamTextSource
from llm.data.inputs.local import LocalLineTextSource
from llm.data.inputs.partitions import stripe_partitions
from llm.data.inputs.source import TextSource
from llm.data.ledger.audit import SHOW, AuditReport, audit
from llm.data.ledger.reader import Ledger
from llm.data.skip_documents import SKIPPED
from llm.data.text.ledger_rebuild import verify_rows
from llm.data.text.ledger_shares import judge, mixed_amounts
from llm.data.text.provenance import record_name

_DOC = ["source", "epoch", "name", "item"]


class TextAuditor:
    """The text sources a ledger header names, read again: each partition's records in the order read."""

    def __init__(self, sources: list[dict[str, Any]], read: bool = True, sample_rebuild: Any = None,
                 held_out: Any = None):
        self.sources = sources
        self.sample_rebuild = sample_rebuild  # SFT records -> samples again (sft/ledger_audit.py; None: not rebuilt)
        self.held_out = held_out  # SFT's val_set_size split drawn again (sft/holdout.py; None: not drawn)
        self._held: tuple[frozenset, ...] | None = None
        self.read = read  # False (--no-verify): the counts alone, no file is read
        self.problems: list[str] = []
        self._parts: dict[int, list[tuple[str, str, np.ndarray]] | None] = {}
        self._lines: dict[str, np.ndarray] = {}  # a plain line file's newline offsets, for file:line
        self._bases: list[tuple[int, str, Any]] = []  # (source, recorded name, base partition) read again
        self._sources: dict[int, TextSource] = {}
        self._changed: set[int] = set()  # sources changed since the run: rows rebuilt, records not counted
        self._remap: dict[str, dict[int, int]] = {}  # a changed file's records: the run's offset -> the offset now
        self.unchecked: list[str] = []  # sources whose records cannot be read again, one sentence each

    def partitions(self, s: int) -> list[tuple[str, str, np.ndarray]] | None:
        """(partition key, recorded name, record offsets in read order) of source s; None when its records are not
        counted against it (not re-read, or changed since the run: its rows are still rebuilt, see `readable`)."""
        if s not in self._parts:
            self._parts[s] = self._read(s)
        return None if s in self._changed else self._parts[s]

    def readable(self, s: int) -> bool:
        """Whether source s was read again (its rows can be rebuilt), changed or not."""
        self.partitions(s)
        return self._parts.get(s) is not None

    def _open(self, s: int) -> TextSource | None:
        """Source s as the stream read it, through the same input reader; None (said why, in `unchecked`) if not."""
        info = self.sources[s]
        fp = info.get("fingerprint") or {}
        try:
            if info.get("kind") == "local":
                return LocalLineTextSource(list(info["paths"]), info["text_column"], info["partition_bytes"])
            if fp.get("type") == "local":  # an object store (s3://, gs://, az://): its credentials from the environment
                return LocalLineTextSource(fp["dataset_path"], fp.get("text_column"), fp.get("partition_bytes"))
            if fp.get("type") == "hf":
                return HFStreamTextSource(fp["dataset_name"], fp.get("dataset_config"), fp.get("split", "train"),
                                          fp.get("text_column"), fp.get("data_files"))
        except Exception as e:  # gone, no credentials, no `datasets`: whatever it is, the records are not re-read
            reason = str(e).strip().split("\n")[0] or type(e).__name__
            self.unchecked.append(f"{info['name']} cannot be read again ({reason}); its counts are audited, its "
                                  "records are not re-checked")
            return None
        self.unchecked.append(f"{info['name']} is a {fp.get('type', 'custom')} source the audit has no reader for; "
                              "its counts are audited, its records are not re-checked")
        return None

    def _changes(self, s: int, src: TextSource) -> str | None:
        """What changed in source s since the run (files or objects named), or None."""
        saved, now = self.sources[s].get("fingerprint") or {}, src.source_fingerprint()
        if saved.get("type") != "local":
            differ = [k for k in sorted(set(saved) | set(now)) if saved.get(k) != now.get(k)]
            return f"its {', '.join(differ)} differ" if differ else None
        before, after = saved.get("stamps", {}), now["stamps"]
        keys = list(before) + [k for k in after if k not in before]
        changed = [k for k in keys if before.get(k) != after.get(k)]
        if not changed and saved.get("bytes") == now["bytes"]:
            return None
        return f"{', '.join(changed) or 'its files'} changed (size or stamp)"

    def _read(self, s: int) -> list[tuple[str, str, np.ndarray]] | None:
        info = self.sources[s]
        if not self.read:
            return None
        src = self._open(s)
        if src is None:
            return None
        try:
            change = self._changes(s, src)
            if change is not None:
                self._changed.add(s)
                self.problems.append(f"{info['name']} changed since the run: {change}; its records are not counted "
                                     "against it, and its rows are checked against the data as it is now")
            return self._offsets(s, src)
        except Exception as e:  # an object gone or a credential refused mid-read: said, not counted as checked
            self._changed.discard(s)
            reason = str(e).strip().split("\n")[0] or type(e).__name__
            self.unchecked.append(f"{info['name']} cannot be read again ({reason}); its counts are audited, its "
                                  "records are not re-checked")
            return None

    def _held_out(self, s: int) -> frozenset:
        """The (partition key, offset) of source s's records held out for validation (SFT's `val_set_size`)."""
        spec = (self.sources[s].get("fingerprint") or {}).get("held_out")
        if not spec or spec.get("side") != "training" or self.held_out is None:
            return frozenset()
        if self._held is None:
            opened = [self._open(i) for i in range(len(self.sources))]
            drawn = self.held_out(opened, spec) if all(o is not None for o in opened) else None
            if drawn is None:
                self.problems.append("the val_set_size split of the sources cannot be drawn again as the run drew it "
                                     "(the records changed); held-out records may be named missing")
            self._held = drawn or tuple(frozenset() for _ in self.sources)
        return self._held[s] if s < len(self._held) else frozenset()

    def _offsets(self, s: int, src: TextSource) -> list[tuple[str, str, np.ndarray]]:
        info = self.sources[s]
        self._sources[s] = src
        recorded = dict(zip(info.get("paths", []), info.get("files", [])))
        out = []
        for group in _groups(stripe_partitions(src.partitions())):
            base = group[0]
            if base.base is not None:
                base = replace(base, key=base.base, stripe=None, stripes=1, base=None)
            held = self._held_out(s)  # records held out for validation are never trained: not missing
            offsets = np.array([after for _, after, _ in src.iter_partition(base, 0) if (base.key, after) not in held],
                               np.int64)
            name = record_name(replace(base, path=recorded.get(base.path or "", base.path)))
            if base.seekable and base.path is not None and "://" not in base.path:
                self._lines.setdefault(name, _newlines(base.path))
            self._bases.append((s, name, base))
            for part in group:
                mine = offsets if part.stripe is None else offsets[(offsets - 1) % part.stripes == part.stripe]
                out.append((part.key, name, mine))
        return out

    def align(self, s: int, recorded: dict[str, np.ndarray]) -> None:
        """Source s changed since the run: match each record the run read (`recorded`: name -> its offsets then)
        with the record in that place now, so its rows are rebuilt from it and it is named where it is now.

        Records edited in place move the byte offsets of every later record of a line file by the same amount:
        a record whose offset, so moved, is a record's end now is that record; one that is not (the edited one,
        whose length changed) is the next record now, and the amount it moved holds for the records after it."""
        if s not in self._changed or not self._parts.get(s):
            return
        now: dict[str, np.ndarray] = {}
        for _, name, offsets in self._parts[s] or []:
            now[name] = np.union1d(now.get(name, offsets[:0]), offsets)
        for name, items in recorded.items():
            ends = now.get(name)
            if ends is None or not len(ends):
                continue
            known, mapping, delta, last = set(ends.tolist()), {}, 0, -1
            for old in np.unique(items).tolist():
                new = old + delta
                if new not in known:
                    later = int(np.searchsorted(ends, max(last, -1), side="right"))
                    if later >= len(ends):
                        break  # past the file's end now: the record is gone
                    new = int(ends[later])
                    delta = new - old
                mapping[old], last = new, new
            self._remap[name] = mapping

    def _now(self, name: str, item: int) -> int:
        return self._remap.get(name, {}).get(item, item)

    def documents(self, s: int, wanted: set[tuple[str, int]]) -> dict[tuple[str, int], str]:
        """The texts of the wanted (name, record) of source s, read again (keyed by the run's record)."""
        out = {}
        by_now = {(name, self._now(name, item)): (name, item) for name, item in wanted}
        for source, name, base in self._bases:
            if source == s and any(n == name for n, _ in wanted):
                for text, after, _ in self._sources[s].iter_partition(base, 0):
                    if (name, after) in by_now:
                        out[by_now[(name, after)]] = text
        return out

    def where(self, name: str, item: int) -> str:
        """A record as `why` names it: FILE:LINE in a plain line file, else FILE record N (where it is now)."""
        item = self._now(name, item)
        lines = self._lines.get(name)
        if lines is None:
            return f"{name} record {item}"
        return f"{name}:{int(np.searchsorted(lines, item - 1, side='left')) + 1}"


def _groups(parts: list) -> list[list]:
    groups: dict[str, list] = {}
    for p in parts:
        groups.setdefault(p.group, []).append(p)
    return list(groups.values())


def _newlines(path: str) -> np.ndarray:
    with open(path, "rb") as f:
        return np.flatnonzero(np.frombuffer(f.read(), np.uint8) == 10)


def audit_text(ledger: Ledger, auditor: TextAuditor | None = None) -> AuditReport:
    """Audit a text/SFT ledger (see the module docstring); `auditor` None: the counts alone."""
    auditor = auditor or TextAuditor(ledger.sources, read=False)
    pieces = ledger.pieces
    dropped_mask = (pieces["start"] == 0) & (pieces["end"] == 0)
    by_id = (pieces["start"] == SKIPPED) & (pieces["end"] == SKIPPED)  # dropped by id: the generic audit counts them
    weights = [s.get("weight") for s in ledger.sources]
    kept = replace(ledger, pieces=pieces[~dropped_mask])
    amounts = mixed_amounts(kept)
    report = audit(kept, weights=weights if all(w is not None for w in weights) else None, amounts=amounts,
                   judge=judge(kept, amounts))
    report.repeated, report.missing = [], []
    trained, dropped, skipped = pieces[~dropped_mask & ~by_id], pieces[dropped_mask], np.unique(pieces[by_id][_DOC])
    names = ledger.names
    for s in range(len(ledger.sources)):  # read first: a record is then named by its file and line
        auditor.partitions(s)
        mine = pieces[pieces["source"] == s]
        auditor.align(s, {names[int(n)]: mine["item"][mine["name"] == n].astype(np.int64)
                          for n in np.unique(mine["name"]).tolist() if n >= 0})

    def say(p: Any) -> str:
        s = int(p["source"])
        src = ledger.sources[s]["name"] if s < len(ledger.sources) else f"source {s}"
        return f"{src} pass {int(p['epoch'])} {auditor.where(names[int(p['name'])], int(p['item']))}"

    repeated, holes = _tiling(trained)
    report.repeated += [f"{say(p)} tokens {int(p['start'])}-{int(p['end'])} trained again" for p in repeated[:SHOW]]
    report.missing += [f"{say(p)} tokens {a}-{b} never trained" for p, a, b in holes[:SHOW]]
    docs = np.unique(trained[_DOC])
    drops = np.unique(dropped[_DOC])
    both = np.intersect1d(docs, drops)
    report.repeated += [f"{say(p)} was trained and also dropped as a duplicate" for p in both[:SHOW]]
    again = np.intersect1d(docs, skipped)  # skipped by id in a pass that also trained it: read twice
    report.repeated += [f"{say(p)} was trained and also skipped by id" for p in again[:SHOW]]
    report.counts["repeated"] = len(repeated) + len(both) + len(again)
    report.counts["dropped"] = len(drops)
    if len(drops):
        report.accounted.append(f"dropped: {len(drops):,} records read and not trained (duplicates, or nothing to "
                                "train on), accounted for")
    report.once, report.unit = len(docs), "documents"
    flight = _in_flight(ledger, docs.dtype)
    seen = np.union1d(np.union1d(np.union1d(docs, drops), flight), skipped)
    missing = _missing_records(ledger, auditor, seen, say, report)
    report.counts["missing"] = len(holes) + missing + verify_rows(ledger, auditor, trained, flight, say, report)
    report.problems += auditor.problems
    report.unchecked += auditor.unchecked
    return report


def _in_flight(ledger: Ledger, dtype: np.dtype) -> np.ndarray:
    """Records the run's last commits hold read but not yet trained (a packer's buffer): not missing."""
    names = {n: i for i, n in enumerate(ledger.names)}
    found = [(s, e, names[n], item) for header in ledger.last_headers.values()
             for s, e, n, item in header.get("in_flight", []) if n in names]
    return np.unique(np.array(found, dtype=dtype)) if found else np.zeros(0, dtype)


def _tiling(trained: np.ndarray) -> tuple[list[Any], list[tuple[Any, int, int]]]:
    """Pieces that overlap an earlier piece of their document, and holes (a document's ranges must tile it)."""
    order = np.lexsort((trained["start"], trained["item"], trained["name"], trained["epoch"], trained["source"]))
    sorted_ = trained[order]
    repeated, holes = [], []
    prev_doc, prev_end = None, 0
    for p in sorted_:
        doc = (int(p["source"]), int(p["epoch"]), int(p["name"]), int(p["item"]))
        start, end = int(p["start"]), int(p["end"])
        if doc != prev_doc:
            if start > 0:
                holes.append((p, 0, start))
            prev_doc, prev_end = doc, end
            continue
        if start < prev_end:
            repeated.append(p)
        elif start > prev_end:
            holes.append((p, prev_end, start))
        prev_end = max(prev_end, end)
    return repeated, holes


def _missing_records(ledger: Ledger, auditor: TextAuditor, seen: np.ndarray, say: Any, report: AuditReport) -> int:
    """Records of each re-read partition that a pass it went past, or the part of a pass before its last read, lacks."""
    total = 0
    names = {n: i for i, n in enumerate(ledger.names)}
    for s in range(len(ledger.sources)):
        parts = auditor.partitions(s)
        mine = seen[seen["source"] == s]
        if parts is None or not len(mine):
            continue
        for _, name, offsets in parts:
            n = names.get(name)
            if n is None or not len(offsets):
                continue
            at = mine[mine["name"] == n]
            at = at[np.isin(at["item"].astype(np.int64), offsets)]
            if not len(at):
                continue
            last_pass = int(at["epoch"].max())
            for epoch in range(int(at["epoch"].min()), last_pass + 1):
                got = at["item"][at["epoch"] == epoch].astype(np.int64)
                if epoch == last_pass:  # the pass it stands in: every record before the last one read
                    index = np.flatnonzero(np.isin(offsets, got))
                    want = offsets[: int(index.max()) + 1] if len(index) else offsets[:0]
                else:
                    want = offsets
                gone = np.setdiff1d(want, got)
                total += len(gone)
                for item in gone[: max(0, SHOW - len(report.missing))]:
                    p = np.zeros(1, ledger.pieces.dtype)[0]
                    p["source"], p["epoch"], p["name"], p["item"] = s, epoch, n, item
                    report.missing.append(f"{say(p)} was never trained"
                                          + (" (its pass is complete)" if epoch < last_pass else ""))
    return total
