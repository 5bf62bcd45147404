"""metrics.jsonl stays strict JSON, a resume is marked, and the plot says when a panel has no data."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llm.training.metrics import METRICS_FILE, RunMeter, read_metrics
from llm.training.plot import plot_run, resume_steps


def _run(folder: Path, start: int, stop: int, loss: float = 1.0) -> None:
    meter = RunMeter(folder, start, stop)
    for step in range(start + 1, stop + 1):
        meter.add_tokens(100)
        meter.record(step, loss=loss, **meter.window(step))
    meter.close()


def test_a_nan_loss_is_written_as_null_and_every_line_is_strict_json(tmp_path: Path) -> None:
    _run(tmp_path, 0, 3, loss=float("nan"))
    lines = (tmp_path / METRICS_FILE).read_text().splitlines()
    assert len(lines) == 3
    for line in lines:
        record = json.loads(line, parse_constant=lambda c: pytest.fail(f"bare {c} in metrics.jsonl"))
        assert record["loss"] is None


def test_a_resumed_run_is_marked_where_its_run_average_starts_over(tmp_path: Path) -> None:
    _run(tmp_path, 0, 6)
    _run(tmp_path, 4, 8)  # resumed from the step-4 checkpoint: steps 5-6 are rewritten
    records = read_metrics(tmp_path)
    assert resume_steps(records) == [4]
    assert [r["step"] for r in records if "loss" in r] == [1, 2, 3, 4, 5, 6, 7, 8]


def test_plot_draws_resumes_and_says_when_a_panel_has_no_data(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib", reason="the plot needs matplotlib (the dev extra installs it)")
    _run(tmp_path, 0, 4, loss=float("nan"))  # no finite loss at all: the loss panel has no data
    _run(tmp_path, 2, 5, loss=float("nan"))
    out = plot_run(tmp_path)
    assert out.is_file() and out.stat().st_size > 1000
    texts = _drawn_texts(tmp_path)  # re-drawn, keeping the figure to read its texts
    assert "no data logged for this panel" in texts  # the loss panel: every loss was NaN
    assert "resumed" in texts


def _drawn_texts(run: Path) -> list[str]:
    """The texts and line labels of the figure `plot_run` draws."""
    import matplotlib.figure

    texts: list[str] = []
    original = matplotlib.figure.Figure.savefig

    def keep(self, *args, **kwargs):
        texts.extend(t.get_text() for ax in self.axes for t in ax.texts)
        texts.extend(str(line.get_label()) for ax in self.axes for line in ax.lines)
        return original(self, *args, **kwargs)

    matplotlib.figure.Figure.savefig = keep
    try:
        plot_run(run)
    finally:
        matplotlib.figure.Figure.savefig = original
    return texts


def test_ingest_panels_draw_wait_percentiles_and_remote_reads(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib", reason="the plot needs matplotlib (the dev extra installs it)")
    meter = RunMeter(tmp_path, 0, 4)
    for step in range(1, 5):
        meter.waited(0.001 * step, tokens=128)
        meter.add_tokens(128)
        stats = meter.window(step)
        meter.record(step, **{**stats, "loss": 1.0, "remote_bytes": 1_000_000 * step, "cache_hits": step, "cache_misses": 1})
    meter.close()
    record = read_metrics(tmp_path)[-1]
    assert record["data_wait_p50_ms"] == pytest.approx(4.0, rel=0.06) and record["data_batches_per_s"] > 0
    texts = _drawn_texts(tmp_path)
    assert {"p50", "p95", "p99", "MB downloaded", "cache hit rate"} <= set(texts)
    assert "no data logged for this panel" not in texts


def test_ranks_windows_merge_into_all_ranks_percentiles_and_the_slowest_ranks_p99() -> None:
    from llm.training.ingest_metrics import SLOWEST_RANK_KEY, IngestMeter

    ranks = [IngestMeter(), IngestMeter()]
    for wait in range(1, 101):
        ranks[0].batch(wait / 1e6, tokens=10)  # 1-100 us
        ranks[1].batch(wait / 1e3, tokens=10)  # 1-100 ms: the slow rank
    other = ranks[1]._window.summary({})
    merged = IngestMeter(gather=lambda mine: [mine, {**other, "remote_seen": False}])
    merged._window = ranks[0]._window
    figures = merged.window()
    assert figures[SLOWEST_RANK_KEY] == pytest.approx(99, rel=0.06)
    assert figures["data_wait_p50_ms"] == pytest.approx(0.1, rel=0.06)  # the 100th of 200 waits: rank 0's largest
    assert figures["data_wait_p99_ms"] == pytest.approx(98, rel=0.06)
    assert "remote_bytes" not in figures


def test_a_local_run_says_its_remote_panel_has_no_data(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib", reason="the plot needs matplotlib (the dev extra installs it)")
    from llm.data.ingest_stats import PROCESS_REMOTE

    PROCESS_REMOTE.add("remote_bytes", 10)  # remote reads of earlier work in this process are not this run's
    meter = RunMeter(tmp_path, 0, 3)
    for step in range(1, 4):
        meter.waited(0.002, tokens=64)
        meter.record(step, loss=1.0, **meter.window(step))
    meter.close()
    texts = _drawn_texts(tmp_path)
    assert texts.count("no data logged for this panel") == 1 and "p99" in texts


def test_plot_of_a_run_with_no_logged_step_is_one_sentence(tmp_path: Path) -> None:
    (tmp_path / METRICS_FILE).write_text("")
    with pytest.raises(ValueError, match="holds no logged step yet"):
        plot_run(tmp_path)
