"""The data watchdog: when a loader hands no batch for `watchdog_s` seconds, name the rank, the worker, what it reads and the request in flight.

One `Watchdog` per loader (StreamingDataLoader, the text and SFT streams). The loader sets
`since` to the clock (`time.perf_counter_ns`) when its caller asks for a batch and to 0 when it
hands one over: two stores per batch, nothing per sample. A daemon thread looks every second or
so; when a caller has waited `watchdog_s` seconds it builds the report from the marks of
`llm.data.waiting` (reader threads of this process, and each worker process's slot) and logs it
on the `llm.data.watchdog` logger, again every further `watchdog_s` while the wait lasts.
`watchdog="raise"` also makes the waiting caller raise `DataStallError` with that report (with
worker processes or reader threads; a loader with `num_workers=0` reads in the caller's own thread,
which cannot be interrupted, so there it logs only). An error that ends an iteration while a worker
process has exited gets a note naming that worker and what it was reading.
Listeners (`add_listener`) get each report too: `llm-train` shares them with the other ranks.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from llm.data.topology import current_topology
from llm.data.waiting import WorkerSlots, local_lines

log = logging.getLogger("llm.data.watchdog")

ACTIONS = ("log", "raise")
DEFAULT_WATCHDOG_S = 600.0

_listeners: list[Callable[[str], None]] = []


class DataStallError(TimeoutError):
    """A loader handed no batch for `watchdog_s` seconds and `watchdog="raise"` was asked; the message names what hangs."""


def add_listener(fn: Callable[[str], None]) -> None:
    """Call `fn(report)` with every watchdog report of this process (from the watchdog's thread)."""
    _listeners.append(fn)


def remove_listener(fn: Callable[[str], None]) -> None:
    if fn in _listeners:
        _listeners.remove(fn)


def check_watchdog(watchdog_s: Any, action: Any, where: str = "") -> tuple[float, str]:
    """(seconds, action) checked: seconds a number >= 0 (0: off), action 'log' or 'raise'."""
    if isinstance(watchdog_s, bool) or not isinstance(watchdog_s, (int, float)) or not math.isfinite(watchdog_s) \
            or watchdog_s < 0:
        raise ValueError(f"{where}watchdog_s must be a number of seconds >= 0 (0 turns the watchdog off), got {watchdog_s!r}")
    if action not in ACTIONS:
        raise ValueError(f"{where}watchdog must be 'log' or 'raise', got {action!r}")
    return float(watchdog_s), action


class Watchdog:
    """Watches one loader's waits; `start()` returns the watch of one iteration, which `stop()` ends."""

    def __init__(self, name: str, watchdog_s: float = DEFAULT_WATCHDOG_S, action: str = "log",
                 slots: WorkerSlots | None = None):
        self.watchdog_s, self.action = check_watchdog(watchdog_s, action)
        self.name, self.slots = name, slots
        self.last_report: str | None = None
        self._current: Watch | None = None
        self._tick = min(1.0, max(self.watchdog_s / 4, 0.05))

    @property
    def on(self) -> bool:
        return self.watchdog_s > 0

    def clear(self) -> None:
        """New worker processes are about to start: forget the previous ones' slots (call it before they start)."""
        if self.slots is not None:
            self.slots.clear()

    def start(self) -> Watch:
        """An iteration starts, its caller waiting from now; an earlier iteration's watch ends."""
        if self._current is not None:
            self._current.stop()
        watch = self._current = Watch(self)
        return watch

    def report(self, waited: float) -> str:
        """One paragraph: the rank, how long, and each worker or reader thread with what it waits for."""
        rank, world = current_topology()
        parts = self.workers()
        what = "; ".join(parts) if parts else "no reader reports a shard, object or request (the wait is elsewhere)"
        return (f"data watchdog: rank {rank} of {world}: {self.name} has handed no batch for {waited:.1f} s "
                f"(watchdog_s={self.watchdog_s:g}): {what}")

    def workers(self) -> list[str]:
        """Each worker process's marks (from its slot), then this process's reader threads'."""
        marks = [m.phrase() for m in self.slots.read()] if self.slots is not None else []
        return marks + local_lines()

    def result(self, future: Future) -> Any:
        """`future.result()`, raising `DataStallError` instead once the watchdog has fired in raise mode."""
        watch = self._current
        if self.action != "raise" or not self.on or watch is None:
            return future.result()
        while True:
            try:
                return future.result(timeout=self._tick)
            except FutureTimeout:
                if watch.error is not None:
                    raise watch.error from None

    def watched(self, items: Iterable[Any]) -> Iterator[Any]:
        """`items` (a DataLoader) watched: the wait for each item counts, not what the caller does with it."""
        self.clear()
        watch = self.start()
        try:
            for item in items:
                watch.since = 0
                yield item
                watch.since = time.perf_counter_ns()
        except Exception as e:
            stall = watch.failed(e)
            if stall is None:
                raise
            raise stall from e
        finally:
            watch.stop()

    def loader_kwargs(self, kwargs: dict, processes: bool) -> None:
        """In raise mode with worker processes, DataLoader's own `timeout` ends the wait (unless the user set one)."""
        if processes and self.on and self.action == "raise" and not kwargs.get("timeout"):
            kwargs["timeout"] = self.watchdog_s


class Watch:
    """One iteration's watch: `since` is when its caller asked for a batch (perf_counter_ns; 0: holding one)."""

    def __init__(self, dog: Watchdog):
        self.dog = dog
        self.since = time.perf_counter_ns()
        self.error: DataStallError | None = None
        self._stop = threading.Event()
        if dog.on:
            threading.Thread(target=self._run, name="llm-data-watchdog", daemon=True).start()

    def stop(self) -> None:
        self.since = 0
        self._stop.set()

    def waited(self) -> float:
        since = self.since
        return (time.perf_counter_ns() - since) / 1e9 if since else 0.0

    def _run(self) -> None:
        dog, reported, next_at = self.dog, 0, 0.0
        while not self._stop.wait(dog._tick):
            since = self.since
            if not since:
                continue
            waited = (time.perf_counter_ns() - since) / 1e9
            if waited < dog.watchdog_s or (since == reported and waited < next_at):
                continue
            reported, next_at = since, waited + dog.watchdog_s
            self.fire(waited)

    def fire(self, waited: float) -> str:
        """Build, log and hand out the report of a wait of `waited` seconds (the watchdog's thread calls it)."""
        report = self.dog.last_report = self.dog.report(waited)
        log.warning(report)
        for fn in list(_listeners):
            fn(report)
        if self.dog.action == "raise":
            self.error = DataStallError(report)
        return report

    def failed(self, error: BaseException) -> DataStallError | None:
        """An error ends the iteration: a `DataStallError` to raise instead (the worker processes' wait timed out
        in raise mode: DataLoader's timeout=watchdog_s), or None, after adding a note naming the worker
        processes that exited and what they were reading."""
        dog = self.dog
        if isinstance(error, RuntimeError) and dog.action == "raise" and dog.on and self.waited() >= dog.watchdog_s:
            return self.error or DataStallError(dog.report(self.waited()))
        if dog.slots is not None:
            gone = [m.phrase() for m in dog.slots.read() if not m.alive()]
            if gone:
                error.add_note(f"data watchdog ({dog.name}): " + "; ".join(gone))
        return None
