"""Saved bench results: one written per run, the newest one of a scenario, and a `median [min-max]` cell."""

from __future__ import annotations

import json
import time
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


def save(prefix: str, result: Any, lines: list[str]) -> Path:
    """Write `results/<prefix>-<UTC time>.json`, print the scenario's markdown `lines` and where the file went."""
    out = RESULTS / f"{prefix}-{time.strftime('%Y%m%d-%H%M', time.gmtime())}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    print("\n".join(lines))
    took = f" ({result['wall_s']} s)" if isinstance(result, dict) and "wall_s" in result else ""
    print(f"raw results: {out}{took}")
    return out
