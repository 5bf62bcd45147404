"""`python -m bench --quick`: the small bench runs the scenarios it claims, with the settings it claims."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench import cli, suite

REPO = Path(__file__).resolve().parent.parent


def test_quick_sets_the_small_bench_and_leaves_the_docs_alone() -> None:
    args = cli.parse_args(["--quick"])
    assert (args.corpus_mb, args.repeat, args.resume_at, args.min_stream_tokens) == (4.0, 1, "50", 2e7)
    assert args.only.split(",") == ["prepare", "stream", "integrity", "resume", "onthefly"]
    assert args.no_docs  # a 4 MB run must not overwrite the figures of the full run
    full = cli.parse_args([])
    assert (full.corpus_mb, full.repeat, full.resume_at, full.only, full.no_docs) == (200.0, 3, "10,50,90", "", False)


def test_flags_given_with_quick_win() -> None:
    args = cli.parse_args(["--quick", "--repeat", "3", "--only", "stream", "--docs-dir", "/tmp/d"])
    assert (args.repeat, args.only, args.corpus_mb, args.no_docs) == (3, "stream", 4.0, False)


def test_quick_covers_every_scenario_the_readme_table_reads() -> None:
    import inspect

    from bench import readme

    quick = set(cli.QUICK["only"].split(","))
    assert quick <= set(suite.SCENARIOS) and not quick & set(suite.OPT_IN)
    read = {name for name in suite.SCENARIOS if f'"{name}"' in inspect.getsource(readme.table)}
    assert read and read <= quick, read - quick


@pytest.mark.slow  # end to end on a tiny corpus: a minute or two on 2 cores
@pytest.mark.timeout(480)
def test_quick_runs_the_scenarios_it_claims(tmp_path: Path) -> None:
    out = tmp_path / "results.json"
    cmd = [sys.executable, "-m", "bench", "--quick", "--corpus-mb", "0.4", "--vocab-size", "600",
           "--contestants", "ours,limit", "--onthefly-cuts", "as-is", "--cache-dir", str(tmp_path / "cache"),
           "--results", str(out), "--quiet"]
    docs = [REPO / "docs" / "benchmarks.md", REPO / "README.md"]
    before = [p.read_bytes() for p in docs]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=420)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(out.read_text())
    assert list(res["scenarios"]) == cli.QUICK["only"].split(",")
    assert res["config"]["repeat"] == 1 and res["config"]["resume_at"] == [50]
    for name, rows in res["scenarios"].items():
        assert rows and not [r for r in rows if "error" in r], (name, rows)
        assert all(len(r["runs"]) == 1 for r in rows if "runs" in r), name
    assert {r["case"] for r in res["scenarios"]["resume"]} == {"2->2 workers @50%", "2->0 workers @50%",
                                                               "1->2 ranks @50%"}
    assert {r["case"] for r in res["scenarios"]["onthefly"]} == {"2 workers", "2 processes"}  # ours, the limit
    assert "# Benchmarks" in proc.stdout  # the report is printed, and the full run's figures are kept
    assert [p.read_bytes() for p in docs] == before
