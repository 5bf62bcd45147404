"""`skip_documents`: document ids as `llm-train why` prints them, read from a list or a file, kept as a union.

Two forms, told apart by the separator before the trailing number:

* text and SFT records: `SOURCE:FILE:RECORD`: the source's name, the file (or object, or
  `FILE#rgN`, or a Hugging Face shard's key) and the record as the ledger stores them (the byte
  offset after the record in a plain line file, its number otherwise). The record is split off
  at the last colon, and the source is matched against the stream's source names, so colons in
  paths (`s3://...`) stay unambiguous;
* token shards: `SOURCE@TOKEN`: the dataset's name and the token offset where the document starts
  in the dataset (the concatenation of its shards).

The streams drop these documents where they would read them (text/skips.py, shards/read/skips.py);
each stream's state keeps the ids (`skip_documents` in a state), and a resume takes the union of
the state's and its own, so a shorter list never brings a document back.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

KEY = "data.skip_documents"
STATE_KEY = "skip_documents"
# a ledger piece with start == end == SKIPPED marks a document (text) or block (shards) dropped by id
SKIPPED = 0xFFFFFFFF
FORMS = "SOURCE:FILE:RECORD for a text or SFT record, SOURCE@TOKEN for a document of token shards"


class SkipDocumentsError(ValueError):
    """A bad document id or id file; the message names it and says what is expected."""


@dataclass(frozen=True)
class DocumentId:
    """One parsed id: `kind` "text" (head is SOURCE:FILE) or "shard" (head is SOURCE), and its number."""

    raw: str
    kind: str
    head: str
    number: int


def parse_id(raw: Any, where: str = KEY) -> DocumentId:
    """One id in either form, or SkipDocumentsError naming it and the forms expected."""
    if not isinstance(raw, str) or not raw.strip():
        raise SkipDocumentsError(f"{where} holds {raw!r}, not a document id; write each as {FORMS} "
                                 "(as `llm-train why` prints it)")
    text = raw.strip()
    digits = len(text) - len(text.rstrip("0123456789"))
    sep = text[-digits - 1] if 0 < digits < len(text) else ""
    head = text[: -digits - 1] if sep else ""
    if sep == ":" and ":" in head and head.split(":", 1)[0] and head.split(":", 1)[1]:
        return DocumentId(text, "text", head, int(text[-digits:]))
    if sep == "@" and head:
        return DocumentId(text, "shard", head, int(text[-digits:]))
    raise SkipDocumentsError(f"{where} holds the malformed document id {text!r}; write it as {FORMS} "
                             "(as `llm-train why` prints it)")


def read_ids(value: Any, key: str = KEY) -> list[str]:
    """The ids of `value` (None, a list of ids, or the path of a file of ids: one a line, `#` comments), sorted
    and without repeats, each parsed; SkipDocumentsError naming the key, the file or the id."""
    if value is None:
        return []
    if isinstance(value, (str, os.PathLike)):
        path = Path(value).expanduser()
        if not path.is_file():
            one = " (one id is written as a list: [ID])" if _is_id(str(value)) else ""
            raise SkipDocumentsError(f"{key} names the file {str(value)!r}, which does not exist "
                                     f"({path.absolute()}); give a file of ids (one a line) or a list of ids{one}")
        lines = path.read_text(encoding="utf-8").splitlines()
        items = [(f"{path} line {n}", line.split("#", 1)[0].strip()) for n, line in enumerate(lines, 1)]
        return canonical([parse_id(text, where).raw for where, text in items if text])
    if not isinstance(value, (list, tuple)):
        raise SkipDocumentsError(f"{key} is {value!r}; give a list of document ids ({FORMS}) or the path of a "
                                 "file of them")
    return canonical([parse_id(v, f"{key}[{i}]").raw for i, v in enumerate(value)])


def _is_id(text: str) -> bool:
    try:
        parse_id(text)
    except SkipDocumentsError:
        return False
    return True


def canonical(ids: Iterable[str]) -> list[str]:
    return sorted(set(ids))


def union(old: Iterable[str], new: Iterable[str]) -> list[str]:
    """A checkpoint's ids and the configured ones: a resume with a shorter list keeps the old ones."""
    return canonical([*old, *new])


def state_ids(state: Any, where: str = "data state") -> list[str]:
    """The ids a saved state keeps (none for a state saved without them); SkipDocumentsError when malformed."""
    saved = state.get(STATE_KEY) if isinstance(state, dict) else None
    if saved is None:
        return []
    if not isinstance(saved, list):
        raise SkipDocumentsError(f"{where} key {STATE_KEY!r} is {saved!r}; expected the list of document ids the "
                                 "stream saved")
    return read_ids(saved, f"{where} key {STATE_KEY!r}")


def split_source(head: str, names: list[str]) -> tuple[int, str] | None:
    """(source index, rest) of a text id's `SOURCE:FILE` against the stream's source names (the longest that
    fits: a name may hold a colon); None when no name fits."""
    best = None
    for i, name in enumerate(names):
        prefix = f"{name}:"
        if head.startswith(prefix) and len(head) > len(prefix) and (best is None or len(name) > len(names[best[0]])):
            best = (i, head[len(prefix):])
    return best


def not_found(raw: str, what: str) -> SkipDocumentsError:
    """The one sentence for an id that names nothing in the data: the id, and what it was checked against."""
    return SkipDocumentsError(f"{KEY}: document id {raw!r} is found nowhere in this run's data ({what}); copy the "
                              "id from `llm-train why` of this run, or drop it from the list")
