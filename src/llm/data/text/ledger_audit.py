"""Audit of a text or SFT ledger: every record's token ranges trained once, records of a pass never read.

It counts from the ledger's pieces alone and checks against the files as they are on disk now,
read the way the stream read them (`TextAuditor`, through the inputs wing). Per source and pass:

* each document's ranges must tile it from token 0 without overlap: an overlap is a repeat (a
  replayed batch, a resume from a wrong state), a hole is a part never trained (a skipped batch);
* records trained in two rows' worth of the same range, or trained and also dropped: repeated;
* records of a partition never read: all of a pass the partition went past, and in the pass it
  stands in, each one before the last record read (a skipped worker chunk, a cursor edited by hand);
* records a dedup source dropped (pieces with start == end == 0): counted as accounted for;
* each source's share of the rows against its weight, and the generic checks (`ledger/audit.py`).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from llm.data.inputs.local import LocalLineTextSource
from llm.data.inputs.partitions import stripe_partitions
from llm.data.ledger.audit import SHOW, AuditReport, audit
from llm.data.ledger.format import checksum_rule
from llm.data.ledger.reader import Ledger
from llm.data.text.provenance import record_name
from llm.data.tokenize.documents import encode_each
from llm.data.tokenize.tokenizers import load_tokenizer

_DOC = ["source", "epoch", "name", "item"]


class TextAuditor:
    """The text sources a ledger header names, read again: each partition's records in the order read."""

    def __init__(self, sources: list[dict[str, Any]], read: bool = True):
        self.sources = sources
        self.read = read  # False (--no-verify): the counts alone, no file is read
        self.problems: list[str] = []
        self._parts: dict[int, list[tuple[str, str, np.ndarray]] | None] = {}
        self._lines: dict[str, np.ndarray] = {}  # a plain line file's newline offsets, for file:line
        self._bases: list[tuple[int, str, Any]] = []  # (source, recorded name, base partition) read again
        self._sources: dict[int, LocalLineTextSource] = {}

    def partitions(self, s: int) -> list[tuple[str, str, np.ndarray]] | None:
        """(partition key, recorded name, record offsets in read order) of source s; None when not re-read."""
        if s not in self._parts:
            self._parts[s] = self._read(s)
        return self._parts[s]

    def _read(self, s: int) -> list[tuple[str, str, np.ndarray]] | None:
        info = self.sources[s]
        if info.get("kind") != "local" or not self.read:
            return None
        try:
            src = LocalLineTextSource(list(info["paths"]), info["text_column"], info["partition_bytes"])
        except (OSError, ValueError) as e:
            self.problems.append(f"{info['name']} cannot be read to check it: {e}")
            return None
        saved, now = info.get("fingerprint", {}), src.source_fingerprint()
        if saved.get("bytes") != now["bytes"] or list(saved.get("stamps", {}).values()) != list(now["stamps"].values()):
            self.problems.append(f"{info['name']} ({', '.join(info['files'])}) changed since the run: its files' sizes "
                                 "or stamps differ; its records are not checked against it")
            return None
        self._sources[s] = src
        recorded = dict(zip(info["paths"], info["files"]))
        out = []
        for group in _groups(stripe_partitions(src.partitions())):
            base = group[0]
            if base.base is not None:
                base = replace(base, key=base.base, stripe=None, stripes=1, base=None)
            offsets = np.array([after for _, after, _ in src.iter_partition(base, 0)], np.int64)
            name = record_name(replace(base, path=recorded.get(base.path or "", base.path)))
            if base.seekable and base.path is not None:
                self._lines.setdefault(name, _newlines(base.path))
            self._bases.append((s, name, base))
            for part in group:
                mine = offsets if part.stripe is None else offsets[(offsets - 1) % part.stripes == part.stripe]
                out.append((part.key, name, mine))
        return out

    def documents(self, s: int, wanted: set[tuple[str, int]]) -> dict[tuple[str, int], str]:
        """The texts of the wanted (name, record) of source s, read again."""
        out = {}
        for source, name, base in self._bases:
            if source == s and any(n == name for n, _ in wanted):
                for text, after, _ in self._sources[s].iter_partition(base, 0):
                    if (name, after) in wanted:
                        out[(name, after)] = text
        return out

    def where(self, name: str, item: int) -> str:
        """A record as `why` names it: FILE:LINE in a plain line file, else FILE record N."""
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
    weights = [s.get("weight") for s in ledger.sources]
    report = audit(replace(ledger, pieces=pieces[~dropped_mask]),
                   weights=weights if all(w is not None for w in weights) else None)
    report.repeated, report.missing = [], []
    trained, dropped = pieces[~dropped_mask], pieces[dropped_mask]
    names = ledger.names
    for s in range(len(ledger.sources)):  # read first: a record is then named by its file and line
        auditor.partitions(s)

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
    report.counts["repeated"] = len(repeated) + len(both)
    report.counts["dropped"] = len(drops)
    if len(drops):
        report.accounted.append(f"dropped: {len(drops):,} records read and not trained (duplicates, or nothing to "
                                "train on), accounted for")
    report.once, report.unit = len(docs), "documents"
    flight = _in_flight(ledger, docs.dtype)
    missing = _missing_records(ledger, auditor, np.union1d(np.union1d(docs, drops), flight), say, report)
    report.counts["missing"] = len(holes) + missing + _verify_tokens(ledger, auditor, trained, flight, say, report)
    report.problems += auditor.problems
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


