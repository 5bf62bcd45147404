"""A resume rewrites `metrics.jsonl` (dropping records past its checkpoint): a kill or a full disk mid-way keeps the old file whole."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from llm.training.metrics import METRICS_FILE, RunMeter, read_metrics

ROOT = Path(__file__).resolve().parents[2]

# The resumed meter in a process whose files may not grow past `limit` bytes: the rewrite fails
# part way, as on a full disk. SIGXFSZ at its default kills the process there (a kill mid-write);
# ignored (Python's own setting), the write raises OSError (EFBIG) instead.
RESUME = """
import resource, signal, sys
from llm.training.metrics import RunMeter
folder, limit, kill = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "kill"
signal.signal(signal.SIGXFSZ, signal.SIG_DFL if kill else signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))
meter = RunMeter(folder, 150, 300)
meter.add_tokens(4096)  # its first step: the file is rewritten here
"""


def _history(folder: Path) -> bytes:
    """200 logged steps of a run, as its meter writes them."""
    meter = RunMeter(folder, 0, 300)
    for step in range(1, 201):
        meter.record(step, epoch=0, loss=1.0 / step, lr=3e-4, tokens=step * 4096, note="x" * 40)
    meter.close()
    return (folder / METRICS_FILE).read_bytes()


@pytest.mark.parametrize("how", ["kill", "error"])
def test_a_rewrite_cut_short_leaves_the_previous_file_whole(tmp_path: Path, how: str) -> None:
    before = _history(tmp_path)
    assert len(before) > 3 * 4096  # the kept part alone is larger than the limit below
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.run([sys.executable, "-c", RESUME, str(tmp_path), "4096", how], env=env,
                          capture_output=True, text=True, timeout=120)
    if how == "kill":
        assert proc.returncode == -signal.SIGXFSZ, proc.stderr
    else:
        assert proc.returncode == 1 and "OSError" in proc.stderr, proc.stderr
    assert (tmp_path / METRICS_FILE).read_bytes() == before
    # the next resume (no limit) ends as a resume that was never cut short, leaving no temporary file behind
    _first_step(RunMeter(tmp_path, 150, 300))
    records = read_metrics(tmp_path)
    assert [r["step"] for r in records] == [*range(1, 151), 150] and records[-1]["event"] == "resumed"
    assert sorted(p.name for p in tmp_path.iterdir()) == [METRICS_FILE]
    assert [json.loads(line)["step"] for line in before.decode().splitlines()[:150]] == list(range(1, 151))


def _first_step(meter: RunMeter) -> None:
    meter.add_tokens(4096)
    meter.close()


def test_a_run_that_fails_before_its_first_step_leaves_no_file_and_an_earlier_one_untouched(tmp_path: Path) -> None:
    fresh = tmp_path / "fresh"
    RunMeter(fresh, 0, 300).close()  # e.g. its first batch raised: fit() never finished a step
    assert not fresh.exists()
    before = _history(tmp_path)
    for start in (0, 150):  # a fresh run over an earlier one's folder, and a resume
        RunMeter(tmp_path, start, 300).close()
        assert (tmp_path / METRICS_FILE).read_bytes() == before
    _first_step(RunMeter(tmp_path, 0, 300))  # once a step has finished, a fresh run starts the file over
    assert (tmp_path / METRICS_FILE).read_bytes() == b""
