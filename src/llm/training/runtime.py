"""Where a training process runs: torchrun rank/world, device, cross-rank gathers, RNG states."""

from __future__ import annotations

import gc
import os
import random
import time
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from llm.data.topology import env_topology
from llm.training.core.loading import ConfigError


@dataclass
class DistEnv:
    """This process's place in the job: rank, world size, local rank."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def init_distributed(device_type: str) -> DistEnv:
    """Join the torchrun job described by RANK/WORLD_SIZE (gloo on CPU, nccl on CUDA), if any."""
    if not (dist.is_available() and dist.is_initialized()):
        _, world = env_topology()  # a bad RANK / WORLD_SIZE is one sentence, not a gloo hang
        if world <= 1:
            return DistEnv()
        dist.init_process_group(backend="nccl" if device_type == "cuda" else "gloo")
    return DistEnv(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", 0)))


def resolve_device(name: str, local_rank: int) -> torch.device:
    """`auto` picks this rank's GPU when there is one, else the CPU."""
    if name == "auto":
        return torch.device(f"cuda:{local_rank}") if torch.cuda.is_available() else torch.device("cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"training.device is {name!r} but no CUDA device is available; use auto or cpu")
    if name == "cuda":
        return torch.device(f"cuda:{local_rank}")
    return torch.device(name)


def autocast(device: torch.device, amp_dtype: str) -> Any:
    """The autocast context for `training.amp_dtype` on `device`: none off CUDA or in fp32."""
    if device.type != "cuda" or amp_dtype == "fp32":
        return nullcontext()  # bf16 autocast only pays off (and is only exact enough) on GPUs
    return torch.autocast("cuda", dtype=torch.bfloat16 if amp_dtype == "bf16" else torch.float16)


def leave_process_group() -> None:
    """Leave the process group this process joined (collective: every rank calls it)."""
    if not (dist.is_available() and dist.is_initialized()):
        return
    dist.barrier()
    # gloo's worker threads free finished collectives' tensors, which needs the GIL; a
    # process group destroyed (its threads joined, GIL held) before they are done
    # deadlocks at exit. Give them the GIL for a moment, then drop DDP's reference to
    # the group (the caller did) so that it is destroyed here, not at interpreter exit.
    time.sleep(0.2)
    gc.collect()
    dist.destroy_process_group()


def gather(obj: Any, env: DistEnv) -> list[Any]:
    if env.world_size == 1:
        return [obj]
    out: list[Any] = [None] * env.world_size
    dist.all_gather_object(out, obj)
    return out


def rng_state() -> dict[str, Any]:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def seed_all(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def make_deterministic() -> None:
    """`training.deterministic`: deterministic kernels only."""
    # cuBLAS needs a fixed workspace for deterministic matmuls; must be set before CUDA starts.
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)
