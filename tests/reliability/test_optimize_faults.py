"""optimize under faults: ids that do not fit, a full disk, kill -9 in overwrite mode, user mistakes."""

from __future__ import annotations

import errno
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import llm.data.storage.local as local
from llm.data import TokensLoader, optimize
from llm.data.shards.format.manifest import INDEX_NAME, Manifest
from llm.data.shards.format.reader import verify_dataset
from llm.data.shards.prepare.optimize import DocumentBatch
from llm.data.shards.prepare.optimize_text import optimize_text
from tests.cli.helpers import run_here
from tests.data.shards.helpers import all_tokens, real_lines, write_jsonl

LLM_DATA = [sys.executable, "-m", "llm.cli.data"]


def _tokens(fn, inputs, out: Path, **kw):
    return optimize(fn, inputs, out, num_workers=0, item_loader=TokensLoader(), progress=False, **kw)


@pytest.mark.parametrize(
    "doc, bad",
    [
        ([1, 2**32], "4294967296"),
        ([1, -3], "-3"),
        (np.array([5, 2**40], dtype=np.uint64), str(2**40)),
        (np.array([5, 2**63 + 7], dtype=np.uint64), str(2**63 + 7)),
        ([3, 2**70], str(2**70)),
        (DocumentBatch(np.array([1, 2, 2**33]), np.array([1, 2])), str(2**33)),
    ],
    ids=["list-2^32", "negative", "uint64-2^40", "uint64-2^63", "python-2^70", "batch"],
)
@pytest.mark.parametrize("workers", [0, 1])
def test_ids_that_do_not_fit_are_refused_with_the_input_index(tmp_path, doc, bad, workers) -> None:
    out = tmp_path / "ds"

    def fn(i):
        return doc if i == 3 else [i, 7]

    with pytest.raises(ValueError, match=r"input 3 \(3\)") as info:
        optimize(fn, list(range(6)), out, num_workers=workers, item_loader=TokensLoader(), progress=False)
    assert bad in str(info.value) and "\n" not in str(info.value)
    assert not out.exists()


def test_ids_up_to_2_32_minus_1_round_trip(tmp_path) -> None:
    _tokens(lambda i: np.array([0, 2**32 - 1, i], dtype=np.uint64), [1, 2], tmp_path / "ds")
    assert all_tokens(tmp_path / "ds").tolist() == [0, 2**32 - 1, 1, 0, 2**32 - 1, 2]


def _enospc_after(monkeypatch, budget: int, only: str | None = None) -> None:
    """os.write (and os.writev) as seen by the shard and manifest writers fails with ENOSPC once `budget` bytes are
    written."""
    real_write, left = os.write, [budget]

    def write(fd: int, data) -> int:
        name = os.readlink(f"/proc/self/fd/{fd}") if os.path.exists(f"/proc/self/fd/{fd}") else ""
        if only is None or only in name:
            if left[0] <= 0:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            data = memoryview(data)[: left[0]]
            left[0] -= len(data)
        return real_write(fd, data)

    def writev(fd: int, views) -> int:  # as a kernel does on a full disk: what fits, then ENOSPC
        return write(fd, b"".join(bytes(v) for v in views))

    monkeypatch.setattr(local.os, "write", write)
    monkeypatch.setattr(local.os, "writev", writev)


@pytest.mark.parametrize("mode", ["append", "overwrite"])
@pytest.mark.parametrize("where, budget", [("shard", 0), ("shard", 1000), ("shard", 20_000), ("manifest", 0), ("manifest", 1000)])
def test_disk_full_names_the_output_and_keeps_the_previous_dataset(tmp_path, monkeypatch, mode, where, budget) -> None:
    out = tmp_path / "ds"
    _tokens(lambda i: np.arange(i, i + 300) % 250, list(range(20)), out, chunk_size=1000)
    before, index = all_tokens(out), (out / INDEX_NAME).read_bytes()
    files = sorted(p.name for p in out.iterdir())
    _enospc_after(monkeypatch, budget, only="shard-" if where == "shard" else INDEX_NAME)
    with pytest.raises(OSError, match="no space left") as info:
        _tokens(lambda i: np.arange(i, i + 500) % 250, list(range(60)), out, chunk_size=1000, mode=mode)
    message = str(info.value)
    assert str(out) in message and "unchanged" in message and "\n" not in message
    monkeypatch.undo()
    assert (out / INDEX_NAME).read_bytes() == index
    assert sorted(p.name for p in out.iterdir()) == files, "no partial shard, temp file or lock is left"
    verify_dataset(out)
    assert np.array_equal(all_tokens(out), before), "data lost"


