"""One writer at a time: two real `optimize` processes on one output never lose each other's shards."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from llm.data import TokensLoader, optimize
from llm.data.shards.format.manifest import Manifest
from llm.data.shards.format.reader import verify_dataset
from llm.data.storage.lock import LOCK_NAME

REPO = Path(__file__).resolve().parents[2]

# A writer that is slow on purpose (a sleep per input) so that the two runs overlap for sure.
WRITER = """
import sys, time
from llm.data import TokensLoader, optimize
out, tag, mode, wait, delay = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4] == "wait", float(sys.argv[5])
def fn(i):
    time.sleep(delay)
    return [tag, i % 251, 7]
optimize(fn, list(range(40)), out, num_workers=0, item_loader=TokensLoader(), chunk_size=30, mode=mode,
         progress=False, wait=wait)
"""


def _start(out: Path, tag: int, mode: str = "append", wait: bool = False, delay: float = 0.05) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.Popen(
        [sys.executable, "-c", WRITER, str(out), str(tag), mode, "wait" if wait else "nowait", str(delay)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )


def _wait_for_lock(out: Path, proc: subprocess.Popen) -> dict:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            holder = json.loads((out / LOCK_NAME).read_text())
            if holder.get("pid") == proc.pid:
                return holder
        except (FileNotFoundError, ValueError):
            pass
        time.sleep(0.01)
    raise AssertionError(f"writer never took the lock: {proc.communicate()}")


def _tags(out: Path) -> list[int]:
    from tests.data.shards.helpers import all_tokens

    tokens = all_tokens(out).reshape(-1, 3)
    return sorted(set(tokens[:, 0].tolist()))


def _seed(out: Path) -> None:
    optimize(lambda i: [0, i, 7], list(range(10)), out, num_workers=0, item_loader=TokensLoader(), progress=False)


@pytest.mark.timeout(120)
# overwrite: the same lock refusal; its commit is test_optimize.py::test_modes_empty_append_overwrite (CI runs both)
@pytest.mark.parametrize("mode", ["append", pytest.param("overwrite", marks=pytest.mark.slow)])
def test_a_second_writer_fails_at_once_naming_the_holder(tmp_path, mode) -> None:
    out = tmp_path / "ds"
    _seed(out)
    first = _start(out, 1, mode, delay=0.1)
    holder = _wait_for_lock(out, first)
    second = _start(out, 2, mode)
    _, err = second.communicate(timeout=60)
    assert first.poll() is None, "the second writer must fail while the first is still running"
    assert second.returncode != 0
    last = err.strip().splitlines()[-1]
    assert f"pid {holder['pid']}" in last and str(out) in last and "wait=True" in last, last
    assert first.wait(timeout=60) == 0, first.stderr.read()
    verify_dataset(out)
    assert _tags(out) == ([0, 1] if mode == "append" else [1])
    assert not (out / LOCK_NAME).exists()


@pytest.mark.timeout(120)
# Trials 1 and 2 repeat the race at other delays: CI runs them.
@pytest.mark.parametrize("trial", [0, *(pytest.param(t, marks=pytest.mark.slow) for t in (1, 2))])
def test_two_appending_writers_with_wait_keep_both_datasets(tmp_path, trial) -> None:
    out = tmp_path / "ds"
    _seed(out)
    procs = [_start(out, tag, "append", wait=True, delay=0.01 * (trial + 1)) for tag in (1, 2)]
    for p in procs:
        _, err = p.communicate(timeout=100)
        assert p.returncode == 0, err
    manifest = verify_dataset(out)  # every listed shard exists and matches its checksum
    assert _tags(out) == [0, 1, 2], "a commit deleted the other run's shards"
    assert manifest.total_documents == 10 + 40 + 40
    assert sorted(p.name for p in out.glob("shard-*.bin")) == sorted(s.file for s in manifest.shards)


def _stale_lock(out: Path) -> int:
    """A lock file left in `out` by a process that is gone (as after kill -9); its pid."""
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (out / LOCK_NAME).write_text(json.dumps({"pid": dead.pid, "host": os.uname().nodename, "since": 0}))
    return dead.pid


def test_a_stale_lock_of_a_dead_process_is_taken_over_with_a_warning(tmp_path, caplog) -> None:
    out = tmp_path / "ds"
    _seed(out)
    pid = _stale_lock(out)
    with caplog.at_level(logging.WARNING, logger="llm.data.storage.lock"):
        optimize(lambda i: [1, i, 7], list(range(5)), out, num_workers=0, item_loader=TokensLoader(),
                 mode="append", progress=False)
    assert f"taking over the stale lock of {out} left by pid {pid} on host" in caplog.text
    assert _tags(out) == [0, 1]
    assert not (out / LOCK_NAME).exists()


def test_the_stale_lock_warning_is_the_sentence_alone(tmp_path) -> None:
    out = tmp_path / "ds"
    _seed(out)
    pid = _stale_lock(out)
    proc = _start(out, 1, delay=0)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(0))
    # one line, as the user reads it: no "file:line: RuntimeWarning:" in front, no source line after
    assert err == (f"taking over the stale lock of {out} left by pid {pid} on host {os.uname().nodename} since {since} "
                   f"(lock file {out / LOCK_NAME}), which is no longer running\n")


def test_the_lock_does_not_make_a_fresh_folder_look_used(tmp_path) -> None:
    out = tmp_path / "ds"
    _seed(out)
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith("shard-")) == ["index.json"]
    assert Manifest.load(out).total_documents == 10
