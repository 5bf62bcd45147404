"""Corpus dedup end to end on every input kind: what is removed, what is kept (unchanged, in order), the report."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import llm.data
from llm.cli.data import main as data_main
from llm.data import dedup_corpus
from llm.data.shards.format.manifest import Manifest
from tests.data.corpus_dedup.helpers import tree, write_corpus


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("corpus")
    write_corpus(folder)
    return folder


def _removed(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "dedup-removed.jsonl").read_text().splitlines()]


def test_near_dedup_removes_the_planted_copies_and_keeps_records_unchanged_in_order(corpus: Path, tmp_path: Path) -> None:
    report = dedup_corpus([str(corpus)], tmp_path / "out", near=0.8, num_workers=0, progress=False)
    out = tmp_path / "out"
    removed = {(Path(r["file"]).name, r["line"]): r for r in _removed(out)}
    # a.jsonl line 8 is blank; the exact copy (record 13) is line 14, the near copy (record 21) line 22
    assert removed[("a.jsonl", 14)]["reason"] == "exact" and removed[("a.jsonl", 14)]["duplicate_of"]["line"] == 4
    assert removed[("a.jsonl", 22)]["reason"] == "near" and removed[("a.jsonl", 22)]["duplicate_of"]["line"] == 6
    assert 0.8 <= removed[("a.jsonl", 22)]["similarity"] < 1
    assert removed[("b.jsonl.zst", 21)]["reason"] == "exact"
    assert removed[("b.jsonl.zst", 22)]["reason"] == "near"  # a short tail added
    assert removed[("c.txt", 3)]["duplicate_of"] == {"file": str(corpus / "a.jsonl"), "line": 1}
    assert removed[("d.parquet", 3)]["reason"] == "near"
    assert len(removed) == 6
    assert report["records_in"] == 32 + 22 + 4 + 3 + 5 and report["removed"] == 6
    assert report["kept"] == report["records_in"] - 6
    assert (report["exact_duplicates"], report["near_duplicates"], report["near_duplicate_clusters"]) == (3, 3, 3)
    assert report["parameters"]["near"] == 0.8 and report["parameters"]["bands"] * report["parameters"]["rows"] <= 128
    # kept JSON Lines records are the input's bytes, in input order; other kinds become JSON objects
    source = [line for line in (corpus / "a.jsonl").read_text().splitlines() if line]
    kept = (out / "a.jsonl").read_text().splitlines()
    assert kept == [line for i, line in enumerate(source) if i not in (12, 20)]
    assert json.loads((out / "sub" / "c.jsonl").read_text().splitlines()[2]) == {
        "text": (corpus / "sub" / "c.txt").read_text().splitlines()[3]}
    assert [json.loads(r)["score"] for r in (out / "sub" / "d.jsonl").read_text().splitlines()] == [1.5, 2.5]
    assert sorted(tree(out)) == [".dedup-plan.json", "a.jsonl", "b.jsonl", "dedup-removed.jsonl", "dedup.json", "e.jsonl",
                                 "sub/c.jsonl", "sub/d.jsonl"]  # the plan stays, hidden: a rerun finds the run finished
    assert json.loads((out / "dedup.json").read_text()) == report
    assert not (out / ".dedup-work").exists()


def test_exact_only_removes_exact_copies_only(corpus: Path, tmp_path: Path) -> None:
    report = dedup_corpus(str(corpus), tmp_path / "out", num_workers=0, progress=False)
    assert (report["exact_duplicates"], report["near_duplicates"], report["removed"]) == (3, 0, 3)
    assert "num_perm" not in report["parameters"] and report["candidate_pairs"] == 0
    assert {r["reason"] for r in _removed(tmp_path / "out")} == {"exact"}


def test_worker_processes_and_chunk_sizes_do_not_change_a_byte(corpus: Path, tmp_path: Path) -> None:
    dedup_corpus([str(corpus)], tmp_path / "one", near=0.8, num_workers=0, progress=False)
    dedup_corpus([str(corpus)], tmp_path / "two", near=0.8, num_workers=2, progress=False, chunk_records=7)
    one, two = tree(tmp_path / "one"), tree(tmp_path / "two")
    assert json.loads(one.pop(".dedup-plan.json"))["parameters"]["chunk_records"] == 50_000
    assert json.loads(two.pop(".dedup-plan.json"))["parameters"]["chunk_records"] == 7
    report = json.loads(two.pop("dedup.json"))
    assert report["parameters"].pop("chunk_records") == 7
    mine = json.loads(one.pop("dedup.json"))
    mine["parameters"].pop("chunk_records")
    assert one == two and mine == report


def test_the_output_feeds_optimize_and_optimize_dedup_runs_it_first(corpus: Path, tmp_path: Path) -> None:
    from llm.data.inputs.listing import expand_inputs

    dedup_corpus([str(corpus)], tmp_path / "clean", near=0.8, num_workers=0, progress=False)
    listed = [p.name for p in expand_inputs([str(tmp_path / "clean")])]
    assert listed == ["a.jsonl", "b.jsonl", "e.jsonl", "c.jsonl", "d.jsonl"]  # not the report files
    assert data_main(["optimize", str(corpus), "--output", str(tmp_path / "ds"), "--dedup", "near=0.8",
                      "--no-progress", "--num-workers", "0"]) == 0
    assert json.loads((tmp_path / "ds.dedup" / "dedup.json").read_text())["removed"] == 6
    assert Manifest.load(tmp_path / "ds").total_documents == 60


def test_llm_data_dedup_cli_and_python_name(corpus: Path, tmp_path: Path, capsys) -> None:
    assert llm.data.dedup_corpus is dedup_corpus and "dedup_corpus" in dir(llm.data)
    from llm.data.dedup import DedupTextSource  # the guide's module is still there

    assert DedupTextSource
    assert data_main(["dedup", str(corpus), "--output", str(tmp_path / "o"), "--near", "0.8", "--num-workers", "0",
                      "--no-progress"]) == 0
    assert "66 records in, 60 kept, 6 removed (3 exact, 3 near at >= 0.8 in 3 clusters)" in capsys.readouterr().err


def test_a_kept_line_with_invalid_utf8_is_written_as_it_was_read(tmp_path: Path) -> None:
    src = tmp_path / "in.jsonl"
    src.write_bytes(b'{"text": "caf\xe9 au lait", "k": 1}\r\n{"text": "plain", "k": 2}\n{"text": "plain", "k": 3}\n')
    report = dedup_corpus(str(src), tmp_path / "out", num_workers=0, progress=False)
    assert report["removed"] == 1
    lines = (tmp_path / "out" / "in.jsonl").read_bytes().splitlines()
    assert [json.loads(x) for x in lines] == [{"text": "caf\ufffd au lait", "k": 1}, {"text": "plain", "k": 2}]
    assert lines[1] == b'{"text": "plain", "k": 2}'  # a valid line: its bytes, unchanged


def test_the_scan_says_which_inputs_are_valid_utf8_and_the_write_checks_the_others(tmp_path: Path) -> None:
    """meta.json's `utf8` lets the write stage copy an input's kept lines unchecked: false as soon as one record
    was read with a replacement (that input's lines are then checked and repaired), true otherwise."""
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "bad.jsonl").write_bytes(b'{"text": "caf\xe9 au lait"}\n{"text": "plain one"}\n')
    (tmp_path / "in" / "good.jsonl").write_bytes('{"text": "café crème"}\n\n{"text": "plain two"}\n'.encode())
    dedup_corpus(str(tmp_path / "in"), tmp_path / "out", near=0.8, num_workers=2, progress=False, keep_work=True)
    metas = [json.loads((tmp_path / "out" / ".dedup-work" / "scan" / f"{i:05d}" / "meta.json").read_text())
             for i in range(2)]
    assert [m["utf8"] for m in metas] == [False, True]
    assert (tmp_path / "out" / "bad.jsonl").read_bytes() == '{"text": "caf\ufffd au lait"}\n{"text": "plain one"}\n'.encode()
    assert (tmp_path / "out" / "good.jsonl").read_bytes() == '{"text": "café crème"}\n{"text": "plain two"}\n'.encode()


