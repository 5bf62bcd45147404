"""Candidate verification: a pair is a near duplicate only if its signatures agree on >= threshold of entries.

Banding finds pairs that agree on one whole band; that is a candidate, not a
verdict (a band key can also collide). The share of equal MinHash entries over all
`num_perm` permutations estimates the pair's Jaccard similarity; only pairs whose
estimate reaches the threshold become edges of the duplicate graph. Signatures are
read from the scan files through memory maps held for one lookup block: random reads, no
load of the whole set, and no mapped pages left behind in the process's RSS.
"""

from __future__ import annotations

import mmap
import os
from pathlib import Path

import numpy as np

from llm.data.corpus_dedup.minhash import estimated_jaccard
from llm.data.corpus_dedup.workdir import split_id

SIG_FILE = "sig.u32"
_LOOKUP_ROWS = 8192  # rows looked up per mapping: at most ~32 MB of mapped pages


class Signatures:
    """Every scanned record's signature, looked up by record id (memory-mapped per input file, per lookup block).

    A lookup maps the files it needs and unmaps them when done, at most `_LOOKUP_ROWS` rows at a
    time: a mapped page stays in the process's RSS while it is mapped, and a signature (512 B)
    touches a whole page (4 KB), so a long-lived map of 10^6 records' signatures grew RSS by ~4 KB
    per record looked up (the clusters stage looks up every removed record: ~800 MB at 10^6).
    """

    def __init__(self, scan_dirs: list[Path], num_perm: int):
        self.dirs, self.num_perm = scan_dirs, num_perm

    def _read(self, index: int, rows: np.ndarray, out: np.ndarray) -> None:
        path = self.dirs[index] / SIG_FILE
        size = os.path.getsize(path)
        if not size:
            return
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
            table = np.frombuffer(mapped, dtype="<u4").reshape(size // (4 * self.num_perm), self.num_perm)
            out[:] = table[rows]
            del table  # the map cannot close while an array views it

    def get(self, ids: np.ndarray) -> np.ndarray:
        """(len(ids), num_perm) uint32 signatures of the records `ids`."""
        files, index = split_id(ids)
        out = np.empty((len(ids), self.num_perm), dtype=np.uint32)
        for f in np.unique(files).tolist():
            where = np.flatnonzero(files == f)
            for start in range(0, len(where), _LOOKUP_ROWS):
                part = where[start : start + _LOOKUP_ROWS]
                block = np.empty((len(part), self.num_perm), dtype=np.uint32)
                self._read(f, index[part], block)
                out[part] = block
        return out

    def similarity(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Estimated Jaccard similarity of the pairs (a[i], b[i]) as float32."""
        if not len(a):
            return np.zeros(0, np.float32)
        both = self.get(np.concatenate((a, b)))  # one pass over the files: each is mapped once per block, not twice
        return estimated_jaccard(both[: len(a)], both[len(a) :]).astype(np.float32)
