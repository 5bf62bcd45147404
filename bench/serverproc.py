"""A local server process for the bench and the storage tests (SeaweedFS, Azurite): started in its own
process group with its output in a log file, waited for until it answers, killed (SIGKILL, as a crash)
or stopped, and started again in place. Subclasses give the command line and what "ready" means.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path


def answers(endpoint: str) -> bool:
    """Whether an HTTP server answers at `endpoint` (any HTTP status counts: e.g. 403 to an anonymous request)."""
    try:
        urllib.request.urlopen(endpoint, timeout=1).close()
        return True
    except urllib.error.HTTPError:
        return True
    except OSError:
        return False


class ServerProcess:
    """One server process, its output appended to `root/log_name`; `name` is what errors call it."""

    name = "the server"
    log_name = "server.log"

    def __init__(self, root: Path):
        self.root = Path(root).resolve()
        self.proc: subprocess.Popen | None = None

    def launch(self, cmd: list[str], ready: Callable[[], bool], timeout_s: float, env: dict | None = None,
               poll_s: float = 0.1) -> None:
        """Start `cmd` in a new session (so kill() reaches its children too); return once `ready()`."""
        with open(self.root / self.log_name, "ab") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=self.root, env=env,
                                         start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}: {self.log_tail()}")
            if ready():
                return
            time.sleep(poll_s)
        raise RuntimeError(f"{self.name} did not answer within {timeout_s:.0f} s: {self.log_tail()}")

    @property
    def up(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL the whole server (its process group), as a crash would."""
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)
        self.proc = None

    def stop(self) -> None:
        """SIGTERM, then SIGKILL if it is still there 20 s later."""
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=20)
            self.proc = None
        except subprocess.TimeoutExpired:
            self.kill()

    def log_tail(self, chars: int = 2000) -> str:
        try:
            return (self.root / self.log_name).read_text(errors="replace")[-chars:]
        except OSError:
            return ""
