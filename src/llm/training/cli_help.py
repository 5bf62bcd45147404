"""What every `llm-*` command shares: help that shows defaults and examples, `--version`, path-kind checks.

Used by `llm-data`, `llm-train`, `llm-train plot` and `llm-generate`.
"""

from __future__ import annotations

import argparse
from pathlib import Path


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Defaults appended to each flag's help; description and epilog (the examples) kept as written.

    A default of None or False (a flag not given, a switch off) is not shown: the help says what it means.
    """

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default in (None, False, []) or "default:" in (action.help or ""):
            return action.help
        return super()._get_help_string(action)


def package_version() -> str:
    """The installed distribution's version (`llm-stream-data`, imported as `llm`; package metadata)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("llm-stream-data")
    except PackageNotFoundError:  # running from a source tree that was never installed
        return "unknown (not installed)"


def add_version(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--version", action="version", version=f"%(prog)s {package_version()}")


def expect_folder(path: str | Path, what: str) -> None:
    """A file where a folder is expected is named as such (a missing path is left to the caller)."""
    p = Path(path).expanduser()
    if p.exists() and not p.is_dir():
        raise ValueError(f"{what} {path} is a file, not a folder")
