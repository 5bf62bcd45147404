"""Exact duplicates: each record's normalised-text digest, and the stage that finds the repeated ones.

The digest is the dedup source's (`llm.data.inputs.dedup`): whitespace collapsed, then
the first 16 bytes of `hash_algo` (sha256 unless told). Every scan chunk writes its
(digest, record id) rows as a sorted run; this stage merges all runs, and in each group
of equal digests the first record in input order is the original, the others its
exact duplicates: the (duplicate, original) pairs it commits.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from llm.data.corpus_dedup.commit import commit_file, kill_point, remove_leftovers, tmp_name
from llm.data.corpus_dedup.runs import RunSlice, group_starts, merge_runs
from llm.data.corpus_dedup.workdir import chunk_runs
from llm.data.inputs.dedup import DIGEST_BYTES, collapse_whitespace, hasher

DIGEST_ROW = np.dtype([("hi", ">u8"), ("lo", ">u8"), ("id", "<u8")])  # big-endian halves: digest byte order
PAIR_ROW = np.dtype([("id", "<u8"), ("of", "<u8")])

# What str.split() splits on (str.isspace) above ASCII: code points of the BMP (two- and three-byte
# UTF-8); tests/data/corpus_dedup/test_stages.py checks the list against every code point of this Python.
WIDE_SPACES = (0x85, 0xA0, 0x1680, *range(0x2000, 0x200B), 0x2028, 0x2029, 0x202F, 0x205F, 0x3000)
_WIDE_SPACE = np.zeros(0x10000, dtype=bool)
_WIDE_SPACE[list(WIDE_SPACES)] = True
_U8 = np.uint8
_BATCH_CHARS = 1 << 18


def normalised_texts(texts: list[str]) -> tuple[np.ndarray, list[int], list[int], list[int]]:
    """(buffer, starts, ends, odd): `collapse_whitespace(texts[i]).encode("utf-8", "replace")` is buffer[starts[i]:ends[i]].

    The same bytes as the dedup source's normalisation, for a batch in a few numpy passes instead
    of a list of words per record (~4 µs a 2 KB record against ~11): the texts' UTF-8 is joined by
    spaces, each run of whitespace bytes (a multi-byte space is a run of its own bytes) becomes one
    space, and a text's span is what it keeps of its bytes (leading whitespace joins the separator's
    run). A text that is empty or ends in whitespace (records are stripped: none does) is listed in
    `odd`: its span is not its normalisation, which the caller takes from `collapse_whitespace`.
    """
    encoded = [t.encode("utf-8", "replace") for t in texts]
    data = np.frombuffer(b" " + b" ".join(encoded) + b"   ", dtype=np.uint8)  # spaces pad the reads below
    with np.errstate(over="ignore"):  # uint8 arithmetic wraps: x - 9 < 5 is 9 <= x <= 13
        space = ((data - _U8(9)) < 5) | ((data - _U8(28)) < 5)  # \t \n \v \f \r, \x1c-\x1f and the space
    lead = np.flatnonzero(data >= 0xC2)  # the first byte of a multi-byte character (UTF-8 written by Python)
    if len(lead):
        d0, d1, d2 = (data[lead + k].astype(np.int64) for k in range(3))
        two = d0 < 0xE0
        code = np.where(two, ((d0 & 0x1F) << 6) | (d1 & 0x3F), ((d0 & 0x0F) << 12) | ((d1 & 0x3F) << 6) | (d2 & 0x3F))
        wide = lead[(d0 < 0xF0) & _WIDE_SPACE[code & 0xFFFF]]
        three = wide[data[wide] >= 0xE0]
        space[wide], space[wide + 1], space[three + 2] = True, True, True
    dropped = np.empty_like(space)
    dropped[0] = True  # the leading pad
    np.logical_and(space[1:], space[:-1], out=dropped[1:])  # a space byte after a space byte: its run's first stays
    with np.errstate(over="ignore"):
        spaced = data + (_U8(32) - data) * space.view(np.uint8)  # every space byte is 32
    out = np.compress(~dropped, spaced)
    gone = np.flatnonzero(dropped)  # few: the extra bytes of whitespace runs
    lengths = np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded))
    first = np.cumsum(lengths + 1) - lengths  # each text's first byte in `data` (after the pad and separators)
    # a kept byte's place in `out`: its place in `data` less the bytes dropped before it
    starts = first - np.searchsorted(gone, first)
    ends = first + lengths - np.searchsorted(gone, first + lengths)
    # an empty text, or one ending in whitespace: its run's first byte (a space) is kept inside it
    odd = np.flatnonzero((lengths == 0) | space[np.maximum(first + lengths - 1, 0)])
    return out, starts.tolist(), ends.tolist(), odd.tolist()


def _batch_ends(texts: list[str]) -> list[int]:
    """Where batches of about `_BATCH_CHARS` characters end: a batch's arrays stay in cache (~10% faster than a chunk)."""
    ends, size = [], 0
    for i, text in enumerate(texts):
        size += len(text)
        if size >= _BATCH_CHARS:
            ends.append(i + 1)
            size = 0
    if not ends or ends[-1] != len(texts):
        ends.append(len(texts))
    return ends


def _digest_function(algo: str):
    """`hasher(algo)`; for hashlib's own algorithms its named constructor (a little cheaper than `hashlib.new`)."""
    make = getattr(hashlib, algo, None) if algo in hashlib.algorithms_guaranteed and not algo.startswith("shake_") else None
    if make is None:
        return hasher(algo)
    return lambda data: make(data).digest()[:DIGEST_BYTES].ljust(DIGEST_BYTES, b"\0")


def digest_rows(texts: list[str], ids: np.ndarray, hash_algo: str) -> np.ndarray:
    """One (digest, id) row per record, for its exact-duplicate run (unsorted)."""
    digest = _digest_function(hash_algo)
    digests: list[bytes] = []
    lo = 0
    for hi in _batch_ends(texts):
        out, starts, ends, odd = normalised_texts(texts[lo:hi])
        view = memoryview(out)
        batch = [digest(view[s:e]) for s, e in zip(starts, ends)]
        for i in odd:
            batch[i] = digest(collapse_whitespace(texts[lo + i]).encode("utf-8", "replace"))
        digests += batch
        lo = hi
    halves = np.frombuffer(b"".join(digests), dtype=">u8").reshape(-1, 2)
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
