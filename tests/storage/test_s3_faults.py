"""Faults on the wire (503 SlowDown, resets mid-body, stalls): retried with backoff, or one clear error;
never a hang, never a short epoch, never a cached file that differs from the object. On every store
(s3, az, gs: the `store_server` fixture), through the same fault proxy."""

from __future__ import annotations

import re

import numpy as np
import pytest

from llm.data.storage.s3 import StorageError
from tests.storage.conftest import QUICK_ON_S3
from tests.storage.faultproxy import FaultProxy
from tests.storage.helpers import docs, stream_tokens, write


def _upstream(server) -> tuple[str, int]:
    host, port = server.endpoint.removeprefix("http://").split(":")
    return host, int(port)


@pytest.fixture
def dataset(store_server):
    url = store_server.url()
    documents = docs(60, seed=11)
    write(url, documents, storage_options=store_server.options())
    return url, np.concatenate(documents)


@pytest.mark.parametrize("store_server", QUICK_ON_S3, indirect=True)  # the retry loop is one for every store
def test_faults_are_retried_and_the_epoch_is_whole(store_server, dataset, tmp_path):
    url, want = dataset
    stalled = []

    def plan(method: str, path: str, attempt: int) -> str:
        if method != "GET" or "/shard-" not in path:
            return "ok"
        if attempt == 1:
            return "503"
        if attempt == 2:
            return "reset"
        if attempt == 3 and not stalled:  # one timeout is enough to prove it
            stalled.append(path)
            return "stall"
        return "ok"

    proxy = FaultProxy(_upstream(store_server), plan)
    try:
        options = {**store_server.options(retries=4, backoff=0.01, timeout=2), **store_server.options_via(proxy.endpoint)}
        got = stream_tokens(url, cache_dir=tmp_path, storage_options=options, workers=2)
    finally:
        proxy.close()
    assert np.array_equal(got, want)
    assert proxy.faults["503"] >= 3 and proxy.faults["reset"] >= 3 and proxy.faults["stall"] == 1
    cached = [p for p in tmp_path.rglob("shard-*") if p.is_file()]
    assert cached and all(not p.name.endswith(".part") for p in cached)


def test_after_the_retry_budget_one_error_names_bucket_and_key(store_server, dataset, tmp_path):
    url, _ = dataset

    def plan(method: str, path: str, attempt: int) -> str:
        return "503" if method == "GET" and "-00001-00000.bin" in path else "ok"

    proxy = FaultProxy(_upstream(store_server), plan)
    try:
        options = {**store_server.options(retries=2, backoff=0.01, timeout=5), **store_server.options_via(proxy.endpoint)}
        where = re.escape(options["endpoint"])  # Azure's names the account: http://127.0.0.1:PORT/devstoreaccount1
        with pytest.raises(StorageError, match=rf"reading {store_server.scheme}://llm-test/.*-00001-00000\.bin at {where} "
                                               r"failed after 3 attempts \(HTTP 503 SlowDown\)"):
            stream_tokens(url, cache_dir=tmp_path, storage_options=options)
    finally:
        proxy.close()
    assert not [p for p in tmp_path.rglob("*-00001-00000.bin*") if not p.name.startswith(".dl-")]
