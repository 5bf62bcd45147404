"""LitData and MDS folders streamed in place: item for item what the peers' own `ds[i]` returns, exact resume."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

from llm.data import StreamingDataLoader, StreamingDataset, TokensLoader
from llm.data.shards.format.reader import ShardError
from llm.data.shards.read.state import StateError
from tests.interop import peers
from tests.resume import check_resume


def assert_same_item(theirs, ours, where: str) -> None:
    """Same structure, types and values; LitData's bytes leaves are memoryviews (ours: bytes)."""
    from PIL import Image

    if isinstance(theirs, dict):
        assert isinstance(ours, dict) and list(theirs) == list(ours), where
        for key in theirs:
            assert_same_item(theirs[key], ours[key], f"{where}[{key!r}]")
    elif isinstance(theirs, (list, tuple)):
        assert type(theirs) is type(ours) and len(theirs) == len(ours), where
        for k, (a, b) in enumerate(zip(theirs, ours)):
            assert_same_item(a, b, f"{where}[{k}]")
    elif isinstance(theirs, Image.Image):
        assert isinstance(ours, Image.Image) and (theirs.mode, theirs.size) == (ours.mode, ours.size), where
        assert np.array_equal(np.asarray(theirs), np.asarray(ours)), where
    elif isinstance(theirs, (np.ndarray, torch.Tensor)):
        assert type(theirs) is type(ours) and theirs.dtype == ours.dtype, f"{where}: {type(ours)} {ours.dtype}"
        assert tuple(theirs.shape) == tuple(ours.shape) and np.array_equal(np.asarray(theirs), np.asarray(ours)), where
    elif isinstance(theirs, memoryview):
        assert ours == theirs.tobytes(), where
    else:
        assert type(theirs) is type(ours) and theirs == ours, f"{where}: {theirs!r} != {ours!r}"


# ---- LitData ----------------------------------------------------------------------------------


@pytest.mark.parametrize("fixture", ["lit_tokens", "lit_tokens_zstd"])
@pytest.mark.parametrize("block", [64, 100])
def test_litdata_token_blocks_are_theirs(request, fixture, block, tmp_path):
    litdata = peers.litdata()
    folder = request.getfixturevalue(fixture)
    copy = tmp_path / "copy"  # LitData decompresses a local folder's chunks in place: give it a copy
    shutil.copytree(folder, copy)
    theirs = litdata.StreamingDataset(str(copy), item_loader=litdata.TokensLoader(block_size=block))
    ours = StreamingDataset(folder, item_loader=TokensLoader(block_size=block))
    assert len(ours) == len(theirs) > 0
    for i in range(len(ours)):
        assert np.array_equal(ours[i].numpy(), np.asarray(theirs[i])), f"block {i}"
    assert ours.manifest.foreign_format == "litdata" and ours.manifest.kind == "tokens"
    ours.verify()
    after = StreamingDataset(copy, item_loader=TokensLoader(block_size=block))  # their in-place decompression
    assert after.fingerprint == ours.fingerprint and np.array_equal(after[len(after) - 1], ours[len(ours) - 1])


def test_litdata_token_positions_restart_at_documents(lit_tokens):
    ds = StreamingDataset(lit_tokens, item_loader=TokensLoader(block_size=64, document_boundaries=True))
    plain = StreamingDataset(lit_tokens, item_loader=TokensLoader(block_size=64))
    first = json.loads((lit_tokens / "index.json").read_text())["chunks"][0]
    sample = ds[0]
    assert np.array_equal(sample["input_ids"].numpy(), plain[0].numpy())
    # documents of the first chunk: the position resets where a document (a LitData item) ends
    assert first["chunk_size"] > 1 and int(sample["position_ids"][0]) == 0


@pytest.mark.parametrize("fixture", ["lit_items", "lit_rows"])
def test_litdata_items_are_theirs(request, fixture):
    litdata = peers.litdata()
    folder = request.getfixturevalue(fixture)
    theirs = litdata.StreamingDataset(str(folder))
    ours = StreamingDataset(folder)
    assert len(ours) == len(theirs) > 0
    for i in range(len(ours)):
        assert_same_item(theirs[i], ours[i], f"item {i}")


def test_litdata_format_read_only_by_litdata_names_convert(lit_nested, tmp_path):
    with pytest.raises(ValueError, match="llm-data convert"):
        StreamingDataset(lit_nested)
    from llm.data.shards.interop.convert import convert

    litdata = peers.litdata()
    convert(lit_nested, tmp_path / "ours", num_workers=0, progress=False)
    ours, theirs = StreamingDataset(tmp_path / "ours"), litdata.StreamingDataset(str(lit_nested))
    assert [ours[i] for i in range(len(ours))] == [theirs[i] for i in range(len(theirs))]


