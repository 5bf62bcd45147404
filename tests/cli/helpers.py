"""Run the `llm-*` commands as a user does: a fresh `python -m` process, its exit code and its lines (`run_here`: the same, in process)."""

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


def run_here(command: str, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """`command` as `run` gives it, but its main() called in this process (what the console script calls): for
    checks of how arguments are read, where a fresh interpreter adds only its start-up (~0.3 s a call)."""
    import contextlib
    import importlib
    import io
    from unittest import mock

    main = importlib.import_module(MODULES[command]).main
    out, err = io.StringIO(), io.StringIO()
    width = {"COLUMNS": "80"}  # argparse wraps help at the width a piped subprocess gets (shutil's fallback)
    with contextlib.chdir(cwd or "."), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), \
            mock.patch.dict(os.environ, width):
        try:
            code = main(list(args))
        except SystemExit as e:  # argparse's own errors and --help
            code = e.code
    return subprocess.CompletedProcess([command, *args], code, out.getvalue(), err.getvalue())
