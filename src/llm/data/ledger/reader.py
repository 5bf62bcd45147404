"""Reading a ledger folder back: every segment checked, and the chain of resumes the run stands on.

The run stands on its last generation, on the generation that one resumed from up to the step
it resumed at, and so on back to generation 0. Rows outside that chain were trained by a run
that a later resume abandoned: a segment written past a checkpoint that never landed (the
writer deletes those when it resumes), or a resume from an older checkpoint on top of a newer
ledger. They are kept apart (`abandoned`) and named by `audit`, never counted as trained.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from llm.data.ledger.format import (
    HEADER_NAME,
    PIECE,
    ROW,
    LedgerError,
    decode_segment,
    parse_segment_name,
    read_header,
)


@dataclass
class Ledger:
    """A ledger as read: the rows and pieces the run stands on, with names resolved, and what was set apart."""

    folder: Path
    header: dict[str, Any]
    rows: np.ndarray  # ROW, plus the segment's rank and generation in `ranks` / `generations`
    ranks: np.ndarray
    generations: np.ndarray
    pieces: np.ndarray  # PIECE; row_ref indexes `rows`; name indexes `names`
    names: list[str]
    markers: dict[int, dict[str, Any]]
    abandoned: list[tuple[int, int, int, int]] = field(default_factory=list)  # (rank, generation, first, last)
    damaged: list[str] = field(default_factory=list)  # one sentence per unreadable segment
    # rank -> the header of its last segment the run stands on (its `in_flight` records: read, not yet trained)
    last_headers: dict[int, dict[str, Any]] = field(default_factory=dict)
    skipped: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))  # per row: read but not trained

    @property
    def trained(self) -> np.ndarray:
        """Per row: trained (not a skipped step's)."""
        return ~self.skipped if len(self.skipped) == len(self.rows) else np.ones(len(self.rows), bool)

    @property
    def sources(self) -> list[dict[str, Any]]:
        return list(self.header.get("sources", []))


def _standing(markers: dict[int, dict[str, Any]], generations: list[int], tip: int | None = None) -> dict[int, int | None]:
    """generation -> the last step of it the run stands on (None: all of it), following resumes back from
    `tip` (the generation a checkpoint stands on; None: the last one)."""
    if not generations:
        return {}
    last = max(generations) if tip is None else tip
    keep: dict[int, int | None] = {last: None}
    g, seen = last, {last}
    while g > 0:
        back = (markers.get(g) or {}).get("resumed_from")
        if not back:
            break
        parent, step = int(back["generation"]), int(back["step"])
        if parent in seen:
            break
        keep[parent] = step
        seen.add(parent)
        g = parent
    return keep


def _marker_ok(marker: Any) -> bool:
    back = marker.get("resumed_from") if isinstance(marker, dict) else None
    return isinstance(back, dict) and all(isinstance(back.get(k), int) and not isinstance(back.get(k), bool)
                                          for k in ("generation", "step"))


def read_ledger(folder: str | os.PathLike, run: str | None = None, tip: int | None = None) -> Ledger:
    """Read and check a ledger folder; damaged segments are named in `damaged`, the rest is read.

    `tip`: the generation the run stands on (a checkpoint's); later generations, a branch resumed
    elsewhere from an earlier checkpoint, are set apart in `abandoned` like the steps a resume left."""
    folder = Path(folder)
    header = read_header(folder)
    if header is None:
        raise LedgerError(f"{folder} holds no ledger ({HEADER_NAME} is missing); pass the folder the run wrote "
                          "(llm-train writes RUN_DIR/ledger)")
    if run is not None and header.get("run") != run:
        raise LedgerError(f"{folder} is the ledger of run {header.get('run')}, not of run {run}; "
                          "pass the ledger folder of this run")
    markers: dict[int, dict[str, Any]] = {}
    damaged: list[str] = []
    segments: list[tuple[tuple[int, int, int, int], str]] = []
    for entry in sorted(os.listdir(folder)):
        parsed = parse_segment_name(entry)
        if parsed:
            segments.append((parsed, entry))
        elif entry.startswith("g") and entry.endswith(".json") and entry[1:-5].isdigit():
            try:
                marker = json.loads((folder / entry).read_bytes())
            except ValueError:
                damaged.append(f"{folder / entry} is not valid JSON; the resume it records cannot be followed")
                continue
            if _marker_ok(marker):
                markers[int(entry[1:-5])] = marker
            else:
                damaged.append(f"{folder / entry} is not a resume marker (no resumed_from {{generation, step}} as "
                               "integers); the resume it records cannot be followed")
    keep = _standing(markers, sorted({p[1] for p, _ in segments} | set(markers)), tip)
    out = _Collect()
    abandoned: list[tuple[int, int, int, int]] = []
    latest: dict[int, tuple[int, int]] = {}
    last_headers: dict[int, dict[str, Any]] = {}
    for parsed, entry in segments:
        rank, generation, first, last = parsed
        limit = keep.get(generation, -1)
        if limit == -1 or (limit is not None and first > limit):
            abandoned.append(parsed)
            continue
        try:
            segment = decode_segment((folder / entry).read_bytes(), str(folder / entry))
        except LedgerError as e:
            damaged.append(str(e))
            continue
        said = tuple(segment.header.get(k) for k in ("rank", "generation", "first_step", "last_step"))
        if said != parsed:  # renamed by hand: its name would place its steps where they were not trained
            damaged.append(f"{folder / entry} holds rank {said[0]} generation {said[1]} steps {said[2]}-{said[3]} "
                           "but is named otherwise; it was renamed, so its steps are not counted")
            continue
        if segment.header.get("run") != header.get("run"):
            damaged.append(f"{folder / entry} belongs to run {segment.header.get('run')}, not to this ledger's run "
                           f"{header.get('run')}; it was copied in from another run and is not counted")
            continue
        rows, pieces = segment.rows, segment.pieces
        if limit is not None and last > limit:  # the part past the resume point was abandoned
            abandoned.append((rank, generation, limit + 1, last))
            rows_kept = rows["step"] <= limit
            pieces = pieces[rows_kept[pieces["row_ref"]]]
            remap = np.cumsum(rows_kept) - 1
            pieces["row_ref"] = remap[pieces["row_ref"]]
            rows = rows[rows_kept]
        out.add(rows, pieces, segment.names, rank, generation, segment.header.get("skipped") or [])
        if limit is None and (generation, last) > latest.get(rank, (-1, -1)):  # the last generation's newest
            latest[rank] = (generation, last)
            last_headers[rank] = segment.header
    rows, ranks, gens, pieces, names = out.tables()
    return Ledger(folder, header, rows, ranks, gens, pieces, names, markers, abandoned, damaged,
                  last_headers=last_headers, skipped=np.concatenate(out.skipped) if out.skipped else np.zeros(0, bool))


class _Collect:
    """Concatenates segments, re-basing each one's row references and name indexes."""

    def __init__(self) -> None:
        self.rows, self.pieces, self.ranks, self.gens, self.skipped = [], [], [], [], []
        self.names: dict[str, int] = {}
        self.n_rows = 0

    def add(self, rows: np.ndarray, pieces: np.ndarray, names: list[str], rank: int, generation: int,
            skipped: list[int]) -> None:
        pieces = pieces.copy()
        pieces["row_ref"] += self.n_rows
        if names:
            table = np.array([self.names.setdefault(n, len(self.names)) for n in names], dtype=np.int32)
            named = pieces["name"] >= 0
            pieces["name"][named] = table[pieces["name"][named]]
        self.rows.append(rows)
        self.pieces.append(pieces)
        self.ranks.append(np.full(len(rows), rank, np.int32))
        self.gens.append(np.full(len(rows), generation, np.int32))
        self.skipped.append(np.isin(rows["step"], np.asarray(skipped, np.uint64)))
        self.n_rows += len(rows)

    def tables(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, list[str]]:
        def cat(parts: list[np.ndarray], dtype: Any) -> np.ndarray:
            return np.concatenate(parts) if parts else np.empty(0, dtype)
        names = sorted(self.names, key=self.names.__getitem__)
        return (cat(self.rows, ROW), cat(self.ranks, np.int32), cat(self.gens, np.int32),
                cat(self.pieces, PIECE), names)
