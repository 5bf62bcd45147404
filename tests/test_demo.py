"""The README's demo command keeps working (on a small corpus)."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.slow  # end to end, tens of seconds on 2 cores: `make test-all` / CI
def test_demo_runs_and_checks_exactly_once(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "llm.demo", "--out", "demo_out", "--corpus-mb", "0.5"],  # relative, as in `make demo`
        capture_output=True, text=True, timeout=600, cwd=tmp_path,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "every block exactly once: yes" in result.stdout
    assert "step 10/10" in result.stdout, "the guide's resumed run continues from step 5"
    assert (tmp_path / "demo_out" / "guide" / "checkpoints" / "optimized_demo" / "latest").exists()
    run = tmp_path / "demo_out" / "guide" / "checkpoints" / "demo"
    assert "   'sample line" in result.stdout, "the demo shows text the model wrote"
    assert "audit: OK, every sample exactly once" in result.stdout, "the demo ends by proving its run from the ledger"
    summary = result.stdout[result.stdout.index("demo: done."):]
    assert str(tmp_path / "demo_out" / "dataset") in summary and str(run / "metrics.jsonl") in summary
    assert (run / "metrics.jsonl").is_file()
    if (run / "metrics.png").exists():
        assert str(run / "metrics.png") in summary
    next_steps = summary[summary.index("demo: try next:"):].splitlines()[1:]
    assert len(next_steps) == 4 and "--checkpoint" in next_steps[3] and "llm-generate" in next_steps[3]
    assert "llm-train" in next_steps[2] and f"why {run} --step 7" in next_steps[2]  # the walk in proving-a-run.md
