"""Candidate verification: a pair is a near duplicate only if its signatures agree on >= threshold of entries.

Banding finds pairs that agree on one whole band; that is a candidate, not a
verdict (a band key can also collide). The share of equal MinHash entries over all
`num_perm` permutations estimates the pair's Jaccard similarity; only pairs whose
estimate reaches the threshold become edges of the duplicate graph. Signatures are
read from the scan files through memory maps: random reads, no load of the whole set.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from llm.data.corpus_dedup.minhash import estimated_jaccard
from llm.data.corpus_dedup.workdir import split_id

SIG_FILE = "sig.u32"


class Signatures:
    """Every scanned record's signature, looked up by record id (memory-mapped per input file)."""

    def __init__(self, scan_dirs: list[Path], num_perm: int):
        self.dirs, self.num_perm = scan_dirs, num_perm
        self._maps: dict[int, np.ndarray] = {}

    def _file(self, index: int) -> np.ndarray:
        if index not in self._maps:
            path = self.dirs[index] / SIG_FILE
            rows = os.path.getsize(path) // (4 * self.num_perm)
            self._maps[index] = (np.memmap(path, dtype="<u4", mode="r", shape=(rows, self.num_perm))
                                 if rows else np.zeros((0, self.num_perm), np.uint32))
        return self._maps[index]

    def get(self, ids: np.ndarray) -> np.ndarray:
        """(len(ids), num_perm) uint32 signatures of the records `ids`."""
        files, index = split_id(ids)
        out = np.empty((len(ids), self.num_perm), dtype=np.uint32)
        for f in np.unique(files).tolist():
            mask = files == f
            out[mask] = self._file(f)[index[mask]]
        return out

    def similarity(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Estimated Jaccard similarity of the pairs (a[i], b[i]) as float32."""
        if not len(a):
            return np.zeros(0, np.float32)
        return estimated_jaccard(self.get(a), self.get(b)).astype(np.float32)
