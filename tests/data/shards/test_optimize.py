"""optimize / llm-data optimize: every input kind, worker independence, modes, crash safety, bad input."""

from __future__ import annotations

import base64
import gzip
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
import zstandard

from llm.data import ItemsLoader, StreamingDataset, TokensLoader, optimize
from llm.data.shards.format.manifest import Manifest
from llm.data.shards.prepare.optimize_text import optimize_text
from llm.data.tokenize.tokenizers import load_tokenizer, train_bpe_tokenizer
from tests.cli.helpers import run_here
from tests.data.shards.helpers import all_tokens, real_lines, write_jsonl

LLM_DATA = [sys.executable, "-m", "llm.cli.data"]


@pytest.fixture(scope="module")
def texts() -> list[str]:
    return real_lines(1500)


@pytest.fixture(scope="module")
def bpe(tmp_path_factory, texts) -> str:
    return str(train_bpe_tokenizer(texts, 600, tmp_path_factory.mktemp("tok") / "tokenizer.json"))


@pytest.fixture(scope="module")
def tiktoken_file(tmp_path_factory) -> str:
    """A real .tiktoken ranks file: the 256 bytes plus a few merges."""
    ranks = [bytes([b]) for b in range(256)] + [b"th", b"the", b" the", b"in", b"ing"]
    path = tmp_path_factory.mktemp("tt") / "tiny.tiktoken"
    path.write_text("".join(f"{base64.b64encode(t).decode()} {i}\n" for i, t in enumerate(ranks)))
    return str(path)


def expected_tokens(spec: str, texts: list[str]) -> np.ndarray:
    tok = load_tokenizer(spec)
    out: list[int] = []
    for t in texts:
        out += tok.encode(t.strip()) + [tok.eos_id]
    return np.array(out, dtype=np.int64)


