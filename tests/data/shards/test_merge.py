"""merge_datasets: optimized datasets as one, their shards copied (hard-linked) and checked, written like optimize's output."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from llm.data import StreamingDataset, TokensLoader, merge_datasets, optimize
from llm.data.shards.format.pread import ShardError
from llm.data.storage.lock import FolderLock
from llm.data.tokenize.tokenizers import load_tokenizer

DOCS = [np.random.default_rng(i).integers(0, 300, size=30 + 5 * i) for i in range(40)]


def write(out: Path, docs: list[np.ndarray], **kw) -> Path:
    optimize(lambda d: d, docs, str(out), item_loader=TokensLoader(), chunk_bytes="1KB", num_workers=0,
             progress=False, **kw)
    return out


def tokens(path: Path) -> np.ndarray:
    ds = StreamingDataset(str(path), item_loader=TokensLoader(block_size=16))
    return np.concatenate([ds[i].numpy() for i in range(len(ds))])[: ds.reader.total]


def test_the_merge_reads_as_the_inputs_one_after_another(tmp_path):
    a, b = write(tmp_path / "a", DOCS[:25]), write(tmp_path / "b", DOCS[25:])
    manifest = merge_datasets([str(a), str(b)], str(tmp_path / "m"))
    assert np.array_equal(tokens(tmp_path / "m"), np.concatenate([tokens(a), tokens(b)]))
    inputs = [json.loads((p / "index.json").read_text()) for p in (a, b)]
    assert [s.checksum for s in manifest.shards] == [s["checksum"] for i in inputs for s in i["shards"]]
    first = tmp_path / "m" / manifest.shards[0].file  # a hard link on one filesystem: no bytes copied
    assert os.stat(first).st_ino == os.stat(a / inputs[0]["shards"][0]["file"]).st_ino
    assert sorted(p.name for p in (tmp_path / "m").iterdir()) == sorted(["index.json", *(s.file for s in manifest.shards)])


@pytest.mark.parametrize("which", ["tokenizer", "dtype", "kind"])
def test_datasets_made_differently_are_refused_in_one_sentence(tmp_path, which):
    a = write(tmp_path / "a", DOCS[:5])
    if which == "tokenizer":
        b = write(tmp_path / "b", DOCS[:5], tokenizer=load_tokenizer("simple"))  # recorded; `a` records none
    elif which == "dtype":
        b = write(tmp_path / "b", [np.array([70_000, 1, 2])])  # ids past uint16: uint32 shards
    else:
        b = tmp_path / "items"
        optimize(lambda i: {"i": i}, list(range(5)), str(b), num_workers=0, progress=False)
    with pytest.raises(ValueError) as info:
        merge_datasets([str(a), str(b)], str(tmp_path / "m"))
    message = str(info.value)
    assert message.startswith(f"cannot merge {a} and {b}: their ") and "\n" not in message
    assert not (tmp_path / "m").exists()


def test_a_corrupt_input_shard_leaves_no_output(tmp_path):
    a, b = write(tmp_path / "a", DOCS[:25]), write(tmp_path / "b", DOCS[25:])
    shard = b / json.loads((b / "index.json").read_text())["shards"][1]["file"]
    shard.write_bytes(shard.read_bytes()[:-1] + b"\xff")  # same size, other bytes
    with pytest.raises(ShardError, match=rf"shard {shard} has .* its manifest says .*: the input is corrupt"):
        merge_datasets([str(a), str(b)], str(tmp_path / "m"))
    assert not (tmp_path / "m").exists()  # the copies made so far were removed with the folder


def test_the_output_is_locked_checked_and_never_an_input(tmp_path):
    a, b = write(tmp_path / "a", DOCS[:25]), write(tmp_path / "b", DOCS[25:])
    with pytest.raises(ValueError, match="output_dir .*a is also an input"):
        merge_datasets([str(a), str(b)], str(a))
    with pytest.raises(ValueError, match="at least two input_dirs"):
        merge_datasets([str(a)], str(tmp_path / "m"))
    merge_datasets([str(a), str(b)], str(tmp_path / "m"))
    with pytest.raises(ValueError, match="is not empty; pass mode='append' or mode='overwrite'"):
        merge_datasets([str(a), str(b)], str(tmp_path / "m"))
    merge_datasets([str(a), str(b)], str(tmp_path / "m"), mode="append")
    assert len(tokens(tmp_path / "m")) == 2 * sum(len(d) for d in DOCS)
    lock = FolderLock(tmp_path / "m", what="a test")
    lock.acquire()
    try:
        with pytest.raises(Exception, match=r"m is being written by .* wait for it to finish"):  # said at once
            merge_datasets([str(a), str(b)], str(tmp_path / "m"), mode="overwrite")
    finally:
        lock.release()
