"""`collector_paused()`: Python's cyclic garbage collector held off while a block makes many small objects.

Why: each time new objects fill a generation the collector walks it, and now and then all of them;
in a process that has imported torch that is a large heap, walked again and again for objects that
live on (a vocabulary) or are garbage a moment later (a manifest's parse). Cyclic garbage made in the
block is collected afterwards, as usual.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def collector_paused() -> Iterator[None]:
    """No cyclic garbage collection in the block; the collector is left as it was found."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
