"""The work folder's layout shared by the stages: record ids and where each input's scan files live.

A record's id is `file index << 40 | record index in the file`, so sorting ids is input order
(2^40 records per input, 2^24 inputs).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from llm.data.corpus_dedup.runs import RunSlice

ID_SHIFT = 40


def record_id(file_index: int, index: np.ndarray) -> np.ndarray:
    return (np.uint64(file_index) << np.uint64(ID_SHIFT)) | index.astype(np.uint64)


def split_id(ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(file index, record index in the file) of each id."""
    ids = np.asarray(ids).astype(np.uint64)
    return (ids >> np.uint64(ID_SHIFT)).astype(np.int64), (ids & np.uint64((1 << ID_SHIFT) - 1)).astype(np.int64)


def scan_dir(work: Path, file_index: int) -> Path:
    """The committed scan folder of input `file_index`."""
    return work / "scan" / f"{file_index:05d}"


def read_meta(work: Path, file_index: int) -> dict:
    """A committed scan's records and records per chunk."""
    return json.loads((scan_dir(work, file_index) / "meta.json").read_text())


def chunk_runs(work: Path, files: int, stem: str, band: int = 0,
               chunks: tuple[tuple[int, ...], ...] = ()) -> list[RunSlice]:
    """Every scan chunk's run in `<stem>-CCCCC.run` (the `band`-th: one run per band in a file).

    `chunks`: each input's records per chunk when the caller has them, else read from the scans' meta.json.
    """
    counts = chunks or tuple(read_meta(work, f)["chunks"] for f in range(files))
    return [(scan_dir(work, f) / f"{stem}-{c:05d}.run", band * n, n) for f in range(files) for c, n in enumerate(counts[f])]