def test_convert_litdata_tokens_keeps_every_document(lit_tokens, tmp_path):
    from llm.data.shards.interop.convert import convert
    from tests.interop.samples import lit_document

    convert(lit_tokens, tmp_path / "ours", num_workers=0, progress=False)
    ds = StreamingDataset(tmp_path / "ours", item_loader=TokensLoader(block_size=1))
    assert ds.manifest.total_documents == 120
    want = np.concatenate([lit_document(i).numpy() for i in range(120)])
    got = ds.read_blocks(np.arange(len(ds)))["input_ids"][:, 0]
    assert np.array_equal(got, want)


# ---- MosaicML MDS -----------------------------------------------------------------------------


def test_mds_samples_are_theirs(mds_raw):
    peers.mosaic()
    from streaming.base import LocalDataset

    theirs, ours = LocalDataset(str(mds_raw)), StreamingDataset(mds_raw)
    assert len(ours) == len(theirs) == 80
    for i in range(len(ours)):
        assert_same_item(theirs[i], ours[i], f"sample {i}")
    assert ours.manifest.foreign_format == "mds"
    ours.verify()


def test_mds_zstd_samples_are_theirs(mds_zstd, tmp_path):
    streaming = peers.mosaic()
    copy = tmp_path / "copy"  # their reader decompresses next to the zip files: give it a copy
    shutil.copytree(mds_zstd, copy)
    theirs = streaming.StreamingDataset(local=str(copy), batch_size=1, allow_unsafe_types=True)
    ours = StreamingDataset(mds_zstd)
    assert all(s.compression == "zstd" for s in ours.manifest.shards)
    assert len(ours) == len(theirs) == 80
    for i in range(len(ours)):
        assert_same_item(theirs[i], ours[i], f"sample {i}")


def test_mds_corrupt_shard_fails_its_hash(mds_raw, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(mds_raw, copy)
    shard = copy / json.loads((copy / "index.json").read_text())["shards"][0]["raw_data"]["basename"]
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0xFF
    shard.write_bytes(bytes(data))
    with pytest.raises(ShardError, match="fails its sha1 hash"):
        StreamingDataset(copy)[0]


def test_mds_hashes_are_remembered_like_our_checksums(mds_raw, tmp_path):
    # checked on first use, then remembered by file identity: a restart does not hash again,
    # a file edited in place is hashed again and refused
    import time

    from llm.data.shards.format import verified

    copy = tmp_path / "copy"
    shutil.copytree(mds_raw, copy)
    time.sleep(0.06)  # a file is remembered only once it has been quiet for 50 ms
    ds = StreamingDataset(copy)
    [ds[i] for i in range(len(ds))]
    shards = ds.manifest.shards
    assert all(s.checksum.startswith("sha1:") and verified.is_verified(copy / s.file, s.checksum) for s in shards)
    shard = copy / shards[0].file
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0xFF
    shard.write_bytes(bytes(data))
    assert not verified.is_verified(shard, shards[0].checksum)
    with pytest.raises(ShardError, match="fails its sha1 hash"):
        StreamingDataset(copy)[0]


# ---- our order, fingerprint and resume over foreign folders ----------------------------------


def test_fingerprint_is_the_foreign_index(lit_tokens, mds_raw, tmp_path):
    block = TokensLoader(block_size=64)
    assert StreamingDataset(lit_tokens, item_loader=block).fingerprint == StreamingDataset(lit_tokens, item_loader=block).fingerprint
    copy = tmp_path / "copy"
    shutil.copytree(lit_tokens, copy)
    assert StreamingDataset(copy, item_loader=block).fingerprint == StreamingDataset(lit_tokens, item_loader=block).fingerprint
    index = json.loads((copy / "index.json").read_text())
    index["chunks"] = index["chunks"][:-1]  # a different dataset (one chunk fewer)
    (copy / "index.json").write_text(json.dumps(index))
    other = StreamingDataset(copy, item_loader=block)
    assert other.fingerprint != StreamingDataset(lit_tokens, item_loader=block).fingerprint
    state = StreamingDataLoader(StreamingDataset(lit_tokens, item_loader=block), batch_size=4).state_dict()
    with pytest.raises(StateError, match="fingerprint"):
        StreamingDataLoader(other, batch_size=4).load_state_dict(state)
    assert StreamingDataset(mds_raw).fingerprint != StreamingDataset(lit_tokens, item_loader=block).fingerprint


def _ids(batch: list[dict]) -> dict[str, torch.Tensor]:
    return {"id": torch.tensor([int(s["id"]) for s in batch]), "tokens": torch.tensor([int(s["tokens"].sum()) for s in batch])}


def run_foreign(config: dict, state: dict | None, steps: int | None):
    """One pipeline over a foreign folder (see tests/resume.py): our shuffle, batches, workers."""
    from tests.resume import take_steps

    if config["kind"] == "tokens":
        ds = StreamingDataset(config["folder"], item_loader=TokensLoader(block_size=48), shuffle=True, seed=3)
        loader = StreamingDataLoader(ds, batch_size=4, num_workers=config["workers"], ledger=config.get("ledger"))
    else:
        ds = StreamingDataset(config["folder"], shuffle=True, seed=5)
        loader = StreamingDataLoader(ds, batch_size=3, num_workers=config["workers"], collate_fn=_ids,
                                     ledger=config.get("ledger"))
    if state is not None:
        loader.load_state_dict(state)
    out = take_steps(({"input_ids": b} if config["kind"] == "tokens" else b for b in loader), steps)
    return out, loader.state_dict()


def test_litdata_tokens_resume_exactly(lit_tokens):
    config = {"folder": str(lit_tokens), "kind": "tokens", "workers": 0}
    reference = check_resume(run_foreign, config, stops=[1, 13], resume_configs=[{**config, "workers": 3}])
    ds = StreamingDataset(lit_tokens, item_loader=TokensLoader(block_size=48))
    assert len(reference) == -(-len(ds) // 4)
    seen = np.sort(np.concatenate([s["input_ids"] for s in reference]), axis=0)
    assert np.array_equal(seen, np.sort(np.stack([ds[i].numpy() for i in range(len(ds))]), axis=0))


def test_mds_resume_exactly(mds_zstd):
    config = {"folder": str(mds_zstd), "kind": "items", "workers": 0}
    reference = check_resume(run_foreign, config, stops=[2, 11], resume_configs=[{**config, "workers": 2}])
    assert sorted(np.concatenate([s["id"] for s in reference]).tolist()) == list(range(80))


def test_litdata_jpeg_leaf_is_the_decoded_image(tmp_path):
    """LitData decodes `jpeg` leaves with torchvision (not installable next to a CPU torch here): we check our
    Pillow decode against Pillow on the same stored bytes, in the layout LitData returns (RGB, CHW, uint8)."""
    peers.litdata()
    from litdata.streaming.writer import BinaryWriter
    from PIL import Image

    path = tmp_path / "pic.jpg"
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (10, 12, 3), dtype=np.uint8)).save(path)
    writer = BinaryWriter(str(tmp_path / "lit"), chunk_bytes="1MB")
    for i in range(3):
        writer[i] = {"i": i, "image": Image.open(path)}
    writer.done()
    writer.merge(1)
    assert "jpeg" in json.loads((tmp_path / "lit" / "index.json").read_text())["config"]["data_format"]
    image = StreamingDataset(tmp_path / "lit")[1]["image"]
    want = torch.from_numpy(np.array(Image.open(path).convert("RGB"))).permute(2, 0, 1)
    assert image.dtype == torch.uint8 and torch.equal(image, want)


