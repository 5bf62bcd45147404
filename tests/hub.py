"""The Hugging Face hub as the tests see it: a closed loopback port, and counters of probes and load_dataset calls."""

from __future__ import annotations

import socket

import pytest


def closed_port() -> int:
    """A loopback port nothing listens on: bound, then released."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def watch_hub(monkeypatch: pytest.MonkeyPatch, offline: bool = False) -> dict:
    """Count hub probes and forbid load_dataset; the hub switches set as the libraries read them."""
    import datasets
    import datasets.config
    import huggingface_hub.constants

    from llm.data.inputs import hub_reach

    calls = {"probe": 0, "load_dataset": 0}
    real_probe = hub_reach._probe

    def probe(endpoint: str, timeout: float) -> str | None:
        calls["probe"] += 1
        return real_probe(endpoint, timeout)

    def load_dataset(*args: object, **kwargs: object) -> None:
        calls["load_dataset"] += 1
        raise AssertionError("load_dataset must not run when the hub cannot be reached")

    monkeypatch.setattr(hub_reach, "_probe", probe)
    monkeypatch.setattr(hub_reach, "_answered", set())  # no answer remembered from an earlier test
    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    for module in (datasets.config, huggingface_hub.constants):
        monkeypatch.setattr(module, "HF_HUB_OFFLINE", offline)
    return calls
