"""The one error type for unreadable or malformed user input (file, line and key in the message)."""

from __future__ import annotations


class InputError(ValueError):
    """A user's input file is unreadable or malformed; the message names file, line and key."""
