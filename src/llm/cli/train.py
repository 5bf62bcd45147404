"""`llm-train`'s console script; the entry point itself lives in `llm.training.train` (also run by torchrun)."""

from __future__ import annotations

import sys

from llm.training.train import build_parser, main

__all__ = ["build_parser", "main"]

if __name__ == "__main__":
    sys.exit(main())
