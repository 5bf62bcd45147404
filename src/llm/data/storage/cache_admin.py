"""`llm-data cache ls|clear`: list and remove shard cache folders, never a shard a live reader holds.

Trade-off: clearing takes the same non-blocking exclusive locks as eviction, so it never
waits for a training run and never removes a file that run is reading; what is in use is
skipped and reported, and a folder a running reader has open (`.source.json` is held with
a shared lock for the reader's lifetime) keeps its folder, so the run can go on (it fetches
again what it needs). A cache made before `.source.json` existed lists its URL as unknown.

Only shard caches are listed or removed, never whatever else sits under the root (an optimized
dataset, a user's folder): a cache folder is one holding `.source.json` (written by `register`
when the folder is created), or, for caches made before that file existed, one with their exact
layout: a 32-hex fingerprint name, the cache's `.lock` file, only plain files (and kept edges,
`.edges/`) and no index.json.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from llm.data.storage.cache import _BUSY, Pin, _open_locked, default_cache_root
from llm.data.storage.local import pid_alive, same_file
from llm.data.storage.lock import LOCK_NAME as DATASET_LOCK

SOURCE = ".source.json"
INDEX = "index.json"  # a dataset's manifest (format/manifest.py's INDEX_NAME; storage/ sits below shards/)
EDGES = ".edges"  # the kept edge tokens of shards (read/edges.py), removed with the shards
_FINGERPRINT = re.compile(r"[0-9a-f]{32}")


def register(folder: Path, url: str) -> Pin:
    """Record which dataset `folder` caches (once) and mark it in use until the returned Pin
    (a shared lock on `.source.json`, like a reader's pin on a shard) is closed."""
    path = Path(folder) / SOURCE
    for _ in range(100):
        Path(folder).mkdir(parents=True, exist_ok=True)
        if not path.exists():
            tmp = path.with_name(f"{SOURCE}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps({"url": url, "fingerprint": Path(folder).name, "created": time.time()}))
            try:
                os.link(tmp, path)  # never replaces: a reader may already hold the existing file
            except FileExistsError:
                pass
            finally:
                tmp.unlink(missing_ok=True)
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            continue  # cleared in between: make it again
        fcntl.flock(fd, fcntl.LOCK_SH)  # waits only for a `clear` of this folder in progress
        if same_file(path, fd):
            os.utime(path)  # its mtime is when the cache was last opened
            return Pin(path, fd)
        os.close(fd)
    raise OSError(f"cache folder {folder} keeps disappearing while opened; is `llm-data cache clear` running in a loop?")


@dataclass
class CacheFolder:
    """One `<root>/<fingerprint>` folder as `ls` shows it."""

    path: Path
    url: str | None
    shards: int
    bytes: int
    last_used: float

    @property
    def fingerprint(self) -> str:
        return self.path.name


def check_root(root: str | Path | None) -> Path:
    """The cache root (default: the user cache dir); a bad --cache-dir is one sentence."""
    if root is None:
        return default_cache_root()
    path = Path(root).expanduser()
    if not path.exists():
        raise ValueError(f"--cache-dir {root} does not exist; pass the folder given as cache_dir (default {default_cache_root()})")
    if not path.is_dir():
        raise ValueError(f"--cache-dir {root} is a file, not a folder")
    if _is_dataset(path):
        raise ValueError(f"--cache-dir {root} holds an optimized dataset ({INDEX}), not shard cache folders; pass the "
                         "folder given as cache_dir (the one above each dataset fingerprint's folder)")
    if (path / SOURCE).exists() or (path / ".lock").exists():
        raise ValueError(f"--cache-dir {root} is one dataset's cache folder; pass the folder above it ({path.parent})")
    return path


def _is_dataset(folder: Path) -> bool:
    """An optimized dataset (ours, LitData's or MDS's: an index.json), or one whose first optimize is under way
    (its lock): never a cache, whatever else it holds. A cache folder never holds an index.json."""
    return (folder / INDEX).exists() or (folder / DATASET_LOCK).exists()


def _scan(folder: Path) -> CacheFolder:
    url, shards, size, used = None, 0, 0, 0.0
    try:
        url = json.loads((folder / SOURCE).read_text()).get("url")
    except (OSError, ValueError, AttributeError):
        pass
    for entry in os.scandir(folder):
        try:
            st = entry.stat(follow_symlinks=False)
        except FileNotFoundError:
            continue
        if entry.name == EDGES and entry.is_dir(follow_symlinks=False):
            size += _tree_size(Path(entry.path))
            continue
        if not entry.is_file(follow_symlinks=False):
            continue
        if not entry.name.startswith("."):
            shards += 1
            used = max(used, st.st_mtime)
        elif entry.name == SOURCE:
            used = max(used, st.st_mtime)
        size += st.st_size
    return CacheFolder(folder, url if isinstance(url, str) else None, shards, size, used)


def is_cache_folder(folder: Path) -> bool:
    """Whether `folder` is a shard cache: marked by `.source.json`, or laid out as one made before it."""
    if _is_dataset(folder):  # a stray .source.json (copied, or made by hand) never makes a dataset removable
        return False
    if (folder / SOURCE).is_file():
        return True
    if not _FINGERPRINT.fullmatch(folder.name) or not (folder / ".lock").is_file():
        return False
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return False
    return all((e.is_file(follow_symlinks=False) or (e.name == EDGES and e.is_dir(follow_symlinks=False)))
               and e.name != INDEX for e in entries)


def _subfolders(root: Path) -> list[Path]:
    if not root.is_dir():
        return []
    return sorted(Path(e.path) for e in os.scandir(root) if e.is_dir(follow_symlinks=False))


def list_caches(root: Path) -> list[CacheFolder]:
    """Every cache folder under `root`, most recently used first (other folders are not caches)."""
    folders = [_scan(path) for path in _subfolders(root) if is_cache_folder(path)]
    return sorted(folders, key=lambda f: (-f.last_used, f.fingerprint))


def not_caches(root: Path) -> list[str]:
    """Names of the folders under `root` that are not shard caches: never listed, never removed."""
    return [path.name for path in _subfolders(root) if not is_cache_folder(path)]


def select(folders: list[CacheFolder], targets: list[str], root: Path) -> list[CacheFolder]:
    """The folders named by fingerprint (or a unique prefix of 8+ characters) or dataset URL."""
    chosen: dict[Path, CacheFolder] = {}
    for target in targets:
        want = target.rstrip("/")
        hits = [f for f in folders if f.url is not None and f.url.rstrip("/") == want]
        hits = hits or [f for f in folders if f.fingerprint == target]
        if not hits and len(target) >= 8:
            hits = [f for f in folders if f.fingerprint.startswith(target)]
            if len(hits) > 1:
                raise ValueError(f"{target} is the start of {len(hits)} cache folders' names under {root}; give more of it")
        if not hits and (root / target).is_dir() and not is_cache_folder(root / target):
            raise ValueError(f"{root / target} is not a shard cache (no {SOURCE}); `llm-data cache clear` removes "
                             "only cache folders: delete it yourself if you mean to")
        if not hits:
            raise ValueError(f"no cache folder under {root} for {target}; `llm-data cache ls` lists fingerprints and URLs")
        chosen.update((f.path, f) for f in hits)
    return list(chosen.values())


def _lock_free(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False


def _tree_size(path: Path) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.stat(os.path.join(root, name), follow_symlinks=False).st_size
            except FileNotFoundError:
                continue
    return total


def _remove_unlocked(path: Path) -> bool:
    """Remove `path` if nobody holds a lock on it (a pinned shard, a download in progress)."""
    fd = _open_locked(path, fcntl.LOCK_EX)
    if fd == _BUSY:
        return False
    if fd is not None:
        try:
            path.unlink(missing_ok=True)
        finally:
            os.close(fd)
    return True


def _part_in_use(name: str) -> bool:
    """A `.NAME.SIZE.PID-N.part` download of a live process."""
    try:
        pid = int(name.rsplit(".", 3)[2].split("-")[0])
    except (IndexError, ValueError):
        return False
    return pid != os.getpid() and pid_alive(pid)


@dataclass
class Cleared:
    folder: CacheFolder
    removed: int = 0  # shards
    freed: int = 0  # bytes
    kept: list[str] = field(default_factory=list)  # shards in use
    in_use: bool = False  # a running reader has the folder open: the folder stays

    @property
    def gone(self) -> bool:
        return not self.kept and not self.in_use


def clear(folder: CacheFolder) -> Cleared:
    """Remove what no live reader holds; the whole folder when nothing is in use."""
    out = Cleared(folder)
    source = folder.path / SOURCE
    made = not source.exists()  # a folder from before .source.json: nobody can hold it
    holder = os.open(source, os.O_RDONLY | os.O_CREAT, 0o644)
    try:
        out.in_use = not _lock_free(holder)
        for entry in sorted(os.scandir(folder.path), key=lambda e: e.name):
            name, path = entry.name, Path(entry.path)
            if name == EDGES and entry.is_dir(follow_symlinks=False):
                out.freed += _tree_size(path)  # kept edges (read/edges.py): a reader without them reads shards whole
                shutil.rmtree(path, ignore_errors=True)
                continue
            if not entry.is_file(follow_symlinks=False) or name in (SOURCE, ".lock"):
                continue
            try:
                size = entry.stat(follow_symlinks=False).st_size
            except FileNotFoundError:
                continue
            if name.endswith(".part") and _part_in_use(name):
                out.kept.append(name)
            elif _remove_unlocked(path):
                if not name.startswith("."):
                    out.removed += 1
                out.freed += size
            elif not name.startswith(".dl-"):
                out.kept.append(name)
            else:
                out.in_use = True  # a download in progress: its process will write here
        if out.gone:
            for name in (".lock", SOURCE):
                (folder.path / name).unlink(missing_ok=True)
            try:
                folder.path.rmdir()
            except OSError:  # something appeared meanwhile: leave the folder
                out.in_use = True
        elif made:
            source.unlink(missing_ok=True)  # an empty one would stop a reader from recording the URL
    finally:
        os.close(holder)
    return out
