"""Where this process sits in the job: (rank, world_size), the one place that reads them.

Explicit values win, then `torch.distributed` when it is initialised, then the
`RANK` / `WORLD_SIZE` variables that torchrun sets. Bad values are one sentence
naming the variable, never a division by zero further down.
"""

from __future__ import annotations

import os
import sys


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"environment variable {name}={raw!r} is not an integer; unset it or set a number") from None


def check_topology(rank: int, world_size: int, what: str = "RANK/WORLD_SIZE") -> tuple[int, int]:
    """(rank, world_size) after checking 0 <= rank < world_size and world_size >= 1."""
    if isinstance(rank, bool) or isinstance(world_size, bool) or not all(
        isinstance(v, int) for v in (rank, world_size)
    ):
        raise ValueError(f"{what}: rank {rank!r} and world size {world_size!r} must be integers")
    if world_size < 1:
        raise ValueError(f"{what}: world size {world_size} must be at least 1")
    if not 0 <= rank < world_size:
        raise ValueError(f"{what}: rank {rank} must be in [0, {world_size}) for world size {world_size}")
    return rank, world_size


def env_topology() -> tuple[int, int]:
    """(RANK, WORLD_SIZE) from the environment (torchrun's), checked; (0, 1) when unset."""
    return check_topology(_env_int("RANK", 0), _env_int("WORLD_SIZE", 1), "RANK/WORLD_SIZE")


def current_topology(rank: int | None = None, world_size: int | None = None) -> tuple[int, int]:
    """(rank, world_size): explicit values, else torch.distributed, else RANK / WORLD_SIZE."""
    if rank is not None and world_size is not None:
        return check_topology(rank, world_size, "rank/world_size")
    dist = sys.modules.get("torch.distributed")  # never import torch just to learn we are alone
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return env_topology()
