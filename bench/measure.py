"""Run one scenario in its own subprocess and measure it: result JSON + peak RSS of the whole process tree."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil

RESULT_PREFIX = "BENCH_RESULT "
REPO_ROOT = Path(__file__).resolve().parent.parent


def _tree(root: psutil.Process) -> list[psutil.Process]:
    """A process and all its descendants (a scan of every process on the machine: ~1 ms)."""
    try:
        return [root, *root.children(recursive=True)]
    except psutil.Error:
        return []


def _tree_sum(procs: list[psutil.Process], proc_file: str, keys: tuple[str, ...]) -> list[int]:
    """Each kB field `keys` of /proc/PID/`proc_file`, summed over `procs`, in bytes."""
    totals = [0] * len(keys)
    for p in procs:
        try:
            with open(f"/proc/{p.pid}/{proc_file}") as f:
                for line in f:
                    for i, key in enumerate(keys):
                        if line.startswith(key):
                            totals[i] += int(line.split()[1]) * 1024
        except (OSError, ValueError):  # the process ended while we read
            continue
    return totals


def _tree_pss(procs: list[psutil.Process]) -> int:
    """Sum of PSS over the tree: shared pages (torch's libraries in forked workers) counted once."""
    return _tree_sum(procs, "smaps_rollup", ("Pss:",))[0]


def _tree_memory(procs: list[psutil.Process]) -> tuple[int, int]:
    """(sum of RSS, sum of anonymous RSS) over the tree, in bytes."""
    # /proc/PID/status is cheap to read (unlike smaps), so we can sample every few ms.
    rss, anon = _tree_sum(procs, "status", ("VmRSS:", "RssAnon:"))
    return rss, anon


class _Sampler(threading.Thread):
    """Peak memory of a process tree, sampled while it runs, spending about 2% of one core.

    Why the budget: on a 2-core machine the sampler competes with what it measures. Reading
    smaps_rollup (PSS) walks a process's page tables, ~20 ms of CPU for a process with torch loaded,
    and scanning for new children reads every process on the machine; at a fixed 50 Hz the sampler
    took 13% of a core. RSS (/proc/PID/status) is read every `every_s`; the tree is listed again
    every 10 ticks, and PSS is read again once 100 times its last cost has passed (its peak is the
    coarser of the three on a short run)."""

    def __init__(self, pid: int, every_s: float = 0.02) -> None:
        super().__init__(daemon=True)
        self.proc = psutil.Process(pid)
        self.every_s = every_s
        self.peak_rss = self.peak_anon = self.peak_pss = 0
        self._stop_evt = threading.Event()

    def run(self) -> None:
        tick, procs, next_pss = 0, _tree(self.proc), 0.0
        while not self._stop_evt.is_set():
            if tick % 10 == 0:
                procs = _tree(self.proc)
            rss, anon = _tree_memory(procs)
            self.peak_rss = max(self.peak_rss, rss)
            self.peak_anon = max(self.peak_anon, anon)
            if time.perf_counter() >= next_pss:
                t = time.thread_time()
                self.peak_pss = max(self.peak_pss, _tree_pss(procs))
                next_pss = time.perf_counter() + max(0.2, 100 * (time.thread_time() - t))
            tick += 1
            self._stop_evt.wait(self.every_s)

    def stop(self) -> None:
        self._stop_evt.set()
        self.join()


def run_worker(python: str, spec: dict, timeout_s: float = 1800.0, env: dict | None = None,
               wrap: list[str] | None = None) -> dict:
    """Run `python -m bench.worker SPEC`; return its result plus peak RSS/PSS/anon MB, wall_s, cpu_s.

    cpu_s is the user+system time of the whole process tree (every descendant is reaped by its
    parent, so RUSAGE_CHILDREN covers it): less sensitive than wall time to a busy machine.

    Failures come back as {"error": "..."} instead of raising, so one broken peer never stops the run.
    """
    out, err, code, measured = run_command([*(wrap or []), python, "-m", "bench.worker", json.dumps(spec)],
                                           timeout_s, env)
    result: dict | None = None
    for line in out.splitlines():
        if line.startswith(RESULT_PREFIX):
            result = json.loads(line[len(RESULT_PREFIX):])
    if result is None:
        tail = "\n".join((err or out).strip().splitlines()[-6:])
        result = {"error": f"exit {code}: {tail}"}
    result.update(measured)
    return result


def run_command(cmd: list[str], timeout_s: float = 1800.0, env: dict | None = None) -> tuple[str, str, int, dict]:
    """Run cmd from the repository root, sampling its process tree: (stdout, stderr, exit code, measures).

    The measures are peak RSS / anonymous RSS / PSS of the tree in MB, wall_s (from just before
    the process starts to its exit: interpreter start, imports and process pools included) and
    cpu_s (user+system of the whole tree).
    """
    full_env = dict(os.environ)
    full_env["PYTHONPATH"] = str(REPO_ROOT) + os.pathsep + full_env.get("PYTHONPATH", "")
    full_env.setdefault("TOKENIZERS_PARALLELISM", "false")
    full_env.setdefault("PYTHONUNBUFFERED", "1")
    if env:
        full_env.update(env)
    ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=REPO_ROOT, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    sampler = _Sampler(proc.pid)
    sampler.start()
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        for child in psutil.Process(proc.pid).children(recursive=True):
            child.kill()
        proc.kill()
        out, err = proc.communicate()
        err = f"timed out after {timeout_s:.0f} s\n" + err
    finally:
        sampler.stop()
    wall = time.perf_counter() - t0
    ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
    measured = {"peak_rss_mb": sampler.peak_rss / 2**20, "peak_anon_mb": sampler.peak_anon / 2**20,
                "peak_pss_mb": sampler.peak_pss / 2**20, "wall_s": wall, "cpu_s": cpu}
    return out, err, proc.returncode, measured


def emit(result: dict) -> None:
    """Print a worker's result where run_worker will find it."""
    sys.stdout.write(RESULT_PREFIX + json.dumps(result) + "\n")
    sys.stdout.flush()
