"""`llm-generate`'s console script; the code lives in `llm.training.generate`."""

from __future__ import annotations

import sys

from llm.training.generate import build_parser, main

__all__ = ["build_parser", "main"]

if __name__ == "__main__":
    sys.exit(main())
