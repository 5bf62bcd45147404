"""`python -m llm.training.train`: the `llm-train` entry point as a module, for torchrun."""

from __future__ import annotations

import sys

from llm.cli.train import main

if __name__ == "__main__":
    sys.exit(main())
