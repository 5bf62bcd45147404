"""The Ray engine: every task a Ray task, on an existing cluster (`ray_address`) or a local one.

Tasks run where Ray puts them and return their result to the driver, which alone calls
`on_done` (and so alone writes manifests and markers). A task whose worker dies is retried
by Ray; only the result of the attempt that finished is used, and a task writes under
names fixed by its task id, so a retry replaces what a killed attempt left.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from llm.data.jobs.tasks import Tasks

INSTALL_HINT = "engine='ray' needs Ray, which is not installed: pip install 'llm-stream-data[ray]' (or pip install 'ray>=2.9')"
TASK_RETRIES = 3  # attempts after a worker death (a killed process, a lost node); errors in fn are not retried


class RayNotInstalled(ImportError):
    """engine='ray' without Ray installed; the message says how to install it."""


def import_ray() -> Any:
    # No usage reports leave the machine (RAY_USAGE_STATS_ENABLED=0), set before Ray is imported or started
    # (the clusters it starts inherit it); a user's explicit setting wins.
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    try:
        import ray
    except ImportError:
        raise RayNotInstalled(INSTALL_HINT) from None
    return ray


def start_local(num_cpus: int | None = None) -> None:
    """Start a Ray cluster on this machine whose workers import what this process imports.

    `address="local"`: a new one, as `--ray-address`'s default says (`RAY_ADDRESS` aside, `_connect`); without
    it Ray would join the last cluster `ray start` began here, or fail when that one is gone (its address
    file, `/tmp/ray/ray_current_cluster`, outlives it).
    """
    ray = import_ray()
    # Workers of a local cluster are fresh interpreters: give them this process's import path
    # so fn (and the llm package from a source checkout) import there as they do here.
    path = os.pathsep.join(os.path.abspath(p or ".") for p in sys.path if os.path.isdir(p or "."))
    ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, logging_level="ERROR", log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": path}})


def _connect(ray: Any, address: str | None, workers: int) -> bool:
    """Use the running Ray session, else connect to `address`, else start a local cluster; True if we did."""
    if ray.is_initialized():
        if address is not None:
            ctx = ray.get_runtime_context()
            current = getattr(ctx, "gcs_address", None)
            if current and address not in ("auto", current):
                raise ValueError(f"Ray is already connected to {current}, not to ray_address={address!r}")
        return False
    address = address or os.environ.get("RAY_ADDRESS") or None  # set by `ray job submit`: the job's cluster
    if address is not None:
        ray.init(address=address, logging_level="ERROR")
    else:
        start_local(workers or None)
    return True


def _task(work: Any, task_id: int) -> tuple[Any, list[int]]:
    counts = [0, 0]

    def report(docs: int, tokens: int) -> None:
        counts[0] += docs
        counts[1] += tokens

    return work(task_id, report), counts


def _cause(ray: Any, error: BaseException, task_id: int, desc: str) -> BaseException:
    if isinstance(error, ray.exceptions.RayTaskError):  # fn raised: the original exception, as the local engine gives
        cause = getattr(error, "cause", None)
        return cause if isinstance(cause, BaseException) else RuntimeError(str(error))
    return RuntimeError(f"{desc}: task {task_id} failed on Ray after {TASK_RETRIES} retries "
                        f"({type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''})")


@contextmanager
def session(address: str | None, num_workers: int | None) -> Iterator[int]:
    """Ray connected for a run; yields its workers (num_workers, else the cluster's CPUs)."""
    ray = import_ray()
    started = _connect(ray, address, num_workers or 0)
    try:
        yield num_workers if num_workers else max(1, int(ray.cluster_resources().get("CPU", 1)))
    finally:
        if started:
            ray.shutdown()


def run_ray(tasks: Tasks, workers: int, address: str | None, bar: Any) -> None:
    """Run the tasks on Ray, at most `workers` at once (0: as many as the cluster has CPUs)."""
    ray = import_ray()
    started = _connect(ray, address, workers)
    pending: dict[Any, int] = {}
    try:
        remote = ray.remote(num_cpus=1, max_retries=TASK_RETRIES, retry_exceptions=False)(_task)
        work = ray.put(tasks.work)
        limit = workers or max(1, int(ray.cluster_resources().get("CPU", 1)))
        next_id, counts = 0, [0, 0]
        while next_id < tasks.count or pending:
            while next_id < tasks.count and len(pending) < limit:
                pending[remote.remote(work, next_id)] = next_id
                next_id += 1
            ready, _ = ray.wait(list(pending), num_returns=1)
            for ref in ready:
                task_id = pending.pop(ref)
                try:
                    result, done = ray.get(ref)
                except ray.exceptions.RayError as e:
                    raise _cause(ray, e, task_id, bar.desc) from None
                tasks.on_done(task_id, result)
                counts = [counts[0] + done[0], counts[1] + done[1]]
                bar.update(1)
                bar.set_postfix(dict(zip(tasks.counters, counts)), refresh=False)
    except BaseException:
        for ref in pending:  # stop what still runs: the run failed and its output is discarded
            ray.cancel(ref, force=True)
        raise
    finally:
        if started:
            ray.shutdown()


def on_every_node(fn: Any, *args: Any, timeout_s: float = 120.0) -> None:
    """Run `fn(*args)` once on every live node of the connected cluster (each node's own disk, e.g. its scratch);
    a node lost meanwhile raises (GetTimeoutError after `timeout_s`, or Ray's own error)."""
    ray = import_ray()
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    remote = ray.remote(num_cpus=0, max_retries=TASK_RETRIES)(fn)
    nodes = [node["NodeID"] for node in ray.nodes() if node.get("Alive")]
    ray.get([remote.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)).remote(*args)
             for node in nodes], timeout=timeout_s)
