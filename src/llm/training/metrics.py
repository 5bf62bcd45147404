"""A run's meter: elapsed time, ETA, tokens/s, data wait; `metrics.jsonl` in the run folder (+ TensorBoard).

`metrics.jsonl` holds one JSON object per logged step (`step`, `epoch`, `loss`, `lr`, `tokens`,
`tokens_per_s` (this call's tokens over its time, as in the log and the summary),
`tokens_per_s_window` (since the previous record), `data_wait` (share of the step time spent
waiting for the next batch), the ingest figures of the interval (`ingest_metrics.py`: data-wait
percentiles, batches/s, tokens/s, remote bytes, requests and cache counts), `elapsed_s`, `time`;
a mixture adds `tokens_by_source` and `samples_by_source`, {source name: count} of the whole job,
source_metrics.py) and one per validation (`step`, `val_loss`).
A fresh run starts the file over; a resumed run drops the records after its checkpoint's step
and appends; either only once its first step has finished (a run that fails before leaves no file
and an earlier one untouched). That rewrite goes by temporary file and rename: a kill or a full disk in the middle
of it leaves the previous file whole. With `tensorboard` installed (`pip install -e '.[tensorboard]'`) the same scalars
go to `<run folder>/tensorboard` too.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

from llm.data.storage.local import atomic_write
from llm.training.ingest_metrics import Gather, IngestMeter

METRICS_FILE = "metrics.jsonl"
RESUMED = "resumed"  # the `event` of the record a resumed run writes at its first step


def clock(seconds: float) -> str:
    """`h:mm:ss` for a log line."""
    s = int(round(max(seconds, 0.0)))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


def read_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    """The records of `run_dir/metrics.jsonl` (a torn last line, from a kill, is skipped)."""
    path = Path(run_dir) / METRICS_FILE
    records = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict) and isinstance(record.get("step"), int):
            records.append(record)
    return records


def _tensorboard(run_dir: Path) -> Any:
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:  # the optional extra is not installed: metrics.jsonl only
        return None
    return SummaryWriter(log_dir=str(run_dir / "tensorboard"))


class RunMeter:
    """Times one `fit()` call and records what it logs (rank 0 writes; others only time)."""

    def __init__(self, run_dir: str | Path | None, start_step: int, total_steps: int, write: bool = True,
                 gather: Gather | None = None):
        """`gather`: every rank's ingest window from this rank's (all_gather under DDP)."""
        self.start_step, self.total_steps = start_step, total_steps
        self.ingest = IngestMeter(gather)
        self.started = self._window_start = time.perf_counter()
        self.tokens = self._window_tokens = 0
        self._waited = 0.0
        self._file = self._tb = None
        # Opened at the first finished step, not here: a run that fails before it (a bad batch, a full
        # disk, an interrupt) leaves no empty metrics.jsonl and an earlier run's file as it was.
        self._folder = Path(run_dir) if run_dir is not None and write else None

    def _open(self) -> None:
        """Start the file over (a fresh run) or keep the records up to the checkpoint (a resumed one), then append."""
        folder, self._folder = self._folder, None
        if folder is None:
            return
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / METRICS_FILE
        for torn in folder.glob(f".{METRICS_FILE}.tmp-*"):  # a rewrite killed part way (atomic_write's name)
            torn.unlink(missing_ok=True)
        if self.start_step == 0:
            path.write_text("")
        elif path.exists():  # a resumed run: the records after its checkpoint are from a run that was cut short
            kept = [json.dumps(r) + "\n" for r in read_metrics(folder) if r["step"] <= self.start_step]
            # the whole history is in this rewrite: replaced by rename, never truncated in place
            atomic_write(path, "".join(kept).encode("utf-8"))
        self._file = open(path, "a", encoding="utf-8")
        if self.start_step > 0:  # the plot marks it: the run average starts over here
            self._write({"step": self.start_step, "event": RESUMED})
        self._tb = _tensorboard(folder)

    def waited(self, seconds: float, tokens: int = 0) -> None:
        """Time spent waiting for the next batch, which holds `tokens` tokens (this rank's)."""
        self._waited += seconds
        self.ingest.batch(seconds, tokens)

    def add_tokens(self, tokens: int) -> None:
        """Called once a step has finished: its tokens (the file is opened at the first)."""
        self._open()
        self.tokens += tokens
        self._window_tokens += tokens

    @property
    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    def window(self, step: int) -> dict[str, float]:
        """Throughput, data wait, elapsed and ETA at `step`; starts a new window."""
        now = time.perf_counter()
        elapsed, span = now - self.started, max(now - self._window_start, 1e-9)
        done = max(step - self.start_step, 1)
        stats = {
            "tokens_per_s": self.tokens / max(elapsed, 1e-9),
            "tokens_per_s_window": self._window_tokens / span,
            "data_wait": min(self._waited / span, 1.0),
            "elapsed_s": elapsed,
            "eta_s": elapsed / done * max(self.total_steps - step, 0),
            **self.ingest.window(),
        }
        self._window_start, self._window_tokens, self._waited = now, 0, 0.0
        return stats

    def record(self, step: int, **values: Any) -> None:
        self._open()
        if self._file is None:
            return
        self._write({"step": step, **values})
        if self._tb is not None:
            for key, value in values.items():
                if isinstance(value, (int, float)) and key not in ("epoch",):
                    self._tb.add_scalar(key, value, step)
                elif isinstance(value, dict):  # per-source counts: one curve per source (tokens_by_source/wiki)
                    for name, count in value.items():
                        self._tb.add_scalar(f"{key}/{name}", count, step)

    def _write(self, record: dict[str, Any]) -> None:
        # strict JSON: a non-finite value (a NaN loss) is written as null, never as a bare NaN
        clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in record.items()}
        self._file.write(json.dumps({**clean, "time": round(time.time(), 3)}, allow_nan=False) + "\n")
        self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._tb is not None:
            self._tb.close()
            self._tb = None
