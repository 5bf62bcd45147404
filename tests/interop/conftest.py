"""Folders written by the real peers (litdata, mosaicml-streaming), once per session, for the interop tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.interop import peers
from tests.interop.samples import (
    MDS_COLUMNS,
    lit_document,
    lit_document_u16,
    lit_item,
    lit_nested_item,
    lit_row,
    mds_sample,
    trainer_document,
)


def _lit_write(out: Path, fn, n: int, **kwargs) -> Path:
    """Write with litdata's own chunk writer, in this process (what each `litdata.optimize` worker runs,
    then its index merge), so the fixtures take milliseconds instead of a worker pool's seconds."""
    peers.litdata()
    from litdata.streaming.writer import BinaryWriter

    out.mkdir(parents=True)
    writer = BinaryWriter(str(out), **kwargs)
    for i in range(n):
        writer[i] = fn(i)
    writer.done()
    writer.merge(1)
    return out


@pytest.fixture(scope="session")
def lit_tokens(tmp_path_factory) -> Path:
    litdata = peers.litdata()
    return _lit_write(tmp_path_factory.mktemp("lit") / "tokens", lit_document, 120, chunk_bytes="16KB",
                      item_loader=litdata.TokensLoader())


@pytest.fixture(scope="session")
def lit_tokens_zstd(tmp_path_factory) -> Path:
    litdata = peers.litdata()
    return _lit_write(tmp_path_factory.mktemp("lit") / "tokens_zstd", lit_document_u16, 90, chunk_bytes="8KB",
                      item_loader=litdata.TokensLoader(), compression="zstd", compression_level="chunk")


@pytest.fixture(scope="session")
def lit_items(tmp_path_factory) -> Path:
    return _lit_write(tmp_path_factory.mktemp("lit") / "items", lit_item, 60, chunk_bytes="4KB")


@pytest.fixture(scope="session")
def lit_rows(tmp_path_factory) -> Path:
    return _lit_write(tmp_path_factory.mktemp("lit") / "rows", lit_row, 50, chunk_bytes="1KB")


@pytest.fixture(scope="session")
def lit_nested(tmp_path_factory) -> Path:
    return _lit_write(tmp_path_factory.mktemp("lit") / "nested", lit_nested_item, 30, chunk_bytes="1KB")


def _mds(out: Path, compression: str | None) -> Path:
    streaming = peers.mosaic()
    with streaming.MDSWriter(out=str(out), columns=MDS_COLUMNS, compression=compression, size_limit=3000,
                             hashes=["sha1", "xxh64"]) as writer:
        for i in range(80):
            writer.write(mds_sample(i))
    return out


@pytest.fixture(scope="session")
def mds_raw(tmp_path_factory) -> Path:
    return _mds(tmp_path_factory.mktemp("mds") / "raw", None)


@pytest.fixture(scope="session")
def mds_zstd(tmp_path_factory) -> Path:
    return _mds(tmp_path_factory.mktemp("mds") / "zstd", "zstd")


@pytest.fixture(scope="session")
def trainer_tokens(tmp_path_factory) -> Path:
    from llm.data import TokensLoader, optimize

    out = tmp_path_factory.mktemp("trainers") / "ds"
    optimize(trainer_document, list(range(60)), out, num_workers=0, chunk_size=400, item_loader=TokensLoader(),
             progress=False)
    return out
