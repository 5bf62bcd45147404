"""The ledger's optional C module (_rows.c): `KERNEL` is the module when it was built from this version's source on a
little-endian machine, else None, and the callers take their NumPy path to the same results (checksums.py,
columns.py). setup.py builds it where a C compiler is found."""

from __future__ import annotations

import sys
from typing import Any

VERSION = 4  # _rows.c's KERNEL: a module built from another version's source lacks, or differs in, what we call

try:
    from llm.data.ledger import _rows
except ImportError:  # not built
    _rows = None

KERNEL: Any = _rows if _rows is not None and getattr(_rows, "KERNEL", None) == VERSION and sys.byteorder == "little" \
    else None  # (on a big-endian machine its native-order weights and bytes would differ)
