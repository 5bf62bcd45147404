"""The one-writer lock of a dataset in object storage: a lock object created only if absent."""

from __future__ import annotations

import json
import os
import socket
import sys
import time
import uuid
from typing import Any

from llm.data.storage.local import pid_alive
from llm.data.storage.lock import LOCK_NAME, LockHeld, _describe, log
from llm.data.storage.s3 import ObjectNotFound


class RemoteLock:
    """`.llm-data.lock` under the dataset prefix, written with a conditional create (If-None-Match),
    so of two writers exactly one gets it. A lock left by a dead process of this host is taken
    over with a warning; one from another host names its holder and how to remove it."""

    def __init__(self, objects: Any, wait: bool = False, what: str = "an optimize"):
        self.objects, self.wait, self.what = objects, wait, what
        self.token = uuid.uuid4().hex
        self.held = False

    def acquire(self) -> None:
        told = False
        while True:
            me = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.time(), "token": self.token}
            try:
                self.objects.put(LOCK_NAME, json.dumps(me).encode(), create=True)
                self.held = True
                return
            except FileExistsError:
                pass
            holder = self._holder()
            if holder is None:
                continue  # released meanwhile: try again
            if holder.get("host") == socket.gethostname() and not pid_alive(int(holder.get("pid", 0) or 0)):
                log.warning("taking over the stale lock of %s left by %s, which is no longer running",  # logged: lock.py says why
                            self.objects.url(), _describe(holder, self.objects.url(LOCK_NAME)))
                self.objects.delete(LOCK_NAME)
                continue
            described = _describe(holder, self.objects.url(LOCK_NAME))
            if not self.wait:
                raise LockHeld(
                    f"{self.objects.url()} is being written by {self.what} run, {described}; wait for it to finish "
                    f"or pass wait=True (CLI: --wait); if that run is dead, delete {self.objects.url(LOCK_NAME)}"
                )
            if not told:
                print(f"waiting for {self.objects.url()}: held by {described}", file=sys.stderr, flush=True)
                told = True
            time.sleep(1.0)

    def _holder(self) -> dict | None:
        try:
            data = json.loads(self.objects.get(LOCK_NAME) or b"{}")
        except ObjectNotFound:
            return None
        except ValueError:
            return {}
        return data if isinstance(data, dict) else {}

    def release(self) -> None:
        if not self.held:
            return
        self.held = False
        holder = self._holder()
        if holder is not None and holder.get("token") == self.token:
            self.objects.delete(LOCK_NAME)
