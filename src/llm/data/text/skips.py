"""Text and SFT streams' side of `skip_documents`: ids checked against the files, and a record dropped where it is read.

A skipped record is read like any other (its place in a mixture's draws, its dedup digest) and
then, instead of being tokenized and packed, only moves its partition's cursor past it, exactly
as a record fed to the packer would (`skip_record`). So the order of every other record, and
every cursor, is what it would be without the skip; the rows simply lack that document. With a
ledger the record is recorded as a piece with start == end == SKIPPED (text/provenance.py), once
the cursor has passed it, so `audit` counts it as skipped.

A record whose cut into rows was under way at the checkpoint the run resumes from (a long
document, greedy packing's cursor `skip`) was read already: it trains to its end, and is dropped
from its next pass on.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from llm.data.inputs.source import Partition
from llm.data.pack.best_fit import BestFitPacker
from llm.data.pack.window import WindowCutter
from llm.data.skip_documents import (
    STATE_KEY,
    SkipDocumentsError,
    parse_id,
    read_ids,
    split_source,
    state_ids,
    union,
)
from llm.data.stage import StateError
from llm.data.text.provenance import record_name

Skips = dict[tuple[int, str], frozenset[int]]  # (source, record name) -> records (offsets after) to drop


def text_skips(ids: list[str], names: list[str], partitions: list[Partition]) -> Skips:
    """Each id resolved to (source, file, record) and checked: its source is one of `names`, its file one the
    source reads, and in a plain line file its offset ends a line (SkipDocumentsError naming the id)."""
    if not ids:
        return {}
    files: dict[tuple[int, str], list[Partition]] = {}
    for part in partitions:
        files.setdefault((part.source, record_name(part)), []).append(part)
    out: dict[tuple[int, str], set[int]] = {}
    for raw in ids:
        doc = parse_id(raw)
        if doc.kind != "text":
            raise SkipDocumentsError(f"data.skip_documents: document id {raw!r} names a document of token shards "
                                     "(SOURCE@TOKEN), but this run reads text; use SOURCE:FILE:RECORD as "
                                     "`llm-train why` prints it for this run")
        found = split_source(doc.head, names)
        if found is None:
            raise SkipDocumentsError(f"data.skip_documents: document id {raw!r} names no source of this stream (its "
                                     f"sources: {', '.join(names)}); copy the id from `llm-train why` of this run")
        source, name = found
        parts = files.get((source, name))
        if parts is None:
            listed = sorted(n for s, n in files if s == source)
            shown = ", ".join(listed[:5]) + (f" and {len(listed) - 5} more" if len(listed) > 5 else "")
            raise SkipDocumentsError(f"data.skip_documents: document id {raw!r} names {name!r}, which source "
                                     f"{names[source]} does not read (it reads {shown})")
        _check_record(raw, parts, doc.number)
        out.setdefault((source, name), set()).add(doc.number)
    return {k: frozenset(v) for k, v in out.items()}


def _check_record(raw: str, parts: list[Partition], record: int) -> None:
    """In a plain line file a record's offset ends a line (checked with one byte read); elsewhere (compressed
    files, JSON arrays, parquet row groups, Hugging Face shards) the number is taken as given."""
    if record < 1:
        raise SkipDocumentsError(f"data.skip_documents: document id {raw!r} ends in record {record}; records "
                                 "count from 1 (a line file's offsets are the byte after the record)")
    part = parts[0]
    if not part.seekable or part.path is None or not Path(part.path).is_file():
        return
    path = Path(part.path)
    size = path.stat().st_size
    if record > size:
        raise SkipDocumentsError(f"data.skip_documents: document id {raw!r} is past the end of {part.path} "
                                 f"({size:,} bytes); copy the id from `llm-train why` of this run")
    if record < size:
        with open(path, "rb") as f:
            f.seek(record - 1)
            if f.read(1) != b"\n":
                raise SkipDocumentsError(f"data.skip_documents: document id {raw!r} does not end a record of "
                                         f"{part.path} (byte {record} is not after a line end); copy the id from "
                                         "`llm-train why` of this run")


def skip_record(packer: Any, offset_after: int, tokens: int) -> None:
    """Move the packer's cursor past one record, as feeding it would, without packing anything of it.

    `tokens`: the record's tokens when it was encoded anyway (a mixture of token shares draws by them), so
    the cursor's token count, which a resumed mixture draws from, is what it would be without the skip."""
    tracker = packer if hasattr(packer, "packer") else None
    inner = tracker.packer if tracker is not None else packer
    if tracker is not None:
        tracker.skipped(offset_after)
    if isinstance(inner, WindowCutter):
        inner.offset, inner.records, inner.tokens = offset_after, inner.records + 1, inner.tokens + tokens
        inner._anchor, inner.skip = (inner.offset, inner.records, inner._snapshot(), inner.tokens), 0
    elif isinstance(inner, BestFitPacker):
        inner._consumed(offset_after, tokens)
    else:  # one sample a row (sft/stream.py RecordCursor)
        inner.offset, inner.records, inner.tokens = offset_after, inner.records + 1, inner.tokens + tokens


class SkipHooks:
    """A text module's `skip_documents`: the ids (the union of its own and a loaded state's) and their records.

    Kept in every state (`skip_documents`), so a resume, also one given a shorter list, keeps dropping them."""

    _skip_ids: list[str]
    _skips: Skips | None

    def _set_skips(self, value: Any) -> None:
        self._skip_ids, self._skips = read_ids(value), None
        if self._skip_ids:
            self.document_skips()  # checked against the sources now, before any batch

    @property
    def skip_documents(self) -> list[str]:
        """The document ids this stream drops (its own and those of the state it resumed from)."""
        return list(self._skip_ids)

    def document_skips(self) -> Skips:
        if self._skips is None:
            self._skips = text_skips(self._skip_ids, self._source_names(), self.partitions())  # type: ignore[attr-defined]
        return self._skips

    def _skip_state(self, state: dict) -> dict:
        if self._skip_ids:
            state[STATE_KEY] = list(self._skip_ids)
        return state

    def _check_skips(self, state: dict) -> list[str]:
        try:
            ids = union(state_ids(state), self._skip_ids)
            text_skips(ids, self._source_names(), self.partitions())  # type: ignore[attr-defined]
        except SkipDocumentsError as e:
            raise StateError(str(e)) from None
        return ids

    def _restore_skips(self, state: dict) -> None:
        self._skip_ids, self._skips = union(state_ids(state), self._skip_ids), None
