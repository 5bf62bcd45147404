"""What every `llm-*` command shares; it lives in `llm.training.cli_help` (llm.training must not import llm.cli)."""

from llm.training.cli_help import (
    HelpFormatter,
    add_version,
    expect_file,
    expect_folder,
    package_version,
)

__all__ = ["HelpFormatter", "add_version", "expect_file", "expect_folder", "package_version"]
