"""Saved bench results: the newest one of a scenario, and a `median [min-max]` cell, for every section writer."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).parent / "results"


def newest(prefix: str) -> Any | None:
    """The newest `results/<prefix>-*.json` (docs/benchmarks.md keeps a section when other scenarios are rerun)."""
    found = sorted(RESULTS.glob(f"{prefix}-*.json"))
    return json.loads(found[-1].read_text()) if found else None


def spread(s: dict[str, float], scale: float = 1.0, digits: int = 2) -> str:
    """A statistic as `median [min-max]`, each divided by `scale`."""
    return f"{s['median'] / scale:.{digits}f} [{s['min'] / scale:.{digits}f}-{s['max'] / scale:.{digits}f}]"
