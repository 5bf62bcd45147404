"""cProfile around one scenario run: where our time goes when a target is missed (`--profile`)."""

from __future__ import annotations

import cProfile
import io
import pstats
from collections.abc import Callable
from pathlib import Path


def profiled(fn: Callable[[dict], dict], spec: dict, out_dir: str) -> dict:
    """Run fn(spec) under cProfile; write NAME.prof and NAME.txt (top functions by cumulative time)."""
    name = f"{spec['impl']}-{spec['scenario']}-{spec.get('num_workers', 0)}w"
    prof = cProfile.Profile()
    result = prof.runcall(fn, spec)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    prof.dump_stats(out / f"{name}.prof")
    buf = io.StringIO()
    stats = pstats.Stats(prof, stream=buf).strip_dirs().sort_stats("cumulative")
    stats.print_stats(30)
    buf.write("\n--- by internal time ---\n")
    stats.sort_stats("tottime").print_stats(20)
    (out / f"{name}.txt").write_text(buf.getvalue())
    result["profile"] = str(out / f"{name}.txt")
    return result
