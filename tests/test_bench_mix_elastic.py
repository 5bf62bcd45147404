"""bench/mix_elastic.py: its committed run meets its goals and its table is the one in docs/benchmarks.md."""

from __future__ import annotations

from pathlib import Path

from bench import mix_elastic

ROOT = Path(__file__).resolve().parent.parent


def test_the_latest_run_meets_its_goals_and_is_the_documented_table() -> None:
    res = mix_elastic.latest()
    assert res is not None and res["baseline"] == "main" and res["repeat"] >= 3
    assert all(r["max_error"] <= 0.01 for r in res["ramp"]) and {r["batching"] for r in res["ramp"]} == {
        "stratified", "per_batch"}
    ratios = [r["ratio"]["median"] for r in res["throughput"] if "ratio" in r]
    assert len(ratios) == 2 and all(r >= 0.9 for r in ratios)  # no regression beyond noise
    assert "\n".join(mix_elastic.markdown(res)) in (ROOT / "docs" / "benchmarks.md").read_text()