def _verify_tokens(ledger: Ledger, auditor: TextAuditor, trained: np.ndarray, flight: np.ndarray, say: Any,
                   report: AuditReport) -> int:
    """Token rows rebuilt from their documents as stored now: the checksum must match, and every document's
    last range must reach its end (its last id; greedy packing's next window holds its EOS). Returns the holes."""
    holes, bad = 0, np.zeros(len(ledger.rows), bool)
    checked = np.zeros(len(ledger.rows), bool)
    checksum = checksum_rule(ledger.header)  # version 1 ledgers: their own rule
    for s, info in enumerate(ledger.sources):
        stream = info.get("stream") or {}
        mine = trained[trained["source"] == s]
        if stream.get("rows") != "tokens" or auditor.partitions(s) is None or not len(mine):
            continue
        tokenizer = load_tokenizer(stream["tokenizer"])
        if tokenizer.fingerprint() != stream.get("tokenizer_fingerprint"):
            report.accounted.append(f"{info['name']}: tokens not checked (the tokenizer {stream['tokenizer']} "
                                    "is not the one the run used)")
            continue
        names = ledger.names
        wanted = {(names[int(n)], int(i)) for n, i in np.unique(mine[["name", "item"]]).tolist()}
        texts = auditor.documents(s, wanted)
        keys = list(texts)
        docs = dict(zip(keys, (np.append(ids, stream["eos_id"]) for ids in encode_each(tokenizer, [texts[k] for k in keys]))))
        ends: dict[tuple[str, int, int], int] = {}
        held = {(names[int(n)], int(i), int(e)) for e, n, i in flight[flight["source"] == s][["epoch", "name", "item"]].tolist()}
        for p in mine:
            key = (names[int(p["name"])], int(p["item"]))
            doc_end = (key[0], key[1], int(p["epoch"]))
            ends[doc_end] = max(ends.get(doc_end, 0), int(p["end"]))
        for (name, item, epoch), end in ends.items():
            doc = docs.get((name, item))
            if doc is not None and end < len(doc) - 1 and (name, item, epoch) not in held:  # held: its tail is to come
                holes += 1
                if len(report.missing) < SHOW:
                    report.missing.append(f"{info['name']} pass {epoch} {auditor.where(name, item)} tokens "
                                          f"{end}-{len(doc) - 1} never trained")
        by_row = mine[np.argsort(mine["row_ref"], kind="stable")]  # each row's pieces together, in their order
        for row in np.split(by_row, np.flatnonzero(np.diff(by_row["row_ref"])) + 1):
            r = int(row["row_ref"][0])
            checked[r] = True
            parts = [docs.get((names[int(p["name"])], int(p["item"])), np.zeros(0, np.int64))[int(p["start"]):int(p["end"])]
                     for p in row]
            ids = np.full(stream["max_seq_len"], stream["eos_id"], np.int64)
            held = np.concatenate(parts) if parts else ids[:0]
            ids[: len(held)] = held[: len(ids)]
            bad[r] = int(checksum(ids[None])[0]) != int(ledger.rows["crc"][r])
    if bad.any():
        r = int(np.flatnonzero(bad)[0])
        report.problems.append(f"{int(bad.sum())} of {int(checked.sum())} trained rows no longer match the files on "
                               f"disk (first: step {int(ledger.rows['step'][r])} row {int(ledger.rows['row'][r])}); "
                               "the data changed since the run")
    return holes
