"""The rows' checksums of the run ledger, one function per rule the ledger header can name (`RULES`).

Version 3 (`row_checksums`, rule "wword64") checksums the ids as the source stores them, in the dtype the
header records per source; versions 2 and 1 took the ids by value. Each is kept so that an older ledger is
audited, and resumed, by its own rule. docs/proving-a-run.md describes them; bench/ledger.py measures them.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import numpy as np
import xxhash

# the C kernel of rule "wword64" (_rows.c); None where it was not built: NumPy computes the same checksums, slower
from llm.data.ledger.kernel import KERNEL as _kernel

CHECKSUM = "wword64"  # the rule new ledgers record (header "checksum"); version 2: "wsum32", 1: "xxh3-int64"
_WEIGHTS = np.zeros(0, np.uint32)
_WORD_WEIGHTS = np.zeros(0, "<u8")


def _word_weights(words: int) -> np.ndarray:
    """W_j = splitmix64(j + 1) | 1 for j < words (splitmix64's finalizer over (j + 1) * golden gamma), grown once."""
    global _WORD_WEIGHTS
    w = _WORD_WEIGHTS  # one read: another thread may swap in a longer table meanwhile, never a shorter one
    if len(w) < words:
        with np.errstate(over="ignore"):
            x = np.arange(1, max(words, 2 * len(w), 64) + 1, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
            x ^= x >> np.uint64(30)
            x *= np.uint64(0xBF58476D1CE4E5B9)
            x ^= x >> np.uint64(27)
            x *= np.uint64(0x94D049BB133111EB)
            x ^= x >> np.uint64(31)
        _WORD_WEIGHTS = w = (x | np.uint64(1)).astype("<u8")
    return w[:words]


def row_checksums(tokens: Any, dtype: Any = None) -> np.ndarray:
    """The 32-bit checksum of each row's token ids as stored (rule "wword64", ledger version 3).

    The row's ids in `dtype` (the source's stored dtype, which the ledger header records per source as
    `checksum_dtype`; None: int64, what a text row holds), as little-endian bytes zero-padded to a multiple of 8,
    read as little-endian uint64 words x_j; s = sum of x_j * W_j modulo 2**64 with W_j = splitmix64(j + 1) | 1;
    the checksum is (s xor s >> 32) modulo 2**32. Ids in another dtype are cast to `dtype` first (as numpy's
    `astype` does: a value that does not fit wraps), so the audit, which reads the rows again in the loader's
    dtype, gets the checksum the reader threads took on the stored rows.

    Odd weights make any single changed token change s (a token is at most 16 bits of a word shifted by at most
    48: the change is never a multiple of 2**64), and distinct weights make a swap or a shifted run change it too;
    folded to the 32 bits kept, a change is missed with probability about 2**-32. It is not a keyed hash: it finds
    data that changed, not data forged to match. Why this rule (version 2 weighted each id, version 1 hashed each
    row with xxh3 from Python): on a uint16 shard it is one integer matrix-vector product over a quarter as many
    words as there are ids, on the rows as read, before the loader widens them; the C kernel (_rows.c, built by
    setup.py where a compiler is found) does it a vector of words at a time, about 4x NumPy's speed
    (bench/ledger.py has the numbers).
    """
    rows = np.asarray(tokens)
    if rows.ndim != 2:
        rows = rows.reshape(len(rows), -1) if rows.size else rows.reshape(len(rows), 0)
    stored = np.dtype(np.int64 if dtype is None else dtype).newbyteorder("<")
    if rows.dtype != stored:
        rows = rows.astype(stored)  # values cast as numpy casts them (a narrower dtype wraps)
    rows = np.ascontiguousarray(rows)
    n, nbytes = len(rows), rows.shape[1] * stored.itemsize
    if n == 0:
        return np.zeros(0, np.uint32)
    if _kernel is not None and nbytes:  # the same arithmetic, a vector of words at a time (_rows.c)
        out = np.empty(n, np.uint32)
        _kernel.checksum_rows(rows, nbytes, _word_weights((nbytes + 7) // 8), out)
        return out
    return _checksums_numpy(rows, n, nbytes)


def _checksums_numpy(rows: np.ndarray, n: int, nbytes: int) -> np.ndarray:
    """Rule "wword64" in NumPy: the reference the C kernel is tested against, and its stand-in where it is not
    built (`rows`: n contiguous rows of `nbytes` bytes each, little-endian)."""
    if nbytes % 8:  # a row of a width that does not fill whole words: zero bytes after it
        padded = np.zeros((n, nbytes + 8 - nbytes % 8), np.uint8)
        padded[:, :nbytes] = rows.view(np.uint8).reshape(n, nbytes)
        rows = padded
    words = rows.view("<u8").reshape(n, rows.shape[1] * rows.dtype.itemsize // 8)
    s = words @ _word_weights(words.shape[1])  # integer matmul wraps modulo 2**64: exact in any order
    return ((s ^ (s >> np.uint64(32))) & np.uint64(0xFFFFFFFF)).astype(np.uint32)


def checksummed_widened(rule: Callable[..., np.ndarray], rows: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """(`rule`'s checksums of `rows`, `rows` as int64) in one pass of the C kernel, when `rule` is "wword64", the
    kernel is built and the rows are little-endian uint16, uint32 or int32; None otherwise (the caller checksums,
    then widens). Why one pass: a chunk's rows come back from memory by the time they are checksummed (a megabyte,
    read by threads that share the cores), and the widening copy reads them anyway (bench/ledger.py)."""
    if _kernel is None or inspect.unwrap(rule) is not row_checksums or rows.ndim != 2 or not rows.shape[1]:
        return None
    kind = rows.dtype.kind + str(rows.dtype.itemsize)
    if kind not in ("u2", "u4", "i4") or rows.dtype.byteorder == ">":  # (a big-endian machine has no kernel)
        return None
    rows = np.ascontiguousarray(rows)
    crcs, wide = np.empty(len(rows), np.uint32), np.empty(rows.shape, np.int64)
    row_bytes = rows.shape[1] * rows.itemsize
    _kernel.checksum_rows(rows, row_bytes, _word_weights((row_bytes + 7) // 8), crcs, wide, rows.itemsize, kind == "i4")
    return crcs, wide


def _weights(length: int) -> np.ndarray:
    """w_i = fmix32(i + 1) | 1 (MurmurHash3's 32-bit finalizer) for i < length, grown once and shared."""
    global _WEIGHTS
    w = _WEIGHTS  # one read: another thread may swap in a longer table meanwhile, never a shorter one
    if len(w) < length:
        x = np.arange(1, max(length, 2 * len(w)) + 1, dtype=np.uint64).astype(np.uint32)
        x ^= x >> np.uint32(16)
        x *= np.uint32(0x85EBCA6B)
        x ^= x >> np.uint32(13)
        x *= np.uint32(0xC2B2AE35)
        x ^= x >> np.uint32(16)
        _WEIGHTS = w = x | np.uint32(1)
    return w[:length]


def row_checksums_v2(tokens: Any, dtype: Any = None) -> np.ndarray:
    """Rule "wsum32" (ledger version 2): sum over the row of id_i * w_i modulo 2**32, ids taken modulo 2**32 (their
    values, whatever dtype holds them; `dtype` is not used), w_i = fmix32(i + 1) | 1. Kept so that a version 2
    ledger is still audited and resumed with its own rule."""
    rows = np.asarray(tokens)
    if rows.ndim != 2:
        rows = rows.reshape(len(rows), -1) if rows.size else rows.reshape(len(rows), 0)
    n, length = rows.shape
    out = np.empty(n, np.uint32)
    if n == 0:
        return out
    w = _weights(length)
    if rows.dtype.kind in "iu" and rows.dtype.itemsize == 8 and rows.dtype.isnative:
        # 64-bit ids: one pass, no copy; unsigned wrap-around modulo 2**64 keeps the low 32 bits exact, and a
        # negative id's two's complement is its value modulo 2**32
        return (np.ascontiguousarray(rows).view(np.uint64) @ w.astype(np.uint64)).astype(np.uint32)
    block = max(1, (1 << 16) // max(length, 1))  # 256 KB of uint32: the three passes stay in cache
    buf = np.empty((min(block, n), length), np.uint32)
    for lo in range(0, n, block):
        part = rows[lo:lo + block]
        b = buf[:len(part)]
        np.copyto(b, part, casting="unsafe")  # values modulo 2**32 (a negative int64 wraps, as documented)
        np.multiply(b, w, out=b)
        np.add.reduce(b, axis=1, out=out[lo:lo + len(part)])
    return out


def row_checksums_v1(tokens: Any, dtype: Any = None) -> np.ndarray:
    """Rule "xxh3-int64" (ledger version 1): the low half of xxh3-64 over each row's ids as little-endian int64.
    Kept so that a version 1 ledger is still audited (`dtype` is not used: the ids' values decide)."""
    rows = np.ascontiguousarray(np.asarray(tokens), dtype="<i8").reshape(len(tokens), -1)
    digest = xxhash.xxh3_64_intdigest
    return np.fromiter((digest(r) & 0xFFFFFFFF for r in rows), dtype=np.uint32, count=len(rows))


# rule name -> f(rows, dtype): the rows' checksums, dtype the source's `checksum_dtype` (used by "wword64" only)
RULES: dict[str, Callable[..., np.ndarray]] = {CHECKSUM: row_checksums, "wsum32": row_checksums_v2,
                                               "xxh3-int64": row_checksums_v1}
# the rules whose checksum depends on the dtype the ids are stored in (the header names it per source)
BY_DTYPE = frozenset({CHECKSUM})
