"""Engines run the tasks of `optimize` and `map`: local worker processes, or Ray tasks on a cluster.

Both take a `Tasks` (a function of the task id, run where the task runs, and a callback
run in the driver as each task finishes) and differ only in where the tasks run.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

ENGINES = ("local", "ray")

Report = Callable[[int, int], None]  # (documents or items, tokens) done since the last report


@dataclass(frozen=True)
class Tasks:
    """`work(task_id, report)` runs in a worker and returns the task's result (picklable);
    `on_done(task_id, result)` runs in the driver, in completion order."""

    work: Callable[[int, Report], Any]
    count: int
    on_done: Callable[[int, Any], None]
    unit: str = "task"
    counters: tuple[str, str] = ("docs", "tokens")  # names of report()'s two numbers on the bar


def check_engine(engine: str, ray_address: str | None) -> None:
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {', '.join(repr(e) for e in ENGINES)}, got {engine!r}")
    if ray_address is not None and engine != "ray":
        raise ValueError(f"ray_address is only used with engine='ray', not {engine!r}")


def progress_bar(total: int, desc: str, unit: str, enabled: bool) -> Any:
    from tqdm.auto import tqdm

    return tqdm(total=total, unit=unit, desc=desc, disable=not enabled, dynamic_ncols=True, file=sys.stderr)


def run_tasks(tasks: Tasks, *, engine: str = "local", workers: int = 1, ray_address: str | None = None,
              desc: str = "optimize", progress: bool = True) -> None:
    """Run every task once (Ray: at least once, its result taken once), reporting to a progress bar."""
    check_engine(engine, ray_address)
    bar = progress_bar(tasks.count, desc, tasks.unit, progress)
    try:
        if engine == "ray":
            from llm.data.shards.engines.ray import run_ray

            run_ray(tasks, workers, ray_address, bar)
        else:
            from llm.data.shards.engines.local import run_local

            run_local(tasks, workers, bar)
    finally:
        bar.close()


@contextmanager
def engine_session(engine: str, ray_address: str | None, num_workers: int | None) -> Iterator[int]:
    """The number of workers for a run, with Ray connected (or started) for its duration."""
    check_engine(engine, ray_address)
    if engine == "local":
        yield (os.cpu_count() or 1) if num_workers is None else num_workers
        return
    from llm.data.shards.engines.ray import session

    with session(ray_address, num_workers) as workers:
        yield workers
