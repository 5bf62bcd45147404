"""How a segment stores a table column by column (format.py `encode_segment`): the codecs and the loader's
`Columns`, a table given as what it knows of each column (one value, a range, runs) rather than built whole."""

from __future__ import annotations

from typing import Any

import numpy as np

from llm.data.ledger.kernel import KERNEL


class Runs:
    """A column given as runs: `values[k]` repeated `lengths[k]` times (the rows' steps: one run per batch)."""

    def __init__(self, values: np.ndarray, lengths: np.ndarray):
        self.values, self.lengths = np.asarray(values), np.asarray(lengths, np.int64)

    def array(self, dtype: np.dtype) -> np.ndarray:
        return np.repeat(self.values.astype(dtype), self.lengths)


class RunIndex:
    """A column that counts 0, 1, ... within each run of the column `of` (a row's position in its batch); the runs
    hold distinct values one after the other (steps only go forward), which is how a reader finds them again."""

    def __init__(self, of: str):
        self.of = of


class Chunks:
    """A column given as consecutive arrays, one per chunk read (the loader's ids and checksums): stored in one pass
    of the C kernel without being joined first (`_encode_column`); `array()` joins them."""

    def __init__(self, parts: list[np.ndarray]):
        self.parts = [np.ascontiguousarray(p) for p in parts]  # (a strided view is copied: the kernel reads runs)

    def array(self, dtype: np.dtype) -> np.ndarray:
        return np.concatenate(self.parts).astype(dtype, copy=False) if self.parts else np.zeros(0, dtype)


class Columns:
    """A ROW or PIECE table held column by column, each an array, one value for every row (a Python or NumPy
    scalar), `Runs`, `RunIndex`, `Chunks`, or `range(start, start + n)` (a piece's row_ref): what the loader knows of its
    rows without building them, and what `encode_segment` stores without looking at (bench/ledger.py).
    `table[name]` and `materialize()` give the plain arrays."""

    def __init__(self, dtype: np.dtype, n: int, columns: dict[str, Any]):
        self.dtype, self.n, self.columns = dtype, n, columns

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, name: str) -> np.ndarray:
        c, dtype = self.columns[name], self.dtype[name]
        if isinstance(c, (Runs, Chunks)):
            return c.array(dtype)
        if isinstance(c, RunIndex):
            lengths = self.columns[c.of].lengths
            return (np.arange(self.n) - np.repeat(np.cumsum(lengths) - lengths, lengths)).astype(dtype)
        if isinstance(c, range):
            return np.arange(c.start, c.start + self.n, dtype=dtype)
        if np.ndim(c) == 0:
            return np.full(self.n, c, dtype)
        return np.asarray(c, dtype)

    def __setitem__(self, name: str, value: Any) -> None:
        self.columns[name] = value

    def materialize(self) -> np.ndarray:
        out = np.empty(self.n, self.dtype)
        for name in self.dtype.names:
            out[name] = self[name]
        return out


def as_table(table: Any, dtype: np.dtype) -> np.ndarray:
    """A table (structured array or `Columns`) as a structured array of `dtype`."""
    return table.materialize() if isinstance(table, Columns) else np.asarray(table, dtype)


# columns stored as differences from the previous row (wrapping modulo 2**64): sorted or shuffled ids, steps
_DELTA = frozenset({"step", "row_ref", "item"})
_NARROW = [np.dtype(t) for t in ("<u1", "<i1", "<u2", "<i2", "<u4", "<i4", "<u8", "<i8")]  # _rows.c NARROW alike
_BOUNDS = [(t, int(np.iinfo(t).min), int(np.iinfo(t).max)) for t in _NARROW]  # (np.iinfo costs a call each time)


def _delta(items: np.ndarray) -> np.ndarray:
    items = np.asarray(items)
    items = items.view(np.uint64) if items.dtype.kind in "iu" and items.dtype.itemsize == 8 else items.astype(np.uint64)
    out = np.empty(len(items), np.uint64)
    out[:1] = items[:1]
    np.subtract(items[1:], items[:-1], out=out[1:])  # wraps modulo 2**64 and back: exact for any order
    return out


def _undelta(deltas: np.ndarray) -> np.ndarray:
    return np.cumsum(deltas, dtype=np.uint64)


def _narrowest(values: np.ndarray) -> tuple[Any, np.ndarray | None]:
    """("const", value) when every value is one, else (the narrowest dtype that holds them, the values in it)."""
    if values.dtype.kind == "f":
        if np.isnan(values).all():
            return None, None  # every value NaN (JSON holds no NaN as a plain number)
        return np.dtype("<f4"), np.ascontiguousarray(values, "<f4")
    if not values.size:
        return 0, None
    lo, hi = values.min(), values.max()
    if lo == hi:
        return int(lo), None
    for t, least, most in _BOUNDS:
        if least <= lo and hi <= most:
            return t, values.astype(t, copy=False)  # already that type (a checksum column): no copy
    raise AssertionError("unreachable: every integer fits int64 or uint64")


