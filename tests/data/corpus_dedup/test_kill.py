"""kill -9 at every stage boundary, then a rerun in a fresh process: the same bytes, committed work not redone."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from llm.data import dedup_corpus
from llm.data.shards.format.manifest import Manifest
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
    # written by the driver while 2 workers write the kept records: they die with it (no orphan commits beside the rerun)
    ("removed-list", 2, "plan, scan 5/5, exact, bands 14/14, clusters"),
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


# Every kill point of the pipeline for the corpus of helpers.py (5 inputs, 14 bands at 0.8), in run order.
KILL_POINTS = ["plan", *(f"scan:{i}" for i in range(5)), "exact", *(f"band:{b}" for b in range(14)), "clusters",
               *(f"write:{i}" for i in range(5)), "removed-list", "report", "cleanup:plan", "cleanup:rename", "cleanup",
               "done"]
QUICK = ("write:2", "cleanup:plan", "cleanup:rename", "cleanup", "done")


def test_the_list_names_every_kill_point_in_the_code() -> None:
    # remote.py's points (an object store's output) are test_remote_kill.py's
    code = "".join(p.read_text() for p in (ROOT / "src" / "llm" / "data" / "corpus_dedup").glob("*.py") if p.name != "remote.py")
    named = re.findall(r'kill_point\(f?"([^"]+)"', code) + re.findall(r'_remove_tree\(\w+, "([^"]+)"\)', code)
    stems = {m.split("{")[0].rstrip(":") for m in named}
    assert stems == {p.split(":")[0] if p[-1].isdigit() else p for p in KILL_POINTS}


@pytest.mark.parametrize("point", [pytest.param(p, marks=() if p in QUICK else pytest.mark.slow) for p in KILL_POINTS])
def test_a_kill_at_any_point_then_the_same_command_ends_with_the_same_bytes(corpus, tmp_path: Path, point: str) -> None:
    folder, expected = corpus
    out = tmp_path / "out"
    first = _run(folder, out, 0, point)
    assert first.returncode == -9, first.stderr
    second = _run(folder, out, 0)
    assert second.returncode == 0, second.stderr
    assert tree(out) == expected
    hidden = sorted(p.name for p in out.iterdir() if p.name.startswith("."))
    assert hidden in ([".dedup-plan.json"], [".dedup-plan.json", ".llm-data.lock"])  # no work folder left
    third = _run(folder, out, 0)  # a finished run, run again: nothing to do, nothing changed
    assert third.returncode == 0 and "already holds this run's result" in third.stderr and tree(out) == expected


def test_a_finished_run_of_other_inputs_or_changed_inputs_is_refused(corpus, tmp_path: Path) -> None:
    folder, expected = corpus
    out = tmp_path / "out"
    copy = tmp_path / "copy"
    copy.mkdir()
    (copy / "a.jsonl").write_bytes((folder / "a.jsonl").read_bytes())
    dedup_corpus(str(copy), out, num_workers=0, progress=False)
    with pytest.raises(ValueError, match=r"holds a finished dedup run of other inputs or parameters; rerun it as it "
                                         r"was, or pass overwrite=True \(CLI: --overwrite\) to start over$"):
        dedup_corpus(str(copy), out, near=0.8, num_workers=0, progress=False)
    (copy / "a.jsonl").write_bytes((folder / "a.jsonl").read_bytes() + b'{"text": "more"}\n')
    with pytest.raises(ValueError, match=r"a.jsonl: input changed since the finished dedup run in .* read it"):
        dedup_corpus(str(copy), out, num_workers=0, progress=False)
    (out / "a.jsonl").unlink()
    (copy / "a.jsonl").write_bytes((folder / "a.jsonl").read_bytes())
    os.utime(copy / "a.jsonl", ns=(0, 0))
    assert dedup_corpus(str(copy), out, num_workers=0, progress=False, overwrite=True)["removed"] == 1
    (out / "a.jsonl").unlink()
    with pytest.raises(ValueError, match=r"holds a finished dedup run but a.jsonl is missing; pass overwrite=True"):
        dedup_corpus(str(copy), out, num_workers=0, progress=False)


def test_a_work_folder_without_its_plan_is_a_start_that_was_killed(corpus, tmp_path: Path) -> None:
    folder, expected = corpus
    out = tmp_path / "out"
    (out / ".dedup-work").mkdir(parents=True)
    (out / ".dedup-work" / ".plan.json.tmp-123-abcdef01").write_text('{"torn')
    assert _run(folder, out, 0).returncode == 0
    assert tree(out) == expected


OPTIMIZE = ["-m", "llm.cli.data", "optimize", "CORPUS", "--output", "OUT", "--dedup", "near=0.8", "--num-workers", "0",
            "--no-progress"]


def _optimize(corpus: Path, out: Path, kill_at: str | None = None, *extra: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT}"}
    env.pop("LLM_DEDUP_KILL_AT", None)
    if kill_at:
        env["LLM_DEDUP_KILL_AT"] = kill_at
    args = [str(corpus) if a == "CORPUS" else str(out) if a == "OUT" else a for a in OPTIMIZE]
    return subprocess.run([sys.executable, *args, *extra], env=env, capture_output=True, text=True, timeout=240)


@pytest.fixture(scope="module")
def optimized(corpus, tmp_path_factory) -> tuple[dict[str, bytes], str, int]:
    folder, _ = corpus
    ref = tmp_path_factory.mktemp("ref") / "ds"
    assert _optimize(folder, ref).returncode == 0
    manifest = Manifest.load(ref)
    return tree(Path(f"{ref}.dedup")), manifest.fingerprint(), manifest.total_documents


@pytest.mark.parametrize("point", ["done", pytest.param("cleanup", marks=pytest.mark.slow),
                                   pytest.param("scan:2", marks=pytest.mark.slow)])
def test_optimize_dedup_killed_then_the_same_command_finishes_without_a_flag(corpus, optimized, tmp_path: Path,
                                                                             point: str) -> None:
    folder, _ = corpus
    stage, fingerprint, documents = optimized
    out = tmp_path / "ds"
    assert _optimize(folder, out, point).returncode == -9
    again = _optimize(folder, out)
    assert again.returncode == 0, again.stderr
    assert tree(Path(f"{out}.dedup")) == stage
    manifest = Manifest.load(out)
    assert (manifest.fingerprint(), manifest.total_documents) == (fingerprint, documents)


def test_optimize_overwrite_is_mode_overwrite_and_append_replaces_the_stage(corpus, tmp_path: Path) -> None:
    from tests.cli.helpers import run_here

    folder, _ = corpus
    out = tmp_path / "ds"
    args = ["optimize", str(folder), "--output", str(out), "--dedup", "exact", "--num-workers", "0", "--no-progress"]
    assert run_here("llm-data", *args).returncode == 0
    again = run_here("llm-data", *args, "--overwrite")
    assert again.returncode == 0, again.stderr
    both = run_here("llm-data", *args, "--overwrite", "--mode", "append")
    assert both.returncode == 2 and both.stderr.splitlines() == [
        "llm-data: error: --overwrite replaces the dataset and --mode append adds to it; pass one of them"]
    more = tmp_path / "more.jsonl"
    more.write_text('{"text": "a new record"}\n{"text": "a new record"}\n')
    appended = run_here("llm-data", "optimize", str(more), "--output", str(out), "--dedup", "exact", "--mode", "append",
                        "--num-workers", "0", "--no-progress")
    assert appended.returncode == 0, appended.stderr
    assert Manifest.load(out).total_documents == 63 + 1
