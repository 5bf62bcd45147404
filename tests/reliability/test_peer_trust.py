"""Peers' folders (LitData, MosaicML MDS) obey our trust rule: an index that lies is one sentence, never served.

Each folder is written by the peer's own writer, then its index.json (or a chunk's offsets
table) is edited. Every case is refused the same way by `ds[i]`, a full epoch, `llm-data
convert` (non-zero, nothing written) and `llm-data verify` (exit 1), naming the file and field.
"""

from __future__ import annotations

import json
import re
import shutil
import struct
from collections.abc import Callable
from pathlib import Path

import pytest

from llm.cli.data import main as llm_data
from llm.data import StreamingDataset, TokensLoader
from tests.interop import peers
from tests.interop.samples import lit_document, lit_document_u16, lit_item

Edit = Callable[[Path], None]


def _index(change: Callable[[dict], None]) -> Edit:
    def edit(folder: Path) -> None:
        data = json.loads((folder / "index.json").read_text())
        change(data)
        (folder / "index.json").write_text(json.dumps(data))

    return edit


def _add(where: str, i: int, field: str, delta: int) -> Edit:
    def change(data: dict) -> None:
        data[where][i][field] += delta

    return _index(change)


def _twice(where: str) -> Edit:
    return _index(lambda data: data[where].append(dict(data[where][0])))


def _encoding(column: str, encoding: str) -> Edit:
    def change(data: dict) -> None:
        for shard in data["shards"]:
            shard["column_encodings"][shard["column_names"].index(column)] = encoding

    return _index(change)


def _offset(chunk: str, entry: int, value: Callable[[int, int], int]) -> Edit:
    """Overwrite entry `entry` of a chunk's offsets table: value(old offset, file size) -> new (uint32)."""
    def edit(folder: Path) -> None:
        raw = bytearray((folder / chunk).read_bytes())
        count = struct.unpack_from("<I", raw, 0)[0]
        at = 4 * ((count if entry < 0 else entry) + 1)  # -1: the last entry, where the items end
        old = struct.unpack_from("<I", raw, at)[0]
        struct.pack_into("<I", raw, at, value(old, len(raw)) % 2**32)
        (folder / chunk).write_bytes(bytes(raw))

    return edit


def _raw_bytes_plus_one(folder: Path) -> None:
    data = json.loads((folder / "index.json").read_text())
    data["shards"][0]["raw_data"]["bytes"] += 1
    (folder / "index.json").write_text(json.dumps(data))


def _flip_a_sample_byte(folder: Path) -> None:
    raw = bytearray((folder / "shard.00000.mds").read_bytes())
    raw[-3] ^= 0xFF  # inside the last sample: counts and offsets stay right, only the hashes can tell
    (folder / "shard.00000.mds").write_bytes(bytes(raw))


# name: (peer folder, edit, what the one sentence must say: the file and the field)
CASES: dict[str, tuple[str, Edit, str]] = {
    "lit dim +5": ("lit_tokens", _add("chunks", 0, "dim", 5), r"chunk-0-0\.bin .*dim \d+"),
    "lit dim -5": ("lit_tokens", _add("chunks", 0, "dim", -5), r"chunk-0-0\.bin .*dim \d+"),
    "lit zstd dim +3": ("lit_tokens_zstd", _add("chunks", 1, "dim", 3), r"chunk-0-1\.zstd\.bin .*dim \d+"),
    "lit chunk listed twice": ("lit_tokens", _twice("chunks"), r"index\.json: chunk \d+ lists the file 'chunk-0-0\.bin' again"),
    "lit tokens chunk_size +2": ("lit_tokens", _add("chunks", 0, "chunk_size", 2), r"chunk-0-0\.bin .*chunk_size \d+"),
    "lit items chunk_size -2": ("lit_items", _add("chunks", 0, "chunk_size", -2), r"chunk-0-0\.bin .*chunk_size \d+"),
    "lit items chunk_size +2": ("lit_items", _add("chunks", 1, "chunk_size", 2), r"chunk-0-1\.bin .*chunk_size \d+"),
    "lit chunk_bytes +2": ("lit_items", _add("chunks", 0, "chunk_bytes", 2), r"chunk-0-0\.bin .*chunk_bytes \d+"),
    "lit offset past the end": ("lit_items", _offset("chunk-0-1.bin", 2, lambda old, size: size + 100),
                                r"chunk-0-1\.bin has item 2 at byte \d+, past the end of its items .*chunk_bytes"),
    "lit offset negative": ("lit_items", _offset("chunk-0-1.bin", 2, lambda old, size: -8),  # uint32: 2**32 - 8
                            r"chunk-0-1\.bin has item 2 at byte 4294967288, past the end .*chunk_bytes"),
    "lit offset backwards": ("lit_items", _offset("chunk-0-1.bin", 2, lambda old, size: 10),
                             r"chunk-0-1\.bin has item 2 at byte 10, before item 1 .*offsets must not decrease"),
    "lit first offset negative": ("lit_items", _offset("chunk-0-0.bin", 0, lambda old, size: -1),
                                  r"chunk-0-0\.bin has its first item at byte"),
    "lit last offset past the end": ("lit_tokens", _offset("chunk-0-0.bin", -1, lambda old, size: size + 4),
                                     r"chunk-0-0\.bin has item \d+ at byte \d+, past the end .*chunk_bytes"),
    "mds samples +3": ("mds_raw", _add("shards", 0, "samples", 3), r"shard\.00000\.mds holds \d+ items .*samples \d+"),
    "mds zstd samples +3": ("mds_zstd", _add("shards", 1, "samples", 3), r"shard\.00001\.mds\.zstd holds .*samples"),
    "mds shard listed twice": ("mds_raw", _twice("shards"), r"shard \d+ lists the file 'shard\.00000\.mds' again"),
    "mds encoding str -> int": ("mds_raw", _encoding("text", "int"), r"index\.json: shard 0 column 'text' .*column_sizes"),
    "mds encoding fixed size": ("mds_raw", _encoding("fixed", "ndarray:uint32:4"), r"column 'fixed' .*column_sizes"),
    "mds encoding json -> pkl": ("mds_raw", _encoding("meta", "pkl"), r"shard\.00000\.mds item 0: column 'meta' \(pkl\)"),
    "mds raw_data.bytes +1": ("mds_raw", _raw_bytes_plus_one, r"shard\.00000\.mds has \d+ bytes .*raw_data\.bytes"),
    "mds shard bytes changed": ("mds_raw", _flip_a_sample_byte, r"shard\.00000\.mds fails its \w+ hash"),
}


