"""Suite-wide settings: hypothesis without per-example deadlines (CI machines are small and shared), a clean source registry per test."""

import os
import secrets
import tempfile

import pytest
from hypothesis import settings

from bench.seaweed import keep_on_loopback

# The suite never writes to the user's cache: remote shard caches and the verified-shards
# store go to a folder of this run (subprocesses inherit it).
os.environ.setdefault("LLM_CACHE_DIR", tempfile.mkdtemp(prefix="llm-test-cache-"))
# Nothing leaves loopback (docs/storage.md): no client reaches a cloud metadata address or proxy, set
# before any store is opened (subprocesses inherit it).
keep_on_loopback()
# Ray clusters the tests start send no usage reports (docs/items.md); the engine sets it too.
os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
# Ray's driver swaps 127.0.0.1 for the machine's network address ("so other nodes can reach it") unless
# its multi-node switch is off, as it is on macOS; off, every Ray address the tests use stays on loopback.
# The raylets of tests/ray_nodes.py turn it back on for themselves (a second node needs it).
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
# Every Ray cluster of the suite authenticates with a token of this run, set before Ray is imported, so
# the driver, local clusters and the raylets of tests/ray_nodes.py agree whatever ~/.ray holds.
os.environ["RAY_AUTH_MODE"] = "token"
os.environ["RAY_AUTH_TOKEN"] = secrets.token_hex(32)

settings.register_profile("llm", deadline=None, max_examples=60)
settings.load_profile("llm")


@pytest.fixture(autouse=True)
def _isolated_source_registry():
    """Sources a test registers are gone after it: the global registry is restored."""
    from llm.data.inputs.registry import SOURCE_REGISTRY

    saved = (dict(SOURCE_REGISTRY._factories), dict(SOURCE_REGISTRY._keys))
    yield
    SOURCE_REGISTRY._factories, SOURCE_REGISTRY._keys = saved


@pytest.fixture(scope="module")
def ray_cluster(tmp_path_factory):
    """A Ray cluster of two raylets on this machine, one CPU each, for one test module (tests/ray_nodes.py);
    each raylet's workers have their own scratch folder (`cluster.scratch`)."""
    pytest.importorskip("ray", reason="Ray is not installed: pip install 'llm-stream-data[ray]' (the dev extra has it)")
    from tests.ray_nodes import TwoRayletCluster

    cluster = TwoRayletCluster(scratch=(tmp_path_factory.mktemp("head-scratch"), tmp_path_factory.mktemp("node-scratch")))
    cluster.start()
    yield cluster
    cluster.stop()
