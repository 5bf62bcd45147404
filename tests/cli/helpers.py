"""Run the `llm-*` commands as a user does: a fresh `python -m` process, its exit code and its lines."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

MODULES = {
    "llm-data": "llm.cli.data",
    "llm-train": "llm.cli.train",
    "llm-generate": "llm.cli.generate",
}


def run(command: str, *args: str, cwd: Path, timeout: int = 240) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "-m", MODULES[command], *args], cwd=cwd, env=env, capture_output=True, text=True,
        timeout=timeout,
    )


def first_error(proc: subprocess.CompletedProcess) -> str:
    """The first stderr line of a failed command (never a traceback)."""
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.stderr.splitlines()[0]
