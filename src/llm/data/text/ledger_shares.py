"""What a text mixture's phases are held to: each row's records (or tokens) per source, and phases where all were served.

A text mixture's weights are shares of records drawn (or of their tokens, `streaming_mixing_unit:
tokens`), so a row counts, per source, the documents it starts (a piece from token 0) or the tokens
it holds. Its shares are held to the weights only under `weighted` and `round_robin` (low-discrepancy
choosers: within a record per consumer), and only in a phase after which every weighted source was
still served in the same pass: a source that runs out of records leaves the others to go on alone,
which is not a fault. Other phases are shown, not judged.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from llm.data.ledger.reader import Ledger
from llm.data.ledger.shares import Phase

HELD = ("weighted", "round_robin")  # choosers whose shares follow the weights closely; `random` draws


def _spec(ledger: Ledger) -> dict[str, Any] | None:
    return next((s["mixture"] for s in ledger.sources if isinstance(s.get("mixture"), dict)), None)


def mixed_amounts(ledger: Ledger) -> np.ndarray | None:
    """Per ledger row, per source: the records it starts, or their tokens (the mixture's unit), credited where a
    record starts as the chooser counts it when drawn (a document's tokens: all its ranges); None when not mixed."""
    spec = _spec(ledger)
    if spec is None or len(ledger.sources) < 2:
        return None
    pieces = ledger.pieces
    out = np.zeros((len(ledger.rows), len(ledger.sources)), np.float64)
    starts = pieces["start"] == 0
    amount = starts.astype(np.float64)
    if spec.get("unit") == "tokens":
        _, doc = np.unique(pieces[["source", "epoch", "name", "item"]], return_inverse=True)
        tokens = np.bincount(doc, weights=(pieces["end"].astype(np.int64) - pieces["start"].astype(np.int64)))
        amount = np.where(starts, tokens[doc], 0.0)
    np.add.at(out, (pieces["row_ref"].astype(np.int64), pieces["source"].astype(np.int64)), amount)
    return out


def _consumers(ledger: Ledger) -> int:
    """The most consumers (rank x worker) that mixed at once: each is within a record of the weights on its own."""
    topologies = [m.get("topology") or {} for m in ledger.markers.values()]
    topologies += [h.get("topology") or {} for h in ledger.last_headers.values()]
    return max([int(t.get("world_size", 1)) * max(1, int(t.get("num_workers", 0))) for t in topologies] or [1])


def judge(ledger: Ledger, amounts: np.ndarray | None) -> Callable[[Phase], None]:
    """Sets whether a phase is held to its weights (a close chooser, every weighted source served after it) and
    its slack: each consumer may be a record ahead, and its packer may hold one more (`Phase.slot`)."""
    spec = _spec(ledger) or {}
    pieces = ledger.pieces
    steps = ledger.rows["step"][pieces["row_ref"]].astype(np.int64)
    last: dict[tuple[int, int], int] = {}
    for s, e, step in zip(pieces["source"].tolist(), pieces["epoch"].tolist(), steps.tolist()):
        if step > last.get((s, e), -1):
            last[(s, e)] = step
    largest = float(amounts.max()) if amounts is not None and amounts.size else 1.0
    slack = max(1, int(np.ceil(largest))) * _consumers(ledger)

    end = int(steps.max()) if len(steps) else 0

    def why_not(phase: Phase) -> str:
        if spec.get("strategy") not in HELD:
            return f"the {spec.get('strategy')} chooser draws by chance"
        for s in range(len(phase.expected)):
            if phase.expected[s] <= 0:
                continue
            inside = (pieces["source"] == s) & (steps >= phase.first) & (steps <= phase.last)
            if not inside.any() or last[(s, int(pieces["epoch"][inside].max()))] <= phase.last:
                # it ran out in this phase (or before), and the others went on alone; or the ledger ends here
                return "the ledger ends in it (a source may have run out)" if phase.last >= end else \
                    f"{ledger.sources[s].get('name', s)} ran out of records in it"
        return ""

    def set_phase(phase: Phase) -> None:
        phase.why, phase.slot = why_not(phase), slack
        phase.compare = not phase.why

    return set_phase
