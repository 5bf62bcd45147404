"""Where a dedup run's output and work folder live: a local folder (here) or an object store (remote.py).

The pipeline asks a place only these things: is `rel` committed (`has`), bring these committed
files into the folder the driver reads (`fetch`), publish a file the driver wrote there
(`publish`), make a stage's task run against the place (`stage`), and the run's start and end
(`entries`, `clear`, `drop`, `finish`). `rel` is a path relative to the output root, with `/`.

A local folder is its own copy: `fetch`, `publish` and `stage` do nothing, and a commit is a
rename (commit.py). The plan of a finished run is moved out of the work folder by one rename,
then the work folder is renamed aside and deleted (pipeline.py's docstring says why).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from llm.data.corpus_dedup.commit import kill_point
from llm.data.storage.local import fsync_dir
from llm.data.storage.lock import LOCK_NAME

WORK_NAME = ".dedup-work"
DONE_NAME = ".dedup-plan.json"  # the plan of a finished run, moved out of the work folder
TRASH_NAME = ".dedup-work.deleting"  # the work folder of a finished run, renamed aside to be deleted


class LocalPlace:
    """An output folder on this machine's disk (or a disk every Ray node mounts at the same path)."""

    remote = False

    def __init__(self, out: Path):
        self.out = self.root = out  # root: the folder the driver reads and writes (here the output itself)

    def __str__(self) -> str:
        return str(self.out)

    def has(self, rel: str) -> bool:
        return (self.out / rel).exists()

    def has_any(self, rel: str) -> bool:
        """Whether anything of the folder `rel` is there."""
        return (self.out / rel).is_dir()

    def read_bytes(self, rel: str) -> bytes:
        return (self.out / rel).read_bytes()

    def refresh(self) -> None:
        pass

    def fetch(self, rels: Iterable[str]) -> None:
        pass

    def publish(self, rel: str) -> None:
        pass

    def stage(self, task: Any, needs: Any = None, makes: Any = None) -> Any:
        return task

    def entries(self) -> list[str]:
        """What the output holds at its top (the lock left out)."""
        return [e.name for e in sorted(self.out.iterdir()) if e.name != LOCK_NAME] if self.out.is_dir() else []

    def clear(self) -> None:
        """Empty the output for --overwrite (the lock file stays: we hold it)."""
        for name in self.entries():
            _remove_entry(self.out / name)

    def drop(self, rel: str) -> None:
        """Delete a folder (a work folder that no longer counts); a deletion cut short before is finished."""
        _remove_tree(self.out / rel)

    def sweep(self) -> None:
        _remove_tree(self.out / TRASH_NAME)  # a deletion killed part way: garbage by construction (finish)

    def finish(self, keep_work: bool) -> None:
        """Delete the work folder so that a kill at any moment leaves a run that a rerun finishes.

        The plan goes first, by one rename, to `DONE_NAME`: from then on the run is finished.
        The rest is renamed aside and deleted; what a kill leaves of it is removed by the rerun.
        """
        if keep_work:
            return
        work = self.out / WORK_NAME
        os.replace(work / "plan.json", self.out / DONE_NAME)
        fsync_dir(self.out)
        kill_point("cleanup:plan")
        trash = self.out / TRASH_NAME
        _remove_tree(trash)
        os.rename(work, trash)
        fsync_dir(self.out)
        kill_point("cleanup:rename")
        _remove_tree(trash, "cleanup")


def _remove_tree(folder: Path, point: str | None = None) -> None:
    """Delete a folder; `point`: the kill point after its first entry went (a deletion cut short).

    The files go from threads at once (unlink releases the GIL, and on a journaling file system
    each one waits on the disk: ~2 ms here, so a work folder of a few hundred took ~0.5 s one by one).
    """
    if not folder.is_dir():
        return
    entries = sorted(folder.iterdir())
    for i, entry in enumerate(entries[:1]):
        _remove_entry(entry)
        if i == 0 and point:
            kill_point(point)
    files: list[str] = []
    dirs: list[str] = []
    for entry in entries[1:]:
        if entry.is_dir() and not entry.is_symlink():
            for root, subdirs, names in os.walk(entry):
                files += [os.path.join(root, n) for n in names]
                files += [os.path.join(root, d) for d in subdirs if os.path.islink(os.path.join(root, d))]
                dirs.append(root)
        else:
            files.append(str(entry))
    if files:
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(os.unlink, files))
    for d in reversed(dirs):  # os.walk lists a folder before its subfolders
        os.rmdir(d)
    folder.rmdir()


def _remove_entry(entry: Path) -> None:
    if entry.is_dir() and not entry.is_symlink():
        shutil.rmtree(entry)
    else:
        entry.unlink()
