"""Datasets in real stores on loopback (SeaweedFS for s3://, Azurite for az://, our GCS XML server for gs://):
write, stream, resume, cache, faults. Tests that take `store_env` / `store_server` run on all three."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from llm.data.shards.format.loaders import TokensLoader
from llm.data.shards.format.manifest import ManifestError
from llm.data.shards.read.dataset import StreamingDataset
from llm.data.storage.cache import CorruptObject
from llm.data.storage.objects import open_objects
from llm.data.storage.s3 import BucketNotFound, StorageError
from tests.resume import check_resume
from tests.storage.conftest import QUICK_ON_S3
from tests.storage.helpers import FolderSampler, docs, run_remote, stream_tokens, write


def test_optimize_to_s3_then_stream_gives_every_token_in_order(store_env, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    documents = docs(300)
    url = store_env.url()
    summary = write(url, documents, workers=2)
    assert summary.output_dir == url and summary.shards > 5
    assert not (tmp_path / f"{store_env.scheme}:").exists(), "a URL must never become a local folder"
    names = set(open_objects(url).list())
    assert "index.json" in names and ".llm-data.lock" not in names
    tokens = stream_tokens(url, workers=2, cache_dir=tmp_path / "cache")
    assert np.array_equal(tokens, np.concatenate(documents))
    # default cache: under the user cache dir, named by the dataset's fingerprint
    ds = StreamingDataset(url, item_loader=TokensLoader(block_size=64))
    assert ds.cache.folder == tmp_path / "user-cache" / "llm" / "shards" / ds.fingerprint


@pytest.mark.slow  # end to end (~25 s); local resume on other workers is in the quick suite
def test_resume_from_s3_is_exact_on_other_worker_counts(s3_server, tmp_path):
    url = s3_server.url()
    write(url, docs(200, seed=1), storage_options=s3_server.options())
    config = {"url": url, "options": s3_server.options(), "cache": str(tmp_path / "cache"),
              "block": 32, "batch": 4, "workers": 0, "max_cache": "24KB"}
    check_resume(run_remote, config, stops=[1, 37], resume_configs=[
        {**config, "workers": 2, "backend": "processes"},
        {**config, "workers": 3, "backend": "threads", "cache": str(tmp_path / "other-cache")},
    ], verify=False)  # the audit reopens s3:// without the test server's storage_options: counts only


@pytest.mark.parametrize("store,backend,shuffle", [("s3", "processes", False), ("s3", "threads", True),
                                                  *(pytest.param(s, "threads", True, marks=pytest.mark.slow) for s in ("az", "gs"))])
def test_cache_stays_under_its_limit_with_two_workers(store_env_of, tmp_path, store, backend, shuffle):
    documents = docs(800, seed=2)
    url = store_env_of(store).url()
    write(url, documents)
    limit = 6 * 4096
    ds = StreamingDataset(url, item_loader=TokensLoader(block_size=32), shuffle=shuffle, cache_dir=tmp_path, max_cache_size=limit)
    assert sum(s.bytes for s in ds.manifest.shards) > 4 * limit, "the dataset must not fit in the cache"
    largest = max(s.bytes for s in ds.manifest.shards)
    from llm.data.shards.read.loader import StreamingDataLoader

    loader = StreamingDataLoader(ds, batch_size=4, num_workers=2, worker_backend=backend)
    with FolderSampler(ds.cache.folder) as sampler:
        tokens = np.concatenate([b.numpy().reshape(-1, 32) for b in loader])
    assert sampler.samples > 10 and sampler.peak > 0
    assert sampler.peak <= limit + largest, f"cache held {sampler.peak} bytes, limit {limit} + one shard {largest}"
    want = np.concatenate(documents)
    if not shuffle:
        assert np.array_equal(tokens.reshape(-1)[: want.size], want)
    else:  # every block once: the sorted rows equal the unshuffled epoch's sorted rows
        plain = stream_tokens(url, block=32, cache_dir=tmp_path / "plain")
        padded = np.full(len(ds) * 32, ds.pad_id, dtype=np.int64)
        padded[: plain.size] = plain
        assert sorted(map(bytes, tokens.astype("<i8"))) == sorted(map(bytes, padded.reshape(-1, 32).astype("<i8")))


@pytest.mark.parametrize("damage", ["corrupted", "truncated"])
def test_object_corrupted_behind_the_manifest_is_named_and_never_cached(store_env, tmp_path, capsys, damage):
    url = store_env.url()
    write(url, docs(100, seed=3))
    objects = open_objects(url)
    manifest = json.loads(objects.get("index.json"))
    victim = manifest["shards"][2]["file"]
    data = bytearray(objects.get(victim))
    if damage == "corrupted":
        data[100] ^= 0xFF  # same size, different bytes
    else:
        del data[len(data) // 2 :]  # cut short, as by an upload that died
    objects.put(victim, bytes(data))
    with pytest.raises(CorruptObject, match=f"{url}/{victim}"):
        stream_tokens(url, cache_dir=tmp_path)
    cached = [p.name for p in tmp_path.rglob("*") if p.is_file()]
    assert victim not in cached and not any(n.endswith(".part") for n in cached)
    from llm.cli.data import main

    assert main(["verify", url]) == 2
    err = capsys.readouterr().err.strip()
    why = "checksum" if damage == "corrupted" else f"has {len(data)} bytes, the manifest says"
    assert err.count("\n") == 0 and f"{url}/{victim}" in err and why in err


def test_errors_are_one_sentence_naming_endpoint_bucket_and_key(store_server, tmp_path):
    server = store_server
    url = server.url()
    write(url, docs(20), storage_options=server.options())
    with pytest.raises(StorageError, match="access denied") as e:
        StreamingDataset(url, item_loader=TokensLoader(block_size=8), storage_options=server.wrong_credentials(),
                         cache_dir=tmp_path)
    assert server.endpoint in str(e.value) and f"{url}/index.json" in str(e.value) and server.keys_variable in str(e.value)
    assert "\n" not in str(e.value)
    with pytest.raises(BucketNotFound, match=f"{server.bucket_word} 'no-such-bucket-here' does not exist") as e:
        StreamingDataset(f"{server.scheme}://no-such-bucket-here/ds", storage_options=server.options(), cache_dir=tmp_path)
    assert server.endpoint in str(e.value)
    with pytest.raises(ManifestError, match=f"no index.json .*{url}-missing/index.json does not exist"):
        StreamingDataset(url + "-missing", storage_options=server.options(), cache_dir=tmp_path)
    closed = {**server.options(retries=1, backoff=0.01, connect_timeout=1), **server.options_via("http://127.0.0.1:9")}
    with pytest.raises(StorageError, match="http://127.0.0.1:9[^ ]* failed after 2 attempts .*check that the endpoint is up"):
        StreamingDataset(url, storage_options=closed, cache_dir=tmp_path)


@pytest.mark.parametrize("store_server", QUICK_ON_S3, indirect=True)  # az and gs writes: test_optimize_to_s3_then_stream_...
def test_cli_writes_to_s3_and_reads_it_back(store_env, tmp_path, capsys, monkeypatch):
    from llm.cli.data import main
    from tests.data.shards.helpers import real_lines, write_jsonl

    monkeypatch.chdir(tmp_path)
    src = write_jsonl(tmp_path / "in.jsonl", real_lines(400))
    url = store_env.url()
    assert main(["optimize", str(src), "--output", url, "--no-progress", "--num-workers", "0", "--chunk-bytes", "8KB"]) == 0
    assert not (tmp_path / f"{store_env.scheme}:").exists()
    capsys.readouterr()
    assert main(["info", url]) == 0
    assert url in capsys.readouterr().out  # the readable summary names the dataset
    assert main(["info", url, "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["totals"]["shards"] > 1 and info["totals"]["tokens"] > 0
    assert main(["verify", url]) == 0
    assert f"{info['totals']['shards']} shards OK in {url}" in capsys.readouterr().out
    assert main(["inspect", url, "--shards", "2", "--json"]) == 0  # lengths from the first 2 shards, downloaded
    lengths = json.loads(capsys.readouterr().out)["lengths"]
    assert lengths["shards_measured"] == 2 and lengths["max"] > 0
    assert stream_tokens(url).size == info["totals"]["tokens"]  # through the user cache dir
    assert main(["cache", "ls"]) == 0  # that cache, named by the dataset's URL
    assert url in capsys.readouterr().out
    assert main(["cache", "clear", url]) == 0
    capsys.readouterr()
    assert main(["cache", "ls"]) == 0 and url not in capsys.readouterr().out
    assert main(["optimize", str(src), "--output", url, "--no-progress", "--num-workers", "0"]) == 2
    assert "is not empty; pass mode=" in capsys.readouterr().err
    assert main(["optimize", str(src), "--output", url, "--no-progress", "--num-workers", "0", "--mode", "append"]) == 0
    capsys.readouterr()
    main(["info", url, "--json"])
    assert json.loads(capsys.readouterr().out)["totals"]["tokens"] == 2 * info["totals"]["tokens"]
    for name, value in store_env.wrong_env().items():
        monkeypatch.setenv(name, value)
    assert main(["info", url]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("llm-data: error: access denied") and "\n" not in err and store_env.endpoint in err
    assert main(["info", "hdfs://bucket/ds"]) == 2
    assert "unknown storage scheme 'hdfs://'" in capsys.readouterr().err
    assert set(os.listdir(tmp_path)) - {"user-cache"} == {"in.jsonl"}  # no folder named after the URL
