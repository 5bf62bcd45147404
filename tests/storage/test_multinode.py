"""Several nodes simulated on one machine: separate torchrun launches on a loopback rendezvous
(2 nodes x 2 ranks, then 1 node x 3 ranks), each node with its own cache folder, all reading one
s3:// dataset on a real S3-compatible server (SeaweedFS). Each rank runs tests/storage/multinode_rank.py,
which does one collective per step as a training loop does, so uneven ranks would hang or fail."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from llm.data import StreamingDataset, TokensLoader
from tests.storage.helpers import docs, write

pytestmark = pytest.mark.slow  # four to six Python processes with torch per test (~30-60 s each on 2 cores)

RANK_SCRIPT = Path(__file__).with_name("multinode_rank.py")
COLLECTIVE_TIMEOUT_S = 30


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_nodes(procs_per_node: list[int], args: list[str], s3_server, tmp_path: Path) -> list[tuple[int, str]]:
    """One torchrun launch per node, started together on one loopback rendezvous; (exit code, output) each."""
    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "COLLECTIVE_TIMEOUT_S": str(COLLECTIVE_TIMEOUT_S),
           "STORAGE_OPTIONS": json.dumps(s3_server.options())}
    launches = []
    for node, nproc in enumerate(procs_per_node):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(len(procs_per_node)),
               "--node-rank", str(node), "--nproc-per-node", str(nproc), "--master-addr", "127.0.0.1",
               "--master-port", str(port), str(RANK_SCRIPT), *args]
        node_env = {**env, "NODE_CACHE": str(tmp_path / f"cache-{len(procs_per_node)}x{nproc}-node{node}")}
        launches.append(subprocess.Popen(cmd, env=node_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    results = []
    for p in launches:
        try:
            output, _ = p.communicate(timeout=COLLECTIVE_TIMEOUT_S + 150)
        except subprocess.TimeoutExpired:
            for q in launches:
                q.kill()
            raise AssertionError("a simulated node hung past the collective timeout") from None
        results.append((p.returncode, output))
    return results


def read_ranks(out: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(out.glob("rank*.json"))]


def all_blocks(url: str, s3_server, tmp_path: Path) -> Counter:
    ds = StreamingDataset(url, item_loader=TokensLoader(block_size=32), cache_dir=tmp_path / "reference-cache",
                          storage_options=s3_server.options())
    return Counter(tuple(ds[i].tolist()) for i in range(len(ds)))


@pytest.fixture
def remote_dataset(s3_server, tmp_path) -> tuple[str, Counter]:
    url = s3_server.url()
    write(url, docs(133, seed=5), storage_options=s3_server.options())
    blocks = all_blocks(url, s3_server, tmp_path)
    assert sum(blocks.values()) % 8, "the epoch must end in a short global batch (8 = 2 nodes x 2 ranks x 2)"
    return url, blocks


def test_two_nodes_read_every_block_exactly_once_and_end_the_epoch_together(remote_dataset, s3_server, tmp_path):
    url, blocks = remote_dataset
    out = tmp_path / "epoch"
    for code, output in launch_nodes([2, 2], ["epoch", url, str(out)], s3_server, tmp_path):
        assert code == 0, output[-3000:]
    ranks = read_ranks(out)
    assert [r["rank"] for r in ranks] == [0, 1, 2, 3] and {r["world"] for r in ranks} == {4}
    assert len({r["steps"] for r in ranks}) == 1, "every rank ends the epoch at the same step"
    assert Counter(tuple(row) for r in ranks for row in r["rows"]) == blocks
    for node in (0, 1):  # each node filled its own cache
        assert any((tmp_path / f"cache-2x2-node{node}").rglob("*.bin")), f"node {node} cached nothing"


def test_a_two_by_two_state_resumes_on_one_node_of_three_ranks(remote_dataset, s3_server, tmp_path):
    url, blocks = remote_dataset
    first, second = tmp_path / "run" / "first", tmp_path / "run" / "second"
    # 4 steps of 8, then 405 = 67 x 6 + 3 blocks left for 3 ranks: the short last batch has a block per
    # rank (with fewer, ranks left without one repeat an early block to stay in step: plan/schedule.py).
    for code, output in launch_nodes([2, 2], ["stop", url, str(first), "4"], s3_server, tmp_path):
        assert code == 0, output[-3000:]
    for code, output in launch_nodes([3], ["resume", url, str(second)], s3_server, tmp_path):
        assert code == 0, output[-3000:]
    before, after = read_ranks(first), read_ranks(second)
    assert {r["steps"] for r in before} == {4} and len(after) == 3
    assert len({r["steps"] for r in after}) == 1
    read = Counter(tuple(row) for r in before + after for row in r["rows"])
    assert read == blocks, "the resumed run repeats nothing and loses nothing"


def test_a_rank_killed_mid_epoch_ends_every_node_with_a_named_error_not_a_hang(remote_dataset, s3_server, tmp_path):
    url, _ = remote_dataset
    started = time.monotonic()
    results = launch_nodes([2, 2], ["die", url, str(tmp_path / "die"), "4"], s3_server, tmp_path)
    elapsed = time.monotonic() - started
    assert all(code != 0 for code, _ in results), "every node reports the failure"
    assert elapsed < COLLECTIVE_TIMEOUT_S + 120
    killed_node, other_node = results[0][1], results[1][1]
    assert "SIGKILL" in killed_node and "rank      : 1" in killed_node, killed_node[-3000:]
    # the other node's ranks fail in their next collective, naming the lost peer, and torchrun says which
    assert "multinode_rank.py FAILED" in other_node and "Connection closed by peer" in other_node, other_node[-3000:]
