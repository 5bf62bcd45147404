"""One root seed: every component's random stream is derived from it by a keyed hash.

`derive_seed(root, component, epoch)` is blake2b keyed by the root seed over the
component's name and the epoch. Orders keyed by `seed + epoch` made (42, epoch 1) the same
order as (43, epoch 0), and two components that kept the same default seed drew the same
stream; a keyed hash of (component, epoch) gives every pair its own, unrelated stream, and
one user-facing `seed` moves them all.
"""

from __future__ import annotations

import hashlib


def check_seed(seed: object, where: str = "seed") -> int:
    """`seed` as an int, or a one-sentence ValueError naming `where`."""
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"{where} must be an integer, got {seed!r}")
    return seed


def derive_seed(root: int, component: str, epoch: int = 0) -> int:
    """A 63-bit seed for `component` (a stable name, e.g. 'shuffle' or 'mixture') in `epoch`."""
    key = int(root).to_bytes(16, "little", signed=True)
    digest = hashlib.blake2b(f"{component}\x00{int(epoch)}".encode(), key=key, digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1
