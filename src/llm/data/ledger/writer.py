"""`LedgerWriter`: one rank's record of what each step trained on, committed with the checkpoint.

The loader (or the text module) calls `record(step, rows, pieces)` as it hands a batch over,
with the identities its worker read. Nothing reaches the disk until `commit()`, which the
checkpoint calls *before* it renames its own file: a segment holds exactly the steps since the
previous commit. So after a kill -9:

* a segment written but whose checkpoint never landed ends past the checkpoint the run resumes
  from: `open(state)` deletes it (same generation, steps beyond the state), so those steps,
  trained and then lost with the model, are never counted;
* steps recorded after the last commit were never written.

Each resume starts a new *generation*: one more than any generation already in the folder (every
rank computes the same number, since nothing new is written before the first commit, which comes
after every rank has opened). Rank 0 writes `g{generation}.json` at its first commit: where the
generation resumed from (generation and step) and its topology, so `audit` can follow the chain
of resumes the run stands on, and name steps that a resume from an older checkpoint abandoned.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import weakref
from pathlib import Path
from typing import Any

import numpy as np

from llm.data.ledger.format import (
    CHECKSUM,
    HEADER_NAME,
    PIECE,
    ROW,
    RULES,
    VERSION,
    Columns,
    LedgerError,
    Runs,
    as_table,
    checksum_name,
    parse_segment_name,
    read_header,
    segment_name,
    segment_parts,
)
from llm.data.stage import StateError
from llm.data.storage.local import atomic_write, fsync_dir, pid_alive
from llm.data.storage.lock import FolderLock, LockHeld, _describe

STATE_KEYS = ("run", "generation", "step")
# (folder, rank) -> (its lock, the token of the writer of this process that holds it)
_HOLDERS: dict[tuple[str, int], tuple[FolderLock, object, int]] = {}  # ..., and the pid that took it


# files that make a folder another writer's: a ledger written in there would mix with (or be wiped with) them
_FOREIGN = (("index.json", "a dataset folder"), ("checkpoint.pt", "a checkpoint folder"),
            ("latest", "an llm-train checkpoint folder"))


def ledger_path(folder: Any) -> Path:
    """`ledger=` checked: a folder path (str, bytes or os.PathLike), or a TypeError naming the argument."""
    if isinstance(folder, (str, bytes, os.PathLike)):
        path = os.fsdecode(os.fspath(folder))
        if path.strip():
            return Path(path)
    raise TypeError(f"ledger= is {folder!r} ({type(folder).__name__}); pass the path of a folder for the run's "
                    "ledger (a str or os.PathLike; a new or empty folder starts one)")


def lock_name(rank: int) -> str:
    return f".r{rank:05d}.lock"


def written_elsewhere(folder: Path) -> str | None:
    """The holder of a rank's lock in this ledger folder when it is another live process of this host (a run
    still writing it), else None. Read from the lock files, never locked: a writer starting now is not refused."""
    for path in sorted(folder.glob(".r*.lock")):
        try:
            holder = json.loads(path.read_bytes() or b"{}")
        except (OSError, ValueError):
            continue
        pid = holder.get("pid") if isinstance(holder, dict) else None
        if isinstance(pid, int) and pid != os.getpid() and holder.get("host") == socket.gethostname() \
                and pid_alive(pid):
            return _describe(holder, path)
    return None


def _holder(path: Path) -> str:
    try:
        return _describe(json.loads(path.read_bytes() or b"{}"), path)
    except (OSError, ValueError):
        return f"another process (lock file {path})"


def _release(key: tuple[str, int], token: object) -> None:
    """A writer is gone (garbage collected): its lock goes, unless a later writer of this process took it over."""
    held = _HOLDERS.get(key)
    if held is not None and held[1] is token:
        del _HOLDERS[key]
        if held[2] == os.getpid():  # a forked worker's copy is not the lock: its holder's file stays
            held[0].release()


def marker_name(generation: int) -> str:
    return f"g{generation:04d}.json"


def generations_in(folder: Path) -> list[int]:
    """Every generation that left a segment or a marker in the folder."""
    found = set()
    for entry in os.listdir(folder):
        parsed = parse_segment_name(entry)
        if parsed:
            found.add(parsed[1])
        elif entry.startswith("g") and entry.endswith(".json") and entry[1:-5].isdigit():
            found.add(int(entry[1:-5]))
    return sorted(found)


def check_ledger_state(state: Any, where: str = "ledger state") -> dict[str, Any]:
    """The ledger part of a saved state, checked (StateError naming the key)."""
    if not isinstance(state, dict):
        raise StateError(f"{where} is {state!r}; expected {{run, generation, step}} as the loader saved it")
    for key in STATE_KEYS:
        value = state.get(key)
        ok = isinstance(value, str) and value if key == "run" else \
            isinstance(value, int) and not isinstance(value, bool) and value >= 0
        if not ok:
            raise StateError(f"{where} key {key!r} is {value!r}; pass the state the loader saved, unchanged")
    return state


class LedgerWriter:
    """One rank's ledger: `open`, then `record` per step handed over, `commit` with every checkpoint."""

    def __init__(self, folder: str | os.PathLike, rank: int = 0, sources: list[dict[str, Any]] | None = None):
        self.folder = ledger_path(folder)
        self.rank = rank
        self.sources = list(sources or [])
        self.run: str | None = None
        self.generation = 0
        self.resumed_from: dict[str, int] | None = None
        self.topology: dict[str, Any] = {}
        self.committed_step = 0  # the last step written (0: none yet)
        self._rows: list[np.ndarray] = []
        self._pieces: list[np.ndarray] = []
        self._n_rows = 0  # rows recorded since the last commit: a running count, not a sum per step
        self._names: dict[str, int] = {}
        self._marker_written = False
        self._header_due = False  # rank 0 of a fresh run writes ledger.json at its first commit
        self._first_step: int | None = None
        self._last_step = 0
        self._skipped: list[int] = []  # steps recorded (read) but not trained: data.skip_batches
        self.checksum = CHECKSUM  # the rows' checksum rule: a resumed ledger keeps the one its header names
        self.compress = True  # zstd on the segments' columns (the shard loader's cannot shrink: format.segment_parts)
        self._token = object()  # this writer's claim on its rank's lock (_HOLDERS)
        self._key: tuple[str, int] | None = None

    # -- the one-writer lock -----------------------------------------------------------------------
    def _lock(self) -> None:
        """Hold this rank's lock in the folder for as long as this writer lives (the kernel drops it at a kill -9).

        Two writers of one rank would each name their segments alike and replace each other's, which audits
        "OK" over steps that were lost: a second process is refused. A later writer of this same process (a
        loader built again to resume) takes the lock over, and the earlier writer's next commit is refused."""
        key = (os.path.realpath(self.folder), self.rank)
        if self._key == key:
            return
        if self._key is not None:
            _release(self._key, self._token)
        held = _HOLDERS.get(key)
        if held is None:
            lock = FolderLock(self.folder, what="a ledger", name=lock_name(self.rank))
            try:
                lock.acquire()
            except LockHeld:
                raise LedgerError(f"{self.folder} is being written as rank {self.rank} by {_holder(lock.path)}; two "
                                  "writers would replace each other's steps: wait for that run to end, or give this "
                                  "one another ledger folder") from None
            except OSError as e:
                raise LedgerError(f"cannot write the ledger folder {self.folder} ({e.strerror or e}); give the run "
                                  "a ledger folder it can write") from None
            held = (lock, self._token, os.getpid())
        _HOLDERS[key] = (held[0], self._token, held[2])
        self._key = key
        weakref.finalize(self, _release, key, self._token)

    def _check_lock(self) -> None:
        held = _HOLDERS.get(self._key) if self._key is not None else None
        if held is None or held[1] is not self._token:
            raise LedgerError(f"{self.folder} rank {self.rank} was opened by a later ledger writer of this process "
                              "(a second loader with the same ledger= folder); this one's steps are not written: "
                              "use one loader per ledger folder and rank")

    # -- start and resume ------------------------------------------------------------------------
    def open(self, state: dict[str, Any] | None, topology: dict[str, Any] | None = None, run: str | None = None) -> None:
        """Start a new run's ledger (state None) or resume from a checkpoint's ledger state.

        `run`: the new run's id, the same on every rank (a random one when None on a single rank).
        A fresh start needs a folder without a ledger: rank 0 refuses one that holds another run's.
        """
        if self.folder.exists() and not self.folder.is_dir():
            raise LedgerError(f"ledger folder {self.folder} is a file, not a folder; pass a folder (a new or empty "
                              "one starts a ledger)")
        for name, what in _FOREIGN:
            if (self.folder / name).exists():
                raise LedgerError(f"ledger folder {self.folder} is {what} (it holds {name}); give the ledger a "
                                  "folder of its own, e.g. a `ledger` folder beside it")
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise LedgerError(f"cannot create the ledger folder {self.folder} ({e.strerror or e}); give the run a "
                              "ledger folder it can write") from None
        self._lock()
        self.topology = dict(topology or {})
        if state is None:
            if run is None and int(self.topology.get("world_size", 1)) > 1:
                raise ValueError("LedgerWriter.open(None) on several ranks needs run=, the same id on every rank")
            self.run = run or secrets.token_hex(8)
            if self.rank == 0:
                header = read_header(self.folder)
                if header is not None:
                    raise LedgerError(f"{self.folder} already holds the ledger of run {header['run']}; resume that "
                                      "run from its checkpoint, or give this run an empty ledger folder")
                # written with the first commit: nothing reaches the disk before a checkpoint does
                self._header_due = True
            self.generation, self.committed_step, self._last_step = 0, 0, 0
            self.checksum = CHECKSUM
            return
        state = check_ledger_state(state)
        header = read_header(self.folder)
        if header is None or header.get("run") != state["run"]:
            found = "no ledger" if header is None else f"the ledger of run {header.get('run')}"
            raise LedgerError(f"the checkpoint's ledger state belongs to run {state['run']} but {self.folder} holds "
                              f"{found}; pass the ledger folder of the run that wrote the checkpoint")
        self.run = header["run"]
        self.checksum = checksum_name(header)  # a version 1 ledger resumed goes on with its own rule
        existing = generations_in(self.folder)
        self.generation = max([state["generation"], *existing]) + 1
        if self.rank == 0 and max(existing, default=0) <= state["generation"]:
            # the usual case, a kill -9 after a segment but before its checkpoint: drop those steps. A state
            # older than a later generation is a resume from an older checkpoint: keep all, audit names it.
            self._drop_lost_steps(state["generation"], state["step"])
        self.resumed_from = {"generation": state["generation"], "step": state["step"]}
        self.committed_step = self._last_step = state["step"]

    def _drop_lost_steps(self, generation: int, step: int) -> None:
        """Segments of this generation past the checkpoint: trained, written, then lost with the model."""
        for entry in sorted(os.listdir(self.folder)):
            parsed = parse_segment_name(entry)
            if parsed and parsed[1] == generation and parsed[3] > step:
                os.unlink(self.folder / entry)
        fsync_dir(self.folder)

    # -- recording ---------------------------------------------------------------------------------
    def name_id(self, name: str) -> int:
        """The index of a file or object name in the next segment's names table."""
        return self._names.setdefault(name, len(self._names))

    def record(self, step: int, rows: np.ndarray, pieces: np.ndarray) -> None:
        """The rows (ROW) and pieces (PIECE, `row_ref` indexing `rows`) of one step handed over."""
        if step <= self._last_step:
            raise ValueError(f"ledger step {step} recorded after step {self._last_step}; steps only go forward")
        rows = np.asarray(rows, ROW).copy()
        rows["step"] = step
        pieces = np.asarray(pieces, PIECE).copy()
        pieces["row_ref"] += self._n_rows
        self._n_rows += len(rows)
        self._rows.append(rows)
        self._pieces.append(pieces)
        self._first_step = step if self._first_step is None else self._first_step
        self._last_step = step

    def record_many(self, rows: np.ndarray, pieces: np.ndarray, owned: bool = False) -> None:
        """Several steps at once (rows carry their steps, in order; `row_ref` indexes `rows`): one copy, not one per
        step; none with `owned=True` (tables built for this call alone, kept as they are)."""
        if not len(rows):
            return
        first, last = _step_bounds(rows)
        if first <= self._last_step:
            raise ValueError(f"ledger step {first} recorded after step {self._last_step}; steps only go forward")
        if isinstance(pieces, Columns) and owned:  # the loader's columns: kept as they are (encode_segment)
            ref, shift = pieces.columns["row_ref"], self._n_rows
            pieces["row_ref"] = range(ref.start + shift, ref.start + shift + len(pieces)) if isinstance(ref, range) \
                else np.asarray(ref) + shift
        else:
            pieces = as_table(pieces, PIECE) if owned else as_table(pieces, PIECE).copy()
            pieces["row_ref"] += self._n_rows
        self._n_rows += len(rows)
        self._rows.append(rows if isinstance(rows, Columns) and owned else
                          np.asarray(rows, ROW) if owned else as_table(rows, ROW).copy())
        self._pieces.append(pieces)
        self._first_step = first if self._first_step is None else self._first_step
        self._last_step = last

    def set_loss(self, step: int, losses: np.ndarray) -> None:
        """Per-row losses of a step recorded since the last commit (`checkpoint.ledger_loss`)."""
        for rows in reversed(self._rows):
            if len(rows) and _step_bounds(rows)[0] == step:
                rows["loss"] = np.asarray(losses, np.float32).reshape(-1)[: len(rows)]
                return

    def mark_skipped(self, step: int) -> None:
        """A step recorded since the last commit was read but not trained (audit counts its rows as skipped)."""
        if self._first_step is None or not self._first_step <= step <= self._last_step:
            raise ValueError(f"ledger step {step} is not among the steps recorded since the last commit")
        self._skipped.append(step)

    # -- commit ------------------------------------------------------------------------------------
    def commit(self, in_flight: list[list[Any]] | None = None) -> dict[str, Any]:
        """Write the steps recorded since the last commit as one segment; returns the state to checkpoint.

        `in_flight`: records read but not yet trained at this commit, as [source, epoch, name, item] (a text
        stream's packer holds them); the segment's header keeps them, so audit does not call them missing."""
        if self.run is None:
            raise RuntimeError("LedgerWriter.commit() before open()")
        self._check_lock()
        if self._header_due:
            atomic_write(self.folder / HEADER_NAME, json.dumps(
                {"version": VERSION, "run": self.run, "checksum": self.checksum, "sources": self.sources},
                indent=1).encode())
            self._header_due = False
        if self.rank == 0 and not self._marker_written and self.generation > 0:
            atomic_write(self.folder / marker_name(self.generation), json.dumps(
                {"generation": self.generation, "resumed_from": self.resumed_from, "topology": self.topology}).encode())
            self._marker_written = True
        if self._first_step is not None:
            names = sorted(self._names, key=self._names.__getitem__)
            header = {"run": self.run, "rank": self.rank, "generation": self.generation,
                      "first_step": self._first_step, "last_step": self._last_step,
                      "topology": self.topology, "names": names, "in_flight": in_flight or [],
                      "skipped": self._skipped, "checksum": self.checksum}
            one = len(self._rows) == 1  # the loader's one table a commit: no copy to join it
            data = segment_parts(header, self._rows[0] if one else np.concatenate([as_table(t, ROW) for t in self._rows]),
                                 self._pieces[0] if one else np.concatenate([as_table(t, PIECE) for t in self._pieces]),
                                 self.compress)
            path = self.folder / segment_name(self.rank, self.generation, self._first_step, self._last_step)
            atomic_write(path, data)  # its parts as they are, in one writev: joining them would copy them again
            self._rows, self._pieces, self._names, self._first_step = [], [], {}, None
            self._n_rows, self._skipped = 0, []
        self.committed_step = self._last_step
        return self.state()

    def state(self) -> dict[str, Any]:
        return {"run": self.run, "generation": self.generation, "step": self.committed_step}


