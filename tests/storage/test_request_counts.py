"""Reads of raw text that don't storm the store, on all three stores: every request counted on the wire
(the fault proxy, passing everything). Shards: test_s3_requests.py (s3) and test_windowed_s3.py (az, gs)."""

from __future__ import annotations

from collections import Counter

import pytest

from tests.storage.faultproxy import FaultProxy
from tests.storage.test_s3_text import _docs, _jsonl, make_module, run_stream, upload, via

BLOCK = 32


def _upstream(server) -> tuple[str, int]:
    host, port = server.endpoint.removeprefix("http://").split(":")
    return host, int(port)


def _kinds(seen: Counter, prefix: str) -> Counter:
    """Requests by kind: GETs of shards, of other objects (index.json), listings and the rest."""
    out: Counter = Counter()
    for (method, path), n in seen.items():
        name = path.rsplit("/", 1)[-1]
        if method == "GET" and f"/{prefix}/" in path and name.startswith("shard-"):
            out["shard GET"] += n
        elif method == "GET" and f"/{prefix}/" in path:
            out["other GET"] += n
        elif method == "GET":
            out["list"] += n  # GET on the bucket or container itself
        else:
            out[method] += n
    return out


@pytest.mark.parametrize("store", ["s3", "az", "gs"])
def test_text_is_read_in_a_few_large_ranged_gets(request, tmp_path, store):
    server = request.getfixturevalue(f"{store}_server")
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "big.jsonl").write_bytes(_jsonl(_docs(4000, 9)))
    url = server.url()
    upload(tmp_path / "in", url, server.options())
    proxy = FaultProxy(_upstream(server), lambda *_: "ok")
    try:
        config = {"path": f"{url}/big.jsonl", "options": via(server, proxy.endpoint), "L": 256, "batch": 8}
        steps, _ = run_stream(config, None, None)
        counts = Counter(method for method, _ in proxy.seen.elements())
    finally:
        proxy.close()
    partitions = len(make_module({**config, "options": server.options()}).partitions())
    # one GET per partition (each up to 8 MiB), the 4 KiB "JSON array?" probe, and the HEAD of the exact key
    assert counts["GET"] <= partitions + 2, (counts, partitions)
    assert counts["HEAD"] <= 2 and sum(counts.values()) <= partitions + 4, counts
    assert sum(counts.values()) * 20 < 4000, counts  # dozens of records per request, never one each
    print(f"{store}: 4000 records, {partitions} partitions, {len(steps)} batches; requests {dict(counts)}")
