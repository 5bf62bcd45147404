"""Subprocess entry: `python -m bench.worker SPEC_JSON` runs one scenario of one contestant and prints its result."""

from __future__ import annotations

import importlib
import json
import sys
import traceback

from bench.measure import emit


def main(argv: list[str]) -> int:
    spec = json.loads(argv[0])
    module = importlib.import_module(f"bench.runners.{spec['impl']}")
    try:
        fn = getattr(module, spec["scenario"])
        if spec.get("profile_dir"):
            from bench.profiling import profiled

            if hasattr(module, "_import"):  # profile the work, not the one-off imports
                module._import()
            result = profiled(fn, spec, spec["profile_dir"])
        else:
            result = fn(spec)
    except Exception as exc:  # reported, not raised: the harness records the failure and moves on
        traceback.print_exc()
        msg = f"{type(exc).__name__}: {exc}"  # the head says what, the tail of a wrapped traceback says why
        emit({"error": msg if len(msg) <= 3000 else f"{msg[:800]}\n[...]\n{msg[-2200:]}"})
        return 1
    emit(result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
