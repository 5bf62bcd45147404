"""Suite-wide settings: hypothesis without per-example deadlines (CI machines are small and shared), a clean source registry per test."""

import os
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

settings.register_profile("llm", deadline=None, max_examples=60)
settings.load_profile("llm")


@pytest.fixture(autouse=True)
def _isolated_source_registry():
    """Sources a test registers are gone after it: the global registry is restored."""
    from llm.data.text.registry import SOURCE_REGISTRY

    saved = (dict(SOURCE_REGISTRY._factories), dict(SOURCE_REGISTRY._keys))
    yield
    SOURCE_REGISTRY._factories, SOURCE_REGISTRY._keys = saved


@pytest.fixture(scope="module")
def ray_cluster():
    """A local Ray cluster of 2 CPUs for one test module (~10-20 s to start on 2 cores)."""
    ray = pytest.importorskip("ray", reason="Ray is not installed: pip install 'llm-stream-data[ray]' (the dev extra has it)")
    from llm.data.shards.jobs.ray import start_local

    start_local(num_cpus=2)
    yield
    ray.shutdown()
