"""Writing to object storage under crashes and concurrent writers: the previous dataset stays readable.
On every store (s3, az, gs: `store_env`), configured through each cloud's usual variables."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from llm.data.shards.format.manifest import INDEX_NAME
from llm.data.storage.lock import LOCK_NAME, LockHeld
from llm.data.storage.objects import open_objects
from llm.data.storage.remote_lock import RemoteLock
from tests.storage.conftest import QUICK_ON_S3
from tests.storage.helpers import docs, stream_tokens, write

_SLOW_WRITER = """
import sys, time, numpy as np
from llm.data.shards.prepare.optimize import optimize
from llm.data.shards.format.loaders import TokensLoader
rng = np.random.default_rng(9)
docs = [rng.integers(0, 1000, size=150) for _ in range(400)]
def slow(i):
    time.sleep(0.02)
    return docs[i]
optimize(slow, list(range(400)), sys.argv[1], item_loader=TokensLoader(), chunk_bytes="2KB", num_workers=0,
         mode="overwrite", progress=False)
"""


def _shards(url: str) -> set[str]:
    return {n for n in open_objects(url).list() if n.startswith("shard-")}


@pytest.mark.parametrize("store_server", QUICK_ON_S3, indirect=True)  # kill -9 of a subprocess: az and gs in CI
def test_kill_9_mid_upload_leaves_the_previous_dataset_and_the_next_run_cleans_up(store_env, tmp_path, caplog):
    url = store_env.url()
    first = docs(120, seed=4)
    write(url, first)
    before = _shards(url)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen([sys.executable, "-c", _SLOW_WRITER, url], env=env, cwd=tmp_path, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not (_shards(url) - before) and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        assert proc.poll() is None, "the writer finished before it could be killed; make it slower"
        os.killpg(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=30)
    orphans = _shards(url) - before
    assert orphans, "the kill should come after the first upload"
    assert np.array_equal(stream_tokens(url, cache_dir=tmp_path / "c1"), np.concatenate(first))
    assert LOCK_NAME in open_objects(url).list()  # left behind by the killed writer
    second = docs(30, seed=5)
    with caplog.at_level(logging.WARNING, logger="llm.data.storage.lock"):
        write(url, second, mode="append")
    assert "taking over the stale lock" in caplog.text
    manifest = json.loads(open_objects(url).get(INDEX_NAME))
    assert _shards(url) == {s["file"] for s in manifest["shards"]}, "orphans of the killed run must be removed"
    assert np.array_equal(stream_tokens(url, cache_dir=tmp_path / "c2"), np.concatenate(first + second))


def test_a_second_writer_is_refused_while_the_lock_object_exists(store_env):
    url = store_env.url()
    write(url, docs(10))
    objects = open_objects(url)
    holder = RemoteLock(objects)
    holder.acquire()
    try:
        assert json.loads(objects.get(LOCK_NAME))["token"] == holder.token
        with pytest.raises(LockHeld, match=f"pid {os.getpid()} .*delete {url}/{LOCK_NAME}"):
            write(url, docs(10), mode="append")
        objects.put(LOCK_NAME, json.dumps({"pid": 1, "host": "another-machine", "since": 0}).encode())
        with pytest.raises(LockHeld, match="pid 1 on host another-machine"):
            write(url, docs(10), mode="overwrite")
    finally:
        objects.delete(LOCK_NAME)
    write(url, docs(10, seed=8), mode="overwrite")
    assert np.array_equal(stream_tokens(url), np.concatenate(docs(10, seed=8)))
    assert LOCK_NAME not in objects.list()
