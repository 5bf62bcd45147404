"""The band stage: one band's key runs merged, candidate pairs formed and verified, edges committed.

Every scan chunk wrote, per band, a run of (band key, id) rows sorted by key then id.
Merging a band's runs (`runs.merge_runs`, memory bounded by a block per run) brings
records with equal keys together in input order. In each group every record is paired
with the group's first record and with the one before it (a star plus a chain: the
group is connected when all pairs verify, with 2n pairs rather than n^2). Pairs are
verified (`verify.py`) and written with their estimated similarity to `band-BBB.pairs`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from llm.data.corpus_dedup.commit import commit_file, kill_point, remove_leftovers, tmp_name
from llm.data.corpus_dedup.runs import group_starts, merge_runs, unique_pairs
from llm.data.corpus_dedup.scan import BAND_ROW
from llm.data.corpus_dedup.verify import Signatures
from llm.data.corpus_dedup.workdir import chunk_runs, scan_dir

EDGE_ROW = np.dtype([("a", "<u8"), ("b", "<u8"), ("sim", "<f4")])


def band_file(work: Path, band: int) -> Path:
    return work / "bands" / f"band-{band:03d}.pairs"


def candidate_pairs(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(earlier, later) id pairs of a merged block: each record with its group's first and previous one."""
    starts = group_starts([rows["key"]])
    sizes = np.diff(np.append(starts, len(rows)))
    first = np.repeat(starts, sizes)
    ids = rows["id"]
    later = np.flatnonzero(np.arange(len(rows)) != first)
    a = np.concatenate((ids[first[later]], ids[later - 1]))
    b = np.concatenate((ids[later], ids[later]))
    return unique_pairs(a, b)


@dataclass(frozen=True)
class BandTask:
    """Merge, pair and verify band `todo[task_id]` into `work/bands/band-BBB.pairs`."""

    work: Path
    files: int
    num_perm: int
    block_rows: int
    todo: tuple[int, ...]
    sync_dir: bool = True  # False: the pipeline fsyncs `bands/` once after the stage (commit.commit_file)
    chunks: tuple[tuple[int, ...], ...] = ()  # each input's records per chunk (the driver read them: not once a band)

    def __call__(self, task_id: int, report) -> int:
        band = self.todo[task_id]
        final = band_file(self.work, band)
        final.parent.mkdir(parents=True, exist_ok=True)
        remove_leftovers(final.parent, final.name)
        signatures = Signatures([scan_dir(self.work, f) for f in range(self.files)], self.num_perm)
        tmp = tmp_name(final)
        runs = chunk_runs(self.work, self.files, "bands", band, self.chunks)
        count = 0
        with open(tmp, "wb") as out:
            for rows in merge_runs(runs, BAND_ROW, ("key",), self.block_rows):
                a, b = candidate_pairs(rows)
                edges = np.empty(len(a), dtype=EDGE_ROW)
                edges["a"], edges["b"], edges["sim"] = a, b, signatures.similarity(a, b)
                out.write(edges.tobytes())
                count += len(edges)
                report(len(rows), 0)
        commit_file(tmp, final, self.sync_dir)
        kill_point(f"band:{band}")
        return count


def read_edges(path: Path) -> np.ndarray:
    return np.fromfile(path, dtype=EDGE_ROW)
