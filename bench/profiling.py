"""Profiles of our cases (`--profile`): py-spy over the whole process tree, or cProfile in-process."""

from __future__ import annotations

import cProfile
import io
import pstats
import re
import shutil
from collections import Counter
from collections.abc import Callable
from pathlib import Path

_FRAME = re.compile(r"^(?P<func>.*) \((?P<file>[^:()]+):(?P<line>\d+)\)$")


def py_spy() -> str | None:
    """The py-spy binary next to this Python, or on PATH."""
    import sys

    here = Path(sys.executable).with_name("py-spy")
    return str(here) if here.exists() else shutil.which("py-spy")


def py_spy_command(out: Path, rate: int = 100) -> list[str]:
    """Prefix that samples a command and all its subprocesses (DataLoader / optimize workers)."""
    return [py_spy() or "py-spy", "record", "--subprocesses", "--nonblocking", "-r", str(rate),
            "-f", "raw", "-o", str(out), "--"]


def _short(frame: str) -> str:
    m = _FRAME.match(frame.strip())
    if not m:
        return frame.strip()
    f = m["file"]
    for marker in ("site-packages/", "src/", "/work/main/"):
        if marker in f:
            f = f.split(marker, 1)[1]
    return f"{m['func']} ({f}:{m['line']})"


def summarize_raw(raw: Path, n: int = 8) -> list[str]:
    """Top frames of a py-spy raw (collapsed stacks) file: own samples, and ours inclusive."""
    own: Counter[str] = Counter()
    ours: Counter[str] = Counter()
    total = imports = 0
    for line in raw.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        c = int(count)
        frames = stack.split(";")[1:]  # the first element names the process
        if not frames:
            continue
        if any("importlib._bootstrap" in f for f in frames):
            imports += c  # one-off start-up cost, not the work being measured
            continue
        total += c
        own[_short(frames[-1])] += c
        for fr in {_short(f) for f in frames if "llm/" in f and "/bench/" not in f}:
            ours[fr] += c
    if not total:
        return ["(no samples)"]
    lines = [f"{total} samples over all processes ({imports} more in imports, left out); own time:"]
    lines += [f"{100 * c / total:5.1f}% {f}" for f, c in own.most_common(n)]
    if ours:
        lines.append("inclusive time in llm.*:")
        lines += [f"{100 * c / total:5.1f}% {f}" for f, c in ours.most_common(n)]
    return lines


def profiled(fn: Callable[[dict], dict], spec: dict, out_dir: str) -> dict:
    """Run fn(spec) under cProfile (this process only); write NAME.prof and NAME.txt."""
    name = spec.get("profile_name") or f"{spec['impl']}-{spec['scenario']}"
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


def profile_cases(ctx, cases: list[tuple[str, str, str, dict]]) -> None:
    """One extra run of ours per (scenario, workers), profiled, kept out of the statistics."""
    done = set()
    for who, case, scenario, spec in cases:
        key = (scenario, spec.get("num_workers"))
        if who != "ours" or key in done:
            continue
        done.add(key)
        name = re.sub(r"[^A-Za-z0-9]+", "_", f"{scenario}-{case}").strip("_")
        ctx.profile_dir.mkdir(parents=True, exist_ok=True)
        ctx.say(f"profiling {scenario} {who} {case}")
        if py_spy():  # every process of the tree: workers are where the work is
            raw = ctx.profile_dir / f"{name}.raw.txt"
            res = ctx.run(who, scenario, wrap=py_spy_command(raw), **dict(spec))
            top = summarize_raw(raw) if raw.exists() else [res.get("error", "no profile")]
            ctx.profiles.append({"scenario": scenario, "case": case, "path": str(raw), "tool": "py-spy",
                                 "top": top})
        else:
            res = ctx.run(who, scenario, profile_dir=str(ctx.profile_dir), profile_name=name, **dict(spec))
            if "profile" in res:
                ctx.profiles.append({"scenario": scenario, "case": case, "path": res["profile"],
                                     "tool": "cProfile (main process only)"})
