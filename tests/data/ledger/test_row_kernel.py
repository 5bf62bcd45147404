"""The ledger's C kernel (ledger/_rows.c): built where a compiler is, the same checksums as the NumPy reference for
every stored dtype and width, the one pass that also widens the rows gives NumPy's int64 rows, a column given chunk by
chunk is stored exactly as NumPy stores it joined, bad arguments are named, and a loader without the kernel records
the very same ledger."""

from __future__ import annotations

import functools
import shutil
import sysconfig
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llm.data import StreamingDataLoader, StreamingDataset, TokensLoader
from llm.data.ledger import checksums, columns
from llm.data.ledger.checksums import checksummed_widened, row_checksums, row_checksums_v2
from llm.data.ledger.columns import Chunks, _encode_column
from llm.data.ledger.format import PIECE, ROW
from llm.data.ledger.reader import read_ledger
from tests.data.shards.helpers import make_token_dataset

kernel = checksums._kernel
needs_kernel = pytest.mark.skipif(kernel is None, reason="the C kernel is not built here (no C compiler when "
                                                         "installed): the NumPy path is what runs, and is tested")
DTYPES = ["<u1", "<u2", "<i2", "<u4", "<i4", "<u8", "<i8", ">u2", ">i4"]


def _numpy(rows: np.ndarray, dtype: str) -> np.ndarray:
    stored = np.ascontiguousarray(rows, np.dtype(dtype).newbyteorder("<"))
    return checksums._checksums_numpy(stored, len(stored), stored.shape[1] * stored.itemsize)


