"""Azurite, Microsoft's Azure Blob Storage emulator, on loopback for the storage tests: installed by
`make setup` into .venv/azurite (npm), started with telemetry off, killed and restarted in place.

`azurite_command` is the one command line (docs/storage.md). `--disableTelemetry` is always on it:
Azurite reports usage to Microsoft unless told not to, and that switch is the only one.
"""

from __future__ import annotations

import atexit
import base64
import email.utils
import hashlib
import hmac
import shutil
import sys
import urllib.error
import urllib.request
from pathlib import Path

from bench.seaweed import free_port, keep_on_loopback
from bench.serverproc import ServerProcess, answers

# Azurite's well-known development account (public, in every Azure SDK's docs): the only one it serves by default.
ACCOUNT = "devstoreaccount1"
ACCOUNT_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
AZURITE_VERSION = "3.35.0"  # the version `make setup` installs
# Why an az:// test skipped, and the one command that brings it in (make test runs it too when npm is there).
NOT_INSTALLED = "Azurite is not installed: `make azurite` (Node.js and npm needed) installs it into .venv/azurite"


def azurite_binary() -> str | None:
    """azurite-blob from .venv/azurite (make setup), else from PATH."""
    installed = Path(sys.prefix) / "azurite" / "node_modules" / ".bin" / "azurite-blob"
    return str(installed) if installed.exists() else shutil.which("azurite-blob")


def azurite_command(binary: str, port: int, folder: Path | None) -> list[str]:
    """Blob service only, on 127.0.0.1:`port`, telemetry off; in memory, or persisted in `folder` (for restarts)."""
    where = ["--location", str(folder)] if folder is not None else ["--inMemoryPersistence"]
    return [binary, *where, "--blobHost", "127.0.0.1", "--blobPort", str(port), "--disableTelemetry", "--skipApiVersionCheck"]


class Azurite(ServerProcess):
    """azurite-blob on 127.0.0.1:`port`; start(), kill() (SIGKILL), start() again (same data when `persist`)."""

    log_name = "azurite.log"

    def __init__(self, root: Path, persist: bool = False):
        keep_on_loopback()
        binary = azurite_binary()
        if binary is None:
            raise RuntimeError("Azurite is not installed: `make setup` puts it in .venv/azurite "
                               f"(npm install --prefix .venv/azurite azurite@{AZURITE_VERSION})")
        super().__init__(root)
        self.binary = binary
        self.root.mkdir(parents=True, exist_ok=True)
        self.folder = self.root / "data" if persist else None
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.name = f"Azurite at {self.endpoint}"

    @property
    def blob_endpoint(self) -> str:
        """The account's blob URL, as a connection string's BlobEndpoint names it."""
        return f"{self.endpoint}/{ACCOUNT}"

    def connection_string(self) -> str:
        return (f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT};AccountKey={ACCOUNT_KEY};"
                f"BlobEndpoint={self.blob_endpoint};")

    def start(self, timeout_s: float = 60.0) -> None:
        cmd = azurite_command(self.binary, self.port, self.folder)
        assert "--disableTelemetry" in cmd, cmd  # never without it
        atexit.register(self.kill)  # also when the test run ends without its fixtures' teardown
        self.launch(cmd, lambda: answers(self.endpoint), timeout_s)

    def create_container(self, name: str) -> None:
        """One signed REST call (Shared Key), as any Azure SDK makes it; an existing container is fine."""
        request = _signed(self.blob_endpoint, "PUT", f"/{name}", {"restype": "container"})
        try:
            urllib.request.urlopen(request, timeout=10).close()
        except urllib.error.HTTPError as e:
            if e.code != 409:  # ContainerAlreadyExists
                raise


def _signed(blob_endpoint: str, method: str, path: str, query: dict[str, str]) -> urllib.request.Request:
    """A Shared Key request (https://learn.microsoft.com/rest/api/storageservices/authorize-with-shared-key)."""
    headers = {"x-ms-date": email.utils.formatdate(usegmt=True), "x-ms-version": "2021-08-06"}
    resource_path = blob_endpoint.split("://", 1)[1].split("/", 1)[1]  # devstoreaccount1 (path-style URL)
    canonical = f"/{ACCOUNT}/{resource_path}{path}" + "".join(f"\n{k}:{v}" for k, v in sorted(query.items()))
    content_type = "application/octet-stream"  # urllib would send its own form type with a body otherwise
    to_sign = "\n".join([method, "", "", "", "", content_type, "", "", "", "", "", "",
                         *(f"{k}:{v}" for k, v in sorted(headers.items())), canonical])
    signature = base64.b64encode(hmac.new(base64.b64decode(ACCOUNT_KEY), to_sign.encode(), hashlib.sha256).digest())
    headers |= {"Authorization": f"SharedKey {ACCOUNT}:{signature.decode()}", "Content-Type": content_type}
    url = f"{blob_endpoint}{path}?" + "&".join(f"{k}={v}" for k, v in query.items())
    return urllib.request.Request(url, method=method, headers=headers, data=b"" if method == "PUT" else None)