def write_inputs(folder: Path, texts: list[str]) -> dict[str, Path]:
    """The same records in every supported input kind."""
    half = len(texts) // 2
    paths = {"txt": folder / "a.txt", "jsonl": folder / "b.jsonl"}
    paths["txt"].write_text("\n".join(texts) + "\n")
    write_jsonl(paths["jsonl"], texts)
    with gzip.open(folder / "c.jsonl.gz", "wt") as f:
        f.writelines(json.dumps({"text": t}) + "\n" for t in texts[:half])
    paths["jsonl.gz"] = folder / "c.jsonl.gz"
    raw = "".join(json.dumps({"text": t}) + "\n" for t in texts[half:]).encode()
    (folder / "d.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(raw))
    paths["jsonl.zst"] = folder / "d.jsonl.zst"
    pq.write_table(pa.table({"text": texts, "n": list(range(len(texts)))}), folder / "e.parquet", row_group_size=300)
    paths["parquet"] = folder / "e.parquet"
    return paths


@pytest.mark.parametrize("spec_name", ["simple", "bpe", "tiktoken"])
def test_round_trip_every_input_kind(tmp_path, texts, bpe, tiktoken_file, spec_name):
    spec = {"simple": "simple", "bpe": bpe, "tiktoken": tiktoken_file}[spec_name]
    paths = write_inputs(tmp_path, texts)
    half = len(texts) // 2
    records = {"txt": texts, "jsonl": texts, "jsonl.gz": texts[:half], "jsonl.zst": texts[half:], "parquet": texts}
    for kind, path in paths.items():
        out = tmp_path / f"ds-{kind}"
        optimize_text([str(path)], out, spec, num_workers=2, chunk_bytes="8KB", progress=False)
        assert np.array_equal(all_tokens(out), expected_tokens(spec, records[kind])), kind
        m = Manifest.load(out)
        assert m.eos_id == load_tokenizer(spec).eos_id and m.dtype == "uint16"
        assert m.total_documents == len(records[kind])


def test_content_is_the_same_for_any_number_of_workers(tmp_path, texts):
    big = tmp_path / "big.jsonl"
    write_jsonl(big, texts * 60)  # ~6 MB: split into byte ranges shared by workers
    streams = []
    for workers in (0, 1, 2, 3):
        out = tmp_path / f"w{workers}"
        optimize_text([str(big)], out, "simple", num_workers=workers, chunk_bytes="1MB", progress=False)
        streams.append(all_tokens(out))
    for s in streams[1:]:
        assert np.array_equal(s, streams[0])
    assert np.array_equal(streams[0], expected_tokens("simple", texts * 60))


def _docs_generator(n: int):
    for i in range(n):
        yield np.arange(i % 50 + 1, dtype=np.int32) + n


def test_python_api_documents_as_arrays_tensors_lists_and_generators(tmp_path):
    inputs = list(range(40))

    def fn(i: int):
        if i % 4 == 0:
            return np.full(i + 1, i, dtype=np.int64)
        if i % 4 == 1:
            return torch.full((i + 1,), i)
        if i % 4 == 2:
            return [i] * (i + 1)
        return _docs_generator(3)

    optimize(fn, inputs, tmp_path / "ds", num_workers=2, item_loader=TokensLoader(), chunk_size=100, progress=False)
    expected: list[int] = []
    for i in inputs:
        if i % 4 == 3:
            for doc in _docs_generator(3):
                expected += doc.tolist()
        else:
            expected += [i] * (i + 1)
    assert all_tokens(tmp_path / "ds").tolist() == expected
    ds = StreamingDataset(tmp_path / "ds", item_loader=TokensLoader(block_size=7))
    assert torch.cat([ds[i] for i in range(len(ds))])[: len(expected)].tolist() == expected


def test_large_ids_widen_to_uint32(tmp_path):
    optimize(lambda i: np.array([i, 70_000 + i]), [1, 2, 3], tmp_path / "ds", num_workers=0, item_loader=TokensLoader(), progress=False)
    m = Manifest.load(tmp_path / "ds")
    assert m.dtype == "uint32"
    assert all_tokens(tmp_path / "ds").tolist() == [1, 70_001, 2, 70_002, 3, 70_003]


def test_items_round_trip(tmp_path):
    def fn(i: int):
        return {"id": i, "name": f"item-{i}", "vec": np.arange(i, dtype=np.float32), "t": torch.tensor([i, i])}

    optimize(fn, list(range(100)), tmp_path / "items", num_workers=2, chunk_size=16, compression="zstd", progress=False)
    ds = StreamingDataset(tmp_path / "items", item_loader=ItemsLoader())
    assert len(ds) == 100
    assert ds[42]["name"] == "item-42" and np.array_equal(ds[42]["vec"], np.arange(42, dtype=np.float32))
    from llm.data import StreamingDataLoader

    loader = StreamingDataLoader(ds, batch_size=8, num_workers=2, collate_fn=lambda items: [x["id"] for x in items])
    ids = [i for batch in loader for i in batch]
    assert sorted(ids) == list(range(100))


def test_compressed_token_shards_read_back(tmp_path, texts):
    src = write_jsonl(tmp_path / "a.jsonl", texts)
    optimize_text([str(src)], tmp_path / "z", "simple", compression="zstd", chunk_bytes="16KB", progress=False)
    m = Manifest.load(tmp_path / "z")
    assert all(s.compression == "zstd" and s.bytes < s.raw_bytes for s in m.shards)
    ds = StreamingDataset(tmp_path / "z", item_loader=TokensLoader(block_size=1000))
    got = torch.cat([ds[i] for i in range(len(ds))]).numpy()
    want = expected_tokens("simple", texts)
    assert np.array_equal(got[: want.size], want)


def test_modes_empty_append_overwrite(tmp_path, texts, bpe):
    a = write_jsonl(tmp_path / "a.jsonl", texts[:300])
    b = write_jsonl(tmp_path / "b.jsonl", texts[300:600])
    out = tmp_path / "ds"
    optimize_text([str(a)], out, "simple", progress=False)
    with pytest.raises(ValueError, match="not empty.*mode='append' or mode='overwrite'"):
        optimize_text([str(b)], out, "simple", progress=False)
    optimize_text([str(b)], out, "simple", mode="append", progress=False)
    assert np.array_equal(all_tokens(out), expected_tokens("simple", texts[:600]))
    with pytest.raises(ValueError, match="cannot append to .*: its tokenizer is .*, this run.s is "):
        optimize_text([str(b)], out, bpe, mode="append", progress=False)
    optimize_text([str(b)], out, bpe, mode="overwrite", progress=False)
    assert np.array_equal(all_tokens(out), expected_tokens(bpe, texts[300:600]))
    assert len(list(out.glob("shard-*.bin"))) == len(Manifest.load(out).shards), "old shards are removed"


# kill -9 of an llm-data subprocess: CI. make test kills an append in test_items.py (the same output folder
# commit and orphan clean-up) and an llm-data overwrite in reliability/test_optimize_faults.py.
@pytest.mark.slow
def test_kill_during_append_leaves_previous_dataset(tmp_path, texts):
    out = tmp_path / "ds"
    first = write_jsonl(tmp_path / "first.jsonl", texts[:500])
    optimize_text([str(first)], out, "simple", progress=False)
    before_manifest = (out / "index.json").read_bytes()
    before = all_tokens(out)
    big = write_jsonl(tmp_path / "big.jsonl", texts * 400)  # long enough to kill mid-run
    proc = subprocess.Popen(
        [*LLM_DATA, "optimize", str(big), "--output", str(out), "--mode", "append", "--chunk-bytes", "64KB", "--num-workers", "2"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )
    deadline = time.time() + 60
    while time.time() < deadline and len(list(out.glob("shard-*.bin"))) < len(Manifest.load(out).shards) + 3:
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGKILL)  # the parent and its workers, mid-write
    proc.wait()
    assert len(list(out.glob("shard-*.bin"))) > len(Manifest.load(out).shards), "the kill must land mid-run"
    assert (out / "index.json").read_bytes() == before_manifest
    ds = StreamingDataset(out, item_loader=TokensLoader(block_size=64))
    ds.verify()
    assert np.array_equal(torch.cat([ds[i] for i in range(len(ds))]).numpy()[: before.size], before)
    second = write_jsonl(tmp_path / "second.jsonl", texts[500:600])
    optimize_text([str(second)], out, "simple", mode="append", progress=False)
    assert np.array_equal(all_tokens(out), expected_tokens("simple", texts[:600]))
    assert len(list(out.glob("shard-*.bin"))) == len(Manifest.load(out).shards), "orphans of the killed run are removed"


def run_cli(*args: str) -> subprocess.CompletedProcess:
    """`llm-data ARGS`, its main() called in process: these are argument and input checks (a subprocess each cost ~0.3 s)."""
    return run_here("llm-data", *args)


def assert_clean_failure(result: subprocess.CompletedProcess, out: Path, *fragments: str) -> None:
    assert result.returncode == 2, result.stderr
    message = result.stderr.strip().splitlines()[-1]
    assert "Traceback" not in result.stderr
    for fragment in fragments:
        assert fragment in message, message
    assert not out.exists(), "no partial dataset is left behind"


def test_bad_inputs_give_one_clear_sentence(tmp_path, texts):
    out = tmp_path / "out"
    assert_clean_failure(run_cli("optimize", str(tmp_path / "missing.txt"), "--output", str(out)), out, "missing.txt", "no such")
    bad_json = tmp_path / "bad.jsonl"
    lines = [json.dumps({"text": t}) for t in texts * 20]
    lines[len(lines) - 10] = '{"text": "unterminated'
    bad_json.write_text("\n".join(lines) + "\n")
    assert_clean_failure(
        run_cli("optimize", str(bad_json), "--output", str(out), "--num-workers", "2"),
        out, f"bad.jsonl:{len(lines) - 9}", "invalid JSON",
    )
    no_col = write_jsonl(tmp_path / "nocol.jsonl", texts[:10])
    assert_clean_failure(run_cli("optimize", str(no_col), "--output", str(out), "--text-column", "body"), out, "nocol.jsonl:1", "'body'")
    pq.write_table(pa.table({"content": ["a", "b"]}), tmp_path / "p.parquet")
    assert_clean_failure(run_cli("optimize", str(tmp_path / "p.parquet"), "--output", str(out)), out, "p.parquet", "'text'", "content")
    assert_clean_failure(run_cli("optimize", str(no_col), "--output", str(out), "--tokenizer", "gpt9"), out,
                         "tokenizer 'gpt9' is neither a file here nor a Hugging Face tokenizer in the local hub cache")
    unreadable = tmp_path / "locked.txt"
    unreadable.write_text("x\n")
    unreadable.chmod(0)
    if os.geteuid() != 0:  # root reads anything; a directory named like a file is unreadable for everyone
        assert_clean_failure(run_cli("optimize", str(unreadable), "--output", str(out)), out, "locked.txt")
    (tmp_path / "dir.txt").mkdir()
    assert_clean_failure(run_cli("optimize", str(tmp_path / "dir.txt" / "*.txt"), "--output", str(out)), out, "no files match")


def test_invalid_utf8_is_replaced_and_counted(tmp_path):
    src = tmp_path / "mixed.txt"
    src.write_bytes(b"good line\nbad \xff\xfe line\nalso \xc3 bad\nfine\n")
    result = run_cli("optimize", str(src), "--output", str(tmp_path / "ds"), "--no-progress")
    assert result.returncode == 0, result.stderr
    assert "2 records with invalid UTF-8" in result.stderr
    assert all_tokens(tmp_path / "ds").tolist() == expected_tokens(
        "simple", ["good line", "bad \ufffd\ufffd line", "also \ufffd bad", "fine"]
    ).tolist()


def test_corruption_names_the_shard(tmp_path, texts):
    src = write_jsonl(tmp_path / "a.jsonl", texts)
    out = tmp_path / "ds"
    optimize_text([str(src)], out, "simple", chunk_bytes="16KB", progress=False)
    assert run_cli("verify", str(out)).returncode == 0
    shard = out / Manifest.load(out).shards[1].file
    data = bytearray(shard.read_bytes())
    data[100] ^= 0xFF
    shard.write_bytes(bytes(data))
    verify = run_cli("verify", str(out))
    assert verify.returncode == 2 and f"{shard.name} fails its checksum" in verify.stderr
    ds = StreamingDataset(out, item_loader=TokensLoader(block_size=64))
    with pytest.raises(ValueError, match=f"shard .*{shard.name} fails its checksum"):
        [ds[i] for i in range(len(ds))]
    shard.write_bytes(bytes(data[:-5]))
    ds = StreamingDataset(out, item_loader=TokensLoader(block_size=64))  # opening reads no shard: the first touch checks
    with pytest.raises(ValueError, match=f"shard .*{shard.name} has {len(data) - 5} bytes"):
        [ds[i] for i in range(len(ds))]
    (out / "index.json").write_text("{not json")
    with pytest.raises(ValueError, match="index.json: malformed manifest"):
        StreamingDataset(out, item_loader=TokensLoader(block_size=64))
    (out / "index.json").unlink()
    with pytest.raises(ValueError, match=f"{out}: no index.json"):
        StreamingDataset(out, item_loader=TokensLoader(block_size=64))


def _small_item(i: int) -> dict:
    return {"x": i, "name": f"n{i}"}


def _doc100(i: int) -> np.ndarray:
    return np.arange(i, i + 100)


@pytest.mark.parametrize("compression", [None, "zstd"])
def test_a_small_input_in_many_tasks_gives_full_shards(tmp_path, compression) -> None:
    # 8 workers cut 40 inputs into 32 tasks; their tiny last shards are joined, in input order
    optimize(_small_item, list(range(40)), tmp_path / "items", num_workers=8, compression=compression, progress=False)
    ds = StreamingDataset(tmp_path / "items")
    assert len(ds.manifest.shards) <= 2 and [ds[i]["x"] for i in range(len(ds))] == list(range(40))
    optimize(_doc100, list(range(40)), tmp_path / "tokens", num_workers=8, chunk_size=3000, item_loader=TokensLoader(),
             compression=compression, progress=False)
    manifest = Manifest.load(tmp_path / "tokens")
    assert [s.tokens for s in manifest.shards] == [3000, 1000]  # joined, then cut at chunk_size
    if compression is None:  # all_tokens reads the raw files
        assert all_tokens(tmp_path / "tokens").tolist() == np.concatenate([_doc100(i) for i in range(40)]).tolist()


def test_a_big_input_still_runs_in_many_tasks(tmp_path) -> None:
    # tasks whose output is near the limit keep their own shards (nothing is rewritten)
    optimize(_doc100, list(range(400)), tmp_path / "ds", num_workers=2, chunk_size=2000, item_loader=TokensLoader(),
             progress=False)
    shards = Manifest.load(tmp_path / "ds").shards
    tasks = {s.file.split("-")[3] for s in shards}
    assert len(tasks) == 8 and not any("joined" in s.file for s in shards)
    assert all_tokens(tmp_path / "ds").tolist() == np.concatenate([_doc100(i) for i in range(400)]).tolist()
