"""Every script in examples/ runs to the end (each checks its own results) in a fresh interpreter."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.py"))
SLOW = {p.name for p in EXAMPLES} - {"quickstart.py"}  # ~10 s each in a fresh interpreter; CI runs them all


@pytest.mark.parametrize(
    "script", [pytest.param(p, id=p.name, marks=[pytest.mark.slow] if p.name in SLOW else []) for p in EXAMPLES]
)
def test_example_runs(script, tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]),
           "TMPDIR": str(tmp_path)}
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{script.name} failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    assert done.stdout.strip(), f"{script.name} printed nothing"


def test_examples_are_there():
    assert {p.name for p in EXAMPLES} >= {"quickstart.py", "append_overwrite.py", "pause_resume.py", "cache_limit.py",
                                          "combined.py", "read_litdata_folder.py", "subsample_split.py",
                                          "slicing_transforms.py", "profile_loader.py"}
