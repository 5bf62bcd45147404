"""Every test id is the same in every process.

`make test` runs the suite with pytest-xdist (-n auto): each worker collects the whole suite itself and
the run stops at once ("Different tests were collected between gw1 and gw0") when two workers' lists
differ. An id built from the clock (gzip's header), randomness, hash() or set order, an address or a
temporary path differs between two processes; this test collects the suite in two fresh processes,
seconds apart and with different hash seeds, and compares every id.
"""

import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _collect(hash_seed: str) -> list[str]:
    # PYTEST_* (xdist's worker variables, a user's PYTEST_ADDOPTS) belong to the running session, not to
    # a fresh `pytest --collect-only`; addopts= keeps the one -q that prints one node id a line.
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env["PYTHONHASHSEED"] = hash_seed
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-o", "addopts=", "-p", "no:cacheprovider", "tests"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    return [line for line in result.stdout.splitlines() if "::" in line]


def test_two_processes_collect_the_same_test_ids() -> None:
    started = time.time()
    first = _collect("1")
    # At least a second apart, so that an id carrying the time (in seconds, as gzip's header does) differs.
    time.sleep(max(0.0, started + 1.5 - time.time()))
    second = _collect("2")
    assert len(first) > 1000, first[-20:]  # the whole suite, not an import error that collected nothing
    assert len(set(first)) == len(first)
    differ = sorted(set(first) ^ set(second))
    assert not differ, f"ids that differ between two processes: {differ[:10]}"
    assert first == second  # the same order too: xdist compares the lists
