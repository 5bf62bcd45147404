"""optimize() of items of any type: round trips, structure errors, append, v1 datasets, collate."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from llm.data import StreamingDataLoader, StreamingDataset, collate_items, optimize
from llm.data.shards.format.manifest import INDEX_NAME, Manifest
from llm.data.shards.format.reader import ShardError
from llm.data.shards.format.records import ItemCodec
from llm.data.shards.format.serializers import StructureError
from tests.data.items.helpers import same, write_v1_items


class Point:  # a picklable object of our own: stored as a pickle, the last resort
    def __init__(self, x: int):
        self.x = x

    def __eq__(self, other: object) -> bool:
        return type(other) is Point and other.x == self.x


def _every_type(i: int) -> dict:
    return {
        "int": i, "float": i / 3, "bool": i % 2 == 0, "none": None, "str": f"item-{i}-é", "bytes": bytes([i % 256]) * i,
        "u8": np.full((2, 3), i, dtype=np.uint8), "f16": np.arange(i, dtype=np.float16), "be": np.arange(3, dtype=">i4"),
        "fortran": np.asfortranarray(np.arange(6.0).reshape(2, 3)), "scalar": np.float32(i), "zero_d": np.array(i),
        "strings": np.array(["a" * i, "b"]), "empty": np.zeros((0, 4)), "complex": np.array([1 + 2j]),
        "tensor": torch.arange(i, dtype=torch.float32).reshape(-1, 1), "bf16": torch.ones(2, dtype=torch.bfloat16),
        "nested": {"list": [1, (2.5, "x")], "tuple": (None, [b"y"])}, "obj": Point(i), "big": 2**70 + i,
    }


def test_every_type_round_trips_with_chunks_zstd_and_workers(tmp_path: Path) -> None:
    out = tmp_path / "ds"
    summary = optimize(_every_type, list(range(40)), out, num_workers=2, chunk_size=7, compression="zstd", progress=False)
    assert summary.items == 40 and summary.shards >= 6
    manifest = json.loads((out / INDEX_NAME).read_text())
    assert manifest["format_version"] == 2 and manifest["item_layout"]["dict"][0] == ["int", "int"]
    ds = StreamingDataset(out)
    for i in (0, 1, 17, 39):
        assert same(ds[i], _every_type(i)), i
    assert ds[5]["u8"].flags.writeable and ds[5]["fortran"].flags.c_contiguous


def test_a_generator_yields_many_items_and_numpy_is_stored_raw(tmp_path: Path) -> None:
    def fn(i: int):
        for j in range(3):
            yield {"x": np.full(1000, 7 * i + j, dtype=np.int64), "label": j}

    optimize(fn, list(range(5)), tmp_path / "ds", num_workers=0, progress=False)
    raw = b"".join(p.read_bytes() for p in sorted((tmp_path / "ds").glob("shard-*.bin")))
    assert b"numpy" not in raw and b"\x80\x05" not in raw  # no pickle anywhere, just the array bytes
    ds = StreamingDataset(tmp_path / "ds")
    assert len(ds) == 15 and int(ds[7]["x"][0]) == 7 * 2 + 1 and ds[7]["label"] == 1


_LEAF = st.one_of(
    st.integers(-(2**63), 2**63 - 1), st.floats(allow_nan=True), st.booleans(), st.none(), st.text(max_size=8),
    st.binary(max_size=8),
    hnp.arrays(st.one_of(hnp.scalar_dtypes(), hnp.byte_string_dtypes(), hnp.unicode_string_dtypes()),
               hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=3)),
)
_ITEM = st.recursive(_LEAF, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.lists(inner, max_size=3).map(tuple),
    st.dictionaries(st.text(max_size=4), inner, max_size=3)), max_leaves=8)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_ITEM)
def test_any_nested_structure_of_arrays_and_scalars_round_trips(item) -> None:
    codec = ItemCodec.for_item(item)
    assert same(codec.decode(codec.encode(item)), item)
    assert same(ItemCodec(json.loads(json.dumps(codec.layout))).decode(codec.encode(item)), item)  # from a manifest


@pytest.mark.parametrize("workers", [0, 2])
def test_an_item_of_another_structure_names_the_input_and_the_field(tmp_path: Path, workers: int) -> None:
    def fn(i: int) -> dict:
        return {"image": np.zeros((2, 2), np.uint8), "meta": {"label": "cat" if i == 17 else i}}

    with pytest.raises(StructureError, match=r"^optimize: input 17 \(17\): field 'meta.label' is str, the first item's is int$"):
        optimize(fn, list(range(20)), tmp_path / "ds", num_workers=workers, progress=False)
    assert not (tmp_path / "ds").exists()


def test_a_task_whose_first_item_differs_is_named_by_its_item_index(tmp_path: Path) -> None:
    def fn(i: int):  # task 1 (inputs 5-9 of 4 tasks x 5) yields floats from its first item on
        for _j in range(2):
            yield {"label": float(i) if i >= 5 else i}

    with pytest.raises(StructureError, match=r"item 10 \(the first of task 1\): field 'label' is float, the first item's is int"):
        optimize(fn, list(range(20)), tmp_path / "ds", num_workers=1, progress=False)


def test_append_needs_the_same_layout(tmp_path: Path) -> None:
    out = tmp_path / "ds"
    optimize(lambda i: {"x": np.zeros(3), "y": i}, list(range(4)), out, num_workers=0, progress=False)
    optimize(lambda i: {"x": np.ones(5), "y": 10 + i}, list(range(4)), out, num_workers=0, mode="append", progress=False)
    ds = StreamingDataset(out)
    assert [ds[i]["y"] for i in range(8)] == [0, 1, 2, 3, 10, 11, 12, 13]
    before, files = (out / INDEX_NAME).read_text(), sorted(out.glob("shard-*.bin"))
    with pytest.raises(ValueError, match=r"cannot append to .*: its item layout has field 'y' as int, this run's has str"):
        optimize(lambda i: {"x": np.zeros(3), "y": "s"}, [0], out, num_workers=0, mode="append", progress=False)
    assert (out / INDEX_NAME).read_text() == before and sorted(out.glob("shard-*.bin")) == files


def test_v1_item_datasets_still_read_and_refuse_an_append(tmp_path: Path) -> None:
    items = [{"id": i, "vec": np.arange(i, i + 3), "t": torch.tensor([i])} for i in range(30)]
    folder = write_v1_items(tmp_path / "old", items)
    manifest = Manifest.load(folder)
    assert manifest.format_version == 1 and manifest.item_layout is None
    ds = StreamingDataset(folder)
    assert all(same(ds[i], items[i]) for i in range(30))
    loader = StreamingDataLoader(ds, batch_size=8, num_workers=0)
    assert [b["id"].tolist() for b in loader][0] == list(range(8))
    with pytest.raises(ValueError, match="format v1 pickles; rebuild it with mode='overwrite'"):
        optimize(lambda i: {"id": i}, [1], folder, num_workers=0, mode="append", progress=False)
    assert Manifest.load(folder).fingerprint() == manifest.fingerprint()


def test_default_collate_batches_as_pytorch_does(tmp_path: Path) -> None:
    def fn(i: int) -> dict:
        return {"x": np.full((2, 3), i, np.float32), "label": i, "w": i / 2, "name": f"n{i}", "none": None,
                "pair": (i, np.int16(i)), "t": torch.full((4,), i)}

    optimize(fn, list(range(10)), tmp_path / "ds", num_workers=0, progress=False)
    batch = next(iter(StreamingDataLoader(StreamingDataset(tmp_path / "ds"), batch_size=4, num_workers=0)))
    assert batch["x"].shape == (4, 2, 3) and batch["x"].dtype == torch.float32
    assert batch["label"].tolist() == [0, 1, 2, 3] and batch["label"].dtype == torch.int64
    assert batch["w"].dtype == torch.float64 and batch["name"] == ["n0", "n1", "n2", "n3"]
    assert batch["none"] == [None] * 4 and batch["t"].shape == (4, 4)
    assert batch["pair"][0].tolist() == [0, 1, 2, 3] and batch["pair"][1].dtype == torch.int16
    from torch.utils.data import default_collate

    items = [fn(i) for i in range(4)]
    reference = default_collate([{k: v for k, v in it.items() if k != "none"} for it in items])
    ours = collate_items(items)
    for key, value in reference.items():
        assert same(ours[key], value), key


def test_an_edited_item_layout_is_a_clear_error(tmp_path: Path) -> None:
    optimize(lambda i: {"a": i, "b": "x" * i}, list(range(5)), tmp_path / "ds", num_workers=0, progress=False)
    data = json.loads((tmp_path / "ds" / INDEX_NAME).read_text())
    data["item_layout"] = {"dict": [["a", "int"], ["b", "nope"]]}
    (tmp_path / "ds" / INDEX_NAME).write_text(json.dumps(data))
    with pytest.raises(ValueError, match=r"key 'item_layout' has an unknown leaf 'nope'"):
        StreamingDataset(tmp_path / "ds")
    data["item_layout"] = {"dict": [["a", "int"], ["b", "bytes"]]}  # well formed, but not these records
    (tmp_path / "ds" / INDEX_NAME).write_text(json.dumps(data))
    with pytest.raises(ValueError, match="key 'fingerprint'"):
        StreamingDataset(tmp_path / "ds")


_KILL_SCRIPT = """
import sys, time
import numpy as np
from llm.data import optimize

