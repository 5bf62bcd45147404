"""Smoke test of `python -m bench`: a tiny corpus, our implementation and the memmap/tokenizer limits only."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.slow  # end to end, tens of seconds on 2 cores: `make test-all` / CI
@pytest.mark.timeout(180)
def test_bench_runs_end_to_end_on_a_tiny_corpus(tmp_path: Path) -> None:
    out = tmp_path / "results.json"
    cmd = [sys.executable, "-m", "bench", "--corpus-mb", "0.4", "--repeat", "1", "--vocab-size", "600",
           "--contestants", "ours,limit", "--only", "prepare,stream,integrity,resume", "--resume-at", "50",
           "--cache-dir", str(tmp_path / "cache"), "--results", str(out),
           "--docs-dir", str(tmp_path / "docs"), "--quiet"]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=420)  # a busy 2-core machine is slow, not wrong
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(out.read_text())
    assert set(res["scenarios"]) == {"prepare", "stream", "integrity", "resume"}
    tokens = res["config"]["tokens"]
    assert tokens > 50_000  # 0.4 MB of text with a 600-token BPE

    prep = {r["who"]: r for r in res["scenarios"]["prepare"]}
    assert set(prep) == {"ours", "limit"}
    for r in prep.values():
        assert "error" not in r, r.get("error")
        assert 0 < r["mb_per_s"]["median"] < 10_000

    stream = {(r["who"], r["case"]): r for r in res["scenarios"]["stream"]}
    assert set(stream) == {("ours", "0 workers"), ("ours", "2 workers"), ("ours", "2 workers, processes"),
                           ("limit", "0 workers")}
    assert all(run["worker_backend"] == "processes" for run in stream[("ours", "2 workers, processes")]["runs"])
    for r in stream.values():
        assert "error" not in r, r.get("error")
        assert r["tokens_per_s"]["median"] > 0
        assert 0 <= r["first_batch_s"]["median"] < 60
        assert 10 < r["peak_rss_mb"]["median"] < 16_000
        # every run delivered a whole epoch: all the blocks of the tokenized corpus
        assert all(run["tokens"] >= (tokens // 2049) * 2049 for run in r["runs"])

    (integ,) = res["scenarios"]["integrity"]
    assert integ["tokens_written"] == tokens
    assert integ["vs_reference"] == {"once": tokens // 2049, "twice_or_more": 0, "never": 0, "unknown": 0}
    assert 0 <= integ["tokens_lost"] < 2049

    resume = res["scenarios"]["resume"]
    assert {r["case"] for r in resume} == {"2->2 workers @50%", "2->0 workers @50%", "1->2 ranks @50%"}
    for r in resume:
        assert r["delivery"]["twice_or_more"] == 0 and r["delivery"]["never"] == 0, r["case"]
        assert r["state_bytes"] < 4096

    names = {t["name"] for t in res["targets"]}
    assert any(n.startswith("integrity: ours delivers every block") for n in names)
    assert (tmp_path / "docs" / "benchmarks.md").read_text().startswith("# Benchmarks")
    assert (tmp_path / "docs" / "benchmarks.png").stat().st_size > 1000
