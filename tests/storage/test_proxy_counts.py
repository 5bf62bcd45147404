"""The counting proxy (bench/faultproxy.py) names each request's kind the same way on all three stores:
the s3 bench's requests-per-epoch table and the request-count tests rely on it."""

from __future__ import annotations

from llm.data.storage.objects import open_objects
from tests.storage.faultproxy import FaultProxy, request_kind


def test_a_listing_is_a_get_of_the_bucket_or_a_list_query():
    assert request_kind("GET", "/bucket?list-type=2&prefix=ds/") == "LIST"
    assert request_kind("GET", "/devstoreaccount1/container?restype=container&comp=list") == "LIST"
    assert request_kind("GET", "/bucket?prefix=ds%2F") == "LIST"
    assert request_kind("GET", "/bucket/ds/shard-0.bin") == "GET"
    assert request_kind("POST", "/bucket/ds/big.bin?uploads") == "PUT"
    assert request_kind("HEAD", "/bucket/ds/index.json") == "HEAD"


def test_each_kind_and_the_bytes_received_are_counted_on_every_store(store_server):
    host, port = store_server.endpoint.removeprefix("http://").split(":")
    proxy = FaultProxy((host, int(port)), lambda *_: "ok")
    data = bytes(range(256)) * 1000
    try:
        objects = open_objects(store_server.url(), {**store_server.options(), **store_server.options_via(proxy.endpoint)})
        objects.put("a.bin", data)
        assert objects.list() == {"a.bin": len(data)}
        assert objects.get("a.bin") == data
    finally:
        proxy.close()
    assert proxy.requests["PUT"] >= 1 and proxy.requests["LIST"] >= 1, proxy.requests
    assert proxy.requests["GET"] == 1, proxy.seen  # the object itself, once; the listing is not a GET
    assert proxy.bytes_in["GET"] == len(data), proxy.bytes_in
