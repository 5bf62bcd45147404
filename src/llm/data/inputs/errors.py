"""The one error type for unreadable or malformed user input (file, line and key in the message)."""

from __future__ import annotations


class InputError(ValueError):
    """A user's input file is unreadable or malformed; the message names file, line and key."""


def one_line(error: object) -> str:
    """A library's error message on one line (pyarrow's span several), for inside our sentence."""
    return " ".join(str(error).split()) or type(error).__name__
