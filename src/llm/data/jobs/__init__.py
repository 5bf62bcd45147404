"""Engines run the tasks of `optimize` and `map`: local worker processes, or Ray tasks on a cluster.

Both take a `Tasks` (a function of the task id, run where the task runs, and a callback
run in the driver as each task finishes) and differ only in where the tasks run.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

from llm.data.jobs.tasks import ENGINES, Report, Tasks, check_engine, progress_bar

__all__ = ["ENGINES", "Report", "Tasks", "check_engine", "engine_session", "progress_bar", "run_tasks"]


def run_tasks(tasks: Tasks, *, engine: str = "local", workers: int = 1, ray_address: str | None = None,
              desc: str = "optimize", progress: bool = True) -> None:
    """Run every task once (Ray: at least once, its result taken once), reporting to a progress bar.

    The caller checked `engine` at its entry (check_engine), before anything was created."""
    bar = progress_bar(tasks.count, desc, tasks.unit, progress)
    try:
        if engine == "ray":
            from llm.data.jobs.ray import run_ray

            run_ray(tasks, workers, ray_address, bar)
        else:
            from llm.data.jobs.local import run_local

            run_local(tasks, workers, bar)
    finally:
        bar.close()


@contextmanager
def engine_session(engine: str, ray_address: str | None, num_workers: int | None) -> Iterator[int]:
    """The number of workers for a run, with Ray connected (or started) for its duration (engine checked)."""
    if engine == "local":
        yield (os.cpu_count() or 1) if num_workers is None else num_workers
        return
    from llm.data.jobs.ray import session

    with session(ray_address, num_workers) as workers:
        yield workers
