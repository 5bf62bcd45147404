"""What each row a text worker makes holds, for the run ledger: every document in it with its token range.

A tracker stands in for one partition's packer (same `feed` / `finish` / `cursor`) and, after each
row the packer yields, leaves in `last` the row's (source, pass, [(name, record, start, end), ...]).
`name` is the file (or object, or parquet row group) and `record` the offset the source yields after
the record: a byte offset in a plain line file, a record number otherwise (`record_name`). A range
is the document's tokens (its ids, then EOS) that the row's `input_ids` hold, so a document split
over rows tiles its tokens once. The rows' documents come from what the packer was fed, never from
the cursor; what a cursor carries over (greedy packing's token buffer, best fit's open blocks) keeps
its documents in the cursor too (`ledger_buffer`, `ledger_blocks`), so a resume still names them.

Only a stream with a ledger makes trackers: without one nothing here runs.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from typing import Any

import numpy as np

from llm.data.inputs.source import Partition
from llm.data.ledger.format import PIECE
from llm.data.pack.best_fit import BestFitCutter, BestFitPacker
from llm.data.pack.window import WindowCutter
from llm.data.skip_documents import SKIPPED

Piece = tuple[str | None, int, int, int]  # (name, record, start, end); name None: a document not known


def record_name(part: Partition) -> str:
    """The name a ledger gives a partition's records: its file (with the row group), else its group's key."""
    if part.path is None:
        return part.group
    return f"{part.path}#rg{part.shard}" if part.shard is not None else part.path


def track(packer: Any, cursor: dict | None, name: str, source: int, epoch: int) -> Tracker:
    """The tracker for a packer made by a batch format (greedy windows, best fit, or one sample a row)."""
    if isinstance(packer, WindowCutter):
        return WindowTracker(packer, cursor, name, source, epoch)
    if isinstance(packer, BestFitPacker):
        return BlockTracker(packer, cursor, name, source, epoch)
    return Tracker(packer, cursor, name, source, epoch)


class Tracker:
    """One sample a row (SFT without packing): the row is the record's sample, all of it."""

    def __init__(self, packer: Any, cursor: dict | None, name: str, source: int, epoch: int):
        self.packer, self.name, self.source, self.epoch = packer, name, source, epoch
        self.last: tuple[int, int, list[Piece]] = (source, epoch, [])
        # records read that make no row (a duplicate dropped, a sample with nothing to train on), held until
        # the cursor passes them (`released`): a state saved earlier reads them again, so they count then
        self.drops: deque[tuple[int, int, Piece]] = deque()
        # the last record fed: while it is cut (a cursor's `skip`), it is in flight; a resume cuts it on
        cutting = (cursor or {}).get("ledger_cutting") if (cursor or {}).get("skip") else None
        self.fed = int(cutting[1]) if cutting else -1

    # the packer's own interface, which the dataset reads
    @property
    def offset(self) -> int:
        return self.packer.offset

    @property
    def records(self) -> int:
        return self.packer.records

    @property
    def done(self) -> bool:
        return self.packer.done

    def cursor(self) -> dict:
        return self.packer.cursor()

    def _cutting(self, cursor: dict) -> dict:
        """A long record cut across rows: the cursor stays before it, so it is read again on resume (in flight)."""
        if cursor["skip"] and self.fed >= 0:
            cursor["ledger_cutting"] = [self.name, self.fed]
        return cursor

    def drop(self, record: int) -> None:
        """A record read and not trained (a duplicate, or nothing to train on): start == end == 0."""
        self.drops.append((self.source, self.epoch, (self.name, record, 0, 0)))

    def skipped(self, record: int) -> None:
        """A record dropped by id (`skip_documents`): start == end == SKIPPED, released like a drop."""
        self.drops.append((self.source, self.epoch, (self.name, record, SKIPPED, SKIPPED)))

    def released(self, cursor: dict) -> list[tuple[int, int, Piece]]:
        """The drops the cursor has gone past (all of them once the partition is done)."""
        out = []
        while self.drops and (cursor["done"] or self.drops[0][2][1] <= cursor["offset"]):
            out.append(self.drops.popleft())
        return out

    def _rows(self, rows: Iterator[Any], pieces: Any) -> Iterator[Any]:
        for row in rows:
            self.last = (self.source, self.epoch, pieces(row))
            yield row

    def feed(self, item: Any, offset_after: int) -> Iterator[Any]:
        if item is None:  # a record with nothing to train on: read, accounted for, no row
            self.drop(offset_after)
        length = len(item[0]) if isinstance(item, tuple) else 0
        return self._rows(self.packer.feed(item, offset_after), lambda row: [(self.name, offset_after, 0, length)])

    def finish(self) -> Iterator[Any]:
        return self._rows(self.packer.finish(), lambda row: [])


