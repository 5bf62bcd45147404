"""The one-writer lock of a dataset folder: a lock file naming its holder (pid, host), flock-guarded."""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import socket
import sys
import time
from pathlib import Path

from llm.data.storage.local import pid_alive, same_file

LOCK_NAME = ".llm-data.lock"
# A stale lock taken over is news for whoever runs the job, not a mistake in the calling code: it is
# logged (one line, the sentence alone, like the package's other run-time notices), not a warnings.warn,
# which would print a file:line and the caller's source line around it.
log = logging.getLogger(__name__)


_HELD: set[int] = set()  # lock fds this process holds


def _close_inherited() -> None:
    # A forked child (an optimize worker) shares the parent's lock; if it kept the fd, the lock
    # would outlive a parent killed with -9 until every worker is gone, and a new run would fail.
    for fd in list(_HELD):
        try:
            os.close(fd)
        except OSError:
            pass
    _HELD.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_close_inherited)


class LockHeld(OSError):
    """Another live process holds the folder's lock; the message names it."""


def _describe(holder: dict, path: Path) -> str:
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(holder.get("since", 0)))
    return f"pid {holder.get('pid', '?')} on host {holder.get('host', '?')} since {since} (lock file {path})"


class FolderLock:
    """Exclusive lock on a folder for the whole of a write: `with FolderLock(folder, what="optimize"):`.

    The kernel's flock does the exclusion (it is released when the holder dies, even by kill -9);
    the file's content (pid, host, start time) names the holder in errors. A lock file left by a
    dead holder is taken over with a warning. The file is removed on release; since a waiter may
    have opened the old file meanwhile, a taker checks that the path still is the file it locked.
    """

    def __init__(self, folder: str | Path, wait: bool = False, what: str = "a writer", name: str = LOCK_NAME):
        # `name`: several writers that each own a part of one folder (a ledger's ranks) lock one file each
        self.folder, self.wait, self.what = Path(folder), wait, what
        self.path = self.folder / name
        self._fd: int | None = None

    def acquire(self) -> None:
        while True:
            self.folder.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                if not self._flock(fd):
                    continue  # waited for a holder that removed its file: try the new one
                if same_file(self.path, fd):
                    self._claim(fd)
                    self._fd = fd
                    _HELD.add(fd)
                    return
            except BaseException:
                os.close(fd)
                raise
            os.close(fd)

    def _flock(self, fd: int) -> bool:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            pass
        except OSError as e:  # no flock on this filesystem: fall back to the pid in the file
            if e.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
                raise
            holder = _read(fd)
            if not holder or holder.get("host") != socket.gethostname() or not pid_alive(int(holder.get("pid", 0))):
                return True
        holder = _read(fd)
        if not self.wait:
            raise LockHeld(
                f"{self.folder} is being written by {self.what} run, {_describe(holder, self.path)}; "
                "wait for it to finish or pass wait=True (CLI: --wait)"
            )
        print(f"waiting for {self.folder}: held by {_describe(holder, self.path)}", file=sys.stderr, flush=True)
        fcntl.flock(fd, fcntl.LOCK_EX)  # blocks until the holder releases or dies
        return True

    def _claim(self, fd: int) -> None:
        holder = _read(fd)
        if holder and holder.get("pid") != os.getpid():
            # The previous holder died without releasing (kill -9, power cut): take over.
            log.warning("taking over the stale lock of %s left by %s, which is no longer running",
                        self.folder, _describe(holder, self.path))
        me = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.time()}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(me).encode(), 0)
        os.fsync(fd)

    def release(self) -> None:
        if self._fd is None:
            return
        try:
            self.path.unlink(missing_ok=True)  # before unlocking: a waiter then sees it is gone
        finally:
            _HELD.discard(self._fd)
            os.close(self._fd)  # closing drops the flock
            self._fd = None

    def __enter__(self) -> FolderLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _read(fd: int) -> dict:
    try:
        data = json.loads(os.pread(fd, 4096, 0) or b"{}")
        return data if isinstance(data, dict) else {}
    except (ValueError, OSError):
        return {}