KILLED_IN_MEANWHILE = """
import os, signal, sys, time
from pathlib import Path

from llm.data.jobs.local import run_local
from llm.data.jobs.tasks import Tasks

class Bar:
    desc = "test"
    def update(self, n): pass
    def set_postfix(self, *a, **k): pass

def work(task_id, report):
    time.sleep(0.5)  # the parent is gone by now
    (Path(sys.argv[1]) / f"task-{task_id}").write_text("committed")

def meanwhile():
    (Path(sys.argv[1]) / "meanwhile").write_text("ran")
    os.kill(os.getpid(), signal.SIGKILL)

run_local(Tasks(work=work, count=4, on_done=lambda i, r: None, unit="task", counters=("records",)), 2, Bar(), meanwhile)
"""


def test_workers_die_with_a_driver_killed_during_its_meanwhile_work(tmp_path: Path) -> None:
    """run_local's `meanwhile` runs in the driver beside its workers: a driver killed there (a crash, a test's kill
    point) takes them along, where they would go on committing tasks beside a rerun."""
    import subprocess
    import sys
    import time

    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3] / "src")}
    run = subprocess.run([sys.executable, "-c", KILLED_IN_MEANWHILE, str(tmp_path)], env=env, timeout=60)
    assert run.returncode == -9
    time.sleep(1.5)  # what a surviving worker would need to commit its tasks
    assert sorted(p.name for p in tmp_path.iterdir()) == ["meanwhile"]