class WindowTracker(Tracker):
    """Greedy windows: consecutive slices of the partition's token stream, `L` apart, overlapping by one token.

    The stream is the cursor's token buffer, then each document fed; `segments` hold
    (name, record, document offset at the segment's start, stream start, stream end).
    """

    def __init__(self, packer: WindowCutter, cursor: dict | None, name: str, source: int, epoch: int):
        super().__init__(packer, cursor, name, source, epoch)
        cursor = cursor or {}
        self.segments: deque[tuple[str | None, int, int, int, int]] = deque()
        at = 0
        known = cursor.get("ledger_buffer")
        if known is None and len(cursor.get("token_buffer", ())):  # saved without a ledger: its documents are unknown
            known = [[None, 0, 0, len(cursor["token_buffer"])]]
        for doc, record, start, end in known or []:
            self.segments.append((doc, record, start, at, at + end - start))
            at += end - start
        self.end = self.last_start = at
        self.pos = int(cursor.get("skip", 0))  # resuming inside a long document: its windows before `skip` are out

    def _take(self, window: np.ndarray) -> list[Piece]:
        a, b = self.pos, self.pos + len(window) - 1  # the window's inputs: all its tokens but the last
        self.pos = b
        pieces = [(doc, record, d + max(a, s) - s, d + min(b, e) - s)
                  for doc, record, d, s, e in self.segments if s < b and e > a and doc is not None]
        keep_from = min(self.pos, self.last_start - self.packer.L)  # the anchor's buffer may still be needed
        while self.segments and self.segments[0][4] <= keep_from:
            self.segments.popleft()
        return pieces

    def feed(self, item: Any, offset_after: int) -> Iterator[Any]:
        self.fed = offset_after
        self.last_start, self.end = self.end, self.end + len(item) + 1
        self.segments.append((self.name, offset_after, 0, self.last_start, self.end))
        return self._rows(self.packer.feed(item, offset_after), self._take)

    def finish(self) -> Iterator[Any]:
        return self._rows(self.packer.finish(), self._take)

    def cursor(self) -> dict:
        cursor = self.packer.cursor()
        size = len(cursor["token_buffer"])
        # the anchor's buffer ends after the last record fed, or before it while that record is being cut
        e = self.end if cursor["skip"] == 0 else self.last_start
        a = e - size
        cursor["ledger_buffer"] = [[doc, record, d + max(a, s) - s, d + min(e, t) - s]
                                   for doc, record, d, s, t in self.segments if s < e and t > a]
        return self._cutting(cursor)


class BlockTracker(Tracker):
    """Best fit: each piece (a window, or an SFT sample) is tagged when made; a block out names its pieces."""

    def __init__(self, packer: BestFitPacker, cursor: dict | None, name: str, source: int, epoch: int):
        super().__init__(packer, cursor, name, source, epoch)
        self.tags: dict[int, tuple] = {}
        self.windows = isinstance(packer, BestFitCutter)
        if self.windows:
            packer.tags = self.tags  # the cutter makes its windows itself: it tags them
        for (pieces, _), known in zip(self._open(), (cursor or {}).get("ledger_blocks", [])):
            for piece, tag in zip(pieces, known):
                self.tags[id(piece)] = ((tag[0], tag[1]), tag[2], tag[3])

    def _open(self) -> list[tuple[list, list]]:
        packer = self.packer
        return list(packer.final) if packer.draining else list(packer.open.blocks.values())

    def _pieces(self, block: list[Any]) -> list[Piece]:
        out = []
        for piece in block:
            tag = self.tags.pop(id(piece), None)
            if tag is not None and tag[0][0] is not None:
                out.append((tag[0][0], tag[0][1], tag[1], tag[2]))
        return out

    def feed(self, item: Any, offset_after: int) -> Iterator[Any]:
        self.fed = offset_after
        if self.windows:
            self.packer.tag = (self.name, offset_after)
        elif isinstance(item, tuple):  # a sample goes into a block as it is
            self.tags[id(item)] = ((self.name, offset_after), 0, len(item[0]))
        elif item is None:
            self.drop(offset_after)
        return self._rows(self.packer.feed(item, offset_after), self._pieces)

    def finish(self) -> Iterator[Any]:
        return self._rows(self.packer.finish(), self._pieces)

    def cursor(self) -> dict:
        cursor = self.packer.cursor()
        cursor["ledger_blocks"] = [[self._known(p) for p in pieces] for pieces, _ in self._open()]
        return self._cutting(cursor)

    def _known(self, piece: Any) -> list:
        (doc, record), start, end = self.tags.get(id(piece), ((None, 0), 0, 0))
        return [doc, record, start, end]


def pieces_array(rows: list[tuple[int, int, list[Piece]]], dropped: list[tuple[int, int, Piece]],
                 packed: list[int] | None = None) -> tuple[np.ndarray, list[str]]:
    """A batch's pieces as a PIECE table (`name` indexes the returned names), dropped records on row 0.

    `packed`: the batch row each of `rows` went in, when a collator packed several into one (SFT's
    sample_packing); a piece's token range then stays its sample's own."""
    names: dict[str, int] = {}
    at = packed or list(range(len(rows)))
    flat = [(at[r], source, epoch, p) for r, (source, epoch, pieces) in enumerate(rows) for p in pieces]
    flat += [(0, source, epoch, p) for source, epoch, p in dropped]
    out = np.array([(r, source, epoch, names.setdefault(doc, len(names)), record, start, end)
                    for r, source, epoch, (doc, record, start, end) in flat], PIECE)
    return out, list(names)
