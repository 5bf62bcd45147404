"""One rank of the simulated multi-node tests, started by torchrun: it reads an s3:// dataset as a
training loop would (one collective per step) and writes what it read to OUT/rank<N>.json.

Modes: `epoch` reads a whole epoch; `stop K` saves the loader state after K steps (rank 0 writes
it); `resume` loads that state and reads to the end; `die K` kills rank 1 with SIGKILL at step K.
"""

from __future__ import annotations

import datetime
import json
import os
import signal
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from llm.data import StreamingDataLoader, StreamingDataset, TokensLoader


def main() -> None:
    mode, url, out = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    at_step = int(sys.argv[4]) if len(sys.argv) > 4 else 0
    out.mkdir(parents=True, exist_ok=True)
    timeout = datetime.timedelta(seconds=float(os.environ["COLLECTIVE_TIMEOUT_S"]))
    dist.init_process_group("gloo", timeout=timeout)
    rank, world = dist.get_rank(), dist.get_world_size()
    dataset = StreamingDataset(url, item_loader=TokensLoader(block_size=32), shuffle=True, seed=11,
                               cache_dir=os.environ["NODE_CACHE"], storage_options=json.loads(os.environ["STORAGE_OPTIONS"]))
    loader = StreamingDataLoader(dataset, batch_size=2, num_workers=1)
    if mode == "resume":
        loader.load_state_dict(json.loads((out.parent / "state.json").read_text()))
    rows: list[list[int]] = []
    steps = 0
    for batch in loader:
        one = torch.ones(1)
        dist.all_reduce(one)  # a training step's collective: a rank that ran out early would hang here
        assert int(one.item()) == world
        rows.extend(batch.tolist())
        steps += 1
        if mode == "die" and rank == 1 and steps == at_step:
            os.kill(os.getpid(), signal.SIGKILL)
        if mode == "stop" and steps == at_step:
            if rank == 0:
                (out.parent / "state.json").write_text(json.dumps(loader.state_dict()))
            break
    dist.barrier()
    (out / f"rank{rank}.json").write_text(json.dumps({"rank": rank, "world": world, "steps": steps, "rows": rows}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
