"""Our StreamingDataLoader where torchdata's StatefulDataLoader protocol is expected."""

from __future__ import annotations

import io

import pytest
import torch

from tests.interop.samples import audited_once, trainer_loader


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


def test_own_loop_with_a_ledger_audits_clean_across_a_resume(trainer_tokens, tmp_path):
    """docs/interop.md's own-loop recipe: ledger=, per-row loss, state_dict() at each save, a resume, then audit."""
    ledger, per_epoch = tmp_path / "ledger", len(trainer_loader(trainer_tokens))
    loader = trainer_loader(trainer_tokens, workers=2, ledger=ledger)
    it = iter(loader)
    for _ in range(5):
        batch = next(it)
        loader.ledger_set_loss(batch.float().mean(1))
    saved = io.BytesIO()
    torch.save(loader.state_dict(), saved)  # a checkpoint: commits steps 1-5
    for _ in range(3):
        next(it)  # trained after the checkpoint, then lost with a kill: never counted
    del it, loader
    saved.seek(0)
    resumed = trainer_loader(trainer_tokens, workers=2, ledger=ledger)
    resumed.load_state_dict(torch.load(saved))
    served = 5
    for batch in resumed:
        resumed.ledger_set_loss(batch.float().mean(1))
        served += 1
        if served == per_epoch + 3:
            break
    resumed.state_dict()
    assert audited_once(ledger) == served * 4
