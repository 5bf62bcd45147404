"""The local engine: tasks in forked worker processes of this machine (or in this process for 0 workers).

Why not concurrent.futures.ProcessPoolExecutor (fork context): it is as fast but loses two guarantees: a failed run stops at once here (the other workers are
terminated), where the executor waits for every running task to finish; and a worker that
dies is named with its pid and exit code or signal here, where the executor only says that
the pool broke. Workers also stop by themselves if this process is killed (`report`).
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import queue
import signal
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

from llm.data.collector import keep_freed_memory
from llm.data.jobs.tasks import Tasks


def run_local(tasks: Tasks, workers: int, bar: Any, meanwhile: Callable[[], None] | None = None) -> None:
    """Run the tasks on `workers` forked processes (0: in this process, in order).

    `meanwhile`: work of this process that needs none of the tasks' results, run while the workers run
    (before the tasks without workers): the driver's part overlaps theirs instead of adding to the wall.
    """
    counts = [0, 0]

    def report(docs: int, tokens: int) -> None:
        counts[0] += docs
        counts[1] += tokens

    if workers == 0:
        if meanwhile is not None:
            meanwhile()
        for task_id in range(tasks.count):
            result = tasks.work(task_id, report)
            tasks.on_done(task_id, result)
            bar.update(1)
            bar.set_postfix(dict(zip(tasks.counters, counts)), refresh=False)
        return
    _run_parallel(tasks, workers, bar, meanwhile)


def _worker(tasks: Tasks, task_queue: Any, results: Any, parent_pid: int, die_with_parent: bool = False) -> None:
    # The worker processes are the parallelism: tokenizer thread pools would only contend for cores.
    os.environ["LLM_TOKENIZER_THREADS"] = "1"
    os.environ["RAYON_NUM_THREADS"] = "1"
    if tasks.keep_freed_memory:  # a task's numpy temporaries, made batch after batch, reuse the heap's pages
        keep_freed_memory()
    if die_with_parent:
        _die_with(parent_pid)
    last = [time.monotonic(), 0, 0]

    def report(docs: int, tokens: int) -> None:
        last[1] += docs
        last[2] += tokens
        if time.monotonic() - last[0] > 0.5:
            if os.getppid() != parent_pid:  # the parent was killed: stop writing orphans
                os._exit(1)
            results.put(("progress", last[1], last[2]))
            last[:] = [time.monotonic(), 0, 0]

    while True:
        task_id = task_queue.get()
        if task_id is None:
            return
        try:
            result = tasks.work(task_id, report)
            results.put(("progress", last[1], last[2]))
            last[1:] = [0, 0]
            results.put(("done", task_id, result))
        except BaseException as e:  # reported to the parent, which stops the run and cleans up
            results.put(("error", task_id, picklable(e), traceback.format_exc()))
            return


def _die_with(parent_pid: int) -> None:
    """On Linux, SIGKILL this worker when its parent dies: a parent killed while it runs its `meanwhile` work
    (a test's kill point, a crash) must not leave workers that go on committing tasks beside a rerun (without
    `meanwhile`, the parent only waits, and `report` checks)."""
    if sys.platform.startswith("linux"):
        try:
            import ctypes  # imported by the parent before the fork (_run_parallel): shared, not imported per worker

            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            return
    if os.getppid() != parent_pid:  # the parent died before the call above
        os._exit(1)


def picklable(e: BaseException) -> BaseException:
    """The exception itself when it survives pickling (to cross a process boundary), else its text."""
    try:
        pickle.loads(pickle.dumps(e))
        return e
    except Exception:
        return RuntimeError(f"{type(e).__name__}: {e}")


def _run_parallel(tasks: Tasks, workers: int, bar: Any, meanwhile: Callable[[], None] | None = None) -> None:
    # fork where available: fn need not be picklable and workers start in milliseconds.
    ctx = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn")
    task_queue, result_queue = ctx.Queue(), ctx.Queue()
    for task_id in range(tasks.count):
        task_queue.put(task_id)
    workers = min(workers, tasks.count)
    for _ in range(workers):
        task_queue.put(None)
    if meanwhile is not None and sys.platform.startswith("linux"):
        import ctypes  # noqa: F401 - for _die_with in the workers
    procs = [ctx.Process(target=_worker, args=(tasks, task_queue, result_queue, os.getpid(), meanwhile is not None),
                         daemon=True) for _ in range(workers)]
    for p in procs:
        p.start()
    done = 0
    counts = [0, 0]
    try:
        if meanwhile is not None:  # the workers' messages wait in the queue meanwhile
            meanwhile()
        while done < tasks.count:
            try:
                message = result_queue.get(timeout=1.0)
            except queue.Empty:
                dead = [p for p in procs if p.exitcode not in (None, 0)]
                if dead:
                    raise RuntimeError(_died(bar.desc, dead[0].pid, dead[0].exitcode)) from None
                continue
            if message[0] == "progress":
                counts[0] += message[1]
                counts[1] += message[2]
                bar.set_postfix(dict(zip(tasks.counters, counts)), refresh=False)
            elif message[0] == "done":
                tasks.on_done(message[1], message[2])  # in this process: e.g. the object-store client does not survive fork
                done += 1
                bar.update(1)
            else:
                raise message[2]
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
        for p in procs:
            p.join(timeout=5)


def _died(desc: str, pid: int | None, code: int) -> str:
    how = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
    return (f"{desc}: worker process {pid} {how} (fn ended the process, or the system killed it, e.g. out of "
            "memory); the run stopped, rerun it once the cause is fixed")