def slow_item(i):
    time.sleep(0.002)
    return {"x": np.full((16, 16), i, np.int32), "label": i, "name": f"n{i}"}

optimize(slow_item, list(range(100_000)), sys.argv[1], mode="append", chunk_bytes="8KB", num_workers=2,
         progress=False)
"""


def test_kill_9_during_an_item_append_leaves_the_previous_dataset(tmp_path: Path) -> None:
    out = tmp_path / "ds"

    def item(i: int) -> dict:
        return {"x": np.full((16, 16), i, np.int32), "label": i, "name": f"n{i}"}

    optimize(item, list(range(300)), out, chunk_bytes="8KB", num_workers=0, progress=False)
    before = (out / "index.json").read_bytes()
    listed = len(Manifest.load(out).shards)
    proc = subprocess.Popen([sys.executable, "-c", _KILL_SCRIPT, str(out)], start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 60
    while time.time() < deadline and len(list(out.glob("shard-*.bin"))) < listed + 3:
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGKILL)  # the parent and its workers, mid-write
    proc.wait()
    assert len(list(out.glob("shard-*.bin"))) > listed, "the kill must land mid-run"
    assert (out / "index.json").read_bytes() == before
    ds = StreamingDataset(out)
    assert [ds[i]["label"] for i in range(len(ds))] == list(range(300))
    optimize(item, list(range(300, 310)), out, mode="append", chunk_bytes="8KB", num_workers=0, progress=False)
    ds = StreamingDataset(out)
    assert [ds[i]["label"] for i in range(len(ds))] == list(range(310))
    assert int(ds[305]["x"][3, 3]) == 305 and ds[305]["name"] == "n305"
    assert len(list(out.glob("shard-*.bin"))) == len(Manifest.load(out).shards), "orphans of the killed run are removed"


def test_an_epoch_of_items_keeps_no_pages_and_a_truncated_shard_is_named(tmp_path: Path) -> None:
    from tests.data.shards.test_pread import mapped_kb

    out = tmp_path / "ds"
    optimize(lambda i: {"x": np.full((40, 40, 3), i % 256, np.uint8), "label": i}, list(range(3000)), out,
             chunk_bytes="1MB", num_workers=0, progress=False)
    ds = StreamingDataset(out, shuffle=True)
    labels = [int(v) for batch in StreamingDataLoader(ds, batch_size=16, num_workers=2) for v in batch["label"]]
    assert sorted(labels) == list(range(3000))
    # 14 MB of records read; through maps with fault-around nearly all of it would stay resident
    assert mapped_kb(out) < 1 << 10, f"{mapped_kb(out)} KB of the dataset's pages stayed mapped"
    fresh = StreamingDataset(out)
    assert int(fresh[5]["x"][0, 0, 0]) == 5
    shard = out / fresh.manifest.shards[0].file
    os.truncate(shard, 1000)
    with pytest.raises(ShardError, match=f"shard {shard} ended before byte .* while reading an item: the file was truncated"):
        fresh[50]


def _numbered(i: int) -> dict:
    return {"x": i, "y": np.arange(i % 5)}


@pytest.mark.parametrize("workers", [0, 2])  # 2: reader threads (the default backend without a custom collate_fn)
def test_a_dataset_overwritten_under_its_reader_is_named(tmp_path: Path, workers: int) -> None:
    from llm.data.shards.format.pread import DatasetChanged

    out = tmp_path / "ds"
    optimize(_numbered, list(range(2000)), out, num_workers=0, chunk_size=20, progress=False)
    # in order, so that the reader threads' read-ahead has not opened every shard yet (an open shard
    # stays readable: its old file lives on until closed)
    loader = StreamingDataLoader(StreamingDataset(out), batch_size=4, num_workers=workers,
                                 collate_fn=list, worker_backend="threads")
    batches = iter(loader)
    for _ in range(3):
        next(batches)
    optimize(_numbered, list(range(2000)), out, num_workers=0, chunk_size=20, progress=False, mode="overwrite")
    with pytest.raises(DatasetChanged, match=rf"^dataset {out} changed under this reader \(shard shard-\S+\.bin is gone") as info:
        for _ in batches:
            pass
    assert "\n" not in str(info.value)


def test_a_shard_deleted_under_its_reader_is_named_missing(tmp_path: Path) -> None:
    out = tmp_path / "ds"
    optimize(_numbered, list(range(100)), out, num_workers=0, chunk_size=20, progress=False)
    ds = StreamingDataset(out)
    shard = sorted(out.glob("shard-*.bin"))[-1]
    shard.unlink()  # the manifest still lists it: a lost file, not a new dataset
    with pytest.raises(ShardError, match=rf"shard {shard} is missing \(listed in {out / INDEX_NAME}\)"):
        [ds[i] for i in range(len(ds))]


def _with_lock_at_4(i: int) -> dict:
    import threading

    return {"x": i, "meta": {"k": threading.Lock() if i == 4 else Point(i)}}


@pytest.mark.parametrize("workers", [0, 2])
def test_an_unpicklable_item_names_the_input_and_the_field(tmp_path: Path, workers: int) -> None:
    from llm.data.shards.format.serializers import UnpicklableItem

    with pytest.raises(UnpicklableItem, match=r"^optimize: input 4 \(4\): field 'meta.k' \(lock\) cannot be pickled "
                                              r"\(TypeError: cannot pickle '_thread.lock' object\); return only") as info:
        optimize(_with_lock_at_4, list(range(10)), tmp_path / "ds", num_workers=workers, progress=False)
    assert "\n" not in str(info.value) and not (tmp_path / "ds" / INDEX_NAME).exists()


def test_a_shard_removed_after_it_was_verified_is_named(tmp_path: Path) -> None:
    from llm.data.shards.format.pread import DatasetChanged, DescriptorPool

    gone = str(tmp_path / "shard-x.bin")
    with pytest.raises(DatasetChanged, match=rf"^shard {gone} was removed after its checksum was verified: the dataset changed"):
        with DescriptorPool().use([0], lambda i: gone, [(1, 2)]):
            pass
