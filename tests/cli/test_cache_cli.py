"""`llm-data cache ls|clear` on real cache folders (a `local:` dataset read through the shard cache)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from llm.data import StreamingDataLoader, StreamingDataset, TokensLoader, optimize
from tests.cli.helpers import first_error, run, run_here


def _dataset(folder: Path, tag: int) -> str:
    optimize(lambda i: np.full(50, tag * 1000 + i, dtype=np.int64), list(range(60)), str(folder), chunk_bytes="1KB",
             num_workers=0, progress=False, item_loader=TokensLoader())
    return f"local:{folder}"


def _read_all(url: str, cache: Path) -> StreamingDataset:
    ds = StreamingDataset(url, item_loader=TokensLoader(block_size=16), cache_dir=cache, max_cache_size=None)
    for _ in StreamingDataLoader(ds, batch_size=4):
        pass
    return ds


@pytest.fixture
def caches(tmp_path: Path) -> tuple[Path, list[StreamingDataset]]:
    cache = tmp_path / "cache"
    return cache, [_read_all(_dataset(tmp_path / f"ds{i}", i), cache) for i in range(2)]


@pytest.mark.parametrize("sub", [["cache"], ["cache", "ls"], ["cache", "clear"]])
def test_help_shows_examples(tmp_path: Path, sub: list[str]) -> None:
    proc = run_here("llm-data", *sub, "--help", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "llm-data cache clear --all" in proc.stdout.split("example", 1)[1]


def _ls(cwd: Path, *args: str) -> list[list[str]]:
    proc = run("llm-data", "cache", "ls", *args, cwd=cwd)
    assert proc.returncode == 0, proc.stderr
    return [line.split("  ") for line in proc.stdout.splitlines()]


def test_ls_shows_fingerprint_url_shards_bytes_and_last_use(caches, tmp_path: Path) -> None:
    cache, (a, b) = caches
    rows = {row[0]: row for row in _ls(tmp_path, "--cache-dir", str(cache))}
    assert set(rows) == {a.fingerprint, b.fingerprint}
    for ds in (a, b):
        fingerprint, url, shards, size, used = rows[ds.fingerprint]
        assert url == ds.input_dir and url.startswith("local:/")
        assert shards == f"{len(ds.manifest.shards)} shards"
        assert size.endswith(" KB") and used.startswith("last used 20")
    source = json.loads((a.cache.folder / ".source.json").read_text())
    assert source["url"] == a.input_dir and source["fingerprint"] == a.fingerprint
    # the default root: $LLM_CACHE_DIR/shards
    os.environ["LLM_CACHE_DIR"] = str(tmp_path / "env")
    try:
        (tmp_path / "env" / "shards").mkdir(parents=True)
        (cache / a.fingerprint).rename(tmp_path / "env" / "shards" / a.fingerprint)
        assert [row[0] for row in _ls(tmp_path)] == [a.fingerprint]
    finally:
        del os.environ["LLM_CACHE_DIR"]


def test_clear_never_removes_a_shard_in_use_and_keeps_a_folder_a_reader_has_open(caches, tmp_path: Path) -> None:
    cache, (a, b) = caches
    pin = a.cache.open(1)  # a reader copying from shard 1 right now
    try:
        proc = run("llm-data", "cache", "clear", a.input_dir, "--cache-dir", str(cache), cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.startswith(f"kept {a.fingerprint} ({a.input_dir}): 1 file(s) in use ({a.manifest.shards[1].file})")
        left = sorted(p.name for p in a.cache.folder.iterdir() if not p.name.startswith("."))
        assert left == [a.manifest.shards[1].file], "only the pinned shard stays"
        assert b.cache.folder.is_dir() and len(list(b.cache.folder.glob("shard-*"))) == len(b.manifest.shards)
    finally:
        pin.close()
    # the reader still runs (its folder stays while its cache is open) and fetches again what it needs
    rows = StreamingDataLoader(a, batch_size=4)
    assert sum(len(batch) for batch in rows) == len(a)
    proc = run("llm-data", "cache", "clear", a.fingerprint[:10], "--cache-dir", str(cache), cwd=tmp_path)
    assert proc.stdout.startswith(f"kept {a.fingerprint} ({a.input_dir}): open by a running reader"), proc.stdout
    assert not list(a.cache.folder.glob("shard-*"))
    a.cache.registration.close(), b.cache.registration.close()  # both readers end
    proc = run("llm-data", "cache", "clear", "--all", "--cache-dir", str(cache), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert {line.rsplit(", ", 1)[0] for line in proc.stdout.splitlines()} == {
        f"removed {a.fingerprint} ({a.input_dir}): 0 shards",
        f"removed {b.fingerprint} ({b.input_dir}): {len(b.manifest.shards)} shards",
    }
    assert list(cache.iterdir()) == []
    assert "cache clear: freed" in proc.stderr


def test_a_folder_from_before_source_json_is_listed_and_cleared(caches, tmp_path: Path) -> None:
    cache, (a, _) = caches
    a.cache.registration.close()
    (a.cache.folder / ".source.json").unlink()
    rows = {row[0]: row for row in _ls(tmp_path, "--cache-dir", str(cache))}
    assert rows[a.fingerprint][1] == "(url unknown)"
    proc = run("llm-data", "cache", "clear", a.fingerprint, "--cache-dir", str(cache), cwd=tmp_path)
    assert proc.returncode == 0 and proc.stdout.startswith(f"removed {a.fingerprint} (url unknown): ")
    assert not a.cache.folder.exists()


def test_mistakes_are_one_sentence_with_exit_2(caches, tmp_path: Path) -> None:
    cache, (a, _) = caches
    (tmp_path / "file").write_text("x")
    cases = {
        ("clear", "--cache-dir", str(cache)): "llm-data: error: cache clear needs what to remove: FINGERPRINT or URL "
        "arguments (as `llm-data cache ls` shows them), or --all for every cache folder",
        ("clear", a.fingerprint, "--all", "--cache-dir", str(cache)): "llm-data: error: cache clear needs either "
        "FINGERPRINT or URL arguments (as `llm-data cache ls` shows them) or --all, not both",
        ("clear", "s3://nope/ds", "--cache-dir", str(cache)): f"llm-data: error: no cache folder under {cache} for "
        "s3://nope/ds; `llm-data cache ls` lists fingerprints and URLs",
        ("ls", "--cache-dir", "missing"): "llm-data: error: --cache-dir missing does not exist; pass the folder given as cache_dir",
        ("ls", "--cache-dir", "file"): "llm-data: error: --cache-dir file is a file, not a folder",
        ("clear", "--all", "--cache-dir", str(a.cache.folder)): f"llm-data: error: --cache-dir {a.cache.folder} is one "
        f"dataset's cache folder; pass the folder above it ({cache})",
    }
    for args, expected in cases.items():
        assert first_error(run_here("llm-data", "cache", *args, cwd=tmp_path)).startswith(expected), args
    assert len(list(cache.iterdir())) == 2, "nothing removed by a refused command"


def test_clear_all_removes_only_shard_caches_and_names_what_it_left_alone(caches, tmp_path: Path) -> None:
    cache, (a, b) = caches
    a.cache.registration.close(), b.cache.registration.close()
    _dataset(cache / "my-dataset", 7)  # an optimized dataset someone wrote into the cache root
    (cache / "notes").mkdir()
    (cache / "notes" / "todo.txt").write_text("keep me")
    old = cache / ("0123456789abcdef" * 2)  # a cache from before .source.json: its exact layout
    old.mkdir()
    (old / ".lock").write_text("")
    (old / "shard-00000.bin").write_bytes(b"x" * 10)
    rows = {row[0] for row in _ls(tmp_path, "--cache-dir", str(cache))}
    assert rows == {a.fingerprint, b.fingerprint, old.name}
    proc = run("llm-data", "cache", "clear", "--all", "--cache-dir", str(cache), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in cache.iterdir()) == ["my-dataset", "notes"]
    assert "left alone 2 folders that are not shard caches: my-dataset, notes" in proc.stderr
    assert (cache / "notes" / "todo.txt").read_text() == "keep me" and (cache / "my-dataset" / "index.json").is_file()
    assert first_error(run("llm-data", "cache", "clear", "notes", "--cache-dir", str(cache), cwd=tmp_path)).startswith(
        f"llm-data: error: {cache / 'notes'} is not a shard cache (no .source.json)")


def test_clear_refuses_a_dataset_folder_as_cache_dir_and_never_deletes_a_dataset(tmp_path: Path) -> None:
    """Issue 34: `cache clear --all --cache-dir <a dataset>` exited 0; the docs say 2, and nothing of it goes."""
    ds = tmp_path / "ds"
    _dataset(ds, 3)
    (ds / "notes").mkdir()  # a subfolder of the dataset, as a user or `map` may leave
    before = {p: p.read_bytes() for p in ds.rglob("*") if p.is_file()}
    for action in (["clear", "--all"], ["ls"]):
        error = first_error(run_here("llm-data", "cache", *action, "--cache-dir", str(ds), cwd=tmp_path))
        assert error == (f"llm-data: error: --cache-dir {ds} holds an optimized dataset (index.json), not shard cache "
                         "folders; pass the folder given as cache_dir (the one above each dataset fingerprint's folder)")
    starting = tmp_path / "starting"  # a first optimize under way: its lock and shards, no index.json yet
    starting.mkdir()
    (starting / ".llm-data.lock").write_text("{}")
    (starting / "shard-1-00000-00000.bin").write_bytes(b"x")
    assert "holds an optimized dataset" in first_error(
        run_here("llm-data", "cache", "clear", "--all", "--cache-dir", str(starting), cwd=tmp_path))
    # a dataset under a cache root that someone marked as a cache (a stray .source.json) is still never removed
    root = tmp_path / "root"
    marked = root / "marked"
    _dataset(marked, 4)
    (marked / ".source.json").write_text('{"url": "local:/x"}')
    proc = run_here("llm-data", "cache", "clear", "--all", "--cache-dir", str(root), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "left alone 1 folder that is not a shard cache: marked" in proc.stderr
    assert (marked / "index.json").is_file() and len(list(marked.glob("shard-*.bin"))) > 1
    assert {p: p.read_bytes() for p in ds.rglob("*") if p.is_file()} == before