def test_the_kernel_is_built_where_a_c_compiler_is() -> None:
    compiler = (sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(compiler) is None:
        pytest.skip(f"no C compiler ({compiler}) on this machine: the install went on without the kernel")
    assert kernel is not None, "setup.py builds llm.data.ledger._rows where a C compiler is; it is missing"
    assert kernel.KERNEL == 4  # the version kernel.py expects: a module built from other source is not used


@needs_kernel
@settings(max_examples=300, deadline=None)
@given(st.sampled_from(DTYPES), st.integers(0, 40), st.integers(1, 300), st.integers(0, 2**32 - 1),
       st.booleans())
def test_the_kernel_gives_the_numpy_checksums_for_every_dtype_and_width(dtype: str, n: int, width: int, seed: int,
                                                                         strided: bool) -> None:
    native = np.dtype(dtype).newbyteorder("=")
    info = np.iinfo(native)
    rows = np.random.default_rng(seed).integers(info.min, info.max, (n, width * 2 if strided else width),
                                                dtype=native, endpoint=True).astype(dtype)  # big-endian: byteswapped
    rows = rows[:, ::2] if strided else rows  # not contiguous: copied first
    assert row_checksums(rows, dtype).tolist() == _numpy(rows, dtype).tolist()


@needs_kernel
@pytest.mark.parametrize("dtype", [np.uint16, np.uint32, np.int32])
@pytest.mark.parametrize("width", [256, 255, 3, 1])
def test_the_one_pass_checksums_and_widens_as_numpy_does(dtype: type, width: int) -> None:
    info = np.iinfo(dtype)
    rows = np.random.default_rng(width).integers(info.min, info.max, (300, width), dtype=dtype, endpoint=True)
    rows[0] = info.max
    rows[1] = info.min  # a negative int32 stays negative, an unsigned top value stays positive
    crcs, wide = checksummed_widened(row_checksums, rows)
    assert wide.dtype == np.int64 and np.array_equal(wide, rows.astype(np.int64))
    assert crcs.tolist() == _numpy(rows, np.dtype(dtype).str).tolist()
    # the rule as the bench times it (wrapped with functools.wraps) is still recognised
    timed = functools.wraps(row_checksums)(lambda *a, **k: row_checksums(*a, **k))
    assert checksummed_widened(timed, rows) is not None


@needs_kernel
def test_the_one_pass_declines_what_it_does_not_do() -> None:
    rows = np.arange(64, dtype=np.uint16).reshape(4, 16)
    assert checksummed_widened(row_checksums_v2, rows) is None  # another rule: its own path
    assert checksummed_widened(row_checksums, rows.astype(np.uint8)) is None
    assert checksummed_widened(row_checksums, rows.astype(np.int64)) is None
    assert checksummed_widened(row_checksums, rows.astype(">u2")) is None  # big-endian ids
    assert checksummed_widened(row_checksums, rows[:, :0]) is None


@needs_kernel
def test_bad_arguments_are_named_not_read_past() -> None:
    rows = np.zeros((4, 16), np.uint16)
    weights = checksums._word_weights(4)
    with pytest.raises(ValueError, match="not whole rows"):
        kernel.checksum_rows(rows, 30, weights, np.empty(4, np.uint32))
    with pytest.raises(ValueError, match="too short"):
        kernel.checksum_rows(rows, 32, weights, np.empty(3, np.uint32))
    with pytest.raises(ValueError, match="too short"):
        kernel.checksum_rows(rows, 32, weights[:2], np.empty(4, np.uint32))
    with pytest.raises(ValueError, match="wide is too short"):
        kernel.checksum_rows(rows, 32, weights, np.empty(4, np.uint32), np.empty((4, 15), np.int64), 2, False)
    with pytest.raises(ValueError, match="widens"):
        kernel.checksum_rows(rows, 32, weights, np.empty(4, np.uint32), np.empty((4, 16), np.int64), 2, True)
    with pytest.raises(TypeError):
        kernel.checksum_rows(rows, 32, weights, b"read-only crcs")


_EDGES = [0, 1, 255, 256, 2**15, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**63 - 1, -1, -(2**31), -(2**63)]


@st.composite
def _parts(draw: st.DrawFn) -> list[np.ndarray]:
    """A column chunk by chunk as the loader holds it: int64 ids or uint32 checksums; sorted, shuffled, constant, or
    at the edges of each narrower type; some chunks empty."""
    wide = draw(st.booleans())
    kind = draw(st.sampled_from(["shuffled", "sorted", "constant", "edges", "small"]))
    out = []
    for _ in range(draw(st.integers(1, 5))):
        n = draw(st.integers(0, 300))
        rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
        if kind == "shuffled":
            values = rng.integers(0, draw(st.integers(1, 10**12)) if wide else 2**32, n, dtype=np.int64)
        elif kind == "sorted":
            values = np.arange(n) + draw(st.integers(0, 2**40))
        elif kind == "constant":
            values = np.full(n, draw(st.sampled_from([0, 7, 2**32 - 1])))
        elif kind == "edges":
            values = rng.choice([e for e in _EDGES if wide or 0 <= e < 2**32], n)
        else:
            values = rng.integers(0, draw(st.sampled_from([2, 200, 70000])), n)
        out.append(np.asarray(values).astype(np.int64 if wide else np.uint32))
    return out


@needs_kernel
@settings(max_examples=400, deadline=None)
@given(_parts(), st.sampled_from([("item", PIECE), ("crc", ROW), ("source", PIECE), ("step", ROW)]))
def test_a_column_given_chunk_by_chunk_is_stored_as_numpy_stores_it_joined(parts: list[np.ndarray],
                                                                           column: tuple[str, np.dtype]) -> None:
    name, table = column
    if not sum(len(p) for p in parts):
        parts.append(np.array([5], parts[0].dtype))
    joined = np.concatenate(parts)
    by_kernel: list = []
    by_numpy: list = []
    spec = _encode_column(name, Chunks(parts), table[name], by_kernel)
    assert spec == _encode_column(name, joined, table[name], by_numpy)
    assert [bytes(memoryview(np.ascontiguousarray(b)).cast("B")) for b in by_kernel] == \
        [bytes(memoryview(np.ascontiguousarray(b)).cast("B")) for b in by_numpy]


@needs_kernel
def test_the_column_kernel_names_what_it_cannot_store() -> None:
    with pytest.raises(TypeError, match="part 1 is not a 1-D int64 or uint32"):
        kernel.narrow_column([np.arange(3), np.arange(3, dtype=np.int32)], True)
    with pytest.raises(TypeError, match="part 0"):
        kernel.narrow_column([np.zeros((2, 2), np.int64)], False)
    with pytest.raises(ValueError, match="no values"):
        kernel.narrow_column([np.zeros(0, np.int64)], False)
    # a strided chunk (a view with a step) is stored as its values
    strided: list = []
    assert _encode_column("item", Chunks([np.arange(10, dtype=np.int64)[::3]]), PIECE["item"], strided) == \
        ["raw", "|u1", "delta"]
    assert np.frombuffer(strided[0], np.uint8).tolist() == [0, 3, 3, 3]
    # what the kernel does not take goes the NumPy way, to the same spec
    blobs: list = []
    assert _encode_column("item", Chunks([np.array([1, 5], np.uint16)]), PIECE["item"], blobs) == ["raw", "|u1", "delta"]
    assert np.asarray(blobs[0]).tolist() == [1, 4]
    swapped: list = []  # big-endian ids: NumPy's path too
    assert _encode_column("item", Chunks([np.array([1, 5], ">i8")]), PIECE["item"], swapped) == ["raw", "|u1", "delta"]
    assert np.asarray(swapped[0]).tolist() == [1, 4]


def _ledger_rows(data: Path, folder: Path, workers: int) -> np.ndarray:
    ds = StreamingDataset(str(data), item_loader=TokensLoader(block_size=64), shuffle=True, seed=3)
    loader = StreamingDataLoader(ds, batch_size=8, num_workers=workers, ledger=str(folder))
    for step, _ in enumerate(loader):
        if step % 7 == 6:
            loader.state_dict()  # commits mid-chunk
    loader.state_dict()
    ledger = read_ledger(folder)
    return ledger.rows, ledger.pieces


@pytest.mark.parametrize("workers", [0, 2])
def test_a_loader_without_the_kernel_records_the_same_ledger(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                             workers: int) -> None:
    data = make_token_dataset(tmp_path, n_lines=400)
    built, built_pieces = _ledger_rows(data, tmp_path / "built", workers)
    monkeypatch.setattr(checksums, "_kernel", None)  # as installed where no C compiler was found
    monkeypatch.setattr(columns, "KERNEL", None)
    plain, plain_pieces = _ledger_rows(data, tmp_path / "plain", workers)
    assert len(built) > 100 and len(built) == len(plain)
    for field in ROW.names:
        assert np.array_equal(built[field], plain[field], equal_nan=field == "loss"), field
    assert len(built_pieces) == len(built) and np.array_equal(built_pieces, plain_pieces)
