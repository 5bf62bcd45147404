"""Our StreamingDataLoader where torchdata's StatefulDataLoader protocol is expected."""

from __future__ import annotations

import io

import pytest
import torch

from tests.interop.samples import trainer_loader


def _protocol_run(make_loader, stop: int, total: int) -> tuple[list, list]:
    """A training loop written against torchdata's StatefulDataLoader: state_dict -> torch.save -> load_state_dict."""
    loader, seen, it = make_loader(), [], None
    it = iter(loader)
    for _ in range(stop):
        seen.append(next(it))
    buffer = io.BytesIO()
    torch.save({"loader": loader.state_dict()}, buffer)
    buffer.seek(0)
    resumed = make_loader()
    resumed.load_state_dict(torch.load(buffer)["loader"])  # weights_only=True: plain ints, strs and bools
    rest = []
    for batch in resumed:
        rest.append(batch)
        if stop + len(rest) == total:
            break
    return seen, rest


def test_torchdata_stateful_protocol(trainer_tokens):
    stateful = pytest.importorskip("torchdata.stateful_dataloader", reason="torchdata is not installed")
    loader = trainer_loader(trainer_tokens)
    assert isinstance(loader, stateful.Stateful)
    reference = [b.clone() for b in trainer_loader(trainer_tokens)]
    for stop in (0, 3, len(reference) - 1):
        head, tail = _protocol_run(lambda: trainer_loader(trainer_tokens, workers=2), stop, len(reference))
        assert len(head) + len(tail) == len(reference)
        assert all(torch.equal(a, b) for a, b in zip(head + tail, reference)), f"stop {stop}"
