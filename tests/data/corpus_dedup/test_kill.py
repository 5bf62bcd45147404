"""kill -9 at every stage boundary, then a rerun in a fresh process: the same bytes, committed work not redone."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from llm.data import dedup_corpus
from tests.data.corpus_dedup.helpers import tree, write_corpus

ROOT = Path(__file__).resolve().parents[3]
RUN = "import sys; from llm.data import dedup_corpus; dedup_corpus(sys.argv[1], sys.argv[2], near=0.8, num_workers=int(sys.argv[3]), progress=False, chunk_records=16)"


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> tuple[Path, dict[str, bytes]]:
    folder = tmp_path_factory.mktemp("corpus")
    write_corpus(folder)
    clean = tmp_path_factory.mktemp("clean") / "out"
    dedup_corpus(str(folder), clean, near=0.8, num_workers=0, progress=False, chunk_records=16)
    return folder, tree(clean)


def _run(corpus: Path, out: Path, workers: int, kill_at: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT}"}
    env.pop("LLM_DEDUP_KILL_AT", None)
    if kill_at:
        env["LLM_DEDUP_KILL_AT"] = kill_at
    return subprocess.run([sys.executable, "-c", RUN, str(corpus), str(out), str(workers)], env=env,
                          capture_output=True, text=True, timeout=120)


def _killed_then_rerun(corpus: Path, out: Path, point: str, workers: int, resumed: str) -> None:
    first = _run(corpus, out, workers, point)
    assert first.returncode == -9, first.stderr  # a real SIGKILL, not an exception
    assert (out / ".dedup-work" / "plan.json").is_file()
    second = _run(corpus, out, workers)
    assert second.returncode == 0, second.stderr
    assert f"already committed: {resumed}" in second.stderr


def test_killed_in_the_band_stage_and_rerun_gives_the_same_bytes(corpus, tmp_path: Path) -> None:
    folder, expected = corpus
    _killed_then_rerun(folder, tmp_path / "out", "band:5", 0, "plan, scan 5/5, exact, bands 6/14")
    assert tree(tmp_path / "out") == expected


@pytest.mark.slow
@pytest.mark.parametrize(("point", "workers", "resumed"), [
    ("plan", 0, "plan"),
    ("scan:1", 0, "plan, scan 2/5"),
    ("exact", 2, "plan, scan 5/5, exact"),
    ("clusters", 2, "plan, scan 5/5, exact, bands 14/14, clusters"),
    ("write:2", 0, "plan, scan 5/5, exact, bands 14/14, clusters, write 3/5"),
    ("report", 0, "plan, everything"),
])
def test_killed_at_each_stage_boundary_and_rerun_gives_the_same_bytes(corpus, tmp_path: Path, point, workers, resumed) -> None:
    folder, expected = corpus
    _killed_then_rerun(folder, tmp_path / "out", point, workers, resumed)
    assert tree(tmp_path / "out") == expected


@pytest.mark.slow
def test_a_killed_worker_fails_the_run_and_a_rerun_keeps_what_other_workers_committed(corpus, tmp_path: Path) -> None:
    folder, expected = corpus
    out = tmp_path / "out"
    first = _run(folder, out, 2, "scan:3")  # the worker that scanned input 3 dies right after committing it
    assert first.returncode == 1 and "was killed by signal 9" in first.stderr
    scanned = {p.name: p.stat().st_mtime_ns for p in (out / ".dedup-work" / "scan").iterdir() if not p.name.startswith(".")}
    assert "00003" in scanned
    # a second kill later on: what the first run committed is still the same files (not redone)
    second = _run(folder, out, 0, "clusters")
    assert second.returncode == -9
    assert {p.name: p.stat().st_mtime_ns for p in (out / ".dedup-work" / "scan").iterdir()} == scanned
    assert _run(folder, out, 0).returncode == 0
    assert tree(out) == expected
