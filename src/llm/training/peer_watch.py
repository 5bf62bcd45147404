"""Under DDP, a rank stuck on its data is named by the ranks that wait for it, before the collective times out.

Each rank's data watchdog (`llm.data.watchdog`) reports what its loader waits for after `data.watchdog_s`
seconds without a batch. `PeerWatch` shares those reports through the process group's key-value
store, and watches this rank's own steps: when it has waited `data.watchdog_s` seconds inside a step
(its batch in hand, so in the step's collectives) and other ranks reported a data stall for the
same step, it prints their reports, e.g. `rank 0 of 2 has waited 12.0 s in step 3 for the other ranks: data watchdog:
rank 1 of 2: ... reads partition ... its request in flight for 11.8 s: reading s3://...`. The
collective's own timeout is 10 minutes for NCCL and 30 for gloo by default; the default `data.watchdog_s`
(600 s) equals NCCL's, so lower it for NCCL jobs to be told first.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from llm.data.watchdog import add_listener, remove_listener

log = logging.getLogger("llm.data.watchdog")
_KEY = "llm/data_watchdog/{}"


def _default_store() -> Any:
    """The default process group's store (TCPStore under torchrun), or None when there is none."""
    try:
        from torch.distributed import distributed_c10d

        return distributed_c10d._get_default_store()
    except Exception:  # no process group, or a torch without it: each rank still logs its own reports
        return None


class PeerWatch:
    """Shares this rank's data-watchdog reports and names the stalled ranks this rank waits for (see module doc)."""

    def __init__(self, rank: int, world: int, watchdog_s: float, say: Callable[[str], None], store: Any = None):
        self.rank, self.world, self.watchdog_s, self.say = rank, world, float(watchdog_s), say
        self.store = store if store is not None else (_default_store() if world > 1 and watchdog_s > 0 else None)
        self.step = 0  # the step whose batch this rank waits for, or trains on
        self.in_step = 0.0  # time.monotonic() when this rank's batch came; 0: waiting for data
        self._stop = threading.Event()
        if self.store is None:
            return
        add_listener(self._share)
        threading.Thread(target=self._run, name="llm-peer-watch", daemon=True).start()

    def waiting(self, step: int) -> None:
        """This rank now waits for the batch of `step`."""
        self.step, self.in_step = step, 0.0

    def training(self) -> None:
        """This rank has its batch: from now on it waits only for the step's collectives."""
        self.in_step = time.monotonic()

    def close(self) -> None:
        self._stop.set()
        remove_listener(self._share)

    def _share(self, report: str) -> None:
        try:
            self.store.set(_KEY.format(self.rank), f"{self.step}\t{report}")
        except Exception as e:  # the store is gone (the job is ending): the report is in this rank's log already
            log.debug("could not share a data watchdog report: %s", e)

    def peers(self, step: int) -> list[str]:
        """The other ranks' reports made while they waited for the batch of `step`."""
        out = []
        for r in range(self.world):
            key = _KEY.format(r)
            if r == self.rank or not self.store.check([key]):
                continue
            at, _, report = self.store.get(key).decode().partition("\t")
            if at == str(step):
                out.append(report)
        return out

    def _run(self) -> None:
        reported = (0, 0.0)  # (step, waited) of the last message
        while not self._stop.wait(min(1.0, max(self.watchdog_s / 4, 0.05))):
            since, step = self.in_step, self.step
            waited = time.monotonic() - since if since else 0.0
            if not since or waited < self.watchdog_s or (reported[0] == step and waited < reported[1] + self.watchdog_s):
                continue
            try:
                reports = self.peers(step)
            except Exception:  # the store is gone (another rank ended the job)
                return
            if not reports:  # a long step of its own (a checkpoint save) or a wait that is not in the data
                continue
            reported = (step, waited)
            self.say(f"data watchdog: rank {self.rank} of {self.world} has waited {waited:.1f} s in step {step} "
                     f"for the other ranks: {' | '.join(reports)}")
