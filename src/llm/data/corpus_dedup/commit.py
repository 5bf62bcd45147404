"""Atomic commits of the work folder and the output, and the kill points the crash tests use.

Every stage's output appears under its final name by one rename, after its bytes are
fsynced: a file or folder with a final name is complete, anything else (`*.tmp-*`) is
the leftover of a killed writer and is removed before the work is done again.
`LLM_DEDUP_KILL_AT=<point>` makes the process kill itself with SIGKILL right after that
commit (once only when `LLM_DEDUP_KILL_ONCE` names a marker file): how the tests kill a
run at every stage boundary, for real.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from llm.data.storage.local import fsync_dir


def tmp_name(final: Path) -> Path:
    """A private name next to `final` for writing it (unique per process and attempt)."""
    return final.with_name(f".{final.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")


def commit_file(tmp: Path, final: Path, sync_dir: bool = True) -> None:
    """Rename a written and closed file into place, durably.

    `sync_dir=False`: the folder's fsync is left to the caller, who syncs it once after a stage's
    many commits into it (before anything later relies on them). The file's bytes are synced before
    the rename either way, so a final name never holds less than the whole file; a power cut before
    the folder's sync can only lose the name, and a rerun writes that item again.
    """
    with open(tmp, "rb+") as f:
        os.fsync(f.fileno())
    os.replace(tmp, final)
    if sync_dir:
        fsync_dir(final.parent)


def write_file(final: Path, data: bytes) -> None:
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = tmp_name(final)
    tmp.write_bytes(data)
    commit_file(tmp, final)


def write_json(final: Path, value: object) -> None:
    write_file(final, (json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False) + "\n").encode("utf-8"))


def commit_dir(tmp: Path, final: Path, sync_dir: bool = True) -> None:
    """Rename a finished folder into place; when a retried attempt got there first, ours is dropped.

    `sync_dir`: as for `commit_file`.
    """
    # at once, from threads (fsync releases the GIL): the disk flushes them together, where one after the
    # other each waits its own turn (a scan folder holds 5+ files: ~3 ms each here, ~1 ms together)
    entries = [*tmp.iterdir(), tmp]
    with ThreadPoolExecutor(len(entries)) as pool:
        list(pool.map(_fsync_path, entries))
    try:
        os.rename(tmp, final)
    except OSError:
        if not final.is_dir():
            raise
        shutil.rmtree(tmp, ignore_errors=True)  # the same content, written by another attempt
    if sync_dir:
        fsync_dir(final.parent)


def _fsync_path(path: Path) -> None:
    if path.is_dir():
        fsync_dir(path)
        return
    with open(path, "rb+") as f:
        os.fsync(f.fileno())


def remove_leftovers(folder: Path, name: str) -> None:
    """Remove what a killed writer of `name` left in `folder` (its `.name.tmp-*`)."""
    if not folder.is_dir():
        return
    for entry in folder.glob(f".{name}.tmp-*"):
        if entry.is_dir():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)


def kill_point(point: str) -> None:
    """Test hook: SIGKILL this process right after the commit named `point` (see the module docstring)."""
    if os.environ.get("LLM_DEDUP_KILL_AT") != point:
        return
    marker = os.environ.get("LLM_DEDUP_KILL_ONCE")
    if marker:
        try:
            fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            return
        os.close(fd)
    os.kill(os.getpid(), signal.SIGKILL)
