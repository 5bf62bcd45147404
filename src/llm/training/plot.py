"""`llm-train plot RUN_DIR`: a PNG of a run's loss, throughput and ingest curves (and a mixture's token shares), from its metrics.jsonl."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from llm.training.cli_help import HelpFormatter
from llm.training.ingest_metrics import draw_remote_panel, draw_wait_panel, series
from llm.training.metrics import METRICS_FILE, RESUMED, read_metrics
from llm.training.source_metrics import KEY, draw_shares

EPILOG = """examples:
  llm-train plot checkpoints/demo                    # writes checkpoints/demo/metrics.png
  llm-train plot checkpoints/demo --output run.png

RUN_DIR is a run's checkpoint.checkpoint_dir: llm-train writes metrics.jsonl there.
Needs matplotlib (pip install matplotlib, or the [dev] extra)."""


def resume_steps(records: list[dict[str, Any]]) -> list[int]:
    """Steps at which a resumed run started (its run average of tokens/s starts over there)."""
    return sorted({r["step"] for r in records if r.get("event") == RESUMED})


def _mark_resumes(ax: Any, records: list[dict[str, Any]]) -> None:
    for i, step in enumerate(resume_steps(records)):
        ax.axvline(step, color="grey", linestyle=":", label="resumed" if i == 0 else None)


def _no_data(ax: Any) -> None:
    ax.text(0.5, 0.5, "no data logged for this panel", ha="center", va="center", transform=ax.transAxes, color="grey")


def plot_run(run_dir: str | Path, output: str | Path | None = None) -> Path:
    """Draw loss (and val loss), tokens/s, data-wait percentiles and remote reads against step; return the PNG's path."""
    run = Path(run_dir)
    if run.is_file():
        raise ValueError(f"RUN_DIR {run_dir} is a file, not a folder; pass the run's checkpoint_dir")
    if not run.is_dir():
        raise ValueError(f"RUN_DIR {run_dir} does not exist; pass the run's checkpoint.checkpoint_dir")
    if not (run / METRICS_FILE).is_file():
        raise ValueError(f"{run_dir} holds no {METRICS_FILE}; is it the checkpoint_dir of a run by llm-train?")
    records = read_metrics(run)
    steps, loss = series(records, "loss")
    if not any("event" not in r for r in records):
        raise ValueError(f"{run / METRICS_FILE} holds no logged step yet")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ValueError("plotting needs matplotlib: pip install matplotlib (or pip install -e '.[dev]')") from None
    mixture = any(isinstance(r.get(KEY), dict) for r in records)  # one more panel: each source's token share
    panels = 5 if mixture else 4
    fig, axes = plt.subplots(panels, 1, figsize=(8, 3 * panels), sharex=True)
    ax_loss, ax_speed, ax_wait, ax_remote = axes[:4]
    if mixture:
        draw_shares(axes[4], records)
    if steps:
        ax_loss.plot(steps, loss, label="train loss")
    val_steps, val = series(records, "val_loss")
    if val_steps:
        ax_loss.plot(val_steps, val, "o-", label="val loss")
    ax_loss.set_ylabel("loss")
    ax_loss.set_title(f"{run.resolve().name}: {max(r['step'] for r in records)} steps")
    for key, label, style in (("tokens_per_s_window", "since previous log", "-"), ("tokens_per_s", "run average", "--")):
        s, v = series(records, key)
        if s:
            ax_speed.plot(s, v, style, label=label)
    ax_speed.set_ylabel("tokens/s")
    draw_wait_panel(ax_wait, records)
    draw_remote_panel(ax_remote, records)
    axes[-1].set_xlabel("step")
    for ax in (ax_loss, ax_speed, ax_wait, ax_remote):
        ax.grid(alpha=0.3)
        has_data = bool(ax.lines)
        _mark_resumes(ax, records)
        if not has_data:
            _no_data(ax)
        if ax.lines:
            ax.legend()
    out = Path(output) if output else run / "metrics.png"
    if out.is_dir():
        raise ValueError(f"--output {output} is a folder, not a file")
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="llm-train plot", description="Draw a run's loss and throughput curves as a PNG.", epilog=EPILOG,
        formatter_class=HelpFormatter,
    )
    parser.add_argument("run_dir", metavar="RUN_DIR", help="the run's checkpoint_dir (holds metrics.jsonl)")
    parser.add_argument("--output", "-o", default=None, help="PNG to write (default: RUN_DIR/metrics.png)")
    args = parser.parse_args(argv)
    try:
        out = plot_run(args.run_dir, args.output)
    except (ValueError, OSError) as exc:
        print(f"llm-train plot: error: {exc}", file=sys.stderr)
        return 2
    print(f"plot: wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