@pytest.fixture
def small_fs(tmp_path):
    """A real 2 MiB tmpfs, so ENOSPC comes from the kernel; skipped where the test may not mount (not root)."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)], capture_output=True).returncode:
        pytest.skip("mounting a tmpfs needs root")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=True)


def test_disk_full_on_a_real_small_filesystem(small_fs) -> None:
    out = small_fs / "ds"
    _tokens(lambda i: np.arange(i, i + 300) % 250, list(range(20)), out, chunk_size=1000)
    before, index = all_tokens(out), (out / INDEX_NAME).read_bytes()
    files = sorted(p.name for p in out.iterdir())
    with pytest.raises(OSError, match="no space left") as info:
        _tokens(lambda i: np.arange(i, i + 5000) % 250, list(range(1000)), out, chunk_size=100_000, mode="append")
    assert str(out) in str(info.value) and "\n" not in str(info.value)
    assert (out / INDEX_NAME).read_bytes() == index
    assert sorted(p.name for p in out.iterdir()) == files, "no partial shard, temp file or lock is left"
    assert np.array_equal(all_tokens(out), before), "data lost"


def test_disk_full_through_the_cli_is_exit_2(tmp_path) -> None:
    # The CLI turns the OSError into one line and exit 2; the fault is injected in a child via sitecustomize.
    src = write_jsonl(tmp_path / "a.jsonl", real_lines(300))
    out = tmp_path / "ds"
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(
        "import errno, os\nimport llm.data.storage.local as l\n"
        "def w(fd, d):\n    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))\nl.os = type('o', (), {**vars(os), 'write': staticmethod(w), 'writev': staticmethod(w)})\n"
    )
    env = {**os.environ, "PYTHONPATH": f"{hook}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    res = subprocess.run([*LLM_DATA, "optimize", str(src), "-o", str(out), "--num-workers", "0", "--no-progress"],
                         capture_output=True, text=True, env=env, timeout=120)
    assert res.returncode == 2, res.stderr
    assert "no space left" in res.stderr and str(out) in res.stderr and "Traceback" not in res.stderr
    assert not out.exists()


@pytest.mark.timeout(120)
def test_kill_during_overwrite_leaves_previous_dataset(tmp_path, caplog) -> None:
    texts = real_lines(600)
    out = tmp_path / "ds"
    optimize_text([str(write_jsonl(tmp_path / "first.jsonl", texts[:300]))], out, "simple", progress=False)
    index, before = (out / INDEX_NAME).read_bytes(), all_tokens(out)
    big = write_jsonl(tmp_path / "big.jsonl", texts * 300)
    proc = subprocess.Popen(
        [*LLM_DATA, "optimize", str(big), "--output", str(out), "--mode", "overwrite", "--chunk-bytes", "64KB",
         "--num-workers", "2"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )
    deadline = time.time() + 60
    while time.time() < deadline and len(list(out.glob("shard-*.bin"))) < len(Manifest.load(out).shards) + 3:
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert len(list(out.glob("shard-*.bin"))) > len(Manifest.load(out).shards), "the kill must land mid-run"
    assert (out / INDEX_NAME).read_bytes() == index
    verify_dataset(out)
    assert np.array_equal(all_tokens(out), before)
    with caplog.at_level(logging.WARNING, logger="llm.data.storage.lock"):
        optimize_text([str(write_jsonl(tmp_path / "second.jsonl", texts[300:400]))], out, "simple",
                      mode="overwrite", progress=False)
    assert "taking over the stale lock" in caplog.text
    manifest = verify_dataset(out)
    assert sorted(p.name for p in out.glob("shard-*.bin")) == sorted(s.file for s in manifest.shards)


def _cli(*args: str) -> subprocess.CompletedProcess:
    """`llm-data ARGS`, its main() called in process: these are argument and input checks (a subprocess each cost ~0.3 s)."""
    return run_here("llm-data", *args)


def _one_sentence(res: subprocess.CompletedProcess, *fragments: str) -> None:
    assert res.returncode == 2, res.stderr
    assert "Traceback" not in res.stderr and res.stderr.count("\n") == 1, res.stderr
    for f in fragments:
        assert f in res.stderr, res.stderr


@pytest.mark.parametrize("size", ["0", "0MB", "-5MB", "1e400", "99999999TB", "nanMB", "lots"])
def test_bad_chunk_bytes_is_one_sentence(tmp_path, size) -> None:
    src = write_jsonl(tmp_path / "a.jsonl", ["hello"])
    _one_sentence(_cli("optimize", str(src), "-o", str(tmp_path / "ds"), f"--chunk-bytes={size}"), repr(size))
    assert not (tmp_path / "ds").exists()


def test_negative_workers_is_one_sentence(tmp_path) -> None:
    src = write_jsonl(tmp_path / "a.jsonl", ["hello"])
    _one_sentence(_cli("optimize", str(src), "-o", str(tmp_path / "ds"), "--num-workers", "-1"), "num_workers", "-1")
    with pytest.raises(ValueError, match="num_workers"):
        optimize(lambda i: [i], [1], tmp_path / "x", num_workers=-1, item_loader=TokensLoader(), progress=False)


def test_rerun_with_a_glob_matching_the_output_is_refused(tmp_path) -> None:
    src = write_jsonl(tmp_path / "a.jsonl", real_lines(50))
    out = tmp_path / "ds"
    assert _cli("optimize", str(src), "-o", str(out), "--no-progress").returncode == 0
    index = (out / INDEX_NAME).read_bytes()
    for pattern in (str(tmp_path / "**" / "*.json*"), str(out / INDEX_NAME), str(out), str(tmp_path)):
        _one_sentence(_cli("optimize", pattern, "-o", str(out), "--mode", "append", "--no-progress"), "output folder")
    assert (out / INDEX_NAME).read_bytes() == index
    verify_dataset(out)


def _fails_at_3(i: int) -> list[int]:
    if i == 3:
        raise ValueError("boom")
    return [i, 7]


def _generator_fails_at_3(i: int):
    yield [i, 7]
    if i == 3:
        raise KeyError("gone")
    yield [i]


@pytest.mark.parametrize("fn, error", [(_fails_at_3, "ValueError: boom"), (_generator_fails_at_3, "KeyError: 'gone'")],
                         ids=["call", "generator"])
@pytest.mark.parametrize("workers", [0, 2])
def test_fn_raising_names_the_input(tmp_path, fn, error, workers) -> None:
    from llm.data.shards.prepare.optimize import OptimizeError

    with pytest.raises(OptimizeError, match=rf"^optimize: input 3 \(3\) failed: {error}$") as info:
        optimize(fn, list(range(6)), tmp_path / "ds", num_workers=workers, item_loader=TokensLoader(), progress=False)
    assert workers or isinstance(info.value.__cause__, (ValueError, KeyError))  # 0 workers: the original is the cause
    assert not (tmp_path / "ds" / INDEX_NAME).exists()


def _exits_at_5(i: int) -> list[int]:
    if i == 5:
        os._exit(3)  # the worker process ends mid-task, as an out-of-memory kill would
    return [i, 7]


def test_a_worker_that_dies_is_named(tmp_path) -> None:
    with pytest.raises(RuntimeError, match=r"^optimize: worker process \d+ exited with code 3 \(fn ended the process") as info:
        optimize(_exits_at_5, list(range(12)), tmp_path / "ds", num_workers=2, item_loader=TokensLoader(), progress=False)
    assert "\n" not in str(info.value) and not (tmp_path / "ds").exists()


def _reads_a_corrupt_shard(i: int) -> list[int]:
    from llm.data.shards.format.pread import ShardError

    raise ShardError(f"shard /data/s{i}.bin fails its checksum: the file is corrupt")


def test_our_errors_that_name_a_file_pass_through_fn_unchanged(tmp_path) -> None:
    # e.g. `llm-data convert` reading a corrupt foreign shard: the CLI reports these as one sentence
    from llm.data.shards.format.pread import ShardError

    with pytest.raises(ShardError, match=r"^shard /data/s0.bin fails its checksum: the file is corrupt$"):
        optimize(_reads_a_corrupt_shard, [0, 1], tmp_path / "ds", num_workers=0, item_loader=TokensLoader(), progress=False)