@pytest.fixture(scope="module")
def peer_folders(tmp_path_factory) -> dict[str, Path]:
    """Each peer folder once, written by the peer's own writer (small: milliseconds)."""
    litdata = peers.litdata()
    root = tmp_path_factory.mktemp("peers")
    return {
        "lit_tokens": peers.lit_write(root / "lit_tokens", lit_document, 40, chunk_bytes="4KB",
                                      item_loader=litdata.TokensLoader()),
        "lit_tokens_zstd": peers.lit_write(root / "lit_tokens_zstd", lit_document_u16, 30, chunk_bytes="4KB",
                                           item_loader=litdata.TokensLoader(), compression="zstd",
                                           compression_level="chunk"),
        "lit_items": peers.lit_write(root / "lit_items", lit_item, 30, chunk_bytes="2KB"),
        "mds_raw": peers.mds_write(root / "mds_raw", None, n=30),
        "mds_zstd": peers.mds_write(root / "mds_zstd", "zstd", n=30),
    }


def _corrupt(peer_folders: dict[str, Path], case: str, tmp_path: Path) -> tuple[Path, str]:
    fixture, edit, expected = CASES[case]
    folder = tmp_path / fixture
    shutil.copytree(peer_folders[fixture], folder)
    edit(folder)
    return folder, expected


def _dataset(folder: Path) -> StreamingDataset:
    tokens = "tokens" in folder.name
    return StreamingDataset(folder, item_loader=TokensLoader(block_size=16) if tokens else None)


def _one_sentence(message: str) -> None:
    assert "\n" not in message and "Traceback" not in message, message


@pytest.mark.parametrize("case", sorted(CASES))
def test_valid_peer_folders_read(peer_folders, case):
    # the same folder untouched reads to the end: each case's refusal is the edit's, not the check's
    fixture = CASES[case][0]
    ds = _dataset(peer_folders[fixture])
    assert sum(1 for _ in ds) == len(ds) > 0


@pytest.mark.parametrize("case", sorted(CASES))
def test_lying_index_item_access(peer_folders, case, tmp_path):
    folder, expected = _corrupt(peer_folders, case, tmp_path)
    with pytest.raises(ValueError, match=expected) as e:
        _dataset(folder)[0]
    _one_sentence(str(e.value))


@pytest.mark.parametrize("case", sorted(CASES))
def test_lying_index_full_epoch(peer_folders, case, tmp_path):
    folder, expected = _corrupt(peer_folders, case, tmp_path)
    with pytest.raises(ValueError, match=expected):
        for _ in _dataset(folder):
            pass


@pytest.mark.parametrize("case", sorted(CASES))
def test_lying_index_convert(peer_folders, case, tmp_path, capsys):
    folder, expected = _corrupt(peer_folders, case, tmp_path)
    out = tmp_path / "ours"
    assert llm_data(["convert", str(folder), str(out), "--num-workers", "0", "--no-progress"]) != 0
    err = capsys.readouterr().err
    assert err.startswith("llm-data: error: ") and err.count("\n") == 1, err
    assert re.search(expected, err), err
    assert not out.exists()


@pytest.mark.parametrize("case", sorted(CASES))
def test_lying_index_verify(peer_folders, case, tmp_path, capsys):
    folder, expected = _corrupt(peer_folders, case, tmp_path)
    with pytest.raises(SystemExit) as e:
        llm_data(["verify", str(folder)])
    err = capsys.readouterr().err
    assert e.value.code == 1 and err.startswith("llm-data: verify: ") and err.count("\n") == 1, err
    assert re.search(expected, err), err


@pytest.mark.parametrize("fixture", ["lit_tokens", "lit_tokens_zstd", "lit_items", "mds_raw", "mds_zstd"])
def test_verify_a_valid_peer_folder(peer_folders, fixture, capsys):
    assert llm_data(["verify", str(peer_folders[fixture])]) == 0
    out = capsys.readouterr().out
    assert out.startswith("verify: ") and f" OK in {peer_folders[fixture]} " in out
    assert ("hashes" in out) == fixture.startswith("mds")  # MDS has hashes, LitData none