def _step_bounds(rows: Any) -> tuple[int, int]:
    """The first and last step of a table's rows (a Columns' runs are read, not expanded)."""
    steps = rows.columns["step"] if isinstance(rows, Columns) else None
    if isinstance(steps, Runs):
        held = steps.values[steps.lengths > 0]
        return int(held[0]), int(held[-1])
    steps = rows["step"]
    return int(steps[0]), int(steps[-1])


class StageLedger:
    """A stage's ledger (the shard loader's, a text module's): opened lazily, at the first batch or commit,
    so that a `load_state_dict` before it decides whether the run starts or resumes, and on which rank."""

    def __init__(self, folder: str | os.PathLike, sources: list[dict[str, Any]], run: str):
        self.writer = LedgerWriter(folder, 0, sources)
        self.run = run
        self.pending: dict[str, Any] | None = None  # the ledger state a load_state_dict brought
        self.opened = False
        self.step = 0

    def resume_from(self, state: dict[str, Any] | None) -> None:
        self.pending, self.opened = state, False

    def open(self, rank: int, topology: dict[str, Any]) -> None:
        """Start recording as `rank` (read when iteration starts, like the stage's own rank)."""
        if not self.opened:
            self.writer.rank = rank
            self.writer.open(self.pending, topology, run=self.run if self.pending is None else None)
            self.step, self.opened = self.writer.committed_step, True

    @property
    def checksum(self) -> Any:
        """The function that computes rows' checksums by this ledger's rule (known once it is opened)."""
        return RULES[self.writer.checksum]
