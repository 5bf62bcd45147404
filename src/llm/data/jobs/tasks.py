"""What an engine runs: `Tasks` (work per task id, a driver callback per finished task), and engine names."""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

ENGINES = ("local", "ray")

Report = Callable[[int, int], None]  # (documents or items, tokens) done since the last report


@dataclass(frozen=True)
class Tasks:
    """`work(task_id, report)` runs in a worker and returns the task's result (picklable);
    `on_done(task_id, result)` runs in the driver, in completion order."""

    work: Callable[[int, Report], Any]
    count: int
    on_done: Callable[[int, Any], None]
    unit: str = "task"
    counters: tuple[str, ...] = ("docs", "tokens")  # names of report()'s numbers shown on the bar (one or two)
    # the local engine's workers keep the memory they free (collector.keep_freed_memory): for tasks that make
    # numpy temporaries of MBs batch after batch, measured faster (dedup); off elsewhere, unmeasured
    keep_freed_memory: bool = False


def check_engine(engine: str, ray_address: str | None) -> None:
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {', '.join(repr(e) for e in ENGINES)}, got {engine!r}")
    if ray_address is not None and engine != "ray":
        raise ValueError(f"ray_address is only used with engine='ray', not {engine!r}")


class _NoBar:
    """What the engines call on a bar, doing nothing: without a bar, tqdm (and the asyncio it
    imports, ~0.1 s) is never imported, which a short `llm-data optimize --no-progress` feels."""

    def __init__(self, desc: str) -> None:
        self.desc = desc  # the engines name the job by it in their errors

    def update(self, n: int = 1) -> None:
        pass

    def set_postfix(self, *args: Any, **kwargs: Any) -> None:
        pass

    def close(self) -> None:
        pass


def progress_bar(total: int, desc: str, unit: str, enabled: bool) -> Any:
    if not enabled:
        return _NoBar(desc)
    from tqdm.auto import tqdm

    bar = tqdm(total=total, unit=unit, desc=desc, dynamic_ncols=True, file=sys.stderr)
    bar.desc = desc  # the engines name the job by it in their errors
    return bar
