"""Folders written by the real peers (litdata, mosaicml-streaming), once per session, for the interop tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.interop import peers
from tests.interop.samples import (
    lit_document,
    lit_document_u16,
    lit_item,
    lit_nested_item,
    lit_row,
    trainer_document,
)


@pytest.fixture(scope="session")
def lit_tokens(tmp_path_factory) -> Path:
    litdata = peers.litdata()
    return peers.lit_write(tmp_path_factory.mktemp("lit") / "tokens", lit_document, 120, chunk_bytes="16KB",
                           item_loader=litdata.TokensLoader())


@pytest.fixture(scope="session")
def lit_tokens_zstd(tmp_path_factory) -> Path:
    litdata = peers.litdata()
    return peers.lit_write(tmp_path_factory.mktemp("lit") / "tokens_zstd", lit_document_u16, 90, chunk_bytes="8KB",
                           item_loader=litdata.TokensLoader(), compression="zstd", compression_level="chunk")


@pytest.fixture(scope="session")
def lit_items(tmp_path_factory) -> Path:
    return peers.lit_write(tmp_path_factory.mktemp("lit") / "items", lit_item, 60, chunk_bytes="4KB")


@pytest.fixture(scope="session")
def lit_rows(tmp_path_factory) -> Path:
    return peers.lit_write(tmp_path_factory.mktemp("lit") / "rows", lit_row, 50, chunk_bytes="1KB")


@pytest.fixture(scope="session")
def lit_nested(tmp_path_factory) -> Path:
    return peers.lit_write(tmp_path_factory.mktemp("lit") / "nested", lit_nested_item, 30, chunk_bytes="1KB")


@pytest.fixture(scope="session")
def mds_raw(tmp_path_factory) -> Path:
    return peers.mds_write(tmp_path_factory.mktemp("mds") / "raw", None)


@pytest.fixture(scope="session")
def mds_zstd(tmp_path_factory) -> Path:
    return peers.mds_write(tmp_path_factory.mktemp("mds") / "zstd", "zstd")


@pytest.fixture(scope="session")
def trainer_tokens(tmp_path_factory) -> Path:
    from llm.data import TokensLoader, optimize

    out = tmp_path_factory.mktemp("trainers") / "ds"
    optimize(trainer_document, list(range(60)), out, num_workers=0, chunk_size=400, item_loader=TokensLoader(),
             progress=False)
    return out