def _as_list(samples: list) -> list:
    return samples


@pytest.mark.parametrize("fixture", ["lit_items", "mds_zstd"])
def test_foreign_items_through_spawned_workers(request, fixture):
    """Decoders built in the main process (ds[0]) do not travel: spawned workers rebuild their own."""
    folder = request.getfixturevalue(fixture)
    ds = StreamingDataset(folder)
    first = ds[0]
    loader = StreamingDataLoader(ds, batch_size=len(ds), num_workers=1, multiprocessing_context="spawn",
                                 collate_fn=_as_list)
    (batch,) = list(loader)
    key = "index" if "index" in first else "id"  # (DataLoader's default_convert turns arrays into tensors)
    assert list(batch[0]) == list(first) and [b[key] for b in batch] == [ds[i][key] for i in range(len(ds))]


def test_peer_shard_bytes_share_our_shard_bytes():
    # one implementation of maps, LRU, locking and pickling: the peer's class only adds its own checks
    from llm.data.shards.format.reader import _ShardBytes
    from llm.data.shards.interop.base import ForeignShardBytes

    assert issubclass(ForeignShardBytes, _ShardBytes)
    assert not {"raw", "_open", "verify_all", "__getstate__"} & set(vars(ForeignShardBytes))


def test_mds_list_layouts_split_into_their_parts() -> None:
    """MDS's list[...] columns (a size field, a count, sizes, parts) and jpeg_array (count, sizes, parts)."""
    import numpy as np

    from llm.data.shards.interop.mds import _list_of, _sized_parts

    parts = [b"ab", b"", b"cdef"]
    header = np.array([len(parts), *map(len, parts)], np.uint32).tobytes()
    assert _sized_parts(header + b"".join(parts), 0) == parts
    assert _list_of(bytes.upper)(b"\0\0\0\0" + header + b"".join(parts)) == [b"AB", b"", b"CDEF"]