def _encode_column(name: str, c: Any, dtype: np.dtype, blobs: list[Any]) -> list[Any]:
    """One column's spec for the segment header (its blobs appended to `blobs`)."""
    if isinstance(c, Runs):
        values, lengths = _narrowest(_delta(c.values).view(np.int64)), _narrowest(c.lengths)
        spec: list[Any] = ["runs", len(c.lengths)]
        for kind, arr in (values, lengths):
            spec.append(kind if arr is None else kind.str)
            if arr is not None:
                blobs.append(arr)
        return spec
    if isinstance(c, RunIndex):
        return ["runindex", c.of]
    if isinstance(c, range):
        return ["range", c.start]
    if isinstance(c, Chunks):
        stored = _kernel_column(name, c)
        if stored is not None:
            spec, blob = stored
            if blob is not None:
                blobs.append(blob)
            return spec
        c = c.array(dtype)
    if np.ndim(c) == 0:
        value = np.asarray(c, dtype)
        return ["nan"] if dtype.kind == "f" and np.isnan(value) else ["const", value.item()]
    values = np.asarray(c)
    delta = name in _DELTA and len(values) > 1
    kind, arr = _narrowest(_delta(values).view(np.int64) if delta else values)
    if arr is None:
        return ["nan"] if kind is None else (["const", kind, "delta"] if delta else ["const", kind])
    blobs.append(arr)
    return ["raw", kind.str, "delta"] if delta else ["raw", kind.str]


def _kernel_column(name: str, c: Chunks) -> tuple[list[Any], Any] | None:
    """`Chunks`' spec and blob as `_encode_column` stores the joined array, in the C kernel's one call (_rows.c
    `narrow_column`); None where it cannot: not built, no values, or parts that are not int64 or uint32."""
    parts = [p for p in c.parts if len(p)]
    if KERNEL is None or not parts or any(p.dtype not in (np.int64, np.uint32) for p in parts):  # (native order only)
        return None
    delta = name in _DELTA and sum(len(p) for p in parts) > 1
    lo, _, code, data = KERNEL.narrow_column(parts, delta)
    if code is None:
        return (["const", lo, "delta"] if delta else ["const", lo]), None
    return (["raw", code, "delta"] if delta else ["raw", code]), data


def _decode_column(spec: list[Any], n: int, dtype: np.dtype, raw: memoryview, at: int, table: np.ndarray
                   ) -> tuple[np.ndarray, int]:
    def take(t: str, count: int) -> np.ndarray:
        nonlocal at
        out = np.frombuffer(raw, dtype=np.dtype(t), count=count, offset=at)
        at += count * np.dtype(t).itemsize
        return out
    kind = spec[0]
    if kind == "runs":
        k, vt, lt = spec[1], spec[2], spec[3]
        values = np.full(k, vt, np.int64) if isinstance(vt, int) else take(vt, k).astype(np.int64)
        lengths = np.full(k, lt, np.int64) if isinstance(lt, int) else take(lt, k).astype(np.int64)
        if lengths.sum() != n or (lengths < 0).any():
            raise ValueError(f"runs of {int(lengths.sum())} rows in a table of {n}")
        return np.repeat(_undelta(values.view(np.uint64)), lengths).astype(dtype), at
    if kind == "runindex":
        of = table[spec[1]]
        starts = np.flatnonzero(np.r_[True, of[1:] != of[:-1]]) if n else np.zeros(0, np.int64)
        return (np.arange(n) - np.repeat(starts, np.diff(np.r_[starts, n]))).astype(dtype), at
    if kind == "range":
        return np.arange(spec[1], spec[1] + n, dtype=np.int64).astype(dtype), at
    if kind == "nan":
        return np.full(n, np.nan, dtype), at
    if kind == "const":
        values = np.full(n, spec[1], np.int64 if isinstance(spec[1], int) and spec[1] < 2**63 else np.uint64)
    elif kind == "raw":
        values = take(spec[1], n)
        values = values.astype(np.int64) if values.dtype.kind in "iu" and values.dtype != np.uint64 else values
    else:
        raise ValueError(f"column codec {kind!r}")
    if "delta" in spec[2:]:
        values = _undelta(values.view(np.uint64) if values.dtype.itemsize == 8 else values.astype(np.uint64))
    return values.astype(dtype), at
