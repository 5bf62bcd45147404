"""Union-find over the duplicate graph; the first record of each cluster in input order is kept.

Edges are the exact (duplicate, original) pairs and the verified band pairs. Only
records on some edge take part, so memory follows the number of duplicates, not the
corpus. Union-find is vectorised as min-label propagation with pointer jumping: every
node starts as its own label (its rank among the sorted ids), each round lowers both
ends of every edge to the smaller label and then jumps labels to their labels' labels,
until nothing moves. A cluster's label is then its smallest id: its first record in
input order, which is kept whatever the engine or worker count. Every other member is
removed: an exact duplicate names its identical original, a near duplicate the record
its cluster keeps.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from llm.data.corpus_dedup.bands import EDGE_ROW, band_file, read_edges
from llm.data.corpus_dedup.commit import kill_point, write_file, write_json
from llm.data.corpus_dedup.exact import PAIR_ROW
from llm.data.corpus_dedup.runs import group_starts
from llm.data.corpus_dedup.verify import Signatures
from llm.data.corpus_dedup.workdir import scan_dir

REMOVED_ROW = np.dtype([("id", "<u8"), ("of", "<u8"), ("sim", "<f4"), ("near", "u1")])


def components(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(nodes sorted, the smallest node of each one's connected component) for the edges (a[i], b[i])."""
    nodes, inverse = np.unique(np.concatenate((a, b)), return_inverse=True)
    u, v = inverse[: len(a)], inverse[len(a) :]
    label = np.arange(len(nodes))
    while True:
        low = np.minimum(label[u], label[v])
        new = label.copy()
        np.minimum.at(new, u, low)
        np.minimum.at(new, v, low)
        while True:  # pointer jumping: follow labels to their roots
            jumped = new[new]
            if np.array_equal(jumped, new):
                break
            new = jumped
        if np.array_equal(new, label):
            return nodes, nodes[label]
        label = new


def removed_records(exact: np.ndarray, edges: np.ndarray, signatures: Signatures | None) -> np.ndarray:
    """The removed records, sorted by id: each with the record it duplicates, the similarity, exact or near."""
    nodes, root = components(np.concatenate((exact["id"], edges["a"])), np.concatenate((exact["of"], edges["b"])))
    gone = nodes != root
    removed = np.zeros(int(gone.sum()), dtype=REMOVED_ROW)
    removed["id"], removed["of"], removed["near"] = nodes[gone], root[gone], 1
    # an exact duplicate names its identical original (sorted lookup), similarity 1
    is_exact = np.isin(removed["id"], exact["id"])
    order = np.argsort(exact["id"])
    where = np.searchsorted(exact["id"][order], removed["id"][is_exact])
    removed["of"][is_exact] = exact["of"][order][where]
    removed["near"][is_exact] = 0
    removed["sim"][is_exact] = 1.0
    near = ~is_exact
    if signatures is not None and near.any():
        removed["sim"][near] = signatures.similarity(removed["id"][near], removed["of"][near])
    return removed


def _distinct(edges: np.ndarray, threshold: float | None) -> tuple[int, int]:
    """How many different (a, b) pairs `edges` holds (a pair may come from several bands), and how many of them
    are verified (similarity >= `threshold`): a pair's similarity is the same in every band (its signatures')."""
    order = np.lexsort((edges["b"], edges["a"]))
    first = order[group_starts([edges["a"][order], edges["b"][order]])]
    if threshold is None:
        return len(first), len(first)
    return len(first), int(np.count_nonzero(edges["sim"][first] >= np.float32(threshold)))


@dataclass(frozen=True)
class ClusterTask:
    """Cluster every edge into `work/removed.bin` (one task)."""

    work: Path
    files: int
    bands: int
    num_perm: int
    threshold: float | None

    def __call__(self, task_id: int, report) -> int:
        exact = np.fromfile(self.work / "exact.pairs", dtype=PAIR_ROW)
        parts = [read_edges(band_file(self.work, band)) for band in range(self.bands)]
        edges_all = np.concatenate(parts) if parts else np.zeros(0, dtype=EDGE_ROW)
        edges, signatures = edges_all, None
        if self.threshold is not None:
            edges = edges_all[edges_all["sim"] >= np.float32(self.threshold)]
            dirs = [scan_dir(self.work, f) for f in range(self.files)]
            signatures = Signatures(dirs, self.num_perm)
        removed = removed_records(exact, edges, signatures)
        near = removed[removed["near"] == 1]
        candidate, verified = _distinct(edges_all, self.threshold)
        write_json(self.work / "clusters.json", {
            "candidate_pairs": candidate, "verified_pairs": verified,
            "exact_duplicates": int((removed["near"] == 0).sum()),
            "near_duplicates": len(near), "near_duplicate_clusters": len(np.unique(near["of"])),
        })
        write_file(self.work / "removed.bin", removed.tobytes())
        kill_point("clusters")
        return len(removed)
