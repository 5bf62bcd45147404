"""Exact duplicates: each record's normalised-text digest, and the stage that finds the repeated ones.

The digest is the dedup source's (`llm.data.inputs.dedup`): whitespace collapsed, then
the first 16 bytes of `hash_algo` (sha256 unless told). Every scan chunk writes its
(digest, record id) rows as a sorted run; this stage merges all runs, and in each group
of equal digests the first record in input order is the original, the others its
exact duplicates: the (duplicate, original) pairs it commits.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from llm.data.corpus_dedup.commit import commit_file, kill_point, remove_leftovers, tmp_name
from llm.data.corpus_dedup.runs import RunSlice, group_starts, merge_runs
from llm.data.corpus_dedup.workdir import chunk_runs
from llm.data.inputs.dedup import collapse_whitespace, hasher

DIGEST_ROW = np.dtype([("hi", ">u8"), ("lo", ">u8"), ("id", "<u8")])  # big-endian halves: digest byte order
PAIR_ROW = np.dtype([("id", "<u8"), ("of", "<u8")])


def digest_rows(texts: list[str], ids: np.ndarray, hash_algo: str) -> np.ndarray:
    """One (digest, id) row per record, for its exact-duplicate run (unsorted)."""
    digest = hasher(hash_algo)
    raw = b"".join(digest(collapse_whitespace(t).encode("utf-8", "replace")) for t in texts)
    halves = np.frombuffer(raw, dtype=">u8").reshape(-1, 2)
    rows = np.empty(len(texts), dtype=DIGEST_ROW)
    rows["hi"], rows["lo"], rows["id"] = halves[:, 0], halves[:, 1], ids
    return rows


def exact_pairs(runs: list[RunSlice], out: Path, block_rows: int) -> int:
    """Merge the digest runs; write (duplicate, original) pairs to `out` (unsorted); returns how many."""
    count = 0
    with open(out, "wb") as f:
        for rows in merge_runs(runs, DIGEST_ROW, ("hi", "lo"), block_rows):
            starts = group_starts([rows["hi"], rows["lo"]])
            first_of = np.repeat(starts, np.diff(np.append(starts, len(rows))))
            dup = np.arange(len(rows)) != first_of
            pairs = np.empty(int(dup.sum()), dtype=PAIR_ROW)
            pairs["id"], pairs["of"] = rows["id"][dup], rows["id"][first_of[dup]]
            f.write(pairs.tobytes())
            count += len(pairs)
    return count


@dataclass(frozen=True)
class ExactTask:
    """Merge every chunk's digest run into `work/exact.pairs` (one task)."""

    work: Path
    files: int
    block_rows: int

    def __call__(self, task_id: int, report) -> int:
        final = self.work / "exact.pairs"
        remove_leftovers(final.parent, final.name)
        tmp = tmp_name(final)
        count = exact_pairs(chunk_runs(self.work, self.files, "exact"), tmp, self.block_rows)
        commit_file(tmp, final)
        kill_point("exact")
        return count
